"""``--device {auto,cpu,cuda}``: the torch device a run, a benchmark or a statistics pass uses.

``auto`` is CUDA when torch sees a GPU, else the CPU. Asking for ``cuda`` where there is none is a
user error (:class:`~adaptplan.errors.InputError`, exit code 2) naming the flag.
"""

from __future__ import annotations

import torch

from adaptplan.errors import InputError
from trainers.config.train_config import DEVICES, check_choice


def resolve_device(name: str, field: str = "--device") -> torch.device:
    """The torch.device of ``name`` (one of :data:`trainers.config.train_config.DEVICES`); InputError naming
    ``field`` for an unknown name or for ``cuda`` without a usable GPU."""
    check_choice(name, DEVICES, field)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        why = "this torch is built without CUDA" if torch.version.cuda is None else "torch sees no CUDA GPU here"
        raise InputError(f"CUDA is not available ({why}); use --device cpu, or auto (CUDA when present)", field=field)
    return torch.device(name)


def describe(device: torch.device) -> str:
    """``cpu`` or ``cuda (NVIDIA H100 ...)``, for reports."""
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return device.type


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (before reading a wall clock)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
