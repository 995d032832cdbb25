"""Small units of the trainers core checked against hand computations: model builders (parameter
counts written out), partition and sampler edges, a device's data summaries, client-batching
reasons, device names, and a policy whose baseline finds no plan."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from adaptplan.errors import InfeasibleError, InputError
from trainers.batching import unbatchable_reason
from trainers.devices import describe, resolve_device, synchronize
from trainers.models import build_model, check_model
from trainers.optim import OptimizerSpec
from trainers.partition import PartitionSummary, partition_indices
from trainers.roles import Device

torch.set_num_threads(1)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_builtin_mlp_has_the_documented_shape() -> None:
    # Flatten → Linear(C·H·W, 4·width) → ReLU → Linear(4w, 4w) → ReLU → Linear(4w, M); 1×8×8 inputs, width 4:
    # 64·16 + 16 + 16·16 + 16 + 16·3 + 3 = 1,379 parameters
    model = build_model("mlp", (1, 8, 8), 3, width=4)
    assert n_params(model) == 64 * 16 + 16 + 16 * 16 + 16 + 16 * 3 + 3
    assert model(torch.zeros(5, 1, 8, 8)).shape == (5, 3)
    # 3×4×2 inputs: C·H·W = 24 input features
    assert n_params(build_model("mlp", (3, 4, 2), 2, width=1)) == 24 * 4 + 4 + 4 * 4 + 4 + 4 * 2 + 2


def test_builtin_cnn_has_the_documented_shape() -> None:
    # CIFAR (3×32×32), width 32: convs 3→32→64→64 (3×3), then 64·4·4 → 128 → 10: ≈ 0.12 M parameters
    model = build_model("cnn", (3, 32, 32), 10)
    expected = (3 * 9 * 32 + 32) + (32 * 9 * 64 + 64) + (64 * 9 * 64 + 64) + (64 * 16 * 128 + 128) + (128 * 10 + 10)
    assert n_params(model) == expected
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


def test_other_model_names_go_to_torchvision_and_unknown_ones_are_input_errors() -> None:
    model = build_model("resnet18", (3, 32, 32), 7)
    assert model.fc.out_features == 7
    with pytest.raises(InputError, match="cnn") as info:
        check_model("no-such-model", field="--model")
    assert info.value.field == "--model"
    with pytest.raises(InputError, match="cnn, mlp, vgg16-cifar") as info:     # the built-ins are listed as valid
        build_model("no-such-model", (3, 32, 32), 10, field="model")
    assert info.value.field == "model"
    check_model("mlp")                                    # built-ins need no look-up


def test_a_partition_needs_a_sample_per_device_and_summarises_by_hand() -> None:
    with pytest.raises(InputError, match="3 samples cannot be split over 4 devices") as info:
        partition_indices(np.array([0, 1, 0]), 4, "iid", seed=0)
    assert info.value.field == "devices"
    labels = np.array([0, 0, 1, 2, 2, 2])
    summary = PartitionSummary.of([np.array([0, 1]), np.array([2, 3, 4, 5])], labels)
    assert summary == PartitionSummary((2, 4), (1, 2))


def test_a_device_knows_its_data_size_and_label_histogram() -> None:
    x = torch.zeros(8, 2)
    y = torch.tensor([0, 1, 1, 2, 2, 2, 3, 0])
    dev = Device(0, nn.Sequential(nn.Linear(2, 2)), 1, x, y, np.array([1, 2, 5, 6]), 2, 0, OptimizerSpec())
    assert dev.data_size == 4
    assert dev.label_counts(5).tolist() == [0, 2, 1, 1, 0]          # labels 1, 1, 2, 3


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


def test_a_cpu_is_named_and_needs_no_synchronisation() -> None:
    cpu = resolve_device("cpu")
    assert cpu == torch.device("cpu")
    assert describe(cpu) == "cpu"
    assert synchronize(cpu) is None


def test_a_baseline_that_finds_no_plan_is_an_infeasible_error(monkeypatch) -> None:
    from adaptplan.scenarios import default_scenario
    from solvers import baselines
    from trainers.policies import policy_planner
    from trainers.run import ReplanRequest

    failed = SimpleNamespace(success=False, message="no cut vector reaches the target", cuts=(1,), interval=1)
    monkeypatch.setattr(baselines, "solve_fixed_cut", lambda problem, cut: failed)
    scenario = default_scenario()
    plan = policy_planner("fixed-cut", scenario.constants, 0.01, seed=0, fixed_cut=2)
    with pytest.raises(InfeasibleError, match="no cut vector reaches the target"):
        plan(ReplanRequest(0, scenario.system, scenario.profile, [], 1))


def test_sim_clock_charges_eqs_16_to_24_for_the_runs_batch_and_each_rounds_system() -> None:
    from adaptplan.scenarios import default_scenario
    from adaptplan.system import SystemProcess
    from trainers.clock import SimClock

    scenario = default_scenario()                               # 20 devices, system batch size 16
    profile, N, b = scenario.profile, scenario.system.num_devices, 8
    assert scenario.system.batch_size != b
    process = SystemProcess(scenario.system, seed=1, redraw=True)
    clock = SimClock(profile, process, batch_size=b)
    cuts = [(i % profile.num_cuts) + 1 for i in range(N)]

    def by_hand(t: int) -> dict[str, np.ndarray]:
        s = process.state(t)
        c = np.asarray(cuts) - 1
        f = np.array([d.flops for d in s.devices])
        rate = {k: np.array([getattr(d, k) for d in s.devices]) for k in ("up_bps", "down_bps", "fed_up_bps",
                                                                          "fed_down_bps")}
        return {"client_fp": b * profile.rho[c] / f,                                    # (16)
                "upload": b * profile.psi[c] / rate["up_bps"],                          # (17)
                "server": b * ((profile.rho[-1] - profile.rho[c]) + profile.server_bp[c]) / s.server_flops,  # (18)+(19)
                "download": b * profile.chi[c] / rate["down_bps"],                      # (20)
                "client_bp": b * profile.varpi[c] / f,                                  # (21)
                "model_up": profile.delta[c] / rate["fed_up_bps"],                      # (22)
                "model_down": profile.delta[c] / rate["fed_down_bps"]}                  # (24)

    first = clock.stage_times(3, cuts)
    for t in (3, 4, 3):                                          # round 3 again after 4: no stale system
        times = clock.stage_times(t, cuts)
        for name, expected in by_hand(t).items():
            np.testing.assert_allclose(getattr(times, name), expected, rtol=1e-12, err_msg=f"{name}, round {t}")
        assert times.batch_size == b
        assert (times.edge_to_fed_bps, times.fed_to_edge_bps) == (scenario.system.edge_to_fed_bps,
                                                                  scenario.system.fed_to_edge_bps)
    assert not np.allclose(clock.stage_times(4, cuts).client_fp, first.client_fp)    # re-drawn devices
    fixed = SimClock(profile, SystemProcess(scenario.system, seed=1, redraw=False), batch_size=b)
    np.testing.assert_array_equal(fixed.stage_times(2, cuts).upload, fixed.stage_times(9, cuts).upload)


# ---- optimizers by hand ----------------------------------------------------------------------------------------
def param(*values: float) -> nn.Parameter:
    return nn.Parameter(torch.tensor(values, dtype=torch.float64))


def step(opt, p: nn.Parameter, grad, scale: float = 1.0) -> None:
    p.grad = torch.tensor(grad, dtype=torch.float64)
    opt.step(scale)


def test_default_optimizer_is_plain_sgd_at_lr_0_01() -> None:
    from trainers.optim import RoleOptimizer

    p = param(1.0, -2.0)
    opt = RoleOptimizer(OptimizerSpec(), [p])
    step(opt, p, [10.0, 20.0])
    assert torch.allclose(p.detach(), torch.tensor([1.0 - 0.1, -2.0 - 0.2], dtype=torch.float64))
    assert p.grad is None                                              # cleared after the step
    step(opt, p, [10.0, 0.0])                                          # no momentum: the same rule again
    assert torch.allclose(p.detach(), torch.tensor([0.8, -2.2], dtype=torch.float64))


def test_scaling_then_clipping_then_the_sgd_rule_with_momentum_and_weight_decay() -> None:
    from trainers.optim import RoleOptimizer

    p = param(3.0, 4.0)
    opt = RoleOptimizer(OptimizerSpec("sgd", lr=0.5, clip_norm=1.0), [p])
    step(opt, p, [3.0, 4.0], scale=2.0)          # 2·(3, 4) = (6, 8), norm 10 → clipped to norm 1: (0.6, 0.8)
    assert torch.allclose(p.detach(), torch.tensor([3.0 - 0.3, 4.0 - 0.4], dtype=torch.float64))
    q = param(1.0)
    opt = RoleOptimizer(OptimizerSpec("sgd", lr=0.1, momentum=0.9, weight_decay=0.5), [q])
    step(opt, q, [2.0])                          # g' = 2 + 0.5·1 = 2.5, buf = 2.5, q = 1 − 0.25 = 0.75
    assert torch.allclose(q.detach(), torch.tensor([0.75], dtype=torch.float64))
    step(opt, q, [0.0], scale=3.0)               # g' = 0 + 0.5·0.75 = 0.375, buf = 0.9·2.5 + 0.375 = 2.625
    assert torch.allclose(q.detach(), torch.tensor([0.75 - 0.2625], dtype=torch.float64))
    (state,) = opt.param_states([q])
    assert torch.allclose(state["momentum_buffer"], torch.tensor([2.625], dtype=torch.float64))


def test_adam_is_adam_and_a_step_without_gradients_changes_nothing() -> None:
    from trainers.optim import RoleOptimizer

    p = param(1.0, 1.0)
    opt = RoleOptimizer(OptimizerSpec("adam", lr=0.1), [p])
    opt.step()                                                         # no gradient yet: no step, no state
    assert opt.param_states([p]) == [{}] and torch.equal(p.detach(), torch.ones(2, dtype=torch.float64))
    step(opt, p, [4.0, -0.5])                    # Adam's first step: lr·m̂/(√v̂ + ε) = lr·sign(g)
    assert torch.allclose(p.detach(), torch.tensor([0.9, 1.1], dtype=torch.float64), atol=1e-6)
    assert RoleOptimizer(OptimizerSpec(), []).torch is None            # an owner without parameters
    RoleOptimizer(OptimizerSpec(), []).step()


def test_optimizer_states_move_as_copies() -> None:
    from trainers.optim import RoleOptimizer

    p, q = param(1.0), param(1.0)
    a = RoleOptimizer(OptimizerSpec("sgd", lr=0.1, momentum=0.9), [p])
    step(a, p, [1.0])
    b = RoleOptimizer(OptimizerSpec("sgd", lr=0.1, momentum=0.9), [q])
    b.load_param_states([q], a.param_states([p]))
    step(a, p, [1.0])
    step(b, q, [1.0])
    # a: buf 1 → 1.9, p = 0.9 − 0.19; b continues from a copy of buf = 1 (a's second step does not touch it)
    assert torch.allclose(p.detach(), torch.tensor([0.71], dtype=torch.float64))
    assert torch.allclose(q.detach(), torch.tensor([1.0 - 0.19], dtype=torch.float64))


def test_a_gpu_is_named_by_its_model_and_synchronised(monkeypatch) -> None:
    # no GPU needed: torch.device("cuda") is only a name; the two CUDA calls are stand-ins that record their use
    calls = []
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU 80GB")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    gpu = torch.device("cuda")
    assert describe(gpu) == "cuda (Fake GPU 80GB)"
    synchronize(gpu)
    assert calls == [gpu]
    synchronize(torch.device("cpu"))
    assert calls == [gpu]                                              # the CPU has nothing queued to wait for


def test_model_builders_default_to_the_documented_sizes() -> None:
    from trainers.models import cnn, vgg16_cifar

    # cnn(): width 32 (32/64/64 channels, ≈ 0.12 M parameters on CIFAR-10)
    expected = (3 * 9 * 32 + 32) + (32 * 9 * 64 + 64) + (64 * 9 * 64 + 64) + (64 * 16 * 128 + 128) + (128 * 10 + 10)
    assert n_params(cnn(3, 32, 10)) == expected
    # vgg16_cifar(): 10 classes, 3 input channels: 15,245,130 parameters (docs/model.md §7.1)
    vgg = vgg16_cifar()
    assert n_params(vgg) == 15_245_130
    assert next(vgg.parameters()).shape[1] == 3


def test_a_policy_that_never_aggregates_outlasts_any_run() -> None:
    from adaptplan.limits import MAX_STEPS
    from trainers.policies import NEVER

    assert NEVER >= MAX_STEPS           # PSL's interval: no run the config accepts reaches an aggregation before it ends
