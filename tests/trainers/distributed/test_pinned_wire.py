"""The wire's documented limits at their edges (docs/distributed.md "The wire"), the values written out from the
docs, not read from trainers/distributed/wire.py: ranks in 0..10,001, frame numbers in 0..2⁶³ − 1, sessions of at
most 64 letters, digits, ``-`` and ``_``, a message's ``int`` field a 64-bit integer, and a frame longer than 2 GiB
refused. Each limit is taken at its last valid value and refused one beyond it."""

from __future__ import annotations

import hashlib
import hmac
import json
import struct

import pytest
import torch

from trainers.distributed import wire
from trainers.roles.messages import Activation

KEY = hashlib.sha256(b"pinned wire").digest()
LAST_RANK = 10_001                     # "the sender and receiver are ranks in 0..10,001"
LAST_SEQ = 2 ** 63 - 1                 # "the frame's number an integer in 0..2⁶³ − 1"
SESSION_CHARS = 64                     # "sessions are names of at most 64 letters, digits, - and _"
GIB = 1024 ** 3


def craft(header: dict, data: bytes = b"") -> bytes:
    """A frame as the documented layout says: "APW1", a 4-byte big-endian header length, the JSON header, the
    tensor bytes and HMAC-SHA256 over all of it."""
    raw = json.dumps(header, separators=(",", ":")).encode()
    body = b"APW1" + struct.pack(">I", len(raw)) + raw + data
    return body + hmac.new(KEY, body, hashlib.sha256).digest()


BASE = {"src": 0, "dst": 1, "seq": 0, "ses": "", "to": "", "v": 1, "t": []}


@pytest.mark.parametrize("field", ["src", "dst"])
def test_a_rank_of_10001_is_taken_and_10002_refused(field: str) -> None:
    frame = wire.decode(craft({**BASE, field: LAST_RANK}), KEY)
    assert getattr(frame, field) == LAST_RANK
    with pytest.raises(wire.WireError, match="sender or receiver"):
        wire.decode(craft({**BASE, field: LAST_RANK + 1}), KEY)


def test_frame_number_2_63_minus_1_is_taken_and_2_63_refused() -> None:
    assert wire.decode(craft({**BASE, "seq": LAST_SEQ}), KEY).seq == LAST_SEQ
    assert wire.decode(wire.encode(7, 0, 1, LAST_SEQ, KEY), KEY).seq == LAST_SEQ
    with pytest.raises(wire.WireError, match="sequence number"):
        wire.decode(craft({**BASE, "seq": LAST_SEQ + 1}), KEY)


@pytest.mark.parametrize("key", ["ses", "to"])
def test_a_session_of_64_allowed_characters_is_taken_and_65_refused(key: str) -> None:
    allowed = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"
    longest = (allowed * 2)[:SESSION_CHARS]
    assert len(longest) == 64 and set(allowed) <= set(allowed * 2)
    frame = wire.decode(craft({**BASE, key: longest}), KEY)
    assert getattr(frame, key) == longest
    assert wire.decode(craft({**BASE, key: allowed[:64]}), KEY)          # every allowed character
    with pytest.raises(wire.WireError, match="sessions are not names of at most 64"):
        wire.decode(craft({**BASE, key: longest + "a"}), KEY)
    assert getattr(wire.decode(craft({**BASE, key: ""}), KEY), key) == ""   # a sender that knew none


@pytest.mark.parametrize("value, taken", [(2 ** 63 - 1, True), (-(2 ** 63), True), (2 ** 63, False),
                                          (-(2 ** 63) - 1, False)])
def test_an_int_field_is_a_64_bit_integer(value: int, taken: bool) -> None:
    """docs: "every field of a decoded message is of its declared type (`int` an integer of 64 bits ...)"."""
    message = Activation(0, value, 0, torch.zeros(2, 3), torch.zeros(2, dtype=torch.int64))
    frame = wire.encode(message, 2, 0, 0, KEY)
    if taken:
        assert wire.decode(frame, KEY).value.round == value
    else:
        with pytest.raises(wire.WireError, match="Activation.round is .*, not a 64-bit integer"):
            wire.decode(frame, KEY)


def test_a_frame_longer_than_2_gib_is_refused_and_one_of_the_limit_taken(monkeypatch) -> None:
    """2 GiB frames cannot be built in a test: the limit's value is pinned to the docs' 2 GiB, and the comparison
    is taken at its edge on a lowered limit (a frame exactly as long as the limit is taken)."""
    assert wire.MAX_FRAME_BYTES == 2 * GIB
    frame = wire.encode({"x": torch.zeros(10)}, 0, 1, 0, KEY)
    monkeypatch.setattr(wire, "MAX_FRAME_BYTES", len(frame))
    assert wire.decode(frame, KEY).value["x"].shape == (10,)
    monkeypatch.setattr(wire, "MAX_FRAME_BYTES", len(frame) - 1)
    with pytest.raises(wire.WireError, match=f"it is {len(frame)} bytes, more than the {len(frame) - 1}"):
        wire.decode(frame, KEY)
