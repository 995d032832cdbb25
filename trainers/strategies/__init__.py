"""One strategy per split algorithm; :func:`make_strategy` maps a name to an instance."""

from __future__ import annotations

from trainers.api import Strategy
from trainers.config import ALGORITHMS, check_choice
from trainers.strategies.adaptsfl import AdaptSFL
from trainers.strategies.psl import PSL
from trainers.strategies.sfl import SFLV1, SFLV2
from trainers.strategies.sl import SL

STRATEGIES: dict[str, type[Strategy]] = {"sl": SL, "psl": PSL, "sfl-v1": SFLV1, "sfl-v2": SFLV2, "adaptsfl": AdaptSFL}
assert tuple(STRATEGIES) == ALGORITHMS


def make_strategy(name: str) -> Strategy:
    """A fresh strategy for algorithm ``name``; InputError listing the valid names otherwise."""
    return STRATEGIES[check_choice(name, ALGORITHMS, "algorithm")]()


__all__ = ["Strategy", "SL", "PSL", "SFLV1", "SFLV2", "AdaptSFL", "STRATEGIES", "make_strategy"]
