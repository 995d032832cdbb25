"""One strategy per split algorithm; :func:`make_strategy` maps a name (and its options) to an instance."""

from __future__ import annotations

from typing import Any, Mapping

from trainers.api import Strategy
from trainers.config import ALGORITHMS, algorithm_options, check_choice
from trainers.strategies.adaptsfl import AdaptSFL
from trainers.strategies.cyclesl import CycleSL
from trainers.strategies.gapsl import GAPSL
from trainers.strategies.gas import GAS
from trainers.strategies.psl import PSL
from trainers.strategies.scala import SCALA
from trainers.strategies.sfl import SFLV1, SFLV2
from trainers.strategies.sl import SL

STRATEGIES: dict[str, type[Strategy]] = {"sl": SL, "psl": PSL, "sfl-v1": SFLV1, "sfl-v2": SFLV2, "adaptsfl": AdaptSFL,
                                         "gapsl": GAPSL, "scala": SCALA, "cyclesl": CycleSL, "gas": GAS}
assert tuple(STRATEGIES) == ALGORITHMS


def make_strategy(name: str, options: Mapping[str, Any] | None = None) -> Strategy:
    """A fresh strategy for algorithm ``name`` with its options (``trainers.config.ALGORITHM_OPTIONS``;
    defaults where not given). InputError naming the flag for a bad or foreign option."""
    return STRATEGIES[check_choice(name, ALGORITHMS, "algorithm")](**algorithm_options(name, options or {}))


__all__ = ["Strategy", "SL", "PSL", "SFLV1", "SFLV2", "AdaptSFL", "GAPSL", "SCALA", "CycleSL", "GAS", "STRATEGIES",
           "make_strategy"]
