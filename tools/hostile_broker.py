#!/usr/bin/env python3
"""A device login against the broker (issue 67 item 5): a real Mosquitto broker as ``adaptplan train --runtime
mqtt`` starts it (TLS, per-rank passwords, the access control list, the limits from the run's largest frame), and
rank 2 — a device host holding its own password — tries what its login allows and what it does not: retained
payloads, packets past the size limit, floods for a rank that is away, topics of other ranks, other runs, the
broker's own and wildcards, another rank's client id, wrong passwords, many sessions.

Each case ends as one of: held (the broker refused or dropped it, no other rank received anything it should not
have, nothing was kept for a later subscriber, the broker's resident memory stayed within its queue bound, and
the broker still serves an honest pair of ranks), leaked (another rank or a later subscriber received something),
grown (the broker's memory rose past the bound), or down (the broker died or stopped serving). Prints the counts
and each case that was not held.

    python tools/hostile_broker.py
"""

from __future__ import annotations

import collections
import contextlib
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import paho.mqtt.client as mqtt  # noqa: E402

from trainers.distributed.broker import BrokerLimits, LocalBroker, start_local_broker  # noqa: E402
from trainers.distributed.launch import free_port  # noqa: E402
from trainers.distributed.mqtt import frame_topic  # noqa: E402

WORLD, LARGEST = 4, 256 * 1024          # four ranks; the run's largest frame 256 KiB
LIMITS = BrokerLimits.for_run(WORLD, LARGEST)
ATTACKER = 2


def rss_kib(broker: LocalBroker) -> int:
    for line in Path(f"/proc/{broker.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def client(broker: LocalBroker, rank: int, *, client_id: str | None = None, password: str | None = None,
           clean: bool = True, tls: bool = True) -> Any:
    """A bare paho client logged in as ``rank``, recording what it receives and whether it was dropped; its
    ``connected`` event says whether the broker took the login."""
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id or f"rank{rank}", clean_session=clean,
                    protocol=mqtt.MQTTv311)
    c.username_pw_set(f"rank{rank}", broker.password_files[rank].read_text() if password is None else password)
    if tls:
        c.tls_set(ca_certs=str(broker.ca_file))
    c.received, c.dropped, c.connected, c.subscribed = [], threading.Event(), threading.Event(), threading.Event()
    c.on_connect = lambda cl, u, flags, reason, p=None: (c.connected.set() if not reason.is_failure
                                                          else c.dropped.set())
    c.on_disconnect = lambda cl, u, flags, reason, p=None: c.dropped.set()
    c.on_message = lambda cl, u, m: c.received.append((m.topic, bytes(m.payload), m.retain))
    c.on_subscribe = lambda cl, u, mid, reasons, p=None: c.subscribed.set()
    c.reconnect_delay_set(60, 60)
    with contextlib.suppress(Exception):
        c.connect(broker.host, broker.port)
    c.loop_start()
    c.connected.wait(3)
    return c


def stop(c: Any) -> None:
    c.loop_stop()
    with contextlib.suppress(Exception):
        c.disconnect()


def listeners(broker: LocalBroker) -> list[Any]:
    """Every rank but the attacker, subscribed to its own inbox (what its login may read)."""
    out = []
    for r in range(WORLD):
        if r != ATTACKER:
            c = client(broker, r)
            c.subscribe(f"ap/{broker.run}/to/rank{r}/#", qos=1)
            c.subscribed.wait(3)
            out.append(c)
    return out


def publish(topic: Callable[[LocalBroker], str], payload: bytes, *, retain: bool = False, times: int = 1,
            qos: int = 1) -> Callable[[LocalBroker, Any], None]:
    def act(broker: LocalBroker, attacker: Any) -> None:
        for _ in range(times):
            if attacker.dropped.is_set():
                return
            with contextlib.suppress(Exception):
                info = attacker.publish(topic(broker), payload, qos=qos, retain=retain)
                if qos:
                    info.wait_for_publish(2)
    return act


def subscribe(topic: Callable[[LocalBroker], str]) -> Callable[[LocalBroker, Any], None]:
    def act(broker: LocalBroker, attacker: Any) -> None:
        with contextlib.suppress(Exception):
            attacker.subscribe(topic(broker), qos=1)
        time.sleep(0.3)
        with contextlib.suppress(Exception):       # an honest frame to rank 1 that the attacker must not see
            honest = client(broker, 0, client_id="rank0")
            honest.publish(frame_topic(broker.run, 1, 0), b"honest", qos=1).wait_for_publish(2)
            stop(honest)
    return act


def to(rank: int) -> Callable[[LocalBroker], str]:
    return lambda b: frame_topic(b.run, rank, ATTACKER)


CASES: dict[str, Callable[[LocalBroker, Any], None]] = {
    "retained frame to rank 0": publish(to(0), b"APW1 junk", retain=True),
    "retained frame to rank 1": publish(to(1), b"APW1 junk", retain=True),
    "retained empty payload": publish(to(0), b"", retain=True),
    "packet at the limit + 1": publish(to(0), b"x" * (LIMITS.max_packet_bytes + 1)),
    "packet 10 × the limit": publish(to(0), b"x" * (10 * LIMITS.max_packet_bytes)),
    "1,000 frames to a rank away": publish(to(3), b"x" * 1024, times=1000),
    "200 largest frames to a rank away": publish(to(3), b"x" * LARGEST, times=200),
    "1,000 QoS 0 frames": publish(to(3), b"x" * 4096, times=1000, qos=0),
    "in another rank's name": publish(lambda b: frame_topic(b.run, 0, 3), b"APW1 forged"),
    "to another run": publish(lambda b: f"ap/other{b.run}/to/rank0/from/rank{ATTACKER}", b"x"),
    "to the broker's $SYS": publish(lambda b: "$SYS/broker/x", b"x"),
    "to a topic outside ap/": publish(lambda b: "x/y", b"x"),
    "to a wildcard topic": publish(lambda b: f"ap/{b.run}/to/+/from/rank{ATTACKER}", b"x"),
    "to a 60,000-byte topic": publish(lambda b: "ap/" + "t" * 60_000, b"x"),
    "to its own inbox": publish(lambda b: frame_topic(b.run, ATTACKER, ATTACKER), b"x"),
    "subscribe to #": subscribe(lambda b: "#"),
    "subscribe to another rank's inbox": subscribe(lambda b: f"ap/{b.run}/to/rank1/#"),
    "subscribe to $SYS/#": subscribe(lambda b: "$SYS/#"),
    "subscribe to the run's +": subscribe(lambda b: f"ap/{b.run}/+/+/+/+"),
}
LOGINS: dict[str, dict[str, Any]] = {
    "another rank's client id": {"client_id": "rank1"},
    "a client id of its own": {"client_id": "mine"},
    "a wrong password": {"password": "wrong"},
    "an empty password": {"password": ""},
    "without TLS": {"tls": False},
    "a persistent session": {"clean": False},
}


def honest_pair_works(broker: LocalBroker) -> bool:
    receiver, sender = client(broker, 1), client(broker, 0)
    try:
        receiver.subscribe(f"ap/{broker.run}/to/rank1/#", qos=1)
        receiver.subscribed.wait(3)
        sender.publish(frame_topic(broker.run, 1, 0), b"check", qos=1).wait_for_publish(3)
        deadline = time.monotonic() + 3
        while not receiver.received and time.monotonic() < deadline:
            time.sleep(0.02)
        return [p for _, p, _ in receiver.received] == [b"check"]
    finally:
        stop(sender)
        stop(receiver)


def verdict(broker: LocalBroker, others: list[Any], attacker: Any, before_kib: int, honest: set[bytes]) -> str:
    time.sleep(0.5)
    if broker.process.poll() is not None:
        return "down"
    foreign = [p for o in others for _, p, _ in o.received if p not in honest]
    seen = [p for _, p, _ in attacker.received if p in honest]
    later = client(broker, 0, client_id="rank0")
    later.subscribe(f"ap/{broker.run}/to/rank0/#", qos=1)
    later.subscribed.wait(3)
    time.sleep(0.3)
    kept = list(later.received)
    stop(later)
    if foreign or seen or kept:
        return "leaked"
    bound_kib = (LIMITS.queued_bytes * WORLD) // 1024 + 8 * 1024
    if rss_kib(broker) - before_kib > bound_kib:
        return "grown"
    return "held" if honest_pair_works(broker) else "down"


def run_case(name: str, act: Callable[[LocalBroker, Any], None] | None, login: dict[str, Any]) -> tuple[str, str]:
    with tempfile.TemporaryDirectory(prefix="hostile-broker-") as folder:
        broker = start_local_broker(Path(folder) / "broker", WORLD, free_port(), largest_frame_bytes=LARGEST)
        try:
            away = client(broker, 3, clean=False)            # rank 3 subscribes, then is away (a queue builds)
            away.subscribe(f"ap/{broker.run}/to/rank3/#", qos=1)
            away.subscribed.wait(3)
            stop(away)
            others = [c for c in listeners(broker) if c._client_id != b"rank3"]
            before = rss_kib(broker)
            attacker = client(broker, ATTACKER, **login)
            if act is not None:
                act(broker, attacker)
            elif attacker.connected.is_set() and not attacker.dropped.is_set() and login.get("password") is not None:
                return "leaked", "the broker took the login"
            result = verdict(broker, others, attacker, before, {b"honest"})
            stop(attacker)
            for o in others:
                stop(o)
            return result, f"rss {before} → {rss_kib(broker) if broker.process.poll() is None else 0} KiB"
        finally:
            broker.stop()


def main() -> None:
    counts: collections.Counter = collections.Counter()
    notes = []
    for name, act in [*CASES.items(), *((n, None) for n in LOGINS)]:
        result, detail = run_case(name, act, LOGINS.get(name, {}))
        counts[result] += 1
        print(f"{name:36s} {result:7s} {detail}", flush=True)
        if result != "held":
            notes.append(f"{name}: {result} ({detail})")
    print(f"\ncases {sum(counts.values())}, held {counts['held']}, leaked {counts['leaked']}, grown {counts['grown']}, "
          f"down {counts['down']}")
    for note in notes:
        print("  " + note)
    control, _ = run_case("control", publish(to(0), b"junk"), {})
    print(f"control (a junk frame on a topic its login may use, to rank 0): {control} — the harness sees a frame "
          "that gets through; the broker cannot judge a frame's contents: rank 0's channel refuses it by its "
          "signature (tools/hostile_frames.py)")


if __name__ == "__main__":
    main()
