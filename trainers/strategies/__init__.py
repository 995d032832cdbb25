"""One strategy per split algorithm; :func:`make_strategy` makes the one the registry
(:data:`trainers.algorithms.REGISTRY`) names, with its options."""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn

from adaptplan.errors import InputError
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


def later_models(strategy: Strategy, template: nn.Sequential) -> list[nn.Sequential]:
    """The architectures of the later models ``strategy`` may train from the run's ``template`` (``stage_specs``, at
    their largest; torch's generator left as it was), so that a model a later stage cannot be built from is refused
    before any training: InputError naming the model."""
    try:
        with torch.random.fork_rng(devices=[]):
            return [strategy.stage_architecture(template, spec) for spec in strategy.stage_specs()]
    except ValueError as exc:
        raise InputError(f"{strategy.name} cannot train this model: {exc}", field="model") from None


__all__ = ["Strategy", "SL", "PSL", "SFLV1", "SFLV2", "AdaptSFL", "GAPSL", "SCALA", "CycleSL", "GAS", "STRATEGIES",
           "make_strategy", "later_models"]
