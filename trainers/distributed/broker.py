"""A Mosquitto broker for one local run (``adaptplan train --runtime mqtt``; docs/mqtt.md).

:func:`start_local_broker` writes, in a folder only this user can read: a CA and a broker
certificate for 127.0.0.1 (``openssl``), one random password per rank (``mosquitto_passwd``
hashes them), the access control list of :mod:`trainers.distributed.mqtt` (a rank reads only its own
inbound topics and writes only frames in its own name), and a configuration with one TLS listener
on 127.0.0.1, no anonymous clients and no persistence on disk; then starts ``mosquitto`` and waits
until it accepts connections. The same files, made by hand, serve a real deployment (docs/mqtt.md).
"""

from __future__ import annotations

import getpass
import secrets
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from adaptplan.errors import InputError
from trainers.distributed.mqtt_login import user

START_SECONDS = 10.0


def find_tool(name: str, package: str) -> str:
    """The path of ``name`` (also looked for in /usr/sbin, where Debian puts mosquitto); an
    InputError naming the package when it is not installed."""
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin")
    if not found:
        raise InputError(f"the mqtt runtime needs {name}: install the package {package} (e.g. apt-get install -y "
                         f"{package})", field="--runtime")
    return found


MQTT_MAX_PACKET_BYTES = 268_435_455 + 5
"""The largest MQTT packet (bytes): the protocol's largest remaining length plus its fixed header."""
QUEUED_FRAMES_PER_PEER = 64
"""Frames the broker holds for a rank per peer while it is away (:class:`BrokerLimits`)."""
QUEUED_LARGEST_PER_PEER = 4
"""Largest frames' worth of bytes the broker holds for a rank per peer while it is away."""


@dataclass(frozen=True)
class BrokerLimits:
    """What the written broker configurations bound (docs/mqtt.md "What the broker bounds"): a packet larger
    than ``max_packet_bytes`` disconnects its sender; the broker holds at most ``queued_messages`` frames and
    ``queued_bytes`` bytes for a rank beyond those in flight (while it reconnects), and drops the rest (the rank
    then misses a frame and its peer is named after --rank-timeout)."""

    max_packet_bytes: int
    queued_messages: int
    queued_bytes: int

    @classmethod
    def for_run(cls, world: int, largest_frame_bytes: int) -> "BrokerLimits":
        """From the run's largest frame (bytes, :func:`trainers.distributed.frame_bound.largest_frame`) and its
        ``world`` ranks: the packet limit is the frame plus the topic and MQTT's header (at most the protocol's
        largest packet); a rank's queue holds :data:`QUEUED_FRAMES_PER_PEER` frames and
        :data:`QUEUED_LARGEST_PER_PEER` largest frames' bytes per peer."""
        packet = min(MQTT_MAX_PACKET_BYTES, int(largest_frame_bytes) + 1024)
        peers = max(1, world - 1)
        return cls(packet, QUEUED_FRAMES_PER_PEER * peers, QUEUED_LARGEST_PER_PEER * peers * packet)


def broker_settings(limits: BrokerLimits) -> str:
    """The lines both written ``mosquitto.conf`` share (the local broker's and ``provision``'s): logins only, a
    client id bound to its login, nothing on disk, nothing retained (a client that publishes with retain is
    disconnected), and ``limits``."""
    return ("per_listener_settings false\nallow_anonymous false\npassword_file passwd\nacl_file acl\n"
            "use_username_as_clientid true\n"    # a rank's client id is its user name: no rank connects in another's
            "persistence false\nretain_available false\n"
            f"max_packet_size {limits.max_packet_bytes}\nmax_queued_messages {limits.queued_messages}\n"
            f"max_queued_bytes {limits.queued_bytes}\nmax_inflight_messages 0\nset_tcp_nodelay true\n")


def acl_text(run: str, world: int) -> str:
    """The access control list: ``%u`` is the client's user name (``rank<r>``); a rank writes frames only to the
    run's ``world`` ranks (so the topics a login can publish on are as few as the run's pairs)."""
    return ("".join(f"pattern write ap/{run}/to/{user(r)}/from/%u\n" for r in range(world))
            + f"pattern read ap/{run}/to/%u/#\n"
            f"pattern readwrite ap/{run}/ready/%u\n"
            f"pattern read ap/{run}/ready/+\n"
            f"pattern write ap/{run}/gone/%u\n"
            f"pattern read ap/{run}/gone/+\n")


@dataclass
class LocalBroker:
    """A running broker: where it listens, its CA certificate, the run's topic prefix, and each
    rank's password file."""

    host: str
    port: int
    ca_file: Path
    run: str
    password_files: dict[int, Path]
    process: subprocess.Popen
    folder: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def log_tail(self, lines: int = 5) -> str:
        path = self.folder / "broker.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


def run_tool(command: list[str], what: str) -> None:
    """Run an external tool (openssl, mosquitto_passwd); a RuntimeError with its message if it fails."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{what} failed ({done.returncode}): {done.stderr.strip()[-500:]}")


def subject_alt_name(host: str) -> str:
    """The broker certificate's subjectAltName for ``host``: an IP address or a DNS name (what the ranks check)."""
    import ipaddress

    try:
        return f"IP:{ipaddress.ip_address(host)}"
    except ValueError:
        return f"DNS:{host}"


def make_certificates(folder: Path, host: str = "127.0.0.1", days: int = 2) -> tuple[Path, Path, Path]:
    """(CA certificate, broker certificate, broker key) for ``host``, valid ``days`` days (openssl); the CA's key
    and the signing request stay in ``folder`` too, every file readable by its owner only."""
    openssl = find_tool("openssl", "openssl")
    ca_key, ca_crt = folder / "ca.key", folder / "ca.crt"
    key, csr, crt = folder / "broker.key", folder / "broker.csr", folder / "broker.crt"
    run_tool([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", str(days), "-subj",
              "/CN=adaptplan CA", "-keyout", str(ca_key), "-out", str(ca_crt)], "making the CA")
    run_tool([openssl, "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={host}", "-keyout", str(key),
              "-out", str(csr)], "making the broker's key")
    extra = ",DNS:localhost" if host == "127.0.0.1" else ""
    (folder / "san.ext").write_text(f"subjectAltName={subject_alt_name(host)}{extra}\n")
    run_tool([openssl, "x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key), "-CAcreateserial",
              "-days", str(days), "-extfile", str(folder / "san.ext"), "-out", str(crt)], "signing the broker's certificate")
    for path in folder.iterdir():
        path.chmod(0o600)
    return ca_crt, crt, key


def start_local_broker(folder: Path, world: int, port: int,
                       largest_frame_bytes: int = MQTT_MAX_PACKET_BYTES) -> LocalBroker:
    """Write the broker's files into ``folder`` (mode 0700) and start it on 127.0.0.1:``port``, its limits
    derived from the run's largest frame (:meth:`BrokerLimits.for_run`)."""
    mosquitto = find_tool("mosquitto", "mosquitto")
    hasher = find_tool("mosquitto_passwd", "mosquitto")
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    run = secrets.token_hex(6)
    ca, crt, key = make_certificates(folder)
    passwords = {r: secrets.token_hex(16) for r in range(world)}
    password_files = {}
    for r, password in passwords.items():
        path = folder / f"{user(r)}.password"
        path.write_text(password)
        path.chmod(0o600)
        password_files[r] = path
    hashed = folder / "passwd"
    hashed.write_text("".join(f"{user(r)}:{p}\n" for r, p in passwords.items()))
    hashed.chmod(0o600)
    run_tool([hasher, "-U", str(hashed)], "hashing the ranks' passwords")
    (folder / "acl").write_text(acl_text(run, world))
    (folder / "mosquitto.conf").write_text(
        f"user {getpass.getuser()}\n"      # started by root, mosquitto would switch to its own user: keep this one's
        f"listener {port} 127.0.0.1\ncafile {ca}\ncertfile {crt}\nkeyfile {key}\n"
        + broker_settings(BrokerLimits.for_run(world, largest_frame_bytes))
        + "log_dest file broker.log\nlog_type error\nlog_type warning\nlog_type notice\n")
    # its own session: Ctrl-C in the launcher's terminal stops the run at the end of a round, which needs the
    # broker still there; the launcher stops it last (LocalBroker.stop). Started from its folder: the
    # configuration's paths (passwd, acl, broker.log) are relative to it, as in provision's.
    process = subprocess.Popen([mosquitto, "-c", "mosquitto.conf"], cwd=folder, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    broker = LocalBroker("127.0.0.1", port, ca, run, password_files, process, folder)
    try:
        wait_until_listening(process, port, lambda: broker.log_tail())
    except RuntimeError:
        broker.stop()
        raise
    return broker


def wait_until_listening(process: subprocess.Popen, port: int, log: Callable[[], str] = lambda: "",
                         seconds: float = START_SECONDS) -> None:
    """Until the broker ``process`` accepts connections on 127.0.0.1:``port``; a RuntimeError with its output (and
    ``log()``) if it stops first or does not listen within ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"mosquitto stopped at once ({process.returncode}): "
                               f"{(process.stderr.read() if process.stderr else '')[-500:]} {log()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"mosquitto did not accept connections on 127.0.0.1:{port} within {seconds:g} s")


def rank_broker_environment(broker: LocalBroker, rank: int) -> dict[str, str]:
    """The ``ADAPTPLAN_MQTT_*`` variables of ``rank`` (trainers.distributed.mqtt.broker_login)."""
    from trainers.distributed.environment import RUNTIME_ENV
    from trainers.distributed.mqtt_login import BROKER_ENV, CA_ENV, PASSWORD_FILE_ENV, RUN_ENV

    return {BROKER_ENV: f"{broker.host}:{broker.port}", CA_ENV: str(broker.ca_file),
            PASSWORD_FILE_ENV: str(broker.password_files[rank]), RUN_ENV: broker.run, RUNTIME_ENV: "mqtt"}

