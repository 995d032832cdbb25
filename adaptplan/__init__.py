"""adaptplan: plan and run split federated learning.

The numpy-only world model is imported eagerly; torch-using entry points (``profile_model``,
``estimate_constants``, ``train``) are re-exported lazily so that ``import adaptplan`` and
``adaptplan plan`` never load torch (DESIGN.md).
"""

from __future__ import annotations

import importlib
from typing import Any

from adaptplan.constants import ConvergenceConstants
from adaptplan.errors import InfeasibleError, InputError
from adaptplan.latency import LatencyBreakdown, LatencyModel, total_latency
from adaptplan.model_profile import CutPoint, ModelProfile
from adaptplan.plan import Plan
from adaptplan.system import DeviceSpec, SystemProcess, SystemRanges, SystemSpec, generate_system

__version__ = "0.1.0"

_LAZY = {
    "Planner": ("adaptplan.planner", "Planner"),
    "plan": ("adaptplan.planner", "plan"),
    "default_scenario": ("adaptplan.scenarios", "default_scenario"),
    "profile_model": ("profilers", "profile_model"),
    "estimate_constants": ("profilers", "estimate_constants"),
    "build_chain": ("profilers", "build_chain"),
    "train": ("trainers.run", "run"),
}

__all__ = ["ConvergenceConstants", "CutPoint", "DeviceSpec", "InfeasibleError", "InputError", "LatencyBreakdown",
           "LatencyModel", "ModelProfile", "Plan", "SystemProcess", "SystemRanges", "SystemSpec", "generate_system",
           "total_latency", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attribute = _LAZY[name]
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'adaptplan' has no attribute {name!r}")
