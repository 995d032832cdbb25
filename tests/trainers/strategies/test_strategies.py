"""Strategy equivalences and aggregation schedules (docs/model.md §2.1 eqs. 4–7), and what the reference
tests do not pin: CycleSL's literal server phase (E single resampled mini-batches of b_S = b, spec
CSL-4), and the edge server's forward for a layout the strategy API allows but no shipped algorithm
uses (a shared block followed by per-device blocks: a concatenated stream must split again by device)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from adaptplan.errors import InputError
from adaptplan.fileio import show
from tests.cli_checks import assert_train_flag_error
from tests.engine_builders import flat, make_data, make_engine, params, small_model
from trainers.algorithms import ALGORITHMS
from trainers.api import Strategy
from trainers.engine.split_engine import SplitEngine
from trainers.strategies import GAS, SCALA, CycleSL, make_strategy


# ---- from test_strategies.py (merged by subject) ----------------------------------------
def test_sfl_v1_equals_adaptsfl_at_interval_one() -> None:
    v1 = make_engine("sfl-v1", [4, 4, 4], devices=3, interval=1)
    ad = make_engine("adaptsfl", [4, 4, 4], devices=3, interval=1)
    for t in range(1, 5):
        assert v1.run_round(t).aggregated and ad.run_round(t).aggregated
    for d in range(3):
        for a, b in zip(params(v1.device_model(d)), params(ad.device_model(d)), strict=True):
            assert torch.allclose(a, b, atol=1e-6, rtol=0)


def test_adaptsfl_averages_exactly_every_interval() -> None:
    interval = 3
    engine = make_engine("adaptsfl", [2, 4, 4], devices=3, interval=interval)
    for t in range(1, 8):
        stats = engine.run_round(t)
        assert stats.aggregated == (t % interval == 0)
        forged = [[p for j in range(engine.deepest_cut) for p in engine.block(d, j).parameters()] for d in range(3)]
        equal = all(torch.equal(a, b) for a, b in zip(forged[0], forged[1]))
        assert equal == (t % interval == 0), t
        assert stats.bytes_server > 0 if t % interval == 0 else stats.bytes_server == 0


def test_psl_never_averages_client_models() -> None:
    engine = make_engine("psl", [3, 3, 3], devices=3)
    for t in range(1, 5):
        assert not engine.run_round(t).aggregated
        first = [p for j in range(3) for p in engine.block(0, j).parameters()]
        second = [p for j in range(3) for p in engine.block(1, j).parameters()]
        assert not any(torch.equal(a, b) for a, b in zip(first, second))
    assert len(engine.strategy.eval_models(engine)) == 3      # mean accuracy over devices


def test_sfl_v2_server_is_sequential_and_clients_averaged() -> None:
    engine = make_engine("sfl-v2", [3, 3], devices=2, interval=1)
    parallel = make_engine("psl", [3, 3], devices=2)
    server_before = params(engine.block(0, 6))
    stats = engine.run_round(1)
    parallel.run_round(1)
    assert stats.aggregated
    assert all(torch.equal(a, b) for a, b in zip(params(engine.block(0, 0)), params(engine.block(1, 0))))
    assert not any(torch.equal(a, b) for a, b in zip(server_before, params(engine.block(0, 6))))
    # two sequential steps (device 1 sees the server already updated by device 0) ≠ one averaged step
    assert not any(torch.equal(a, b) for a, b in zip(params(parallel.block(0, 6)), params(engine.block(0, 6))))


def test_unknown_algorithm_lists_valid_names() -> None:
    with pytest.raises(InputError, match="sfl-v1"):
        make_strategy("splitfed")


def test_sl_rejects_heterogeneous_cuts() -> None:
    with pytest.raises(InputError, match="cuts"):
        make_engine("sl", [2, 3], devices=2)


# ---- from test_strategy_contracts.py (merged by subject) ----------------------------------------
torch.set_num_threads(1)


def test_cyclesl_steps_phase_draws_e_minibatches_of_b_without_replacement() -> None:
    # CSL-4, Algorithm 1 read literally: E single resampled minibatches B_S^f ∼ D_S^f of b_S = b features each
    N, B, E = 3, 8, 4
    engine = SplitEngine(small_model(), [9] * N, CycleSL(participation=1.0, server_epochs=E, server_phase="steps"),
                         make_data(N),
                         {"lr": 0.05}, batch_size=B, seed=0)
    drawn = []
    original = engine.strategy.server_batches
    engine.strategy.server_batches = lambda ctx, n: drawn.append((n, original(ctx, n))) or drawn[-1][1]
    stats = engine.run_round(1)
    (n, batches), = drawn
    assert n == N * B                                        # the pooled features of the round
    assert len(batches) == E and stats.metrics["server_steps"] == E
    for idx in batches:
        assert idx.numel() == B and len(set(idx.tolist())) == B and 0 <= int(idx.min()) and int(idx.max()) < n
    # resampled: not the same mini-batch every step
    assert len({tuple(sorted(idx.tolist())) for idx in batches}) > 1


class SharedThenOwn(Strategy):
    """A layout the API allows: blocks below 6 are one shared server instance, blocks from 6 on are a copy
    per device (a shared feature extractor under per-device heads)."""

    name = "shared-then-own"

    def server_owner(self, device, block, deepest_cut):
        return None if block < 6 else device


def test_a_concatenated_stream_splits_by_device_at_per_device_blocks() -> None:
    engine = SplitEngine(small_model(), [3, 3, 4], SharedThenOwn(), make_data(3), {"lr": 0.05}, batch_size=8)
    # make the per-device heads differ, so a device's samples through another device's head would show
    with torch.no_grad():
        for d in range(3):
            for p in engine.edge.instances[(d, 10)].parameters():
                p.add_(0.5 * (d + 1))
    arrivals = [engine.devices[d].forward(1) for d in range(3)]
    p = engine.passes.run(arrivals)
    for a in arrivals:
        # device d's logits = its activation through ITS server blocks, one module after the other
        h = a.tensor
        for j in range(engine.cuts[a.device], engine.num_blocks):
            h = engine.edge.instances[engine.edge.key(a.device, j)](h)
        assert p.logits[a.device].shape == h.shape
        assert torch.allclose(p.logits[a.device], h, atol=1e-6, rtol=0), a.device


@pytest.mark.parametrize("name", ["gas", "scala"])
@pytest.mark.parametrize("tau,message", [(-0.5, "must be in [0, 1e+30], got -0.5"),
                                         (-1e-300, "must be in [0, 1e+30], got -1e-300"),
                                         (math.inf, "must be a finite number, got inf"),
                                         (math.nan, "must be a finite number, got nan")])
def test_logit_adjustment_temperature_must_be_finite_and_non_negative(name, tau, message) -> None:
    # τ ≥ 0 (GAS-9, SCALA eqs. 12–13): a negative τ would reward the frequent labels, an infinite one has no loss
    with pytest.raises(InputError) as info:
        make_strategy(name, {"la_tau": tau})
    assert (info.value.field, info.value.message) == ("--la-tau", message)
    assert make_strategy(name, {"la_tau": 0.0}).tau == 0.0   # the closed end: plain cross-entropy


def test_gas_negative_la_tau_is_one_message_and_exit_2(capsys) -> None:
    assert_train_flag_error(["--algorithm", "gas", "--la-tau", "-1"], "--la-tau", capsys)


# ---- what the algorithms refuse up front -----------------------------------------------------------------
@pytest.mark.parametrize("algorithm,cuts,field,text", [
    ("cyclesl", [3, 4, 3], "cuts", r"needs one cut for all devices, got \[3, 4\]"),
    ("gapsl", [3, 4, 3], "cuts", r"needs one cut for all devices .*got \[3, 4\]"),
    ("gapsl", [3], "devices", "at least 2 devices"),
    ("sl", [4, 3], "cuts", r"got \[3, 4\]"),
])
def test_algorithms_refuse_cuts_and_device_counts_they_cannot_train(algorithm, cuts, field, text) -> None:
    from trainers.strategies import make_strategy

    with pytest.raises(InputError, match=text) as info:
        SplitEngine(small_model(), cuts, make_strategy(algorithm), make_data(len(cuts)), {"lr": 0.05}, batch_size=8)
    assert info.value.field == field


@pytest.mark.parametrize("buffer", [-1, 1.5, "2", True, 10**9 + 1])
def test_gas_buffer_must_be_an_integer_at_least_zero(buffer) -> None:
    with pytest.raises(InputError) as info:
        make_strategy("gas", {"buffer": buffer})
    assert (info.value.field, info.value.message) == \
        ("--buffer", f"must be an integer in 0..1,000,000,000 mini-batches, got {show(buffer)}")
    assert make_strategy("gas", {"buffer": 0}).buffer_size == 0          # 0 = the number of active devices


def test_gas_full_covariance_that_no_regularisation_repairs_is_an_error() -> None:
    from trainers.strategies.gas import LabelStatistics

    stats = LabelStatistics(full=True)
    stats.merge(torch.randn(6, 3), torch.ones(6))
    stats.cov = stats.cov.clone()
    stats.cov[0, 0] = float("nan")                        # εI never makes a NaN matrix positive definite
    with pytest.raises(RuntimeError, match="not positive definite after 100 regularisation steps"):
        stats.sample(torch.zeros(2, 3))


def test_gapsl_plain_excluded_update_gives_every_device_its_own_cut_gradient() -> None:
    # excluded_update = "plain" (A.3.2): the devices outside Ŝ get ∂L_i/∂a_i of their own loss, as those in Ŝ do
    # in the detached mode. In round 1 every cut gradient is taken at the same initial server weights, so every
    # device's client step is PSL's (whose reply is ∂F_i/∂a_i at w_s^0 too); the server steps differ.
    from trainers.strategies import GAPSL, PSL

    def run(strategy):
        engine = SplitEngine(small_model(), [3] * 4, strategy, make_data(4, "dirichlet"), {"lr": 0.1},
                             batch_size=8, seed=0, total_rounds=4)
        stats = engine.run_round(1)
        return engine, stats

    gapsl, stats = run(GAPSL(excluded_update="plain", eta_th=2.0))
    psl, _ = run(PSL())
    assert stats.metrics["aligned"] < 4                    # some devices are outside Ŝ ...
    for d in range(4):                                     # ... and still step exactly like PSL's devices
        for a, b in zip(gapsl.devices[d].blocks.parameters(), psl.devices[d].blocks.parameters()):
            assert torch.allclose(a, b, atol=1e-6, rtol=0), d
    none, stats = run(GAPSL(excluded_update="none", eta_th=2.0))
    moved = [not torch.equal(flat(none.devices[d].blocks), flat(small_model()[:3])) for d in range(4)]
    assert sum(moved) == stats.metrics["aligned"]           # the literal reading: only Ŝ steps


@pytest.mark.parametrize("name", ALGORITHMS)
def test_a_strategy_built_without_options_is_the_one_the_command_line_builds_by_default(name) -> None:
    # the constructors' defaults and trainers.config.train_config's option defaults (the flags') must not drift apart
    from trainers.strategies import STRATEGIES, make_strategy

    direct, configured = STRATEGIES[name](), make_strategy(name)
    assert type(direct) is type(configured)
    assert vars(direct) == vars(configured)


def test_strategy_defaults_are_the_specs() -> None:
    from trainers.strategies import GAPSL

    g = GAPSL()      # docs/algorithms.md GAPSL: K = [0.2, 0.8], η_th = 0.5, λ = 5e-4, the detached GDA, every device steps
    assert (g.k_min, g.k_max, g.eta_th, g.lam, g.gda, g.excluded_update) == (0.2, 0.8, 0.5, 5e-4, "detached", "plain")
    assert (g.term_weighting, g.leader) == ("mean", "lgi")              # PSL's step over Ŝ, eqs. 1-3's leaders
    # the option --server-step weighs eq. (8)'s terms; it never replaces the trait that says GAPSL serves itself
    assert g.server_step == GAPSL(server_step="sum").server_step == "own"
    assert GAPSL(server_step="sum").term_weights(SimpleNamespace(data_sizes=[3, 1, 4]), [0, 2]) == [1.0, 1.0]
    assert g.term_weights(SimpleNamespace(data_sizes=[3, 1, 4]), [0, 2]) == [3 / 7, 4 / 7]
    assert (g.nu_min, g.nu_max) == (math.inf, -math.inf)               # no ν seen yet
    s = SCALA()      # τ = 1, the concatenated batch's labels as the server prior, the paper's ρ = 10%, ≥ 2 devices
    assert (s.tau, s.server_prior, s.participation, s.min_participants) == (1.0, "batch", 0.1, 2)
    c = CycleSL()    # E = 1 server epoch of reshuffled passes, |D_i| sample weights, CyclePSL, 5% attendance (≥ 2)
    assert (c.epochs, c.phase, c.sample_weight, c.base, c.participation, c.min_participants) == \
        (1, "epochs", "data_size", "psl", 0.05, 2)
    gas = GAS()      # C = half the devices (0), E = 20, Q_s = C, generation on, diagonal covariance, τ = 1
    assert (gas.active, gas.local_steps, gas.buffer_size, gas.generation, gas.full, gas.tau) == \
        (0, 20, 0, True, False, 1.0)
    assert (s.reset_client_optimizer, gas.reset_client_optimizer, c.reset_client_optimizer, g.reset_client_optimizer) \
        == (True, True, False, False)


@pytest.mark.parametrize("total,t,expected", [(None, 1, 0.8), (4, 1, 0.35), (2, 3, 0.8)])
def test_gapsl_schedule_progress_is_t_over_t_capped_at_one(total, t, expected) -> None:
    # eq. (2) on the first call: ν_min = ν_max, so stab = 1 and K^t = K_min + (t/T)·(K_max − K_min), K = [0.2, 0.8];
    # without a known T the schedule is at its end (t/T = 1), and a round past T (a run continued) stays there
    from trainers.strategies import GAPSL

    engine = SplitEngine(small_model(), [3] * 3, GAPSL(), make_data(3), {"lr": 0.05}, batch_size=8, total_rounds=total)
    stats = engine.run_round(t)
    assert stats.metrics["leader_fraction"] == pytest.approx(expected, abs=1e-12)


def test_cyclesl_uniform_sample_weights_are_the_plain_mean() -> None:
    # CSL-3: L_S = Σ w_j·CE_j / Σ w_j; "uniform" weights every feature 1 (the plain mean CE), which is also what the
    # |D_i| weights give when every device holds as many samples: the two runs are the same there, and differ
    # where the devices' data sizes differ
    def run(partition: str, weight: str) -> torch.Tensor:
        engine = SplitEngine(small_model(), [9] * 4, CycleSL(sample_weight=weight), make_data(4, partition),
                             {"lr": 0.1}, batch_size=8, seed=0)
        engine.run_round(1)
        return flat(*[engine.edge.instances[(None, j)] for j in (9, 10)])

    assert len({p.size for p in make_data(4, "iid").parts}) == 1
    assert torch.allclose(run("iid", "uniform"), run("iid", "data_size"), atol=1e-6, rtol=0)
    assert len({p.size for p in make_data(4, "dirichlet").parts}) > 1
    assert not torch.allclose(run("dirichlet", "uniform"), run("dirichlet", "data_size"), atol=1e-6, rtol=0)


def test_gas_activates_half_the_devices_by_default_and_scala_at_least_two() -> None:
    """GAS's C/K = 10/20 of the paper: ⌈N/2⌉ active; SCALA's ρ = 0.1 of 10 devices is one, raised to 2."""
    from trainers.strategies import make_strategy

    gas = SplitEngine(small_model(), [9] * 5, make_strategy("gas", {"local_steps": 1}), make_data(5), {"lr": 0.05},
                      batch_size=4, seed=0)
    gas.run_round(1)
    assert len(gas.async_state.active) == 3
    scala = SplitEngine(small_model(), [9] * 10, make_strategy("scala"), make_data(10), {"lr": 0.05}, batch_size=4,
                        seed=0, interval=2)
    assert len(scala.run_round(1).participants) == 2


def test_a_fresh_download_restarts_the_devices_momentum_and_a_plain_one_keeps_it() -> None:
    """ModelDownload.fresh_optimizer: the device's next step is a first step (v = g) on the loaded weights."""
    from trainers.roles.messages import BlockState, ModelDownload

    engine = SplitEngine(small_model(), [3] * 2, make_strategy_psl(), make_data(2), {"lr": 0.05, "momentum": 0.9},
                         batch_size=4, seed=0)
    engine.run_round(1)
    device = engine.devices[0]
    params = list(device.blocks[0].parameters())
    assert all("momentum_buffer" in device.optimizer.torch.state[p] for p in params)
    state = {k: v.clone() for k, v in device.blocks[0].state_dict().items()}
    device.download(ModelDownload(0, 1, "device", {0: BlockState(state)}))
    assert all("momentum_buffer" in device.optimizer.torch.state[p] for p in params)
    device.download(ModelDownload(0, 1, "device", {0: BlockState(state)}, fresh_optimizer=True))
    assert all(p not in device.optimizer.torch.state for p in params)
    assert all("momentum_buffer" in device.optimizer.torch.state[p] for p in device.blocks[1].parameters())


def make_strategy_psl():
    from trainers.strategies import make_strategy

    return make_strategy("psl")


@pytest.mark.parametrize("name,expected", [("sl", "holder"), ("psl", "devices"), ("sfl-v1", "global"),
                                           ("sfl-v2", "global"), ("adaptsfl", "global"), ("gapsl", "devices"),
                                           ("scala", "global"), ("cyclesl", "devices"), ("gas", "global")])
def test_each_algorithm_evaluates_the_model_docs_algorithms_names(name: str, expected: str) -> None:
    """docs/algorithms.md "What each algorithm evaluates", after one round of 4 devices at one cut."""
    from trainers.strategies import make_strategy

    options = {"gas": {"local_steps": 1}}.get(name, {})
    engine = SplitEngine(small_model(), [9] * 4, make_strategy(name, options), make_data(4), {"lr": 0.05},
                         batch_size=4, seed=0, interval=2)
    stats = engine.run_round(1)
    models = engine.strategy.eval_models(engine)
    if expected == "devices":
        assert len(models) == 4 and all(flat(m).equal(flat(engine.device_model(d))) for d, m in enumerate(models))
        return
    (model,) = models
    got = flat(model).clone()              # the averaged views reuse the engine's evaluation modules: copy first
    reference = {"holder": lambda: engine.device_model(engine.strategy.holder),
                 "global": lambda: engine.global_model()}[expected]()
    assert got.equal(flat(reference))
    if expected == "global" and name != "gas":     # I = 2: no average yet, so the client blocks are still w⁰
        assert not stats.aggregated and flat(*list(model)[:9]).equal(flat(*list(small_model())[:9]))
        assert not flat(*list(model)[:9]).equal(flat(*list(engine.averaged_model())[:9]))


def test_sampling_never_asks_more_devices_than_there_are() -> None:
    from trainers.api import sample_devices

    engine = SplitEngine(small_model(), [9], make_strategy_psl(), make_data(1), {"lr": 0.05}, batch_size=4, seed=0)
    assert sample_devices(engine.context(1), 0.1, minimum=2) == [0]


def test_strategies_see_server_passes_and_model_views_not_the_runtime_classes() -> None:
    """The two protocols of trainers.api are what EdgePasses and SplitEngine offer strategies:
    every protocol method exists there with the same parameters; the classes themselves are not
    part of the strategy API."""
    import inspect

    import trainers.api as api
    from trainers.engine.split_engine import SplitEngine
    from trainers.roles.passes import EdgePasses

    for protocol, cls in ((api.ServerPasses, EdgePasses), (api.ModelViews, SplitEngine)):
        methods = [n for n, v in vars(protocol).items() if inspect.isfunction(v) and not n.startswith("_")]
        assert methods, protocol
        for name in methods:
            wanted = list(inspect.signature(getattr(protocol, name)).parameters)
            assert list(inspect.signature(getattr(cls, name)).parameters)[:len(wanted)] == wanted, (cls, name)
    assert not {"EdgeServer", "EdgePasses", "SplitEngine"} & set(api.__all__)
    assert not any(hasattr(api, name) for name in ("EdgeServer", "EdgePasses", "SplitEngine"))
    assert {"ServerPasses", "ModelViews"} <= set(api.__all__)


def test_a_strategy_with_its_own_serve_must_say_so() -> None:
    """``server_step`` is what the runtime reads to decide how to serve a barrier: a class that defines ``serve``
    while leaving the default "parallel" would have its barriers served by the default step instead of its own."""
    import pytest

    from trainers.api import Strategy, parallel_step

    with pytest.raises(TypeError, match='Quiet defines its own serve: declare server_step = "own"'):
        class Quiet(Strategy):
            def serve(self, edge, ctx, arrivals):
                return parallel_step(edge, ctx, arrivals)

    class Declared(Strategy):
        server_step = "own"

        def serve(self, edge, ctx, arrivals):
            return parallel_step(edge, ctx, arrivals)

    assert Declared.server_step == "own"
