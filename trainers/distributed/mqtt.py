"""Frames over an MQTT broker: ranks that connect *out* (devices behind NATs), the same role code
(docs/mqtt.md).

Every rank is one long-lived MQTT client (paho-mqtt), logged in as ``rank<r>`` with its own
password, over TLS to the broker (the CA certificate given). Topics, one per (receiver, sender)::

    ap/<run>/to/rank<dst>/from/rank<src>     a frame of the safe wire (trainers/distributed/wire.py)
    ap/<run>/ready/rank<r>                    rank r is subscribed (the start barrier); its payload is the
                                              session of rank r's process (FrameChannel.announce), and in a
                                              reply to a new session of rank q also the session this rank knew
                                              for q before (``<session> rank<q>=<earlier>``); empty: a goodbye
    ap/<run>/gone/rank<r>                     rank r's will: its connection dropped without a goodbye

Nothing is retained (the written broker configurations set ``retain_available false``: a client that
publishes with retain is disconnected), so nothing a broker keeps can poison a later start. The start
barrier works without it: a rank says ready once subscribed, and every rank that sees a session it
did not know answers with its own ready flag, so a rank that subscribes late still hears of every rank
that came before it. A process started again for its rank learns that it replaces an earlier one
(``rejoining``) from a peer's answer naming the earlier session.

The broker's access control list lets ``rank<r>`` read only ``to/rank<r>/#`` and write only
``to/+/from/rank<r>`` (and its own ready/gone topics), so a device can neither read another's
frames nor write in another's name; the frames are authenticated besides (HMAC, per-pair numbers).

Delivery: QoS 1 on a persistent session (``clean_session=False``: the broker holds a rank's frames
while it reconnects), so a frame is never lost; QoS 1 may deliver one twice, and the per-pair
sequence number drops the copy (:meth:`FrameChannel._accept` with ``duplicates``), so nothing enters
a round twice. A rank whose connection drops reconnects by itself (paho, every 1-4 s) and the run
goes on where it was: the broker held the frames sent to it, and it re-sends what the broker had not
acknowledged. A rank that does not come back — its will announced the drop — is named by whoever
waits on it after ``--rank-timeout`` s; the run then stops and can be resumed from its checkpoint.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from typing import Any, Callable

from adaptplan.errors import InputError
from trainers.distributed import wire
from trainers.distributed.mqtt_login import (  # noqa: F401  (re-exported: the runtime's names)
    BROKER_ENV,
    CA_ENV,
    PASSWORD_FILE_ENV,
    RUN_ENV,
    BrokerLogin,
    broker_login,
    frame_topic,
    user,
)
from trainers.distributed.transport import FrameChannel, PeerError

_READY = re.compile(r"([0-9a-f]{16})(?: rank([0-9]{1,6})=([0-9a-f]{16}))?")
"""A ready flag's payload: the sender's session (FrameChannel.session) and, in an answer to a new session of
rank q, the session the sender knew for q before (module docstring)."""
CONNECT_SECONDS = 10.0


class MqttChannel(FrameChannel):
    """This rank's end of every pair over the broker (module docstring). Construction connects,
    subscribes, announces this rank and waits until all ``world`` ranks have (``CONNECT_SECONDS``
    × the set-up factor at most)."""

    def __init__(self, rank: int, world: int, timeout: float, describe: Callable[[int], str], key: bytes,
                 login: BrokerLogin, trace: Callable[[wire.Frame], None] | None = None,
                 wait_seconds: float = CONNECT_SECONDS) -> None:
        import paho.mqtt.client as mqtt

        peers = [r for r in range(world) if r != rank]
        super().__init__(rank, peers, timeout, describe, key, trace)
        self.login = login
        self._ready: set[int] = set()
        self.granted_qos: list[int] = []            # per subscription, as the broker acknowledged it
        self._gone: dict[int, float] = {}
        self._connected = threading.Event()
        self._refused: str | None = None
        self._inflight: dict[int, list[int]] = {}     # per receiver: message ids the broker has not acknowledged
        self._acked: set[int] = set()
        self._untracked: set[int] = set()            # our own ready flags' message ids: no frame waits on them
        self._echo = threading.Event()               # our own ready flag came back through the broker
        self._seen: dict[int, str] = {}              # each peer's session as its ready flags named it
        self._left: set[int] = set()                 # peers that said goodbye: their next process is no restart
        self._starting = True                        # until the start barrier is passed (rejoining is decided)
        self._drop_earlier_session(mqtt, wait_seconds)
        self.client = self._new_client(mqtt, clean=False)
        self.client.will_set(f"ap/{login.run}/gone/{user(rank)}", b"", qos=1)
        self.client.max_inflight_messages_set(1000)
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_subscribe
        self.client.on_publish = self._on_publish
        self.client.reconnect_delay_set(min_delay=1, max_delay=4)
        try:
            self.client.connect(login.host, login.port, keepalive=max(5, int(timeout)))
        except (OSError, ValueError) as exc:
            raise InputError(f"rank {rank} cannot reach the broker at {login.host}:{login.port} "
                             f"({type(exc).__name__}: {exc})", field=BROKER_ENV) from None
        self.client.loop_start()
        deadline = time.monotonic() + wait_seconds
        while not self._connected.is_set() and self._refused is None and time.monotonic() < deadline:
            time.sleep(0.01)
        if self._refused is not None or not self._connected.is_set():
            self.client.loop_stop()
            raise InputError(f"the broker at {login.host}:{login.port} refused rank {rank} "
                             f"({self._refused or 'no answer'})", field=PASSWORD_FILE_ENV)
        while len(self._ready & set(peers)) < len(peers) and time.monotonic() < deadline + wait_seconds:
            time.sleep(0.01)
        absent = sorted(set(peers) - self._ready)
        if absent:
            raise InputError(f"rank {rank} waited {2 * wait_seconds:g} s for rank{'s' if len(absent) > 1 else ''} "
                             f"{', '.join(map(str, absent))} at the broker", field=BROKER_ENV)
        self._echo.wait(max(0.0, deadline + wait_seconds - time.monotonic()))
        self._starting = False
        if self.rejoining:                           # frames still numbered for the earlier process are dropped
            self._restarting = set(peers)

    def _new_client(self, mqtt: Any, clean: bool) -> Any:
        """A paho client of this rank's identity and login (TLS to the broker's CA)."""
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"{self.login.run}-{user(self.rank)}",
                             clean_session=clean, protocol=mqtt.MQTTv311)
        client.username_pw_set(user(self.rank), self.login.password)
        client.tls_set(ca_certs=self.login.ca_file)
        return client

    def _drop_earlier_session(self, mqtt: Any, wait_seconds: float) -> None:
        """Connect once with a clean session and leave, so that the broker forgets what it held for
        an earlier process of this rank (frames numbered for that process). A failure here is left
        to the real connection, which names it."""
        done = threading.Event()
        client = self._new_client(mqtt, clean=True)
        client.on_connect = lambda *args: done.set()
        try:
            client.connect(self.login.host, self.login.port)
        except (OSError, ValueError):
            return
        client.loop_start()
        done.wait(wait_seconds)
        client.disconnect()
        client.loop_stop()

    # ---- paho's callbacks (its network thread) --------------------------------------------------------
    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any = None) -> None:
        if reason.is_failure:
            self._refused = str(reason)
            return
        sock = client.socket()
        if sock is not None:          # no Nagle delay: a frame is one burst, its reply waits on it
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        run = self.login.run
        client.subscribe([(f"ap/{run}/to/{user(self.rank)}/#", 1), (f"ap/{run}/ready/+", 1),
                          (f"ap/{run}/gone/+", 1)])

    def _on_subscribe(self, client: Any, userdata: Any, mid: int, reasons: Any, properties: Any = None) -> None:
        """Subscribed (only now may peers send: the broker keeps frames for subscriptions it has)."""
        self.granted_qos = [r.value for r in reasons]
        if any(r.is_failure for r in reasons):
            self._refused = f"a subscription was refused: {', '.join(str(r) for r in reasons)}"
            return
        self._say_ready(client, "")   # (again) here
        self._connected.set()

    def _say_ready(self, client: Any, answer: str) -> None:
        """Publish this rank's ready flag (never retained); ``answer``: `` rank<q>=<earlier>`` or nothing."""
        ready = client.publish(f"ap/{self.login.run}/ready/{user(self.rank)}", (self.session + answer).encode(),
                               qos=1)
        self._untracked.add(ready.mid)

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        parts = message.topic.split("/")
        try:
            src = int(parts[-1].removeprefix("rank"))
        except ValueError:
            return
        if src == self.rank:
            if parts[2] == "ready" and message.payload and not message.retain:
                self._echo.set()
            return
        if src not in self._inbox or message.retain:   # nothing is retained: a retained message is a broker's junk
            return
        if parts[2] == "ready":
            self._on_ready(client, src, bytes(message.payload))
        elif parts[2] == "gone":
            self._gone[src] = time.monotonic()
        elif parts[2] == "to":
            self._accept(src, bytes(message.payload), time.time(), duplicates=True)

    def _on_ready(self, client: Any, src: int, payload: bytes) -> None:
        """``src`` is subscribed (or, with an empty payload, said goodbye). A session not seen before is
        answered with this rank's own flag, naming the session known for ``src`` before unless it left
        cleanly; an answer that names this rank's earlier process makes this one a restart (``rejoining``)."""
        if not payload:
            self._left.add(src)
            return
        text = payload.decode("ascii", "replace")
        found = _READY.fullmatch(text)
        if found is None:
            self._refuse(src, f"its ready flag holds {text[:40]!r}, not a session")
            return
        session, about, earlier = found.groups()
        if about is not None and int(about) == self.rank and earlier != self.session and self._starting:
            self.rejoining = True                   # a peer knew an earlier process of this rank
        known = self._seen.get(src)
        self._seen[src] = session
        self.announce(src, session)
        self._ready.add(src)
        self._gone.pop(src, None)                  # it came back: the broker held its frames meanwhile
        if known != session:
            answer = f" {user(src)}={known}" if known is not None and src not in self._left else ""
            self._left.discard(src)
            self._say_ready(client, answer)

    def _silent(self, src: int, seconds: float) -> PeerError:
        if src in self._gone:
            return PeerError(src, self.describe(src), f"lost its connection to the broker and did not come back within "
                                                      f"{seconds:g} s (--rank-timeout): it died or was killed")
        return super()._silent(src, seconds)

    # ---- the carrier --------------------------------------------------------------------------------
    def _on_publish(self, client: Any, userdata: Any, mid: int, reason: Any = None, properties: Any = None) -> None:
        """The broker has a message (PUBACK). A frame's id is kept until :meth:`_prune` drops it; a ready
        flag's is not kept at all, so that no stale id can pass for a frame's once paho's ids wrap."""
        if mid in self._untracked:
            self._untracked.discard(mid)
        else:
            self._acked.add(mid)

    def _transmit(self, dst: int, frame: bytes) -> None:
        """Publish at QoS 1; while disconnected paho keeps the frame and sends it on reconnecting."""
        info = self.client.publish(frame_topic(self.login.run, dst, self.rank), frame, qos=1)
        self._inflight.setdefault(dst, []).append(info.mid)
        self._prune(dst)

    def _prune(self, dst: int) -> list[int]:
        """Drop the frames to ``dst`` the broker acknowledged; the ids still unacknowledged."""
        sent = self._inflight.get(dst, [])
        done = {m for m in sent if m in self._acked}
        self._acked.difference_update(done)
        self._inflight[dst] = [m for m in sent if m not in done]
        return self._inflight[dst]

    def _pending(self, dst: int) -> bool:
        return bool(self._prune(dst))

    def close(self) -> None:
        """Deliver what is queued, say goodbye (an empty ready flag) and disconnect (no will). The goodbye is best
        effort: a rank whose connection is down at that moment (paho reconnecting) still ends; its next process
        is then taken for a restart of this one (``rejoining``)."""
        try:
            self.flush(timeout=self.timeout, skip_lost=True)
        finally:
            try:
                self.client.publish(f"ap/{self.login.run}/ready/{user(self.rank)}", b"", qos=1).wait_for_publish(2.0)
            except (RuntimeError, ValueError):      # paho: "The client is not currently connected"
                pass
            self.client.disconnect()
            self.client.loop_stop()
