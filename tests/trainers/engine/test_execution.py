"""The execution policy (trainers.engine.execution): resolved once from the options, read by the runtime."""

from __future__ import annotations

import pytest
import torch

from adaptplan.errors import InputError
from tests.engine_builders import make_data, small_model
from trainers.config.train_config import CPU_PASS_SAMPLES, RECOMPUTE_BYTES, SERVER_PASS_SAMPLES
from trainers.engine.execution import Execution, graph_bytes_per_sample
from trainers.engine.split_engine import SplitEngine
from trainers.strategies import make_strategy


def test_auto_resolves_by_device_and_given_values_stay() -> None:
    cpu, gpu = Execution.resolve("cpu"), Execution.resolve("cuda")       # no GPU needed to name one
    assert (cpu.client_batching, cpu.server_pass_samples, cpu.defer_checks) == (False, CPU_PASS_SAMPLES, False)
    assert (gpu.client_batching, gpu.server_pass_samples, gpu.defer_checks) == (True, SERVER_PASS_SAMPLES, True)
    given = Execution.resolve(torch.device("cpu"), "on", 64, "off", concatenate=False)
    assert (given.client_batching, given.server_pass_samples, given.client_recompute, given.concatenate) == \
        (True, 64, "off", False)
    assert Execution.resolve("cuda", "off", None).server_pass_samples is None and \
        not Execution.resolve("cuda", "off").client_batching


def test_recompute_follows_its_option_and_the_waiting_graphs_bytes() -> None:
    auto, on, off = (Execution.resolve("cpu", client_recompute=mode) for mode in ("auto", "on", "off"))
    per_sample = {1: 1024.0, 3: 3072.0}.__getitem__          # bytes per sample at cuts 1 and 3
    at_budget = {1: RECOMPUTE_BYTES // 4096, 3: RECOMPUTE_BYTES // 4096}    # 1024·n + 3072·n = the budget (2³⁰)
    assert not auto.recompute(at_budget, per_sample)
    assert auto.recompute({1: at_budget[1] + 1, 3: at_budget[3]}, per_sample)
    assert on.recompute({1: 1}, per_sample) and not off.recompute({3: 10 * RECOMPUTE_BYTES}, per_sample)


def test_a_graphs_bytes_per_sample_are_its_saved_activations_and_change_nothing() -> None:
    """Conv2d(1→4, 3×3) on 8×8 inputs, ReLU, MaxPool2d(2): the convolution saves its input (1·8·8 floats per
    sample), ReLU its output (4·6·6), the pooling that same output (counted once) and its int64 indices (4·3·3):
    256 + 576 + 288 = 1,120 bytes per sample; the weights are not per sample. The probe draws nothing from the
    random stream and leaves BatchNorm's statistics alone."""
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU()), torch.nn.MaxPool2d(2)]
    x = torch.randn(2, 1, 8, 8)
    assert graph_bytes_per_sample(blocks[:1], x) == 4 * (64 + 144)
    assert graph_bytes_per_sample(blocks, x) == 4 * (64 + 144) + 8 * 36
    norm = torch.nn.Sequential(torch.nn.Dropout(0.5), torch.nn.BatchNorm2d(1))
    state = torch.random.get_rng_state()
    assert graph_bytes_per_sample([norm], x) > 0
    assert torch.equal(torch.random.get_rng_state(), state) and torch.equal(norm[1].running_mean, torch.zeros(1))


def test_a_saved_view_counts_its_whole_storage_once() -> None:
    """y = x[:, :2] · w saves the view x[:, :2] (w is a parameter): autograd keeps all of x's storage, 4 floats per
    sample, not the view's 2; the same storage saved again through another view (x[:, 2:] · w) adds nothing."""

    class Halves(torch.nn.Module):
        def __init__(self, both: bool) -> None:
            super().__init__()
            self.w, self.both = torch.nn.Parameter(torch.ones(2)), both

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x[:, :2] * self.w
            return y + x[:, 2:] * self.w if self.both else y

    x = torch.randn(3, 4)
    assert graph_bytes_per_sample([Halves(both=False)], x) == 4 * 4
    assert graph_bytes_per_sample([Halves(both=True)], x) == 4 * 4


@pytest.mark.parametrize("field, kwargs", [("client_batching", {"client_batching": "sometimes"}),
                                           ("client_recompute", {"client_recompute": "maybe"})])
def test_a_bad_choice_names_its_option(field: str, kwargs: dict) -> None:
    with pytest.raises(InputError) as info:
        Execution.resolve("cpu", **kwargs)
    assert info.value.field == field


def test_the_engine_runs_the_policy_it_is_given() -> None:
    policy = Execution.resolve("cpu", "on", 8, "on", concatenate=False)
    engine = SplitEngine(small_model(), [2, 2, 3], make_strategy("psl"), make_data(3), {"lr": 0.05}, batch_size=4,
                         execution=policy)
    assert engine.execution is policy and engine.batcher is not None
    assert (engine.passes.pass_samples, engine.passes.concatenate, engine.recompute({0: 1})) == (8, False, True)
    by_options = SplitEngine(small_model(), [2, 2, 3], make_strategy("psl"), make_data(3), {"lr": 0.05}, batch_size=4,
                             client_batching="on", server_pass_samples=8, client_recompute="on", batch_devices=False)
    assert by_options.execution == policy
