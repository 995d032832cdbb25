"""Point-to-point delivery of messages between ranks over torch.distributed (gloo on CPU).

A message is two sends on the same (source, destination) pair: an int64 length, then the frame
of :mod:`trainers.distributed.wire` as a uint8 tensor (a JSON header and raw tensor bytes,
authenticated with the run's secret; nothing is unpickled). A length over
:data:`~trainers.distributed.wire.MAX_FRAME_BYTES` is refused before anything is allocated; a frame
that is malformed, not authenticated by this run's secret, or out of sequence is refused, and the
peer is treated as lost (:class:`FrameRefused`, naming it).

Every wait has a deadline (``timeout`` seconds, the ``--rank-timeout`` option). A peer that died
shows up at once as a failed receive or send (gloo's connection closes); a peer that hangs as a
deadline passed. Both raise :class:`PeerError` naming the peer rank and its role, so every rank can stop
with one line instead of a traceback.
"""

from __future__ import annotations

import queue
import secrets
import threading
import time
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from adaptplan.errors import InputError
from adaptplan.fileio import show
from trainers.distributed import wire
from trainers.distributed.control import Abort, Alive, Envelope, Rejoin, RoleError
from trainers.distributed.layout import EDGE_RANK, FED_RANK
from trainers.roles.messages import MessageMismatchError, NonFiniteError

POLL_SECONDS = 0.002
"""Sleep between checks while waiting for queued messages to leave (s)."""


class PeerError(RuntimeError):
    """A peer rank died, closed its connection, or did not answer within the time-out."""

    def __init__(self, rank: int, who: str, what: str) -> None:
        super().__init__(f"rank {rank} ({who}) {what}")
        self.rank = rank
        self.who = who


SERVER_RANKS = (EDGE_RANK, FED_RANK)
"""The ranks whose :class:`RoleError` may name another rank (``blame``): a device rank speaks only for itself."""
ROLE_ERRORS = {"nonfinite": NonFiniteError, "mismatch": MessageMismatchError, "input": InputError}
"""Errors of the role code that a rank reports to rank 0 (:class:`RoleError`) instead of dying:
rank 0 raises them as if its own role had (a divergence stops the run with the usual message)."""


def role_error(exc: Exception) -> RoleError:
    """The :class:`RoleError` that reports ``exc`` (one of :data:`ROLE_ERRORS`) to rank 0."""
    kind = next(k for k, cls in ROLE_ERRORS.items() if isinstance(exc, cls))
    return RoleError(kind, str(exc))


class AbortRun(RuntimeError):
    """The controller told this rank to stop: another rank failed (the message says which)."""


class FrameRefused(PeerError):
    """A peer's frame was refused (malformed, oversized, not authenticated, out of sequence)."""

    def __init__(self, rank: int, who: str, receiver: int, why: str) -> None:
        super().__init__(rank, who, f"sent rank {receiver} a frame it refused: {why}")


_CLOSED = object()
RESTARTED = "it was started again as a new process: its models are gone"


class FrameChannel:
    """This rank's end of every pair, whatever carries the frames: numbering, encoding and checking
    (:mod:`~trainers.distributed.wire`), one inbox per peer, waits with deadlines. A carrier
    (:class:`Channel` over gloo, :class:`~trainers.distributed.mqtt.MqttChannel` over a broker)
    hands each received frame to :meth:`_accept` and implements :meth:`_transmit`.
    ``describe(rank)`` names a rank's role for messages.

    Sessions: this process is :attr:`session` (random, 16 hex digits); each frame names it and the
    receiver's session as announced to this rank (:meth:`announce`: gloo exchanges them when the ranks
    join, the broker's ready flags carry them). A frame is taken only from the sender's announced session
    and addressed to this one, so a frame of another run, or of an earlier process of either rank, is
    refused even under a reused secret; an earlier session's frames still on their way after the peer's
    new process announced itself are dropped. A :class:`Rejoin` restarts a peer's numbering only from a
    session whose numbering has not started yet: a replayed one is refused like any replayed frame. A peer
    that announced no session is pinned to the session of its first frame."""

    def __init__(self, rank: int, peers: Sequence[int], timeout: float, describe: Callable[[int], str],
                 key: bytes = b"", trace: Callable[[wire.Frame], None] | None = None,
                 session: str | None = None) -> None:
        self.rank = rank
        self.key = key
        self.trace = trace
        self.session = session or secrets.token_hex(8)
        self._sessions: dict[int, str] = {}            # each peer's current session, as announced (or first seen)
        self._retired: dict[int, set[str]] = {r: set() for r in peers}   # its earlier processes' sessions
        self._numbered: dict[int, str] = {}            # the session whose frame numbering is running
        self._sent_seq: dict[int, int] = {}
        self._expected: dict[int, int] = {r: 0 for r in peers}
        self.timeout = float(timeout)
        self.describe = describe
        self.closing = False
        self._inbox: dict[int, queue.Queue] = {r: queue.Queue() for r in peers}
        self._send_error: dict[int, str] = {}
        self.rejoining = False                 # this process replaces an earlier one of its rank (MQTT)
        self._restarting: set[int] = set()     # peers whose frames are an earlier process's until one numbered 0
        self._send_lock = threading.RLock()    # numbering and queueing: rank 0's heartbeat sends from its own thread
        self.last_sent: dict[int, float] = {}  # each peer's last send (time.monotonic), for the heartbeat

    def _accept(self, src: int, payload: Any, arrived: float, duplicates: bool = False) -> bool:
        """Decode a frame from ``src`` into its inbox; False when it was refused (the peer is then
        lost: its inbox holds the :class:`FrameRefused`). With ``duplicates`` (an at-least-once
        carrier) a frame numbered below the next expected one is a re-delivery and dropped."""
        try:
            frame = wire.decode(payload, self.key)
            if frame.ses in self._retired[src]:
                return True                    # an earlier process of the peer: its frames still on their way
            if not self._from_current_session(src, frame):
                return True                    # addressed to an earlier process of this rank
            if (frame.seq == 0 and (frame.src, frame.dst) == (src, self.rank) and isinstance(frame.value, Envelope)
                    and isinstance(frame.value.msg, Rejoin) and self._numbered.get(src) != frame.ses):
                self.restart_numbering(src)    # the peer's new process (authenticated): numbering starts over
            if src in self._restarting and (frame.src, frame.dst) == (src, self.rank):
                if frame.seq != 0:
                    return True                # numbered for this rank's earlier process: not ours
                self._restarting.discard(src)
            expected = self._expected[src]
            if duplicates and (frame.src, frame.dst) == (src, self.rank) and frame.seq < expected:
                return True
            if (frame.src, frame.dst, frame.seq) != (src, self.rank, expected):
                raise wire.WireError(f"it is numbered {frame.src}→{frame.dst} #{frame.seq}, not "
                                     f"{src}→{self.rank} #{expected} (replayed, re-ordered or misdirected)")
            self._expected[src] = expected + 1
            self._numbered[src] = frame.ses
            if self.trace is not None:
                self.trace(frame)
            obj = frame.value
            if not isinstance(obj, Envelope):
                raise wire.WireError(f"it holds a {type(obj).__name__}, not an Envelope")
            obj.arrived = arrived
        except wire.WireError as exc:
            self._refuse(src, str(exc))
            return False
        self._inbox[src].put(obj)
        return True

    def _from_current_session(self, src: int, frame: wire.Frame) -> bool:
        """Whether ``frame`` comes from ``src``'s current session and is addressed to this one; False for a frame
        addressed to an earlier process of this rank while it rejoins (dropped); :class:`~wire.WireError` for
        anything else (another run's frame, or a replay)."""
        known = self._sessions.setdefault(src, frame.ses)          # no announcement: the first frame's session
        if frame.ses != known:
            raise wire.WireError(f"it comes from session {frame.ses[:16]!r} of rank {src}, not its current "
                                 f"{known[:16]!r} (another run's frame, or replayed)")
        if frame.to != self.session:
            if self.rejoining and frame.to:
                return False
            raise wire.WireError(f"it is addressed to session {frame.to[:16]!r} of rank {self.rank}, not this "
                                 f"process's {self.session!r} (another run's frame, or replayed)")
        return True

    def announce(self, rank: int, session: str) -> None:
        """``rank``'s current process is ``session`` (a new one retires the one before: its frames are dropped,
        and frames to ``rank`` are addressed to the new one)."""
        earlier = self._sessions.get(rank)
        if earlier is not None and earlier != session:
            self._retired[rank].add(earlier)
        self._retired[rank].discard(session)
        self._sessions[rank] = session

    def _refuse(self, src: int, why: str) -> None:
        """Report a frame from ``src`` refused for ``why``; the peer counts as lost."""
        self._inbox[src].put(FrameRefused(src, self.describe(src), self.rank, why))

    def _lost(self, src: int, why: str) -> None:
        """Report a peer whose connection ended to whoever waits on it (not while closing)."""
        if not self.closing:
            self._inbox[src].put(PeerError(src, self.describe(src), why))

    def _silent(self, src: int, seconds: float) -> PeerError:
        """The error for a peer that sent nothing within ``seconds``."""
        return PeerError(src, self.describe(src), f"sent nothing for {seconds:g} s (--rank-timeout): it hangs or is too slow")

    def _transmit(self, dst: int, frame: bytes) -> None:
        raise NotImplementedError

    def _pending(self, dst: int) -> bool:
        """Whether frames to ``dst`` are still on their way (for :meth:`flush`)."""
        raise NotImplementedError

    # ---- sending --------------------------------------------------------------------------------------
    def send(self, obj: Any, dst: int, rate: float | None = None, charged_bytes: int | None = None) -> None:
        """Queue ``obj`` for ``dst`` in an :class:`Envelope` stamped now, without waiting (messages
        to one peer arrive in order); ``rate``/``charged_bytes`` as the envelope's."""
        with self._send_lock:
            if dst in self._send_error:
                raise PeerError(dst, self.describe(dst), f"stopped receiving ({self._send_error[dst]})")
            seq = self._sent_seq.get(dst, 0)
            self._sent_seq[dst] = seq + 1
            self._transmit(dst, wire.encode(Envelope(obj, time.time(), rate, charged_bytes), self.rank, dst, seq,
                                            self.key, self.session, self._sessions.get(dst, "")))
            self.last_sent[dst] = time.monotonic()

    def flush(self, timeout: float | None = None, skip_lost: bool = False) -> None:
        """Wait until every queued message has been taken by its receiver (deadline ``timeout``);
        with ``skip_lost`` a peer that stopped receiving is passed over, not raised (an abort still
        reaches the others)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        for dst in list(self._sent_seq):
            while self._pending(dst) and dst not in self._send_error:
                if time.monotonic() > deadline:
                    raise PeerError(dst, self.describe(dst), f"took no message for {self.timeout:g} s (--rank-timeout)")
                time.sleep(POLL_SECONDS)
            if dst in self._send_error and not skip_lost:
                raise PeerError(dst, self.describe(dst), f"stopped receiving ({self._send_error[dst]})")

    def close(self) -> None:
        self.closing = True

    def forget(self, rank: int, why: str) -> None:
        """Count ``rank`` as no longer receiving (it was taken out of the run): nothing more is
        sent to it, and a flush with ``skip_lost`` does not wait for it."""
        self._send_error.setdefault(rank, why)

    def restart_numbering(self, rank: int) -> None:
        """``rank`` is a new process (it sent :class:`Rejoin`, or rank 0 said :class:`Readmit`):
        frames both ways are numbered from 0 again and nothing of its earlier process is kept;
        nothing is sent to it until :meth:`admit` (rank 0 decides whether it takes it back)."""
        with self._send_lock:
            self._expected[rank] = 0
            self._sent_seq[rank] = 0
            self._send_error[rank] = RESTARTED
        box = self._inbox[rank]
        while not box.empty():                  # the same queue: a wait on it sees what comes next
            box.get_nowait()

    def admit(self, rank: int) -> None:
        """Send to ``rank`` again (it was taken back into the run)."""
        self._send_error.pop(rank, None)

    def restarted(self, rank: int) -> bool:
        """Whether ``rank`` is a new process not taken back (yet)."""
        return self._send_error.get(rank) == RESTARTED

    def waiting(self, src: int) -> bool:
        """Whether something from ``src`` (a message, or the error that ends it) is in, to be received at once."""
        return not self._inbox[src].empty()

    def take_waiting(self, src: int, kind: type) -> Envelope | None:
        """Without waiting: the first message of type ``kind`` already in from ``src`` (anything
        before it is dropped), or None."""
        box = self._inbox[src]
        while True:
            try:
                obj = box.get_nowait()
            except queue.Empty:
                return None
            if isinstance(obj, PeerError):
                box.put(obj)
                return None
            if isinstance(obj.msg, kind):
                return obj

    # ---- receiving ------------------------------------------------------------------------------------
    def recv(self, src: int, timeout: float | None = None, deadline: float | None = None) -> Envelope:
        """The next envelope from ``src`` within ``timeout`` s (default: the channel's; or until the
        :func:`time.monotonic` ``deadline``), its ``arrived`` the :func:`time.time` when it had fully
        arrived. An :class:`Abort` raises :class:`AbortRun`, a :class:`RoleError` the role's error."""
        nominal = self.timeout if timeout is None else timeout
        while True:
            wait = nominal if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                obj = self._inbox[src].get(timeout=wait)
            except queue.Empty:
                raise self._silent(src, nominal) from None
            if isinstance(obj, PeerError) or not isinstance(obj.msg, Alive):
                break                          # (a heartbeat: the peer lives; the wait starts over)
        if isinstance(obj, PeerError):
            self._inbox[src].put(obj)          # every later wait on this peer fails the same way
            raise obj
        msg = obj.msg
        if isinstance(msg, Abort):
            raise AbortRun(msg.reason)
        if isinstance(msg, RoleError) and msg.blame is not None and msg.blame != src and src not in SERVER_RANKS:
            raise PeerError(src, self.describe(src), f"sent a message its role may not send: an error blaming rank "
                                                     f"{show(msg.blame)} (only the servers name another rank)")
        if isinstance(msg, RoleError) and msg.kind == "bad" and isinstance(msg.blame, int) and msg.blame != src:
            raise PeerError(msg.blame, self.describe(msg.blame),
                            f"sent rank {src} ({self.describe(src)}) a message its role may not send: {msg.message}")
        if isinstance(msg, RoleError) and msg.kind == "lost" and isinstance(msg.blame, int) and msg.blame != src:
            raise PeerError(msg.blame, self.describe(msg.blame), f"{msg.message} (rank {src} ({self.describe(src)}) "
                                                                 "waited on it)")
        if isinstance(msg, RoleError):
            error = ROLE_ERRORS.get(msg.kind, MessageMismatchError)
            raise error(f"{self.describe(src)}: {msg.message}" if msg.kind == "input" else str(msg.message))
        return obj

    def recv_many(self, sources: Sequence[int], timeout: float | None = None) -> list[tuple[int, Envelope]]:
        """One envelope per entry of ``sources`` (a rank may appear several times: that many messages,
        in its order), as (source, object); all were being received concurrently."""
        nominal = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + nominal
        return [(s, self.recv(s, nominal, deadline)) for s in sources]


class Channel(FrameChannel):
    """Frames over torch.distributed (gloo): one receiving thread per peer (blocking receives, so a
    message is taken in as soon as it arrives and stamped ``arrived``), one sending thread per
    destination (a send never blocks the caller, and messages to one peer keep their order).
    ``group`` is the process group used for the transfers (created without a time-out of its own:
    waiting is bounded here)."""

    def __init__(self, timeout: float, describe: Callable[[int], str], group: Any = None, key: bytes = b"",
                 trace: Callable[[wire.Frame], None] | None = None) -> None:
        rank = dist.get_rank()
        peers = [r for r in range(dist.get_world_size()) if r != rank]
        super().__init__(rank, peers, timeout, describe, key, trace)
        self.group = group
        self._outbox: dict[int, queue.Queue] = {}
        for r, session in enumerate(exchange_sessions(self.session)):
            if r != rank:
                self.announce(r, session)
        for r in peers:
            threading.Thread(target=self._receive_from, args=(r,), daemon=True, name=f"recv-{r}").start()

    # ---- threads --------------------------------------------------------------------------------------
    def _receive_from(self, src: int) -> None:
        while True:
            header = torch.zeros(1, dtype=torch.int64)
            try:
                dist.recv(header, src, group=self.group)
                length = int(header[0])
                if not 0 < length <= wire.MAX_FRAME_BYTES:
                    self._refuse(src, f"its length {length} bytes is outside 1..{wire.MAX_FRAME_BYTES}")
                    return
                payload = torch.empty(length, dtype=torch.uint8)
                dist.recv(payload, src, group=self.group)
            except Exception as exc:   # noqa: BLE001 - a closed connection, reported to the waiting caller
                self._lost(src, f"closed its connection ({_cause(exc)})")
                return
            if not self._accept(src, payload.numpy(), time.time()):
                return

    def _send_to(self, dst: int, box: queue.Queue) -> None:
        while True:
            item = box.get()
            try:
                if item is _CLOSED:
                    return
                if dst not in self._send_error:
                    header, payload = item
                    dist.send(header, dst, group=self.group)
                    dist.send(payload, dst, group=self.group)
            except Exception as exc:   # noqa: BLE001 - reported at the next send or flush
                self._send_error[dst] = _cause(exc)
            finally:
                box.task_done()

    def _transmit(self, dst: int, frame: bytes) -> None:
        box = self._outbox.get(dst)
        if box is None:
            box = self._outbox[dst] = queue.Queue()
            threading.Thread(target=self._send_to, args=(dst, box), daemon=True, name=f"send-{dst}").start()
        payload = torch.frombuffer(bytearray(frame), dtype=torch.uint8)
        box.put((torch.tensor([payload.numel()], dtype=torch.int64), payload))

    def _pending(self, dst: int) -> bool:
        return bool(self._outbox[dst].unfinished_tasks) if dst in self._outbox else False

    def close(self) -> None:
        """Stop the sending threads after their queues; receiving threads end with the process group."""
        self.closing = True
        for box in self._outbox.values():
            box.put(_CLOSED)


SESSION_BYTES = 8


def exchange_sessions(mine: str) -> list[str]:
    """Every rank's session, by rank, from one all-gather over the default group (its set-up time-out) before
    any frame: 8 bytes each, raw, nothing unpickled."""
    raw = torch.frombuffer(bytearray(bytes.fromhex(mine)), dtype=torch.uint8)
    out = [torch.zeros(SESSION_BYTES, dtype=torch.uint8) for _ in range(dist.get_world_size())]
    dist.all_gather(out, raw)
    return [bytes(t.tolist()).hex() for t in out]


def _cause(exc: BaseException) -> str:
    """A whole sentence for a failed transfer: the library's text only names the kind of failure."""
    text = str(exc).lower()
    if "closed by peer" in text or "connection reset" in text or "broken pipe" in text or "eof" in text:
        return "it died or was killed"
    if "timed out" in text or "timeout" in text:
        return "the transfer timed out"
    return f"the transfer failed with a {type(exc).__name__}"
