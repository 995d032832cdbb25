"""One strategy per split algorithm; :func:`make_strategy` makes the one the registry
(:data:`trainers.algorithms.REGISTRY`) names, with its options."""

from __future__ import annotations

from typing import Any, Mapping

from trainers.algorithms import REGISTRY, algorithm, algorithm_options
from trainers.api import Strategy
from trainers.strategies.adaptsfl import AdaptSFL
from trainers.strategies.cyclesl import CycleSL
from trainers.strategies.gapsl import GAPSL
from trainers.strategies.gas import GAS
from trainers.strategies.psl import PSL
from trainers.strategies.scala import SCALA
from trainers.strategies.sfl import SFLV1, SFLV2
from trainers.strategies.sl import SL

STRATEGIES: dict[str, type[Strategy]] = {name: entry.strategy_class() for name, entry in REGISTRY.items()}
"""Algorithm name → its strategy class, in the registry's order."""


def make_strategy(name: str, options: Mapping[str, Any] | None = None) -> Strategy:
    """A fresh strategy for algorithm ``name`` with its options (the registry's; defaults where not given).
    InputError naming the flag for a bad or foreign option."""
    return STRATEGIES[algorithm(name).name](**algorithm_options(name, options or {}))


__all__ = ["Strategy", "SL", "PSL", "SFLV1", "SFLV2", "AdaptSFL", "GAPSL", "SCALA", "CycleSL", "GAS", "STRATEGIES",
           "make_strategy"]
