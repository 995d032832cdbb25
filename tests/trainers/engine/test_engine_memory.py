"""State for the population, work for the participants (issue 24): a device recomputes its forward
instead of holding its graph, the edge server serves a barrier in bounded chunks — each path equal
to the plain one for every algorithm — and a round counts the samples its participants trained."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.engine_builders import cuts_for
from trainers.config.train_config import ALGORITHMS, RECOMPUTE_BYTES
from trainers.engine.split_engine import DeviceData, SplitEngine
from trainers.inputs.models import cnn
from trainers.inputs.partition import partition_indices
from trainers.roles.core import Device, EdgeServer
from trainers.roles.messages import Activation
from trainers.roles.passes import EdgePasses
from trainers.strategies import make_strategy

torch.set_num_threads(1)
DEVICES, BATCH = 12, 8
CYCLESFL_QUARTER = {"participation": 0.25, "cycle_base": "sfl"}   # its average goes to every device (CSL-7)
CHUNKED = ("adaptsfl", "sfl-v1", "psl", "scala", "gas", "cyclesl")   # their server passes are served in chunks
PINNED = ("sl", "psl", "sfl-v1", "sfl-v2", "adaptsfl", "gapsl", "scala", "cyclesl", "gas", "sglr")
"""The algorithms whose serving these tests pin by name (CHUNKED, STREAMED, IN_PARTS); an algorithm registered later
gets every check that follows from its declared traits, and equality up to float rounding where chunks may sum."""


def data() -> DeviceData:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(DEVICES * BATCH * 4, 1, 8, 8, generator=g)
    y = torch.randint(0, 3, (DEVICES * BATCH * 4,), generator=g)
    return DeviceData(x, y, x[:16], y[:16], partition_indices(y.numpy(), DEVICES, "iid", 0))


def trained(algorithm: str, rounds: int = 4, options: dict | None = None, whole_gas_step: bool = False,
            **memory) -> list[torch.Tensor]:
    """``whole_gas_step``: GAS-8 as one pass over real ∪ generated at the flush (a BatchNorm model's way)."""
    torch.manual_seed(0)
    model = cnn(1, 8, 3, width=4)
    engine = SplitEngine(model, cuts_for(algorithm, [2] * DEVICES, len(model)), make_strategy(algorithm, options),
                         data(), {"lr": 0.05, "momentum": 0.9}, BATCH, seed=3, **memory)
    engine.passes.batch_independent = not whole_gas_step
    for t in range(1, rounds + 1):
        engine.run_round(t)
    devices = [p.detach().clone() for d in engine.devices for p in d.blocks.parameters()]
    server = [p.detach().clone() for m in engine.edge.instances.values() for p in m.parameters()]
    return devices + server


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_recomputed_client_forwards_train_bit_for_bit_the_same(algorithm) -> None:
    plain = trained(algorithm, server_pass_samples=None, client_recompute="off")
    recomputed = trained(algorithm, server_pass_samples=None, client_recompute="on")
    assert len(plain) == len(recomputed)
    assert all(torch.equal(a, b) for a, b in zip(plain, recomputed))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_barrier_served_in_chunks_trains_the_same_parameters(algorithm) -> None:
    # GAS over 2 rounds (its first flushes with generated activations included): on some CPUs (an AVX-512 EPYC)
    # the two runs part in one server step of its third round (6.7e-8 → 6.5e-6 apart, then growing), as any two
    # trainings of GAS do there — scaling its initial weights by 1 + 1e-7·N(0, 1) moves its parameters after 4
    # rounds by the same 0.026 (AdaptSFL's and SCALA's by 9e-8) — so beyond round 2 "equal up to float rounding"
    # is not a property of GAS on every CPU.
    rounds = 2 if algorithm == "gas" else 4
    one_pass = trained(algorithm, rounds, server_pass_samples=None, client_recompute="off")
    chunked = trained(algorithm, rounds, server_pass_samples=3 * BATCH - 1, client_recompute="on")   # chunks of 2 devices
    if algorithm in CHUNKED or algorithm not in PINNED:     # the mean loss's gradient summed chunk by chunk: equal up
        # to float rounding
        assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(one_pass, chunked))
    else:                        # their own server passes are never chunked
        assert all(torch.equal(a, b) for a, b in zip(one_pass, chunked))


@pytest.mark.parametrize("algorithm, options, rounds", [
    ("scala", {"participation": 0.5}, 4),                 # 6 participants × 8 samples: chunks of 2 devices
    ("gas", {"active": 6, "local_steps": 1}, 12),        # GAS-8 over 6 × 8 buffered + generated features in one
    ("cyclesl", {"participation": 0.5}, 4),               # CSL-5's pass at the frozen θ_S (CSL-4's steps: b_S = b)
])
def test_scala_gas_and_cyclesl_server_passes_in_chunks_train_the_same_parameters(algorithm, options, rounds, monkeypatch) -> None:
    passes: list[int] = []
    run, run_features = EdgePasses.run, EdgePasses.run_features
    monkeypatch.setattr(EdgePasses, "run", lambda self, arrivals, concatenate=True: passes.append(
        sum(int(a.tensor.shape[0]) for a in arrivals)) or run(self, arrivals, concatenate))
    monkeypatch.setattr(EdgePasses, "run_features", lambda self, x, d: passes.append(x.shape[0]) or run_features(self, x, d))
    whole_step = algorithm == "gas"
    one_pass = trained(algorithm, rounds, options, whole_step, server_pass_samples=None, client_recompute="off")
    whole = list(passes)
    passes.clear()
    chunked = trained(algorithm, rounds, options, whole_step, server_pass_samples=3 * BATCH - 1, client_recompute="off")
    assert len(one_pass) == len(chunked)
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(one_pass, chunked))
    # the plain run had passes over the budget; the chunked one none, and the same rows in all
    assert max(whole) > 3 * BATCH - 1 >= max(passes) and sum(passes) == sum(whole)


def test_spans_cover_the_rows_in_order_within_the_budget() -> None:
    template = cnn(1, 8, 3, width=4)
    edge = EdgePasses(EdgeServer(template, [2] * 5, lambda d, j, lc: None, _sgd()), pass_samples=20)
    assert edge.spans(45) == [slice(0, 20), slice(20, 40), slice(40, 45)]
    assert edge.spans(20) == [slice(0, 20)] and edge.spans(0) == [slice(0, 0)]
    edge.pass_samples = None
    assert edge.spans(45) == [slice(0, 45)]
    batch_norm = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.LazyLinear(3))
    assert EdgePasses(EdgeServer(batch_norm, [1] * 5, lambda d, j, lc: None, _sgd()), pass_samples=1).spans(45) == [slice(0, 45)]


def test_chunks_hold_at_most_the_budget_in_order() -> None:
    template = cnn(1, 8, 3, width=4)
    edge = EdgePasses(EdgeServer(template, [2] * 5, lambda d, j, lc: None, _sgd()), pass_samples=20)
    arrivals = [Activation(d, 1, 1, torch.zeros(n, 4, 8, 8), torch.zeros(n, dtype=torch.long))
                for d, n in enumerate([8, 8, 8, 30, 4])]
    chunks = edge.chunks(arrivals)
    assert [[a.device for a in c] for c in chunks] == [[0, 1], [2], [3], [4]]   # 16 ≤ 20; 24 > 20; 30 alone
    edge.pass_samples = None
    assert [[a.device for a in c] for c in edge.chunks(arrivals)] == [[0, 1, 2, 3, 4]]
    assert edge.chunks([]) == []
    batch_norm = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(144, 3))
    coupled = EdgePasses(EdgeServer(batch_norm, [1] * 5, lambda d, j, lc: None, _sgd()), pass_samples=1)
    assert len(coupled.chunks(arrivals)) == 1       # batch statistics span the pass: never chunked


@pytest.mark.parametrize("budget", [None, 20, 1])
def test_arrival_gradients_in_chunks_are_each_devices_cut_gradient_and_the_summed_server_gradient(budget) -> None:
    """EdgePasses.arrival_gradients over arrivals of one shared server, in passes of ``budget`` samples (20: [0, 1],
    [2, 3]; 1: one arrival each): ∂cut_loss_i/∂a_i by device and ∂Σ server_loss/∂w_s summed over the passes, the
    plain reference's — each device's loss alone through a copy of the server, the server loss over all samples at
    once — to float rounding; nothing accumulated into ``.grad``."""
    torch.manual_seed(0)
    template = cnn(1, 8, 3, width=4)
    edge = EdgePasses(EdgeServer(template, [2] * 4, lambda d, j, lc: None, _sgd()), pass_samples=budget)
    g = torch.Generator().manual_seed(2)
    arrivals = [Activation(d, 1, 1, torch.randn(n, 4, 8, 8, generator=g), torch.randint(0, 3, (n,), generator=g))
                for d, n in enumerate([8, 8, 8, 6])]
    weights = [1.0, 2.0, 3.0, 4.0]

    def cut_loss(d, logits, labels):
        return weights[d] * nn.functional.cross_entropy(logits, labels)

    def server_loss(logits, labels):
        return nn.functional.cross_entropy(logits, labels, reduction="sum")

    cut, summed = edge.arrival_gradients(arrivals, cut_loss, server_loss)
    server = nn.Sequential(*[edge.server.instances[(None, j)] for j in range(2, len(template))])
    params = list(server.parameters())
    assert all(p.grad is None for p in params)
    for a in arrivals:
        x = a.tensor.clone().requires_grad_(True)
        (expected,) = torch.autograd.grad(cut_loss(a.device, server(x), a.labels), [x])
        assert torch.allclose(cut[a.device], expected, atol=1e-6, rtol=1e-5)
    x, y = torch.cat([a.tensor for a in arrivals]), torch.cat([a.labels for a in arrivals])
    expected = torch.autograd.grad(server_loss(server(x), y), params)
    assert len(summed) == len(params)
    assert all(torch.allclose(s, e, atol=1e-5, rtol=1e-5) for s, e in zip(summed, expected))


def test_a_layout_is_keyed_by_its_own_deepest_cut() -> None:
    """AdaptSFL's rule (w_{n,i} per device below L_c, w_s shared from it): the layout of other cuts — a
    re-partition's new ones — is keyed by their L_c, not by the current cuts', and setting the cuts moves the
    default with them."""
    from trainers.strategies import AdaptSFL

    template = cnn(1, 8, 3, width=4)
    L = len(template)
    edge = EdgeServer(template, [1, 1], AdaptSFL().server_owner, _sgd())
    assert edge.layout([1, 1]) == [(None, j) for j in range(1, L)]
    assert edge.layout([1, 3]) == [(0, 1), (0, 2)] + [(None, j) for j in range(3, L)]
    assert edge.key(0, 1) == (None, 1) and edge.key(0, 1, 3) == (0, 1)
    edge.cuts = [1, 3]
    assert edge.cuts == (1, 3) and edge.key(0, 1) == (0, 1) and edge.key(0, 3) == (None, 3)


def _sgd():
    from trainers.roles.optim import OptimizerSpec

    return OptimizerSpec(lr=0.1)


def saved_bytes(step) -> int:
    """Bytes autograd keeps for backward while ``step`` runs (saved-tensor hooks see every save)."""
    total = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    return total[0]


def test_a_recomputing_device_holds_no_activations_while_it_waits() -> None:
    from trainers.roles.optim import OptimizerSpec

    d = data()
    torch.manual_seed(0)
    model = cnn(1, 8, 3, width=8)
    device = Device(0, model, 3, d.x_train, d.y_train, d.parts[0], BATCH, [0, 0], OptimizerSpec(lr=0.1))
    held = saved_bytes(lambda: device.forward(1))
    device.pending = None
    recomputed = saved_bytes(lambda: device.forward(2, recompute=True))
    assert held > 20_000 and recomputed < held / 50       # only the sample indices, not the block activations
    batch_norm = Device(0, nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4)), 2, d.x_train, d.y_train, d.parts[0],
                        BATCH, [0, 0], OptimizerSpec(lr=0.1))
    assert not batch_norm.can_recompute and device.can_recompute


def test_a_recomputed_forward_replays_its_dropout_masks_and_leaves_the_random_stream_alone() -> None:
    """The forward run again at backward time draws the masks the first one drew (the same gradient and step
    as without recomputing), and the run's random numbers after it are those it would have drawn anyway."""
    from trainers.roles.messages import CutGradient
    from trainers.roles.optim import OptimizerSpec

    d = data()
    outcomes = []
    for recompute in (False, True):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.Dropout(0.5)), nn.Linear(32, 3))
        device = Device(0, model, 1, d.x_train, d.y_train, d.parts[0], BATCH, [0, 0], OptimizerSpec(lr=0.1))
        sent = device.forward(1, recompute=recompute)
        drawn_meanwhile = torch.rand(3)                # the run goes on drawing while the device waits
        device.backward(CutGradient(0, 1, sent.step, torch.linspace(-1, 1, sent.tensor.numel()).view_as(sent.tensor)))
        outcomes.append((sent.tensor, drawn_meanwhile, torch.rand(3), [p.detach().clone() for p in device.blocks.parameters()]))
    (plain_a, plain_mid, plain_next, plain_w), (re_a, re_mid, re_next, re_w) = outcomes
    assert (plain_a == 0).any() and torch.equal(plain_a, re_a)                     # dropout did drop, the same units
    assert torch.equal(plain_mid, re_mid) and torch.equal(plain_next, re_next)
    assert all(torch.equal(a, b) for a, b in zip(plain_w, re_w))
    assert not torch.equal(plain_w[0], model[0][1].weight)                          # the step did change the weights


@pytest.mark.parametrize("extra, mode, expected", [(0, "auto", False), (1, "auto", True), (-10**9, "on", True),
                                                   (10**9, "off", False)])
def test_auto_recomputes_only_when_the_waiting_graphs_exceed_the_budget(extra, mode, expected) -> None:
    """The engine weighs each device's samples by its cut's graph bytes per sample (measured on its own blocks):
    half the devices at cut 1, half at cut 2, samples chosen so that the bytes land at the budget, or 1 over."""
    from trainers.engine.execution import graph_bytes_per_sample

    model = cnn(1, 8, 3, width=4)
    cuts = [1, 2] * (DEVICES // 2)
    engine = SplitEngine(model, cuts, make_strategy("psl"), data(), {"lr": 0.1}, BATCH, client_recompute=mode)
    x = data().x_train[:2]
    b1, b2 = (graph_bytes_per_sample(list(model)[:c], x) for c in (1, 2))
    assert b1.is_integer() and b2.is_integer() and 0 < b1 < b2
    n = RECOMPUTE_BYTES // int(b1 + b2)
    batch = {0: n, 1: n, 2: 0, 3: 0}                          # device 0 at cut 1, device 1 at cut 2
    spare = RECOMPUTE_BYTES - n * int(b1 + b2)                 # bytes left below the budget
    if extra > 0:
        batch[2] = spare // int(b1) + 1                        # the first sample over the budget
    assert engine.recompute(batch) is expected


def test_an_unknown_recompute_mode_names_the_field() -> None:
    from adaptplan.errors import InputError

    with pytest.raises(InputError) as info:
        SplitEngine(cnn(1, 8, 3, width=4), [2] * DEVICES, make_strategy("psl"), data(), {"lr": 0.1}, BATCH,
                    client_recompute="sometimes")
    assert info.value.field == "client_recompute"


@pytest.mark.parametrize("algorithm, expected", [("adaptsfl", DEVICES * BATCH), ("psl", DEVICES * BATCH)])
def test_a_round_counts_the_samples_its_devices_sent(algorithm, expected) -> None:
    engine = SplitEngine(cnn(1, 8, 3, width=4), [2] * DEVICES, make_strategy(algorithm), data(), {"lr": 0.1}, BATCH)
    assert engine.run_round(1).samples == expected


def test_gas_counts_only_its_active_devices_steps() -> None:
    strategy = make_strategy("gas")
    engine = SplitEngine(cnn(1, 8, 3, width=4), [2] * DEVICES, strategy, data(), {"lr": 0.1}, BATCH)
    stats = engine.run_round(1)
    steps = sum(d.step for d in engine.devices)              # every forward the round's active devices ran
    assert stats.samples == steps * BATCH
    assert 0 < stats.samples < 100 * DEVICES * BATCH


@pytest.mark.parametrize("algorithm", ["sfl-v1", "adaptsfl", "psl"])
def test_a_chunked_barrier_lets_each_chunks_devices_go_on_before_the_next_chunk(algorithm, monkeypatch) -> None:
    """The runtime hands each chunk's replies of the default parallel step over as soon as the chunk is done: its devices
    back-propagate before the next chunk is served (so one chunk's replies are held, not the round's),
    bit for bit what holding them all gives (a serve that returns every reply at the end)."""
    from trainers.api import parallel_step
    from trainers.engine.network import LocalNetwork
    from trainers.strategies import STRATEGIES

    log: list[str] = []
    run, send = EdgePasses.run, LocalNetwork.send
    monkeypatch.setattr(EdgePasses, "run", lambda self, arrivals, *a, **k: log.append("pass") or run(self, arrivals, *a, **k))
    monkeypatch.setattr(LocalNetwork, "send", lambda self, to, msg: (
        log.append("reply") if type(msg).__name__ == "CutGradient" else None) or send(self, to, msg))
    early = trained(algorithm, rounds=3, server_pass_samples=2 * BATCH, client_recompute="on")
    assert log[:9] == ["pass", "reply", "reply"] * 3                         # chunks of 2 devices, each answered at once

    class AtTheEnd(STRATEGIES[algorithm]):                                    # the same algorithm, replies held to the end
        server_step = "own"
        def serve(self, edge, ctx, arrivals):
            return parallel_step(edge, ctx, arrivals)

    monkeypatch.setitem(STRATEGIES, algorithm, AtTheEnd)
    log.clear()
    held = trained(algorithm, rounds=3, server_pass_samples=2 * BATCH, client_recompute="on")
    assert log[:DEVICES // 2 + 1] == ["pass"] * (DEVICES // 2) + ["reply"]
    assert len(early) == len(held) and all(torch.equal(a, b) for a, b in zip(early, held))


# ---- a barrier served as its devices forward (server_step = "parallel") ----------------------------
STREAMED = ("sfl-v1", "adaptsfl", "psl", "sl")      # the default serve: chunks independent until the final step
IN_PARTS = STREAMED + ("gapsl",)                    # GAPSL's own step in parts (each reply its device's alone)


def whole_barrier(algorithm: str):
    """The same algorithm with every activation of a barrier forwarded before the server serves any."""
    from trainers.strategies import STRATEGIES

    class Whole(STRATEGIES[algorithm]):
        server_step = "own"           # the default serve, given the whole barrier

        def barrier_step(self, edge, ctx, devices):
            return None               # GAPSL's serve, given the whole barrier

    return Whole


def uneven_data() -> DeviceData:
    """DEVICES devices; device 3 holds 3 samples (fewer than b: its mini-batch is min(b, |D_i|) = 3)."""
    d = data()
    parts = [p[:3] if i == 3 else p for i, p in enumerate(d.parts)]
    return DeviceData(d.x_train, d.y_train, d.x_test, d.y_test, parts)


def streamed_run(algorithm: str, whole: bool, monkeypatch, cuts=None, rounds: int = 3, model=None):
    from adaptplan.system import SystemProcess, generate_system
    from profilers import build_chain, profile_model
    from trainers.engine.clock import SimClock
    from trainers.strategies import STRATEGIES

    if whole:
        monkeypatch.setitem(STRATEGIES, algorithm, whole_barrier(algorithm))
        monkeypatch.setattr(SplitEngine, "may_stream", property(lambda self: False))
    torch.manual_seed(0)
    model = model or cnn(1, 8, 3, width=4)
    chain = build_chain(model, torch.zeros(2, 1, 8, 8))
    clock = SimClock(profile_model(chain, (1, 8, 8), model_name="cnn-synthetic"),
                     SystemProcess(generate_system(DEVICES, 0), seed=0, redraw=False), BATCH)
    engine = SplitEngine(chain.blocks, cuts or [2] * DEVICES, make_strategy(algorithm), uneven_data(),
                         {"lr": 0.05, "momentum": 0.9}, BATCH, seed=3, clock=clock, interval=2, server_pass_samples=2 * BATCH,
                         client_recompute="off")
    stats = [engine.run_round(t) for t in range(1, rounds + 1)]
    params = [p.detach().clone() for d in engine.devices for p in d.blocks.parameters()]
    params += [p.detach().clone() for m in engine.edge.instances.values() for p in m.parameters()]
    return stats, params


@pytest.mark.parametrize("algorithm, cuts", [("sfl-v1", None), ("adaptsfl", [1, 2, 3] * (DEVICES // 3)), ("psl", None),
                                             ("sl", None), ("sfl-v2", None), ("gapsl", None)])
def test_a_barrier_served_as_its_devices_forward_trains_bit_for_bit_what_the_whole_barrier_does(
        algorithm, cuts, monkeypatch) -> None:
    """Same parameters, losses, bytes, samples and simulated seconds (per stage too) as forwarding
    every device first; chunks of 2 devices, one device with fewer samples than b, a simulated clock."""
    streamed_stats, streamed = streamed_run(algorithm, False, monkeypatch, cuts)
    whole_stats, whole = streamed_run(algorithm, True, monkeypatch, cuts)
    assert len(streamed) == len(whole) and all(torch.equal(a, b) for a, b in zip(streamed, whole))
    for a, b in zip(streamed_stats, whole_stats):
        assert (a.loss, a.bytes_up, a.bytes_down, a.samples, a.sim_seconds) == (b.loss, b.bytes_up, b.bytes_down, b.samples,
                                                                               b.sim_seconds)
        assert a.stage_seconds == b.stage_seconds and a.sim_seconds > 0
    assert streamed_stats[0].samples == (DEVICES - 1) * BATCH + 3


def test_each_chunks_devices_forward_only_once_the_chunk_before_is_answered(monkeypatch) -> None:
    """Streamed: forward 2, pass, 2 replies, forward 2, ... so at most one chunk's devices wait at once;
    the whole barrier (and a model with Dropout, whose masks would be drawn in another order) forwards
    every device before the first pass."""
    from trainers.engine.network import LocalNetwork

    log: list[str] = []
    forward, run, send = Device.forward, EdgePasses.run, LocalNetwork.send
    monkeypatch.setattr(Device, "forward", lambda self, *a, **k: log.append("fwd") or forward(self, *a, **k))
    monkeypatch.setattr(EdgePasses, "run", lambda self, arrivals, *a, **k: log.append("pass") or run(self, arrivals, *a, **k))
    monkeypatch.setattr(LocalNetwork, "send", lambda self, to, msg: (
        log.append("reply") if type(msg).__name__ == "CutGradient" else None) or send(self, to, msg))
    streamed_run("sfl-v1", False, monkeypatch, rounds=1)
    # chunks of at most 2·b = 16 samples in arrival order: device 3's 3 samples go with one device of b = 8
    assert log == ["fwd", "fwd", "pass", "reply", "reply"] * (DEVICES // 2) and max_waiting(log) == 2
    log.clear()
    streamed_run("sfl-v2", False, monkeypatch, rounds=1)       # served on arrival: each chunk's two, then their replies
    assert log == ["fwd", "fwd", "pass", "pass", "reply", "reply"] * (DEVICES // 2) and max_waiting(log) == 2
    log.clear()
    streamed_run("gapsl", False, monkeypatch, rounds=1)        # its step in parts: each device's own cut gradient
    assert [e for e in log if e != "pass"] == ["fwd", "fwd", "reply", "reply"] * (DEVICES // 2) and max_waiting(log) == 2
    log.clear()
    streamed_run("sfl-v1", True, monkeypatch, rounds=1)
    assert log[:DEVICES + 1] == ["fwd"] * DEVICES + ["pass"] and max_waiting(log) == DEVICES
    log.clear()
    torch.manual_seed(0)
    dropout = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Dropout(0.1), nn.Linear(256, 3))
    streamed_run("sfl-v1", False, monkeypatch, rounds=1, model=dropout)
    assert log[:DEVICES + 1] == ["fwd"] * DEVICES + ["pass"]


@pytest.mark.parametrize("algorithm", ["psl", "gapsl"])
def test_a_barrier_served_whole_still_answers_each_chunk_at_once(algorithm, monkeypatch) -> None:
    """A model with Dropout is served whole (every device forwards first, so its masks keep their order); a step in
    parts (the default parallel step, GAPSL's) still gets the barrier a server chunk at a time and each chunk's
    replies go out before the next chunk is served."""
    from trainers.api import GradientRowsStep, ParallelStep
    from trainers.engine.network import LocalNetwork

    log: list[str] = []
    forward, send = Device.forward, LocalNetwork.send
    monkeypatch.setattr(Device, "forward", lambda self, *a, **k: log.append("fwd") or forward(self, *a, **k))
    monkeypatch.setattr(LocalNetwork, "send", lambda self, to, msg: (
        log.append("reply") if type(msg).__name__ == "CutGradient" else None) or send(self, to, msg))
    for step in (ParallelStep, GradientRowsStep):
        monkeypatch.setattr(step, "serve_part", (lambda serve_part: lambda self, part: log.append("part") or
                                                 serve_part(self, part))(step.serve_part))
    torch.manual_seed(0)
    dropout = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Dropout(0.1), nn.Linear(256, 3))
    streamed_run(algorithm, False, monkeypatch, rounds=1, model=dropout)
    assert log == ["fwd"] * DEVICES + ["part", "reply", "reply"] * (DEVICES // 2)


def max_waiting(log: list[str]) -> int:
    """The most devices that had forwarded and not yet received their reply, over the log."""
    waiting = most = 0
    for event in log:
        waiting += {"fwd": 1, "reply": -1}.get(event, 0)
        most = max(most, waiting)
    return most


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_only_the_default_serve_and_gapsls_plain_step_are_streamed(algorithm) -> None:
    """The runtime serves chunk by chunk (a ParallelStep) exactly where the strategy's server step is the default
    parallel one, and GAPSL's step in parts where each reply is its device's own (excluded_update = plain, not
    double_backprop); an algorithm with its own serve (SCALA, CycleSL, GAS, SGLR, and SFL-V2's arrival mode) gets
    the whole barrier."""
    from trainers.api import GradientRowsStep, ParallelStep, Strategy
    from trainers.engine.sync_round import chunk_server

    def stream_of(strategy):
        model = cnn(1, 8, 3, width=4)
        engine = SplitEngine(model, cuts_for(strategy.name, [2] * DEVICES, len(model)), strategy, data(), {"lr": 0.1},
                             BATCH)
        return chunk_server(engine, engine.context(1), list(range(DEVICES)))

    strategy = make_strategy(algorithm)
    stream = stream_of(strategy)
    default = type(strategy).serve is Strategy.serve and strategy.server_mode == "barrier"   # read off the code
    assert (strategy.server_step == "parallel" and strategy.server_mode == "barrier") is default
    assert isinstance(stream, ParallelStep) is default
    if algorithm in PINNED:
        assert default is (algorithm in STREAMED)
        assert (stream is not None) is (algorithm in IN_PARTS)
    else:                        # a later algorithm: streamed in parts where it gives a barrier step
        assert (stream is not None) is (default or type(strategy).barrier_step is not Strategy.barrier_step)
    if algorithm == "gapsl":
        assert isinstance(stream, GradientRowsStep)
        for options in ({"excluded_update": "none"}, {"gda": "double_backprop"}):
            assert stream_of(make_strategy("gapsl", options)) is None
        assert isinstance(stream_of(make_strategy("gapsl", {"gda": "gradient_step"})), GradientRowsStep)


# ---- devices whose models are equal share one copy until they diverge ----------------------------------
def storages(modules) -> set[int]:
    """The distinct storages behind the parameters of ``modules``."""
    return {p.untyped_storage().data_ptr() for m in modules for p in m.parameters()}


def test_a_broadcast_global_model_is_one_copy_until_a_device_trains(monkeypatch) -> None:
    """CycleSFL (ρ = 1/4, the global client model loaded into all N clients every round, CSL-7): after a round every device's
    client blocks are the download's tensors — one storage for all 12 devices, equal to the global
    model —; during the next round each participant trains on its own copy while the devices that sit
    out still share; its broadcast makes them one copy again."""
    torch.manual_seed(0)
    engine = SplitEngine(cnn(1, 8, 3, width=4), [2] * DEVICES, make_strategy("cyclesl", CYCLESFL_QUARTER), data(),
                         {"lr": 0.05, "momentum": 0.9}, BATCH, seed=3)
    engine.run_round(1)
    everyone = storages(b for d in engine.devices for b in d.blocks)
    assert everyone == storages(engine.devices[0].blocks) and len(everyone) == 2     # conv weight and bias
    assert all(d.shared == {0, 1} for d in engine.devices)
    for d in engine.devices:
        for j, block in enumerate(d.blocks):
            assert all(torch.equal(v, engine.fed.global_blocks[j][k]) for k, v in block.state_dict().items())
    seen: dict[int, set[int]] = {}
    run = EdgePasses.run
    monkeypatch.setattr(EdgePasses, "run", lambda self, arrivals, *a, **k: seen.update(
        {d.index: storages(d.blocks) for d in engine.devices}) or run(self, arrivals, *a, **k))
    engine.run_round(2)
    trained = set(engine.period)
    assert len(trained) == 3
    for d, held in seen.items():
        assert (held == everyone) is (d not in trained)               # the idle share, each participant its own
    assert len(set().union(*(seen[d] for d in trained))) == 2 * len(trained)
    again = storages(b for d in engine.devices for b in d.blocks)
    assert len(again) == 2 and again != everyone


def test_a_device_that_trains_leaves_the_others_copy_untouched() -> None:
    """AdaptSFL, I = 2: after the round-2 average the devices share; round 3 trains every device, each
    on its own copy (12 storages per parameter again) and the average they shared is unchanged."""
    torch.manual_seed(0)
    engine = SplitEngine(cnn(1, 8, 3, width=4), [2] * DEVICES, make_strategy("adaptsfl"), data(),
                         {"lr": 0.05, "momentum": 0.9}, BATCH, seed=3, interval=2)
    for t in (1, 2):
        engine.run_round(t)
    average = {j: {k: v.clone() for k, v in s.items()} for j, s in engine.fed.global_blocks.items()}
    assert len(storages(b for d in engine.devices for b in d.blocks)) == 2
    engine.run_round(3)
    assert len(storages(b for d in engine.devices for b in d.blocks)) == 2 * DEVICES
    assert not any(d.shared for d in engine.devices)
    assert all(torch.equal(v, average[j][k]) for j, s in engine.fed.global_blocks.items() for k, v in s.items())
    for d in engine.devices:                          # each trained away from the average it had shared
        assert not torch.equal(d.blocks[0].state_dict()["weight"], average[0]["weight"])


def test_sfl_v1_server_copies_share_the_average_until_their_device_is_served() -> None:
    torch.manual_seed(0)
    engine = SplitEngine(cnn(1, 8, 3, width=4), [2] * DEVICES, make_strategy("sfl-v1"), data(),
                         {"lr": 0.05, "momentum": 0.9}, BATCH, seed=3)
    """SplitFed V1 (I = 1): after the average the 12 server copies of a block are one storage (the
    download's); a copy about to run (``EdgeServer.instance``) becomes its own, the others still share."""
    engine.run_round(1)
    copies = [engine.edge.instances[(d, 3)] for d in range(DEVICES)]       # block 4: a convolution
    assert len(storages(copies)) == 2 and len(engine.edge.shared) == DEVICES * (engine.num_blocks - 2)
    average = {k: v.clone() for k, v in copies[1].state_dict().items()}
    engine.edge.instance((0, 3))
    assert len(storages(copies)) == 4 and storages(copies[1:]) == storages(copies[1:2])
    assert (0, 3) not in engine.edge.shared and (1, 3) in engine.edge.shared
    assert all(torch.equal(v, average[k]) for k, v in copies[0].state_dict().items())


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_shared_copies_train_bit_for_bit_what_private_copies_do(algorithm, monkeypatch) -> None:
    """Every algorithm, four rounds with momentum: the same parameters (devices and server) whether the
    template and every download are shared, or copied into every device and instance (the behaviour
    before sharing)."""
    import copy

    import trainers.roles.core as roles

    options = {"participation": 0.5} if algorithm in ("scala", "cyclesl") else ({"active": 4, "local_steps": 2}
                                                                                if algorithm == "gas" else None)
    shared = trained(algorithm, 4, options)

    def copy_in(module, state):
        module.load_state_dict(state)
        return False

    monkeypatch.setattr(roles, "share_state", copy_in)
    monkeypatch.setattr(roles, "shared_copy", copy.deepcopy)
    copied = trained(algorithm, 4, options)
    assert len(shared) == len(copied) and all(torch.equal(a, b) for a, b in zip(shared, copied))


def test_share_state_falls_back_to_a_copy_when_the_state_does_not_fit() -> None:
    """Shared where names, shapes, dtypes and devices match (the tensors themselves, Parameter objects
    kept); copied in (load_state_dict's conversions and checks) otherwise."""
    from trainers.roles.core import own_state, share_state

    module = nn.Linear(3, 2)
    weight = module.weight
    state = {k: torch.randn_like(v) for k, v in module.state_dict().items()}
    assert share_state(module, state) and module.weight is weight and weight.data_ptr() == state["weight"].data_ptr()
    own_state(module)
    assert weight.data_ptr() != state["weight"].data_ptr() and torch.equal(weight, state["weight"])
    doubled = {k: v.double() for k, v in state.items()}
    assert share_state(module, doubled) is False and module.weight.dtype == torch.float32
    assert torch.equal(module.weight, state["weight"]) and module.weight.data_ptr() != doubled["weight"].data_ptr()
    with pytest.raises(RuntimeError, match="extra"):                 # an unexpected name: load_state_dict refuses it
        share_state(module, {**state, "extra": state["bias"]})
    reshaped = {"weight": state["weight"].t().contiguous(), "bias": state["bias"]}
    with pytest.raises(RuntimeError, match="size mismatch"):
        share_state(module, reshaped)


def test_the_server_pass_budget_follows_the_device_unless_given() -> None:
    """``auto``: 128 samples on a CPU (passes that fit the caches: 1.0× centralized batch-b throughput
    instead of 0.7× with 1,024, docs/measured.md "The engine and its memory"), 1,024 on a GPU; a number as given; None
    one pass. TrainConfig takes auto or a positive integer and names the field otherwise."""
    from adaptplan.errors import InputError
    from trainers.config.train_config import CPU_PASS_SAMPLES, SERVER_PASS_SAMPLES, TrainConfig, pass_samples

    assert (CPU_PASS_SAMPLES, SERVER_PASS_SAMPLES) == (128, 1024)
    assert [pass_samples("auto", "cpu"), pass_samples("auto", "cuda"), pass_samples(64, "cuda"), pass_samples(None, "cpu")] \
        == [128, 1024, 64, None]
    engine = SplitEngine(cnn(1, 8, 3, width=4), [2] * DEVICES, make_strategy("psl"), data(), {"lr": 0.1}, BATCH)
    assert engine.passes.pass_samples == 128
    assert TrainConfig().execution.server_pass_samples == "auto" and TrainConfig.flat(server_pass_samples=7).execution.server_pass_samples == 7
    for bad in ("often", 0, 2.5):
        with pytest.raises(InputError) as info:
            TrainConfig.flat(server_pass_samples=bad)
        assert info.value.field == "server_pass_samples"


def test_devices_and_server_copies_start_as_one_copy_of_the_engines_own_template() -> None:
    """Before any round every device's client blocks and every SFL-V1 server copy are the template's
    tensors (one storage per parameter, whatever N); the template is the engine's own copy, so a
    caller who changes its model afterwards changes no device."""
    torch.manual_seed(0)
    model = cnn(1, 8, 3, width=4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    engine = SplitEngine(model, [2] * DEVICES, make_strategy("sfl-v1"), data(), {"lr": 0.05, "momentum": 0.9}, BATCH)
    client = [b for d in engine.devices for b in d.blocks]
    assert storages(client) == storages(engine.template[:2]) and len(storages(client)) == 2   # conv weight and bias
    server = [engine.edge.instances[(d, 3)] for d in range(DEVICES)]
    assert storages(server) == storages([engine.template[3]]) and len(storages(server)) == 2
    assert all(d.shared == {0, 1} for d in engine.devices) and len(engine.edge.shared) == len(engine.edge.instances)
    assert storages([model]).isdisjoint(storages(engine.template))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    assert all(torch.equal(v, before[f"0.{k}"]) for k, v in engine.devices[5].blocks[0].state_dict().items())
    engine.run_round(1)                                 # every device trained its own copy; the template is untouched
    assert all(torch.equal(v, before[f"0.{k}"]) for k, v in engine.template[0].state_dict().items())


def test_a_checkpoint_stores_a_shared_download_once() -> None:
    """CycleSFL's broadcast (CSL-7): 12 devices share the global client model, so the checkpoint holds it once
    (smaller than with 12 private copies by about 11 copies of the client blocks), and resuming from
    it gives every device the same values in copies of its own."""
    from trainers.roles.core import own_state
    from trainers.run.checkpoint import decode, encode

    torch.manual_seed(0)
    engine = SplitEngine(cnn(1, 8, 3, width=4), [7] * DEVICES, make_strategy("cyclesl", CYCLESFL_QUARTER), data(),
                         {"lr": 0.05, "momentum": 0.9}, BATCH, seed=3)
    engine.run_round(1)
    shared = encode(engine.state_dict())
    for d in engine.devices:
        for block in d.blocks:
            own_state(block)
    private = encode(engine.state_dict())
    client_bytes = sum(t.numel() * t.element_size() for b in engine.devices[0].blocks for t in b.state_dict().values())
    assert len(private) - len(shared) >= (DEVICES - 1) * client_bytes
    state = decode(shared, "checkpoint")
    resumed = SplitEngine(cnn(1, 8, 3, width=4), [7] * DEVICES, make_strategy("cyclesl", CYCLESFL_QUARTER), data(),
                          {"lr": 0.05, "momentum": 0.9}, BATCH, seed=3)
    resumed.load_state_dict(state)
    assert len(storages(b for d in resumed.devices for b in d.blocks)) == DEVICES * len(storages(resumed.devices[0].blocks))
    assert all(torch.equal(a, b) for d, e in zip(engine.devices, resumed.devices)
               for a, b in zip(d.blocks.parameters(), e.blocks.parameters()))


@pytest.mark.parametrize("algorithm", ["adaptsfl", "sfl-v1", "psl"])
def test_re_partitioning_shared_models_trains_bit_for_bit_what_private_copies_do(algorithm, monkeypatch) -> None:
    """Cuts moved after an average (blocks handed between devices and the server, new server
    instances, devices gaining template blocks) and trained on: the same parameters as copying."""
    import copy

    import trainers.roles.core as roles

    def run() -> list[torch.Tensor]:
        torch.manual_seed(0)
        engine = SplitEngine(cnn(1, 8, 3, width=4), [2] * DEVICES, make_strategy(algorithm), data(),
                             {"lr": 0.05, "momentum": 0.9}, BATCH, seed=3)
        engine.run_round(1)
        engine.set_cuts([1, 5, 8, 2] * (DEVICES // 4), 1)
        engine.run_round(2)
        engine.set_cuts([5, 2, 1, 8] * (DEVICES // 4), 2)
        engine.run_round(3)
        return ([p.detach().clone() for d in engine.devices for p in d.blocks.parameters()]
                + [p.detach().clone() for k in sorted(engine.edge.instances, key=str)
                   for p in engine.edge.instances[k].parameters()])

    shared = run()

    def copy_in(module, state):
        module.load_state_dict(state)
        return False

    monkeypatch.setattr(roles, "share_state", copy_in)
    monkeypatch.setattr(roles, "shared_copy", copy.deepcopy)
    copied = run()
    assert len(shared) == len(copied) and all(torch.equal(a, b) for a, b in zip(shared, copied))


def test_a_chunk_left_unanswered_is_named(monkeypatch) -> None:
    """A chunk server that answers only part of its chunk stops the round naming the device."""
    from trainers.api import ParallelStep
    from trainers.roles.messages import MessageMismatchError
    from trainers.strategies import STRATEGIES

    class Forgetful(ParallelStep):
        def serve_part(self, part):
            return [r for r in super().serve_part(part) if r.device != 5]

    import trainers.api
    monkeypatch.setattr(trainers.api, "ParallelStep", Forgetful)      # the runtime's chunk server
    Psl = STRATEGIES["psl"]
    engine = SplitEngine(cnn(1, 8, 3, width=4), [2] * DEVICES, Psl(), data(), {"lr": 0.1}, BATCH, server_pass_samples=2 * BATCH)
    with pytest.raises(MessageMismatchError, match=r"activation of device 5 \(round 1, step 1\) was never answered"):
        engine.run_round(1)


def test_what_is_marked_shared_is_exactly_what_shares() -> None:
    """The bookkeeping behind ``own_state``: a block loaded by copy (a download of another dtype) is
    its own and no longer marked; a server instance a re-partition creates from the template is marked
    shared and takes its own copy when it runs (the template untouched); a loaded checkpoint shares
    nothing."""
    from trainers.roles.messages import BlockState, ModelDownload
    from trainers.roles.optim import OptimizerSpec

    d = data()
    template = cnn(1, 8, 3, width=4)
    device = Device(0, template, 4, d.x_train, d.y_train, d.parts[0], BATCH, [0, 0], OptimizerSpec(lr=0.1))
    assert device.shared == {0, 1, 2, 3}
    doubled = {k: v.double() for k, v in template[3].state_dict().items()}
    device.download(ModelDownload(0, 1, "device", {3: BlockState(doubled)}))
    assert device.shared == {0, 1, 2} and storages([device.blocks[3]]).isdisjoint(storages([template[3]]))
    edge = EdgeServer(template, [4, 4], lambda dev, j, lc: dev, OptimizerSpec(lr=0.1))
    assert edge.shared == set(edge.instances)
    edge.download([ModelDownload(0, 1, "edge", {6: BlockState({k: v.double() for k, v in template[6].state_dict().items()})})])
    assert (0, 6) not in edge.shared and (1, 6) in edge.shared
    edge.download([], new_cuts=[3, 4])                     # device 0 hands block 4 (index 3) to the server
    assert (0, 3) in edge.instances and (0, 3) in edge.shared
    assert storages([edge.instances[(0, 3)]]) == storages([template[3]])
    before = {k: v.clone() for k, v in template[3].state_dict().items()}
    module = edge.instance((0, 3))
    with torch.no_grad():
        for p in module.parameters():
            p.add_(1.0)
    assert all(torch.equal(v, before[k]) for k, v in template[3].state_dict().items()) and (0, 3) not in edge.shared
    edge.load_state_dict(edge.state_dict())
    assert edge.shared == set()
    device.load_state_dict(device.state_dict())
    assert device.shared == set()


def test_the_documented_budgets_are_the_engines() -> None:
    """docs/engine.md "Memory" and the help of --client-recompute state the thresholds the engine uses."""
    from pathlib import Path

    from adaptplan.cli import build_parser
    from trainers.config.train_config import CPU_PASS_SAMPLES, RECOMPUTE_BYTES, SERVER_PASS_SAMPLES

    docs = " ".join((Path(__file__).parents[3] / "docs" / "engine.md").read_text(encoding="utf-8").split())
    assert f"would keep more than {RECOMPUTE_BYTES // 2**30} GiB for backward at once" in docs
    assert f"`auto` is {CPU_PASS_SAMPLES} samples on a CPU and {SERVER_PASS_SAMPLES:,} on a GPU" in docs
    assert (RECOMPUTE_BYTES, CPU_PASS_SAMPLES, SERVER_PASS_SAMPLES) == (2**30, 128, 1024)
    helps = {a.dest: a.help for a in build_parser()._subparsers._group_actions[0].choices["train"]._actions}
    assert f"more than {RECOMPUTE_BYTES / 2**30:g} GiB" in helps["client_recompute"]
    assert f"{CPU_PASS_SAMPLES} on a cpu" in helps["server_pass_samples"]


@pytest.mark.parametrize("algorithm", ["psl", "sfl-v2"])
def test_a_streamed_device_that_sends_other_than_its_mini_batch_is_named(algorithm, monkeypatch) -> None:
    """The chunks are cut for min(b_i, |D_i|) samples per device: one that sends fewer stops the round."""
    from trainers.roles.messages import MessageMismatchError

    forward = Device.forward
    monkeypatch.setattr(Device, "forward", lambda self, t, b=None, recompute=False: forward(
        self, t, b - 1 if self.index == 4 else b, recompute))
    engine = SplitEngine(cnn(1, 8, 3, width=4), [2] * DEVICES, make_strategy(algorithm), data(), {"lr": 0.1}, BATCH,
                         seed=3, server_pass_samples=2 * BATCH)
    with pytest.raises(MessageMismatchError, match=rf"^device 4 sent {BATCH - 1} samples in round 1, expected {BATCH} "):
        engine.run_round(1)
