"""Contracts of the torch.distributed runtime checked without processes (docs/distributed.md).

Every collaborator of the unit under test is a small fake written here (a channel that records what
is sent and answers from a script, a ``torch.distributed`` stand-in that moves tensors through
queues, fake rank processes for the launcher), so each test runs in well under a second. The
references are written out in the tests: the layout rule (rank 0 edge, rank 1 fed, device i on
rank 2 + i mod (W − 2)), a message's bytes (an int64 length, then the wire frame), the
emulated delay 8·bytes / rate, and the exact lines a failing run prints.
"""

from __future__ import annotations

import pickle
import queue
import signal
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from adaptplan.errors import InputError
from trainers.distributed import engine as dengine
from trainers.distributed import launch, session, timing, transport, workers
from trainers.distributed.layout import EDGE_RANK, FED_RANK, RankLayout, default_world_size
from trainers.distributed.remote import Hub, RemoteBlockState, RemoteDevice, RemoteFed, is_remote, materialize
from trainers.distributed import wire as wire_format
from trainers.distributed.environment import run_key
from trainers.distributed.transport import AbortRun, Channel, FrameRefused, PeerError
from trainers.engine import SplitEngine
from trainers.messages import (Activation, BlockState, CutGradient, MessageMismatchError, ModelDownload, ModelUpload,
                               NonFiniteError)


# ---- fakes --------------------------------------------------------------------------------------------------
class ScriptedChannel:
    """Records ``send``; ``recv`` answers from a per-source script (FIFO)."""

    def __init__(self, timeout: float = 12.0, describe=lambda r: f"rank {r}", replies: dict | None = None) -> None:
        self.timeout = timeout
        self.describe = describe
        self.sent: list[tuple[int, Any]] = []
        self.replies = {k: list(v) for k, v in (replies or {}).items()}
        self.recv_calls: list[tuple[int, Any]] = []
        self.closed = False
        self.flushed: list[Any] = []

    def send(self, obj: Any, dst: int) -> None:
        self.sent.append((dst, obj))

    def recv(self, src: int, timeout: float | None = None, deadline: float | None = None) -> Any:
        self.recv_calls.append((src, timeout))
        item = self.replies[src].pop(0)
        if callable(item):                      # built when it is received (e.g. an error naming a peer)
            item = item()
        if isinstance(item, BaseException):
            raise item
        return item

    def recv_many(self, sources, timeout: float | None = None):
        return [(s, self.recv(s, timeout)) for s in sources]

    def close(self) -> None:
        self.closed = True

    def flush(self, timeout: float | None = None) -> None:
        self.flushed.append(timeout)

    def ops(self, dst: int | None = None) -> list[str]:
        return [obj["op"] for d, obj in self.sent if dst is None or d == dst]


def _chain() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))     # block bytes: (12 + 4)·4 = 64, (8 + 2)·4 = 40


def _state(value: float) -> BlockState:
    return BlockState({"weight": torch.full((2, 2), value)}, [{"momentum_buffer": torch.full((2, 2), -value)}])


def _clock(monkeypatch, module, now: list[float]) -> list[float]:
    """Freeze ``module.time.time`` at ``now[0]``; ``sleep`` is recorded, not slept."""
    slept: list[float] = []
    monkeypatch.setattr(module.time, "time", lambda: now[0])
    monkeypatch.setattr(module.time, "sleep", lambda s: slept.append(s))
    return slept


# ---- layout ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("world", [3, 4, 5, 7])
def test_layout_follows_the_documented_rule(world: int) -> None:
    """Rank 0 edge server, rank 1 fed server, device i on rank 2 + (i mod (W − 2))."""
    num_devices = 11
    layout = RankLayout(world, num_devices)
    assert (EDGE_RANK, FED_RANK) == (0, 1)
    assert layout.device_ranks == list(range(2, world))
    for i in range(num_devices):
        assert layout.rank_of(i) == 2 + i % (world - 2)
    hosted = {r: [i for i in range(num_devices) if 2 + i % (world - 2) == r] for r in range(2, world)}
    for r, devices in hosted.items():
        assert layout.devices_of(r) == devices
        assert layout.role(r) == layout.describe(r) == "devices " + ", ".join(str(d) for d in devices)
    assert layout.devices_of(0) == [] and layout.devices_of(1) == []
    assert layout.role(0) == "edge server" and layout.role(1) == "fed server"


def test_layout_names_a_single_device_and_the_smallest_world() -> None:
    layout = RankLayout(5, 3)
    assert [layout.role(r) for r in range(5)] == ["edge server", "fed server", "device 0", "device 1", "device 2"]
    with pytest.raises(ValueError, match=r"^a distributed run needs at least 3 ranks \(edge, fed, one device host\), "
                                         r"got 2$"):
        RankLayout(2, 1)
    assert [default_world_size(n) for n in (0, 1, 2, 8, 9)] == [3, 3, 4, 10, 10]
    assert default_world_size(5, max_device_ranks=2) == 4


# ---- messages on the wire ------------------------------------------------------------------------------------------
class FakeDist:
    """torch.distributed's point-to-point calls over queues; ``deliver`` puts a message on the wire
    exactly as :class:`Channel` sends one (an int64 length, then the payload)."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world
        self.wire: dict[int, queue.Queue] = {r: queue.Queue() for r in range(world)}
        self.sent: list[tuple[int, torch.Tensor]] = []
        self.fail_send: dict[int, str] = {}
        self.seq: dict[int, int] = {}

    def get_rank(self) -> int:
        return self.rank

    def get_world_size(self) -> int:
        return self.world

    def recv(self, tensor: torch.Tensor, src: int, group: Any = None) -> None:
        item = self.wire[src].get()
        if isinstance(item, BaseException):
            raise item
        tensor.copy_(item)

    def send(self, tensor: torch.Tensor, dst: int, group: Any = None) -> None:
        if dst in self.fail_send:
            raise RuntimeError(self.fail_send[dst])
        self.sent.append((dst, tensor.clone()))

    def deliver(self, src: int, obj: Any, key: bytes = None, seq: int | None = None) -> None:
        """``obj`` framed as rank ``src``'s next frame to this rank (or with ``key``/``seq`` given)."""
        if seq is None:
            seq = self.seq.get(src, 0)
            self.seq[src] = seq + 1
        frame = wire_format.encode(obj, src, self.rank, seq, KEY if key is None else key)
        self.deliver_bytes(src, frame)

    def deliver_bytes(self, src: int, frame: bytes, length: int | None = None) -> None:
        payload = torch.frombuffer(bytearray(frame), dtype=torch.uint8)
        self.wire[src].put(torch.tensor([len(frame) if length is None else length], dtype=torch.int64))
        self.wire[src].put(payload)

    def cut(self, src: int, text: str) -> None:
        self.wire[src].put(RuntimeError(text))


KEY = b"k" * 32


def decode(payload: torch.Tensor) -> Any:
    return wire_format.decode(payload.numpy(), KEY).value


@pytest.fixture
def wire(monkeypatch):
    """A Channel on rank 0 of 4 (peers 1, 2, 3) over :class:`FakeDist`; its threads are ended afterwards."""
    fake = FakeDist(0, 4)
    monkeypatch.setattr(transport, "dist", fake)
    before = set(threading.enumerate())
    channel = Channel(5.0, RankLayout(4, 2).describe, key=KEY)
    yield fake, channel
    channel.closing = True
    for r in (1, 2, 3):
        fake.cut(r, "test over")
    channel.close()
    for thread in set(threading.enumerate()) - before:   # ended while `dist` is still this test's fake
        thread.join(timeout=10)


def _receiver_done(src: int) -> None:
    for thread in threading.enumerate():
        if thread.name == f"recv-{src}":
            thread.join(timeout=10)


def test_a_message_is_its_length_then_its_numbered_authenticated_frame(wire) -> None:
    fake, channel = wire
    obj = {"op": "forward", "round": 3, "items": [(1, 16)]}
    channel.send(obj, 2)
    channel.send({"op": "stop"}, 2)
    channel.send({"op": "stop"}, 3)
    channel.flush()
    expected = wire_format.encode(obj, 0, 2, 0, KEY)
    to_2 = [t for d, t in fake.sent if d == 2]                        # one sending thread per destination
    header, payload = to_2[:2]
    assert header.dtype == torch.int64 and header.tolist() == [len(expected)]
    assert payload.dtype == torch.uint8 and payload.numpy().tobytes() == expected
    second = wire_format.decode(to_2[3].numpy(), KEY)
    assert (second.src, second.dst, second.seq, second.value) == (0, 2, 1, {"op": "stop"})   # numbered per pair, in order
    third = wire_format.decode([t for d, t in fake.sent if d == 3][1].numpy(), KEY)
    assert (third.dst, third.seq) == (3, 0)
    assert len(fake.sent) == 6


@pytest.mark.parametrize("case, why", [
    ("other key", "its authentication tag is wrong"),
    ("replayed", r"it is numbered 2→0 #0, not 2→0 #1 \(replayed"),
    ("misdirected", r"it is numbered 2→3 #1, not 2→0 #1"),
    ("pickle", "it is not an adaptplan frame"),
    ("oversized", "its length 2147483649 bytes is outside"),
])
def test_a_refused_frame_names_its_sender_on_every_later_wait(wire, case: str, why: str) -> None:
    fake, channel = wire
    fake.deliver(2, {"op": "ok"})
    assert channel.recv(2) == {"op": "ok", "arrived": pytest.approx(time.time(), abs=5)}
    if case == "other key":
        fake.deliver(2, {"op": "x"}, key=b"q" * 32)
    elif case == "replayed":
        fake.deliver(2, {"op": "x"}, seq=0)
    elif case == "misdirected":
        fake.deliver_bytes(2, wire_format.encode({"op": "x"}, 2, 3, 1, KEY))
    elif case == "pickle":
        fake.deliver_bytes(2, pickle.dumps({"op": "x"}))
    else:
        fake.deliver_bytes(2, b"x", length=wire_format.MAX_FRAME_BYTES + 1)
    for _ in range(2):
        with pytest.raises(FrameRefused, match=rf"^rank 2 \(device 0\) sent rank 0 a frame it refused: {why}"):
            channel.recv(2)
    fake.deliver(1, {"op": "still"})                                    # the other peers are unaffected
    assert channel.recv(1)["op"] == "still"


def test_received_dicts_are_stamped_with_their_arrival_and_kept_in_order(wire) -> None:
    fake, channel = wire
    before = time.time()
    fake.deliver(3, {"seq": 1})
    fake.deliver(3, {"seq": 2, "arrived": 1.5})                          # a stamp already there is kept
    fake.deliver(2, [1, 2, 3])                                           # not a dict: as sent
    first, second = channel.recv(3), channel.recv(3)
    assert first["seq"] == 1 and first["arrived"] >= before
    assert second == {"seq": 2, "arrived": 1.5}
    assert channel.recv(2) == [1, 2, 3]
    fake.deliver(1, "a")
    fake.deliver(2, "b")
    fake.deliver(2, "c")
    assert channel.recv_many([2, 1, 2]) == [(2, "b"), (1, "a"), (2, "c")]


def test_abort_and_role_errors_are_raised_where_they_are_received(wire) -> None:
    fake, channel = wire
    fake.deliver(1, {"op": "abort", "reason": "rank 0 (edge server) lost rank 3"})
    with pytest.raises(AbortRun, match=r"^rank 0 \(edge server\) lost rank 3$"):
        channel.recv(1)
    fake.deliver(2, {"op": "role-error", "kind": "nonfinite", "message": "NaN or inf in x at round 2, device 0"})
    with pytest.raises(NonFiniteError, match=r"^NaN or inf in x at round 2, device 0$"):
        channel.recv(2)
    fake.deliver(2, {"op": "role-error", "kind": "mismatch", "message": "tags differ"})
    with pytest.raises(MessageMismatchError, match="^tags differ$"):
        channel.recv(2)
    fake.deliver(2, {"op": "role-error", "kind": "input", "message": "--data-root: 10 samples here"})
    with pytest.raises(InputError, match=r"^device 0: --data-root: 10 samples here$"):
        channel.recv(2)
    fake.deliver(2, {"op": "role-error", "kind": "?", "message": "odd"})
    with pytest.raises(MessageMismatchError, match="^odd$"):
        channel.recv(2)
    fake.deliver(2, {"op": "forward"})
    assert channel.recv(2)["op"] == "forward"


def test_a_closed_connection_names_the_peer_on_every_later_wait(wire) -> None:
    fake, channel = wire
    fake.cut(3, "Connection closed by peer [127.0.0.1]:41234")
    for _ in range(2):
        with pytest.raises(PeerError) as info:
            channel.recv(3)
        assert str(info.value) == "rank 3 (device 1) closed its connection (it died or was killed)"
        assert (info.value.rank, info.value.who) == (3, "device 1")
    fake.cut(2, "Gloo read failed\nsecond line of a long library message that would be cut")
    with pytest.raises(PeerError, match=r"^rank 2 \(device 0\) closed its connection \(the transfer failed with a "
                                        r"RuntimeError\)$"):
        channel.recv(2)
    fake.cut(1, "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read timeout [127.0.0.1]:1234")
    with pytest.raises(PeerError, match=r"^rank 1 \(fed server\) closed its connection \(the transfer timed out\)$"):
        channel.recv(1)


def test_after_close_a_lost_connection_is_not_reported(wire) -> None:
    """Closing (the run's end) is when the other ranks' connections go: that is no failure."""
    fake, channel = wire
    channel.close()
    fake.cut(1, "Connection closed by peer")
    _receiver_done(1)
    with pytest.raises(PeerError, match=r"^rank 1 \(fed server\) sent nothing for 0\.05 s \(--rank-timeout\): it hangs "
                                        r"or is too slow$"):
        channel.recv(1, timeout=0.05)


def test_a_passed_deadline_does_not_wait_for_a_late_message(wire) -> None:
    fake, channel = wire
    timer = threading.Timer(0.3, fake.deliver, args=(2, {"late": True}))
    timer.start()
    try:
        with pytest.raises(PeerError, match=r"sent nothing for 4 s"):
            channel.recv(2, timeout=4.0, deadline=time.monotonic() - 1.0)
    finally:
        timer.join()
    assert channel.recv(2)["late"] is True                               # it still arrives for the next wait


def test_a_failed_send_is_reported_at_flush_and_at_the_next_send(wire) -> None:
    fake, channel = wire
    fake.fail_send[3] = "Connection reset by peer\ndetails"
    channel.send({"op": "ping"}, 2)
    channel.send({"op": "report"}, 3)
    expected = r"^rank 3 \(device 1\) stopped receiving \(it died or was killed\)$"
    with pytest.raises(PeerError, match=expected):
        channel.flush()
    assert [(d, decode(t)) for d, t in fake.sent if t.dtype == torch.uint8] == [(2, {"op": "ping"})]  # others unaffected
    with pytest.raises(PeerError, match=expected):
        channel.send({"op": "stop"}, 3)


# ---- the edge rank's proxies ------------------------------------------------------------------------------------
def _hub(replies: dict | None = None, emulate: bool = False, world: int = 4, devices: int = 3) -> Hub:
    return Hub(ScriptedChannel(replies=replies), RankLayout(world, devices), _chain(), emulate)


def test_hub_sizes_blocks_and_reads_link_rates_only_when_emulating() -> None:
    system = SimpleNamespace(fed_to_edge_bps=5e6, devices=[SimpleNamespace(up_bps=1e6), SimpleNamespace(up_bps=2e6)])
    hub = _hub(emulate=True)
    assert hub.block_bytes == [64, 40]
    assert hub.rate(1, "up_bps") is None                                 # no round system yet
    hub.system = system
    assert hub.rate(1, "up_bps") == 2e6 and hub.rate(None, "fed_to_edge_bps") == 5e6
    plain = _hub(emulate=False)
    plain.system = system
    assert plain.rate(1, "up_bps") is None and plain.rate(None, "fed_to_edge_bps") is None


def test_fetch_asks_the_fed_server_once_and_books_the_edge_servers_download(monkeypatch) -> None:
    _clock(monkeypatch, timing, [50.0])
    a, b = ("avg", 1, 0), ("avg", 1, 1)
    reply = {"blocks": {a: _state(1.0), b: _state(2.0)}, "t_send": 40.0, "arrived": 40.25, "rate": None}
    hub = _hub({FED_RANK: [reply]})
    hub.fetch([a, b])
    hub.fetch([b, a])                                                    # already here: no second request
    assert hub.channel.sent == [(FED_RANK, {"op": "fetch", "refs": [a, b], "rate": None})]
    assert hub.take(b).state["weight"][0, 0] == 2.0
    assert hub.measured.take() == {"model download": {"edge": 0.25}}
    hub.forget()
    with pytest.raises(KeyError):
        hub.take(a)


def test_fetch_is_emulated_for_the_bytes_charged(monkeypatch) -> None:
    slept = _clock(monkeypatch, timing, [40.1])
    ref = ("global", 0)
    reply = {"blocks": {ref: _state(1.0)}, "t_send": 40.0, "arrived": 40.05, "rate": 8000.0}
    hub = _hub({FED_RANK: [reply]}, emulate=True)
    hub.system = SimpleNamespace(fed_to_edge_bps=8000.0)
    hub.fetch([ref], charged_bytes=500)                                  # 8·500 / 8000 = 0.5 s after sending
    assert hub.channel.sent == [(FED_RANK, {"op": "fetch", "refs": [ref], "rate": 8000.0})]
    assert slept == [pytest.approx(0.4)]
    assert hub.measured.take() == {"model download": {"edge": pytest.approx(0.5)}}


def test_a_remote_block_fetches_its_group_once_and_keeps_the_optimizer(monkeypatch) -> None:
    _clock(monkeypatch, timing, [10.0])
    refs = [("up", 7, 0), ("up", 7, 1)]
    reply = {"blocks": {refs[0]: _state(1.0), refs[1]: _state(2.0)}, "t_send": 9.0, "arrived": 9.5, "rate": None}
    hub = _hub({FED_RANK: [reply]})
    first = RemoteBlockState(hub, refs[0], 64, refs)
    second = RemoteBlockState(hub, refs[1], 40, refs)
    assert is_remote({0: first, 1: second}) and not is_remote({})
    assert first.num_bytes == 64 and first.group == refs
    assert torch.equal(first.optimizer[0]["momentum_buffer"], torch.full((2, 2), -1.0))
    assert torch.equal(second.state["weight"], torch.full((2, 2), 2.0))
    assert hub.channel.ops() == ["fetch"] and hub.channel.sent[0][1]["refs"] == refs      # the siblings came along
    assert first.fetched and second.fetched and not is_remote({0: first})
    plain = materialize({0: first, 1: _state(3.0)})
    assert isinstance(plain[0], BlockState) and torch.equal(plain[0].state["weight"], torch.full((2, 2), 1.0))
    assert plain[0].optimizer[0]["momentum_buffer"][0, 0] == -1.0 and plain[1].state["weight"][0, 0] == 3.0
    again = pickle.loads(pickle.dumps(second))                           # a checkpoint holds the plain state
    assert type(again) is BlockState and torch.equal(again.state["weight"], torch.full((2, 2), 2.0))
    alone = RemoteBlockState(hub, ("global", 1), 40)
    assert alone.group == [("global", 1)]


def test_a_remote_device_sends_commands_to_its_rank() -> None:
    hub = _hub()
    device = RemoteDevice(hub, 2, cut=1)
    assert device.index == 2 and device.rank == 2 + 2 % 2
    upload = device.upload(4, [0, 1], weight=3.0, with_optimizer=True)      # only blocks below the cut
    assert list(upload.blocks) == [0] and upload.blocks[0].num_bytes == 64 and upload.weight == 3.0
    (dst1, up), (dst2, receive) = hub.channel.sent
    assert (dst1, up["op"], up["blocks"], up["device"], up["with_optimizer"]) == (2, "upload", [0], 2, True)
    assert (dst2, receive) == (FED_RANK, {"op": "receive", "src": 2, "id": up["id"]})
    assert upload.blocks[0].ref == ("up", up["id"], 0)
    assert device.upload(4, [1], 1.0).blocks == {} and len(hub.channel.sent) == 2
    device.load_state_dict({"cut": 2, "step": 5})
    assert device.cut == 2 and hub.channel.sent[-1] == (2, {"op": "load", "device": 2, "state": {"cut": 2, "step": 5}})
    assert list(device.upload(5, [0, 1], 1.0).blocks) == [0, 1]


def test_a_remote_devices_download_takes_the_direct_path_and_sets_the_cut(monkeypatch) -> None:
    monkeypatch.setattr(timing.time, "time", lambda: 5.0)
    hub = _hub()
    device = RemoteDevice(hub, 1, cut=2)
    refs = {0: RemoteBlockState(hub, ("avg", 3, 0), 64, [("avg", 3, 0)])}
    device.download(ModelDownload(1, 6, "device", refs))
    assert hub.channel.sent[0] == (FED_RANK, {"op": "send", "dst": 3, "device": 1, "round": 6, "receiver": "device",
                                              "refs": {0: ("avg", 3, 0)}, "cut": None, "rate": None,
                                              "fresh_optimizer": False})
    assert hub.channel.sent[1] == (3, {"op": "download", "device": 1, "source": FED_RANK})
    assert device.cut == 2                                               # no cut in the message: unchanged
    device.download(ModelDownload(1, 7, "device", {0: _state(4.0)}, cut=1, fresh_optimizer=True))
    dst, cmd = hub.channel.sent[2]
    assert (dst, cmd["op"], cmd["source"]) == (3, "download", None)
    assert cmd["msg"].cut == 1 and cmd["msg"].blocks[0].state["weight"][0, 0] == 4.0 and cmd["msg"].fresh_optimizer
    assert device.cut == 1


def test_an_activation_books_the_devices_forward_and_uplink(monkeypatch) -> None:
    _clock(monkeypatch, timing, [20.0])
    hub = _hub()
    device = RemoteDevice(hub, 0, cut=1)
    msg = Activation(0, 3, 9, torch.zeros(2, 4), torch.zeros(2, dtype=torch.long))    # 32 + 16 = 48 bytes
    got = device.receive_activation({"msg": msg, "fp": 0.125, "t_send": 19.0, "arrived": 19.5, "rate": None})
    assert got is msg and device.pending == (3, 9)
    assert hub.measured.take() == {"device FP": {0: 0.125}, "uplink": {0: 0.5}}
    device.receive_activation({"msg": msg, "fp": 0.0, "t_send": 19.0, "arrived": 19.5, "rate": 96.0})  # 8·48/96 = 4 s
    assert hub.measured.take()["uplink"] == {0: pytest.approx(4.0)}


def test_the_remote_fed_server_keeps_global_references_and_restores_them() -> None:
    hub = _hub()
    fed = RemoteFed(hub)
    up = ModelUpload(0, 1, "device", {0: RemoteBlockState(hub, ("up", 1, 0), 64, [("up", 1, 0)])}, 2.0)
    up.remote_id = 1
    edge = ModelUpload(0, 1, "edge", {1: _state(1.0)}, 2.0)
    out = fed.average([up, ModelUpload(1, 1, "device", {}, 1.0), edge], 1)
    cmd = hub.channel.sent[-1][1]
    assert cmd["op"] == "average" and cmd["items"][0] == {"ref": 1, "weight": 2.0} and len(cmd["items"]) == 2
    assert cmd["items"][1]["inline"].blocks[1].state["weight"][0, 0] == 1.0
    assert {j: b.ref for j, b in out.items()} == {0: ("avg", cmd["seq"], 0), 1: ("avg", cmd["seq"], 1)}
    assert {j: b.ref for j, b in fed.global_states([0, 1, 2]).items()} == {0: ("global", 0), 1: ("global", 1)}
    restored = RemoteFed(hub)
    restored.load_state_dict({"global_blocks": {"1": {}, "0": {}}})
    assert hub.channel.sent[-1] == (FED_RANK, {"op": "load", "state": {"global_blocks": {"1": {}, "0": {}}}})
    got = restored.global_states([1])
    assert list(got) == [1] and got[1].ref == ("global", 1) and got[1].group == [("global", 0), ("global", 1)]
    assert got[1].num_bytes == 40


# ---- the edge rank's round ------------------------------------------------------------------------------------------
def _engine(hub: Hub, cuts: list[int]) -> dengine.DistributedEngine:
    eng = dengine.DistributedEngine.__new__(dengine.DistributedEngine)      # only what these methods read
    eng.hub = hub
    eng._last_measured = {}
    eng.devices = [RemoteDevice(hub, i, c) for i, c in enumerate(cuts)]
    eng.clock = None
    return eng


def test_a_round_carries_the_measured_seconds(monkeypatch) -> None:
    times = [100.0, 102.5]
    monkeypatch.setattr(dengine.time, "time", lambda: times.pop(0) if len(times) > 1 else times[0])
    eng = _engine(_hub(), [1, 1, 1])

    def round_body(self, t):
        self._last_measured = {"uplink": 0.5}
        return dengine.RoundStats(1.0, 0, 0, 0, False)

    monkeypatch.setattr(SplitEngine, "run_round", round_body)
    stats = eng.run_round(1)
    assert stats.measured_round_seconds == 2.5 and stats.measured_stage_seconds == {"uplink": 0.5}
    assert eng.hub.system is None


def test_forwards_start_on_every_rank_and_come_back_in_group_order(monkeypatch) -> None:
    _clock(monkeypatch, timing, [1.0])
    monkeypatch.setattr(dengine.time, "time", lambda: 1.0)

    def envelope(d):
        return {"device": d, "msg": Activation(d, 2, 0, torch.zeros(1, 4), torch.zeros(1, dtype=torch.long)),
                "fp": 0.1, "t_send": 0.5, "arrived": 0.75, "rate": None}

    hub = _hub({2: [envelope(2), envelope(0)], 3: [envelope(1)]})
    eng = _engine(hub, [1, 1, 1])
    out = eng._forward_all(2, [2, 1, 0], {0: 8, 1: 16, 2: 4})
    assert list(out) == [2, 1, 0] and [out[d].device for d in out] == [2, 1, 0]
    assert hub.channel.sent == [(2, {"op": "forward", "round": 2, "items": [(2, 4), (0, 8)], "rates": {2: None, 0: None}}),
                                (3, {"op": "forward", "round": 2, "items": [(1, 16)], "rates": {1: None}})]
    assert hub.measured.summary() == {"device FP": pytest.approx(0.1), "uplink": 0.25}


def test_the_rounds_end_merges_every_ranks_seconds_and_reports_the_first_divergence(monkeypatch) -> None:
    edge_checked: list[int] = []
    replies = {1: [{"seconds": {"model upload": {0: 0.3, 1: 0.2}}, "nonfinite": None}],
               2: [{"seconds": {"downlink": {0: 0.1}}, "nonfinite": None}],
               3: [{"seconds": {"downlink": {1: 0.4}}, "nonfinite": None}]}
    hub = _hub(replies)
    hub.measured.add("edge", "server", 0.7)
    eng = _engine(hub, [1, 1, 1])
    monkeypatch.setattr(dengine.DistributedEngine, "_check_edge_finite", lambda self, t: edge_checked.append(t))
    eng.check_models_finite(5)
    assert hub.channel.sent == [(r, {"op": "report", "round": 5}) for r in (1, 2, 3)]
    assert eng._last_measured == {"model upload": 0.3, "downlink": 0.4, "server": 0.7}
    assert hub.measured.summary() == {} and edge_checked == [5]
    bad = {1: [{"seconds": {}, "nonfinite": None}],
           2: [{"seconds": {}, "nonfinite": "NaN or inf in client model block 1 at round 6, device 0"}],
           3: [{"seconds": {}, "nonfinite": "NaN or inf in client model block 1 at round 6, device 1"}]}
    eng.hub = _hub(bad)
    with pytest.raises(NonFiniteError, match=r"^NaN or inf in client model block 1 at round 6, device 0$"):
        eng.check_models_finite(6)
    assert edge_checked == [5]


# ---- the other ranks' loops --------------------------------------------------------------------------------------------
def test_the_fed_server_books_an_emulated_upload_and_waits_for_it(monkeypatch) -> None:
    slept = _clock(monkeypatch, workers, [30.0])
    fed = workers.FedRank(ScriptedChannel(), 1.0)
    upload = ModelUpload(2, 1, "device", {0: BlockState({"w": torch.zeros(250)})}, 1.0)       # 1,000 bytes
    fed.channel.replies = {3: [{"id": 4, "upload": upload, "t_send": 29.0, "arrived": 29.1, "rate": 4000.0}]}
    fed.op_receive({"src": 3})                                           # 8·1000 / 4000 = 2 s: due at 31.0
    assert fed.uploads == {4: upload} and fed.ready_at == pytest.approx(31.0)
    assert fed.ledger.take() == {"model upload": {2: pytest.approx(2.0)}}
    fed.op_average({"round": 1, "items": [{"ref": 4, "weight": 1.0}], "seq": 9, "t_send": 30.0, "rate": None})
    assert slept == [pytest.approx(1.0)] and fed.uploads == {}
    assert list(fed.averages) == [9] and torch.equal(fed.averages[9][0].state["w"], torch.zeros(250))
    unhurried = workers.FedRank(ScriptedChannel(replies={2: [{"id": 1, "upload": upload, "t_send": 29.0,
                                                               "arrived": 29.5, "rate": None}]}), 1.0)
    unhurried.op_receive({"src": 2})
    assert unhurried.ledger.take() == {"model upload": {2: 0.5}}


def test_the_fed_server_books_the_edge_servers_inline_upload(monkeypatch) -> None:
    _clock(monkeypatch, workers, [10.0])
    monkeypatch.setattr(timing.time, "time", lambda: 10.0)
    fed = workers.FedRank(ScriptedChannel(), 1.0)
    inline = ModelUpload(0, 2, "edge", {1: BlockState({"w": torch.ones(2)})}, 1.0)      # 8 bytes
    fed.op_average({"round": 2, "items": [{"inline": inline}], "seq": 1, "t_send": 9.0, "arrived": 9.25, "rate": 16.0})
    assert fed.ledger.take() == {"model upload": {"edge": pytest.approx(4.0)}}          # 8·8 / 16 = 4 s


def test_the_fed_server_resolves_references_and_releases_delivered_uploads() -> None:
    fed = workers.FedRank(ScriptedChannel(), 1.0)
    fed.fed.global_blocks = {0: {"w": torch.full((2,), 7.0)}}
    fed.averages = {3: {1: _state(5.0)}}
    fed.uploads = {8: ModelUpload(1, 2, "device", {0: _state(6.0), 1: _state(6.5)}, 1.0)}
    assert fed._block(("global", 0)).state["w"][0] == 7.0
    assert fed._block(("avg", 3, 1)).state["weight"][0, 0] == 5.0
    assert fed._block(("up", 8, 1)).state["weight"][0, 0] == 6.5
    fed.op_send({"refs": {1: ("avg", 3, 1)}, "device": 1, "round": 2, "receiver": "device", "cut": 2, "rate": None,
                 "dst": 3})
    dst, envelope = fed.channel.sent[-1]
    assert dst == 3 and envelope["msg"].cut == 2 and envelope["msg"].blocks[1].state["weight"][0, 0] == 5.0
    assert envelope["msg"].fresh_optimizer is False
    fed.op_send({"refs": {1: ("avg", 3, 1)}, "device": 1, "round": 2, "receiver": "device", "cut": None, "rate": None,
                 "dst": 3, "fresh_optimizer": True})                     # SCALA/GAS: the device restarts its state
    assert fed.channel.sent[-1][1]["msg"].fresh_optimizer is True
    assert list(fed.averages) == [3]                                     # averages stay referenced
    fed.op_send({"refs": {0: ("up", 8, 0)}, "device": 2, "round": 2, "receiver": "device", "cut": None, "rate": None,
                 "dst": 2})
    assert fed.uploads == {}                                             # a hand-off is delivered once
    fed.uploads = {9: ModelUpload(1, 2, "device", {0: _state(1.0)}, 1.0)}
    fed.op_fetch({"refs": [["up", 9, 0], ["global", 0]], "rate": 123.0})
    dst, envelope = fed.channel.sent[-1]
    assert dst == EDGE_RANK and set(envelope["blocks"]) == {("up", 9, 0), ("global", 0)} and envelope["rate"] == 123.0
    assert fed.uploads == {}


def test_a_device_rank_books_downlink_and_download(monkeypatch) -> None:
    _clock(monkeypatch, workers, [3.0])
    monkeypatch.setattr(timing.time, "time", lambda: 3.0)
    loaded, stepped = [], []
    rank = workers.DeviceRank(ScriptedChannel(), 1.0)
    rank.devices = {1: SimpleNamespace(backward=stepped.append, download=loaded.append)}
    grad = CutGradient(1, 2, 0, torch.zeros(5))                          # 20 bytes
    rank.op_backward({"msg": grad, "t_send": 2.0, "arrived": 2.25, "rate": 40.0})     # 8·20 / 40 = 4 s
    down = ModelDownload(1, 2, "device", {0: BlockState({"w": torch.zeros(2)})})
    rank.channel.replies = {FED_RANK: [{"msg": down, "t_send": 2.5, "arrived": 2.75, "rate": None}]}
    rank.op_download({"device": 1, "source": FED_RANK})
    assert stepped == [grad] and loaded == [down]
    seconds = rank.ledger.take()
    assert seconds["downlink"] == {1: pytest.approx(4.0)} and seconds["model download"] == {1: 0.25}


def test_a_role_error_on_a_rank_goes_to_rank_0_and_the_loop_goes_on() -> None:
    channel = ScriptedChannel(replies={EDGE_RANK: [{"op": "report", "round": 1}, {"op": "stop"}]})
    rank = workers.DeviceRank(channel, 7.0)

    def diverged(c):
        raise NonFiniteError("NaN or inf in activation at round 1, device 0")

    rank.op_report = diverged
    rank.serve()
    assert channel.sent == [(EDGE_RANK, {"op": "role-error", "kind": "nonfinite",
                                         "message": "NaN or inf in activation at round 1, device 0"})]
    assert channel.recv_calls == [(EDGE_RANK, 7.0), (EDGE_RANK, 1.5 * 12.0)]


# ---- sessions ------------------------------------------------------------------------------------------------------------
class FakeEdgeSession:
    made: list["FakeEdgeSession"] = []

    def __init__(self, num_devices, timeout, emulate_links, threads, source=None) -> None:
        self.aborted: list[str] = []
        self.finished = False
        FakeEdgeSession.made.append(self)

    def engine_factory(self, *a, **k):
        return "engine"

    def abort(self, reason: str) -> None:
        self.aborted.append(reason)

    def finish(self) -> None:
        self.finished = True


def test_rank_0_stops_every_rank_with_the_reason(monkeypatch) -> None:
    monkeypatch.setattr(session, "EdgeSession", FakeEdgeSession)
    FakeEdgeSession.made = []
    assert session.run_edge(3, 12.0, False, None, lambda factory: 0 if factory() == "engine" else 1) == 0
    assert FakeEdgeSession.made[-1].finished and FakeEdgeSession.made[-1].aborted == []

    def lost(factory):
        raise PeerError(3, "devices 1, 3", "closed its connection (it died or was killed)")

    with pytest.raises(session.DistributedRunError, match=r"^rank 3 \(devices 1, 3\) closed its connection \(it died "
                                                          r"or was killed\)$"):
        session.run_edge(3, 12.0, False, None, lost)
    assert FakeEdgeSession.made[-1].aborted == ["rank 0 (edge server) lost rank 3 (devices 1, 3) closed its connection "
                                                "(it died or was killed)"]
    assert not FakeEdgeSession.made[-1].finished

    def broken(factory):
        raise ValueError("bad\n   value")

    with pytest.raises(ValueError):
        session.run_edge(3, 12.0, False, None, broken)
    assert FakeEdgeSession.made[-1].aborted == ["rank 0 (edge server) stopped: bad value"]


def _serve(monkeypatch, rank: int, script: list) -> tuple[int, ScriptedChannel]:
    made: list[ScriptedChannel] = []

    def channel(timeout, describe, group, key):
        assert key == run_key({"ADAPTPLAN_SECRET": "s" * 16})
        c = ScriptedChannel(timeout, describe)
        c.replies = {EDGE_RANK: [s for s in script if not callable(s)]}
        for s in script:
            if callable(s):
                s(c)
        made.append(c)
        return c

    monkeypatch.setattr(session, "join", lambda timeout: (rank, 4, None))
    monkeypatch.setattr(session, "open_channel", channel)
    monkeypatch.setenv("ADAPTPLAN_SECRET", "s" * 16)
    monkeypatch.delenv("ADAPTPLAN_SECRET_FILE", raising=False)
    monkeypatch.setattr(session.signal, "signal", lambda *a: None)
    monkeypatch.setattr(session.torch, "set_num_threads", lambda n: None)
    return session.serve_rank(workers.WorkerOptions(2.0)), made[0]


def test_a_serving_rank_names_the_peer_it_lost_by_role(monkeypatch, capsys) -> None:
    def device_dies(c):
        c.replies[3] = [lambda: PeerError(3, c.describe(3), "closed its connection (it died or was killed)")]

    code, channel = _serve(monkeypatch, 1, [{"op": "layout", "num_devices": 4}, {"op": "receive", "src": 3, "id": 1},
                                            device_dies])
    assert code == 3
    assert capsys.readouterr().err == ("adaptplan train: rank 1 (fed server) lost rank 3 (devices 1, 3) closed its "
                                       "connection (it died or was killed)\n")
    assert channel.recv_calls[0] == (EDGE_RANK, 20.0)                   # the layout: SETUP_TIMEOUT_FACTOR time-outs


def test_a_serving_rank_relays_rank_0s_abort_and_stops_cleanly_otherwise(monkeypatch, capsys) -> None:
    code, _ = _serve(monkeypatch, 2, [{"op": "layout", "num_devices": 4},
                                      AbortRun("rank 0 (edge server) lost rank 3 (devices 1, 3) sent nothing")])
    assert code == 3
    assert capsys.readouterr().err == ("adaptplan train: rank 2 (devices 0, 2) stopped: rank 0 (edge server) lost "
                                       "rank 3 (devices 1, 3) sent nothing\n")
    code, channel = _serve(monkeypatch, 1, [{"op": "layout", "num_devices": 4}, {"op": "stop"}])
    assert code == 0 and channel.closed and channel.flushed == [2.0] and capsys.readouterr().err == ""


# ---- the launcher -------------------------------------------------------------------------------------------------------
class FakeRank:
    """A rank process: ``plan[rank]`` = (exit code or None for one that never ends, its stderr)."""

    plan: dict[int, tuple[int | None, str]] = {}
    started: list["FakeRank"] = []

    def __init__(self, command, env, stdout=None, stderr=None) -> None:
        self.rank = int(env["RANK"])
        self.command, self.env = command, env
        self.code, text = FakeRank.plan[self.rank]
        self.terminated = False
        if stderr is not None:
            stderr.write(text.encode())
        FakeRank.started.append(self)

    def poll(self):
        return self.code

    def wait(self, timeout=None):
        return self.code

    def terminate(self) -> None:
        self.terminated = True
        self.code = -signal.SIGTERM

    def kill(self) -> None:
        self.code = -signal.SIGKILL


@pytest.fixture
def ranks(monkeypatch):
    monkeypatch.setattr(launch.subprocess, "Popen", FakeRank)
    monkeypatch.setattr(launch, "free_port", lambda: 29555)
    monkeypatch.setattr(launch, "POLL_SECONDS", 0.001)
    FakeRank.started = []
    return FakeRank


def test_the_launcher_starts_every_rank_with_its_environment(ranks, tmp_path) -> None:
    ranks.plan = {r: (0, "") for r in range(4)}
    assert launch.launch_local(["--devices", "3"], 4, 3, str(tmp_path)) == 0
    assert [p.rank for p in ranks.started] == [0, 1, 2, 3]
    assert all(p.command[1:] == ["-m", "adaptplan.distributed", "--devices", "3"] for p in ranks.started)
    assert {(p.env["WORLD_SIZE"], p.env["MASTER_PORT"], p.env["MASTER_ADDR"]) for p in ranks.started} == \
        {("4", "29555", "127.0.0.1")}


def test_the_launcher_names_each_failed_rank_once_and_where_to_resume(ranks, tmp_path, capsys) -> None:
    (tmp_path / "checkpoint.pt").write_bytes(b"x")
    ranks.plan = {0: (3, ""),
                  1: (3, "adaptplan train: rank 1 (fed server) stopped: rank 0 (edge server) lost rank 3\n"),
                  2: (3, "warning\nadaptplan train: rank 2 (devices 0, 2) lost rank 3 (devices 1) closed it\n"),
                  3: (-signal.SIGKILL, "")}
    assert launch.launch_local([], 4, 3, str(tmp_path)) == 3
    assert capsys.readouterr().err.splitlines() == [
        "adaptplan train: rank 2 (devices 0, 2) lost rank 3 (devices 1) closed it",
        "adaptplan train: rank 3 (device 1) was killed by SIGKILL",
        f"adaptplan train: the run stopped; its last checkpoint is in {tmp_path}: continue with adaptplan train "
        f"--out {tmp_path} --resume --distributed"]


def test_the_launcher_passes_a_user_error_through_and_terminates_a_rank_that_stays(ranks, tmp_path, capsys,
                                                                                     monkeypatch) -> None:
    ranks.plan = {0: (2, ""), 1: (3, "adaptplan train: rank 1 (fed server) stopped: x\n"), 2: (3, "")}
    assert launch.launch_local([], 3, 1, None) == 2
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(launch, "GRACE_SECONDS", 0.01)
    ranks.plan = {0: (3, ""), 1: (None, ""), 2: (0, "")}
    assert launch.launch_local([], 3, 1, str(tmp_path)) == 3
    assert ranks.started[-2].terminated
    assert capsys.readouterr().err.splitlines() == [
        "adaptplan train: rank 1 (fed server) did not stop within 0.01 s of the failure and was terminated"]
    ranks.plan = {0: (-signal.SIGINT, ""), 1: (0, ""), 2: (0, "")}
    assert launch.launch_local([], 3, 1, None) == 3                     # a signal on rank 0: the failure code
    assert capsys.readouterr().err.splitlines() == ["adaptplan train: rank 0 (edge server) was killed by SIGINT"]


def test_train_distributed_hands_the_launcher_every_flag_after_train(monkeypatch) -> None:
    from adaptplan.cli import main
    from trainers.distributed import launch

    monkeypatch.delenv("RANK", raising=False)
    seen = []
    monkeypatch.setattr(launch, "launch_local", lambda args, world, devices, out: seen.append((args, world, devices, out))
                        or 0)
    argv = ["--algorithm", "psl", "--distributed", "--devices", "3", "--ranks", "4", "--dataset", "synthetic",
            "--rounds", "1", "--cuts", "2", "--no-progress"]
    assert main(["train", *argv]) == 0
    assert seen == [(argv, 4, 3, None)]
