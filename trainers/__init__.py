"""The split-training engine (DESIGN.md "The engine and the algorithms").

Light imports only: ``import trainers`` does not load torch. Public API (lazy):
``TrainConfig``, ``run(config) -> History``, ``Trainer``, ``SplitEngine``, ``History``,
``make_strategy``, ``Strategy``.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "TrainConfig": "trainers.config",
    "run": "trainers.run",
    "Trainer": "trainers.run",
    "SplitEngine": "trainers.engine",
    "DeviceData": "trainers.engine",
    "History": "trainers.history",
    "make_strategy": "trainers.strategies",
    "Strategy": "trainers.strategies",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trainers' has no attribute {name!r}")
