"""Engine mechanics (trainers.engine.split_engine, trainers.api): SL ≡ centralized SGD, message checks, NaN detection,
re-partition without state loss, device batching ≡ per-device processing, optimizer state persistence;
a checkpoint restores every strategy's own state (floats, ints, lists, not only tensors) so a restored
engine continues exactly as the uninterrupted one; the base classes' defaults are the specs' values."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from tests.engine_builders import flat, make_data, make_engine, params, small_model  # noqa: F401
from trainers.api import Aggregation, AsyncStrategy, InputError, Strategy, parallel_step, sample_devices, skip
from trainers.engine.clock import StageTimes
from trainers.engine.split_engine import STRATEGY_STREAM, DeviceData, SplitEngine, check_device_finite
from trainers.inputs.datasets import load_dataset
from trainers.inputs.partition import DeviceSampler
from trainers.roles.core import own_state
from trainers.roles.messages import (
    CutGradient,
    MessageMismatchError,
    ModelDownload,
    NonFiniteError,
    check_all_finite,
    check_finite,
    deferred_finite_checks,
)
from trainers.strategies import make_strategy

# ---- from test_engine.py (merged by subject) ----------------------------------------
torch.set_num_threads(1)



@pytest.mark.parametrize("cut", [1, 4, 9, 11])
def test_one_device_sl_equals_centralized_sgd(cut: int) -> None:
    engine = make_engine("sl", [cut], devices=1)
    central = small_model()
    opt = torch.optim.SGD(central.parameters(), lr=0.1)
    sampler = DeviceSampler(engine.data.parts[0], 16, [0, 0])
    for t in range(1, 6):
        engine.run_round(t)
        idx = torch.from_numpy(sampler.next())
        loss = nn.functional.cross_entropy(central(engine.data.x_train[idx]), engine.data.y_train[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    for a, b in zip(params(engine.device_model(0)), params(central), strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=0)


def test_an_empty_barrier_is_served_with_no_replies_and_no_step() -> None:
    """parallel_step over no arrivals touches neither the edge server nor the round (nothing to step)."""
    assert parallel_step(None, None, []) == []          # type: ignore[arg-type]


def test_wrong_gradient_raises() -> None:
    engine = make_engine("psl", [3, 3], devices=2)
    device = engine.devices[0]
    msg = device.forward(1)
    with pytest.raises(MessageMismatchError, match=r"step 2\) delivered to device 0, which expects \(device 0, round 1, step 1\)"):
        device.backward(CutGradient(0, 1, msg.step + 1, torch.zeros_like(msg.tensor)))
    with pytest.raises(MessageMismatchError, match="device 1"):
        device.backward(CutGradient(1, 1, msg.step, torch.zeros_like(msg.tensor)))
    with pytest.raises(MessageMismatchError, match="shape"):
        device.backward(CutGradient(0, 1, msg.step, torch.zeros(1)))
    with pytest.raises(MessageMismatchError, match="which expects nothing"):   # the pending step was consumed
        device.backward(CutGradient(0, 1, msg.step, torch.zeros_like(msg.tensor)))


def test_bytes_are_the_messages_sizes() -> None:
    """bytes_up = activations (fp32) + labels (int64) of every device; bytes_down = the cut gradients;
    at an aggregation the model messages are added (client blocks up and down)."""
    engine = make_engine("psl", [3, 3, 3], devices=3)
    stats = engine.run_round(1)
    with torch.no_grad():
        act = nn.Sequential(*engine.devices[0].blocks)(engine.data.x_train[:16])
    per_device = act.numel() * 4
    assert stats.bytes_up == 3 * (per_device + 16 * 8) and stats.bytes_down == 3 * per_device
    sfl = make_engine("sfl-v2", [3, 3, 3], devices=3)
    stats = sfl.run_round(1)
    client_bytes = sum(p.numel() * 4 for p in sfl.devices[0].blocks.parameters())
    assert stats.aggregated and stats.bytes_up == 3 * (per_device + 16 * 8 + client_bytes)
    assert stats.bytes_down == 3 * (per_device + client_bytes) and stats.bytes_server == 0


class StaleStrategy(Strategy):
    """A faulty server: in round 2 it answers with round 1's gradients (stale replay)."""
    server_step = "own"

    def __init__(self) -> None:
        self.previous = None

    def serve(self, edge, ctx, arrivals):
        grads = parallel_step(edge, ctx, arrivals)
        stale, self.previous = self.previous, grads
        return stale or grads


class SilentStrategy(Strategy):
    """A faulty server that never answers device 1."""
    server_step = "own"

    def serve(self, edge, ctx, arrivals):
        return [g for g in parallel_step(edge, ctx, arrivals) if g.device != 1]


def test_stale_gradient_stops_the_round() -> None:
    engine = SplitEngine(small_model(), [3, 3], StaleStrategy(), make_data(2), {"lr": 0.1}, 16)
    engine.run_round(1)
    with pytest.raises(MessageMismatchError, match="round 1, step 1"):
        engine.run_round(2)


def test_unanswered_activation_is_named() -> None:
    engine = SplitEngine(small_model(), [3, 3], SilentStrategy(), make_data(2), {"lr": 0.1}, 16)
    with pytest.raises(MessageMismatchError, match="activation of device 1 .*never answered"):
        engine.run_round(1)


def test_nan_stops_naming_round_and_device() -> None:
    engine = make_engine("adaptsfl", [2, 4, 4], devices=3)
    engine.run_round(1)
    with torch.no_grad():
        p = next(engine.block(1, 0).parameters())   # device 1 alone (its tensors may be shared with the others')
        p.data = torch.full_like(p, float("nan"))
    # caught where it first shows: device 1's own forward, before its activation is sent
    with pytest.raises(NonFiniteError, match=r"^NaN or inf in client activation at round 2, device 1$"):
        engine.run_round(2)


class NaNGradientStrategy(Strategy):
    """A faulty server that answers device 0 with a NaN cut gradient."""
    server_step = "own"

    def serve(self, edge, ctx, arrivals):
        replies = parallel_step(edge, ctx, arrivals)
        for r in replies:
            if r.device == 0:
                r.tensor = torch.full_like(r.tensor, float("nan"))
        return replies


def test_a_nan_gradient_is_refused_by_the_device() -> None:
    engine = SplitEngine(small_model(), [3, 3], NaNGradientStrategy(), make_data(2), {"lr": 0.1}, 16)
    before = flat(engine.devices[0].blocks)
    with pytest.raises(NonFiniteError, match=r"^NaN or inf in gradient message at round 1, device 0$"):
        engine.run_round(1)
    assert torch.equal(flat(engine.devices[0].blocks), before)          # no step was taken with it


@pytest.mark.parametrize("new_cuts", [[5, 1, 9], [5, 1, 10]])   # L_c 7 → 9, 10: block 9 (weights) turns per-device
def test_repartition_keeps_global_model_output(new_cuts) -> None:
    engine = make_engine("adaptsfl", [2, 4, 7], devices=3, interval=2, momentum=0.9)
    for t in (1, 2):
        stats = engine.run_round(t)
    assert stats.aggregated
    x = engine.data.x_test[:32]
    with torch.no_grad():
        before = engine.averaged_model()(x)
        per_device_before = [engine.device_model(d)(x) for d in range(3)]
    engine.set_cuts(new_cuts)
    with torch.no_grad():
        after = engine.averaged_model()(x)
        per_device_after = [engine.device_model(d)(x) for d in range(3)]
    assert torch.equal(before, after)
    for a, b in zip(per_device_before, per_device_after, strict=True):
        assert torch.equal(a, b)
    assert engine.deepest_cut == max(new_cuts) and engine.cuts == new_cuts
    # momentum buffers were carried: every optimizer of every role has state for its parameters
    optimizers = [d.optimizer.torch for d in engine.devices] + [o.torch for o in engine.edge.optimizers.values()]
    for opt in optimizers:
        assert all("momentum_buffer" in opt.state[p] for g in opt.param_groups for p in g["params"])
    engine.run_round(3)                  # training continues on the new layout


@pytest.mark.parametrize("algorithm", ["adaptsfl", "psl"])
def test_device_batching_is_mathematically_identical(algorithm: str) -> None:
    batched = make_engine(algorithm, [2, 4, 4, 7], devices=4, batch_devices=True)
    separate = make_engine(algorithm, [2, 4, 4, 7], devices=4, batch_devices=False)
    for t in range(1, 4):
        batched.run_round(t)
        separate.run_round(t)
    for d in range(4):
        for a, b in zip(params(batched.device_model(d)), params(separate.device_model(d)), strict=True):
            assert torch.allclose(a, b, atol=1e-6, rtol=0)


def test_optimizer_state_persists_across_batches() -> None:
    engine = make_engine("sfl-v1", [3, 3], devices=2, momentum=0.9)
    opt = engine.edge.optimizers[0].torch
    engine.run_round(1)
    buffers = [opt.state[p]["momentum_buffer"].clone() for p in opt.param_groups[0]["params"]]
    engine.run_round(2)
    assert engine.edge.optimizers[0].torch is opt
    assert any(not torch.equal(b, opt.state[p]["momentum_buffer"]) for b, p in zip(buffers, opt.param_groups[0]["params"]))


def held_blocks(engine: SplitEngine) -> int:
    """Block instances held by all roles: every device's client blocks plus the edge server's instances."""
    return sum(d.cut for d in engine.devices) + len(engine.edge.instances)


def test_memory_layout_only_needed_copies() -> None:
    n = 4
    counts = {alg: held_blocks(make_engine(alg, [3] * n, devices=n)) for alg in ("sl", "psl", "sfl-v1", "sfl-v2", "adaptsfl")}
    L = 11
    # every device holds its own client blocks (SL hands them over as model messages); the edge server
    # holds one shared copy of each server block, except SFL-V1 (one per device)
    assert counts["sl"] == counts["psl"] == counts["sfl-v2"] == 3 * n + (L - 3)
    assert counts["sfl-v1"] == L * n
    assert counts["adaptsfl"] == 3 * n + (L - 3)       # equal cuts: no non-common part
    hetero = make_engine("adaptsfl", [2, 5, 5, 3], devices=n)
    assert held_blocks(hetero) == 5 * n + (L - 5)      # L_c = 5: blocks 1..5 per device, rest shared


@pytest.mark.parametrize("algorithm, cuts", [("psl", [3, 3, 3]), ("sfl-v1", [1, 4, 4]), ("adaptsfl", [2, 5, 9])])
def test_models_before_training_are_the_template(algorithm, cuts) -> None:
    """Every device's model and the averaged model hold all L blocks and compute the initial model."""
    engine = make_engine(algorithm, cuts, devices=3)
    x = engine.data.x_test[:20]
    with torch.no_grad():
        expected = small_model()(x)
        for d in range(3):
            assert len(engine.device_model(d)) == engine.num_blocks == 11
            assert torch.equal(engine.device_model(d)(x), expected)
        assert len(engine.averaged_model()) == 11 and torch.equal(engine.averaged_model()(x), expected)


def test_evaluate_is_accuracy_and_mean_cross_entropy_over_the_test_set() -> None:
    engine = make_engine("psl", [3, 3], devices=2)
    engine.run_round(1)
    model = engine.device_model(0)
    x, y = engine.data.x_test, engine.data.y_test
    with torch.no_grad():
        logits = model(x)                                   # all 400 test samples in one pass
    def reference(n: int) -> tuple[float, float]:
        correct = int((logits[:n].argmax(1) == y[:n]).sum())
        return correct / n, float(nn.functional.cross_entropy(logits[:n], y[:n]))
    for batch in (1000, 400, 7):
        accuracy, loss = engine.evaluate(model, batch_size=batch)
        assert accuracy == reference(400)[0] and loss == pytest.approx(reference(400)[1], rel=1e-5)
    accuracy, loss = engine.evaluate(model, batch_size=7, max_samples=50)
    assert accuracy == reference(50)[0] and loss == pytest.approx(reference(50)[1], rel=1e-5)
    assert model.training                                   # back in training mode


def test_batchnorm_keeps_devices_apart_at_the_server() -> None:
    """Samples interact inside a batch with BatchNorm, so the edge server must not concatenate devices then."""
    from trainers.roles.core import has_batch_coupling

    plain = small_model()
    with_bn = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                            nn.Linear(4 * 8 * 8, 10))
    assert not has_batch_coupling(plain) and has_batch_coupling(with_bn)
    assert has_batch_coupling(nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))))   # nested
    assert make_engine("psl", [3, 3], devices=2).passes.concatenate
    assert not make_engine("psl", [1, 1], devices=2, model=with_bn).passes.concatenate


def test_label_prior_and_an_empty_server_step() -> None:
    from trainers.api import label_prior

    assert torch.equal(label_prior([2, 0, 6]), torch.tensor([0.25, 0.0, 0.75]))
    assert torch.equal(label_prior(torch.tensor([0, 0, 0])), torch.zeros(3))      # no samples: no NaN
    assert label_prior([1, 1]).dtype == torch.float32
    engine = make_engine("psl", [3, 3], devices=2)
    before = flat(*engine.edge.instances.values())
    assert parallel_step(engine.passes, engine.context(1), []) == []                # nothing arrived: no replies, no step
    assert torch.equal(flat(*engine.edge.instances.values()), before)


class BlowUpStrategy(Strategy):
    """A server step that leaves an inf in the shared server model (as a too large step would)."""
    server_step = "own"

    def serve(self, edge, ctx, arrivals):
        replies = parallel_step(edge, ctx, arrivals)
        with torch.no_grad():
            next(edge.server.instances[(None, 10)].parameters())[0, 0] = float("inf")
        return replies


def test_a_model_made_non_finite_stops_the_round_that_made_it() -> None:
    engine = SplitEngine(small_model(), [3, 3], BlowUpStrategy(), make_data(2), {"lr": 0.1}, 16)
    with pytest.raises(NonFiniteError, match=r"NaN or inf in server model block 11 at round 1, device shared server"):
        engine.run_round(1)
    per_device = make_engine("sfl-v1", [3, 3], devices=2)          # one server copy per device: named by its device
    p = next(per_device.edge.instances[(1, 10)].parameters())   # device 1's copy alone (shared: the template's)
    p.data = p.data.clone()
    with torch.no_grad():
        p[0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match=r"NaN or inf in server model block 11 at round 1, device 1$"):
        per_device.check_models_finite(1)


@pytest.mark.parametrize("cut", [4, 11])
def test_sl_hands_the_model_and_its_momentum_on_like_centralized_sgd(cut: int) -> None:
    """Vanilla SL over 3 devices: one client model (and its optimizer state) passed device to device, one
    server model — together one model trained by SGD with momentum on device 0's batch, then device 1's,
    device 2's, device 0's... (each device's batches from its own seeded sampler)."""
    engine = make_engine("sl", [cut] * 3, devices=3, momentum=0.9)
    central = small_model()
    opt = torch.optim.SGD(central.parameters(), lr=0.1, momentum=0.9)
    samplers = [DeviceSampler(engine.data.parts[d], 16, [0, d]) for d in range(3)]
    for t in range(1, 4):
        engine.run_round(t)
        for d in range(3):
            idx = torch.from_numpy(samplers[d].next())
            loss = nn.functional.cross_entropy(central(engine.data.x_train[idx]), engine.data.y_train[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    for a, b in zip(params(engine.device_model(0)), params(central), strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=0)


def test_optimizer_states_are_averaged_copies() -> None:
    """mean_param_state: float tensors of one or more dimensions averaged, scalars and the rest from the first
    state; always fresh tensors, so two roles never share a momentum buffer."""
    from trainers.roles.optim import mean_param_state

    a = {"momentum_buffer": torch.tensor([1.0, 2.0]), "step": torch.tensor(5.0), "note": 3}
    b = {"momentum_buffer": torch.tensor([3.0, 6.0]), "step": torch.tensor(7.0), "note": 4}
    merged = mean_param_state([a, {}, b])                 # empty states (no step yet) are left out
    assert torch.equal(merged["momentum_buffer"], torch.tensor([2.0, 4.0]))
    assert torch.equal(merged["step"], torch.tensor(5.0)) and merged["note"] == 3
    partial = mean_param_state([{"momentum_buffer": torch.tensor([1.0]), "x": 1}, {"x": 2}])   # not in every state
    assert torch.equal(partial["momentum_buffer"], torch.tensor([1.0])) and partial["x"] == 1
    single = mean_param_state([a])
    assert torch.equal(single["momentum_buffer"], a["momentum_buffer"]) and single["note"] == 3
    for out in (merged, single):
        out["momentum_buffer"].add_(10.0)
        out["step"].add_(1.0)
    assert torch.equal(a["momentum_buffer"], torch.tensor([1.0, 2.0])) and float(a["step"]) == 5.0
    assert mean_param_state([{}, {}]) == {}


def test_a_restored_engine_continues_the_message_tags() -> None:
    engine = make_engine("psl", [3, 3], devices=2)
    for t in (1, 2):
        engine.run_round(t)
    restored = make_engine("psl", [3, 3], devices=2)
    restored.load_state_dict(engine.state_dict())
    msg = restored.devices[1].forward(3)
    assert (msg.device, msg.round, msg.step) == (1, 3, 3)            # two steps were taken before the checkpoint


@pytest.mark.parametrize("base", ["psl", "sfl"])
def test_cyclesl_evaluates_the_models_of_its_base(base: str) -> None:
    """CyclePSL: every device's own model (client models are never averaged); CycleSFL: the global model."""
    from trainers.strategies import CycleSL

    engine = SplitEngine(small_model(), [3] * 3, CycleSL(participation=1.0, cycle_base=base), make_data(3), {"lr": 0.1}, 16)
    engine.run_round(1)
    x = engine.data.x_test[:20]
    with torch.no_grad():
        outputs = [m(x) for m in engine.strategy.eval_models(engine)]
        if base == "psl":
            expected = [engine.device_model(d)(x) for d in range(3)]
            assert not torch.equal(expected[0], expected[1])
        else:
            expected = [engine.global_model()(x)]
            assert torch.equal(expected[0], engine.averaged_model()(x))     # I = 1: every device holds the average
    assert len(outputs) == len(expected) and all(torch.equal(a, b) for a, b in zip(outputs, expected))


def test_scala_evaluates_the_global_model_of_the_last_iteration() -> None:
    """SCALA's participant set stays for the I rounds of a global iteration; mid-iteration the reported model is
    the global model of the last aggregation (w⁰ before the first), at its end the participants' FedAvg."""
    from trainers.strategies import SCALA

    engine = SplitEngine(small_model(), [3] * 4, SCALA(participation=0.5), make_data(4), {"lr": 0.1}, 16, interval=2)
    first = engine.run_round(1).participants
    current = engine.period
    assert len(current) == 2 and first == current
    x = engine.data.x_test[:20]
    with torch.no_grad():
        (model,) = engine.strategy.eval_models(engine)
        initial = nn.Sequential(*list(small_model())[:3], *engine.device_model(0)[3:])
        assert torch.equal(model(x), initial(x))
    assert engine.run_round(2).participants == current
    with torch.no_grad():
        (model,) = engine.strategy.eval_models(engine)
        assert torch.equal(model(x), engine.averaged_model(current)(x))
        assert not torch.equal(model(x), initial(x))


def test_edge_server_api_edges() -> None:
    """An empty server pass, and zero_grad clearing the server's accumulated gradients."""
    engine = make_engine("psl", [3, 3], devices=2)
    empty = engine.passes.run([])
    assert empty.devices == [] and empty.logits == {} and empty.inputs == {}
    arrivals = [engine.devices[d].forward(1) for d in (0, 1)]
    p = engine.passes.run(arrivals)
    p.backward(sum(nn.functional.cross_entropy(p.logits[d], p.labels[d]) for d in (0, 1)))
    server = [q for m in engine.edge.instances.values() for q in m.parameters()]
    assert all(q.grad is not None for q in server)
    engine.edge.zero_grad()
    assert all(q.grad is None for q in server)


# ---- from test_engine_contracts.py (merged by subject) ----------------------------------------
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
    ("scala", {"participation": 0.5}, [3, 3, 3, 3], 2),               # the engine's period and stale devices
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
    assert plain or algorithm == "scala"         # each of these strategies keeps some plain state (SCALA's is the engine's)
    assert {k: b.strategy.state_dict()[k] for k in plain} == plain
    assert (b.period, b.stale) == (a.period, a.stale) and (a.period is not None or algorithm == "gas")
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


# the small CNN cut after block 3 (conv 1→4, ReLU, 2×2 pool on 1×8×8 inputs): 4×4×4 activation values per
# sample; a client model of 4·9 + 4 = 40 float32 parameters
B = 16
ACTIVATION_BYTES = B * 4 * 4 * 4 * 4
LABEL_BYTES = B * 8
CLIENT_BYTES = 40 * 4


def test_sl_hand_offs_are_counted_as_model_messages_both_ways() -> None:
    # one SL round over 3 devices: 3 activations (+ labels) up and 3 cut gradients down, and 3 hand-offs
    # (0 → 1, 1 → 2, 2 → 0), each the client model up to the fed server and down to the next device
    engine = SplitEngine(small_model(), [3, 3, 3], make_strategy("sl"), make_data(3), {"lr": 0.05}, batch_size=B)
    stats = engine.run_round(1)
    assert stats.bytes_up == 3 * (ACTIVATION_BYTES + LABEL_BYTES) + 3 * CLIENT_BYTES
    assert stats.bytes_down == 3 * ACTIVATION_BYTES + 3 * CLIENT_BYTES
    assert stats.bytes_server == 0
    # one device holds the model all along: no hand-off, no model message
    alone = SplitEngine(small_model(), [3], make_strategy("sl"), make_data(1), {"lr": 0.05}, batch_size=B)
    stats = alone.run_round(1)
    assert (stats.bytes_up, stats.bytes_down) == (ACTIVATION_BYTES + LABEL_BYTES, ACTIVATION_BYTES)


def test_a_shared_server_block_is_neither_sent_nor_overwritten_at_an_aggregation() -> None:
    # SFL-V2 with cuts (1, 4): the client blocks 0..3 are averaged; device 1 holds blocks 1..3 itself, while
    # device 0's blocks 1..3 are the edge server's SHARED instances — not device-specific, so the edge server
    # neither uploads them nor receives the average back (bytes_server = 0), and they keep their own weights
    engine = SplitEngine(small_model(), [1, 4], make_strategy("sfl-v2"), make_data(2), {"lr": 0.05}, batch_size=B)
    shared = [engine.edge.instances[(None, j)] for j in (1, 2, 3)]
    stats = engine.run_round(1)
    assert stats.aggregated and stats.bytes_server == 0
    # the shared conv block 3 (block index 3: Conv2d(4, 8)) trained on device 0's stream only; device 1's copy
    # on device 1's data: they differ after the round
    assert not torch.equal(flat(shared[2]), flat(engine.devices[1].blocks[3]))
    assert all(engine.edge.instances[(None, j)] is m for j, m in zip((1, 2, 3), shared))


class NaNAtAggregation(AsyncStrategy):
    """An asynchronous strategy whose aggregation leaves a NaN in the uploading device's client model
    (as a diverged local step would): the last event of the round."""

    name = "nan-at-aggregation"
    active, local_steps = 2, 1

    def __init__(self) -> None:
        super().__init__()
        self.models: list = []

    def on_model(self, ctx, upload):
        self.models.append(upload)
        if len(self.models) < self.active:
            return None
        with torch.no_grad():
            upload.blocks[0].state["weight"].view(-1)[0] = float("nan")     # the live tensor of the device's block
        flushed, self.models = self.models, []
        return flushed


def test_a_model_made_non_finite_stops_the_asynchronous_round_that_made_it() -> None:
    engine = SplitEngine(small_model(), [3, 3, 3], NaNAtAggregation(), make_data(3), {"lr": 0.05}, batch_size=B)
    with pytest.raises(NonFiniteError, match=r"NaN or inf in client model block 1 at round 1, device \d$"):
        engine.run_round(1)


# ---- the message discipline: every misdelivery is refused with a MessageMismatchError -------------------
def psl(cuts=(3, 3), devices: int = 2) -> SplitEngine:
    return SplitEngine(small_model(), list(cuts), make_strategy("psl"), make_data(devices), {"lr": 0.05}, batch_size=B)


def test_a_device_starts_no_step_before_its_previous_one_is_answered() -> None:
    engine = psl()
    first = engine.devices[0].forward(1)
    with pytest.raises(MessageMismatchError, match=r"device 0 starts round 2 with an unanswered activation "
                                                   r"\(round 1, step 1\)"):
        engine.devices[0].forward(2)
    engine.devices[0].backward(CutGradient(0, 1, first.step, None))       # a skip consumes it
    assert engine.devices[0].forward(2).step == 2


def test_model_messages_go_to_their_own_device_and_no_repartition_mid_step() -> None:
    engine = psl()
    block = engine.devices[0].upload(1, [0], 1.0).blocks
    with pytest.raises(MessageMismatchError, match="model for device 0 delivered to device 1"):
        engine.devices[1].download(ModelDownload(0, 1, "device", block))
    from trainers.engine.sync_round import forward_all
    forward_all(engine, 1, [0], {0: 4})               # the edge server holds device 0's activation, unanswered
    with pytest.raises(MessageMismatchError, match="device 0 cannot re-partition with an unanswered activation"):
        engine.devices[0].download(ModelDownload(0, 1, "device", {}, cut=4))
    assert engine.devices[0].cut == 3
    with pytest.raises(MessageMismatchError, match=r"cannot re-partition with unanswered activations from devices \[0\]"):
        engine.set_cuts([4, 4])
    assert engine.cuts == [3, 3]


def test_one_server_pass_takes_one_activation_per_device() -> None:
    engine = psl()
    a = engine.devices[0].forward(1)
    with pytest.raises(MessageMismatchError, match="two activations from device 0 in one server pass"):
        engine.passes.run([a, a])


class AnswersOthers(Strategy):
    """A faulty server: answers every arrival twice, or answers a device that is not in the group."""
    server_step = "own"

    def __init__(self, fault: str) -> None:
        super().__init__()
        self.fault = fault

    def schedule(self, ctx, participants):
        return [[d] for d in participants]              # one device per group

    def serve(self, edge, ctx, arrivals):
        replies = parallel_step(edge, ctx, arrivals)
        if self.fault == "twice":
            return replies + replies
        return replies + [CutGradient(1 - arrivals[0].device, ctx.round, 1, None)]


@pytest.mark.parametrize("fault,state", [("twice", "was already answered"),
                                         ("stranger", "sent no activation in this group")])
def test_a_reply_nobody_waits_for_is_refused(fault, state) -> None:
    engine = SplitEngine(small_model(), [3, 3], AnswersOthers(fault), make_data(2), {"lr": 0.05}, batch_size=B)
    with pytest.raises(MessageMismatchError, match=f"a gradient for device [01] \\(round 1, step 1\\), which {state}"):
        engine.run_round(1)


class Unanswering(AsyncStrategy):
    """An asynchronous strategy that does not answer the arrivals it serves."""
    server_step = "own"

    active, local_steps = 2, 1

    def serve(self, edge, ctx, arrivals):
        return []


def test_an_asynchronous_strategy_must_answer_each_arrival_it_serves() -> None:
    engine = SplitEngine(small_model(), [3, 3], Unanswering(), make_data(2), {"lr": 0.05}, batch_size=B)
    with pytest.raises(MessageMismatchError, match=r"asynchronous strategy base did not answer devices \[\d\]"):
        engine.run_round(1)


def test_a_checkpoint_of_another_server_layout_is_refused() -> None:
    per_device = SplitEngine(small_model(), [3, 3], make_strategy("sfl-v1"), make_data(2), {"lr": 0.05}, batch_size=B)
    shared = psl()
    with pytest.raises(MessageMismatchError, match="checkpoint layout does not match the algorithm's server layout"):
        shared.edge.load_state_dict(per_device.edge.state_dict())


# ---- NaN/inf checks of one role ----------------------------------------------------------------------------
def test_finite_checks_of_one_device_and_of_the_edge_server_name_the_block() -> None:
    engine = psl()
    check_device_finite(engine.devices[1], 4)                # finite: nothing raised
    engine.edge.check_finite(4)
    own_state(engine.devices[1].blocks[0])                 # device 1's own copy (it starts on the template's tensors)
    engine.edge.instance((None, 6))                        # about to run: its own copy, read at the next check
    with torch.no_grad():
        engine.devices[1].blocks[0].bias[2] = float("inf")
        engine.edge.instances[(None, 6)].weight.view(-1)[0] = float("nan")
    check_device_finite(engine.devices[0], 4)
    with pytest.raises(NonFiniteError, match=r"^NaN or inf in client model block 1 at round 4, device 1$"):
        check_device_finite(engine.devices[1], 4)
    with pytest.raises(NonFiniteError, match=r"^NaN or inf in server model block 7 at round 4, device shared server$"):
        engine.edge.check_finite(4)


def test_finite_check_without_the_multi_tensor_norm_still_finds_an_inf(monkeypatch) -> None:
    # an older torch without the ∞-norm in _foreach_norm: the fallback takes each tensor's largest |x|
    def missing(*args, **kwargs):
        raise RuntimeError("not implemented")

    monkeypatch.setattr(torch, "_foreach_norm", missing)
    ok, bad = torch.ones(3), torch.tensor([1.0, float("inf"), 2.0])
    with deferred_finite_checks():                            # the multi-tensor norm serves the deferred checks
        check_all_finite([(ok, "a", 0)], 1)
    with pytest.raises(NonFiniteError, match=r"^NaN or inf in b at round 7, device 3$"):
        with deferred_finite_checks():
            check_all_finite([(ok, "a", 0), (bad, "b", 3)], 7)


@pytest.mark.parametrize("deferred", [False, True])
def test_finite_values_whose_sum_overflows_pass_and_a_shared_nan_names_its_first_holder(deferred) -> None:
    """The immediate checks sum each tensor (a finite sum proves it finite): a sum that overflows
    (4 × 3e38 > float32's 3.4e38) is tested exactly and passes; a tensor held by several items (a
    shared download) is named by its first holder, as a check of each in turn would."""
    huge = torch.full((4, 2), 3e38)
    nan = torch.tensor([0.0, float("nan")])
    with deferred_finite_checks(enabled=deferred):
        check_finite(huge, "activation", 1, 0)
        check_all_finite([(huge, "model a", 0), (huge.t(), "model b", 1)], 1)
    with pytest.raises(NonFiniteError, match=r"^NaN or inf in model c at round 2, device 5$"):
        with deferred_finite_checks(enabled=deferred):
            check_all_finite([(huge, "model a", 0), (nan, "model c", 5), (nan, "model c", 6)], 2)
    with pytest.raises(NonFiniteError, match=r"^NaN or inf in gradient at round 3, device 2$"):
        with deferred_finite_checks(enabled=deferred):
            check_finite(torch.tensor([1.0, -float("inf")]), "gradient", 3, 2)


def test_an_error_inside_a_deferred_scope_passes_through_when_every_check_held() -> None:
    with pytest.raises(KeyError, match="boom"):
        with deferred_finite_checks():
            check_finite(torch.ones(2), "x", 1, 0)
            raise KeyError("boom")
    with pytest.raises(NonFiniteError, match="NaN or inf in x at round 1, device 0") as info:
        with deferred_finite_checks():
            check_finite(torch.tensor([float("nan")]), "x", 1, 0)
            raise KeyError("later")
    assert isinstance(info.value.__cause__, KeyError)


# ---- checkpointed strategy state of any shape ----------------------------------------------------------------
@dataclasses.dataclass
class Moments:
    mean: torch.Tensor
    count: int


class Stateful(Strategy):
    """A strategy whose checkpoint holds nested containers, a dataclass and plain values."""

    def __init__(self) -> None:
        super().__init__()
        self.state = {}

    def state_dict(self):
        return {"moments": Moments(torch.arange(3.0), 4), "pair": (torch.ones(2), "label"), "list": [1, 2.5, None],
                "nested": {"k": [torch.zeros(1)]}}

    def load_state_dict(self, state):
        self.state = state


def test_a_strategy_state_of_any_shape_is_restored_as_saved() -> None:
    engine = SplitEngine(small_model(), [3, 3], Stateful(), make_data(2), {"lr": 0.05}, batch_size=B)
    engine.load_state_dict(copy.deepcopy(engine.state_dict()))
    got = engine.strategy.state
    assert isinstance(got["moments"], Moments) and got["moments"].count == 4
    assert torch.equal(got["moments"].mean, torch.arange(3.0))
    assert isinstance(got["pair"], tuple) and torch.equal(got["pair"][0], torch.ones(2)) and got["pair"][1] == "label"
    assert got["list"] == [1, 2.5, None]
    assert isinstance(got["nested"]["k"], list) and torch.equal(got["nested"]["k"][0], torch.zeros(1))


# ---- what a skip costs, custom aggregations, re-partition merges ------------------------------------------
class SkipDevice1(Strategy):
    """PSL's server step, but device 1 is told to drop its step (as GAPSL's filter does)."""
    server_step = "own"

    def serve(self, edge, ctx, arrivals):
        return [skip(a) if r.device == 1 else r for a, r in zip(arrivals, parallel_step(edge, ctx, arrivals))]


def test_a_skipped_device_is_charged_no_downlink_or_backward() -> None:
    from tests.engine_builders import FixedClock

    engine = SplitEngine(small_model(), [3, 3, 3], SkipDevice1(), make_data(3), {"lr": 0.05}, batch_size=B,
                         clock=FixedClock())
    before = flat(engine.devices[1].blocks)
    stats = engine.run_round(1)
    # arrivals 5, 1.5, 2.25 → the server starts at 5 and works 0.5 + 0.25 + 0.125 → replies at 5.875; device 0
    # back at 5.875 + 0.5 + 1 = 7.375, device 2 at 5.875 + 1 + 0.5 = 7.375; device 1 receives nothing to
    # download or back-propagate (its 0.25 + 2 would end the round at 8.125)
    assert stats.sim_seconds == pytest.approx(7.375, rel=1e-12)
    assert stats.stage_seconds["downlink"] == pytest.approx(1.0) and stats.stage_seconds["device BP"] == pytest.approx(1.0)
    assert stats.bytes_down == 2 * ACTIVATION_BYTES
    assert torch.equal(flat(engine.devices[1].blocks), before)


class Custom(Strategy):
    """An aggregation of devices 0 and 1 only, with equal weights, broadcast to every device."""

    def __init__(self) -> None:
        super().__init__()
        self.view = None
        self.before = None

    def aggregation(self, ctx):
        self.before = [copy.deepcopy(d.blocks) for d in self.view.devices]
        return Aggregation(tuple(range(3)), weights="equal", devices=(0, 1), recipients="all")


def test_an_equal_weight_aggregation_of_chosen_devices_reaches_every_device() -> None:
    data = make_data(3, "dirichlet")
    sizes = [p.size for p in data.parts]
    assert sizes[0] != sizes[1]                             # FedAvg's |D_i| weights would differ from 1/2
    strategy = Custom()
    engine = SplitEngine(small_model(), [3, 3, 3], strategy, data, {"lr": 0.05}, batch_size=B)
    strategy.view = engine
    stats = engine.run_round(1)
    assert stats.aggregated
    expected = [(p0 + p1) / 2 for p0, p1 in zip(strategy.before[0].parameters(), strategy.before[1].parameters())]
    for d in range(3):                                      # device 2 was not averaged but receives the average
        got = list(engine.devices[d].blocks.parameters())
        assert all(torch.allclose(g, e, atol=1e-7, rtol=0) for g, e in zip(got, expected)), d
    # only devices 0 and 1 upload (40 parameters each); all three download
    activation_traffic = 3 * (ACTIVATION_BYTES + LABEL_BYTES)
    assert stats.bytes_up == activation_traffic + 2 * CLIENT_BYTES
    assert stats.bytes_down == 3 * ACTIVATION_BYTES + 3 * CLIENT_BYTES


def test_repartition_merges_the_old_instances_weighted_by_how_many_devices_used_each() -> None:
    # SFL-V2, cuts (1, 1, 4) → (1, 1, 1), no aggregation yet (I = 2): the new shared instance of block j ∈ {1, 2, 3}
    # serves all three devices; before, devices 0 and 1 used the shared instance S_j and device 2 its own block
    # D_j, so it takes (2·S_j + 1·D_j) / 3
    engine = SplitEngine(small_model(), [1, 1, 4], make_strategy("sfl-v2"), make_data(3), {"lr": 0.05},
                         batch_size=B, interval=2)
    engine.run_round(1)
    S = {j: copy.deepcopy(engine.edge.instances[(None, j)]) for j in (1, 2, 3)}
    D = {j: copy.deepcopy(engine.devices[2].blocks[j]) for j in (1, 2, 3)}
    assert not torch.equal(flat(S[3]), flat(D[3]))
    untouched = engine.edge.instances[(None, 6)]
    engine.set_cuts([1, 1, 1])
    assert engine.devices[2].cut == 1
    for j in (1, 2, 3):
        for new, s, d in zip(engine.edge.instances[(None, j)].parameters(), S[j].parameters(), D[j].parameters()):
            assert torch.allclose(new, (2 * s + d) / 3, atol=1e-7, rtol=0), j
    assert engine.edge.instances[(None, 6)] is untouched     # used by the same devices as before: kept as is


@pytest.mark.parametrize("rho,message", [
    (0, "must be in (0, 1] fraction of the devices, got 0"), (-0.5, "must be in (0, 1] fraction of the devices, got -0.5"),
    (1.0001, "must be in (0, 1] fraction of the devices, got 1.0001"),
    (float("nan"), "must be a finite number in fraction of the devices, got nan"),
    ("0.5", "must be a number in fraction of the devices, got '0.5'"),
    (None, "must be a number in fraction of the devices, got None")])
def test_participation_must_be_a_fraction_in_the_half_open_unit_interval(rho, message) -> None:
    with pytest.raises(InputError) as info:
        Strategy(participation=rho)
    assert (info.value.field, info.value.message) == ("--participation", message)
    assert Strategy(participation=1).participation == 1.0                   # the closed end


def test_a_participation_fraction_draws_ceil_rho_n_distinct_devices() -> None:
    assert Strategy(participation=1).participation == 1.0
    engine = SplitEngine(small_model(), [3] * 10, Strategy(participation=0.25), make_data(10), {"lr": 0.05},
                         batch_size=4)
    seen = set()
    for t in (1, 2, 3, 4):
        chosen = engine.run_round(t).participants
        assert len(chosen) == 3 and chosen == sorted(set(chosen))      # ⌈0.25 · 10⌉ = 3, without replacement
        seen |= set(chosen)
    assert len(seen) > 3                                                # redrawn every round
    ctx = engine.context(5)
    assert len(sample_devices(ctx, 0.01)) == 1                          # at least one device
    assert sample_devices(ctx, 1.0) == list(range(10))


def test_models_and_data_elsewhere_are_copied_once_and_the_callers_stay_put() -> None:
    # (the "meta" device stands in for a GPU here: tensors on it have a device but no storage)
    from trainers.engine.split_engine import _data_on_device, _on_device

    chain, data = small_model(), make_data(2)
    cpu, meta = torch.device("cpu"), torch.device("meta")
    assert _on_device(chain, cpu) is chain and _data_on_device(data, cpu) is data
    moved = _on_device(chain, meta)
    assert moved is not chain and all(p.device == meta for p in moved.parameters())
    assert all(p.device == cpu for p in chain.parameters())
    moved_data = _data_on_device(data, meta)
    assert all(getattr(moved_data, n).device == meta for n in ("x_train", "y_train", "x_test", "y_test"))
    assert moved_data.parts is data.parts and data.x_train.device == cpu
    assert moved_data.x_train.shape == data.x_train.shape


def test_evaluation_runs_in_eval_mode_and_restores_the_models_mode() -> None:
    # Dropout is off while evaluating (no random masks: the same numbers twice, those of the eval-mode model)
    engine = psl()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Dropout(0.5), torch.nn.Linear(64, 10))
    x, y = engine.data.x_test, engine.data.y_test
    model.eval()
    with torch.no_grad():
        logits = model(x)
    expected = (int((logits.argmax(1) == y).sum()) / len(y), float(torch.nn.functional.cross_entropy(logits, y)))
    assert engine.evaluate(model)[0] == expected[0]                 # an eval-mode model stays in eval mode
    assert not model.training
    model.train()
    first, second = engine.evaluate(model, batch_size=64), engine.evaluate(model, batch_size=64)
    assert first == second and first[0] == expected[0] and first[1] == pytest.approx(expected[1], rel=1e-6)
    assert model.training


# ---- the edge server and the fed server, by hand --------------------------------------------------------------
def test_devices_meeting_at_a_batchnorm_server_block_are_normalised_apart() -> None:
    # BatchNorm couples the samples of a batch: each device's activations go through the shared server blocks
    # alone (batch statistics of its own mini-batch), never concatenated with another device's
    torch.manual_seed(0)
    with_bn = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                  torch.nn.Flatten(), torch.nn.Linear(4 * 8 * 8, 10))
    engine = SplitEngine(with_bn, [1, 1], make_strategy("psl"), make_data(2), {"lr": 0.05}, batch_size=B)
    arrivals = [engine.devices[d].forward(1) for d in range(2)]
    server = torch.nn.Sequential(*[copy.deepcopy(engine.edge.instances[(None, j)]) for j in range(1, 5)])
    expected = {a.device: server(a.tensor) for a in arrivals}        # one device at a time, in training mode
    p = engine.passes.run(arrivals)
    for d in range(2):
        assert torch.allclose(p.logits[d], expected[d], atol=1e-5, rtol=0), d


def test_weighted_mean_by_hand() -> None:
    from trainers.roles.core import weighted_mean

    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}
    b = {"w": torch.tensor([4.0, 8.0]), "n": torch.tensor(5)}
    out = weighted_mean([a, b, a], [1.0, 1.0, 1.0])
    assert torch.allclose(out["w"], torch.tensor([2.0, 4.0]))          # (1 + 4 + 1)/3, (2 + 8 + 2)/3
    assert torch.equal(out["n"], torch.tensor(3))                       # integer buffers: the first's, not a mean
    out = weighted_mean([a, b], [1.0, 3.0])
    assert torch.allclose(out["w"], torch.tensor([3.25, 6.5]))         # (1 + 3·4)/4, (2 + 3·8)/4
    out = weighted_mean([b, b], [2.0, 7.0])
    assert torch.equal(out["w"], b["w"]) and out["w"] is not b["w"]    # identical entries: an exact copy
    c = {"w": torch.tensor([0.0, 16.0]), "n": torch.tensor(7)}
    out = weighted_mean([a, b, c], [2.0, 2.0, 4.0])                     # equal weights first, then another
    assert torch.allclose(out["w"], torch.tensor([1.25, 10.5]))        # (2·1 + 2·4 + 4·0)/8, (2·2 + 2·8 + 4·16)/8
    assert torch.equal(a["w"], torch.tensor([1.0, 2.0]))                # the inputs are left as they were


def test_the_fed_server_averages_uploads_as_they_arrive() -> None:
    from trainers.roles.core import FedServer
    from trainers.roles.messages import BlockState, ModelUpload

    fed = FedServer()
    for k, value in enumerate([1.0, 3.0, 8.0]):
        upload = ModelUpload(k, 1, "device", {0: BlockState({"w": torch.full((2,), value)})}, 1.0 + (k == 2))
        fed.add(upload)
        del upload                                                       # nothing keeps it
    out = fed.finish(1)
    assert list(out) == [(0, 0)]                                        # group 0 (none set), block 0
    assert torch.allclose(out[0, 0].state["w"], torch.full((2,), 5.0))  # (1 + 3 + 2·8)/4
    assert torch.equal(fed.global_blocks[0]["w"], out[0, 0].state["w"])
    assert fed.finish(2) == {}                                          # each finish starts anew


def test_added_server_gradients_accumulate() -> None:
    engine = psl()
    p = next(engine.edge.instances[(None, 6)].parameters())
    assert p.grad is None
    g1, g2 = torch.ones_like(p), torch.full_like(p, 2.5)
    engine.edge.add_gradients([p], [g1])
    engine.edge.add_gradients([p], [g2])
    assert torch.equal(p.grad, torch.full_like(p, 3.5))
    assert torch.equal(g1, torch.ones_like(p))                          # the caller's tensors are not modified
    engine.edge.zero_grad()
    assert p.grad is None


def test_an_aggregation_that_moves_no_edge_server_block_costs_the_edge_links_nothing() -> None:
    # SFL-V2 (one shared server model): only client blocks are averaged, so neither edge link carries anything;
    # with instantaneous device model messages the aggregation adds no time at all, whatever the edge rates
    from tests.engine_builders import BP, DOWN, FP, SERVER, UP, FixedClock

    zero = np.zeros(3)
    times = StageTimes(FP, UP, SERVER, DOWN, BP, zero, zero, 8.0, 8.0, B)        # 8 bit/s edge links
    engine = SplitEngine(small_model(), [3, 3, 3], make_strategy("sfl-v2"), make_data(3), {"lr": 0.05},
                         batch_size=B, clock=FixedClock(times))
    stats = engine.run_round(1)
    # training alone as in test_engine_timing's SFL-V2 round: the last device back at 7.0
    assert stats.aggregated and stats.bytes_server == 0
    assert stats.sim_seconds == pytest.approx(7.0, rel=1e-12)
    assert stats.stage_seconds["model upload"] == 0.0 and stats.stage_seconds["model download"] == 0.0


def test_a_nested_deferred_scope_joins_the_outer_one() -> None:
    bad = torch.tensor([float("inf")])
    after_inner = []
    with pytest.raises(NonFiniteError, match="NaN or inf in model x at round 3, device 1"):
        with deferred_finite_checks():
            with deferred_finite_checks():                    # joins: nothing is read when it ends
                check_all_finite([(torch.ones(2), "model w", 0), (bad, "model x", 1)], 3)
            after_inner.append(True)
            check_finite(bad, "later", 3, 2)
    assert after_inner == [True]
    with deferred_finite_checks(enabled=False):               # off: the multi-tensor check is immediate too
        with pytest.raises(NonFiniteError, match="model x at round 4"):
            check_all_finite([(bad, "model x", 1)], 4)
    check_all_finite([], 5)                                    # nothing to check


@pytest.mark.parametrize("cut", [10, 11])
def test_per_device_gradients_by_hand(cut) -> None:
    # loss L_i = mean CE(a W^T + c, y) over the b samples. With P = softmax(logits) and Y one-hot:
    # ∂L/∂W = (P − Y)^T a / b, ∂L/∂c = Σ (P − Y) / b, ∂L/∂a = (P − Y) W / b; with cut L = 11 the server holds no
    # block: logits = a, no server gradient, ∂L/∂a = (P − Y) / b
    engine = SplitEngine(small_model(), [cut, cut], make_strategy("psl"), make_data(2), {"lr": 0.05}, batch_size=B)
    arrivals = [engine.devices[d].forward(1) for d in range(2)]
    per = engine.passes.per_device_gradients(arrivals, lambda d, logits, y: torch.nn.functional.cross_entropy(logits, y))
    for a in arrivals:
        g, cut_grad, loss, leaf = per[a.device]
        x = a.tensor.detach()
        Y = torch.nn.functional.one_hot(a.labels, 10).to(x.dtype)
        if cut == 10:
            W, c = (p.detach() for p in engine.edge.instances[(None, 10)].parameters())
            logits = x @ W.T + c
        else:
            logits = x
        P = torch.softmax(logits, dim=1)
        assert torch.allclose(loss.detach(), torch.nn.functional.cross_entropy(logits, a.labels), atol=1e-6)
        if cut == 10:
            assert len(g) == 2
            assert torch.allclose(g[0], (P - Y).T @ x / B, atol=1e-6) and torch.allclose(g[1], (P - Y).sum(0) / B, atol=1e-6)
            assert torch.allclose(cut_grad, (P - Y) @ W / B, atol=1e-6)
        else:
            assert g == []
            assert torch.allclose(cut_grad, (P - Y) / B, atol=1e-6)
    if cut == 10:                                                        # no parameter .grad is touched
        assert all(p.grad is None for p in engine.edge.instances[(None, 10)].parameters())


def test_the_strategys_draws_are_not_any_devices_sampler_stream() -> None:
    """Device i's sampler is seeded [seed, i]; the strategy's generator must not repeat any of those streams."""
    engine = SplitEngine(small_model(), [3] * 8, make_strategy("cyclesl"), make_data(8), {"lr": 0.05}, batch_size=2,
                         seed=3)
    strategy_draws = engine.rng.integers(0, 2**62, 4)
    for i in range(8):
        device_draws = np.random.default_rng([3, i]).integers(0, 2**62, 4)
        assert not np.array_equal(strategy_draws, device_draws), i
    assert np.array_equal(strategy_draws, np.random.default_rng([3, STRATEGY_STREAM]).integers(0, 2**62, 4))


@pytest.mark.parametrize("weights", ["equal", "data_size"])
def test_an_aggregation_averages_the_client_blocks_with_the_weights_it_names(weights: str) -> None:
    """Devices of 1, 2 and 5 hundred samples whose client block holds 0, 1 and 2 (no learning,
    lr = 0): after the aggregation every device holds the plain mean 1 (``equal``) or the
    |𝒟_i|-weighted one (0·1 + 1·2 + 2·5)/8 = 1.5 (``data_size``)."""
    class Averaging(Strategy):
        def aggregation(self, ctx):
            return Aggregation((0,), weights)

    d = load_dataset("synthetic")
    sizes = [100, 200, 500]
    parts = np.split(np.arange(800), np.cumsum(sizes)[:-1])
    data = DeviceData(d.x_train, d.y_train, d.x_test, d.y_test, list(parts))
    engine = SplitEngine(small_model(), [2, 2, 2], Averaging(), data, {"lr": 0.0}, batch_size=4)
    for i, device in enumerate(engine.devices):
        for p in device.blocks[0].parameters():
            p.data = torch.full_like(p, float(i))     # its own tensor: devices start on the template's
    engine.run_round(1)
    expected = 1.0 if weights == "equal" else (0 * 100 + 1 * 200 + 2 * 500) / 800
    for device in engine.devices:
        assert all(torch.allclose(p, torch.full_like(p, expected)) for p in device.blocks[0].parameters())


def test_the_averaged_model_is_the_block_wise_mean_of_the_devices_models() -> None:
    """w̄ = (1/N)Σ_i w_i (docs/model.md §2.1), block by block: PSL's client models differ after a round, so their
    blocks are averaged; the shared server blocks are the one live instance."""
    engine = make_engine("psl", [4] * 3, devices=3)
    engine.run_round(1)
    mean = engine.averaged_model()
    weighted = [j for j in range(4) if list(engine.block(0, j).parameters())]
    assert weighted
    for j in weighted:
        expected = sum(flat(engine.block(d, j)) for d in range(3)) / 3
        assert torch.allclose(flat(mean[j]), expected, atol=1e-7, rtol=0), j
        assert mean[j] is not engine.block(0, j)
    assert all(mean[j] is engine.block(0, j) for j in range(4, 11))
    assert torch.allclose(flat(*list(engine.averaged_model([1]))[:4]), flat(*[engine.block(1, j) for j in range(4)]))
