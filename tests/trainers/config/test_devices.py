"""Compute devices (trainers/config/devices.py): names and synchronisation of a CPU and a GPU."""

from __future__ import annotations

import torch

from trainers.config.devices import describe, resolve_device, synchronize

torch.set_num_threads(1)


def test_a_cpu_is_named_and_needs_no_synchronisation() -> None:
    cpu = resolve_device("cpu")
    assert cpu == torch.device("cpu")
    assert describe(cpu) == "cpu"
    assert synchronize(cpu) is None


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
