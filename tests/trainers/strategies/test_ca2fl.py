"""CA²FL (trainers/strategies/ca2fl.py) against cached-update calibration written out from the GAS authors'
baseline (baseline/CA2FL.py; docs/algorithms.md "CA²FL"): FedBuff's loop, and every C uploads the global model steps
by every device's latest cached update weighted by its data share — the stale caches of devices that did not upload
since included. Its equivalence with the rule written out is tests/trainers/strategies/test_fedbuff.py's,
parametrized over both buffered algorithms."""

from __future__ import annotations

import pytest
import torch

from tests.engine_builders import flat, make_data, small_model
from trainers.engine.split_engine import SplitEngine
from trainers.roles.optim import OptimizerSpec
from trainers.strategies import make_strategy

LR, L = 0.1, 11            # small_model: 11 blocks


def _engine(N: int, C: int, E: int, spec: OptimizerSpec) -> SplitEngine:
    return SplitEngine(small_model(), [L] * N, make_strategy("ca2fl", {"active": C, "local_steps": E}),
                       make_data(N, "dirichlet"), spec, batch_size=16, seed=0)


def test_ca2fl_differs_from_fedbuff_once_a_cache_is_stale() -> None:
    """At the first average every update started from w⁰, so w⁰ + Σ_B p_k h_k = w⁰ + (Σ_B |𝒟_k| / Σ|𝒟|)·(FedBuff's
    average − w⁰): the calibrated step is FedBuff's scaled by the buffer's share of the data (< 1 with N > C)."""
    N, C, E = 6, 3, 2
    spec = OptimizerSpec("sgd", LR, 0.0)
    ca2fl, fedbuff = _engine(N, C, E, spec), SplitEngine(
        small_model(), [L] * N, make_strategy("fedbuff", {"active": C, "local_steps": E}), make_data(N, "dirichlet"),
        spec, batch_size=16, seed=0)
    ca2fl.run_round(1)
    fedbuff.run_round(1)
    w0 = flat(small_model())
    calibrated, averaged = (flat(*e.strategy.eval_models(e)) for e in (ca2fl, fedbuff))
    share = sum(ca2fl.data.parts[k].size for k in ca2fl.strategy.cache) / sum(p.size for p in ca2fl.data.parts)
    assert 0 < share < 1
    assert torch.allclose(calibrated - w0, share * (averaged - w0), atol=1e-6, rtol=0)


def test_a_restored_ca2fl_state_is_checked() -> None:
    """Starts, caches and pre-average uploads must be whole models of devices of the run."""
    N = 4
    engine = _engine(N, 2, 1, OptimizerSpec("sgd", LR, 0.0))
    engine.run_round(1)
    ctx = engine.context(2)
    strategy = engine.strategy
    strategy.check_state(ctx)
    state = strategy.state_dict()
    some = next(iter(state["cache"].values()))
    for name, bad, message in (("cache", {N: some}, "cache must map devices of 0..3"),
                               ("start", {0: {0: {}}}, "start must map devices of 0..3 to whole models"),
                               ("global", {0: {}}, "global model must hold the 11 blocks")):
        strategy.load_state_dict({**state, name: bad})
        with pytest.raises(ValueError, match=message):
            strategy.check_state(ctx)
    strategy.load_state_dict(state)
    strategy.check_state(ctx)
