"""The distributed runtime's frame format (trainers/distributed/wire.py): what round-trips, and
every way a frame is refused. Frames are built here from the documented layout (MAGIC, a 4-byte
big-endian header length, the JSON header, the tensor bytes, HMAC-SHA256 over all of it)."""

from __future__ import annotations

import hashlib
import hmac
import json
import pickle
import random
import re
import struct
from pathlib import Path
from typing import Sequence

import numpy as np
import pytest
import torch

from adaptplan.errors import InputError
from trainers.distributed import wire
from trainers.distributed.environment import run_key
from trainers.roles.defences import ActivationDefence
from trainers.roles.messages import Activation, BlockState, CutGradient, ModelDownload, ModelUpload
from trainers.roles.optim import OptimizerSpec

KEY = hashlib.sha256(b"test").digest()
ROOT = Path(__file__).resolve().parents[3]


def craft(header: dict, data: bytes = b"", key: bytes = KEY) -> bytes:
    """A frame with this header and tensor bytes, tagged as the documented layout says."""
    raw = json.dumps(header, separators=(",", ":")).encode()
    body = b"APW1" + struct.pack(">I", len(raw)) + raw + data
    return body + hmac.new(key, body, hashlib.sha256).digest()


def roundtrip(value):
    return wire.decode(wire.encode(value, 1, 2, 7, KEY), KEY)


def test_the_frame_layout_is_magic_length_json_bytes_and_an_hmac() -> None:
    t = torch.tensor([1.5, -2.0], dtype=torch.float32)
    frame = wire.encode({"x": t}, 0, 3, 4, KEY, "00000000000000a0", "00000000000000b3")
    assert frame[:4] == b"APW1"
    (n,) = struct.unpack(">I", frame[4:8])
    header = json.loads(frame[8:8 + n])
    assert header == {"src": 0, "dst": 3, "seq": 4, "ses": "00000000000000a0", "to": "00000000000000b3",
                      "v": {"D": [["x", {"X": 0}]]}, "t": [["float32", [2], 0, 8]]}
    back = wire.decode(frame, KEY)
    assert (back.ses, back.to) == ("00000000000000a0", "00000000000000b3")
    assert frame[8 + n:8 + n + 8] == t.numpy().tobytes()
    assert frame[-32:] == hmac.new(KEY, frame[:-32], hashlib.sha256).digest()
    assert len(frame) == 8 + n + 8 + 32
    assert frame == craft(header, t.numpy().tobytes())


def test_every_message_and_value_form_round_trips() -> None:
    upload = ModelUpload(4, 2, "device", {0: BlockState({"w": torch.randn(3, 2), "n": torch.tensor(5)},
                                                        [{"state": {0: {"momentum_buffer": torch.ones(3)}},
                                                          "param_groups": [{"lr": 0.1, "params": [0]}]}])}, 0.25)
    value = {"act": Activation(3, 7, 2, torch.randn(4, 5), torch.tensor([1, 0, 2, 1])),
             "grad": CutGradient(3, 7, 2, None), "grad2": CutGradient(1, 1, 0, torch.randn(2, 3, dtype=torch.float64)),
             "up": upload, "down": ModelDownload(4, 3, "edge", {}, 2, {0, 1}, True),
             "spec": OptimizerSpec("adam", 1e-3, 0.9, 0.0, 1.0), ("up", 5, 1): [None, True, "s", 3, 2.5],
             "nonfinite": [float("nan"), float("inf"), float("-inf")], "rng": {"state": 2 ** 127 + 1},
             "order": np.array([5, 3, 9]), "empty": torch.empty(0, 4), "flags": torch.tensor([True, False]),
             "half": torch.tensor([1.0, 2.0], dtype=torch.bfloat16), "scalar": torch.tensor(3.0),
             "strided": torch.arange(12.0).reshape(3, 4).t(),
             "defence": ActivationDefence(0.125, 1.0, 0.5, 1e-6, 2.0, 10, clip_per_value=True)}
    frame = roundtrip(value)
    back = frame.value
    assert (frame.src, frame.dst, frame.seq) == (1, 2, 7)
    assert isinstance(back["act"], Activation) and back["act"].step == 2
    assert torch.equal(back["act"].tensor, value["act"].tensor) and torch.equal(back["act"].labels, value["act"].labels)
    assert back["grad"] == CutGradient(3, 7, 2, None)
    assert torch.equal(back["grad2"].tensor, value["grad2"].tensor) and back["grad2"].tensor.dtype == torch.float64
    state = back["up"].blocks[0]
    assert isinstance(state, BlockState) and torch.equal(state.state["w"], upload.blocks[0].state["w"])
    assert torch.equal(state.optimizer[0]["state"][0]["momentum_buffer"], torch.ones(3))
    assert state.optimizer[0]["param_groups"] == [{"lr": 0.1, "params": [0]}] and back["up"].weight == 0.25
    assert back["down"] == ModelDownload(4, 3, "edge", {}, 2, {0, 1}, True)
    assert back["spec"] == OptimizerSpec("adam", 1e-3, 0.9, 0.0, 1.0)
    assert back[("up", 5, 1)] == [None, True, "s", 3, 2.5]
    assert np.isnan(back["nonfinite"][0]) and back["nonfinite"][1:] == [float("inf"), float("-inf")]
    assert back["rng"] == {"state": 2 ** 127 + 1}
    assert isinstance(back["order"], np.ndarray) and back["order"].tolist() == [5, 3, 9]
    assert back["empty"].shape == (0, 4) and back["flags"].tolist() == [True, False]
    assert back["half"].dtype == torch.bfloat16 and back["half"].tolist() == [1.0, 2.0]
    assert back["scalar"].shape == () and float(back["scalar"]) == 3.0
    assert torch.equal(back["strided"], value["strided"])
    assert back["defence"] == value["defence"]                  # a device rank's defence, every field of it
    assert frame.tensors[:2] == (("float32", (4, 5)), ("int64", (4,)))


@pytest.mark.parametrize("value, what", [
    (torch.nn.Linear(2, 2), "a Linear cannot be sent"),
    (object(), "a object cannot be sent"),
    ({"x": torch.zeros(2, dtype=torch.complex64)}, "dtype torch.complex64 cannot be sent"),
])
def test_what_is_not_a_message_is_not_sent(value, what: str) -> None:
    with pytest.raises(wire.WireError, match=what):
        wire.encode(value, 0, 1, 0, KEY)


def test_a_pickle_or_torch_save_payload_is_refused_unread() -> None:
    class Boom:
        def __reduce__(self):
            return (exec, ("raise SystemExit('ran')",))

    with pytest.raises(wire.WireError, match="not an adaptplan frame"):
        wire.decode(pickle.dumps(Boom()), KEY)
    with pytest.raises(wire.WireError, match="authentication tag is wrong"):
        wire.decode(b"APW1" + pickle.dumps(Boom()) + b"\0" * 32, KEY)


def test_any_altered_byte_or_another_key_is_refused() -> None:
    frame = bytearray(wire.encode({"x": torch.randn(16), "n": 3}, 0, 2, 0, KEY))
    with pytest.raises(wire.WireError, match="authentication tag is wrong"):
        wire.decode(bytes(frame), hashlib.sha256(b"other").digest())
    rng = random.Random(0)
    for _ in range(200):
        altered = bytearray(frame)
        altered[rng.randrange(4, len(frame))] ^= 1 << rng.randrange(8)
        with pytest.raises(wire.WireError):
            wire.decode(bytes(altered), KEY)
    with pytest.raises(wire.WireError, match="not an adaptplan frame"):
        wire.decode(bytes(frame[:20]), KEY)


@pytest.mark.parametrize("header, data, why", [
    ({"src": 0, "dst": 1, "seq": 0, "v": {"M": "os.system", "f": {}}, "t": []}, b"", "names the message type 'os.system'"),
    ({"src": 0, "dst": 1, "seq": 0, "v": {"M": "Activation", "f": {"evil": 1}}, "t": []}, b"", r"fields \['evil'\]"),
    ({"src": 0, "dst": 1, "seq": 0, "v": {"M": "Activation", "f": {"device": 1}}, "t": []}, b"", "incomplete"),
    ({"src": 0, "dst": 1, "seq": 0, "v": {"Q": 1}, "t": []}, b"", "tagged 'Q'"),
    ({"src": 0, "dst": 1, "seq": 0, "v": {"a": 1, "b": 2, "c": 3}, "t": []}, b"", "unknown form"),
    ({"src": 0, "dst": 1, "seq": 0, "v": {"X": 0}, "t": [["object", [1], 0, 1]]}, b"x", "dtype 'object'"),
    ({"src": 0, "dst": 1, "seq": 0, "v": {"X": 0}, "t": [["float32", [4], 0, 16]]}, b"\0" * 8, "does not fit"),
    ({"src": 0, "dst": 1, "seq": 0, "v": {"X": 0}, "t": [["float32", [4], 0, 8]]}, b"\0" * 16, "does not fit"),
    ({"src": 0, "dst": 1, "seq": 0, "v": {"X": 0}, "t": [["float32", [-1], 0, 0]]}, b"", "not a list of sizes"),
    ({"src": 0, "dst": 1, "seq": 0, "v": {"X": 3}, "t": []}, b"", "refers to tensor 3"),
    ({"src": 0, "dst": 1, "seq": 0, "v": {"D": [[[1], 2]]}, "t": []}, b"", "dict keyed by a list"),
    ({"src": 0, "dst": 1, "seq": 0, "v": {"D": [[1]]}, "t": []}, b"", r"not \[key, value\] pairs"),
    ({"src": 0, "dst": 1, "seq": 0, "v": {"F": "1e999"}, "t": []}, b"", "tagged 'F'"),
    ({"src": 0, "dst": 1, "v": 1, "t": []}, b"", "sequence number"),
    ({"src": 0, "dst": 1, "seq": 0, "v": 1, "t": {}}, b"", "tensor table is not a list"),
])
def test_a_well_signed_but_malformed_frame_is_refused(header: dict, data: bytes, why: str) -> None:
    with pytest.raises(wire.WireError, match=why):
        wire.decode(craft(header, data), KEY)


def test_a_frame_listing_more_tensors_or_dimensions_than_any_message_has_is_refused_early() -> None:
    """Issue 36 W3: a header listing 10⁶ tensor entries (inside the 64 MiB header cap) cost seconds of CPU to
    check one by one; over :data:`wire.MAX_TENSORS` it is refused before any entry is read, and a shape of more
    than :data:`wire.MAX_DIMS` sizes too."""
    entry = ["uint8", [0], 0, 0]
    over = {"src": 0, "dst": 1, "seq": 0, "v": 1, "t": [entry] * (wire.MAX_TENSORS + 1)}
    with pytest.raises(wire.WireError, match=f"it lists {wire.MAX_TENSORS + 1:,} tensors, more than the "
                                             f"{wire.MAX_TENSORS:,} a frame may carry"):
        wire.decode(craft(over), KEY)
    at = wire.decode(craft({**over, "v": [{"X": i} for i in range(wire.MAX_TENSORS)],
                            "t": [entry] * wire.MAX_TENSORS}), KEY)          # at the cap: taken
    assert len(at.tensors) == wire.MAX_TENSORS
    deep = {"src": 0, "dst": 1, "seq": 0, "v": {"X": 0}, "t": [["uint8", [1] * (wire.MAX_DIMS + 1), 0, 1]]}
    with pytest.raises(wire.WireError, match="has the shape"):
        wire.decode(craft(deep, b"x"), KEY)
    assert wire.decode(craft({**deep, "t": [["uint8", [1] * wire.MAX_DIMS, 0, 1]]}, b"x"), KEY).tensors[0][1] == \
        (1,) * wire.MAX_DIMS


def test_a_header_length_beyond_the_frame_is_refused() -> None:
    for length in (10 ** 6, wire.MAX_HEADER_BYTES + 1):
        body = b"APW1" + struct.pack(">I", length) + b'{"src":0}'
        with pytest.raises(wire.WireError, match=f"its header length {length} does not fit the frame"):
            wire.decode(body + hmac.new(KEY, body, hashlib.sha256).digest(), KEY)


def test_a_well_signed_header_with_a_number_too_long_to_read_is_refused() -> None:
    """Issue 36 W1: an insider's header holding a 5,000-digit integer raised Python's ValueError (int conversion
    limit) out of the decoder: over MQTT rank 0's network thread died, over gloo a traceback."""
    for field in ("seq", "v"):
        header = {"src": 0, "dst": 1, "seq": 0, "t": [], "v": 1}
        text = json.dumps(header).replace(f'"{field}": {header[field]}', f'"{field}": {"9" * 5000}')
        body = b"APW1" + struct.pack(">I", len(text)) + text.encode()
        with pytest.raises(wire.WireError, match="holds a number too long to read"):
            wire.decode(body + hmac.new(KEY, body, hashlib.sha256).digest(), KEY)


def test_a_value_nested_deeper_than_python_recurses_is_refused(monkeypatch) -> None:
    """The decoder recurses once per level of the value; where Python's stack ends (a frame nested
    thousands deep within the JSON parser's limit) the frame is refused, not a crash."""
    frame = wire.encode([[[1]]], 0, 1, 0, KEY)

    def too_deep(self, v):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(wire._Decoder, "value", too_deep)
    with pytest.raises(wire.WireError, match="^its value is nested too deeply$"):
        wire.decode(frame, KEY)


def test_deep_nesting_and_oversized_frames_are_refused(monkeypatch) -> None:
    deep: object = 1
    for _ in range(5000):
        deep = [deep]
    header = '{"src":0,"dst":1,"seq":0,"t":[],"v":' + "[" * 100000 + "]" * 100000 + "}"
    body = b"APW1" + struct.pack(">I", len(header)) + header.encode()
    with pytest.raises(wire.WireError, match="not JSON|nested too deeply"):
        wire.decode(body + hmac.new(KEY, body, hashlib.sha256).digest(), KEY)
    monkeypatch.setattr(wire, "MAX_FRAME_BYTES", 100)
    with pytest.raises(wire.WireError, match="more than the 100 a frame may have"):
        wire.decode(wire.encode({"x": torch.zeros(50)}, 0, 1, 0, KEY), KEY)


def test_the_runs_key_comes_from_a_file_or_the_environment_never_a_flag(tmp_path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("a" * 32 + "\n")
    for mode in (0o640, 0o604, 0o620):                    # issue 67: readable (or writable) by others is refused
        secret.chmod(mode)
        with pytest.raises(InputError, match=rf"^ADAPTPLAN_SECRET_FILE: '.*secret' can be read or written by other "
                                             rf"users \(mode {mode:o}\)"):
            run_key({"ADAPTPLAN_SECRET_FILE": str(secret)})
    secret.chmod(0o600)
    from_file = run_key({"ADAPTPLAN_SECRET_FILE": str(secret)})
    assert from_file == hashlib.sha256(b"adaptplan run secret\0" + b"a" * 32).digest()
    assert run_key({"ADAPTPLAN_SECRET": "a" * 32}) == from_file
    assert run_key({"ADAPTPLAN_SECRET": "b" * 32}) != from_file
    with pytest.raises(InputError, match="^ADAPTPLAN_SECRET_FILE: a rank needs the run's shared secret"):
        run_key({})
    with pytest.raises(InputError, match="^ADAPTPLAN_SECRET: ADAPTPLAN_SECRET holds 5 bytes; a secret needs at least 16"):
        run_key({"ADAPTPLAN_SECRET": "short"})
    with pytest.raises(InputError, match=r"^ADAPTPLAN_SECRET_FILE: cannot read the run's secret from '.*missing'"):
        run_key({"ADAPTPLAN_SECRET_FILE": str(tmp_path / "missing")})


def test_nothing_read_from_a_peer_or_a_file_is_unpickled() -> None:
    """The packages never call pickle/torch.load in a way that would run code from bytes."""
    risky = re.compile(r"weights_only\s*=\s*False|pickle\.loads?\(|marshal\.loads|dill\.|cloudpickle|"
                       r"torch\.load\((?!.*weights_only\s*=\s*True)")
    found = []
    for package in ("adaptplan", "profilers", "solvers", "trainers"):
        for path in (ROOT / package).rglob("*.py"):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if risky.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert found == []


@pytest.mark.parametrize("value, why", [
    ({"S": [[1, 2]]}, "a set of lists"),
    ({"S": [{"D": []}]}, "a set of lists"),
    ({"D": [[{"T": [[1]]}, 1]]}, "a dict keyed by a tuple"),
    ({"D": [[{"T": [{"D": []}]}, 1]]}, "a dict keyed by a tuple"),
])
def test_a_set_or_key_of_unhashable_values_is_refused_not_an_internal_error(value, why) -> None:
    """Found by the issue 36 harness: these raised a plain TypeError out of decode."""
    with pytest.raises(wire.WireError, match=why):
        wire.decode(craft({"src": 0, "dst": 1, "seq": 0, "v": value, "t": []}), KEY)


def test_an_empty_tensor_of_a_huge_side_and_a_tensor_referenced_twice_are_refused() -> None:
    for shape in ([0, 2 ** 63], [10 ** 30, 0], [0, 2 ** 64]):
        with pytest.raises(wire.WireError, match="has the shape"):
            wire.decode(craft({"src": 0, "dst": 1, "seq": 0, "v": {"X": 0}, "t": [["float32", shape, 0, 0]]}), KEY)
    data = bytes(64)
    twice = {"src": 0, "dst": 1, "seq": 0, "v": [{"X": 0}, {"X": 0}], "t": [["float32", [16], 0, 64]]}
    with pytest.raises(wire.WireError, match="refers to tensor 0 twice"):
        wire.decode(craft(twice, data), KEY)
    assert wire.decode(craft({**twice, "v": [{"X": 0}]}, data), KEY).value[0].shape == (16,)
    with pytest.raises(wire.WireError, match="does not fit its byte range"):
        wire.decode(craft({**twice, "v": [{"X": 0}], "t": [["float32", [16], False, 64]]}, data), KEY)


@pytest.mark.parametrize("field, value", [("src", True), ("dst", False), ("seq", True), ("src", -1), ("dst", 10 ** 30),
                                          ("seq", 2 ** 63), ("seq", 1.0), ("src", "0")])
def test_a_sender_receiver_or_sequence_number_of_another_type_or_range_is_refused_by_the_header(field, value) -> None:
    """Found by the issue 36 harness: true, 10³⁰ or −1 passed the header and were refused later, by the sequence check."""
    header = {"src": 0, "dst": 1, "seq": 0, "v": 1, "t": []}
    with pytest.raises(wire.WireError, match="sender or receiver"):
        wire.decode(craft({**header, field: value}), KEY)


def _activation(**fields):
    base = {"device": 0, "round": 1, "step": 0, "tensor": torch.zeros(2, 3), "labels": torch.zeros(2, dtype=torch.long)}
    return Activation(**{**base, **fields})


@pytest.mark.parametrize("message, where", [
    (_activation(device="0"), "Activation.device"),
    (_activation(round=True), "Activation.round"),
    (_activation(step=1.5), "Activation.step"),
    (_activation(tensor=[1.0, 2.0]), "Activation.tensor"),
    (CutGradient(0, 1, 0, "x"), "CutGradient.tensor"),
    (ModelUpload(0, 1, "dev", {"0": BlockState({"w": torch.zeros(1)})}), "ModelUpload.blocks"),
    (ModelUpload(0, 1, "dev", {0: BlockState({"w": 1.0})}), "BlockState.state"),
    (ModelUpload(0, 1, "dev", {0: BlockState({"w": torch.zeros(1)})}, weight=True), "ModelUpload.weight"),
    (ModelDownload(0, 1, "dev", {}, shared={"a"}), "ModelDownload.shared"),
    (ModelDownload(0, 1, "dev", {}, fresh_optimizer=1), "ModelDownload.fresh_optimizer"),
    (OptimizerSpec("sgd", lr="0.1"), "OptimizerSpec.lr"),
])
def test_a_well_signed_message_whose_field_is_not_of_its_declared_type_is_refused(message, where) -> None:
    """Found by the issue 36 harness: the dataclass took any value, and the receiving role failed on it later."""
    with pytest.raises(wire.WireError, match=re.escape(where)):
        roundtrip(message)


@pytest.mark.parametrize("hint, good, bad", [
    (int, [0, -3, 10 ** 30], [True, 1.0, "1", None]),
    (float, [0.5, 2, float("nan")], [True, "0.5", None]),
    (int | None, [None, 4], [4.0, False]),
    (list[tuple[int, int]], [[], [(1, 2)]], [[(1, 2, 3)], [[1, 2]], [(1, "2")], ((1, 2),)]),
    (dict[int, float], [{}, {1: 2.5}], [{"1": 2.5}, {1: "x"}, [(1, 2.5)]]),
    (set[int], [set(), {1, 2}], [{"a"}, [1]]),
    (tuple, [(), (1, "a")], [[1]]),
    (tuple[int, ...], [(), (1, 2, 3)], [(1, "2"), [1]]),
    (Sequence[str], [["a"], ("b",)], [5, {"a"}]),        # another generic: its class only
    (torch.Tensor, [torch.zeros(1)], [np.zeros(1), 0.0]),
])
def test_conforms_reads_each_declared_form(hint, good, bad) -> None:
    assert all(wire.conforms(v, hint) for v in good), hint
    assert not any(wire.conforms(v, hint) for v in bad), hint


@pytest.mark.parametrize("change, why", [
    ({"zzz": 1}, r"keys \['zzz'\] it does not know"),
    ({"ses": "zz\u0000\u202e"}, "sessions are not names"),
    ({"to": "a" * 65}, "sessions are not names"),
    ({"v": "\ud800"}, "text that is not UTF-8"),
    ({"v": {"M": "Activation", "f": {"device": 0, "round": 2 ** 63, "step": 0, "tensor": {"X": 0}, "labels": {"X": 1}}}},
     r"Activation.round is .*, not a 64-bit integer"),
    ({"v": {"M": "CutGradient", "f": {"device": 0, "round": 1, "step": -10 ** 30, "tensor": None}}},
     r"CutGradient.step is .*, not a 64-bit integer"),
])
def test_what_the_second_harness_run_found_is_refused(change, why) -> None:
    """Issue 36's harness run again after the fixes: unknown header keys, control characters in a session, a lone
    surrogate in text and integers beyond 64 bits in a message passed the decoder (−1 is a field's sentinel)."""
    header = {"src": 0, "dst": 1, "seq": 0, "ses": "00000000000000a2", "to": "", "v": 1,
              "t": [["float32", [2, 3], 0, 24], ["int64", [2], 24, 16]]}
    with pytest.raises(wire.WireError, match=why):
        wire.decode(craft({**header, **change}, bytes(40)), KEY)


def test_a_bool_tensor_holding_bytes_other_than_0_and_1_is_refused() -> None:
    header = {"src": 0, "dst": 1, "seq": 0, "v": {"X": 0}, "t": [["bool", [4], 0, 4]]}
    assert wire.decode(craft(header, bytes([0, 1, 1, 0])), KEY).value.tolist() == [False, True, True, False]
    with pytest.raises(wire.WireError, match="bool but holds bytes other than 0 and 1"):
        wire.decode(craft(header, bytes([0, 1, 255, 0])), KEY)


def test_a_frames_tensor_bytes_are_exactly_its_tensors_each_referred_to() -> None:
    """tools/hostile_frames.py: bytes after the last tensor, a gap or an overlap between two, and a listed tensor the
    value never refers to were taken (junk carried along); each is refused, and the honest layout at its edge (two
    tensors back to back, an empty one anywhere) is taken."""
    two = {"src": 0, "dst": 1, "seq": 0, "v": [{"X": 0}, {"X": 1}, {"X": 2}],
           "t": [["uint8", [2], 0, 2], ["uint8", [0], 2, 0], ["uint8", [3], 2, 3]]}
    assert [t.tolist() for t in wire.decode(craft(two, b"abcde"), KEY).value] == [[97, 98], [], [99, 100, 101]]
    for header, payload, message in [
        (two, b"abcdef", "it carries 1 bytes beyond its tensors"),
        ({**two, "t": [["uint8", [2], 0, 2], ["uint8", [0], 2, 0], ["uint8", [3], 3, 3]]}, b"abcdef",
         "its tensors' byte ranges overlap or leave a gap"),
        ({**two, "t": [["uint8", [2], 0, 2], ["uint8", [0], 2, 0], ["uint8", [3], 1, 3]]}, b"abcde",
         "its tensors' byte ranges overlap or leave a gap"),
        ({**two, "v": [{"X": 0}, {"X": 2}]}, b"abcde", "it carries 1 tensor(s) its value does not refer to"),
    ]:
        with pytest.raises(wire.WireError, match=f"^{re.escape(message)}$"):
            wire.decode(craft(header, payload), KEY)
