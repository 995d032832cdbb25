"""Atomic checkpoints of a run: engine state (parameters, optimizer states, cuts, samplers,
partitions), RNG states (torch, numpy), round index, clock seconds, history and strategy state.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from adaptplan.errors import InputError

CHECKPOINT_NAME = "checkpoint.pt"


def save_checkpoint(state: dict[str, Any], folder: str | os.PathLike) -> Path:
    """Write ``state`` to ``folder/checkpoint.pt`` atomically (temp file + rename)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / CHECKPOINT_NAME
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(folder: str | os.PathLike) -> dict[str, Any]:
    path = Path(folder) / CHECKPOINT_NAME
    if not path.is_file():
        raise InputError(f"no checkpoint at {str(path)!r}; run with --checkpoint-every first", field="resume")
    return torch.load(path, map_location="cpu", weights_only=False)
