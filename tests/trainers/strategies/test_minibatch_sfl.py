"""MiniBatch-SFL (trainers/strategies/minibatch_sfl.py) against its round written out (tests/concatenated_reference.py
with τ = 0: GAS's authors' baseline/Minibatch-SFL.py — per-device mini-batches in proportion to |𝒟_k|, each
device's cut gradient from its own plain cross-entropy at the pre-update server, one server step on the
concatenated activations, |𝒟_k|-weighted client averages every I rounds), its defaults, and its equality with
SCALA at τ = 0."""

from __future__ import annotations

import pytest
import torch

from tests.concatenated_reference import B, CUT, LR, N, reference_scala
from tests.engine_builders import flat, make_data, small_model
from tests.reference_optim import HandSGD
from trainers.algorithms import REGISTRY
from trainers.engine.split_engine import SplitEngine
from trainers.roles.optim import OptimizerSpec
from trainers.strategies import make_strategy


def engine_for(name: str, options: dict, data, interval: int, cut: int = CUT, optimizer=None) -> SplitEngine:
    return SplitEngine(small_model(), [cut] * N, make_strategy(name, options), data,
                       optimizer or {"lr": LR, "momentum": 0.0}, batch_size=B, seed=0, interval=interval)


@pytest.mark.parametrize("cut,momentum", [(7, False), (CUT, True)])
def test_minibatch_sfl_is_the_concatenated_step_with_plain_cross_entropy(cut: int, momentum: bool) -> None:
    """Plain SGD with the last client block holding weights (cut 7: a block left out of the average would show), and
    SGD with momentum 0.9 (weight decay, clipping) restarted when a participant loads the global model."""
    data, interval, rho = make_data(N, "dirichlet"), 2, 0.5
    spec = OptimizerSpec("sgd", LR, 0.9, 5e-4, 1.0) if momentum else None
    engine = engine_for("minibatch-sfl", {"participation": rho}, data, interval, cut, spec)
    hand = HandSGD(LR, 0.9, 5e-4, 1.0) if momentum else None
    for t, C, batch, clients, server, global_client, losses in reference_scala(data, 6, interval, rho, opt=hand,
                                                                               tau=0.0, cut=cut):
        stats = engine.run_round(t)
        assert stats.loss == pytest.approx(sum(losses.values()) / len(losses), rel=1e-5), t
        assert stats.participants == C and stats.aggregated == (t % interval == 0)
        assert {k: engine.strategy.batch_size(engine.context(t), k) for k in C} == batch
        assert torch.allclose(flat(*[engine.edge.instances[(None, j)] for j in range(cut, 11)]), flat(server),
                              atol=1e-5, rtol=0), t
        for k in range(N):
            assert torch.allclose(flat(engine.devices[k].blocks), flat(clients[k]), atol=1e-5, rtol=0), (t, k)
    assert len(set(batch.values())) > 1                     # unequal B_k exercised


def test_a_device_with_a_sliver_of_the_data_still_draws_one_sample() -> None:
    """B_k = max(⌊|𝒟_k|·b·|𝒞| / Σ|𝒟_j|⌋, 1): 1 sample of 2,000 would give 0; it gives 1, the others their share."""
    from types import SimpleNamespace

    from trainers.api import proportional_batch

    ctx = SimpleNamespace(data_sizes=[1, 999, 1000], participants=[0, 1, 2], batch_size=16)
    assert [proportional_batch(ctx, k) for k in range(3)] == [1, 23, 24]        # ⌊999·48/2000⌋, ⌊1000·48/2000⌋


def test_a_global_iteration_has_at_least_two_participants() -> None:
    """⌈ρN⌉ = 1 at ρ = 0.1 of 6 devices: two take part (one device's activations concatenated would be SplitFed)."""
    engine = engine_for("minibatch-sfl", {"participation": 0.1}, make_data(N), 2)
    assert len(engine.run_round(1).participants) == 2


def test_it_is_scala_at_tau_zero_and_takes_gas_setting_by_default() -> None:
    """The same parameters as SCALA with --la-tau 0 round by round (SCALA's ablation CA-SFL); its defaults are GAS's
    setting: 10 of 20 devices (ρ = 0.5), I = 20, SGD 0.01 with momentum 0.9, weight decay 5·10⁻⁴, clipping at 10."""
    data = make_data(N, "dirichlet")
    ours = engine_for("minibatch-sfl", {"participation": 0.5}, data, 2)
    scala = engine_for("scala", {"participation": 0.5, "la_tau": 0.0}, data, 2)
    for t in range(1, 4):
        ours.run_round(t)
        scala.run_round(t)
        assert torch.equal(flat(*ours.eval_models()[0]), flat(*scala.eval_models()[0])), t      # bit for bit
    entry = REGISTRY["minibatch-sfl"]
    assert make_strategy("minibatch-sfl").participation == 0.5
    d = entry.defaults
    assert (d.lr, d.momentum, d.weight_decay, d.clip_norm, d.interval) == (0.01, 0.9, 5e-4, 10.0, 20)


def test_the_clock_charges_each_participants_forward_backward_and_its_second_backward() -> None:
    """The edge server's seconds of a round: each participant's pass over its B_k samples, (T^S_k: eqs. 18 + 19) ×
    B_k / b, and the second backward that gives its cut gradient from the same forward, charged as eq. (19) alone,
    T^{S,bwd}_k × B_k / b, written out from the stage times."""
    import dataclasses

    import numpy as np

    from tests.engine_builders import FixedClock, random_times

    times = random_times(N, seed=5)
    times = dataclasses.replace(times, server_backward=np.random.default_rng(6).uniform(0.01, 0.2, N))
    engine = SplitEngine(small_model(), [CUT] * N, make_strategy("minibatch-sfl", {"participation": 0.5}),
                         make_data(N, "dirichlet"), {"lr": LR}, batch_size=B, seed=0, interval=2,
                         clock=FixedClock(times))
    stats = engine.run_round(1)
    batch = {k: engine.strategy.batch_size(engine.context(1), k) for k in stats.participants}
    expected = sum((times.server[k] + times.server_backward[k]) * batch[k] / B for k in stats.participants)
    assert stats.stage_seconds["server"] == pytest.approx(expected, rel=1e-12)
