"""The split-training engine (docs/architecture.md).

Light imports only: ``import trainers`` does not load torch. Public API (lazy):
``TrainConfig``, ``run(config) -> History``, ``Trainer``, ``SplitEngine``, ``History``,
``make_strategy``, ``Strategy``.
"""

from __future__ import annotations

from adaptplan.lazy import lazy_getattr

_LAZY = {
    "TrainConfig": "trainers.config.train_config",
    "run": "trainers.run.driver",
    "Trainer": "trainers.run.driver",
    "SplitEngine": "trainers.engine.split_engine",
    "DeviceData": "trainers.engine.split_engine",
    "History": "trainers.run.history",
    "make_strategy": "trainers.strategies",
    "Strategy": "trainers.strategies",
}

__all__ = list(_LAZY)

__getattr__ = lazy_getattr('trainers', _LAZY)
