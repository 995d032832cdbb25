"""The simulated clock charges the server work each algorithm computes (issue: CycleSL's E passes, GAS's flush,
GAPSL's per-device algebra and double back-propagation). Every expected figure is written out here from the
latency model's terms: one sample through device i's server blocks costs (ρ_L − ρ_j + ϖ_L − ϖ_j)/f_s seconds
(eqs. 18–19 per sample, j = ℓ_i), and work outside the model costs 2 FLOPs per multiply–add / f_s."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from adaptplan.system import SystemProcess, generate_system
from profilers import build_chain, profile_model
from tests.engine_builders import make_data, small_model
from trainers.engine.clock import SimClock
from trainers.engine.split_engine import SplitEngine
from trainers.strategies import GAPSL, GAS, SCALA, CycleSL

B, CUT = 4, 3


def setup(N: int):
    chain = build_chain(small_model(), torch.zeros(2, 1, 8, 8))
    profile = profile_model(chain, (1, 8, 8), model_name="cnn-synthetic")
    system = generate_system(N, 0)
    clock = SimClock(profile, SystemProcess(system, seed=0, redraw=False), B)
    j = CUT - 1
    per_sample = (profile.rho[-1] - profile.rho[j] + profile.varpi[-1] - profile.varpi[j]) / system.server_flops
    return chain, clock, float(per_sample), float(system.server_flops)


def engine_for(strategy, N: int, chain, clock, optimizer=None) -> SplitEngine:
    return SplitEngine(chain.blocks, [CUT] * N, strategy, make_data(N, "dirichlet"),
                       optimizer or {"lr": 0.05, "momentum": 0.0}, batch_size=B, seed=0, clock=clock)


@pytest.mark.parametrize("epochs", [1, 2, 3])
def test_cyclesl_server_time_grows_with_its_server_epochs(epochs: int) -> None:
    """Spec A.8: T_srv = [E·n_S·(ρ_s + ϖ_s) + n_S·(ρ_s + ϖ_s^in)]/f_s, with ϖ_s^in charged as ϖ_s: (E + 1)·n_S samples."""
    N = 4
    chain, clock, per_sample, _ = setup(N)
    engine = engine_for(CycleSL(participation=1.0, server_epochs=epochs), N, chain, clock)
    stats = engine.run_round(1)
    n_s = N * B
    assert stats.stage_seconds["server"] == pytest.approx((epochs + 1) * n_s * per_sample, rel=1e-12)
    times = clock.stage_times(1, [CUT] * N)
    barrier = float(np.max(times.client_fp + times.upload))
    back = float(np.max(times.download + times.client_bp))
    assert stats.sim_seconds == pytest.approx(barrier + (epochs + 1) * n_s * per_sample + back, rel=1e-12)


def test_cyclesl_steps_phase_charges_its_resampled_batches() -> None:
    """server_phase="steps": E single mini-batches of b_S = b rows each, plus the gradient pass over n_S."""
    N, E = 3, 5
    chain, clock, per_sample, _ = setup(N)
    engine = engine_for(CycleSL(participation=1.0, server_epochs=E, server_phase="steps"), N, chain, clock)
    stats = engine.run_round(1)
    assert stats.stage_seconds["server"] == pytest.approx((E * B + N * B) * per_sample, rel=1e-12)


def test_scala_charges_its_second_backward() -> None:
    """SCALA's cut gradients at the pre-update weights (eq. 13) are a second, input-only backward through the server
    blocks besides the concatenated batch's forward+backward: charged as (19) per sample, (ϖ_L − ϖ_j)/f_s, on top
    of the pass (issue 38: `bench engine --flops` counts 1.31× centralized training's FLOPs for it)."""
    N = 4
    chain, clock, per_sample, flops = setup(N)
    profile = clock.profile
    backward = float(profile.varpi[-1] - profile.varpi[CUT - 1]) / flops
    engine = engine_for(SCALA(participation=1.0), N, chain, clock)
    stats = engine.run_round(1)
    assert stats.stage_seconds["server"] == pytest.approx(stats.samples * (per_sample + backward), rel=1e-12)
    assert backward > 0


@pytest.mark.parametrize("covariance", ["diag", "full"])
def test_gas_charges_every_flush(covariance: str) -> None:
    """Part C: per arrival one pass of its B rows; per flush one pass of the Q_s·B real and B̂ generated rows, the
    statistics (diagonal 3·n·d; full n·d·(d + 1)) and the draws (diagonal B̂·d; full d³/3 + n̂_y·d² per label drawn)."""
    N = 6
    chain, clock, per_sample, f_s = setup(N)
    engine = engine_for(GAS(active=3, local_steps=2, covariance=covariance), N, chain, clock)
    strategy, flushes = engine.strategy, []
    flush = strategy.flush_buffer

    def spy(edge, ctx, device):
        labels = torch.cat([y for _, y, _ in strategy.buffer])
        dim = strategy.buffer[0][0][0].numel()
        before = ctx.metrics.get("generated", 0.0)
        flush(edge, ctx, device)
        generated = int(ctx.metrics["generated"] - before)
        counts = torch.bincount(labels, minlength=10).tolist()
        drawn = [B - c for c in counts if c < B] if generated else []              # GAS-6: n̂_y = max(0, B − n_y)
        flushes.append((labels.numel(), dim, generated, drawn))
    strategy.flush_buffer = spy
    total = sum(engine.run_round(t).stage_seconds["server"] for t in (1, 2, 3))
    steps = sum(engine.devices[d].step for d in range(N))           # one arrival of B rows per device step
    expected = steps * B * per_sample
    for real, dim, generated, drawn in flushes:
        expected += (real + generated) * per_sample
        if covariance == "diag":
            expected += 2 * (3 * real * dim + generated * dim) / f_s
        else:
            expected += 2 * (real * dim * (dim + 1) + sum(dim ** 3 / 3 + n * dim ** 2 for n in drawn)) / f_s
    assert any(g for _, _, g, _ in flushes)                       # generation happened in these rounds
    assert all(g == sum(d) for _, _, g, d in flushes)
    assert total == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("gda", ["detached", "double_backprop"])
def test_gapsl_charges_its_gradient_algebra_and_double_backprop(gda: str) -> None:
    """Spec A.7: PSL's pass per device, plus (S² + 2S)·P multiply–adds for eqs. 1, 4, 5 on the S×P gradient matrix;
    double back-propagation adds two forward+backward passes of every aligned device's batch."""
    N = 4
    chain, clock, per_sample, f_s = setup(N)
    engine = engine_for(GAPSL(gda=gda), N, chain, clock)
    P = sum(p.numel() for j in range(CUT, len(chain.blocks)) for p in chain.blocks[j].parameters())
    stats = engine.run_round(1)
    aligned = stats.metrics["aligned"]
    expected = N * B * per_sample + 2 * (N * N + 2 * N) * P / f_s
    if gda == "double_backprop":
        expected += 2 * aligned * B * per_sample
    assert stats.stage_seconds["server"] == pytest.approx(expected, rel=1e-12)


def test_arrival_mode_and_flush_charges_by_hand() -> None:
    """A strategy served in arrival order that charges B/2 more samples per arrival and answers everyone in
    ``flush`` after 200 FLOPs more. Device 0 arrives at 1 + 1 = 2 s, served 2 → 2 + 4 + (B/2)·4/B = 8; device 1
    arrives at 3, waits, served 8 → 14; the flush adds 200 / 100 FLOP/s = 2 s: both replies at 16, back at
    16 + 0.5 + 1 = 17.5 s. The server is busy 6 + 6 + 2 = 14 s."""
    from trainers.api import Strategy, parallel_step
    from trainers.engine.clock import StageTimes

    class Deferred(Strategy):
        server_step = "own"
        server_mode = "arrival"

        def __init__(self) -> None:
            super().__init__()
            self.held = []

        def serve(self, edge, ctx, arrivals):
            self.held += parallel_step(edge, ctx, arrivals)
            ctx.charge_server(arrivals[0].device, samples=B / 2)
            return []

        def flush(self, edge, ctx):
            ctx.charge_server(0, flops=200.0)
            out, self.held = self.held, []
            return out

    two = np.ones(2)
    times = StageTimes(np.array([1.0, 2.0]), two, 4 * two, 0.5 * two, two, two, two, 1.0, 1.0, B, server_flops=100.0)

    class Fixed:
        def stage_times(self, round_index, cuts):
            return times

    engine = SplitEngine(small_model(), [CUT] * 2, Deferred(), make_data(2), {"lr": 0.05}, batch_size=B, seed=0,
                         clock=Fixed())
    stats = engine.run_round(1)
    assert stats.sim_seconds == pytest.approx(17.5, rel=1e-12)
    assert stats.stage_seconds["server"] == pytest.approx(14.0, rel=1e-12)
    assert all(d.pending is None for d in engine.devices)          # the flush's replies were delivered


def test_the_global_model_is_the_whole_chain_for_any_cuts() -> None:
    """Before any average: w⁰ with the untrained server. Under AdaptSFL with cuts [2, CUT, CUT] after one
    aggregation: blocks 1..L_c from the fed server's global model (client blocks and the averaged non-common
    copies), the common part the edge server's one shared instance."""
    from trainers.strategies import PSL, AdaptSFL

    engine = SplitEngine(small_model(), [CUT] * 3, PSL(), make_data(3), {"lr": 0.05}, batch_size=B, seed=0)
    model = engine.global_model()
    assert len(model) == len(small_model())
    x = make_data(3).x_test[:5]
    assert torch.equal(model(x), small_model()(x))                # w_c^0 before any average, the server untrained
    hetero = SplitEngine(small_model(), [2, CUT, CUT], AdaptSFL(), make_data(3), {"lr": 0.05}, batch_size=B, seed=0)
    hetero.run_round(1)
    model = hetero.global_model()
    for j in range(CUT):
        assert all(torch.equal(v, hetero.fed.global_blocks[j][k]) for k, v in model[j].state_dict().items()), j
    for j in range(CUT, len(model)):
        assert model[j] is hetero.edge.instances[(None, j)], j
