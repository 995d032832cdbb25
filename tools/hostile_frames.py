#!/usr/bin/env python3
"""Hostile frames (issue 67 item 5): a frame of every message a device rank sends (an activation, a model upload,
its blocks, its set-up reply, its report of measured seconds, an error), written by a device that holds the run's
secret (every edited frame is signed again with it), edited at every key path of its JSON header — sender, receiver,
sequence number, sessions, the value tree and the tensor table — by each hostile value or deleted, and whole
(truncated, extended, a header length that lies, a tensor's bytes cut); then decoded as a rank decodes it
(:func:`trainers.distributed.wire.decode`) and, when it decodes, checked as rank 0 checks that message before using
it (:mod:`trainers.roles.checks`, :mod:`trainers.distributed.rank_checks`).

Each case ends as: clean (WireError or BadMessageError: the frame or the message refused, naming why), accepted
(it decodes to a message its role may send), or internal (any other exception). The channel's own checks (that
``src`` is the connection's peer, ``seq`` the next number, the sessions the live ones) come after decoding and are
tested in tests/trainers/distributed/test_distributed_runtime.py; ``--accepted`` lists the accepted edits (an
edit of ``seq``, ``src`` or a session is accepted here and refused there).

    python tools/hostile_frames.py [--accepted]
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import json
import struct
import sys
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from hostile_edits import DELETE, edited, paths  # noqa: E402
from torch import nn  # noqa: E402

from trainers.distributed.control import Ready, Report, RoleError  # noqa: E402
from trainers.distributed.rank_checks import check_ready, check_report  # noqa: E402
from trainers.distributed.wire import MAGIC, TAG_BYTES, WireError, decode, encode  # noqa: E402
from trainers.roles.checks import ActivationRule, BadMessageError, check_activation, check_blocks, check_upload, schema_of  # noqa: E402
from trainers.roles.messages import Activation, BlockState, ModelUpload  # noqa: E402
from trainers.roles.protocol import Blocks  # noqa: E402

KEY = b"k" * 32
HOSTILE: list[Any] = [DELETE, True, -1, 0, 10 ** 30, 10 ** 400, "x", [], {}, 1.5, [1, 2], {"value": {}}, None,
                      {"M": "Activation", "f": {}}, {"X": 0}, {"X": 99}, {"F": "nan"}, {"T": [1]}, {"S": [[1]]},
                      {"D": [[[1], 2]]}, "float64", "complex64", [2 ** 40], [-1], [0, 2 ** 62]]

CHAIN = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
SCHEMA = schema_of([block.state_dict() for block in CHAIN])
RULE = ActivationRule((4,), torch.float32, 3)


def messages() -> list[tuple[str, Any, Callable[[Any], None]]]:
    """(name, an honest message of device 0 on rank 2, rank 0's check of what a frame decodes to)."""
    activation = Activation(0, 2, 0, torch.randn(2, 4), torch.tensor([0, 2]))
    upload = ModelUpload(0, 2, "device", {0: BlockState(CHAIN[0].state_dict())}, 5.0)
    blocks = Blocks(0, [CHAIN[0].state_dict()])

    def is_role_error(msg: Any) -> None:
        if not isinstance(msg, RoleError):
            raise BadMessageError("rank 2", "error", "type", f"is {type(msg).__name__}")

    def is_activation(msg: Any) -> None:         # as RankNetwork._check: its rows and rule, and the round asked for
        check_activation(_as(msg, Activation), 0, 2, RULE)
        if msg.round != 2:
            raise BadMessageError(0, "activation", "round", f"is {msg.round}, but it was asked for round 2")

    return [("activation", activation, is_activation),
            ("model upload", upload, lambda m: check_upload(_as(m, ModelUpload), 0, [0], SCHEMA)),
            ("blocks", blocks, lambda m: check_blocks(m, 0, 1, SCHEMA)),
            ("ready", Ready([0]), lambda m: check_ready(m, 2, [0])),
            ("report", Report({"device FP": {0: 0.25}, "uplink": {0: 0.125}}), lambda m: check_report(m, 2, [0])),
            ("error", RoleError("mismatch", "tags differ"), is_role_error)]


def _as(msg: Any, kind: type) -> Any:
    """What the rank does first with a reply: it must be the type asked for (RankNetwork._check)."""
    if type(msg) is not kind:
        raise BadMessageError(0, "reply", "type", f"is {type(msg).__name__}, expected {kind.__name__}")
    return msg


def split(frame: bytes) -> tuple[dict[str, Any], bytes]:
    (n,) = struct.unpack(">I", frame[4:8])
    return json.loads(frame[8:8 + n]), frame[8 + n:-TAG_BYTES]


def sign(header: Any, tensors: bytes, header_length: int | None = None, raw: bytes | None = None) -> bytes:
    raw = json.dumps(header, separators=(",", ":")).encode() if raw is None else raw
    body = MAGIC + struct.pack(">I", len(raw) if header_length is None else header_length) + raw + tensors
    return body + hmac.new(KEY, body, hashlib.sha256).digest()


def outcome(frame: bytes, check: Callable[[Any], None]) -> tuple[str, str]:
    try:
        decoded = decode(frame, KEY)
        check(decoded.value)
    except (WireError, BadMessageError) as exc:
        return "clean", str(exc)[:80]
    except Exception as exc:  # noqa: BLE001 - what this harness counts
        return "internal", f"{type(exc).__name__}: {str(exc)[:80]}"
    return "accepted", ""


def main() -> None:
    counts: collections.Counter = collections.Counter()
    internal: collections.Counter = collections.Counter()
    accepted: collections.Counter = collections.Counter()

    def count(name: str, label: str, frame: bytes, check: Callable[[Any], None]) -> None:
        result, why = outcome(frame, check)
        counts["cases"] += 1
        counts[result] += 1
        if result == "internal":
            internal[f"{name} {label}: {why}"] += 1
        elif result == "accepted":
            accepted[f"{name} {label}"] += 1

    for name, msg, check in messages():
        frame = encode(msg, 2, 0, 7, KEY, "s2", "s0")
        assert outcome(frame, check) == ("accepted", ""), name           # the honest frame is taken
        header, tensors = split(frame)
        whole = {"truncated": sign(header, tensors[: len(tensors) // 2]), "extended": sign(header, tensors + b"\0" * 8),
                 "header length lies": sign(header, tensors, 10 ** 6), "header length 0": sign(header, tensors, 0),
                 "tag cut": frame[:-1], "not signed": frame[:-TAG_BYTES] + b"\0" * TAG_BYTES,
                 "deep value": sign(None, tensors, raw=json.dumps(dict(header, v=0), separators=(",", ":")).encode()
                                    .replace(b'"v":0', b'"v":' + b"[" * 5000 + b"]" * 5000))}
        for label, data in whole.items():
            count(name, label, data, check)
        for path in paths(header):
            for value in HOSTILE:
                label = f"{'.'.join(map(str, path))} = {'delete' if value is DELETE else repr(value)[:20]}"
                count(name, label, sign(edited(header, path, value), tensors), check)
    print(f"frames: cases {counts['cases']}, clean {counts['clean']}, accepted {counts['accepted']}, "
          f"internal {counts['internal']}")
    for kind, n in internal.most_common():
        print(f"  {n:5d}  {kind}")
    if "--accepted" in sys.argv:
        for kind, n in sorted(accepted.items()):
            print(f"  accepted {kind} ({n})")


if __name__ == "__main__":
    main()
