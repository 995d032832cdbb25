"""Checkpoints of a run that are safe to load and hard to lose.

* **No code runs on load.** The state is tensors and plain Python values only (numpy arrays are
  stored as tensors), and it is read with ``torch.load(..., weights_only=True)``: a crafted pickle
  is refused, never executed.
* **Checksummed.** The file is one header line ``adaptplan-checkpoint 2 sha256=<hex>`` followed by
  the torch payload; a payload whose SHA-256 differs (bit flips, truncation) is refused.
* **Checked.** A loaded state is validated field by field (:mod:`trainers.run.checkpoint_schema`) before
  a run continues from it.
* **Atomic.** Written to a temporary file in the same folder, fsync'ed and renamed over the previous
  checkpoint (:func:`adaptplan.fileio.atomic_write`); a failure (disk full, read-only folder, vanished folder)
  removes the temporary file, leaves the previous checkpoint intact and is reported as one
  :class:`~adaptplan.errors.InputError` naming the path and the cause.
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from adaptplan.errors import InputError
from adaptplan.fileio import atomic_write

CHECKPOINT_NAME = "checkpoint.pt"
MAGIC = b"adaptplan-checkpoint 2 sha256="


def plain(value: Any) -> Any:
    """``value`` with numpy arrays turned into tensors and numpy scalars into Python numbers, so that
    it loads under ``weights_only=True``; tensors on a GPU are copied to the CPU (a checkpoint does
    not depend on the device it was written on, and loads on any)."""
    if torch.is_tensor(value):
        return value.cpu()
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        converted = [plain(v) for v in value]
        return converted if isinstance(value, list) else tuple(converted)
    return value


def encode(state: dict[str, Any]) -> bytes:
    """Header line with the payload's SHA-256, then the torch payload."""
    buffer = io.BytesIO()
    torch.save(plain(state), buffer)
    payload = buffer.getvalue()
    return MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload


def decode(data: bytes, where: str) -> dict[str, Any]:
    """The state of an :func:`encode`d checkpoint; InputError naming ``where`` if it is not one,
    is damaged, or holds anything but tensors and plain values."""
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 65 or data[len(MAGIC) + 64:len(MAGIC) + 65] != b"\n":
        raise InputError(f"{where} is not an adaptplan checkpoint (empty, damaged, or written by an older version); "
                         "start the run again with --overwrite", field="--resume")
    digest = data[len(MAGIC):len(MAGIC) + 64].decode("ascii", "replace")
    payload = data[len(MAGIC) + 65:]
    if hashlib.sha256(payload).hexdigest() != digest:
        raise InputError(f"{where} is damaged (its SHA-256 does not match the one it was written with); "
                         "start the run again with --overwrite", field="--resume")
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError for forbidden globals, RuntimeError for a broken archive
        raise InputError(f"{where} holds something other than tensors and plain values and was not loaded "
                         f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]})", field="--resume") from None
    if not isinstance(state, dict):
        raise InputError(f"{where} does not hold a run's state (found {type(state).__name__})", field="--resume")
    return state


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` with :func:`adaptplan.fileio.atomic_write` (fsync'ed temporary file,
    rename, temporary file removed on failure); InputError naming the path and the cause."""
    try:
        atomic_write(path, lambda fh: fh.write(data))
    except InputError as exc:
        raise InputError(f"{exc.message}; the previous file there, if any, is intact", field="--out") from None


def save_checkpoint(state: dict[str, Any], folder: str | os.PathLike) -> Path:
    """Write ``state`` to ``folder/checkpoint.pt`` (module docstring)."""
    path = Path(folder) / CHECKPOINT_NAME
    write_atomic(path, encode(state))
    return path


MAX_CHECKPOINT_BYTES = 8 * 2**30
"""The largest checkpoint read (bytes): a larger file is refused before it is read (issue 67 C6)."""


def load_checkpoint(folder: str | os.PathLike, validate: bool = True) -> dict[str, Any]:
    """The state in ``folder/checkpoint.pt``, checked as a run's state (``validate``; off only for the
    container round trip of tests); at most :data:`MAX_CHECKPOINT_BYTES`."""
    path = Path(folder) / CHECKPOINT_NAME
    if not path.is_file():
        raise InputError(f"no checkpoint at {str(path)!r}; the run must have been started with --checkpoint-every",
                         field="--resume")
    try:
        size = path.stat().st_size
        if size > MAX_CHECKPOINT_BYTES:
            raise InputError(f"{str(path)!r} holds {size:,} bytes, more than the {MAX_CHECKPOINT_BYTES:,} a checkpoint "
                             "may hold; start again with --overwrite", field="--resume")
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {str(path)!r}: {exc.strerror or exc}", field="--resume") from None
    state = decode(data, repr(str(path)))
    if validate:
        from trainers.run.checkpoint_schema import check_state

        check_state(state, repr(str(path)))
    return state


def file_digest(path: str | os.PathLike | None) -> str | None:
    """SHA-256 of an input file's bytes (None for no file): a resumed run refuses changed inputs."""
    if path is None:
        return None
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as exc:
        raise InputError(f"cannot read {str(path)!r}: {exc.strerror or exc}", field=str(path)) from None
