"""The frame format between ranks: a JSON header plus raw tensor bytes, authenticated, never unpickled.

A frame is, in order (docs/distributed.md, "The wire")::

    MAGIC (4 bytes "APW1") | header length n (4 bytes, big-endian) | header (n bytes, UTF-8 JSON)
    | tensor bytes (concatenated) | tag (32 bytes, HMAC-SHA256 over everything before it)

The header holds the sender, the receiver and a sequence number per (sender, receiver) pair (a
replayed or re-ordered frame is refused), the sender's session and the receiver's as the sender knows it
(``ses``, ``to``: random per process, so a frame of another run or of an earlier process of either rank is
refused, :class:`~trainers.distributed.transport.FrameChannel`), the value (a tree of JSON values, lists, tuples, sets,
dicts with int/str/tuple keys, tensors, numpy arrays and the message dataclasses of
:mod:`trainers.roles.messages`, :mod:`trainers.roles.protocol` and :mod:`trainers.distributed.control`) and one
entry per tensor: its dtype (a fixed list), shape and byte range. Decoding builds only those types,
by name from :data:`MESSAGE_TYPES`: nothing in a frame names a module or a function to call, so a
crafted frame cannot run code. A frame that does not parse, names an unknown tag or dtype, has byte
ranges outside the frame or that do not tile the rest of it, carries a tensor its value does not refer to, is longer
than :data:`MAX_FRAME_BYTES`, or whose tag does not match the run's secret is refused with :class:`WireError`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import hmac
import json
import math
import re
import struct
import types
import typing
from typing import Any

import numpy as np
import torch

from adaptplan.fileio import is_int, is_number, show
from adaptplan.limits import MAX_DEVICES
from trainers.distributed.control import RANK_MESSAGES
from trainers.roles.defences import ActivationDefence
from trainers.roles.messages import Activation, BlockState, CutGradient, HeadForward, HeadGradient, ModelDownload, ModelUpload
from trainers.roles.optim import OptimizerSpec
from trainers.roles.protocol import CONTROL_MESSAGES

MAGIC = b"APW1"
TAG_BYTES = 32
MAX_FRAME_BYTES = 1 << 31
"""The largest frame a rank takes in (bytes, 2 GiB): larger ones are refused before they are read."""
MAX_HEADER_BYTES = 1 << 26
"""The largest header (bytes, 64 MiB of JSON)."""
MAX_TENSORS = 1 << 16
"""The most tensors a frame may carry (a VGG-16 model upload with its optimizer state carries under 100)."""
MAX_DIMS = 16
"""The most dimensions a tensor of a frame may have."""
MAX_RANK = MAX_DEVICES + 2
"""Ranks of a run are 0..MAX_RANK − 1 (the edge server, the fed server and a rank per device at most)."""
MAX_SEQ = 1 << 63
"""Sequence numbers are 0..2⁶³ − 1."""

DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8,
    "bool": torch.bool}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}

MESSAGE_TYPES: dict[str, type] = {t.__name__: t for t in (Activation, CutGradient, HeadForward, HeadGradient, BlockState, ModelUpload,
                                                          ModelDownload, OptimizerSpec, ActivationDefence, *CONTROL_MESSAGES,
                                                          *RANK_MESSAGES)}
"""The dataclasses a frame may carry, by name (the roles' messages, the control messages, a rank's
own); their fields are decoded like any other value."""


class WireError(ValueError):
    """A frame that is not a well-formed, authenticated frame of this run (the message says why)."""


@dataclasses.dataclass(frozen=True)
class Frame:
    """A decoded frame: who sent it to whom, its sequence number on that pair, its value, the
    (dtype, shape) of every tensor it carried (what ``ADAPTPLAN_WIRE_TRACE`` records), the sender's session
    ``ses`` and the receiver's session ``to`` it was sent to ("" where the sender knew none)."""

    src: int
    dst: int
    seq: int
    value: Any
    tensors: tuple[tuple[str, tuple[int, ...]], ...] = ()
    ses: str = ""
    to: str = ""


# ---- encoding -------------------------------------------------------------------------------------------
class _Encoder:
    def __init__(self) -> None:
        self.tensors: list[list[Any]] = []
        self.chunks: list[bytes] = []
        self.offset = 0

    def _add_tensor(self, t: torch.Tensor) -> None:
        if t.dtype not in DTYPE_NAMES:
            raise WireError(f"a tensor of dtype {t.dtype} cannot be sent (one of {', '.join(DTYPES)})")
        flat = t.detach().to("cpu").contiguous().reshape(-1)
        raw = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
        self.tensors.append([DTYPE_NAMES[t.dtype], list(t.shape), self.offset, len(raw)])
        self.chunks.append(raw)
        self.offset += len(raw)

    def value(self, v: Any) -> Any:
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, (int, np.integer)):
            return int(v)
        if isinstance(v, (float, np.floating)):
            f = float(v)
            return f if math.isfinite(f) else {"F": repr(f)}
        if isinstance(v, torch.Tensor):
            self._add_tensor(v)
            return {"X": len(self.tensors) - 1}
        if isinstance(v, np.ndarray):
            self._add_tensor(torch.from_numpy(np.ascontiguousarray(v)))
            return {"N": len(self.tensors) - 1}
        if isinstance(v, list):
            return [self.value(x) for x in v]
        if isinstance(v, tuple):
            return {"T": [self.value(x) for x in v]}
        if isinstance(v, (set, frozenset)):
            return {"S": [self.value(x) for x in sorted(v)]}
        if isinstance(v, dict):
            return {"D": [[self.value(k), self.value(x)] for k, x in v.items()]}
        name = type(v).__name__
        if dataclasses.is_dataclass(v) and MESSAGE_TYPES.get(name) is type(v):
            return {"M": name, "f": {f.name: self.value(getattr(v, f.name)) for f in dataclasses.fields(v)}}
        raise WireError(f"a {name} cannot be sent between ranks (tensors, numbers, strings, lists, dicts "
                        "and the messages of trainers.roles.messages can)")


MAX_SESSION_CHARS = 64
"""The longest session name a header may hold (a process's session is 16 hex digits)."""
SESSION_NAME = re.compile(rf"[A-Za-z0-9_-]{{0,{MAX_SESSION_CHARS}}}")
"""A session as a header may name it."""
HEADER_KEYS = {"src", "dst", "seq", "ses", "to", "v", "t"}
"""Everything a header holds: sender, receiver, sequence number, the two sessions, the value and the tensor table."""


def encode(value: Any, src: int, dst: int, seq: int, key: bytes, ses: str = "", to: str = "") -> bytes:
    """The frame of ``value`` from rank ``src`` (session ``ses``) to rank ``dst`` (session ``to``), ``seq``-th on
    that pair, tagged with ``key``."""
    enc = _Encoder()
    tree = enc.value(value)
    header = json.dumps({"src": src, "dst": dst, "seq": seq, "ses": ses, "to": to, "v": tree, "t": enc.tensors},
                        separators=(",", ":")).encode()
    body = b"".join([MAGIC, struct.pack(">I", len(header)), header, *enc.chunks])
    return body + hmac.new(key, body, hashlib.sha256).digest()


# ---- decoding -------------------------------------------------------------------------------------------
class _Decoder:
    def __init__(self, specs: Any, data: memoryview) -> None:
        if not isinstance(specs, list):
            raise WireError("its tensor table is not a list")
        if len(specs) > MAX_TENSORS:
            raise WireError(f"it lists {len(specs):,} tensors, more than the {MAX_TENSORS:,} a frame may carry")
        self.data = data
        self.specs = [self._checked(i, spec) for i, spec in enumerate(specs)]
        self.used: set[int] = set()
        end = 0                              # the tensors' bytes, one after another, are the rest of the frame
        for _, _, offset, length in sorted(self.specs, key=lambda spec: (spec[2], spec[3])):
            if offset != end:
                raise WireError("its tensors' byte ranges overlap or leave a gap")
            end += length
        if end != len(data):
            raise WireError(f"it carries {len(data) - end:,} bytes beyond its tensors")

    def _checked(self, index: int, spec: Any) -> tuple[str, tuple[int, ...], int, int]:
        """A tensor entry [dtype, shape, offset, length] whose byte range lies in the frame."""
        if not (isinstance(spec, list) and len(spec) == 4):
            raise WireError(f"its tensor {index} is not described as [dtype, shape, offset, length]")
        name, shape, offset, length = spec
        if not isinstance(name, str) or name not in DTYPES:
            raise WireError(f"its tensor {index} has dtype {str(name)[:40]!r}, not one of {', '.join(DTYPES)}")
        if not (isinstance(shape, list) and len(shape) <= MAX_DIMS
                and all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= MAX_FRAME_BYTES for s in shape)):
            raise WireError(f"its tensor {index} has the shape {str(shape)[:60]}, not a list of sizes")
        itemsize = DTYPES[name].itemsize      # not an empty tensor per entry: 10⁶ entries cost seconds that way
        if not (isinstance(offset, int) and isinstance(length, int)) or isinstance(offset, bool) \
                or isinstance(length, bool) or length != math.prod(shape) * itemsize \
                or offset < 0 or offset + length > len(self.data):
            raise WireError(f"its tensor {index} ({name} {shape}) does not fit its byte range")
        return name, tuple(shape), offset, length

    def tensor(self, index: Any) -> torch.Tensor:
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(self.specs):
            raise WireError(f"it refers to tensor {index!r}, not in its table")
        if index in self.used:          # each tensor once: a 1 MB tensor referenced 2,000 times made 2 GB
            raise WireError(f"it refers to tensor {index} twice")
        self.used.add(index)
        name, shape, offset, length = self.specs[index]
        dtype = DTYPES[name]
        if not length:
            return torch.empty(shape, dtype=dtype)
        raw = bytearray(self.data[offset:offset + length])
        if dtype is torch.bool and np.frombuffer(raw, dtype=np.uint8).max() > 1:
            raise WireError(f"its tensor {index} is bool but holds bytes other than 0 and 1")
        return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape)

    def value(self, v: Any) -> Any:
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:                  # a lone surrogate (JSON's \ud800)
                raise WireError("it holds text that is not UTF-8") from None
            return v
        if v is None or isinstance(v, (bool, int, float)):
            return v
        if isinstance(v, list):
            return [self.value(x) for x in v]
        if not isinstance(v, dict) or len(v) not in (1, 2):
            raise WireError(f"it holds a value of an unknown form ({str(v)[:60]})")
        (tag, body), = list(v.items())[:1]
        if tag == "X" and len(v) == 1:
            return self.tensor(body)
        if tag == "N" and len(v) == 1:
            return self.tensor(body).numpy()
        if tag == "F" and len(v) == 1 and body in ("nan", "inf", "-inf"):
            return float(body)
        if tag in ("T", "S") and len(v) == 1 and isinstance(body, list):
            items = [self.value(x) for x in body]
            if tag == "T":
                return tuple(items)
            if not all(_hashable(x) for x in items):
                raise WireError("it holds a set of lists, dicts, sets or tensors")
            return set(items)
        if tag == "D" and len(v) == 1 and isinstance(body, list):
            if not all(isinstance(p, list) and len(p) == 2 for p in body):
                raise WireError("it holds a dict whose entries are not [key, value] pairs")
            out = {}
            for k, x in body:
                key = self.value(k)
                if not isinstance(key, (int, str, tuple)) or not _hashable(key):
                    raise WireError(f"it holds a dict keyed by a {type(key).__name__} (or a tuple of such)")
                out[key] = self.value(x)
            return out
        if tag == "M" and len(v) == 2 and isinstance(v.get("f"), dict):
            cls = MESSAGE_TYPES.get(body) if isinstance(body, str) else None
            if cls is None:
                raise WireError(f"it names the message type {str(body)[:40]!r}, not one of {', '.join(MESSAGE_TYPES)}")
            names = {f.name for f in dataclasses.fields(cls)}
            if not set(v["f"]) <= names:
                raise WireError(f"its {body} has fields {sorted(set(v['f']) - names)} it does not know")
            try:
                message = cls(**{k: self.value(x) for k, x in v["f"].items()})
            except TypeError as exc:
                raise WireError(f"its {body} is incomplete ({exc})") from None
            for name, hint in _field_types(cls).items():
                value = getattr(message, name)
                if not conforms(value, hint):
                    raise WireError(f"its {body}.{name} is not a {_hint_name(hint)} (got {type(value).__name__})")
                if hint in (int, int | None) and value is not None and not -MAX_SEQ <= value < MAX_SEQ:
                    raise WireError(f"its {body}.{name} is {show(value)}, not a 64-bit integer")
            return message
        raise WireError(f"it holds a value tagged {str(tag)[:20]!r}, not a known form")


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    """The declared type of each field of the message dataclass ``cls``."""
    return typing.get_type_hints(cls)


def _hint_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def conforms(value: Any, hint: Any) -> bool:
    """Whether a decoded ``value`` is of the declared type ``hint`` of a message field: ``int`` an integer (not a
    bool), ``float`` any real number (an integer too), ``bool``/``str``/tensor/dataclass by class, ``X | None``,
    ``list[X]``, ``set[X]``, ``dict[K, V]``, ``tuple`` and ``tuple[X, ...]``/``tuple[X, Y]`` element by element;
    ``Any`` anything."""
    if hint is Any:
        return True
    if hint is None or hint is type(None):
        return value is None
    if hint is int:
        return is_int(value)
    if hint is float:
        return is_number(value)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(conforms(value, a) for a in args)
    if origin is None:
        return isinstance(value, hint)
    if not isinstance(value, origin):
        return False
    if origin in (list, set) and args:
        return all(conforms(x, args[0]) for x in value)
    if origin is dict and args:
        return all(conforms(k, args[0]) and conforms(x, args[1]) for k, x in value.items())
    if origin is tuple and args:
        if len(args) == 2 and args[1] is Ellipsis:
            return all(conforms(x, args[0]) for x in value)
        return len(value) == len(args) and all(conforms(x, a) for x, a in zip(value, args))
    return True


def _hashable(value: Any) -> bool:
    """A set member or dict key the decoder may build: JSON scalars and tuples of them (never a list, dict, set or
    tensor, which would raise TypeError)."""
    if isinstance(value, tuple):
        return all(_hashable(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))


def decode(frame: bytes | bytearray | memoryview, key: bytes) -> Frame:
    """The :class:`Frame` in ``frame`` after checking its tag with ``key``; :class:`WireError` otherwise."""
    data = memoryview(frame)
    if len(data) > MAX_FRAME_BYTES:
        raise WireError(f"it is {len(data)} bytes, more than the {MAX_FRAME_BYTES} a frame may have")
    if len(data) < len(MAGIC) + 4 + TAG_BYTES or bytes(data[:4]) != MAGIC:
        raise WireError("it is not an adaptplan frame (no APW1 header)")
    body, tag = data[:-TAG_BYTES], bytes(data[-TAG_BYTES:])
    if not hmac.compare_digest(hmac.new(key, body, hashlib.sha256).digest(), tag):
        raise WireError("its authentication tag is wrong (another run's secret, or altered on the way)")
    (n,) = struct.unpack(">I", bytes(body[4:8]))
    if n > MAX_HEADER_BYTES or 8 + n > len(body):
        raise WireError(f"its header length {n} does not fit the frame")
    try:
        header = json.loads(bytes(body[8:8 + n]).decode())
    except (ValueError, RecursionError):    # not UTF-8, not JSON, or an integer of more digits than Python converts
        raise WireError("its header is not JSON (or holds a number too long to read)") from None
    if not isinstance(header, dict) or not all(is_int(header.get(k)) and 0 <= header[k] < limit
                                               for k, limit in (("src", MAX_RANK), ("dst", MAX_RANK), ("seq", MAX_SEQ))):
        raise WireError(f"its header lacks the sender or receiver (ranks in 0..{MAX_RANK - 1}) or the sequence number "
                        f"(an integer in 0..2^63 − 1)")
    if not set(header) <= HEADER_KEYS:
        raise WireError(f"its header has the keys {sorted(map(str, set(header) - HEADER_KEYS))[:5]} it does not know")
    sessions = [header.get(k, "") for k in ("ses", "to")]
    if not all(isinstance(v, str) and SESSION_NAME.fullmatch(v) for v in sessions):
        raise WireError(f"its sessions are not names of at most {MAX_SESSION_CHARS} letters, digits, - or _")
    decoder = _Decoder(header.get("t"), body[8 + n:])
    try:
        value = decoder.value(header.get("v"))
    except RecursionError:
        raise WireError("its value is nested too deeply") from None
    if len(decoder.used) != len(decoder.specs):
        raise WireError(f"it carries {len(decoder.specs) - len(decoder.used)} tensor(s) its value does not refer to")
    return Frame(header["src"], header["dst"], header["seq"], value,
                 tuple((name, shape) for name, shape, _, _ in decoder.specs), *sessions)
