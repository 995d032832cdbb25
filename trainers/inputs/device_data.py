"""Per-device data folders: each device's training samples in a file of its own, for deployments where
a device's data never leaves it (``--device-data DIR``; docs/distributed.md "Data on the devices").

A folder holds::

    manifest.json    what every role may know: the data set's name, classes, input shape, the test
                     file and its SHA-256, and per device its file, sample count, label counts and SHA-256
    device-<i>.npz   device i's training samples: x float32 (n, *input_shape), normalised as the model
                     takes them; y int64 (n,) class indices
    test.npz         the servers' test set, x and y as above

Who needs which file: the simulator all of them; in a distributed run rank 0 (edge server, which
evaluates) the manifest and ``test.npz``, and a device rank the manifest and its own devices' files.
``adaptplan split-data`` writes a folder from a built-in data set and a partition rule (the same
partition ``adaptplan train`` would draw, so a run on the folder equals a run on the data set).

Device i's samples are rows ``offset_i .. offset_i + n_i − 1`` of the data set the engine sees
(offsets cumulative in device order); a device rank holds only its own rows and maps rank 0's
positions to them (:meth:`DeviceManifest.local_positions`). Every file read is checked (a regular file of at
most :data:`MAX_FILE_BYTES`, exactly the arrays x and y within that bound decompressed, dtypes, shapes, labels, the
manifest's counts and hash): a mismatch is an :class:`InputError` naming the file and ``--device-data``, never a
traceback; nothing is unpickled.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from adaptplan.errors import InputError
from adaptplan.fileio import atomic_write, is_int, nesting_depth, parse_text

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from trainers.inputs.datasets import Dataset

FIELD = "--device-data"
MANIFEST = "manifest.json"
TEST_FILE = "test.npz"
FORMAT = "adaptplan-device-data"
VERSION = 1
MANIFEST_KEYS = ("format", "version", "name", "num_classes", "input_shape", "test", "test_sha256", "devices")
MAX_FILE_BYTES = 8 * 2**30
"""The largest file of a folder read (and the most its arrays may take decompressed): 8 GiB. A name that leads to
no regular file (a device such as /dev/zero, a pipe) or to a larger one is refused before it is read."""
MAX_MANIFEST_BYTES = 64 * 2**20
ENTRY_KEYS = ("file", "samples", "label_counts", "sha256")


def device_file(i: int) -> str:
    """The file name of device ``i``'s samples."""
    return f"device-{i}.npz"


@dataclass(frozen=True)
class DeviceEntry:
    """One device's line of the manifest: its file, sample count, label counts (per class) and the
    file's SHA-256 (hex)."""

    file: str
    samples: int
    label_counts: tuple[int, ...]
    sha256: str


@dataclass(frozen=True)
class DeviceManifest:
    """A folder's ``manifest.json`` (module docstring); ``digest`` is the SHA-256 of the file itself,
    which rank 0 sends the device ranks so that every rank reads the same partition."""

    folder: Path
    name: str
    num_classes: int
    input_shape: tuple[int, ...]
    devices: tuple[DeviceEntry, ...]
    digest: str
    test_sha256: str | None = None      # absent from manifests written before it: test.npz then unchecked

    @property
    def offsets(self) -> list[int]:
        """Row of each device's first sample in the engine's data set (cumulative sample counts)."""
        return [int(x) for x in np.concatenate([[0], np.cumsum([e.samples for e in self.devices])[:-1]])]

    @property
    def total(self) -> int:
        return sum(e.samples for e in self.devices)

    def parts(self) -> list[np.ndarray]:
        """Device i's rows, offset_i .. offset_i + n_i − 1 (the partition the folder fixes)."""
        return [np.arange(o, o + e.samples, dtype=np.int64) for o, e in zip(self.offsets, self.devices)]

    def local_positions(self, device: int, positions: np.ndarray) -> np.ndarray:
        """Rank 0's positions of ``device``'s samples as rows of its own file; InputError when they
        lie outside it (rank 0 and this rank read different manifests)."""
        local = np.asarray(positions, dtype=np.int64) - self.offsets[device]
        if local.size and (local.min() < 0 or local.max() >= self.devices[device].samples):
            raise InputError(f"rank 0's positions of device {device} lie outside its {self.devices[device].samples} "
                             f"samples in {self.devices[device].file}", field=FIELD)
        return local

    def load_device(self, device: int) -> tuple["torch.Tensor", "torch.Tensor"]:
        """Device ``device``'s (x, y), checked against this manifest (hash, count, shape, labels)."""
        import torch

        if not 0 <= device < len(self.devices):
            raise InputError(f"device {device} is not in {self.folder / MANIFEST} ({len(self.devices)} devices)", field=FIELD)
        entry = self.devices[device]
        path = self.folder / entry.file
        most = sum(_array_bytes(entry.samples, self.input_shape).values()) + ZIP_OVERHEAD_BYTES
        raw = _read(path, min(most, MAX_FILE_BYTES), f"its {entry.samples:,} samples in {MANIFEST} can take")
        if hashlib.sha256(raw).hexdigest() != entry.sha256:
            raise InputError(f"{str(path)!r} is not the file {MANIFEST} names (its SHA-256 differs)", field=FIELD)
        x, y = _arrays(path, raw, self.input_shape, self.num_classes, entry.samples)
        counts = tuple(int(c) for c in np.bincount(y, minlength=self.num_classes))
        if x.shape[0] != entry.samples or counts != entry.label_counts:
            raise InputError(f"{str(path)!r} holds {x.shape[0]} samples with label counts {list(counts)}, {MANIFEST} "
                             f"says {entry.samples} with {list(entry.label_counts)}", field=FIELD)
        return torch.from_numpy(x), torch.from_numpy(y)

    def load_test(self) -> tuple["torch.Tensor", "torch.Tensor"]:
        import torch

        path = self.folder / TEST_FILE
        raw = _read(path)
        if self.test_sha256 is not None and hashlib.sha256(raw).hexdigest() != self.test_sha256:
            raise InputError(f"{str(path)!r} is not the file {MANIFEST} names (its SHA-256 differs)", field=FIELD)
        x, y = _arrays(path, raw, self.input_shape, self.num_classes)
        if not len(y):               # an empty test set: the accuracy would divide by zero
            raise InputError(f"{str(path)!r} holds no test samples", field=FIELD)
        return torch.from_numpy(x), torch.from_numpy(y)

    def dataset(self, with_samples: bool) -> "Dataset":
        """The engine's data set: every device's rows in device order and the test set. Without
        samples (rank 0 of a distributed run) the training rows are one zero sample broadcast to
        every row (no memory) and the labels follow the manifest's counts — rank 0 needs only the
        input shape, the partition sizes and the label counts."""
        import torch

        from trainers.inputs.datasets import Dataset

        x_test, y_test = self.load_test()
        if with_samples:
            loaded = [self.load_device(i) for i in range(len(self.devices))]
            x_train = torch.cat([x for x, _ in loaded])
            y_train = torch.cat([y for _, y in loaded])
        else:
            x_train = torch.zeros((1, *self.input_shape)).expand(self.total, *self.input_shape)
            y_train = torch.from_numpy(np.concatenate(
                [np.repeat(np.arange(self.num_classes), e.label_counts) for e in self.devices]).astype(np.int64))
        return Dataset(x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test, num_classes=self.num_classes,
                       input_shape=self.input_shape, name=self.name)


MAX_MANIFEST_DEPTH = 8
"""A manifest is an object of lists of objects: deeper nesting is refused (a 100,000-deep array raised
RecursionError)."""
MAX_CLASSES = 1_000_000


def _count(value: object, key: str) -> int:
    """An integer (not a bool, a text or a fraction) of magnitude at most 10⁹ (ValueError naming ``key``); its range
    is checked with the rest of the manifest."""
    if not is_int(value) or abs(value) > 10 ** 9:
        raise ValueError(f"{key} must hold integers, got {str(value)[:40]}")
    return value


def _text(value: object, key: str, limit: int = 200) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise ValueError(f"{key} must be a text of at most {limit} characters")
    return value


def read_manifest(folder: str | Path) -> DeviceManifest:
    """The folder's manifest, checked; InputError naming the file and what is wrong."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise InputError(f"{str(root)!r} is not a directory", field=FIELD)
    path = root / MANIFEST
    raw = _read(path, MAX_MANIFEST_BYTES)
    try:
        doc = parse_text(raw.decode("utf-8"), toml=False)       # a key given twice is refused
        if nesting_depth(doc) > MAX_MANIFEST_DEPTH:
            raise ValueError(f"nested more than {MAX_MANIFEST_DEPTH} levels deep")
        if doc.get("format") != FORMAT or doc.get("version") != VERSION or isinstance(doc.get("version"), bool):
            raise ValueError(f"not an {FORMAT} version {VERSION} manifest")
        for keys, allowed in [(doc, MANIFEST_KEYS), *((e, ENTRY_KEYS) for e in doc["devices"])]:
            unknown = sorted(set(keys) - set(allowed))
            if unknown:
                raise ValueError(f"unknown key {unknown[0]!r}; allowed: {', '.join(allowed)}")
        num_classes = _count(doc["num_classes"], "num_classes")
        shape = tuple(_count(s, "input_shape") for s in doc["input_shape"])
        entries = tuple(DeviceEntry(_text(e["file"], "file"), _count(e["samples"], "samples"),
                                    tuple(_count(c, "label_counts") for c in e["label_counts"]),
                                    _text(e["sha256"], "sha256")) for e in doc["devices"])
        name = _text(doc["name"], "name")
        if doc.get("test", TEST_FILE) != TEST_FILE:
            raise ValueError(f"test must be {TEST_FILE!r}")
        test_sha256 = doc.get("test_sha256")
        if test_sha256 is not None and not (isinstance(test_sha256, str) and len(test_sha256) == 64):
            raise ValueError("test_sha256 must be 64 hexadecimal digits")
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise InputError(f"{str(path)!r} is not a device-data manifest ({type(exc).__name__}: {exc})", field=FIELD) from None
    if num_classes < 2 or num_classes > MAX_CLASSES or not shape or min(shape) < 1 or not entries:
        raise InputError(f"{str(path)!r}: needs ≥ 2 classes, an input shape and ≥ 1 device", field=FIELD)
    for i, e in enumerate(entries):
        if e.file != device_file(i) or e.samples < 1 or len(e.label_counts) != num_classes \
                or sum(e.label_counts) != e.samples or min(e.label_counts) < 0:
            raise InputError(f"{str(path)!r}: device {i}'s entry is inconsistent (file {e.file!r}, {e.samples} samples, "
                             f"label counts {list(e.label_counts)} over {num_classes} classes)", field=FIELD)
    return DeviceManifest(root, name, num_classes, shape, entries, hashlib.sha256(raw).hexdigest(), test_sha256)


def write_device_folder(dataset: "Dataset", parts: Sequence[np.ndarray], out: str | Path) -> DeviceManifest:
    """Write ``dataset`` split by ``parts`` (device i's sample indices, in order) as a per-device
    folder at ``out``; returns its manifest. Files are written atomically, the manifest last."""
    root = Path(out).expanduser()          # made with its parents by the first atomic_write
    x_train, y_train = dataset.x_train.numpy(), dataset.y_train.numpy()
    entries = []
    for i, part in enumerate(parts):
        idx = np.asarray(part, dtype=np.int64)
        y = y_train[idx].astype(np.int64)
        raw = _npz_bytes(np.ascontiguousarray(x_train[idx], dtype=np.float32), y)
        _write_bytes(root / device_file(i), raw)
        entries.append({"file": device_file(i), "samples": int(idx.size),
                        "label_counts": [int(c) for c in np.bincount(y, minlength=dataset.num_classes)],
                        "sha256": hashlib.sha256(raw).hexdigest()})
    test = _npz_bytes(dataset.x_test.numpy().astype(np.float32), dataset.y_test.numpy().astype(np.int64))
    _write_bytes(root / TEST_FILE, test)
    doc = {"format": FORMAT, "version": VERSION, "name": dataset.name, "num_classes": int(dataset.num_classes),
           "input_shape": [int(s) for s in dataset.input_shape], "test": TEST_FILE,
           "test_sha256": hashlib.sha256(test).hexdigest(), "devices": entries}
    head = json.dumps({k: v for k, v in doc.items() if k != "devices"}, indent=1)[:-2]   # one line per device
    text = head + ',\n "devices": [\n' + ",\n".join(f"  {json.dumps(e)}" for e in entries) + "\n ]\n}\n"
    _write_bytes(root / MANIFEST, text.encode())
    return read_manifest(root)


def _write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda f: f.write(data))


def _npz_bytes(x: np.ndarray, y: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, x=x, y=y)
    return buffer.getvalue()


def _read(path: Path, limit: int | None = None, what: str = "a file of a device-data folder may hold") -> bytes:
    """The bytes of the regular file ``path`` (a link is followed), at most ``limit`` of them (default
    :data:`MAX_FILE_BYTES`; ``what`` says where the limit comes from); anything else is refused before it is read.
    The read is sized to the file, never to the limit (an 8 GiB buffer is more than a small device's address
    space: issue 67 D6)."""
    limit = MAX_FILE_BYTES if limit is None else limit
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))   # a named pipe must not block the open
        with os.fdopen(fd, "rb") as fh:
            info = os.fstat(fh.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise InputError(f"{str(path)!r} is not a regular file", field=FIELD)
            if info.st_size > limit:
                raise InputError(f"{str(path)!r} holds {info.st_size:,} bytes, more than the {limit:,} {what}",
                                 field=FIELD)
            raw = fh.read(info.st_size + 1)
    except FileNotFoundError:
        raise InputError(f"{str(path)!r} not found", field=FIELD) from None
    except OSError as exc:
        raise InputError(f"{str(path)!r} cannot be read ({exc.strerror or exc})", field=FIELD) from None
    if len(raw) > info.st_size:
        raise InputError(f"{str(path)!r} grew beyond its {info.st_size:,} bytes while it was read", field=FIELD)
    return raw


ZIP_OVERHEAD_BYTES = 4096
"""A two-member ``.npz``'s bytes beyond its members': local headers, the central directory, zip64 records."""


def _array_bytes(samples: int, shape: tuple[int, ...]) -> dict[str, int]:
    """The most bytes each member of a file of ``samples`` samples of ``shape`` may hold: x float32, y int64 (8
    bytes a label, the widest integer), each with its ``.npy`` header (:data:`MAX_NPY_HEADER_BYTES`)."""
    return {"x": samples * int(np.prod(shape, dtype=np.int64)) * 4 + MAX_NPY_HEADER_BYTES,
            "y": samples * 8 + MAX_NPY_HEADER_BYTES}


def _members(path: Path, raw: bytes, most: dict[str, int] | None = None) -> dict[str, int]:
    """The archive holds exactly x.npy and y.npy, together at most :data:`MAX_FILE_BYTES` decompressed and each at
    most ``most[name]`` bytes where given (read from its directory, nothing decompressed: a member that is itself a
    zip bomb is refused by its claimed size, issue 67 D2): each member's claimed decompressed size, by array name."""
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as archive:
            infos = archive.infolist()
    except (zipfile.BadZipFile, ValueError, EOFError) as exc:
        raise InputError(f"{str(path)!r} is not a readable .npz file ({type(exc).__name__})", field=FIELD) from None
    names = sorted(i.filename for i in infos)
    if names != ["x.npy", "y.npy"]:
        raise InputError(f"{str(path)!r} must hold exactly the arrays 'x' and 'y' (has "
                         f"{[n.removesuffix('.npy') for n in names][:10]})", field=FIELD)
    if sum(i.file_size for i in infos) > MAX_FILE_BYTES:
        raise InputError(f"{str(path)!r}: its arrays take more than {MAX_FILE_BYTES:,} bytes decompressed", field=FIELD)
    claimed = {i.filename.removesuffix(".npy"): i.file_size for i in infos}
    for name, size in claimed.items():
        if most is not None and size > most[name]:
            raise InputError(f"{str(path)!r}: {name}.npy claims {size:,} bytes decompressed, more than the "
                             f"{most[name]:,} its samples in {MANIFEST} can take", field=FIELD)
    return claimed


MAX_NPY_HEADER_BYTES = 2**16 + 16
"""A ``.npy`` member's bytes beyond its array's: the format's magic, version and header (version 1.0, which
``numpy.save`` writes for any array of this format's shapes)."""


def _arrays(path: Path, raw: bytes, shape: tuple[int, ...], num_classes: int,
            samples: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """x float32 (n, *shape) and y int64 (n,) with labels in 0..num_classes−1, from a ``.npz``'s bytes; with
    ``samples`` (the manifest's count) no member is decompressed beyond what that many samples take."""
    claimed = _members(path, raw, None if samples is None else _array_bytes(samples, shape))
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as archive:
            x, y = archive["x"], archive["y"]
    except Exception as exc:  # BadZipFile, ValueError (a pickled object), EOFError ...
        raise InputError(f"{str(path)!r} is not a readable .npz file ({type(exc).__name__})", field=FIELD) from None
    for name, array in (("x", x), ("y", y)):
        if not 0 <= claimed[name] - array.nbytes <= MAX_NPY_HEADER_BYTES:
            raise InputError(f"{str(path)!r}: its zip directory claims {claimed[name]:,} bytes for {name}.npy, whose "
                             f"array holds {array.nbytes:,}", field=FIELD)
    if x.dtype != np.float32 or tuple(x.shape[1:]) != shape or y.dtype.kind not in "iu" or y.shape != x.shape[:1]:
        raise InputError(f"{str(path)!r}: x is {x.dtype}{list(x.shape)} and y {y.dtype}{list(y.shape)}, expected "
                         f"float32[n, {', '.join(map(str, shape))}] and integer[n]", field=FIELD)
    if y.size and not 0 <= int(y.min()) <= int(y.max()) < num_classes:
        raise InputError(f"{str(path)!r}: labels span {int(y.min())}..{int(y.max())}, outside 0..{num_classes - 1}",
                         field=FIELD)
    if not np.isfinite(x).all():
        raise InputError(f"{str(path)!r}: x holds NaN or infinite values", field=FIELD)
    return x, y.astype(np.int64)
