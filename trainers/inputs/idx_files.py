"""The idx files of MNIST-style data sets (LeCun's format, as Debian's ``dataset-fashion-mnist`` ships them,
gzip-compressed): a 4-byte magic (0, 0, type 0x08 = unsigned byte, the number of dimensions d), d big-endian
32-bit sizes, then the values in C order. Read whole, checked, never more than :data:`MAX_IDX_BYTES`."""

from __future__ import annotations

import gzip
import math
import zlib
from pathlib import Path

import numpy as np

from adaptplan.errors import InputError

MAX_IDX_BYTES = 2**30
"""The most an idx file may hold decompressed (1 GiB: Fashion-MNIST's training images are 47 MB)."""
UNSIGNED_BYTE = 0x08


def read_idx(path: Path, dims: int, field: str = "--data-root") -> np.ndarray:
    """The uint8 array of ``dims`` dimensions in idx file ``path`` (gzip-compressed when its name ends in .gz);
    an :class:`InputError` naming the file and ``field`` when it cannot be read or is not such a file."""
    try:
        with (gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")) as f:
            data = f.read(MAX_IDX_BYTES + 1)
    except (OSError, EOFError, zlib.error) as exc:      # gzip.BadGzipFile is an OSError
        raise InputError(f"{str(path)!r} could not be read ({exc})", field=field) from None
    if len(data) > MAX_IDX_BYTES:
        raise InputError(f"{str(path)!r} holds more than {MAX_IDX_BYTES:,} bytes decompressed", field=field)
    header = 4 + 4 * dims
    if len(data) < header or data[:3] != bytes((0, 0, UNSIGNED_BYTE)) or data[3] != dims:
        raise InputError(f"{str(path)!r} is not an idx file of unsigned bytes with {dims} dimension(s)", field=field)
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims))
    values = np.frombuffer(data, dtype=np.uint8, offset=header)
    if values.size != math.prod(shape):
        raise InputError(f"{str(path)!r} holds {values.size:,} values where its header says {shape}", field=field)
    return values.reshape(shape).copy()           # writable: torch.from_numpy warns on a read-only buffer
