"""Contracts of the simulation runtime and the strategy API (trainers.engine, trainers.api) that the
reference tests do not pin: a checkpoint restores every strategy's own state (floats, ints, lists,
not only tensors) so a restored engine continues exactly as the uninterrupted one; the base classes'
defaults are the specs' values."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from trainers.api import AsyncStrategy
from trainers.engine import SplitEngine
from trainers.strategies import make_strategy

from tests.test_engine import flat, make_data, small_model

torch.set_num_threads(1)


def build(algorithm: str, options: dict, cuts, devices: int, interval: int = 1) -> SplitEngine:
    return SplitEngine(small_model(), cuts, make_strategy(algorithm, options), make_data(devices),
                       {"lr": 0.05, "momentum": 0.5}, batch_size=8, seed=3, interval=interval, total_rounds=6)


def everything(engine: SplitEngine) -> torch.Tensor:
    """Every device's client blocks and every edge-server instance, as one vector."""
    return torch.cat([flat(*[d.blocks for d in engine.devices]),
                      flat(*[engine.edge.instances[k] for k in sorted(engine.edge.instances, key=str)])])


@pytest.mark.parametrize("algorithm,options,cuts,interval", [
    ("sl", {}, [3, 3, 3], 1),                                         # holder (an int)
    ("gapsl", {}, [3, 3, 3], 1),                                      # running ν_min, ν_max (floats)
    ("scala", {"participation": 0.5}, [3, 3, 3, 3], 2),               # the iteration's participants (a list)
    ("gas", {"active": 2, "local_steps": 2}, [3, 3, 3], 1),           # version, buffers, counters
])
def test_a_restored_engine_continues_exactly_like_the_uninterrupted_one(algorithm, options, cuts, interval) -> None:
    a = build(algorithm, options, cuts, len(cuts), interval)
    for t in (1, 2, 3):
        a.run_round(t)
    saved = copy.deepcopy(a.state_dict())
    strategy_state = copy.deepcopy(a.strategy.state_dict())
    b = build(algorithm, options, cuts, len(cuts), interval)
    b.load_state_dict(saved)
    # the strategy's own (non-tensor) state comes back as it was saved
    assert b.strategy.state_dict().keys() == strategy_state.keys()
    plain = {k: v for k, v in strategy_state.items() if isinstance(v, (int, float, str))
             or (isinstance(v, (list, dict)) and all(isinstance(x, (int, float)) for x in
                                                     (v.values() if isinstance(v, dict) else v)))}
    assert plain                                 # each of these strategies keeps some plain state
    assert {k: b.strategy.state_dict()[k] for k in plain} == plain
    for t in (4, 5):
        sa, sb = a.run_round(t), b.run_round(t)
        assert sa.participants == sb.participants
        assert sa.loss == sb.loss or (np.isnan(sa.loss) and np.isnan(sb.loss))
        assert torch.equal(everything(a), everything(b)), f"round {t}"
    ea = [m for m in a.strategy.eval_models(a)]
    eb = [m for m in b.strategy.eval_models(b)]
    assert len(ea) == len(eb)
    for ma, mb in zip(ea, eb):
        assert torch.equal(flat(ma), flat(mb))


class MinimalAsync(AsyncStrategy):
    """An asynchronous strategy that keeps the base class's C and E and aggregates every upload
    batch of C models (GAS-12's rule, without GAS's server-side machinery)."""

    name = "minimal-async"

    def __init__(self) -> None:
        super().__init__()
        self.models: list = []
        self.first: list[int] = []

    def first_devices(self, ctx):
        self.first = super().first_devices(ctx)
        return self.first

    def on_model(self, ctx, upload):
        self.models.append(upload)
        if len(self.models) < self.active:
            return None
        flushed, self.models = self.models, []
        return flushed


def test_async_strategy_defaults_are_the_specs_c_and_e() -> None:
    # docs (spec GAS): an active set of C = 10 clients; a client is replaced after E = 20 local iterations
    strategy = MinimalAsync()
    engine = SplitEngine(small_model(), [3] * 12, strategy, make_data(12), {"lr": 0.05}, batch_size=4, seed=0)
    before = [d.step for d in engine.devices]
    stats = engine.run_round(1)
    assert len(strategy.first) == 10 and len(set(strategy.first)) == 10
    # every upload follows E = 20 steps of one device, and the round ends at the C-th upload: 10 × 20 steps
    steps = [d.step - s for d, s in zip(engine.devices, before)]
    assert sum(steps) == 10 * 20
    assert all(n % 20 == 0 for n in steps)
    assert stats.aggregated and set(strategy.first) <= set(range(12))
