"""The MQTT runtime (trainers/distributed/mqtt.py, broker.py; docs/mqtt.md): frames through a real
Mosquitto broker on loopback with TLS and per-rank passwords; a wrong password, another rank's
topics and a re-delivered frame are refused or dropped; a rank that drops off is named; and
``adaptplan train --runtime mqtt`` gives the simulator's losses for every algorithm.

Needs the ``mosquitto`` binary (.ci/run installs the Debian package where it is missing) and
paho-mqtt (the ``test`` extra); without the binary these tests are skipped, saying so."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from adaptplan.cli import main
from adaptplan.errors import InputError
from tests.process_runs import finished_slowly
from trainers.algorithms import REGISTRY
from trainers.config.train_config import ALGORITHMS
from trainers.distributed import broker as broker_module
from trainers.distributed.broker import acl_text, start_local_broker
from trainers.distributed.launch import free_port
from trainers.distributed.mqtt import BrokerLogin, MqttChannel, frame_topic
from trainers.distributed.transport import PeerError
from trainers.run.history import History

MOSQUITTO = shutil.which("mosquitto") or shutil.which("mosquitto", path="/usr/sbin:/usr/local/sbin")
pytestmark = [pytest.mark.skipif(MOSQUITTO is None, reason="the mosquitto broker is not installed (apt-get install "
                                                           "mosquitto); .ci/run installs it"),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a local broker on loopback")]
KEY = b"k" * 32


@pytest.fixture()
def broker(tmp_path):
    running = start_local_broker(tmp_path / "broker", 4, free_port())
    yield running
    running.stop()


def login(broker, rank: int, password: str | None = None) -> BrokerLogin:
    return BrokerLogin(broker.host, broker.port, str(broker.ca_file), broker.run,
                       password if password is not None else broker.password_files[rank].read_text())


def channels(broker, ranks, world: int = 2, timeout: float = 5.0) -> dict[int, MqttChannel]:
    made: dict[int, MqttChannel] = {}
    errors = []

    def make(r: int) -> None:
        try:
            made[r] = MqttChannel(r, world, timeout, lambda x: f"role {x}", KEY, login(broker, r), wait_seconds=5.0)
        except Exception as exc:   # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=make, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return made


def test_frames_cross_the_broker_in_order_and_intact(broker) -> None:
    ch = channels(broker, [0, 1])
    sent = [torch.randn(16, 32, 8, 8) for _ in range(5)]
    for i, x in enumerate(sent):
        ch[0].send({"a": x, "i": i}, 1, rate=7.5e7, charged_bytes=100)
    got = [ch[1].recv(0) for _ in sent]
    assert [e.msg["i"] for e in got] == [0, 1, 2, 3, 4]
    assert all(torch.equal(e.msg["a"], x) for e, x in zip(got, sent))
    assert got[0].rate == 7.5e7 and got[0].charged_bytes == 100 and got[0].arrived >= got[0].t_send
    ch[0].flush(2.0)
    for c in ch.values():
        c.close()


def test_a_wrong_password_is_refused_at_the_broker(broker) -> None:
    with pytest.raises(InputError, match=r"the broker at 127.0.0.1:\d+ refused rank 2 \(Not authorized\)"):
        MqttChannel(2, 3, 5.0, str, KEY, login(broker, 2, password="guess-" + "0" * 26), wait_seconds=3.0)
    other = broker.password_files[3].read_text()            # rank 3's password does not log rank 2 in either
    with pytest.raises(InputError, match="refused rank 2"):
        MqttChannel(2, 3, 5.0, str, KEY, login(broker, 2, password=other), wait_seconds=3.0)


def test_a_rank_can_neither_read_another_ranks_frames_nor_write_in_its_name(broker) -> None:
    import paho.mqtt.client as mqtt

    ch = channels(broker, [0, 1, 2, 3], world=4)
    intruder = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="intruder", protocol=mqtt.MQTTv311)
    intruder.username_pw_set("rank2", broker.password_files[2].read_text())
    intruder.tls_set(ca_certs=str(broker.ca_file))
    granted: list = []
    received: list = []
    intruder.on_subscribe = lambda c, u, mid, reasons, p=None: granted.extend(reasons)
    intruder.on_message = lambda c, u, m: received.append(m.topic)
    intruder.connect(broker.host, broker.port)
    intruder.loop_start()
    try:
        intruder.subscribe(frame_topic(broker.run, 3, 0), qos=1)          # rank 3's inbound frames
        deadline = time.monotonic() + 5
        while not granted and time.monotonic() < deadline:
            time.sleep(0.01)
        assert granted                   # MQTT 3.1.1: the broker acknowledges, then delivers nothing the ACL forbids
        ch[0].send({"for": "rank 3"}, 3)
        assert ch[3].recv(0).msg == {"for": "rank 3"}
        time.sleep(0.5)
        assert received == []
        forged = intruder.publish(frame_topic(broker.run, 0, 3), b"APW1 forged", qos=1)   # in rank 3's name
        forged.wait_for_publish(5)
        ch[2].send({"from": "rank 2"}, 0)                                 # its own frames still go through
        assert ch[0].recv(2).msg == {"from": "rank 2"}
        with pytest.raises(PeerError, match="sent nothing"):
            ch[0].recv(3, timeout=0.5)                                    # the forged frame never reached rank 0
    finally:
        intruder.loop_stop()
        for c in ch.values():
            c.close()


def test_a_rank_cannot_take_over_another_ranks_client_id(broker) -> None:
    """Issue 36 M1: rank 2, logged in with its own password, connected under rank 3's client id and knocked
    rank 3 off the broker. The broker now gives every client its user name as its client id."""
    import paho.mqtt.client as mqtt

    ch = channels(broker, [0, 1, 2, 3], world=4)
    intruder = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"{broker.run}-rank3", protocol=mqtt.MQTTv311)
    intruder.username_pw_set("rank2", broker.password_files[2].read_text())
    intruder.tls_set(ca_certs=str(broker.ca_file))
    connected = threading.Event()
    intruder.on_connect = lambda c, u, flags, reason, p=None: connected.set()
    intruder.connect(broker.host, broker.port)
    intruder.loop_start()
    try:
        assert connected.wait(5)
        time.sleep(0.5)
        for i in range(3):                          # rank 3 keeps its connection: nothing lost, nothing repeated
            ch[0].send({"i": i}, 3)
            assert ch[3].recv(0).msg == {"i": i}
        assert "rank3" not in " ".join(line for line in (broker.folder / "broker.log").read_text().splitlines()
                                       if "already connected" in line or "session taken over" in line)
    finally:
        intruder.loop_stop()
        intruder.disconnect()
        for r, c in ch.items():
            with contextlib.suppress(RuntimeError) if r == 2 else contextlib.nullcontext():
                c.close()                           # rank 2's own login is the intruder's: its session was taken


def raw_client(broker, rank: int, client_id: str | None = None, clean: bool = True):
    """A bare paho client logged in as ``rank`` (connected, its loop running), recording what it receives and
    whether the broker dropped it; ``client_id`` None: its login's (the broker binds them)."""
    import paho.mqtt.client as mqtt

    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id or f"rank{rank}",
                         clean_session=clean, protocol=mqtt.MQTTv311)
    client.username_pw_set(f"rank{rank}", broker.password_files[rank].read_text())
    client.tls_set(ca_certs=str(broker.ca_file))
    client.received, client.dropped, client.subscribed = [], threading.Event(), threading.Event()
    connected = threading.Event()
    client.on_connect = lambda c, u, flags, reason, p=None: connected.set()
    client.on_disconnect = lambda c, u, flags, reason, p=None: client.dropped.set()
    client.on_message = lambda c, u, m: client.received.append((m.topic, bytes(m.payload), m.retain))
    client.on_subscribe = lambda c, u, mid, reasons, p=None: client.subscribed.set()
    client.reconnect_delay_set(60, 60)              # a dropped client stays dropped while the test looks
    client.connect(broker.host, broker.port)
    client.loop_start()
    assert connected.wait(5)
    return client


def stop_client(client) -> None:
    client.loop_stop()
    with contextlib.suppress(Exception):
        client.disconnect()


def test_the_broker_keeps_nothing_retained_and_drops_who_publishes_so(broker) -> None:
    """Issue 67 M4 (and issue 36 M2): retained junk on a frame topic stayed on the broker for every rank that
    subscribed later. The written configuration sets ``retain_available false``: the publisher is disconnected
    and nothing is kept, so neither a later subscriber nor a later start sees it."""
    junk = raw_client(broker, 0)
    try:
        junk.publish(frame_topic(broker.run, 1, 0), b"APW1 junk kept by the broker", qos=1, retain=True)
        assert junk.dropped.wait(5)                         # the broker cut it off for the retain bit
    finally:
        stop_client(junk)
    later = raw_client(broker, 1)
    try:
        later.subscribe(f"ap/{broker.run}/to/rank1/#", qos=1)
        assert later.subscribed.wait(5)
        time.sleep(0.5)
        assert later.received == []                          # nothing was kept for a later subscriber
    finally:
        stop_client(later)
    ch = channels(broker, [0, 1])
    try:
        ch[0].send({"i": 0}, 1)
        assert ch[1].recv(0).msg == {"i": 0}               # and the start barrier needs no retained flag
    finally:
        for c in ch.values():
            c.close()


def test_a_packet_beyond_the_runs_largest_frame_disconnects_its_sender(tmp_path) -> None:
    """Issue 67 M4: 10 × 50 MB raised the broker from 9 to 486 MB. The limit comes from the run's largest frame
    (here 64 KiB): a frame within it passes, a larger one disconnects its sender and reaches nobody."""
    from trainers.distributed.broker import BrokerLimits

    running = start_local_broker(tmp_path / "broker", 2, free_port(), largest_frame_bytes=64 * 1024)
    limits = BrokerLimits.for_run(2, 64 * 1024)
    assert f"max_packet_size {limits.max_packet_bytes}\n" in (running.folder / "mosquitto.conf").read_text()
    receiver, sender = raw_client(running, 1), raw_client(running, 0)
    try:
        receiver.subscribe(f"ap/{running.run}/to/rank1/#", qos=1)
        assert receiver.subscribed.wait(5)
        sender.publish(frame_topic(running.run, 1, 0), b"f" * (64 * 1024), qos=1).wait_for_publish(5)
        big = sender.publish(frame_topic(running.run, 1, 0), b"b" * (limits.max_packet_bytes + 1), qos=1)
        assert sender.dropped.wait(5) and not big.is_published()
        time.sleep(0.5)
        assert [len(payload) for _, payload, _ in receiver.received] == [64 * 1024]
    finally:
        stop_client(sender)
        stop_client(receiver)
        running.stop()


def test_the_broker_holds_a_bounded_queue_for_a_rank_that_is_away(tmp_path) -> None:
    """Issue 67 M4: the queue the broker holds for a rank while it reconnects is bounded
    (:data:`QUEUED_FRAMES_PER_PEER` frames per peer): of 100 frames sent while rank 1 is away, it gets the first
    64 when it is back, and the rest are dropped at the broker."""
    from trainers.distributed.broker import QUEUED_FRAMES_PER_PEER

    running = start_local_broker(tmp_path / "broker", 2, free_port(), largest_frame_bytes=4096)
    away = raw_client(running, 1, clean=False)
    away.subscribe(f"ap/{running.run}/to/rank1/#", qos=1)
    assert away.subscribed.wait(5)
    away.disconnect()
    away.loop_stop()
    sender = raw_client(running, 0)
    try:
        for n in range(100):
            sender.publish(frame_topic(running.run, 1, 0), n.to_bytes(2, "big"), qos=1).wait_for_publish(5)
        back = raw_client(running, 1, clean=False)
        deadline = time.monotonic() + 5
        while len(back.received) < QUEUED_FRAMES_PER_PEER and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)
        assert [int.from_bytes(p, "big") for _, p, _ in back.received] == list(range(QUEUED_FRAMES_PER_PEER))
        stop_client(back)
    finally:
        stop_client(sender)
        running.stop()


def test_an_aborted_start_on_a_long_lived_broker_does_not_poison_the_next(broker) -> None:
    """Issue 67 P9: after one aborted device start the next complete start failed: the aborted process's
    retained ready flag made rank 0 count a process that was gone, and the new one take itself for a restart.
    Nothing is retained now: the next start is a first start on every rank."""
    with pytest.raises(InputError, match="rank 1 waited 1 s for rank 0 at the broker"):
        MqttChannel(1, 2, 5.0, str, KEY, login(broker, 1), wait_seconds=0.5)      # aborted: rank 0 never came
    ch = channels(broker, [0, 1])
    try:
        assert not ch[0].rejoining and not ch[1].rejoining
        ch[0].send({"i": 0}, 1)
        ch[1].send({"j": 0}, 0)
        assert ch[1].recv(0).msg == {"i": 0} and ch[0].recv(1).msg == {"j": 0}
    finally:
        for c in ch.values():
            c.close()


def test_a_redelivered_frame_is_dropped_and_a_gap_is_refused(broker) -> None:
    ch = channels(broker, [0, 1])
    from trainers.distributed import wire
    from trainers.distributed.control import Envelope

    sessions = (ch[0].session, ch[1].session)
    frames = [wire.encode(Envelope({"n": n}, time.time(), None, None), 0, 1, n, KEY, *sessions) for n in range(3)]
    for raw in (frames[0], frames[0], frames[1]):                          # QoS 1 may deliver #0 twice
        ch[0].client.publish(frame_topic(broker.run, 1, 0), raw, qos=1)
    assert [ch[1].recv(0).msg["n"] for _ in range(2)] == [0, 1]
    ch[0].client.publish(frame_topic(broker.run, 1, 0),
                         wire.encode(Envelope({"n": 9}, 0.0, None, None), 0, 1, 9, KEY, *sessions), qos=1)
    with pytest.raises(PeerError, match=r"sent rank 1 a frame it refused: it is numbered 0→1 #9, not 0→1 #2"):
        ch[1].recv(0)
    for c in ch.values():
        c.close()


def test_frames_of_an_earlier_run_under_the_same_secret_are_refused(broker) -> None:
    """Issue 36 W4: the same secret and run name, a new run: rank 0's frames to rank 1 captured in the first run
    and published again in the second are refused (they name the earlier processes' sessions), and nothing of
    them is taken."""
    from trainers.distributed import wire

    first = channels(broker, [0, 1])
    captured = []
    first[1].trace = captured.append                 # what rank 1 took in the first run, as frames
    raw: list[bytes] = []
    original = first[0]._transmit
    first[0]._transmit = lambda dst, frame: raw.append(frame) or original(dst, frame)
    first[0].send({"n": 0}, 1)
    assert first[1].recv(0).msg == {"n": 0} and len(raw) == 1 and captured[0].to == first[1].session
    for c in first.values():
        c.close()
    second = channels(broker, [0, 1])                # new processes: new sessions, numbering from 0 again
    try:
        assert {second[0].session, second[1].session}.isdisjoint({first[0].session, first[1].session})
        second[0].client.publish(frame_topic(broker.run, 1, 0), raw[0], qos=1)      # the replay, numbered #0
        with pytest.raises(PeerError, match=r"sent rank 1 a frame it refused: it comes from session '[0-9a-f]{16}' of "
                                            r"rank 0, not its current '[0-9a-f]{16}' \(another run's frame, or replayed\)"):
            second[1].recv(0, timeout=10)
        assert wire.decode(raw[0], KEY).seq == 0      # it was well signed and next in sequence: only its session was wrong
    finally:
        for c in second.values():
            c.close()


def test_a_dropped_connection_reconnects_and_loses_or_repeats_nothing(broker) -> None:
    """Rank 1's socket is cut mid-exchange (its will goes out); frames sent to it meanwhile wait at
    the broker, its own wait in paho's queue; it reconnects and every frame arrives exactly once."""
    ch = channels(broker, [0, 1])
    ch[0].send({"n": 0}, 1)
    assert ch[1].recv(0).msg == {"n": 0}
    ch[1].client.socket().shutdown(2)            # the network drops; paho notices and reconnects by itself
    for n in range(1, 4):
        ch[0].send({"n": n}, 1)
        ch[1].send({"back": n}, 0)
    assert [ch[1].recv(0, timeout=15).msg["n"] for _ in range(3)] == [1, 2, 3]
    assert [ch[0].recv(1, timeout=15).msg["back"] for _ in range(3)] == [1, 2, 3]
    with pytest.raises(PeerError, match="sent nothing"):
        ch[1].recv(0, timeout=0.5)                # nothing twice
    assert 1 not in ch[0]._gone                   # its will was cancelled by its return (ready again)
    for c in ch.values():
        c.close()


def test_a_process_started_again_for_its_rank_knows_it_and_gets_nothing_of_the_dead_ones(broker) -> None:
    """Rank 1's process dies without a goodbye while the fed server's first frame to it is on its way;
    a new process for rank 1 learns from the peers' answers to its ready flag that it replaces an earlier
    one (``rejoining``), starts from a clean session (the dead one's frames are gone), and after its Rejoin rank 0 numbers anew."""
    from trainers.distributed.control import Layout, Rejoin

    ch = channels(broker, [0, 1, 2], world=3)
    assert not any(c.rejoining for c in ch.values())               # a first start is no restart
    ch[0].send(Layout(3), 1)
    assert ch[1].recv(0).msg == Layout(3)
    sock = ch[1].client.socket()
    ch[1].client.loop_stop()                                        # dies: no goodbye, its session stays
    sock.close()
    ch[2].send(Layout(99), 1)                                       # the fed server's first frame to it, numbered 0
    ch[0].send(Layout(98), 1)                                       # rank 0's second, numbered 1
    ch[0].flush(2.0)
    ch[2].flush(2.0)
    again = channels(broker, [1], world=3)[1]
    assert again.rejoining
    ch[0].send(Layout(97), 1)                  # rank 0 does not know yet: still numbered for the dead process (#2)
    time.sleep(0.3)
    again.send(Rejoin(), 0)
    assert isinstance(ch[0].recv(1, timeout=5).msg, Rejoin) and ch[0].restarted(1)
    ch[0].admit(1)
    ch[0].send(Layout(3), 1)                                        # numbered 0 for the new process
    assert again.recv(0, timeout=5).msg == Layout(3)
    time.sleep(0.3)
    assert again.take_waiting(2, object) is None                    # the dead process's frame from rank 2 is gone
    for c in (ch[0], ch[2], again):
        c.close()


def test_a_rank_that_does_not_come_back_is_named_after_the_time_out(broker) -> None:
    ch = channels(broker, [0, 1])
    sock = ch[1].client.socket()
    ch[1].client.loop_stop()          # the process is gone: no goodbye, the broker sends rank 1's will
    sock.close()
    deadline = time.monotonic() + 10
    while 1 not in ch[0]._gone and time.monotonic() < deadline:
        time.sleep(0.02)
    with pytest.raises(PeerError, match=r"^rank 1 \(role 1\) lost its connection to the broker and did not come back "
                                        r"within 1 s \(--rank-timeout\): it died or was killed$"):
        ch[0].recv(1, timeout=1.0)
    ch[0].close()


def test_the_acl_gives_each_rank_its_own_topics_only() -> None:
    """Frames only to the run's ranks (issue 67 M4: a wildcard let a login publish on topics without end)."""
    assert acl_text("r1", 3).splitlines() == [
        "pattern write ap/r1/to/rank0/from/%u", "pattern write ap/r1/to/rank1/from/%u",
        "pattern write ap/r1/to/rank2/from/%u", "pattern read ap/r1/to/%u/#", "pattern readwrite ap/r1/ready/%u",
        "pattern read ap/r1/ready/+", "pattern write ap/r1/gone/%u", "pattern read ap/r1/gone/+"]


def test_without_mosquitto_the_run_says_which_package_to_install(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setattr(broker_module.shutil, "which", lambda name, path=None: None)
    code = main(["train", "--runtime", "mqtt", "--dataset", "synthetic", "--model", "mlp", "--devices", "3",
                 "--rounds", "1", "--cuts", "2", "--no-progress", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1] == ("adaptplan train: error: --runtime: the mqtt runtime needs mosquitto: install the "
                                     "package mosquitto (e.g. apt-get install -y mosquitto)")


SMALL = ["--dataset", "synthetic", "--model", "mlp", "--seed", "5", "--eval-every", "3", "--no-progress"]
ALGORITHM_ARGS = {"adaptsfl": ["--cuts", "1,2,2", "--interval", "2"], "gas": ["--cuts", "2", "--active", "2",
                                                                              "--local-steps", "2"],
                  # the model changes after round 1: rounds 2 and 3 train the 2 encoders' classifier
                  "fedconcat": ["--encoder-rounds", "1", "--clusters", "2", "--interval", "1"]}


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_algorithm_over_mqtt_has_the_simulations_losses(tmp_path: Path, algorithm: str) -> None:
    argv = ["--algorithm", algorithm, "--devices", "3", "--rounds", "3", *SMALL, *ALGORITHM_ARGS.get(
        algorithm, [] if REGISTRY[algorithm].whole_model else ["--cuts", "2"])]
    assert main(["train", "--runtime", "mqtt", "--ranks", "3", *argv, "--out", str(tmp_path / "mqtt")]) == 0
    assert main(["train", *argv, "--out", str(tmp_path / "sim")]) == 0
    got = [r.train_loss for r in History.load(tmp_path / "mqtt").records]
    expected = [r.train_loss for r in History.load(tmp_path / "sim").records]
    assert len(got) == 3 and max(abs(a - b) for a, b in zip(got, expected)) <= 1e-4
    assert History.load(tmp_path / "mqtt").meta["config"]["transport"] == "mqtt"


def test_partial_participation_over_mqtt_has_the_simulations_losses(tmp_path: Path) -> None:
    """SFL-V1 at participation 0.5: late participants download the global model through the broker first."""
    argv = ["--algorithm", "sfl-v1", "--devices", "4", "--rounds", "5", "--participation", "0.5", "--cuts", "2", *SMALL]
    assert main(["train", "--runtime", "mqtt", "--ranks", "4", *argv, "--out", str(tmp_path / "mqtt")]) == 0
    assert main(["train", *argv, "--out", str(tmp_path / "sim")]) == 0
    got = [r.train_loss for r in History.load(tmp_path / "mqtt").records]
    expected = [r.train_loss for r in History.load(tmp_path / "sim").records]
    assert len(got) == 5 and max(abs(a - b) for a, b in zip(got, expected)) <= 1e-4
    measured = History.load(tmp_path / "mqtt").meta["measured_system"]     # the broker's runs measure rates too
    assert {f"devices[{i}].up_bps" for i in range(4)} <= set(measured["rates"]) and "server_flops" in measured["rates"]


def test_a_defended_run_over_mqtt_has_the_simulations_losses_and_epsilons(tmp_path: Path) -> None:
    """Clipping, noise and NoPeek on the device ranks behind the broker, with the simulator's numbers."""
    argv = ["--algorithm", "sfl-v2", "--devices", "3", "--rounds", "3", "--cuts", "2", "--activation-clip", "1.0",
            "--activation-noise", "0.7", "--nopeek", "0.2", *SMALL]
    assert main(["train", "--runtime", "mqtt", "--ranks", "3", *argv, "--out", str(tmp_path / "mqtt")]) == 0
    assert main(["train", *argv, "--out", str(tmp_path / "sim")]) == 0
    mqtt, sim = History.load(tmp_path / "mqtt"), History.load(tmp_path / "sim")
    got, expected = [r.train_loss for r in mqtt.records], [r.train_loss for r in sim.records]
    assert len(got) == 3 and max(abs(a - b) for a, b in zip(got, expected)) <= 1e-4
    assert mqtt.meta["privacy"] == sim.meta["privacy"]


def test_a_u_shaped_sl_run_over_mqtt_hands_the_head_on_with_the_simulations_losses(tmp_path: Path) -> None:
    """SL hands the client blocks and the head (with their optimizer state) from device to device through the
    broker; the labels never leave the device ranks; each device rank clips and noises its head's gradients from
    its own stream, as the simulator does."""
    argv = ["--algorithm", "sl", "--devices", "3", "--rounds", "3", "--cuts", "1", "--u-shaped", "1",
            "--head-clip", "0.05", "--head-noise", "1", *SMALL]
    assert main(["train", "--runtime", "mqtt", "--ranks", "4", *argv, "--out", str(tmp_path / "mqtt")]) == 0
    assert main(["train", *argv, "--out", str(tmp_path / "sim")]) == 0
    mqtt, sim = History.load(tmp_path / "mqtt"), History.load(tmp_path / "sim")
    got, expected = [r.train_loss for r in mqtt.records], [r.train_loss for r in sim.records]
    assert len(got) == 3 and max(abs(a - b) for a, b in zip(got, expected)) <= 1e-4
    assert [r.accuracy for r in mqtt.records] == pytest.approx([r.accuracy for r in sim.records], abs=1e-9)
    assert mqtt.meta["privacy"] == sim.meta["privacy"] and sim.meta["privacy"]["head_noise"] == 1.0


def test_a_finished_run_over_mqtt_exits_0_on_every_rank_however_long_rank_0_writes_its_files(tmp_path: Path) -> None:
    """Issue 65: as over torch.distributed, rank 0's slow history write (8 s against 1.5 x 2 s of silence allowed)
    comes after the other ranks were released: every rank exits 0."""
    out = tmp_path / "run"
    run = finished_slowly(tmp_path, ["--runtime", "mqtt", "--algorithm", "sfl-v1", "--devices", "3", "--rounds", "2",
                                     "--rank-timeout", "2", *SMALL, "--cuts", "2", "--out", str(out)], seconds=8)
    assert run.returncode == 0, run.stderr
    assert "sent nothing" not in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert [r.round for r in History.load(out).records] == [1, 2]


def test_a_killed_device_rank_is_named_after_the_time_out_and_the_run_resumes(tmp_path: Path) -> None:
    """Churn past the time-out: a device rank's process is killed mid-run (it cannot come back with
    its models). Rank 0 names it after --rank-timeout, every rank stops, the history and checkpoint
    stay, and ``--resume --runtime mqtt`` continues to the simulator's numbers."""
    import os
    import signal
    import subprocess

    from tests.process_runs import adaptplan, losses, rank_pids, simulate, wait_for
    from trainers.run.checkpoint import load_checkpoint

    out = tmp_path / "run"
    argv = ["--algorithm", "sfl-v1", "--devices", "6", "--rounds", "400", "--checkpoint-every", "2",
            "--rank-timeout", "3", "--ranks", "4", *SMALL, "--cuts", "2"]
    proc = subprocess.Popen([sys.executable, "-m", "adaptplan.cli", "train", "--runtime", "mqtt", *argv, "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[3])
    try:
        wait_for(out / "checkpoint.pt", proc)
        pids = rank_pids(proc.pid)
        assert sorted(pids) == [0, 1, 2, 3], pids
        os.kill(pids[3], signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    finally:
        kill_launcher(proc)
    assert proc.returncode == 3 and "Traceback" not in err, err
    assert "rank 3 (devices 1, 3, 5) lost its connection to the broker and did not come back within 3 s" in err, err
    assert "--resume --runtime mqtt" in err, err
    stopped_at = load_checkpoint(out)["round"]
    assert stopped_at >= 2 and len(losses(out)) >= stopped_at
    total = stopped_at + 2
    resumed = adaptplan("train", "--out", str(out), "--resume", "--rounds", str(total), "--runtime", "mqtt")
    assert resumed.returncode == 0, resumed.stderr
    expected = simulate(tmp_path, "sim", ["--algorithm", "sfl-v1", "--devices", "6", "--rounds", str(total), *SMALL,
                                          "--cuts", "2"])
    got = losses(out)
    assert len(got) == total and max(abs(a - b) for a, b in zip(got, expected)) <= 1e-4


def test_under_partial_participation_a_killed_device_rank_leaves_and_the_run_goes_on(tmp_path: Path) -> None:
    """SCALA allows absence: the killed rank's devices are left out from then on, the run ends
    normally with every round, and a resumed run takes them back (docs/mqtt.md "Churn")."""
    import os
    import signal
    import subprocess

    from tests.process_runs import adaptplan, after_loss, rank_pids, wait_for
    from trainers.run.checkpoint import load_checkpoint

    out = tmp_path / "run"
    argv = ["--algorithm", "scala", "--participation", "0.5", "--devices", "6", "--rounds", "40", "--checkpoint-every",
            "2", "--rank-timeout", "3", "--ranks", "4", *SMALL, "--cuts", "2"]
    proc = subprocess.Popen([sys.executable, "-m", "adaptplan.cli", "train", "--runtime", "mqtt", *argv, "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[3])
    try:
        wait_for(out / "checkpoint.pt", proc)
        os.kill(rank_pids(proc.pid)[3], signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        kill_launcher(proc)
    assert proc.returncode == 0 and "Traceback" not in err, err
    assert ("rank 3 (devices 1, 3, 5) lost its connection to the broker and did not come back within 3 s "
            "(--rank-timeout): it died or was killed; scala goes on without devices 1, 3, 5") in err, err
    assert after_loss(out, {1, 3, 5}, 40) >= 2
    assert load_checkpoint(out)["engine"]["absent"] == [1, 3, 5]
    resumed = adaptplan("train", "--out", str(out), "--resume", "--rounds", "43", "--runtime", "mqtt")
    assert resumed.returncode == 0, resumed.stderr
    records = History.load(out).records
    assert len(records) == 43 and all("absent_devices" not in r.metrics for r in records[40:])
    assert load_checkpoint(out)["engine"]["absent"] == []


def kill_launcher(proc: subprocess.Popen) -> None:
    """After a failed check: SIGKILL a launcher still running and its children, its ranks and its broker (the broker
    runs in a session of its own and would outlive the launcher, listening, for as long as the machine runs)."""
    import os
    import signal

    if proc.poll() is not None:
        return
    children = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, IndexError, ValueError):
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == proc.pid:
                children.append(int(entry.name))
    proc.kill()
    proc.wait()
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def kill_and_start_again(tmp_path: Path, argv: list[str], rounds_back: int = 6) -> tuple[subprocess.CompletedProcess, int, str, Path]:
    """Run ``argv`` over MQTT on 4 ranks, kill device rank 3 after the first checkpoint and start it
    again at once with its own command and environment (as a supervisor would); once rank 0 says it
    came back and ``rounds_back`` more rounds are in the history, stop the run with Ctrl-C (SIGINT to
    the launcher's process group, as a terminal sends it). The run is open-ended rather than a fixed
    number of rounds, so however long the new process takes to start (seconds of torch import on a
    slow machine) it comes back within the run. Returns (the new process's result, the run's exit
    code, the run's stderr, the run folder)."""
    import os
    import signal

    from tests.process_runs import rank_pids, wait_for

    out = tmp_path / "run"
    argv = [*argv, "--rounds", "100000", "--devices", "6", "--checkpoint-every", "2", "--rank-timeout", "3", "--ranks",
            "4", *SMALL, "--cuts", "2"]
    root = Path(__file__).resolve().parents[3]
    proc = subprocess.Popen([sys.executable, "-m", "adaptplan.cli", "train", "--runtime", "mqtt", *argv, "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=root, start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    again = None
    try:
        wait_for(out / "checkpoint.pt", proc)
        pid = rank_pids(proc.pid)[3]
        env = dict(item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
                   if "=" in item)
        command = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
        os.kill(pid, signal.SIGKILL)
        again = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=root)
        deadline, back_round = time.monotonic() + 180, None
        while True:
            assert proc.poll() is None and again.poll() is None, "".join(lines)
            assert time.monotonic() < deadline, "rank 3 did not come back within 180 s: " + "".join(lines)
            if any("came back as a new process" in line for line in lines):
                with contextlib.suppress(OSError, ValueError):             # no history yet (InputError: a ValueError)
                    done = len(History.load(out).records)
                    if back_round is None:
                        back_round = done
                    if done >= back_round + rounds_back:
                        break
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=180)
        reader.join(timeout=10)
        stdout, stderr = again.communicate(timeout=180)
        again = subprocess.CompletedProcess(command, again.returncode, stdout, stderr)
    finally:
        kill_launcher(proc)
        if isinstance(again, subprocess.Popen) and again.poll() is None:
            again.kill()
    return again, proc.returncode, "".join(lines), out


def test_a_killed_device_rank_started_again_is_taken_back(tmp_path: Path) -> None:
    """Under partial participation a device process killed and started again (same command, same
    credentials) asks to come back: rank 0 sets it up again at the next round and its devices take
    part again; the run, stopped with Ctrl-C some rounds later, and the new process end normally."""
    from trainers.run.checkpoint import load_checkpoint

    again, code, err, out = kill_and_start_again(tmp_path, ["--algorithm", "gas", "--active", "2", "--local-steps", "2"])
    assert again.returncode == 0 and again.stderr == "", again.stderr
    assert code == 130 and "Traceback" not in err, err
    assert err.splitlines()[-1] == (                  # rank 0 says it, once; the launcher adds nothing
        f"adaptplan train: interrupted by SIGINT after round {len(History.load(out).records)}; checkpoint and history "
        f"saved in {str(out)!r} — continue with: adaptplan train --out {out} --resume --runtime mqtt"), err
    assert ("rank 3 (devices 1, 3, 5) came back as a new process; gas takes devices 1, 3, 5 back (from the global "
            "client model where there is one, else the initial weights)") in err, err
    assert err.index("gas goes on without devices 1, 3, 5 (partial participation") < err.index("came back as a new process")
    records = History.load(out).records
    assert [r.round for r in records] == list(range(1, len(records) + 1))
    # Absent from the round it was lost in until the one it came back at. That is no round at all when the loss
    # was found between two rounds (fetching its blocks for a checkpoint) and its new process had already asked.
    back = max((r.round for r in records if "absent_devices" in r.metrics), default=0)
    rounds = [(r.round, r.metrics.get("absent_devices"), sorted(r.participants)) for r in records]
    # The message names each round's absent devices and participants. This failed in 1 of 7 runs beside a busy core
    # and 1 of 5 whole suites on two workers (2026-12-03). Cause, measured 2026-12-04 (paho and broker logs with
    # timestamps, 8 runs beside a busy core): at a round's start rank 0 sends the new process its Setup and waits
    # on the reply (RankNetwork.readmit, up to SETUP_TIMEOUT_FACTOR time-outs), sending the fed server and rank 2
    # nothing meanwhile; they allow rank 0 IDLE_FACTOR x 3 = 4.5 s (serve.py). Rank 0 was silent there 1.7 to
    # 4.41 s in the runs that passed (3 of 8 within 0.1 s of 4.5 s). In the one that failed the new process took
    # 5.0 s to load its data and build its chain: ranks 1 and 2 ended ("rank 0 (edge server) sent nothing for
    # 4.5 s") without a goodbye, the broker sent their wills, and rank 0 named rank 2 "lost its connection to the
    # broker". Where rank 2 alone ends, the run goes on with devices 0, 2, 4 absent to its last round (likely the
    # failure of 2026-12-03). No connection dropped otherwise: no "exceeded timeout" at the broker, no paho
    # disconnect, 241 PINGREQs answered within 37 ms. The fix belongs in readmit (no wait on a set-up inside a round).
    assert back < len(records) - 4 and "absent_devices" not in records[-1].metrics, (rounds, err)
    assert {1, 3, 5} & {d for r in records[-6:] for d in r.participants}      # the 6 rounds after it came back
    assert load_checkpoint(out)["engine"]["absent"] == []


def test_a_rank_reads_its_login_from_the_environment_and_names_what_is_missing(tmp_path) -> None:
    from trainers.distributed.mqtt import broker_login

    with pytest.raises(InputError, match="an mqtt rank needs ADAPTPLAN_MQTT_BROKER, ADAPTPLAN_MQTT_CA, "
                                         "ADAPTPLAN_MQTT_PASSWORD_FILE, ADAPTPLAN_MQTT_RUN"):
        broker_login({})
    secret = tmp_path / "pw"
    secret.write_text("  s3cret\n")
    secret.chmod(0o644)
    env = {"ADAPTPLAN_MQTT_BROKER": "broker.example.org:8883", "ADAPTPLAN_MQTT_CA": "ca.crt",
           "ADAPTPLAN_MQTT_PASSWORD_FILE": str(secret), "ADAPTPLAN_MQTT_RUN": "exp1"}
    with pytest.raises(InputError, match=rf"^ADAPTPLAN_MQTT_PASSWORD_FILE: '.*pw' can be read or written by other "
                                         rf"users \(mode 644\): whoever reads it can join the run; chmod 600 .*pw$"):
        broker_login(env)                                         # issue 67: a kit's file readable by everyone
    secret.chmod(0o600)
    assert broker_login(env) == BrokerLogin("broker.example.org", 8883, "ca.crt", "exp1", "s3cret")
    with pytest.raises(InputError, match="ADAPTPLAN_MQTT_BROKER is 'broker:x', not host:port"):
        broker_login(dict(env, ADAPTPLAN_MQTT_BROKER="broker:x"))
    with pytest.raises(InputError, match="ADAPTPLAN_MQTT_PASSWORD_FILE: '.*nothing' cannot be read"):
        broker_login(dict(env, ADAPTPLAN_MQTT_PASSWORD_FILE=str(tmp_path / "nothing")))


def test_no_broker_a_silent_one_or_a_missing_peer_is_one_error_each(broker, tmp_path) -> None:
    import socket

    closed = free_port()
    with pytest.raises(InputError, match=f"rank 2 cannot reach the broker at 127.0.0.1:{closed}"):
        MqttChannel(2, 3, 5.0, str, KEY, BrokerLogin("127.0.0.1", closed, str(broker.ca_file), "r", "pw"), wait_seconds=1)
    with socket.socket() as silent:                      # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        with pytest.raises(InputError, match=f"rank 2 cannot reach the broker at 127.0.0.1:{port} \\(TimeoutError: .*"
                                             "handshake operation timed out\\)"):
            MqttChannel(2, 3, 5.0, str, KEY, BrokerLogin("127.0.0.1", port, str(broker.ca_file), "r", "pw"),
                        wait_seconds=1)
    with pytest.raises(InputError, match="rank 0 waited 2 s for ranks 1, 2 at the broker"):
        MqttChannel(0, 3, 5.0, str, KEY, login(broker, 0), wait_seconds=1)


def test_the_channel_settings_and_a_clean_goodbye(broker) -> None:
    """No Nagle delay on the rank's socket; the list of frames awaiting the broker's acknowledgement
    stays short; a closed rank disconnects cleanly (no will, so no peer takes it for gone)."""
    import socket

    ch = channels(broker, [0, 1])
    assert ch[0].client.socket().getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    assert ch[0].granted_qos == ch[1].granted_qos == [1, 1, 1]        # at least once: frames, ready flags, wills
    deadline = time.monotonic() + 5
    while ch[0]._untracked and time.monotonic() < deadline:           # the ready flag's acknowledgement came
        time.sleep(0.01)
    assert ch[0]._acked == set() and not ch[0]._untracked             # and left no id a later frame could reuse
    for n in range(40):
        ch[0].send({"n": n}, 1)
    deadline = time.monotonic() + 5
    while not set(ch[0]._inflight[1]) <= ch[0]._acked and time.monotonic() < deadline:   # all acknowledged
        time.sleep(0.01)
    ch[0].send({"n": 40}, 1)
    assert len(ch[0]._inflight[1]) <= 2                    # acknowledged frames are dropped as new ones go
    assert [ch[1].recv(0).msg["n"] for _ in range(41)] == list(range(41))
    ch[1].close()
    assert not ch[1].client.is_connected()
    time.sleep(0.5)
    assert 1 not in ch[0]._gone
    assert not channels(broker, [1])[1].rejoining       # after a goodbye a new process of rank 1 is no restart
    ch[0].close()


def test_the_local_broker_keeps_its_files_private_and_stops(broker) -> None:
    import stat

    assert stat.S_IMODE(broker.folder.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in broker.password_files.values())
    assert len({p.read_text() for p in broker.password_files.values()}) == 4           # one password per rank
    broker.stop()
    assert broker.process.poll() is not None
    broker.stop()                                                                         # twice is harmless
    (broker.folder / "broker.log").write_text("one\ntwo\nthree\n")                    # stopped: nothing appends now
    assert broker.log_tail(2) == "two\nthree"


def test_a_broker_that_never_answers_the_login_is_named(broker, monkeypatch) -> None:
    import paho.mqtt.client as mqtt

    monkeypatch.setattr(mqtt.Client, "connect", lambda self, *a, **k: 0)     # the TCP and TLS part went through,
    monkeypatch.setattr(mqtt.Client, "loop_start", lambda self: 0)           # but no CONNACK ever comes
    with pytest.raises(InputError, match=r"the broker at 127.0.0.1:\d+ refused rank 0 \(no answer\)"):
        MqttChannel(0, 2, 5.0, str, KEY, login(broker, 0), wait_seconds=0.3)


def test_pruning_drops_exactly_the_acknowledged_frames() -> None:
    """The bookkeeping behind flush(): acknowledged ids leave both lists, unacknowledged ones stay in
    order, and an acknowledgement for a frame not yet pruned waits for it."""
    ch = object.__new__(MqttChannel)
    ch._inflight, ch._acked, ch._untracked = {1: [5, 6, 7]}, {6, 99}, {3}
    assert ch._prune(1) == [5, 7] and ch._inflight[1] == [5, 7] and ch._acked == {99}
    assert ch._pending(1) and not ch._pending(2)
    ch._on_publish(None, None, 3)                   # a ready flag's acknowledgement is not kept
    ch._on_publish(None, None, 5)
    ch._on_publish(None, None, 7)
    assert ch._untracked == set() and ch._acked == {5, 7, 99}
    assert not ch._pending(1) and ch._acked == {99} and ch._inflight[1] == []
