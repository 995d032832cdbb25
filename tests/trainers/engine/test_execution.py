"""The execution policy (trainers.engine.execution): resolved once from the options, read by the runtime."""

from __future__ import annotations

import pytest
import torch

from adaptplan.errors import InputError
from tests.engine_builders import make_data, small_model
from trainers.config.train_config import CPU_PASS_SAMPLES, RECOMPUTE_SAMPLES, SERVER_PASS_SAMPLES
from trainers.engine.execution import Execution
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


def test_recompute_follows_its_option_and_the_waiting_samples() -> None:
    auto, on, off = (Execution.resolve("cpu", client_recompute=mode) for mode in ("auto", "on", "off"))
    assert not auto.recompute(RECOMPUTE_SAMPLES) and auto.recompute(RECOMPUTE_SAMPLES + 1)
    assert on.recompute(1) and not off.recompute(10 * RECOMPUTE_SAMPLES)


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
    assert (engine.edge.pass_samples, engine.edge.concatenate, engine.recompute(1)) == (8, False, True)
    by_options = SplitEngine(small_model(), [2, 2, 3], make_strategy("psl"), make_data(3), {"lr": 0.05}, batch_size=4,
                             client_batching="on", server_pass_samples=8, client_recompute="on", batch_devices=False)
    assert by_options.execution == policy
