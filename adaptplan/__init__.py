"""adaptplan: plan and run split federated learning.

The numpy-only world model is imported eagerly; torch-using entry points (``profile_model``,
``estimate_constants``, ``training_batches``, ``train``) are re-exported lazily so that ``import adaptplan`` and
``adaptplan plan`` never load torch (docs/architecture.md). What a researcher needs — profile your own model,
plan, re-plan in a loop, train with a configuration, read a run — is documented in docs/api.md.
"""

from __future__ import annotations

from adaptplan.calibration import Calibration, PilotRun
from adaptplan.constants import ConvergenceConstants
from adaptplan.errors import InfeasibleError, InputError
from adaptplan.latency import LatencyBreakdown, LatencyModel, total_latency
from adaptplan.lazy import lazy_getattr
from adaptplan.model_profile import CutPoint, ModelProfile
from adaptplan.plan import Plan
from adaptplan.prediction import Comparison, Prediction
from adaptplan.system import DeviceSpec, SystemProcess, SystemRanges, SystemSpec, generate_system

__version__ = "0.1.0"

_LAZY = {
    "Planner": "adaptplan.planner",
    "plan": "adaptplan.planner",
    "default_scenario": "adaptplan.scenarios",
    "profile_model": "profilers",
    "estimate_constants": "profilers",
    "build_chain": "profilers",
    "training_batches": "trainers.inputs.minibatches",
    "train": "trainers.run.driver:run",
    "TrainConfig": "trainers.config.train_config",
    "History": "trainers.run.history",
    "RoundRecord": "trainers.run.history",
}

__all__ = ["Calibration", "Comparison", "ConvergenceConstants", "CutPoint", "DeviceSpec", "InfeasibleError", "InputError", "LatencyBreakdown",
           "LatencyModel", "ModelProfile", "PilotRun", "Plan", "Prediction", "SystemProcess", "SystemRanges", "SystemSpec", "generate_system",
           "total_latency", *_LAZY]

__getattr__ = lazy_getattr('adaptplan', _LAZY)
