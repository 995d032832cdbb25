"""The distributed runtime's modules checked in one process, without rank processes
(docs/distributed.md): rank layout, stage ledgers, link emulation and rates, the predicted-vs-measured
table, the launcher's failure lines and environment, the transport, the rank loop and sessions.

Every collaborator of the unit under test is a small fake written here (a channel that records what
is sent and answers from a script, a ``torch.distributed`` stand-in that moves tensors through
queues, fake rank processes for the launcher), so each test runs in well under a second. The
references are written out in the tests: the layout rule (rank 0 edge, rank 1 fed, device i on
rank 2 + i mod (W − 2)), a message's bytes (an int64 length, then the wire frame), the
emulated delay 8·bytes / rate, and the exact lines a failing run prints."""

from __future__ import annotations

import json
import math
import pickle
import queue
import signal
import threading
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from adaptplan.errors import InputError
from trainers.distributed import environment, launch, serve, session, timing, transport
from trainers.distributed import network as network_module
from trainers.distributed import wire as wire_format
from trainers.distributed.control import Abort, DeviceSpec, Envelope, Layout, LinkRates, Ready, Report, RoleError, Setup, Stop
from trainers.distributed.environment import run_key
from trainers.distributed.layout import EDGE_RANK, FED_RANK, RankLayout, default_world_size
from trainers.distributed.network import RankNetwork
from trainers.distributed.serve import RankLoop
from trainers.distributed.transport import AbortRun, Channel, FrameRefused, PeerError
from trainers.roles.checks import schema_of
from trainers.roles.defences import ActivationDefence
from trainers.roles.messages import Activation, BlockState, CutGradient, MessageMismatchError, ModelDownload, ModelUpload, NonFiniteError
from trainers.roles.optim import OptimizerSpec
from trainers.roles.protocol import EDGE, FED, Average, Blocks, Forward, GetState, RoundEnd, Send, State, Take, Upload
from trainers.run.history import History, RoundRecord


# ---- from test_distributed_contracts.py (merged by subject) ----------------------------------------
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
        self.forgotten: list[int] = []
        self.restarted_ranks: set[int] = set()
        self.admitted: list[int] = []

    def send(self, obj: Any, dst: int, rate: float | None = None, charged_bytes: int | None = None) -> None:
        self.sent.append((dst, obj, rate, charged_bytes))

    def recv(self, src: int, timeout: float | None = None, deadline: float | None = None) -> Any:
        self.recv_calls.append((src, timeout))
        item = self.replies[src].pop(0)
        if callable(item):                      # built when it is received (e.g. an error naming a peer)
            item = item()
        if isinstance(item, BaseException):
            raise item
        return item if isinstance(item, Envelope) else Envelope(item, 0.0)

    def recv_many(self, sources, timeout: float | None = None):
        return [(s, self.recv(s, timeout)) for s in sources]

    def close(self) -> None:
        self.closed = True

    def forget(self, rank: int, why: str) -> None:
        self.forgotten.append(rank)

    rejoining = False                        # (a new process of its rank: MQTT only)

    def waiting(self, src: int) -> bool:
        return bool(self.replies.get(src))

    def take_waiting(self, src: int, kind: type) -> Envelope | None:
        waiting = self.replies.get(src, [])
        while waiting:
            item = waiting.pop(0)
            if isinstance(item, kind):
                return Envelope(item, 0.0)
        return None

    def restarted(self, rank: int) -> bool:
        return rank in self.restarted_ranks

    def admit(self, rank: int) -> None:
        self.restarted_ranks.discard(rank)
        self.admitted.append(rank)

    def flush(self, timeout: float | None = None, skip_lost: bool = False) -> None:
        self.flushed.append(timeout if not skip_lost else (timeout, "skip lost"))



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

    def all_gather(self, out: list, tensor: torch.Tensor, group: Any = None) -> None:
        """The session exchange: this rank's own, and a made-up one for each peer (:func:`peer_session`)."""
        for r, t in enumerate(out):
            t.copy_(tensor if r == self.rank else torch.tensor(list(bytes.fromhex(peer_session(r))), dtype=torch.uint8))
        self.mine = bytes(tensor.tolist()).hex()

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
        """``obj`` in an envelope framed as rank ``src``'s next frame to this rank (or with ``key``/``seq`` given)."""
        obj = obj if isinstance(obj, Envelope) else Envelope(obj, time.time())
        if seq is None:
            seq = self.seq.get(src, 0)
            self.seq[src] = seq + 1
        frame = wire_format.encode(obj, src, self.rank, seq, KEY if key is None else key, peer_session(src), self.mine)
        self.deliver_bytes(src, frame)

    def deliver_bytes(self, src: int, frame: bytes, length: int | None = None) -> None:
        payload = torch.frombuffer(bytearray(frame), dtype=torch.uint8)
        self.wire[src].put(torch.tensor([len(frame) if length is None else length], dtype=torch.int64))
        self.wire[src].put(payload)

    def cut(self, src: int, text: str) -> None:
        self.wire[src].put(RuntimeError(text))


KEY = b"k" * 32


def peer_session(rank: int) -> str:
    """The session the fake process group gives peer ``rank``."""
    return f"{rank + 1:016x}"


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


def test_a_message_is_its_length_then_its_numbered_authenticated_frame(wire, monkeypatch) -> None:
    fake, channel = wire
    monkeypatch.setattr(transport.time, "time", lambda: 42.5)
    obj = Forward(3, [(1, 16)])
    channel.send(obj, 2, rate=8e6)
    channel.send(Stop(), 2)
    channel.send(Stop(), 3)
    channel.flush()
    expected = wire_format.encode(Envelope(obj, 42.5, 8e6), 0, 2, 0, KEY, channel.session, peer_session(2))
    to_2 = [t for d, t in fake.sent if d == 2]                        # one sending thread per destination
    header, payload = to_2[:2]
    assert header.dtype == torch.int64 and header.tolist() == [len(expected)]
    assert payload.dtype == torch.uint8 and payload.numpy().tobytes() == expected
    second = wire_format.decode(to_2[3].numpy(), KEY)
    assert (second.src, second.dst, second.seq, second.value) == (0, 2, 1, Envelope(Stop(), 42.5))   # numbered per pair
    third = wire_format.decode([t for d, t in fake.sent if d == 3][1].numpy(), KEY)
    assert (third.dst, third.seq) == (3, 0)
    assert len(fake.sent) == 6


@pytest.mark.parametrize("case, why", [
    ("other key", "its authentication tag is wrong"),
    ("replayed", r"it is numbered 2→0 #0, not 2→0 #1 \(replayed"),
    ("misdirected", r"it is numbered 2→3 #1, not 2→0 #1"),
    ("pickle", "it is not an adaptplan frame"),
    ("oversized", "its length 2147483649 bytes is outside"),
    ("no envelope", "it holds a dict, not an Envelope"),
])
def test_a_refused_frame_names_its_sender_on_every_later_wait(wire, case: str, why: str) -> None:
    fake, channel = wire
    fake.deliver(2, Stop())
    assert channel.recv(2).msg == Stop()
    if case == "other key":
        fake.deliver(2, Stop(), key=b"q" * 32)
    elif case == "replayed":
        fake.deliver(2, Stop(), seq=0)
    elif case == "misdirected":
        fake.deliver_bytes(2, wire_format.encode(Envelope(Stop(), 0.0), 2, 3, 1, KEY, peer_session(2), fake.mine))
    elif case == "pickle":
        fake.deliver_bytes(2, pickle.dumps({"op": "x"}))
    elif case == "no envelope":
        fake.deliver_bytes(2, wire_format.encode({"op": "x"}, 2, 0, 1, KEY, peer_session(2), fake.mine))
    else:
        fake.deliver_bytes(2, b"x", length=wire_format.MAX_FRAME_BYTES + 1)
    for _ in range(2):
        with pytest.raises(FrameRefused, match=rf"^rank 2 \(device 0\) sent rank 0 a frame it refused: {why}"):
            channel.recv(2)
    fake.deliver(1, Layout(3))                                          # the other peers are unaffected
    assert channel.recv(1).msg == Layout(3)


def test_received_envelopes_are_stamped_with_their_arrival_and_kept_in_order(wire) -> None:
    fake, channel = wire
    before = time.time()
    fake.deliver(3, Layout(1))
    fake.deliver(3, Envelope(Layout(2), 1.0, arrived=1.5))             # a sender's stamp is replaced
    first, second = channel.recv(3), channel.recv(3)
    assert first.msg == Layout(1) and first.arrived >= before
    assert second.msg == Layout(2) and second.t_send == 1.0 and second.arrived >= before
    fake.deliver(1, "a")
    fake.deliver(2, "b")
    fake.deliver(2, "c")
    assert [(src, e.msg) for src, e in channel.recv_many([2, 1, 2])] == [(2, "b"), (1, "a"), (2, "c")]


def test_abort_and_role_errors_are_raised_where_they_are_received(wire) -> None:
    fake, channel = wire
    fake.deliver(1, Abort("rank 0 (edge server) lost rank 3"))
    with pytest.raises(AbortRun, match=r"^rank 0 \(edge server\) lost rank 3$"):
        channel.recv(1)
    for error, kind, text, raised in [(NonFiniteError, "nonfinite", "NaN or inf in x at round 2, device 0", None),
                                      (MessageMismatchError, "mismatch", "tags differ", None),
                                      (InputError, "input", "--data-root: 10 samples here",
                                       "device 0: --data-root: 10 samples here"),
                                      (MessageMismatchError, "?", "odd", None)]:     # an unknown kind: a mismatch
        fake.deliver(2, RoleError(kind, text))
        with pytest.raises(error) as info:
            channel.recv(2)
        assert str(info.value) == (raised or text)
    assert transport.role_error(InputError("x", field="--model")) == RoleError("input", "--model: x")
    fake.deliver(2, Forward(1, []))
    assert channel.recv(2).msg == Forward(1, [])


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
    assert channel.recv(2).msg == {"late": True}                         # it still arrives for the next wait


def test_a_failed_send_is_reported_at_flush_and_at_the_next_send(wire) -> None:
    fake, channel = wire
    fake.fail_send[3] = "Connection reset by peer\ndetails"
    channel.send({"op": "ping"}, 2)
    channel.send({"op": "report"}, 3)
    expected = r"^rank 3 \(device 1\) stopped receiving \(it died or was killed\)$"
    with pytest.raises(PeerError, match=expected):
        channel.flush()
    assert [(d, decode(t).msg) for d, t in fake.sent if t.dtype == torch.uint8] == [(2, {"op": "ping"})]  # others unaffected
    with pytest.raises(PeerError, match=expected):
        channel.send({"op": "stop"}, 3)


# ---- rank 0's network ---------------------------------------------------------------------------------------------
def _envelope(msg: Any, t_send: float = 0.0, arrived: float = 0.0, rate=None, charged=None) -> Envelope:
    return Envelope(msg, t_send, rate, charged, arrived)


def _network(replies: dict | None = None, emulate: bool = False, world: int = 4, devices: int = 3) -> RankNetwork:
    return RankNetwork(ScriptedChannel(replies=replies), RankLayout(world, devices), emulate,
                       {"dataset": "synthetic", "model": "mlp", "model_width": 4})


def _expecting(net: RankNetwork, rows: dict[int, int], width: int = 3, round_index: int = 2) -> RankNetwork:
    """``net`` as rank 0's network after set-up and after asking ``rows`` of devices (at cut 1, ``width`` features
    an activation) in round ``round_index``, so that it takes their activations (trainers.roles.checks)."""
    from trainers.roles.checks import ActivationRule

    net.engine = SimpleNamespace(num_blocks=2, defence=ActivationDefence(), cuts=[1] * net.layout.num_devices, upload_schema={})
    net.rules = {1: ActivationRule((width,), torch.float32, 3)}
    net.asked.update(rows)
    net.expected.update({d: Activation for d in rows})
    net.asked_round.update({d: round_index for d in rows})
    return net


def _engine_view(cuts: list[int]):
    """What RankNetwork.setup reads from the engine."""
    x = torch.randn(12, 1, 2, 2)
    data = SimpleNamespace(x_train=x, parts=[[0, 1, 2], [3, 4, 5, 6], [7, 8]])
    strategy = SimpleNamespace(allows_absence=True, name="scala", stage_spec=dict)
    return SimpleNamespace(template=_chain(), num_blocks=len(_chain()), data=data, cuts=cuts, batch_size=2, num_classes=3,
                           defence=ActivationDefence(), strategy=strategy)


def test_setup_sends_each_device_rank_sample_positions_and_weights_never_samples() -> None:
    net = _network({2: [_envelope(Ready([0, 2]))], 3: [_envelope(Ready([1]))]})
    spec = OptimizerSpec("sgd", 0.1)
    assert net.setup(_engine_view([1, 2, 1]), spec, 7) is net
    setups = {dst: obj for dst, obj, *_ in net.channel.sent}
    assert sorted(setups) == [2, 3]
    assert setups[2].source == {"dataset": "synthetic", "model": "mlp", "model_width": 4, "num_train": 12, "num_classes": 3}
    assert sorted(setups[2].devices) == [0, 2] and sorted(setups[3].devices) == [1]
    d2 = setups[2].devices[2]
    assert (d2.cut, d2.positions.tolist(), d2.batch_size, d2.seed, d2.optimizer) == (1, [7, 8], 2, [7, 2], spec)
    assert d2.positions.dtype == torch.int64
    assert [list(s) for s in setups[3].initial] == [list(b.state_dict()) for b in _chain()]
    tensors = [t for obj in setups.values() for d in obj.devices.values() for t in [d.positions]] + \
        [t for obj in setups.values() for block in obj.initial for t in block.values()]
    assert not [t for t in tensors if t.dtype.is_floating_point and t.shape[-3:] == (1, 2, 2)]   # no sample
    assert net.channel.recv_calls == [(2, 120.0), (3, 120.0)]            # ready: SETUP_TIMEOUT_FACTOR time-outs
    assert net.template is not None and len(net.template) == 2           # evaluation builds device blocks from it
    assert (net.tolerant, net.algorithm) == (True, "scala")              # the strategy says whether a rank may go


def test_a_network_that_follows_another_sets_the_ranks_up_for_the_new_model(capsys) -> None:
    """A change of model (FedConcat's second stage): the new network empties the fed server's global models first,
    names the stage in the set-up (the algorithm and its ``stage_spec``), keeps out the device ranks the previous one
    took out (their set-up kept for a new process of theirs, none sent or awaited) and the one that was setting up
    again (one line says so)."""
    from trainers.roles.protocol import SetState

    first = _network()
    first.lost, first.returning, first.setting_up, first.algorithm = {3: "rank 3 is gone"}, {3}, {}, "fedconcat"
    engine = _engine_view([3, 3, 3])
    engine.strategy = SimpleNamespace(allows_absence=True, name="fedconcat", stage_spec=lambda: {"encoders": 2})
    net = RankNetwork(ScriptedChannel(replies={2: [_envelope(Ready([0, 2]))]}), RankLayout(4, 3), False,
                      {"dataset": "synthetic", "model": "mlp", "model_width": 4}, previous=first)
    assert net.setup(engine, OptimizerSpec("sgd", 0.1), 7) is net
    (to_fed, reset, *_), (to_rank, setup, *_) = net.channel.sent
    assert (to_fed, reset) == (FED_RANK, SetState(None, {})) and to_rank == 2
    assert setup.source["stage"] == {"algorithm": "fedconcat", "encoders": 2}
    assert net.channel.recv_calls == [(2, 120.0)] and net.lost == {3: "rank 3 is gone"} and net.returning == {3}
    assert sorted(net._setups) == [2, 3] and net._setups[3].source["stage"] == setup.source["stage"]
    ready = {2: [_envelope(Ready([0, 2]))], 3: [_envelope(Ready([1]))]}
    assert "stage" not in _network(ready).setup(_engine_view([1, 2, 1]), OptimizerSpec("sgd", 0.1), 7).channel.sent[0][1].source
    first.setting_up = {3: 0.0}
    RankNetwork(ScriptedChannel(), RankLayout(4, 3), False, {}, previous=first)
    assert "rank 3 (device 1) was setting up again when fedconcat moved to another model; it stays out" in \
        capsys.readouterr().err


def test_messages_go_to_the_rank_of_their_device_and_the_fed_server_to_rank_1() -> None:
    net = _network(world=4, devices=3)
    assert net.hosts([2, 1, 0]) == [[2, 0], [1]]
    net.send(1, Forward(3, [(1, 8)]))
    net.send(FED, Average(3))
    net.send(2, CutGradient(2, 3, 1, None))
    assert [(dst, type(obj).__name__, rate) for dst, obj, rate, _ in net.channel.sent] == \
        [(3, "Forward", None), (1, "Average", None), (2, "CutGradient", None)]


def test_received_activations_book_the_uplink_and_the_first_reply_the_servers_work(monkeypatch) -> None:
    now = [100.0]
    _clock(monkeypatch, network_module, now)
    act = Activation(1, 2, 1, torch.zeros(4, 3), torch.zeros(4, dtype=torch.long))
    net = _expecting(_network({3: [_envelope(act, t_send=99.5, arrived=99.75)]}), {1: 4})
    assert net.receive([1]) == [act]
    now[0] = 100.25
    net.send(1, CutGradient(1, 2, 1, torch.zeros(4, 3)))
    net.send(1, CutGradient(1, 2, 1, torch.zeros(4, 3)))                   # booked once per group
    assert net.ledger.seconds["uplink"] == {1: 0.25}
    assert net.ledger.seconds["server"] == {"edge": 0.25}


def test_link_rates_go_to_every_rank_and_on_every_message_only_when_emulating() -> None:
    system = SimpleNamespace(devices=[SimpleNamespace(up_bps=1e6, down_bps=2e6, fed_up_bps=3e6, fed_down_bps=4e6)] * 3,
                             edge_to_fed_bps=5e6, fed_to_edge_bps=6e6)
    clock = SimpleNamespace(system=lambda t: system)
    quiet = _network()
    quiet.begin_round(1, clock)
    assert quiet.channel.sent == [] and quiet.rates is None
    net = _network(emulate=True)
    net.begin_round(1, clock)
    assert [dst for dst, *_ in net.channel.sent] == [1, 2, 3]
    rates = net.channel.sent[0][1]
    assert rates.devices[2] == {"up_bps": 1e6, "down_bps": 2e6, "fed_up_bps": 3e6, "fed_down_bps": 4e6}
    assert (rates.edge_to_fed_bps, rates.fed_to_edge_bps) == (5e6, 6e6)
    net.send(2, CutGradient(2, 1, 1, None))
    net.send(FED, ModelUpload(0, 1, "edge", {}, 1.0))
    net.send(0, ModelDownload(0, 1, "device", {}, cut=2))
    assert [rate for *_, rate, _ in net.channel.sent[3:]] == [2e6, 5e6, 4e6]


def test_the_rounds_end_merges_every_ranks_report_per_role_and_the_engine_takes_the_longest() -> None:
    from trainers.engine.clock import stage_maxima

    reports = {1: [_envelope(Report({"model upload": {0: 0.5, 1: 0.25}}))],
               2: [_envelope(Report({"device FP": {0: 0.125, 2: 0.375}}))],
               3: [_envelope(Report({"device FP": {1: 0.25}, "uplink": {1: 0.25}}))]}
    net = _network(reports)
    net.ledger.add(1, "uplink", 0.5)
    by_role = net.end_round(4)
    assert by_role == {"uplink": {"1": 0.75}, "device FP": {"0": 0.125, "2": 0.375, "1": 0.25},
                       "model upload": {"0": 0.5, "1": 0.25}}                 # one role's seconds add up
    assert stage_maxima(by_role) == {"uplink": 0.75, "device FP": 0.375, "model upload": 0.5}
    assert [(dst, obj) for dst, obj, *_ in net.channel.sent] == [(1, RoundEnd(4)), (2, RoundEnd(4)), (3, RoundEnd(4))]
    assert net.ledger.seconds["uplink"] == {}                            # taken: the next round starts empty


def test_device_blocks_are_fetched_once_until_a_message_changes_the_device() -> None:
    chain = _chain()
    states = [block.state_dict() for block in chain]
    net = _network({2: [_envelope(Blocks(0, states[:1])), _envelope(Blocks(0, states[:2]))]})
    net.template, net.engine = chain, SimpleNamespace(num_blocks=2, defence=ActivationDefence(), cuts=[1, 1, 1], upload_schema=schema_of(states))
    first = net.device_blocks(0)
    assert len(first) == 1 and net.device_blocks(0) is first
    assert torch.equal(first[0].weight, chain[0].weight) and first[0] is not chain[0]
    net.engine.cuts[0] = 2                              # (the engine's cuts change before their downloads go out)
    net.send(0, ModelDownload(0, 1, "device", {}, cut=2))
    assert len(net.device_blocks(0)) == 2
    assert [type(obj).__name__ for _, obj, *_ in net.channel.sent] == ["GetBlocks", "ModelDownload", "GetBlocks"]


# ---- the other ranks' loop ---------------------------------------------------------------------------------------------
def _loop(rank: int, replies: dict | None = None, world: int = 4, devices: int = 3) -> RankLoop:
    channel = ScriptedChannel(replies=replies)
    channel.rank = rank
    return RankLoop(channel, RankLayout(world, devices), 30.0)


class RecordingHost:
    def __init__(self, emits: list | None = None) -> None:
        self.handled: list[Any] = []
        self.emits = emits or []

    def handle(self, msg: Any, emit) -> None:
        self.handled.append(msg)
        for to, out in self.emits:
            emit(to, out)


def test_a_device_rank_times_each_devices_forward_and_sends_its_activation_at_once(monkeypatch) -> None:
    ticks = iter([1.0, 1.25, 2.0, 2.5])
    monkeypatch.setattr(serve.time, "perf_counter", lambda: next(ticks))
    loop = _loop(2)
    act = Activation(0, 3, 1, torch.zeros(2, 3), torch.zeros(2, dtype=torch.long))
    loop.host = RecordingHost([(EDGE, act)])
    loop.dispatch(_envelope(Forward(3, [(0, 8), (2, 4)], True)))
    assert loop.host.handled == [Forward(3, [(0, 8)], True), Forward(3, [(2, 4)], True)]
    assert loop.ledger.seconds["device FP"] == {0: 0.25, 2: 0.5}
    assert [(dst, obj) for dst, obj, *_ in loop.channel.sent] == [(0, act), (0, act)]


def test_a_take_reads_the_named_rank_and_books_the_transfer(monkeypatch) -> None:
    _clock(monkeypatch, timing, [10.0])
    upload = ModelUpload(1, 2, "device", {0: _state(1.0)}, 3.0)
    fed = _loop(1, {3: [_envelope(upload, t_send=9.0, arrived=9.5)]})
    fed.dispatch(_envelope(Take(1)))
    assert fed.channel.recv_calls == [(3, None)]                       # device 1 lives on rank 3
    assert fed.ledger.seconds["model upload"] == {1: 0.5}
    assert torch.equal(fed.host.fed.finish(2)[0, 0].state["weight"], torch.full((2, 2), 1.0))   # folded into the average
    kept = ModelUpload(0, 2, "device", {0: _state(4.0)}, 1.0)
    fed.channel.replies[2] = [_envelope(kept, t_send=9.0, arrived=9.25)]
    fed.dispatch(_envelope(Take(0, keep=5)))
    assert fed.host.kept == {5: kept} and fed.host.fed._running == {}   # kept for a hand-off, not averaged
    assert fed.ledger.seconds["model upload"] == {1: 0.5, 0: 0.25}


def test_an_emulated_take_waits_for_the_link(monkeypatch) -> None:
    now = [10.0]
    _clock(monkeypatch, timing, now)
    slept: list[float] = []
    monkeypatch.setattr(timing.time, "sleep", lambda s: slept.append(s) or now.__setitem__(0, now[0] + s))
    upload = ModelUpload(0, 2, "device", {0: _state(1.0)}, 1.0)            # 16 bytes: 128 bits
    fed = _loop(1, {2: [_envelope(upload, t_send=9.5, arrived=9.75, rate=32.0)]})
    fed.dispatch(_envelope(Take(0)))
    assert slept == [pytest.approx(3.5)]                                  # due at 9.5 + 128/32 = 13.5
    assert fed.ledger.seconds["model upload"] == {0: pytest.approx(4.0)}


def test_a_rank_reports_its_seconds_at_the_rounds_end_and_a_role_error_goes_to_rank_0() -> None:
    loop = _loop(2)
    loop.host = RecordingHost()
    loop.ledger.add(0, "device BP", 0.5)
    loop.dispatch(_envelope(RoundEnd(3)))
    assert loop.host.handled == [RoundEnd(3)]
    (dst, report, *_), = loop.channel.sent
    assert dst == 0 and report.seconds == {"device BP": {0: 0.5}} and loop.ledger.seconds["device BP"] == {}

    class Diverged(RecordingHost):
        def handle(self, msg, emit):
            raise NonFiniteError("NaN or inf in client model block 1 at round 3, device 0")

    loop.host = Diverged()
    loop.channel.replies = {0: [_envelope(RoundEnd(3)), _envelope(Stop())]}
    loop.serve()
    assert loop.channel.sent[-1][:2] == (0, RoleError("nonfinite", "NaN or inf in client model block 1 at round 3, device 0"))


def test_the_fed_rank_sends_on_what_a_send_names_charged_as_the_message_says() -> None:
    loop = _loop(1)
    loop.host.fed.add(ModelUpload(0, 1, "device", {0: _state(2.0)}, 1.0))
    loop.dispatch(_envelope(Average(1)))
    loop.dispatch(_envelope(Send(EDGE, -1, 1, "edge", {0: ("avg", 0)}, charged_bytes=24)))
    loop.dispatch(_envelope(Send(2, 2, 1, "device", {0: ("avg", 0)})))
    (d2, to_edge, _, c2), (d3, to_device, _, c3) = loop.channel.sent
    assert (d2, c2, to_edge.receiver) == (0, 24, "edge") and (d3, c3, to_device.device) == (2, None, 2)
    assert torch.equal(to_device.blocks[0].state["weight"], torch.full((2, 2), 2.0))


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
    assert FakeEdgeSession.made[-1].aborted == ["rank 0 (edge server) stopped: rank 3 (devices 1, 3) closed its connection "
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
        c.rank = rank
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
    monkeypatch.setattr(session, "use_cpu", lambda n: None)
    return session.serve_rank(serve.WorkerOptions(2.0)), made[0]


def test_a_serving_rank_names_the_peer_it_lost_by_role(monkeypatch, capsys) -> None:
    def device_dies(c):
        c.replies[3] = [lambda: PeerError(3, c.describe(3), "closed its connection (it died or was killed)")]

    code, channel = _serve(monkeypatch, 1, [Layout(4), Take(1), device_dies,
                                            AbortRun("rank 0 (edge server) stopped: rank 3 (devices 1, 3) closed")])
    assert code == 3
    assert channel.sent[0][:2] == (EDGE_RANK, RoleError("lost", "closed its connection (it died or was killed)", 3))
    assert capsys.readouterr().err == ("adaptplan train: rank 1 (fed server) stopped: rank 0 (edge server) stopped: "
                                       "rank 3 (devices 1, 3) closed\n")    # the fed server reported it and served on
    assert channel.recv_calls[0] == (EDGE_RANK, 20.0)                   # the layout: SETUP_TIMEOUT_FACTOR time-outs

    def edge_dies(c):
        c.replies[0] = [Layout(4), PeerError(0, c.describe(0), "closed its connection (it died or was killed)")]

    code, channel = _serve(monkeypatch, 2, [edge_dies])
    assert code == 3 and capsys.readouterr().err == ("adaptplan train: rank 2 (devices 0, 2) ended: rank 0 (edge server) "
                                                     "closed its connection (it died or was killed)\n")


def test_a_serving_rank_relays_rank_0s_abort_and_stops_cleanly_otherwise(monkeypatch, capsys) -> None:
    code, _ = _serve(monkeypatch, 2, [Layout(4), AbortRun("rank 0 (edge server) lost rank 3 (devices 1, 3) sent nothing")])
    assert code == 3
    assert capsys.readouterr().err == ("adaptplan train: rank 2 (devices 0, 2) stopped: rank 0 (edge server) lost "
                                       "rank 3 (devices 1, 3) sent nothing\n")
    code, channel = _serve(monkeypatch, 1, [Layout(4), Stop()])
    assert code == 0 and channel.closed and channel.flushed == [(2.0, "skip lost")] and capsys.readouterr().err == ""
    code, channel = _serve(monkeypatch, 1, [Layout(4), Stop(lost=[3])])      # rank 0 took rank 3 out of the run
    assert code == 0 and channel.forgotten == [3]


# ---- the launcher -------------------------------------------------------------------------------------------------------
class FakeRank:
    """A rank process: ``plan[rank]`` = (exit code or None for one that never ends, its stderr[, the seconds
    after its start when it ends: running until then])."""

    plan: dict[int, tuple] = {}
    started: list["FakeRank"] = []

    def __init__(self, command, env, stdout=None, stderr=None) -> None:
        self.rank = int(env["RANK"])
        self.command, self.env = command, env
        self.code, text, *after = FakeRank.plan[self.rank]
        self.ends_at = time.monotonic() + (after[0] if after else 0.0)
        self.terminated = False
        if stderr is not None:
            stderr.write(text.encode())
        FakeRank.started.append(self)

    def poll(self):
        return self.code if self.terminated or time.monotonic() >= self.ends_at else None

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


def test_an_interrupted_run_leaves_rank_0_to_say_where_to_resume(ranks, tmp_path, capsys) -> None:
    """Ctrl-C or SIGTERM: rank 0 stops at the end of a round (exit 128 + the signal) and says where the run
    continues from itself; the launcher adds nothing, not even a line for the device rank lost earlier that
    the run went on without."""
    (tmp_path / "checkpoint.pt").write_bytes(b"x")
    ranks.plan = {0: (128 + signal.SIGINT, ""), 1: (0, ""), 2: (0, ""), 3: (-signal.SIGKILL, "")}
    assert launch.launch_local([], 4, 3, str(tmp_path), partial=True) == 130
    assert capsys.readouterr().err == ""
    ranks.plan = {0: (128 + signal.SIGTERM, ""), 1: (0, ""), 2: (-signal.SIGKILL, ""), 3: (0, "")}
    assert launch.launch_local([], 4, 3, str(tmp_path), partial=True) == 143
    assert capsys.readouterr().err == ""


def test_the_resume_command_names_the_runtime_the_run_ran_on() -> None:
    from trainers.config.train_config import RuntimeConfig
    from trainers.run.folder import Interrupted

    assert [RuntimeConfig().resume_command("r"), RuntimeConfig(distributed=True).resume_command("r"),
            RuntimeConfig(distributed=True, transport="mqtt").resume_command("r")] == [
        "adaptplan train --out r --resume", "adaptplan train --out r --resume --distributed",
        "adaptplan train --out r --resume --runtime mqtt"]
    assert str(Interrupted(signal.SIGINT, 7, "r", RuntimeConfig(distributed=True, transport="mqtt").resume_command("r"))) \
        == ("interrupted by SIGINT after round 7; checkpoint and history saved in 'r' — continue with: adaptplan train "
            "--out r --resume --runtime mqtt")
    assert str(Interrupted(signal.SIGTERM, 3, "r", RuntimeConfig().resume_command("r"))).endswith(
        "continue with: adaptplan train --out r --resume")
    assert str(Interrupted(signal.SIGTERM, 3, None)) == "interrupted by SIGTERM after round 3"


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


def test_a_killed_device_rank_gives_rank_0_its_time_out_to_stop_the_others(ranks, tmp_path, capsys,
                                                                           monkeypatch) -> None:
    """Issue 36 M3: a device rank killed under a synchronous algorithm; rank 0 notices only after --rank-timeout
    (over MQTT) and aborts the others. The launcher waits for that instead of terminating every rank 5 s after
    the kill: one line for the killed rank, none for the ranks rank 0 stopped."""
    monkeypatch.setattr(launch, "GRACE_SECONDS", 0.05)
    ranks.plan = {0: (3, "", 0.3), 1: (3, "adaptplan train: rank 1 (fed server) stopped: rank 3 lost\n", 0.33),
                  2: (3, "adaptplan train: rank 2 (devices 0, 2) stopped: rank 3 lost\n", 0.33), 3: (-signal.SIGKILL, "")}
    assert launch.launch_local([], 4, 3, None, detect_seconds=0.6) == 3
    assert not any(p.terminated for p in ranks.started)
    assert capsys.readouterr().err.splitlines() == ["adaptplan train: rank 3 (device 1) was killed by SIGKILL"]
    ranks.plan = {0: (None, ""), 1: (None, ""), 2: (None, ""), 3: (-signal.SIGKILL, "")}    # a rank 0 that never
    start = time.monotonic()                                                 # notices: the others are terminated
    assert launch.launch_local([], 4, 3, None, detect_seconds=0.1) == 3      # after GRACE + detect_seconds
    assert [p.rank for p in ranks.started[-4:] if p.terminated] == [0, 1, 2] and time.monotonic() - start < 5
    assert "rank 0 (edge server) did not stop within 0.05 s" in capsys.readouterr().err


def test_once_rank_0_has_ended_the_others_get_a_fresh_grace_not_the_rest_of_its_time_out(ranks, capsys,
                                                                                         monkeypatch) -> None:
    """A hanging device rank (SIGSTOP: it ignores SIGTERM) named by rank 0, which then ends, as the fed server did
    before it: the launcher stops the hanging rank GRACE_SECONDS after rank 0's end, not after the whole allowance
    for rank 0 to notice (detect_seconds, counted from the fed server's end), which would be a minute here."""
    monkeypatch.setattr(launch, "GRACE_SECONDS", 0.05)
    ranks.plan = {0: (3, "", 0.2), 1: (3, "adaptplan train: rank 1 (fed server) stopped: rank 2 lost\n", 0.1),
                  2: (None, "")}
    start = time.monotonic()
    assert launch.launch_local([], 3, 3, None, detect_seconds=60.0) == 3
    assert time.monotonic() - start < 10                                  # 60 s with the allowance kept
    assert [p.rank for p in ranks.started if p.terminated] == [2]
    assert capsys.readouterr().err.splitlines() == [
        "adaptplan train: rank 2 (devices 0, 1, 2) did not stop within 0.05 s of the failure and was terminated"]


def test_train_distributed_hands_the_launcher_every_flag_after_train(monkeypatch) -> None:
    from adaptplan.cli import main
    from trainers.distributed import launch

    monkeypatch.delenv("RANK", raising=False)
    seen = []
    monkeypatch.setattr(launch, "launch_local", lambda args, world, devices, out, runtime, partial, detect_seconds,
                        largest_frame_bytes: seen.append((args, world, devices, out, runtime, partial))
                        or detects.append(detect_seconds) or frames.append(largest_frame_bytes) or 0)
    detects: list[float] = []
    frames: list[int | None] = []
    argv = ["--algorithm", "psl", "--distributed", "--devices", "3", "--ranks", "4", "--dataset", "synthetic",
            "--rounds", "1", "--cuts", "2", "--no-progress"]
    assert main(["train", *argv]) == 0
    assert seen == [(argv, 4, 3, None, "gloo", False)]
    assert main(["train", *argv, "--rank-timeout", "7"]) == 0 and detects[-2:] == [24.0, 14.0]  # 2 × --rank-timeout (12 s default)
    seen.pop()
    mqtt = ["--runtime", "mqtt", *argv[3:]]
    assert main(["train", *mqtt]) == 0
    assert seen[-1] == (mqtt, 4, 3, None, "mqtt", False)
    from trainers.config.train_config import TrainConfig
    from trainers.distributed.frame_bound import largest_frame

    expected = largest_frame(TrainConfig.flat(devices=3, dataset="synthetic", algorithm="psl")).largest
    assert frames[0] is None and frames[-1] == expected        # the broker's limits come from the run's largest frame
    for algorithm, partial in (("scala", True), ("cyclesl", True), ("gas", True), ("gapsl", False), ("sl", False)):
        assert main(["train", *mqtt, "--algorithm", algorithm]) == 0
        assert seen[-1][-1] is partial, algorithm         # a device rank's end is not a failure under these


def _synthetic_source(**changes) -> tuple[dict, list]:
    """What rank 0 sends for the synthetic data set and the mlp of width 4 (built here as rank 0 does)."""
    from profilers.chain import build_chain
    from trainers.inputs.datasets import load_dataset
    from trainers.inputs.models import build_model

    data = load_dataset("synthetic")
    torch.manual_seed(3)
    chain = build_chain(build_model("mlp", (1, 8, 8), 10, 4), data.x_train[:2]).blocks
    source = {"dataset": "synthetic", "model": "mlp", "model_width": 4, "num_train": 2000, "num_classes": 10, **changes}
    return source, [{k: v.clone() for k, v in block.state_dict().items()} for block in chain]


def test_a_device_rank_builds_the_model_here_with_rank_0s_weights_and_its_own_data() -> None:
    source, initial = _synthetic_source()
    chain, samples = serve.local_chain(source, initial, serve.WorkerOptions(), [0])
    x, y, positions = samples(0, np.array([7, 3]))
    assert x.shape == (2000, 1, 8, 8) and y.shape == (2000,) and positions.tolist() == [7, 3]
    assert len(chain) == len(initial) == 3
    assert all(torch.equal(chain[j].state_dict()[k], v) for j, block in enumerate(initial) for k, v in block.items())
    loop = _loop(2, world=4, devices=3)
    devices = {0: DeviceSpec(2, torch.tensor([5, 9, 1999]), 2, [1, 0], OptimizerSpec("sgd", 0.1)),
               2: DeviceSpec(1, torch.tensor([0, 3]), 2, [1, 2], OptimizerSpec("sgd", 0.1))}
    loop.setup(Setup(source, initial, devices))
    assert sorted(loop.host.devices) == [0, 2] and loop.host.devices[0].cut == 2 and loop.host.devices[2].cut == 1
    assert loop.channel.sent[-1][:2] == (0, Ready([0, 2]))
    assert sorted(loop.host.devices[0].sampler.next(3).tolist()) == [5, 9, 1999]     # its own samples, by position


@pytest.mark.parametrize("change, devices, message", [
    ({"num_train": 1999}, None, "this rank's synthetic has 2000 training samples of 10 classes, rank 0's 1999 of 10"),
    ({"num_classes": 9}, None, "rank 0's 2000 of 9: give every rank the same data set"),
    ({"model": "tests/evil.py:factory"}, None, "a device rank imports only code its own command line names"),
    ({"model_width": 8}, None, "rank 0's weights of block 0 do not fit mlp built here"),
    ({}, {1: [0, 2000]}, "device 1's samples lie outside this rank's 2000 training samples"),
    ({}, {1: [-1, 3]}, "device 1's samples lie outside"),
    ({"stage": {"algorithm": "nope", "encoders": 2}}, None, "a later model of an algorithm this rank does not have: 'nope'"),
    ({"stage": {"algorithm": "fedconcat", "encoders": 0}}, None,
     "rank 0's later model cannot be built here: FedConcat's second stage is \\{'encoders': K ≥ 1\\}"),
    ({"stage": {"algorithm": "sfl-v1", "encoders": 2}}, None, "SFLV1 trains one model: it has no model stage"),
    ({"stage": {"algorithm": "fedconcat", "encoders": 2}}, None, "mlp splits into 2 blocks here, 3 on rank 0"),
])
def test_a_device_rank_refuses_a_model_or_data_set_that_differs_from_rank_0s(change, devices, message) -> None:
    source, initial = _synthetic_source(**change)
    loop = _loop(3, world=4, devices=3)
    specs = {i: DeviceSpec(1, torch.tensor(p), 2, [1, i], OptimizerSpec("sgd", 0.1)) for i, p in (devices or {}).items()}
    with pytest.raises(InputError, match=message):
        loop.setup(Setup(source, initial, specs))
    assert loop.channel.sent == []


def test_model_messages_from_rank_0_are_booked_where_they_arrive(monkeypatch) -> None:
    device_rank = _loop(2)
    device_rank.host = RecordingHost()
    download = ModelDownload(0, 1, "device", {0: _state(1.0)}, cut=2)
    device_rank.dispatch(_envelope(download, t_send=5.0, arrived=5.5))
    assert device_rank.host.handled == [download] and device_rank.ledger.seconds["model download"] == {0: 0.5}
    fed = _loop(1)
    fed.dispatch(_envelope(ModelUpload(2, 1, "edge", {0: _state(2.0)}, 1.0), t_send=5.0, arrived=5.25))
    assert fed.ledger.seconds["model upload"] == {"edge": 0.25} and sorted(fed.host.fed._running) == [(0, 0)]


def test_a_local_run_joins_through_its_store_file_not_a_tcp_store(tmp_path, monkeypatch) -> None:
    """With ADAPTPLAN_STORE_FILE the rendezvous is that file (one rank here, in this process): no
    MASTER_ADDR/MASTER_PORT is needed, and none is read."""
    import torch.distributed as dist

    if dist.is_initialized():      # pragma: no cover - another test left a group behind
        pytest.skip("a process group is already initialised in this process")
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("ADAPTPLAN_STORE_FILE", str(tmp_path / "store"))
    try:
        rank, world, group = session.join(5.0)
        assert (rank, world) == (0, 1) and group is not None
        assert (tmp_path / "store").exists()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_an_abort_reaches_every_rank_but_the_dead_one() -> None:
    """Rank 2 is dead (its sends fail): rank 0's abort still goes to ranks 1, 3 and 4 and waits for
    them, passing over the dead one (not stopping at it)."""
    class DeadRank2(ScriptedChannel):
        def send(self, obj, dst, rate=None, charged_bytes=None):
            if dst == 2:
                raise PeerError(2, "device 0", "stopped receiving (it died or was killed)")
            super().send(obj, dst, rate, charged_bytes)

    edge = object.__new__(session.EdgeSession)
    edge._ended = threading.Event()                      # (its heartbeat thread is not started here)
    edge.channel, edge.layout, edge.network = DeadRank2(), RankLayout(5, 3), None
    edge.channel.closing = False
    edge.abort("rank 0 (edge server) stopped: rank 2 (device 0) closed its connection")
    assert [(dst, msg.reason) for dst, msg, *_ in edge.channel.sent] == \
        [(r, "rank 0 (edge server) stopped: rank 2 (device 0) closed its connection") for r in (1, 3, 4)]
    assert edge.channel.flushed == [(5.0, "skip lost")] and edge.channel.closing
    edge.channel = ScriptedChannel()
    edge.channel.restarted_ranks = {3}                   # a new process of rank 3 asked to come back: told too
    edge.abort("rank 0 (edge server) stopped: rank 3 (device 1) was started again as a new process")
    assert edge.channel.admitted == [3] and [dst for dst, *_ in edge.channel.sent] == [1, 2, 3, 4]


# ---- from test_distributed_units.py (merged by subject) ----------------------------------------
def test_rank_layout_spreads_devices_round_robin_over_device_ranks() -> None:
    layout = RankLayout(world_size=4, num_devices=5)          # device ranks 2 and 3
    assert layout.device_ranks == [2, 3]
    assert [layout.rank_of(d) for d in range(5)] == [2, 3, 2, 3, 2]
    assert layout.devices_of(2) == [0, 2, 4] and layout.devices_of(3) == [1, 3]
    assert [layout.describe(r) for r in range(4)] == ["edge server", "fed server", "devices 0, 2, 4", "devices 1, 3"]
    assert RankLayout(3, 1).describe(2) == "device 0"
    with pytest.raises(ValueError, match="at least 3 ranks"):
        RankLayout(2, 4)
    assert [default_world_size(n) for n in (1, 3, 8, 20)] == [3, 5, 10, 10]


def test_stage_ledger_sums_per_participant_and_reports_the_longest() -> None:
    ledger = timing.StageLedger()
    ledger.add(0, "uplink", 0.5)
    ledger.add(0, "uplink", 0.25)           # a device with two steps in a round: its seconds add up
    ledger.add(1, "uplink", 0.6)
    ledger.add("edge", "server", 0.2)
    ledger.add(1, "device FP", -1.0)         # clock noise never makes a stage negative
    ledger.merge({"server": {"edge": 0.1}, "device BP": {2: 0.3}})
    assert ledger.summary() == pytest.approx({"uplink": 0.75, "server": 0.3, "device FP": 0.0, "device BP": 0.3})
    taken = ledger.take()
    assert taken["uplink"] == {0: 0.75, 1: 0.6}
    assert ledger.summary() == {}


def test_emulated_arrival_holds_a_message_for_its_size_over_the_rate(monkeypatch) -> None:
    now = [100.0]
    slept = []
    monkeypatch.setattr(timing.time, "time", lambda: now[0])
    monkeypatch.setattr(timing.time, "sleep", lambda s: slept.append(s))
    # 1,000 bytes over 8,000 bit/s take 1 s: sent at 99.5, due at 100.5 → held 0.5 s from now (100.0)
    assert timing.emulated_arrival(Envelope(None, 99.5, 8000.0, arrived=99.6), 1000) == pytest.approx(100.5)
    assert slept == [pytest.approx(0.5)]
    # arrived later than due: the real arrival counts, nothing held
    assert timing.emulated_arrival(Envelope(None, 98.0, 8000.0, arrived=100.0), 1000) == 100.0
    # no rate (no emulation): the real arrival
    assert timing.emulated_arrival(Envelope(None, 99.5, None, arrived=99.7), 10**9) == 99.7
    assert slept == [pytest.approx(0.5)]
    # charged for more than the message (eq. 25's copies): 3,000 bytes → due at 99.5 + 3 s
    assert timing.emulated_arrival(Envelope(None, 99.5, 8000.0, 3000, arrived=99.6), 1000) == pytest.approx(102.5)
    assert slept[-1] == pytest.approx(2.5)


def test_every_message_takes_its_links_rate_and_books_its_stage(monkeypatch) -> None:
    rates = LinkRates({0: {"up_bps": 1.0, "down_bps": 2.0, "fed_up_bps": 3.0, "fed_down_bps": 4.0}}, 5.0, 6.0)
    act = Activation(0, 1, 1, torch.zeros(1), torch.zeros(1, dtype=torch.long))
    up = ModelUpload(0, 1, "device", {}, 1.0)
    edge_up = ModelUpload(0, 1, "edge", {}, 1.0)
    down = ModelDownload(0, 1, "device", {})
    cases = [(act, 0, EDGE, 1.0), (CutGradient(0, 1, 1, None), EDGE, 0, 2.0), (up, 0, FED, 3.0), (up, 0, EDGE, 1.0),
             (edge_up, EDGE, FED, 5.0), (down, FED, 0, 4.0), (down, FED, EDGE, 6.0), (down, EDGE, 0, 4.0),
             (Forward(1, []), EDGE, 0, None)]
    for msg, sender, to, rate in cases:
        assert timing.link_rate(rates, msg, sender, to) == rate, (msg, sender, to)
        assert timing.link_rate(None, msg, sender, to) is None
    ledger = timing.StageLedger()
    for msg, receiver, who, stage in [(act, EDGE, 0, "uplink"), (up, FED, 0, "model upload"),
                                      (edge_up, FED, "edge", "model upload"), (down, None, 0, "model download"),
                                      (down, EDGE, "edge", "model download"), (CutGradient(0, 1, 1, None), None, 0,
                                                                              "downlink")]:
        assert timing.book_transfer(ledger, Envelope(msg, 10.0, arrived=10.25), receiver) is msg
        assert ledger.take() == {stage: {who: 0.25}}
    assert timing.book_transfer(ledger, Envelope(Forward(1, []), 10.0, arrived=11.0), EDGE) == Forward(1, [])
    assert ledger.take() == {}


def _record(t: int, predicted: dict, measured: dict, round_sim: float, round_wall: float | None) -> RoundRecord:
    return RoundRecord(t, 1.0, None, None, float(t), round_sim, float(t), 0, 0, 0, False, False, [1], 1,
                       stage_seconds=predicted, measured_stage_seconds=measured, measured_round_seconds=round_wall)


def test_stage_comparison_means_over_rounds_with_both_figures() -> None:
    history = History([
        _record(1, {"uplink": 1.0, "server": 0.0}, {"uplink": 1.5, "server": 0.2}, 2.0, 3.0),
        _record(2, {"uplink": 3.0, "server": 0.0, "model upload": 2.0}, {"uplink": 2.5, "server": 0.4,
                                                                          "model upload": 3.0}, 4.0, 5.0),
        _record(3, {"uplink": 9.0}, {}, 9.0, None),        # a simulated round: not compared
    ])
    rows = {r["stage"]: r for r in history.stage_comparison()}
    assert list(rows) == ["uplink", "server", "model upload", "round"]   # STAGES order, then the round
    assert rows["uplink"] == {"stage": "uplink", "predicted_s": 2.0, "measured_s": 2.0, "ratio": 1.0, "rounds": 2}
    assert rows["server"]["ratio"] is None and rows["server"]["measured_s"] == pytest.approx(0.3)
    assert rows["model upload"] == {"stage": "model upload", "predicted_s": 2.0, "measured_s": 3.0, "ratio": 1.5,
                                    "rounds": 1}
    assert rows["round"]["predicted_s"] == 3.0 and rows["round"]["measured_s"] == 4.0
    assert History([_record(1, {"uplink": 1.0}, {}, 1.0, None)]).stage_comparison() == []


def test_history_keeps_measured_seconds_through_json_and_csv(tmp_path) -> None:
    history = History([_record(1, {"uplink": 1.0}, {"uplink": 1.25}, 2.0, 3.5)])
    history.save(tmp_path)
    again = History.load(tmp_path)
    assert again.records[0].measured_stage_seconds == {"uplink": 1.25}
    assert again.records[0].measured_round_seconds == 3.5
    header = (tmp_path / "history.csv").read_text().splitlines()[0].split(",")
    assert "measured_stage_seconds" in header and "measured_round_seconds" in header


def test_launcher_failure_lines(tmp_path) -> None:
    layout = RankLayout(4, 4)
    (tmp_path / "rank1.log").write_text("noise\nadaptplan train: rank 1 (fed server) stopped: rank 0 (edge server) "
                                        "stopped: rank 3 (devices 1, 3) closed its connection\n")
    (tmp_path / "rank2.log").write_text("adaptplan train: rank 2 (devices 0, 2) ended: rank 0 (edge server) closed its "
                                        "connection (it died or was killed)\n")
    (tmp_path / "rank3.log").write_text("")
    line = launch._failure_line
    assert line(0, 0, layout, tmp_path, False) is None
    assert line(0, 3, layout, tmp_path, False) is None                 # rank 0 wrote its own line
    assert line(0, -signal.SIGKILL, layout, tmp_path, False) == "rank 0 (edge server) was killed by SIGKILL"
    assert line(1, 3, layout, tmp_path, False) is None                 # only relayed rank 0's reason
    assert line(2, 3, layout, tmp_path, False) == ("rank 2 (devices 0, 2) ended: rank 0 (edge server) closed its "
                                                   "connection (it died or was killed)")
    assert line(3, -signal.SIGKILL, layout, tmp_path, False) == "rank 3 (devices 1, 3) was killed by SIGKILL"
    assert line(3, 1, layout, tmp_path, False) == "rank 3 (devices 1, 3) exited with code 1"
    assert line(3, -signal.SIGTERM, layout, tmp_path, True) == ("rank 3 (devices 1, 3) did not stop within 5 s of the "
                                                                "failure and was terminated")


def test_rank_environment_is_torchruns_contract_on_loopback(monkeypatch) -> None:
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    env = launch.rank_environment(2, 5, 29500)
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME")} \
        == {"RANK": "2", "LOCAL_RANK": "2", "WORLD_SIZE": "5", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
            "GLOO_SOCKET_IFNAME": "lo"}
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth1")
    assert launch.rank_environment(0, 3, 1)["GLOO_SOCKET_IFNAME"] == "eth1"
    # the launcher's own secret and store replace whatever the user's environment had
    monkeypatch.setenv("ADAPTPLAN_SECRET_FILE", "/elsewhere/secret")
    env = launch.rank_environment(1, 3, 1, secret="s" * 64, store="/tmp/x/store")
    assert "ADAPTPLAN_SECRET_FILE" not in env
    assert (env["ADAPTPLAN_SECRET"], env["ADAPTPLAN_STORE_FILE"]) == ("s" * 64, "/tmp/x/store")


def test_the_store_file_and_the_wire_trace_come_from_the_environment(tmp_path) -> None:
    assert environment.store_file({"ADAPTPLAN_STORE_FILE": "/tmp/a/store"}) == "/tmp/a/store"
    assert environment.store_file({"ADAPTPLAN_STORE_FILE": ""}) is None and environment.store_file({}) is None
    assert environment.wire_trace(2, {}) is None
    record = environment.wire_trace(2, {"ADAPTPLAN_WIRE_TRACE": str(tmp_path)})
    frame = SimpleNamespace(src=0, dst=2, seq=5, tensors=(("float32", (4, 3)), ("int64", (4,))))
    record(frame)
    record(frame)
    lines = (tmp_path / "rank2.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"src": 0, "dst": 2, "seq": 5,
                                                     "tensors": [["float32", [4, 3]], ["int64", [4]]]}] * 2


# ---- churn: ranks taken out of the run and taken back (docs/mqtt.md "Churn") ---------------------------------
class RecordingChannel(transport.FrameChannel):
    """The channel's own logic (numbering, checking, inboxes) with frames handed in by the test and
    sent frames recorded."""

    def __init__(self, rank: int = 0, peers=(1, 2, 3)) -> None:
        super().__init__(rank, list(peers), 0.2, lambda r: f"role {r}", KEY)
        self.out: list[tuple[int, bytes]] = []

    def _transmit(self, dst: int, frame: bytes) -> None:
        self.out.append((dst, frame))

    def _pending(self, dst: int) -> bool:
        return False

    def deliver(self, src: int, msg: Any, seq: int, ses: str | None = None, to: str | None = None) -> bool:
        """``msg`` as ``src``'s frame numbered ``seq``, from its session ``ses`` (default :func:`peer_session`) to this
        process's (or ``to``)."""
        frame = wire_format.encode(Envelope(msg, 0.0), src, self.rank, seq, KEY, peer_session(src) if ses is None else ses,
                                   self.session if to is None else to)
        return self._accept(src, frame, 1.0, duplicates=True)


KEY = b"k" * 32


def test_a_new_process_of_a_peer_restarts_the_numbering_and_is_sent_nothing_until_taken_back() -> None:
    from trainers.distributed.control import Rejoin

    c = RecordingChannel()
    for seq in range(3):
        assert c.deliver(3, Ready([1]), seq)
    c.send(Stop(), 3)
    new = "00000000000000ff"
    c.announce(3, new)                                  # its new process's ready flag
    assert c.deliver(3, Rejoin(), 0, ses=new)           # numbered 0 again: a new process, authenticated
    assert isinstance(c.recv(3, timeout=0.1).msg, Rejoin)  # what its earlier process sent is gone
    assert c.restarted(3)
    with pytest.raises(PeerError, match=r"rank 3 \(role 3\) stopped receiving \(it was started again as a new "
                                        r"process: its models are gone\)"):
        c.send(Stop(), 3)
    c.admit(3)
    assert not c.restarted(3)
    c.send(Layout(3), 3)
    assert wire_format.decode(c.out[-1][1], KEY).seq == 0   # frames to it numbered from 0 too
    assert c.deliver(3, Ready([1]), 1, ses=new) and c.recv(3, timeout=0.1).msg == Ready([1])
    assert wire_format.decode(c.out[-1][1], KEY).to == new  # addressed to the new process
    assert not c.deliver(2, Rejoin(), 5)                 # a Rejoin not numbered 0 is out of sequence: refused


def test_a_process_that_replaces_its_rank_drops_frames_numbered_for_the_earlier_one() -> None:
    c = RecordingChannel(rank=3, peers=(0, 1))
    c._restarting = {0, 1}
    assert c.deliver(0, Layout(3), 57)                  # numbered for the dead process: dropped, not refused
    assert c.take_waiting(0, Layout) is None
    assert c.deliver(0, Layout(3), 0) and c.recv(0, timeout=0.1).msg == Layout(3)
    assert c.deliver(0, Stop(), 1)
    assert not c.deliver(0, Stop(), 57)                 # once it heard from rank 0 anew, a gap is refused again


def test_waiting_messages_are_taken_without_waiting_and_a_forgotten_peer_is_not_waited_for() -> None:
    c = RecordingChannel()
    assert c.take_waiting(2, Ready) is None
    c.deliver(2, Report({}), 0)
    c.deliver(2, Ready([0]), 1)
    assert c.take_waiting(2, Ready).msg == Ready([0]) and c.take_waiting(2, Ready) is None
    c._lost(1, "closed its connection")
    assert c.take_waiting(1, Ready) is None
    with pytest.raises(PeerError, match="closed its connection"):    # the loss stays for whoever waits next
        c.recv(1, 0.1)
    c.forget(2, "taken out of the run")
    c.flush(timeout=0.1, skip_lost=True)
    with pytest.raises(PeerError, match="stopped receiving \\(taken out of the run\\)"):
        c.send(Stop(), 2)


def test_rank_0_takes_a_returning_rank_back_with_its_first_setup(capsys) -> None:
    """Its new process is sent the set-up it had (its devices present again, their step count anew, one line says
    so); it no longer counts as returning; a Stop at the end reaches a rank still setting up."""
    from trainers.distributed.control import Readmit, Rejoin

    net = _network({2: [_envelope(Ready([0, 2]))], 3: [_envelope(Ready([1]))]}, world=4, devices=3)
    net.setup(_engine_view([1, 2, 1]), OptimizerSpec("sgd", 0.1), 7)
    first = {dst: obj for dst, obj, *_ in net.channel.sent}
    net.channel.sent.clear()
    net.channel.replies[3] = [Rejoin()]
    assert net.receive([1], allow_absent=True) == []                # its new process answered: taken out
    assert net.lost == {3: "rank 3 (device 1) was started again as a new process (its models are gone)"}
    assert net.returning == {3} and net.absent_devices() == {1}
    net.channel.replies[3] = [_envelope(Ready([1]))]
    net.last_step = {0: 4, 1: 9}
    assert net.readmit() == [1] and net.lost == {} and net.absent_devices() == set()
    assert net.returning == set() and net.last_step == {0: 4}          # device 1's new process numbers from 0
    assert "rank 3 (device 1) came back as a new process; scala takes devices 1 back" in capsys.readouterr().err
    assert [(dst, type(obj).__name__) for dst, obj, *_ in net.channel.sent] == [(1, "Readmit"), (3, "Layout"), (3, "Setup")]
    assert net.channel.sent[0][1] == Readmit(3) and net.channel.sent[2][1] is first[3] and 3 in net.channel.admitted
    assert net.readmit() == []                                       # nobody else asked
    net.channel.replies[2] = [_envelope(Report({}))]
    net._may_lose(PeerError(2, "devices 0, 2", "sent nothing"))
    assert net.readmit() == [] and 2 in net.lost                    # lost, and no Rejoin from it
    net.channel.replies[2] = [_envelope(Report({})), Rejoin(), _envelope(Ready([0, 2]))]
    assert net.readmit() == [0, 2]                                   # its Rejoin came while it was out
    net.setting_up, net.lost = {3: 0.0}, {3: "setting up"}
    net.channel.sent.clear()
    net.release()
    assert [(dst, obj) for dst, obj, *_ in net.channel.sent] == [(1, Stop([3])), (2, Stop([3])), (3, Stop([3]))]


def test_a_returning_rank_setting_up_does_not_hold_the_round_up(monkeypatch) -> None:
    """Issue 65: rank 0 waited inside a round for a new process to load its data and report ready (5.0 s measured),
    sending the other ranks nothing, who allow it 1.5 time-outs (4.5 s): they ended. Now readmit sends the set-up and
    returns at once; the devices come back at the first round's start after the reply is in, and a rank whose reply
    is not in within SETUP_TIMEOUT_FACTOR time-outs stays out."""
    from trainers.distributed import network as network_module
    from trainers.distributed.control import Rejoin

    now = [100.0]
    monkeypatch.setattr(network_module.time, "monotonic", lambda: now[0])
    net = _tolerant({3: [Rejoin()]})
    net._setups = {3: Setup({}, [], {})}
    net._may_lose(PeerError(3, "role 3", "sent nothing"))
    assert net.readmit() == [] and net.channel.recv_calls == []         # set-up sent, nothing waited for
    assert [(dst, type(obj).__name__) for dst, obj, *_ in net.channel.sent][-2:] == [(3, "Layout"), (3, "Setup")]
    assert set(net.lost) == {3} and net.absent_devices() == {1}         # still out while it sets up
    sent = len(net.channel.sent)
    assert net.readmit() == [] and len(net.channel.sent) == sent        # next round: no reply yet, nothing sent again
    net.channel.replies[3] = [_envelope(Ready([1]))]
    assert net.readmit() == [1] and net.lost == {} and net.setting_up == {}
    net = _tolerant({3: [Rejoin()]})                                    # a new process that never reports ready
    net._setups = {3: Setup({}, [], {})}
    net._may_lose(PeerError(3, "role 3", "sent nothing"))
    assert net.readmit() == []
    now[0] += network_module.SETUP_TIMEOUT_FACTOR * net.channel.timeout - 0.001
    assert net.readmit() == [] and 3 in net.setting_up                 # its time is not up yet
    now[0] += 0.002
    monkeypatch.setattr(net.channel, "waiting", lambda src: False)       # still nothing in: the time is up
    net.channel.replies[3] = [_gone(3)]                                 # what the wait then says
    assert net.readmit() == [] and set(net.lost) == {3} and net.setting_up == {}
    assert net.channel.recv_calls[-1][0] == 3


def test_a_serving_rank_forgets_the_ranks_taken_out_and_numbers_a_returning_one_anew(monkeypatch) -> None:
    from trainers.distributed.control import Readmit

    c = RecordingChannel(rank=1, peers=(0, 2, 3))
    loop = RankLoop(c, RankLayout(4, 3), 1.0)
    for seq in range(2):
        c.deliver(3, Ready([1]), seq)
    c.send(Stop(), 3)
    loop.dispatch(Envelope(Readmit(3), 0.0))
    c.send(Stop(), 3)
    assert wire_format.decode(c.out[-1][1], KEY).seq == 0 and c.deliver(3, Ready([1]), 0)
    c.send(Stop(), 2)
    monkeypatch.setattr(c, "_transmit", lambda dst, frame: (_ for _ in ()).throw(PeerError(dst, "x", "gone")))
    loop.emit(2, Ready([0]))                             # a device rank that stopped receiving: passed over
    with pytest.raises(PeerError):
        loop.emit(EDGE, Ready([0]))                      # rank 0 never is


def test_under_partial_participation_the_launcher_ends_the_run_with_rank_0_and_the_fed_server(ranks, tmp_path,
                                                                                          capsys) -> None:
    ranks.plan = {0: (0, ""), 1: (0, ""), 2: (-signal.SIGKILL, ""), 3: (None, "")}
    assert launch.launch_local([], 4, 3, str(tmp_path), partial=True) == 0
    assert ranks.started[-1].terminated and capsys.readouterr().err == ""     # the hung one, left behind, ended
    ranks.plan = {0: (0, ""), 1: (0, ""), 2: (-signal.SIGKILL, ""), 3: (0, "")}
    assert launch.launch_local([], 4, 3, str(tmp_path)) == 3                  # elsewhere (the default) a device rank's end fails it
    assert "rank 2 (devices 0, 2) was killed by SIGKILL" in capsys.readouterr().err
    ranks.plan = {0: (3, ""), 1: (0, ""), 2: (0, ""), 3: (0, "")}
    assert launch.launch_local([], 4, 3, None, partial=True) == 3             # rank 0's failure still is one


def _tolerant(replies: dict, tolerant: bool = True, world: int = 4, devices: int = 3) -> RankNetwork:
    net = _network(replies, world=world, devices=devices)
    net.tolerant, net.algorithm = tolerant, "scala"
    return net


def _gone(rank: int, what: str = "sent nothing for 12 s (--rank-timeout): it hangs or is too slow"):
    return lambda: PeerError(rank, f"role {rank}", what)


def test_where_absence_is_allowed_a_lost_device_rank_is_passed_over_and_named_once(capsys) -> None:
    act = Activation(0, 1, 1, torch.zeros(2, 3), torch.zeros(2, dtype=torch.long))
    net = _expecting(_tolerant({2: [_envelope(act)], 3: [_gone(3)]}), {0: 2}, round_index=1)
    got = net.receive([0, 1], allow_absent=True)                   # device 0 on rank 2, device 1 on rank 3
    assert got == [act] and net.lost == {3: "rank 3 (role 3) sent nothing for 12 s (--rank-timeout): it hangs or is too slow"}
    assert net.absent_devices() == {1} and net.channel.forgotten == [3]
    assert capsys.readouterr().err == ("adaptplan train: rank 3 (role 3) sent nothing for 12 s (--rank-timeout): it hangs "
                                       "or is too slow; scala goes on without devices 1 (partial participation: they "
                                       "are absent from now on)\n")
    net.channel.replies[3] = [_gone(3)]
    calls = len(net.channel.recv_calls)
    assert net.receive([1], allow_absent=True) == [] and len(net.channel.recv_calls) == calls   # not waited on again
    net.send(1, CutGradient(1, 1, 1, None))
    assert all(dst != 3 for dst, *_ in net.channel.sent) and capsys.readouterr().err == ""    # nothing sent to it


def test_a_lost_rank_stops_the_run_without_absence_at_the_fed_server_or_where_not_allowed() -> None:
    with pytest.raises(PeerError, match="rank 3"):                 # the algorithm needs every device
        _tolerant({3: [_gone(3)]}, tolerant=False).receive([1], allow_absent=True)
    with pytest.raises(PeerError, match="rank 3"):                 # a wait that does not allow absence
        _tolerant({3: [_gone(3)]}).receive([1])
    with pytest.raises(PeerError, match="rank 1"):                 # the fed server is never left behind
        _tolerant({1: [_gone(1)]}).receive([FED], allow_absent=True)
    with pytest.raises(PeerError, match="rank 2"):                 # an error naming another rank is not this one's loss
        _tolerant({3: [_gone(2)]}).receive([1], allow_absent=True)
    net = _tolerant({3: [_gone(3)]}, tolerant=False)
    assert not net._may_lose(PeerError(3, "x", "y")) and net.lost == {}


def test_a_device_rank_lost_at_the_rounds_end_or_on_a_send_is_taken_out_there() -> None:
    class FailingSends(ScriptedChannel):
        def send(self, obj, dst, rate=None, charged_bytes=None):
            if dst == 3:
                raise PeerError(3, "role 3", "stopped receiving (it died or was killed)")
            super().send(obj, dst, rate, charged_bytes)

    net = _tolerant({1: [_envelope(Report({}))], 2: [_envelope(Report({}))], 3: [_gone(3)]})
    assert net.end_round(4) == {} and set(net.lost) == {3}
    assert [(dst, type(msg).__name__) for dst, msg, *_ in net.channel.sent] == [(1, "RoundEnd"), (2, "RoundEnd"), (3, "RoundEnd")]
    net.channel.sent.clear()
    net.channel.replies = {1: [_envelope(Report({}))], 2: [_envelope(Report({}))]}
    net.end_round(5)                                               # rank 3 is neither told nor awaited any more
    assert [dst for dst, *_ in net.channel.sent] == [1, 2]
    strict = _tolerant({1: [_envelope(Report({}))], 2: [_envelope(Report({}))], 3: [_gone(3)]}, tolerant=False)
    with pytest.raises(PeerError):
        strict.end_round(4)
    sends = RankNetwork(FailingSends(), RankLayout(4, 3), False, {})
    sends.tolerant = True
    sends.send(1, CutGradient(1, 1, 1, None))
    assert set(sends.lost) == {3}
    sends.tolerant, sends.lost = False, {}
    with pytest.raises(PeerError):
        sends.send(1, CutGradient(1, 1, 1, None))


def test_reading_a_lost_devices_blocks_gives_none_where_absence_is_allowed() -> None:
    net = _tolerant({3: [_gone(3)]})
    net.template = _chain()
    assert net.device_blocks(1) is None and set(net.lost) == {3}
    assert net.device_blocks(1) is None and len(net.channel.sent) == 1       # asked once, then known lost
    with pytest.raises(PeerError):
        _tolerant({3: [_gone(3)]}, tolerant=False).device_blocks(1)


def test_a_returning_rank_that_fails_its_setup_is_out_again_and_other_errors_stop_the_run() -> None:
    from trainers.distributed.control import Rejoin

    net = _tolerant({3: [Rejoin(), _gone(3)]})
    net._setups = {3: Setup({}, [], {})}
    net._may_lose(PeerError(3, "role 3", "sent nothing"))
    assert net.readmit() == [] and set(net.lost) == {3}
    assert net.channel.recv_calls[-1] == (3, None)
    net = _tolerant({3: [Rejoin(), _gone(1)]})
    net._setups = {3: Setup({}, [], {})}
    net._may_lose(PeerError(3, "role 3", "sent nothing"))
    with pytest.raises(PeerError, match="rank 1"):
        net.readmit()


def test_a_process_that_replaces_its_rank_asks_rank_0_to_take_it_back_first(monkeypatch) -> None:
    from trainers.distributed.control import Rejoin

    code, channel = _serve(monkeypatch, 2, [Layout(4), Stop()])
    assert code == 0 and not any(isinstance(msg, Rejoin) for _, msg, *_ in channel.sent)   # a first start asks nothing
    code, channel = _serve(monkeypatch, 2, [lambda c: setattr(c, "rejoining", True), Layout(4), Stop()])
    assert code == 0 and (channel.sent[0][0], type(channel.sent[0][1])) == (EDGE_RANK, Rejoin)


def test_the_end_of_a_run_names_the_ranks_taken_out_and_stops_only_the_others() -> None:
    edge = object.__new__(session.EdgeSession)
    edge._ended = threading.Event()                      # (its heartbeat thread is not started here)
    edge.channel, edge.layout = ScriptedChannel(), RankLayout(5, 3)
    edge.network = RankNetwork(edge.channel, edge.layout, False, {})
    edge.network.lost = {3: "rank 3 sent nothing"}
    edge.finish()
    assert [(dst, msg) for dst, msg, *_ in edge.channel.sent] == [(1, Stop([3])), (2, Stop([3])), (4, Stop([3]))]
    edge.channel, edge.network = ScriptedChannel(), None
    edge.finish()
    assert [(dst, msg) for dst, msg, *_ in edge.channel.sent] == [(r, Stop([])) for r in (1, 2, 3, 4)]


# ---- sessions: frames of another run or an earlier process (issue 36 W4) ------------------------------------
@pytest.mark.parametrize("case", ["another sender session", "another receiver session"])
def test_a_frame_of_another_run_under_the_same_secret_is_refused(wire, case: str) -> None:
    """The gloo channel learns every rank's session when it opens; a frame signed with the run's secret but
    sent by or to another process (a reused secret file, captured frames) is refused, naming the sessions."""
    fake, channel = wire
    other = "0123456789abcdef"
    ses, to = (other, fake.mine) if case == "another sender session" else (peer_session(2), other)
    fake.deliver_bytes(2, wire_format.encode(Envelope(Stop(), 0.0), 2, 0, 0, KEY, ses, to))
    why = (rf"it comes from session '{other}' of rank 2, not its current '{peer_session(2)}'"
           if case == "another sender session" else rf"it is addressed to session '{other}' of rank 0, not this process's")
    with pytest.raises(FrameRefused, match=rf"sent rank 0 a frame it refused: {why}"):
        channel.recv(2)
    fake.deliver(1, Layout(3))                                          # the other peers are unaffected
    assert channel.recv(1).msg == Layout(3)


def test_every_frame_sent_names_this_process_and_the_receivers(wire) -> None:
    fake, channel = wire
    channel.send(Stop(), 3)
    channel.flush()
    frame = wire_format.decode([t for d, t in fake.sent if d == 3][1].numpy(), KEY)
    assert (frame.ses, frame.to) == (channel.session, peer_session(3)) and len(channel.session) == 16


def test_a_replayed_rejoin_mid_run_does_not_restart_the_numbering() -> None:
    """A Rejoin captured at a process's start and sent again mid-run carries that same process's session: it
    is a frame numbered below the next one (dropped as a re-delivery), not a new process, so the numbering
    goes on and the frames numbered before it stay refused when replayed."""
    from trainers.distributed.control import Rejoin

    c = RecordingChannel()
    new = "00000000000000ee"
    c.announce(3, new)
    assert c.deliver(3, Rejoin(), 0, ses=new) and c.deliver(3, Ready([1]), 1, ses=new)
    assert c.deliver(3, Ready([2]), 2, ses=new)
    assert c.deliver(3, Rejoin(), 0, ses=new) and c.deliver(3, Ready([1]), 1, ses=new)    # the replays
    assert c._expected[3] == 3                                       # its numbering was not restarted
    assert [type(c.recv(3, timeout=0.1).msg).__name__ for _ in range(3)] == ["Rejoin", "Ready", "Ready"]
    assert c.take_waiting(3, Rejoin) is None and c.take_waiting(3, Ready) is None         # nothing replayed was taken
    assert c.deliver(3, Ready([3]), 3, ses=new) and c.recv(3, timeout=0.1).msg == Ready([3])


def test_an_earlier_process_frames_are_dropped_once_its_successor_announced_itself() -> None:
    """After a peer's new process announced its session, frames of the earlier one (still on their way, or
    replayed, a Rejoin included) are dropped, never taken; the new process's are."""
    from trainers.distributed.control import Rejoin

    c = RecordingChannel()
    assert c.deliver(3, Ready([1]), 0) and c.recv(3, timeout=0.1).msg == Ready([1])
    c.announce(3, "00000000000000ee")
    for frame in ((Ready([1]), 1), (Rejoin(), 0)):
        assert c.deliver(3, *frame)                                  # dropped, not refused
    assert c.take_waiting(3, Ready) is None and c.take_waiting(3, Rejoin) is None
    assert c.deliver(3, Rejoin(), 0, ses="00000000000000ee") and isinstance(c.recv(3, timeout=0.1).msg, Rejoin)
    assert not c.deliver(2, Ready([0]), 0, to="00000000000000aa")    # to another process of this rank: refused


def test_a_heartbeat_is_taken_in_and_the_wait_on_rank_0_starts_over() -> None:
    """Rank 0's Alive is never handed to the rank's code: recv takes it in and waits on (a fresh time-out), returning
    the next real message; a heartbeat alone still ends in the silence error after it."""
    from trainers.distributed.control import Alive

    c = RecordingChannel(rank=1, peers=(0, 2))
    c.deliver(0, Alive(), 0)
    c.deliver(0, Alive(), 1)
    c.deliver(0, Ready([4]), 2)
    assert c.recv(0).msg == Ready([4])
    c.deliver(0, Alive(), 3)
    with pytest.raises(PeerError, match="sent nothing for 0.2 s"):
        c.recv(0)

    def later() -> None:                      # a heartbeat at 0.15 s, the command at 0.3 s: a wait of 0.2 s is enough
        time.sleep(0.15)
        c.deliver(0, Alive(), 4)
        time.sleep(0.15)
        c.deliver(0, Ready([5]), 5)

    threading.Thread(target=later).start()
    assert c.recv(0).msg == Ready([5])


def test_rank_0_sends_a_heartbeat_to_each_rank_it_was_silent_to_until_the_run_ends() -> None:
    from trainers.distributed.control import Alive

    edge = object.__new__(session.EdgeSession)
    edge.channel, edge.layout, edge.network = ScriptedChannel(timeout=0.2), RankLayout(4, 2), None
    edge._ended = threading.Event()
    now = time.monotonic()
    edge.channel.last_sent = {1: now, 2: now, 3: now + 3600}    # rank 3 was sent something "now" and again and again
    beat = threading.Thread(target=edge._heartbeat)
    beat.start()
    time.sleep(0.5)                                               # 2.5 time-outs (this channel keeps no last_sent)
    edge._ended.set()
    beat.join(timeout=2)
    assert not beat.is_alive()
    beats = [(dst, obj) for dst, obj, *_ in edge.channel.sent]
    assert {dst for dst, _ in beats} == {1, 2} and all(obj == Alive() for _, obj in beats)
    sent = len(edge.channel.sent)
    time.sleep(0.3)
    assert len(edge.channel.sent) == sent                         # ended: no beat after the run's end


def test_a_device_ranks_message_is_checked_before_rank_0_uses_it(capsys) -> None:
    """Issue 67: an activation for a device another rank hosts, one nobody asked for, or of the wrong shape is that
    rank's failure (named); where absence is allowed the rank is taken out and the run goes on without it."""
    good = Activation(1, 2, 1, torch.zeros(4, 3), torch.zeros(4, dtype=torch.long))
    for msg, rows, why in [
        (Activation(0, 2, 1, torch.zeros(4, 3), torch.zeros(4, dtype=torch.long)), {0: 4},
         "device 0's activation: device: 0 is not a device rank 3 hosts"),
        (Activation(3, 2, 1, torch.zeros(4, 3), torch.zeros(4, dtype=torch.long)), {3: 4},      # one past the last
         "device 3's activation: device: 3 is not a device rank 3 hosts"),
        (good, {}, "device 1's reply: type: is Activation, but it was asked for nothing"),
        (Activation(1, 2, 1, torch.zeros(4, 5), torch.zeros(4, dtype=torch.long)), {1: 4},
         "device 1's activation: tensor.shape: is [4, 5], expected [4, 3] (4 samples asked for)"),
    ]:
        net = _expecting(_network({3: [_envelope(msg)]}), rows)
        with pytest.raises(PeerError) as caught:
            net.receive([1])
        assert caught.value.rank == 3 and str(caught.value) == f"rank 3 (device 1) sent a message its role may not send: {why}"
    net = _expecting(_tolerant({3: [_envelope(Activation(1, 2, 1, torch.zeros(4, 5), torch.zeros(4, dtype=torch.long)))]}),
                     {1: 4})
    assert net.receive([1], allow_absent=True) == [] and 3 in net.lost
    assert "scala goes on without devices 1" in capsys.readouterr().err
    assert _expecting(_network({3: [_envelope(good)]}), {1: 4}).receive([1]) == [good]


# ---- issue 67 M5: the rank rank 0 names when the fed server waited on a device rank ------------------------------
def test_the_fed_server_reports_the_device_rank_it_waited_on_instead_of_dying() -> None:
    """Under SplitFed V1 the fed server takes uploads from the device ranks itself; a device rank that hangs
    made it die, and rank 0, waiting on it, named the fed server. Now it reports that rank and serves on."""
    silent = PeerError(3, "device 1", "sent nothing for 3 s (--rank-timeout): it hangs or is too slow")
    fed = _loop(1, {0: [_envelope(Take(1)), _envelope(Stop())], 3: [silent]})
    fed.serve()
    assert fed.channel.sent == [(0, RoleError("lost", "sent nothing for 3 s (--rank-timeout): it hangs or is too slow",
                                              3), *fed.channel.sent[0][2:])]
    lost_fed = _loop(2, {0: [_envelope(Take(FED))], 1: [PeerError(1, "fed server", "closed its connection")]})
    with pytest.raises(PeerError, match=r"^rank 1 \(fed server\) closed"):
        lost_fed.serve()                                   # a rank other than a device rank is no device's fault


def test_rank_0_names_the_device_rank_the_fed_server_reports_and_gives_it_time_to(wire) -> None:
    from trainers.distributed.layout import FED_ALLOWANCE

    fake, channel = wire
    fake.deliver(1, RoleError("lost", "sent nothing for 3 s", 3))
    with pytest.raises(PeerError) as info:
        channel.recv(1)
    assert (info.value.rank, str(info.value)) == (3, "rank 3 (device 1) sent nothing for 3 s (rank 1 (fed server) "
                                                     "waited on it)")
    net = _network({1: [_envelope(Report({}))], 2: [_envelope(Report({}))], 3: [_envelope(Report({}))]})
    net.end_round(1)
    assert net.channel.recv_calls[0] == (1, (1 + FED_ALLOWANCE) * net.channel.timeout) and FED_ALLOWANCE >= 1


# ---- issue 67 item 1: every other message a device rank sends rank 0 ---------------------------------------------
def test_a_reply_of_another_type_than_asked_is_the_ranks_failure() -> None:
    """A device rank answering a Forward with a Report (or an upload request with an activation) is refused before
    the engine reads the message as what it asked for (it met an AttributeError there before)."""
    asked = Activation(1, 2, 1, torch.zeros(4, 3), torch.zeros(4, dtype=torch.long))
    net = _expecting(_network({3: [_envelope(Report({}))]}), {1: 4})
    with pytest.raises(PeerError, match=r"^rank 3 \(device 1\) sent a message its role may not send: rank 3's reply "
                                        r"\(Report\): device: None is not a device rank 3 hosts$"):
        net.receive([1])
    net = _network({3: [_envelope(asked)]})
    net.engine = SimpleNamespace(num_blocks=2, defence=ActivationDefence(), cuts=[1, 1, 1], upload_schema={})
    net.send(1, Upload(1, 2, [0], 5.0, to=EDGE))
    with pytest.raises(PeerError, match=r"device 1's reply: type: is Activation, expected ModelUpload$"):
        net.receive([1])
    state = State(1, {"model": {}})
    net = _network({3: [_envelope(state)]})
    net.engine = SimpleNamespace(num_blocks=2, defence=ActivationDefence(), cuts=[1, 1, 1], upload_schema={})
    net.send(1, GetState(1))
    assert net.receive([1]) == [state]                    # a state is checked when a run resumes from it


def test_blocks_are_checked_against_the_devices_cut_before_they_are_loaded() -> None:
    chain = _chain()
    states = [block.state_dict() for block in chain]
    wrong = {name: torch.zeros(1) for name in states[0]}
    for reply, why in [(Blocks(0, states[:1]), "device 0's blocks: states: holds 1 blocks, expected 2"),
                       (Blocks(0, [wrong, states[1]]), "device 0's blocks: states[0].weight: is torch.float32[1], "
                                                       f"expected float32{list(states[0]['weight'].shape)}"),
                       (Blocks(2, states), "device 0's blocks: device: is 2, but this is device 0's reply"),
                       (Report({}), "device 0's blocks: type: is Report, expected Blocks (the reply to GetBlocks)")]:
        net = _network({2: [_envelope(reply)]})
        net.template, net.engine = chain, SimpleNamespace(num_blocks=2, defence=ActivationDefence(), cuts=[2, 1, 1], upload_schema=schema_of(states))
        with pytest.raises(PeerError) as caught:
            net.device_blocks(0)
        assert (caught.value.rank, str(caught.value)) == (2, f"rank 2 (devices 0, 2) sent a message its role may not "
                                                             f"send: {why}")
    net = _tolerant({2: [_envelope(Blocks(0, states[:1]))]})
    net.template, net.engine = chain, SimpleNamespace(num_blocks=2, defence=ActivationDefence(), cuts=[2, 1, 1], upload_schema=schema_of(states))
    assert net.device_blocks(0) is None and 2 in net.lost          # where absence is allowed: taken out
    net = _network({2: [_envelope(Blocks(0, states))]})
    net.template, net.engine = chain, SimpleNamespace(num_blocks=2, defence=ActivationDefence(), cuts=[2, 1, 1], upload_schema=schema_of(states))
    assert len(net.device_blocks(0)) == 2                          # exactly its cut's blocks: taken


def test_a_report_speaks_only_for_the_ranks_own_devices() -> None:
    """A device rank's measured seconds fit the system re-plans use: one naming another device or a server, or an
    unknown stage, or seconds that are no duration, stops the run naming the rank (a tolerant run goes on without it)."""
    for report, why in [(Report({"device FP": {1: 0.5}}), "seconds['device FP']: names 1, not one of its devices [0, 2]"),
                        (Report({"server": {"edge": 0.5}}), "seconds['server']: names 'edge', not one of its devices "
                                                            "[0, 2]"),
                        (Report({"device FP": {0: math.inf}}), "seconds['device FP'][0]: is inf, expected a finite "
                                                               "number of seconds in [0, 1e+06]"),
                        (Ready([0, 2]), "type: is Ready, expected Report (the answer to RoundEnd)")]:
        net = _network({1: [_envelope(Report({}))], 2: [_envelope(report)], 3: [_envelope(Report({}))]})
        with pytest.raises(PeerError) as caught:
            net.end_round(1)
        assert (caught.value.rank, str(caught.value)) == (2, f"rank 2 (devices 0, 2) sent a message its role may not "
                                                             f"send: rank 2's report: {why}")
    net = _tolerant({1: [_envelope(Report({}))], 2: [_envelope(Report({"device FP": {1: 0.5}}))],
                     3: [_envelope(Report({"device FP": {1: 0.25}}))]})
    assert net.end_round(1) == {"device FP": {"1": 0.25}} and 2 in net.lost    # the lie is not merged


def test_a_set_up_reply_must_be_ready_for_the_devices_given() -> None:
    net = _network({2: [_envelope(Ready([0]))], 3: [_envelope(Ready([1]))]})
    with pytest.raises(PeerError, match=r"^rank 2 \(devices 0, 2\) sent a message its role may not send: rank 2's "
                                        r"set-up reply: devices: are \[0\], expected \[0, 2\] \(the devices it was given\)$"):
        net.setup(_engine_view([1, 2, 1]), OptimizerSpec("sgd", 0.1), 7)


def test_only_a_server_may_blame_another_rank(wire) -> None:
    """A device rank's error naming another rank would make rank 0 stop the run blaming an honest device: it is the
    sender's own failure; the fed server's (issue 67 M5) is still believed."""
    fake, channel = wire
    fake.deliver(2, RoleError("bad", "device 1 lied", 3))
    with pytest.raises(PeerError) as info:
        channel.recv(2)
    assert (info.value.rank, str(info.value)) == (2, "rank 2 (device 0) sent a message its role may not send: an "
                                                     "error blaming rank 3 (only the servers name another rank)")
    fake.deliver(3, RoleError("lost", "sent nothing", 2))
    with pytest.raises(PeerError) as info:
        channel.recv(3)
    assert info.value.rank == 3
    fake.deliver(1, RoleError("bad", "device 1's model upload: weight: lied", 3))
    with pytest.raises(PeerError) as info:
        channel.recv(1)
    assert info.value.rank == 3                                    # the fed server's word
    fake.deliver(2, RoleError("mismatch", "its own", 2))            # naming itself: its own error, as before
    with pytest.raises(MessageMismatchError, match="^its own$"):
        channel.recv(2)


def test_rank_0_reads_an_activations_rule_from_the_model_it_set_up() -> None:
    """The rules per cut come from one sample through the template (trainers.roles.checks.activation_rules) on the
    first activation: at cut 1 of Linear(3, 4) → Linear(4, 2) a row holds 4 float32 values, labels in 0..2."""
    view = SimpleNamespace(template=_chain(), num_blocks=len(_chain()),
                           data=SimpleNamespace(x_train=torch.randn(5, 3), parts=[[0], [1], [2]]), cuts=[1, 1, 1], batch_size=1,
                           num_classes=3, defence=ActivationDefence(),
                           strategy=SimpleNamespace(allows_absence=False, name="sfl-v1", stage_spec=dict))
    good = Activation(1, 2, 1, torch.zeros(2, 4), torch.tensor([0, 2]))
    net = _network({2: [_envelope(Ready([0, 2]))], 3: [_envelope(Ready([1])), _envelope(good),
                                                       _envelope(Activation(1, 2, 1, torch.zeros(2, 4),
                                                                            torch.tensor([0, 3])))]})
    assert net.setup(view, OptimizerSpec("sgd", 0.1), 7).engine is view
    net.send(1, Forward(2, [(1, 2)]))
    assert net.receive([1]) == [good] and net.rules[1].shape == (4,)
    net.send(1, Forward(2, [(1, 2)]))
    with pytest.raises(PeerError, match=r"device 1's activation: labels: span 0\.\.3, outside 0\.\.2$"):
        net.receive([1])


def test_an_activation_for_another_round_than_asked_is_refused() -> None:
    """tools/hostile_frames.py: an activation naming round −1 or 0 when round 2 was asked was taken (the device met
    the mismatch only when the gradient came back)."""
    net = _network({3: [_envelope(Activation(1, 0, 1, torch.zeros(4, 3), torch.zeros(4, dtype=torch.long)))]})
    net = _expecting(net, {})
    net.send(1, Forward(2, [(1, 4)]))
    with pytest.raises(PeerError, match=r"device 1's activation: round: is 0, but it was asked for round 2$"):
        net.receive([1])
    good = Activation(1, 2, 1, torch.zeros(4, 3), torch.zeros(4, dtype=torch.long))
    net = _expecting(_network({3: [_envelope(good)]}), {})
    net.send(1, Forward(2, [(1, 4)]))
    assert net.receive([1]) == [good]


def test_an_upload_holds_the_blocks_asked_for_below_the_devices_cut() -> None:
    """GAS asks every block of a device's model; the device sends those it holds (below its cut): exactly those are
    taken, one fewer is refused (a device must not leave a block out of the average)."""
    chain = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 4), nn.Linear(4, 2))
    states = [block.state_dict() for block in chain]

    def sent(blocks: list[int]) -> RankNetwork:
        msg = ModelUpload(1, 2, "device", {j: BlockState(states[j]) for j in blocks}, 1.0)
        net = _network({3: [_envelope(msg)]})
        net.engine = SimpleNamespace(num_blocks=3, defence=ActivationDefence(), cuts=[2, 2, 2],
                                     upload_schema=schema_of(states))
        net.send(1, Upload(1, 2, [0, 1, 2], 5.0, to=EDGE))
        return net

    assert list(sent([0, 1]).receive([1])[0].blocks) == [0, 1]
    with pytest.raises(PeerError, match=r"device 1's model upload: blocks: holds blocks \[0\], but it was asked for "
                                        r"\[0, 1\]$"):
        sent([0]).receive([1])
