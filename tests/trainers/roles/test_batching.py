"""Devices and batching (docs/architecture.md "Devices and batching"): batched client passes ≡
per-device passes, the fall-backs, deferred NaN/inf checks, the reused evaluation model, and the
--device / --client-batching flags."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from torch import nn

from adaptplan.cli import main
from tests.engine_builders import make_data, small_model
from trainers.engine.split_engine import SplitEngine
from trainers.roles.batching import unbatchable_reason
from trainers.roles.core import weighted_mean
from trainers.roles.messages import NonFiniteError, check_finite, deferred_finite_checks
from trainers.roles.optim import OptimizerSpec
from trainers.strategies import make_strategy

torch.set_num_threads(1)

SGD = OptimizerSpec("sgd", lr=0.1, momentum=0.9, weight_decay=5e-4)
ADAM_CLIP = OptimizerSpec("adam", lr=0.01, weight_decay=1e-4, clip_norm=0.05)   # clipping active on every step


def engine(algorithm: str, cuts, batching: str, optimizer: OptimizerSpec = SGD, interval: int = 1,
           model: nn.Sequential | None = None, **options) -> SplitEngine:
    return SplitEngine(model if model is not None else small_model(), cuts, make_strategy(algorithm, options),
                       make_data(len(cuts)), optimizer, batch_size=16, seed=0, interval=interval, total_rounds=4,
                       client_batching=batching)


def everything(e: SplitEngine) -> list[torch.Tensor]:
    """Every parameter every role holds: the devices' client blocks and the edge server's instances."""
    return ([p.detach() for d in e.devices for p in d.blocks.parameters()]
            + [p.detach() for m in e.edge.instances.values() for p in m.parameters()])


def run_both(algorithm: str, cuts, rounds: int = 4, **kwargs) -> tuple[SplitEngine, SplitEngine, float, float]:
    """(per-device engine, batched engine, largest loss difference, largest parameter difference)."""
    off, on = engine(algorithm, cuts, "off", **kwargs), engine(algorithm, cuts, "on", **kwargs)
    loss_err = 0.0
    for t in range(1, rounds + 1):
        a, b = off.run_round(t), on.run_round(t)
        loss_err = max(loss_err, abs(a.loss - b.loss))
        assert a.participants == b.participants and a.bytes_up == b.bytes_up and a.bytes_down == b.bytes_down
    param_err = max(float((p - q).abs().max()) for p, q in zip(everything(off), everything(on)))
    return off, on, loss_err, param_err


@pytest.mark.parametrize("algorithm, cuts, interval", [
    ("sfl-v1", [3, 3, 3], 1),
    ("adaptsfl", [2, 4, 4, 2], 2),          # heterogeneous cuts, I > 1: two batches of two devices
    ("psl", [2, 2, 4, 4], 1),
    ("gapsl", [3, 3, 3, 3], 1),             # some devices get no update (a reply without a tensor)
])
def test_batched_client_passes_equal_per_device_passes(algorithm: str, cuts, interval: int) -> None:
    off, on, loss_err, param_err = run_both(algorithm, cuts, interval=interval)
    assert off.batcher is None and on.batcher is not None
    assert on.batcher.reasons == {c: None for c in set(cuts)}        # every cut was batched
    assert loss_err <= 1e-6 and param_err <= 1e-6, (loss_err, param_err)


def test_batched_steps_keep_each_devices_adam_state_and_clipping() -> None:
    off, on, loss_err, param_err = run_both("adaptsfl", [3, 3, 5, 5], optimizer=ADAM_CLIP, interval=3)
    assert loss_err <= 1e-6 and param_err <= 1e-6, (loss_err, param_err)
    for a, b in zip(off.devices, on.devices):
        assert b.step == a.step and b.pending is None and b.sampler.position == a.sampler.position
        for p, q in zip(a.blocks.parameters(), b.blocks.parameters()):
            sa, sb = a.optimizer.torch.state[p], b.optimizer.torch.state[q]
            assert float(sa["step"]) == float(sb["step"]) == 4
            assert torch.allclose(sa["exp_avg_sq"], sb["exp_avg_sq"], atol=1e-9, rtol=1e-4)


def test_checkpoint_and_repartition_after_batched_rounds() -> None:
    on = engine("adaptsfl", [2, 4, 4, 2], "on", interval=2)
    for t in (1, 2):
        on.run_round(t)
    off = engine("adaptsfl", [2, 4, 4, 2], "off", interval=2)
    off.load_state_dict(copy.deepcopy(on.state_dict()))       # a batched run's checkpoint continues per device
    x = on.data.x_test[:32]
    with torch.no_grad():
        before = on.averaged_model()(x)
    on.set_cuts([4, 4, 2, 2], 2)
    off.set_cuts([4, 4, 2, 2], 2)
    with torch.no_grad():
        assert torch.equal(before, on.averaged_model()(x))
    for t in (3, 4):
        a, b = off.run_round(t), on.run_round(t)
        assert abs(a.loss - b.loss) <= 1e-6
    assert max(float((p - q).abs().max()) for p, q in zip(everything(off), everything(on))) <= 1e-6


def mlp_with(module: nn.Module) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Sequential(nn.Flatten(), nn.Linear(64, 16), module), nn.Sequential(nn.ReLU(), nn.Linear(16, 16)),
                         nn.Linear(16, 10))


class HostBranch(nn.Module):
    """Data-dependent control flow (a Python branch on a tensor's value): vmap refuses it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if float(x.detach().abs().max()) >= 0 else -x


@pytest.mark.parametrize("module, reason", [(nn.BatchNorm1d(16), "BatchNorm1d"), (nn.Dropout(0.2), "Dropout"),
                                            (HostBranch(), "vmap failed")])
def test_what_vmap_cannot_run_exactly_stays_per_device(module: nn.Module, reason: str) -> None:
    results = []
    for batching in ("off", "on"):
        torch.manual_seed(1)                 # Dropout's masks: the same random stream on both sides
        e = engine("psl", [1, 1, 1], batching, model=mlp_with(copy.deepcopy(module)))
        results.append([e.run_round(t).loss for t in (1, 2)] + everything(e))
    assert reason in e.batcher.reasons[1]
    assert results[0][:2] == results[1][:2]
    assert all(torch.equal(p, q) for p, q in zip(results[0][2:], results[1][2:]))   # the per-device path, bit for bit


def test_auto_batches_on_cuda_only() -> None:
    assert engine("psl", [3, 3], "auto").batcher is None          # CPU
    with pytest.raises(Exception, match="client_batching"):
        engine("psl", [3, 3], "always")


def test_deferred_checks_name_the_first_failure_at_the_end() -> None:
    good, bad = torch.ones(3), torch.tensor([1.0, float("nan")])
    with pytest.raises(NonFiniteError, match="NaN or inf in b at round 7, device 2"):
        with deferred_finite_checks():
            check_finite(good, "a", 7, 1)
            check_finite(bad, "b", 7, 2)
            check_finite(bad, "c", 7, 3)
            reached = True                       # nothing raised inside the scope
    assert reached
    with pytest.raises(NonFiniteError, match="in b at round 7") as info:
        with deferred_finite_checks():
            check_finite(bad, "b", 7, 2)
            raise ValueError("what the NaN broke later")
    assert isinstance(info.value.__cause__, ValueError)
    with deferred_finite_checks(enabled=False), pytest.raises(NonFiniteError):
        check_finite(bad, "b", 7, 2)             # off: immediate


@pytest.mark.parametrize("batching", ["off", "on"])
def test_nan_with_checks_read_once_per_round_names_round_and_device(batching: str) -> None:
    e = engine("adaptsfl", [2, 4, 4], batching)
    e.execution = dataclasses.replace(e.execution, defer_checks=True)   # what a CUDA engine does
    e.run_round(1)
    with torch.no_grad():
        p = next(e.block(1, 0).parameters())   # device 1 alone (its tensors may be shared with the others')
        p.data = torch.full_like(p, float("nan"))
    with pytest.raises(NonFiniteError, match=r"client activation at round 2, device 1"):
        e.run_round(2)


def test_averaged_model_reuses_its_evaluation_blocks() -> None:
    e = engine("sfl-v1", [3, 3, 3], "off", interval=2)
    e.run_round(1)                              # no aggregation: the devices' models differ
    first = e.averaged_model()
    kept = copy.deepcopy(first)
    e.run_round(2)
    second = e.averaged_model()
    assert all(a is b for a, b in zip(first, second))          # no new modules
    assert not torch.equal(next(kept.parameters()), next(second.parameters()))
    expected = weighted_mean([e.device_model(d)[0].state_dict() for d in range(3)], [1.0] * 3)
    assert all(torch.equal(second[0].state_dict()[k], v) for k, v in expected.items())


# ---- the flags ---------------------------------------------------------------------------------------
TRAIN = ["train", "--dataset", "synthetic", "--devices", "3", "--batch-size", "8", "--cuts", "3", "--threads", "1",
         "--no-progress", "--eval-every", "2", "--rounds", "2"]


@pytest.mark.parametrize("argv", [
    TRAIN,
    ["bench", "engine", "--devices", "2", "--rounds", "1"],
    ["bench", "algorithms", "--algorithms", "psl", "--partitions", "iid", "--rounds", "1"],
    ["bench", "training", "--policies", "sfl", "--partition", "iid", "--rounds", "1"],
    ["profile", "mlp", "--input", "1x8x8", "--grad-stats", "--dataset", "synthetic", "--constants-out", "c.json"],
])
def test_device_cuda_without_a_gpu_is_one_message(argv, monkeypatch, capsys, tmp_path) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.chdir(tmp_path)
    assert main([*argv, "--device", "cuda"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "\n" not in err and "--device" in err and "CUDA is not available" in err, err
    assert not list(tmp_path.iterdir())         # nothing was written


def test_device_cpu_trains_batched_or_not_and_resumes_with_another_setting(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    argv = [*TRAIN, "--algorithm", "adaptsfl", "--device", "cpu", "--checkpoint-every", "1", "--out", str(out)]
    assert main([*argv, "--client-batching", "on"]) == 0
    assert main(["train", "--out", str(out), "--resume", "--rounds", "3", "--client-batching", "off",
                 "--no-progress"]) == 0
    from trainers.run.checkpoint import load_checkpoint

    saved = load_checkpoint(out)
    assert saved["config"]["device"] == "cpu" and saved["config"]["client_batching"] == "off"
    assert all(t.device.type == "cpu" for t in saved["engine"]["devices"][0]["blocks"][0].values())


torch.set_num_threads(1)


class WithBuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        return self.lin(x)


def test_client_blocks_with_buffers_or_nothing_to_train_run_per_device() -> None:
    assert unbatchable_reason([nn.Linear(4, 4), nn.ReLU()]) is None
    assert unbatchable_reason([nn.Linear(4, 4), WithBuffer()]) == "buffers in WithBuffer (updated in place)"
    frozen = nn.Linear(4, 4).requires_grad_(False)
    assert unbatchable_reason([frozen, nn.ReLU()]) == "no trainable parameters"
