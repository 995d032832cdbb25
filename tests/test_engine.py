"""Engine mechanics: SL ≡ centralized SGD, message checks, NaN detection, re-partition without
state loss, device batching ≡ per-device processing, optimizer state persistence."""

from __future__ import annotations


import pytest
import torch
from torch import nn

from trainers.engine import DeviceData, SplitEngine
from trainers.models import cnn
from trainers.partition import DeviceSampler, partition_indices
from trainers.datasets import load_dataset
from trainers.strategies import make_strategy
from trainers.api import Strategy, parallel_step
from trainers.messages import CutGradient, MessageMismatchError, NonFiniteError

torch.set_num_threads(1)


def small_model(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return cnn(1, 8, 10, width=4)        # passed as is: its 11 children are the blocks; input (1, 8, 8)


def make_data(devices: int, partition: str = "iid") -> DeviceData:
    d = load_dataset("synthetic")
    parts = partition_indices(d.y_train.numpy(), devices, partition, seed=0)
    return DeviceData(d.x_train, d.y_train, d.x_test, d.y_test, parts)


def make_engine(algorithm: str, cuts, devices: int, interval: int = 1, lr: float = 0.1, momentum: float = 0.0,
                batch_devices: bool = True, model: nn.Sequential | None = None) -> SplitEngine:
    return SplitEngine(model or small_model(), cuts, make_strategy(algorithm), make_data(devices),
                       {"lr": lr, "momentum": momentum}, batch_size=16, seed=0, interval=interval,
                       batch_devices=batch_devices)


def flat(*modules: nn.Module) -> torch.Tensor:
    """All parameters of ``modules`` as one detached vector."""
    return torch.cat([p.detach().reshape(-1) for m in modules for p in m.parameters()])


def params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


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

    def __init__(self) -> None:
        self.previous = None

    def serve(self, edge, ctx, arrivals):
        grads = parallel_step(edge, ctx, arrivals)
        stale, self.previous = self.previous, grads
        return stale or grads


class SilentStrategy(Strategy):
    """A faulty server that never answers device 1."""

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
        next(engine.block(1, 0).parameters()).fill_(float("nan"))
    # caught where it first shows: device 1's own forward, before its activation is sent
    with pytest.raises(NonFiniteError, match=r"^NaN or inf in client activation at round 2, device 1$"):
        engine.run_round(2)


class NaNGradientStrategy(Strategy):
    """A faulty server that answers device 0 with a NaN cut gradient."""

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


def test_repartition_keeps_global_model_output() -> None:
    engine = make_engine("adaptsfl", [2, 4, 7], devices=3, interval=2, momentum=0.9)
    for t in (1, 2):
        stats = engine.run_round(t)
    assert stats.aggregated
    x = engine.data.x_test[:32]
    with torch.no_grad():
        before = engine.averaged_model()(x)
        per_device_before = [engine.device_model(d)(x) for d in range(3)]
    engine.set_cuts([5, 1, 9])
    with torch.no_grad():
        after = engine.averaged_model()(x)
        per_device_after = [engine.device_model(d)(x) for d in range(3)]
    assert torch.equal(before, after)
    for a, b in zip(per_device_before, per_device_after, strict=True):
        assert torch.equal(a, b)
    assert engine.deepest_cut == 9 and engine.cuts == [5, 1, 9]
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
    from trainers.roles import has_batch_coupling

    plain = small_model()
    with_bn = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                            nn.Linear(4 * 8 * 8, 10))
    assert not has_batch_coupling(plain) and has_batch_coupling(with_bn)
    assert has_batch_coupling(nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))))   # nested
    assert make_engine("psl", [3, 3], devices=2).edge.concatenate
    assert not make_engine("psl", [1, 1], devices=2, model=with_bn).edge.concatenate


def test_label_prior_and_an_empty_server_step() -> None:
    from trainers.api import label_prior

    assert torch.equal(label_prior([2, 0, 6]), torch.tensor([0.25, 0.0, 0.75]))
    assert torch.equal(label_prior(torch.tensor([0, 0, 0])), torch.zeros(3))      # no samples: no NaN
    assert label_prior([1, 1]).dtype == torch.float32
    engine = make_engine("psl", [3, 3], devices=2)
    before = flat(*engine.edge.instances.values())
    assert parallel_step(engine.edge, engine.context(1), []) == []                # nothing arrived: no replies, no step
    assert torch.equal(flat(*engine.edge.instances.values()), before)


class BlowUpStrategy(Strategy):
    """A server step that leaves an inf in the shared server model (as a too large step would)."""

    def serve(self, edge, ctx, arrivals):
        replies = parallel_step(edge, ctx, arrivals)
        with torch.no_grad():
            next(edge.instances[(None, 10)].parameters())[0, 0] = float("inf")
        return replies


def test_a_model_made_non_finite_stops_the_round_that_made_it() -> None:
    engine = SplitEngine(small_model(), [3, 3], BlowUpStrategy(), make_data(2), {"lr": 0.1}, 16)
    with pytest.raises(NonFiniteError, match=r"NaN or inf in server model block 11 at round 1, device shared server"):
        engine.run_round(1)
    per_device = make_engine("sfl-v1", [3, 3], devices=2)          # one server copy per device: named by its device
    per_device.run_round(1)
    with torch.no_grad():
        next(per_device.edge.instances[(1, 10)].parameters())[0, 0] = float("nan")
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
    from trainers.optim import mean_param_state

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
    """CyclePSL: every device's own model (client models are never averaged); CycleSFL: the averaged model."""
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
            expected = [engine.averaged_model()(x)]
    assert len(outputs) == len(expected) and all(torch.equal(a, b) for a, b in zip(outputs, expected))


def test_scala_evaluates_the_average_of_the_iterations_participants() -> None:
    """SCALA's participant set stays for the I rounds of a global iteration; mid-iteration the reported model is
    the average over those participants (the others still hold the previous global client model)."""
    from trainers.strategies import SCALA

    engine = SplitEngine(small_model(), [3] * 4, SCALA(participation=0.5), make_data(4), {"lr": 0.1}, 16, interval=2)
    engine.run_round(1)
    current = engine.strategy.current
    assert len(current) == 2
    x = engine.data.x_test[:20]
    with torch.no_grad():
        (model,) = engine.strategy.eval_models(engine)
        assert torch.equal(model(x), engine.averaged_model(current)(x))
        assert not torch.equal(model(x), engine.averaged_model()(x))


def test_edge_server_api_edges() -> None:
    """An empty server pass, and zero_grad clearing the server's accumulated gradients."""
    engine = make_engine("psl", [3, 3], devices=2)
    empty = engine.edge.run([])
    assert empty.devices == [] and empty.logits == {} and empty.inputs == {}
    arrivals = [engine.devices[d].forward(1) for d in (0, 1)]
    p = engine.edge.run(arrivals)
    p.backward(sum(nn.functional.cross_entropy(p.logits[d], p.labels[d]) for d in (0, 1)))
    server = [q for m in engine.edge.instances.values() for q in m.parameters()]
    assert all(q.grad is not None for q in server)
    engine.edge.zero_grad()
    assert all(q.grad is None for q in server)
