"""GAS (docs/algorithms.md, GAS) against an independent reference written from B.2's event loop (the
engine's zero-time clock: every stage 0 s, ties to the first active slot): LA cut gradient at the
current server (GAS-9/10), buffer of Q_s mini-batches with weights ω (GAS-2/3), statistics (GAS-5b,
diagonal), generation (GAS-6/7), server step on real ∪ generated (GAS-8), |D_k|-weighted averaging at
Q_c uploads (GAS-12). Plus the statistics (GAS-4/5 sample by sample = GAS-5b with λ = 0), the
buffer/generation/clock invariants of B.4.9 and the flags' bad-input handling."""

from __future__ import annotations

import copy
import sys

import numpy as np
import pytest
import torch
from torch import nn

from adaptplan.system import SystemProcess, generate_system
from profilers import build_chain, profile_model
from tests.async_fl_reference import serve_next
from tests.cli_checks import assert_train_flag_error
from tests.engine_builders import FixedClock, flat, make_data, random_times, small_model
from tests.reference_optim import HandSGD
from trainers.engine.clock import SimClock
from trainers.engine.split_engine import STRATEGY_STREAM, DeviceData, SplitEngine
from trainers.inputs.partition import DeviceSampler
from trainers.roles.optim import OptimizerSpec
from trainers.strategies import GAS
from trainers.strategies.gas import LabelStatistics

CUT, B, LR, M = 9, 16, 0.1, 10
LAM = 1e-5




def sgd(module: nn.Module) -> None:
    with torch.no_grad():
        for p in module.parameters():
            if p.grad is not None:
                p -= LR * p.grad
                p.grad = None


# ---- statistics: GAS-4/5 sample by sample = GAS-5b batch merge with λ = 0 -----------------------------
def welford(rows: torch.Tensor, weights: torch.Tensor, full: bool):
    """GAS-4 and GAS-5 applied one activation at a time (float64)."""
    mu, cov, S = None, None, 0.0
    for a, w in zip(rows.double(), weights.double().tolist()):
        if mu is None:
            mu, cov, S = a.clone(), torch.zeros(a.numel(), a.numel()) if full else torch.zeros(a.numel()), w
            cov = cov.double()
            continue
        mu_new = S / (S + w) * mu + w / (S + w) * a
        shift, dev = mu_new - mu, mu_new - a
        outer = (lambda u: torch.outer(u, u)) if full else (lambda u: u * u)
        cov = (S * (cov + outer(shift)) + w * outer(dev)) / (S + w)
        mu, S = mu_new, S + w
    return mu, cov, S


@pytest.mark.parametrize("full", [False, True])
def test_batch_merge_equals_sample_by_sample_with_lambda_zero(full: bool) -> None:
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(40, 6, generator=g) * torch.arange(1, 7) + 3
    weights = torch.randint(1, 20, (40,), generator=g).double()
    stats = LabelStatistics(full)
    for chunk in (slice(0, 7), slice(7, 8), slice(8, 25), slice(25, 40)):
        stats.merge(rows[chunk], weights[chunk], lam=0.0)
    mu, cov, S = welford(rows, weights, full)
    assert stats.weight == pytest.approx(S)
    assert torch.allclose(stats.mean, mu, atol=1e-10)
    assert torch.allclose(stats.cov, cov, atol=1e-9)
    # = the weighted population mean and (co)variance of all rows
    w = weights / weights.sum()
    direct_mu = (w[:, None] * rows.double()).sum(0)
    c = rows.double() - direct_mu
    direct = (w[:, None, None] * c[:, :, None] * c[:, None, :]).sum(0) if full else (w[:, None] * c * c).sum(0)
    assert torch.allclose(stats.cov, direct, atol=1e-9)


def test_lambda_added_at_every_merge_but_the_first() -> None:
    rows = torch.randn(12, 3, generator=torch.Generator().manual_seed(1))
    w = torch.ones(12)
    plain, reg = LabelStatistics(False), LabelStatistics(False)
    plain.merge(rows[:4], w[:4], lam=0.0)
    reg.merge(rows[:4], w[:4])
    assert torch.equal(plain.cov, reg.cov)                    # the first batch initialises, no λ
    for chunk in (slice(4, 8), slice(8, 12)):
        plain.merge(rows[chunk], w[chunk], lam=0.0)
        reg.merge(rows[chunk], w[chunk])
    # second merge adds λ, the third carries (2/3)·λ of it and adds λ again
    assert torch.allclose(reg.cov - plain.cov, torch.full((3,), LAM * (2 / 3) + LAM, dtype=torch.float64), atol=1e-15)


def merge_diag(stat: dict | None, rows: torch.Tensor, w: torch.Tensor) -> dict:
    """GAS-5b, diagonal variant, λ = 1e-5 (the reference's own implementation)."""
    x, w = rows.double(), w.double()
    W = float(w.sum())
    mu_b = (w[:, None] * x).sum(0) / W
    var_b = (w[:, None] * (x - mu_b) ** 2).sum(0) / W
    if stat is None:
        return {"mu": mu_b, "var": var_b, "S": W}
    d = stat["S"] / (stat["S"] + W)
    mu = d * stat["mu"] + (1 - d) * mu_b
    var = d * (stat["var"] + (mu - stat["mu"]) ** 2) + (1 - d) * (var_b + (mu - mu_b) ** 2) + LAM
    return {"mu": mu, "var": var, "S": stat["S"] + W}


# ---- the event loop ------------------------------------------------------------------------------------
def _reference_flush(buffer, stats, generation: bool, rng, server, opt, shape) -> tuple[dict[int, int], int]:
    """A flush of B.2's buffer: the per-label statistics merged (GAS-5b), B − n_y features generated for each label
    short of B once every label has statistics (GAS-6/7), one server step on the buffer and them (GAS-8). Returns
    the samples generated per label and the rows the server stepped on."""
    rows = torch.cat([r for r, _, _ in buffer])
    labels = torch.cat([y for _, y, _ in buffer])
    weights = torch.cat([torch.full((len(y),), w) for _, y, w in buffer])
    for y in sorted(set(labels.tolist())):                                         # GAS-5b
        stats[y] = merge_diag(stats.get(y), rows[labels == y], weights[labels == y])
    feats, targets, made = [rows], [labels], {}
    if generation and len(stats) == M:
        counts = np.bincount(labels.numpy(), minlength=M)
        made = {y: B - int(counts[y]) for y in range(M) if counts[y] < B}                 # GAS-6
        if made:      # one seed off the strategy stream per flush; float32 normals, label by label
            g = torch.Generator().manual_seed(int(rng.integers(2 ** 63)))
            z = torch.randn((sum(made.values()), rows.shape[1]), generator=g).double()
        for y, n in made.items():
            z_y, z = z[:n], z[n:]
            feats.append((stats[y]["mu"] + z_y * torch.sqrt(stats[y]["var"] + LAM)).float())  # GAS-7
            targets.append(torch.full((n,), y, dtype=labels.dtype))
    x = torch.cat(feats).reshape(-1, *shape)
    nn.functional.cross_entropy(server(x), torch.cat(targets)).backward()         # GAS-8
    opt.step(server)
    return made, x.shape[0]


def reference_gas(data: DeviceData, rounds: int, C: int, E: int, Q: int, generation: bool, times=None,
                  opt: HandSGD | None = None):
    """B.2 with ``opt`` (plain SGD at LR by default; a joining device restarts its momentum when it loads the
    global client model, docs/algorithms.md "Optimizer state"). Clock (adaptplan's stages, the engine's convention): device k is ready at r_k, its
    activation arrives at r_k + T^F_k + T^A_k; the earliest arrival is served (ties: the first active slot),
    the server busy T^S_k from max(arrival, server free), then a flush's rows × T^S_k / B more (spec Part C);
    k is ready again T^D_k + T^B_k after its reply (before the flush); an upload adds
    T^mU_k and the replacement is ready T^mD after it. ``times`` None: every stage 0 s."""
    T = (lambda name, j: float(getattr(times, name)[j])) if times is not None else (lambda name, j: 0.0)
    opt = opt or HandSGD(LR)
    N = len(data.parts)
    model = small_model()
    clients = [copy.deepcopy(nn.Sequential(*model[:CUT])) for _ in range(N)]
    server = copy.deepcopy(nn.Sequential(*model[CUT:]))
    samplers = [DeviceSampler(data.parts[k], B, [0, k]) for k in range(N)]
    sizes = [len(p) for p in data.parts]
    priors = [np.bincount(data.y_train[torch.from_numpy(p)].numpy(), minlength=M) / len(p) for p in data.parts]
    rng = np.random.default_rng([0, STRATEGY_STREAM])
    active = sorted(int(k) for k in rng.choice(N, size=C, replace=False))
    clock, free, served = {k: 0.0 for k in active}, 0.0, []
    join, local, steps = {k: 0 for k in active}, {k: 0 for k in active}, {k: 0 for k in active}
    buffer, models, stats, version, global_model, log = [], [], {}, 0, None, []
    for t in range(1, rounds + 1):
        while True:
            k, free = serve_next(active, clock, free, T)
            served.append(k)
            idx = torch.from_numpy(samplers[k].next())
            A, Y = clients[k](data.x_train[idx]), data.y_train[idx]                           # GAS-1
            leaf = A.detach().requires_grad_(True)
            shifted = server(leaf) + torch.tensor(np.log(priors[k] + 1e-12), dtype=torch.float32)
            G = torch.autograd.grad(nn.functional.cross_entropy(shifted, Y), leaf)[0]       # GAS-9/10
            buffer.append((A.detach().reshape(len(Y), -1), Y, float(E * join[k] + local[k] + 1)))  # GAS-2/3
            local[k] += 1
            if len(buffer) == Q:                                                              # flush
                made, flushed = _reference_flush(buffer, stats, generation, rng, server, opt, A.shape[1:])
                free += flushed * T("server", k) / B      # the flush's pass, after k's reply (the zero FLOP/s term)
                log.append(made)
                buffer = []
            A.backward(G)                                                                     # GAS-11
            opt.step(clients[k])
            steps[k] += 1
            if steps[k] < E:
                continue
            models.append((k, [p.detach().clone() for p in clients[k].parameters()]))
            finished_at = clock[k] + T("model_up", k)
            done = len(models) == C
            if done:                                                                          # GAS-12
                w = [float(sizes[j]) for j, _ in models]
                global_model = [sum(wj * ps[i] for wj, (_, ps) in zip(w, models)) / sum(w)
                                for i in range(len(models[0][1]))]
                models, version = [], version + 1
            new = int(rng.choice([j for j in range(N) if j not in active]))
            slot = active.index(k)
            active[slot] = new
            for dct in (clock, steps):
                dct.pop(k)
            clock[new], steps[new], join[new], local[new] = finished_at + T("model_down", new), 0, version, 0
            if global_model is not None:
                opt.restart(clients[new])
                with torch.no_grad():
                    for p, g in zip(clients[new].parameters(), global_model):
                        p.copy_(g)
            if done:
                break
        yield t, clients, server, global_model, log, served


def make_gas_engine(data: DeviceData, clock=None, optimizer=None, **options) -> SplitEngine:
    return SplitEngine(small_model(), [CUT] * len(data.parts), GAS(**options), data,
                       optimizer or {"lr": LR, "momentum": 0.0}, batch_size=B, seed=0, clock=clock)


@pytest.mark.parametrize("buffer,generation,clocked,defaults,split", [
    (0, "on", False, False, True), (2, "off", False, False, True), (1, "on", False, False, True),
    (0, "on", True, False, True), (0, "on", True, True, True), (0, "on", True, True, False)])
def test_gas_matches_reference_from_the_spec(buffer: int, generation: str, clocked: bool, defaults: bool, split: bool,
                                             rounds: int = 2) -> None:
    """Plain SGD, and the defaults' optimizer (momentum 0.9, weight decay 5e-4, clipping — at 1 so that it acts);
    GAS-8 split (the real activations' gradients taken at arrival) and, as for a model with BatchNorm, in one pass
    over real ∪ generated at the flush."""
    N, C, E = 6, 3, 3
    data = make_data(N, "dirichlet")
    clock = FakeClock(N, seed=3) if clocked else None
    spec = OptimizerSpec("sgd", LR, 0.9, 5e-4, 1.0) if defaults else None
    engine = make_gas_engine(data, clock=clock, optimizer=spec, active=C, local_steps=E, buffer=buffer,
                             generation=generation)
    engine.passes.batch_independent = split
    Q = buffer or C
    flushes = 0
    for t, clients, server, global_model, log, served in reference_gas(data, max(rounds, 3 if defaults else 2), C, E,
                                                                       Q, generation == "on",
                                                                       clock.times if clock else None,
                                                                       HandSGD(LR, 0.9, 5e-4, 1.0) if defaults else None):
        stats = engine.run_round(t)
        assert stats.aggregated
        assert engine.strategy.version == t
        assert engine.strategy.server_updates == len(log)
        assert stats.metrics.get("generated", 0.0) == sum(sum(m.values()) for m in log[flushes:])
        flushes = len(log)
        assert torch.allclose(flat(*[engine.edge.instances[(None, j)] for j in range(CUT, 11)]), flat(server),
                              atol=1e-5, rtol=0), f"server, round {t}"
        for k in range(N):
            assert torch.allclose(flat(engine.devices[k].blocks), flat(clients[k]), atol=1e-5, rtol=0), \
                f"device {k}, round {t}"
        glob = torch.cat([v.reshape(-1) for j in sorted(engine.fed.global_blocks)
                          for v in engine.fed.global_blocks[j].values()])
        assert torch.allclose(glob, torch.cat([g.reshape(-1) for g in global_model]), atol=1e-5, rtol=0)
    # zero-time clock: the first slot always wins the tie (a device's E steps in a row); a real clock interleaves
    assert (len(set(served[:E])) > 1) == clocked
    if generation == "off":
        assert not any(log)
    else:                                         # generated, and (zero clock) nothing before all labels are seen
        assert any(log) and (clocked or log[0] == {})


# ---- invariants (B.4.9) under a heterogeneous clock -------------------------------------------------------
def FakeClock(n: int, seed: int = 0) -> FixedClock:
    """Chosen per-device stage seconds (what a SimClock would give), the same every round."""
    return FixedClock(random_times(n, seed))


def spy_engine(N: int, C: int, E: int, buffer: int = 0, clock=None, generation: str = "on", defer: bool = False):
    """A GAS engine whose serve/replace record the loop's state at every event (``defer``: arrivals may wait to be
    served together, an event per serve)."""
    return spy(make_gas_engine(make_data(N, "dirichlet"), clock=clock, active=C, local_steps=E, buffer=buffer,
                               generation=generation), defer)


def spy(engine: SplitEngine, defer: bool = False):
    """Records the loop's state at every serve and replace; unless ``defer``, every arrival is served at once, so
    that a serve is one event of the loop."""
    s, events = engine.strategy, []
    serve, replace = s.serve, s.replace
    if not defer:
        s.defer = lambda edge, ctx, waiting: False

    def serve_spy(edge, ctx, arrivals):
        st = engine.async_state
        server_before = flat(*edge.server.instances.values())
        out = serve(edge, ctx, arrivals)
        events.append({"device": arrivals[0].device, "devices": [a.device for a in arrivals],
                       "samples": sum(int(a.tensor.shape[0]) for a in arrivals),
                       "clock": dict(st.clock), "active": list(st.active),
                       "buffer": len(s.buffer), "updates": s.server_updates,
                       "server_moved": not torch.equal(server_before, flat(*edge.server.instances.values())),
                       "models": len(s.models)})
        return out

    def replace_spy(ctx, finished, active):
        new = replace(ctx, finished, active)
        events.append({"replace": (finished, new, list(active)), "models": len(s.models), "version": s.version})
        return new

    s.serve, s.replace = serve_spy, replace_spy
    return engine, events


def test_buffer_flushes_exactly_every_q_s_arrivals() -> None:
    engine, events = spy_engine(N=6, C=3, E=4, buffer=5, clock=FakeClock(6))
    for t in (1, 2, 3):
        engine.run_round(t)
        assert engine.strategy.version == t                    # one model flush per round
    arrivals = [e for e in events if "device" in e]
    assert len(arrivals) >= 30                                 # about Q_c·E arrivals per global iteration
    for n, e in enumerate(arrivals, start=1):
        assert e["buffer"] == n % 5 and e["buffer"] < 5        # 𝒜 never holds Q_s; empty right after a flush
        assert e["updates"] == n // 5
        assert e["server_moved"] == (n % 5 == 0)               # the server steps only at every Q_s-th arrival
    assert all(e["models"] < 3 for e in events)                # ℳ flushed when it reaches Q_c


@pytest.mark.parametrize("batch_independent", [True, False])
def test_generation_counts_once_all_labels_are_seen(batch_independent: bool, monkeypatch) -> None:
    """n̂_y per label; the flush's pass holds the generated rows alone where the real ones were differentiated at
    arrival (no BatchNorm), real ∪ generated where samples interact in a pass."""
    engine, _ = spy_engine(N=6, C=3, E=3, buffer=1)
    engine.passes.batch_independent = batch_independent
    s = engine.strategy
    flushes, draws = [], []
    sample = LabelStatistics.sample
    monkeypatch.setattr(LabelStatistics, "sample", lambda self, z: draws.append((self, z.shape[0])) or sample(self, z))
    original = s.flush_buffer

    def flush_spy(edge, ctx, device):
        labels = torch.cat([y for _, y, _ in s.buffer])
        known = set(s.stats) | set(labels.tolist())
        start = len(draws)
        run_features = edge.run_features
        sizes = []
        edge.run_features = lambda x, d: sizes.append(x.shape[0]) or run_features(x, d)
        original(edge, ctx, device)
        del edge.run_features
        by_label = {y: n for st, n in draws[start:] for y in s.stats if s.stats[y] is st}
        flushes.append((labels, known, by_label, sum(sizes)))        # in row slices within the pass budget

    s.flush_buffer = flush_spy
    engine.run_round(1)
    engine.run_round(2)
    assert any(len(k) < M for _, k, _, _ in flushes) and any(len(k) == M for _, k, _, _ in flushes)
    for labels, known, by_label, rows in flushes:
        counts = np.bincount(labels.numpy(), minlength=M)
        expected = {y: B - int(counts[y]) for y in range(M) if counts[y] < B} if len(known) == M else {}
        assert by_label == expected                                # n̂_y = max(0, B − n_y), all labels seen
        assert rows == len(labels) * (not batch_independent) + sum(expected.values())
        if expected:
            assert all(max(int(counts[y]), B) == int(counts[y]) + expected.get(y, 0) for y in range(M))


def test_no_generation_when_off(monkeypatch) -> None:
    engine, _ = spy_engine(N=6, C=3, E=3, buffer=1, generation="off")
    monkeypatch.setattr(LabelStatistics, "sample", lambda *a: pytest.fail("generated with --generation off"))
    stats = engine.run_round(1)
    assert stats.metrics.get("generated", 0.0) == 0.0 and engine.strategy.server_updates > 0


@pytest.mark.parametrize("budget, buffer", [("auto", 0), (2 * B, 0), (None, 0), ("auto", 23)])
def test_arrivals_left_waiting_train_and_time_as_if_each_were_served_at_once(budget, buffer) -> None:
    """AsyncStrategy.defer: arrivals between two flushes wait and are served in one pass. The run is the eager
    loop's — the same devices served in the same order, every parameter equal to float rounding, the loop's clock
    equal bit for bit — and a pass never holds one device twice, more than the pass budget (CPU: 128 samples),
    or arrivals on both sides of a flush. Q_s = 23 > C: arrivals still wait when a global iteration ends."""
    N, C, E = 14, 10, 3                       # Q_s = C: 160 samples between two flushes

    def build(defer: bool):
        engine = SplitEngine(small_model(), [CUT] * N, GAS(active=C, local_steps=E, buffer=buffer), make_data(N, "dirichlet"),
                             {"lr": LR, "momentum": 0.0}, batch_size=B, seed=0, clock=FakeClock(N, seed=3),
                             server_pass_samples=budget)
        return spy(engine, defer)

    (eager, eager_events), (waited, waited_events) = build(False), build(True)
    for t in (1, 2, 3):
        eager.run_round(t), waited.run_round(t)
        assert torch.allclose(everything_of(eager), everything_of(waited), atol=1e-6, rtol=0), f"round {t}"
        assert waited.async_state == eager.async_state, f"round {t}"
        assert waited.timeline.server_free == eager.timeline.server_free, f"round {t}"
    order = [d for e in waited_events if "devices" in e for d in e["devices"]]
    assert order == [e["device"] for e in eager_events if "device" in e]
    passes = [e for e in waited_events if "devices" in e]
    limit = {"auto": 128, None: (buffer or C) * B}.get(budget, budget)
    assert max(e["samples"] for e in passes) == limit or buffer  # the passes fill the budget, or Q_s without one
    for e in passes:
        assert len(set(e["devices"])) == len(e["devices"]) and e["samples"] <= limit
        assert e["buffer"] == 0 or not e["server_moved"]       # a flush only after the last arrival of a pass
    assert len(passes) < len(order)


def test_serving_arrivals_together_across_a_flush_equals_serving_them_one_by_one() -> None:
    """GAS.serve given arrivals on both sides of a flush (Q_s = 3, one already buffered): those before the flush
    are answered at the old w_s, the flush steps, the rest are answered at the new w_s — the replies, 𝒜 and the
    server of serving them one at a time, to float rounding."""
    def build() -> SplitEngine:
        engine = make_gas_engine(make_data(6, "dirichlet"), active=2, local_steps=2, buffer=3)
        engine.run_round(1)
        return engine

    together, alone = build(), build()
    assert len(together.strategy.buffer) == 1
    replies = []
    for engine in (together, alone):
        arrivals = [engine.devices[d].forward(2, B) for d in range(5)]
        ctx = engine.context(2)
        if engine is together:
            replies.append(engine.strategy.serve(engine.passes, ctx, arrivals))
        else:
            replies.append([r for a in arrivals for r in engine.strategy.serve(engine.passes, ctx, [a])])
    assert [r.device for r in replies[0]] == [r.device for r in replies[1]] == list(range(5))
    assert all(torch.allclose(a.tensor, b.tensor, atol=1e-7, rtol=0) for a, b in zip(*replies))
    assert together.strategy.server_updates == alone.strategy.server_updates == 3     # round 1's and two flushes
    assert len(together.strategy.buffer) == len(alone.strategy.buffer) == 0
    assert torch.allclose(flat(*together.edge.instances.values()), flat(*alone.edge.instances.values()), atol=1e-6)


def test_a_strategy_that_charges_for_arrivals_it_let_wait_is_refused() -> None:
    """The loop times a waiting arrival as it arrives: server work charged while serving arrivals that waited
    (here at the upload that needs its device's reply) has no place on the clock, so it is an error, not lost."""
    class Charging(GAS):
        def defer(self, edge, ctx, waiting):
            return True

        def serve(self, edge, ctx, arrivals):
            ctx.charge_server(arrivals[0].device, samples=1)
            return super().serve(edge, ctx, arrivals)

    engine = SplitEngine(small_model(), [CUT] * 4, Charging(active=2, local_steps=2), make_data(4, "dirichlet"),
                         {"lr": LR, "momentum": 0.0}, batch_size=B, seed=0, clock=FakeClock(4))
    with pytest.raises(RuntimeError, match="gas charged server work for arrivals it let wait"):
        engine.run_round(1)


def test_events_in_non_decreasing_arrival_time() -> None:
    clock = FakeClock(6, seed=3)
    times = clock.times
    engine, events = spy_engine(N=6, C=3, E=3, clock=clock)
    for t in (1, 2, 3):
        engine.run_round(t)
    arrivals = []
    for e in events:
        if "device" not in e:
            continue
        arrive = {k: e["clock"][k] + times.client_fp[k] + times.upload[k] for k in e["active"]}
        assert arrive[e["device"]] == pytest.approx(min(arrive.values()))   # the earliest arrival is served
        arrivals.append(arrive[e["device"]])
    assert len(arrivals) > 20
    assert all(b >= a - 1e-9 for a, b in zip(arrivals, arrivals[1:]))
    assert len({e["device"] for e in events if "device" in e}) > 3          # several devices interleave


def test_real_clock_serves_arrivals_in_order_and_replaces_with_idle_devices() -> None:
    """The same invariants with the Trainer's clock: a SimClock from the model's profile and a generated system."""
    N, C = 6, 3
    model = small_model()
    chain = build_chain(model, torch.zeros(2, 1, 8, 8))
    profile = profile_model(chain, (1, 8, 8), model_name="cnn-synthetic")
    clock = SimClock(profile, SystemProcess(generate_system(N, 0), seed=0, redraw=False), B)
    engine, events = spy(SplitEngine(chain.blocks, [3] * N, GAS(active=C, local_steps=3), make_data(N, "dirichlet"),
                                     {"lr": LR, "momentum": 0.0}, batch_size=B, seed=0, clock=clock))
    times = clock.stage_times(1, [3] * N)
    assert len(set(np.round(times.client_fp + times.upload, 12))) == N          # heterogeneous devices
    for t in (1, 2, 3):
        engine.run_round(t)
    arrivals = []
    for e in events:
        if "device" in e:
            arrive = {k: e["clock"][k] + times.client_fp[k] + times.upload[k] for k in e["active"]}
            assert arrive[e["device"]] == pytest.approx(min(arrive.values()), rel=1e-12, abs=1e-15)
            arrivals.append(arrive[e["device"]])
        else:
            finished, new, active = e["replace"]
            assert new != finished and new not in active
    assert all(b >= a for a, b in zip(arrivals, arrivals[1:]))
    assert len(arrivals) >= 3 * C * 3 - C


def test_replacement_is_never_active() -> None:
    engine, events = spy_engine(N=5, C=3, E=2, clock=FakeClock(5, seed=1))
    for t in range(1, 5):
        engine.run_round(t)
    replaced = [e["replace"] for e in events if "replace" in e]
    assert len(replaced) == 4 * 3
    for finished, new, active in replaced:
        assert finished in active
        assert new != finished and new not in active
    assert len(set(engine.async_state.active)) == 3


def test_replacement_downloads_the_global_client_model() -> None:
    engine, events = spy_engine(N=6, C=2, E=2)
    engine.run_round(1)
    newest = engine.async_state.active[0]                     # took the slot at the aggregation
    glob = torch.cat([v.reshape(-1) for j in sorted(engine.fed.global_blocks)
                      for v in engine.fed.global_blocks[j].values()])
    assert torch.equal(flat(engine.devices[newest].blocks), glob)


# ---- flags ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv,flag", [
    (["--algorithm", "gas", "--active", "-1"], "--active"),
    (["--algorithm", "gas", "--local-steps", "0"], "--local-steps"),
    (["--algorithm", "gas", "--buffer", "-1"], "--buffer"),
    (["--algorithm", "gas", "--covariance", "dense"], "--covariance"),
    (["--algorithm", "psl", "--active", "3"], "--active"),
])
def test_bad_gas_flags_exit_2(argv, flag, capsys) -> None:
    assert_train_flag_error(argv, flag, capsys)


def test_sampling_draws_from_the_gaussian_and_regularises_a_bad_covariance() -> None:
    """GAS-7: diagonal σ = √(v + 1e-5); full covariance by Cholesky, with εI added (ε = 1e-6, ×10 per retry) while
    Σ is not positive definite. A Σ = −0.002·I needs ε = 1e-2 (the fifth try): draws with covariance ≈ 0.008·I."""
    from trainers.strategies.gas import standard_normals

    rng = np.random.default_rng(0)
    diag = LabelStatistics(False)
    diag.mean, diag.cov = torch.tensor([1.0, -2.0], dtype=torch.float64), torch.tensor([4.0, 0.0], dtype=torch.float64)
    x = diag.sample(standard_normals(40_000, 2, rng)).double()
    assert torch.allclose(x.mean(0), diag.mean, atol=0.03)
    assert torch.allclose(x.var(0), torch.tensor([4.0 + 1e-5, 1e-5], dtype=torch.float64), rtol=0.03)
    full = LabelStatistics(True)
    full.mean, full.cov = torch.zeros(3, dtype=torch.float64), -0.002 * torch.eye(3, dtype=torch.float64)
    x = full.sample(standard_normals(40_000, 3, rng)).double()
    assert torch.isfinite(x).all() and x.shape == (40_000, 3)
    assert torch.allclose(torch.cov(x.T), 0.008 * torch.eye(3, dtype=torch.float64), atol=3e-4)


@pytest.mark.parametrize("stream", [5, 6, 7, 8, 2 ** 32 - 1])
def test_gas_matches_reference_from_the_spec_with_other_strategy_streams(stream: int, monkeypatch) -> None:
    """Any strategy stream, over enough global iterations that devices whose upload is still buffered are drawn
    again: buffered uploads are snapshots, so the engine stays on the reference (which clones its uploads)."""
    import trainers.engine.split_engine

    monkeypatch.setattr(trainers.engine.split_engine, "STRATEGY_STREAM", stream)
    monkeypatch.setattr(sys.modules[__name__], "STRATEGY_STREAM", stream)
    test_gas_matches_reference_from_the_spec(2, "off", False, False, True, rounds=4)
    test_gas_matches_reference_from_the_spec(0, "on", True, defaults=True, split=True, rounds=4)


def test_the_strategy_stream_is_no_device_stream() -> None:
    from adaptplan.limits import MAX_DEVICES

    assert STRATEGY_STREAM >= MAX_DEVICES


def test_a_buffered_upload_is_a_snapshot_when_its_device_trains_again() -> None:
    """N = C: a finished device re-joins at once (no idle device) and trains on while its upload waits in ℳ for
    Q_c = C models. GAS-12 averages the models *as uploaded*: the |D_k|-weighted mean of copies taken at upload."""
    N = C = 3
    engine = make_gas_engine(make_data(N, "dirichlet"), active=C, local_steps=1)
    s, taken = engine.strategy, []
    on_model = s.on_model

    def record(ctx, upload):
        taken.append((upload.device, upload.weight, {j: {k: v.clone() for k, v in bs.state.items()}
                                                     for j, bs in upload.blocks.items()}))
        return on_model(ctx, upload)

    s.on_model = record
    engine.run_round(1)
    devices = [d for d, _, _ in taken]
    assert len(taken) == C and len(set(devices)) < C            # the zero clock: slot 0's device re-joined and sent again
    weights = [w for _, w, _ in taken]
    for j, state in engine.fed.global_blocks.items():
        for name, value in state.items():
            expected = sum(w * snap[j][name] for w, (_, _, snap) in zip(weights, taken)) / sum(weights)
            assert torch.allclose(value, expected, atol=1e-6, rtol=0), (j, name)
    repeat = next(d for d in devices if devices.count(d) > 1)
    first = next(snap for d, _, snap in taken if d == repeat)
    assert not torch.equal(flat(engine.devices[repeat].blocks),
                           torch.cat([v.reshape(-1) for j in sorted(first) for v in first[j].values()]))


def test_gas_evaluates_the_global_client_model_with_the_current_server() -> None:
    """B.4.6: evaluation uses w_c^glob (w_c^0 before the first average), not the mean of the devices' live models."""
    N = 6
    engine = make_gas_engine(make_data(N, "dirichlet"), active=3, local_steps=2)
    template = small_model()
    (model,) = engine.strategy.eval_models(engine)
    assert torch.equal(flat(*model[:CUT]), flat(*template[:CUT]))     # before any average: the initial client model
    engine.run_round(1)
    (model,) = engine.strategy.eval_models(engine)
    glob = torch.cat([v.reshape(-1) for j in sorted(engine.fed.global_blocks)
                      for v in engine.fed.global_blocks[j].values()])
    assert torch.equal(flat(*model[:CUT]), glob)
    assert all(model[j] is engine.edge.instances[(None, j)] for j in range(CUT, 11))
    live_mean = flat(*engine.averaged_model()[:CUT])
    assert not torch.allclose(flat(*model[:CUT]), live_mean)


def test_the_evaluated_global_model_takes_every_global_client_block() -> None:
    """At a cut whose last client block has parameters (cut 4: block 4 is a convolution), every client block of
    the evaluated model is w_c^glob's, and its server blocks are the shared instances."""
    N, cut = 6, 4
    engine = SplitEngine(small_model(), [cut] * N, GAS(active=3, local_steps=2), make_data(N, "dirichlet"),
                         {"lr": LR, "momentum": 0.0}, batch_size=B, seed=0)
    engine.run_round(1)
    (model,) = engine.strategy.eval_models(engine)
    assert len(model) == 11
    for j in range(cut):
        for name, value in model[j].state_dict().items():
            assert torch.equal(value, engine.fed.global_blocks[j][name]), (j, name)
    assert all(model[j] is engine.edge.instances[(None, j)] for j in range(cut, 11))


def test_the_async_loop_state_is_checkpointed_as_its_documented_dict_and_checked_when_loaded() -> None:
    """docs/formats.md's ``async`` part: now, active, steps, clock, server_free; loaded back into the typed
    state, and refused (ValueError naming the part) where it does not fit the engine."""
    from adaptplan.limits import MAX_ROUNDS
    from trainers.engine.round_data import AsyncLoopState

    N = 6
    engine = make_gas_engine(make_data(N, "dirichlet"), active=3, local_steps=2)
    engine.run_round(1)
    saved = engine.state_dict()["async"]
    assert set(saved) == {"now", "active", "steps", "clock", "server_free"}
    assert saved["active"] == engine.async_state.active and set(saved["steps"]) == set(saved["active"])
    assert AsyncLoopState.from_dict(saved, N) == (engine.async_state, engine.timeline.server_free)
    first, *rest = saved["active"]
    top = {**saved, "steps": {**saved["steps"], first: MAX_ROUNDS}}
    assert AsyncLoopState.from_dict(top, N)[0].steps[first] == MAX_ROUNDS          # the documented end, inside
    for bad in (-1, MAX_ROUNDS + 1, 1.5, "2"):                                     # one device's count, the others fine
        with pytest.raises(ValueError, match=f"steps must be integers in \\[0, {MAX_ROUNDS:,}\\]"):
            AsyncLoopState.from_dict({**saved, "steps": {**saved["steps"], first: bad}}, N)
    for broken, message in (({**saved, "now": None} | {"extra": 1}, "must hold exactly"),
                            ({**saved, "active": [0, N]}, f"distinct devices of 0..{N - 1}"),
                            ({**saved, "active": saved["active"][:1]}, "one value per active device")):
        with pytest.raises(ValueError, match=message):
            AsyncLoopState.from_dict(broken, N)


def test_an_asynchronous_rounds_seconds_are_the_loops_time_since_the_last_aggregation() -> None:
    """A global iteration's simulated seconds run from the previous aggregation to this one (the loop's ``now``),
    so that the run's clock, the sum of its rounds, is the loop's time."""
    N = 6
    engine = make_gas_engine(make_data(N, "dirichlet"), clock=FakeClock(N, seed=3), active=3, local_steps=2)
    before, total = 0.0, 0.0
    for t in (1, 2, 3):
        stats = engine.run_round(t)
        assert stats.sim_seconds > 0
        assert stats.sim_seconds == pytest.approx(engine.async_state.now - before, rel=1e-12)
        before, total = engine.async_state.now, total + stats.sim_seconds
    assert total == pytest.approx(engine.async_state.now, rel=1e-12)


def everything_of(engine: SplitEngine) -> torch.Tensor:
    return torch.cat([flat(*[d.blocks for d in engine.devices]), flat(*engine.edge.instances.values())])


@pytest.mark.parametrize("written_before", [False, True])
def test_a_checkpoint_between_flushes_keeps_the_real_activations_gradient(written_before: bool) -> None:
    """Q_s = 3 with C·E = 4 arrivals a global iteration: a checkpoint after round 1 holds one buffered activation,
    whose GAS-8 gradient was taken at arrival (``real_sum``). Restored, the run goes on exactly (bit for bit) as the
    uninterrupted one. A checkpoint written before ``real_sum`` existed (no such keys) runs that activation
    through the server at the flush instead: the same run up to float rounding."""
    def build() -> SplitEngine:
        return make_gas_engine(make_data(6, "dirichlet"), active=2, local_steps=2, buffer=3)

    a = build()
    a.run_round(1)
    assert len(a.strategy.buffer) == 1 and a.strategy.summed == 1 and a.strategy.real_sum is not None
    saved = copy.deepcopy(a.state_dict())
    if written_before:
        for key in ("real_sum", "summed"):
            del saved["strategy"][key]
    b = build()
    b.load_state_dict(saved)
    assert b.strategy.summed == (0 if written_before else 1)
    for t in (2, 3):
        a.run_round(t), b.run_round(t)
        if written_before:
            assert torch.allclose(everything_of(a), everything_of(b), atol=1e-6, rtol=0), f"round {t}"
        else:
            assert torch.equal(everything_of(a), everything_of(b)), f"round {t}"


def test_a_checkpoints_real_activation_gradient_that_does_not_fit_is_refused() -> None:
    engine = make_gas_engine(make_data(6, "dirichlet"), active=2, local_steps=2, buffer=3)
    engine.run_round(1)
    good = copy.deepcopy(engine.state_dict())
    nan = [torch.full_like(g, float("nan")) for g in good["strategy"]["real_sum"]]
    for broken in ({"summed": 2}, {"summed": 0}, {"real_sum": None}, {"real_sum": nan}, {"real_sum": "x"}):
        state = copy.deepcopy(good)
        state["strategy"].update(broken)
        with pytest.raises(ValueError, match="real_sum"):
            make_gas_engine(make_data(6, "dirichlet"), active=2, local_steps=2, buffer=3).load_state_dict(state)
