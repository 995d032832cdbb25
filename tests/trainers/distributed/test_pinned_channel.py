"""A rank's channel (trainers/distributed/transport.py FrameChannel) and rank 0's heartbeat
(trainers/distributed/session.py) against what the docs say, each rule at its edge:

* docs/mqtt.md "Delivery": the receiver drops a frame numbered below the next one expected on its pair (a
  re-delivery) and refuses one above it (a gap), so every frame enters the round exactly once — the frame numbered
  exactly the next expected one is taken;
* docs/distributed.md "The wire": a frame that does not come from the sender's current session *to this process's*
  is refused — also one naming no receiver session at all, even while this process rejoins (where frames addressed
  to its earlier process are dropped);
* docs/distributed.md "Failures": rank 0 sends a heartbeat to each rank it has sent nothing for half a time-out.

The carrier is a fake that records what is sent; frames are encoded with the documented wire."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace
from typing import Any

import pytest

from trainers.distributed import session, transport, wire
from trainers.distributed.control import Alive, Envelope, Ready
from trainers.distributed.layout import RankLayout
from trainers.distributed.transport import FrameRefused

KEY = hashlib.sha256(b"pinned channel").digest()
PEER = "00000000000000a0"          # the sender's session (16 hex digits, as a process draws)


class Carrier(transport.FrameChannel):
    """The channel's own logic with frames handed in by the test and sent frames recorded."""

    def __init__(self, rank: int = 1, peers: tuple[int, ...] = (0,), timeout: float = 0.2) -> None:
        super().__init__(rank, list(peers), timeout, lambda r: f"role {r}", KEY)
        self.out: list[tuple[int, bytes]] = []

    def _transmit(self, dst: int, frame: bytes) -> None:
        self.out.append((dst, frame))

    def _pending(self, dst: int) -> bool:
        return False

    def frame(self, src: int, msg: Any, seq: int, to: str | None = None, duplicates: bool = True) -> bool:
        raw = wire.encode(Envelope(msg, 0.0), src, self.rank, seq, KEY, PEER, self.session if to is None else to)
        return self._accept(src, raw, 1.0, duplicates=duplicates)


def test_the_next_expected_frame_is_taken_a_lower_one_dropped_a_higher_one_refused() -> None:
    c = Carrier()
    c.announce(0, PEER)
    assert c.frame(0, Ready([0]), 0)                      # exactly the next expected (#0): taken
    assert c.recv(0, timeout=0.1).msg == Ready([0])
    assert c.frame(0, Ready([9]), 0)                      # #0 again: a QoS 1 re-delivery, dropped
    assert not c.waiting(0)
    assert c.frame(0, Ready([1]), 1)                      # #1, the next: taken
    assert c.recv(0, timeout=0.1).msg == Ready([1])
    assert not c.frame(0, Ready([3]), 3)                  # #3 where #2 is expected: a gap, refused
    with pytest.raises(FrameRefused, match=r"numbered 0→1 #3, not 0→1 #2"):
        c.recv(0, timeout=0.1)


def test_without_duplicates_a_lower_number_is_refused_too() -> None:
    """gloo delivers once: a frame numbered below the next one is a replay there."""
    c = Carrier()
    c.announce(0, PEER)
    assert c.frame(0, Ready([0]), 0, duplicates=False)
    assert not c.frame(0, Ready([0]), 0, duplicates=False)


def test_a_frame_naming_no_receiver_session_is_refused_even_while_rejoining() -> None:
    c = Carrier()
    c.announce(0, PEER)
    c.rejoining = True
    assert c.frame(0, Ready([0]), 0, to="00000000000000ff")   # to this rank's earlier process: dropped
    assert not c.waiting(0)
    assert not c.frame(0, Ready([0]), 0, to="")               # to no process at all: refused, the peer named
    with pytest.raises(FrameRefused, match=r"rank 0 \(role 0\) sent rank 1 a frame it refused: it is addressed to "
                                           r"session '' of rank 1, not this process's"):
        c.recv(0, timeout=0.1)


def test_a_frame_naming_no_receiver_session_is_refused_outside_a_rejoin() -> None:
    c = Carrier()
    c.announce(0, PEER)
    assert not c.frame(0, Ready([0]), 0, to="")
    with pytest.raises(FrameRefused, match="addressed to session ''"):
        c.recv(0, timeout=0.1)


class OneCheck:
    """The heartbeat loop's ``_ended``: its first wait returns (one check of the ranks), the second ends the loop."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        return len(self.waits) > 1

    def set(self) -> None:
        pass


def test_rank_0_heartbeats_a_rank_it_has_sent_nothing_for_half_a_time_out(monkeypatch) -> None:
    """docs/distributed.md "Failures": a heartbeat (Alive) to each rank it has sent nothing for half a time-out.
    Timeout 4 s: rank 1 silent for exactly 2 s (half) gets one, rank 2 silent for 1.96 s does not, rank 3 silent
    for 40 s does; the ranks are checked four times per half time-out (every 0.5 s)."""
    timeout, now = 4.0, 1000.0
    edge = object.__new__(session.EdgeSession)
    edge.channel, edge.layout, edge.network = Carrier(rank=0, peers=(1, 2, 3), timeout=timeout), RankLayout(4, 2), None
    edge._ended = OneCheck()
    monkeypatch.setattr(session, "time", SimpleNamespace(monotonic=lambda: now))
    edge.channel.last_sent = {1: now - 2.0, 2: now - 1.96, 3: now - 40.0}
    edge._heartbeat()
    beats = [(dst, wire.decode(raw, KEY).value.msg) for dst, raw in edge.channel.out]
    assert [dst for dst, _ in beats] == [1, 3]
    assert all(isinstance(msg, Alive) for _, msg in beats)
    assert edge._ended.waits == [0.5, 0.5]
