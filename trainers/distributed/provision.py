"""``adaptplan provision``: everything a deployment over an MQTT broker needs, written once (docs/mqtt.md
"A real deployment").

For a broker address and N devices over W ranks it writes, under one folder, every file private to its owner
(files 0600, folders 0700):

* ``ca/``: the deployment's certificate authority (its key never leaves this folder);
* ``broker/``: what the broker's server runs — ``mosquitto.conf`` (one TLS listener on the port, no anonymous
  clients, a client id bound to its login, nothing retained, a packet limit and queues derived from the
  run's largest frame), the CA certificate, the
  broker's certificate for its address and its key, the hashed password file and the access control list of
  :mod:`trainers.distributed.mqtt` — owned by the broker's user when provisioned as root (``mosquitto`` where
  that user exists), so the broker can read them after it drops root;
* ``kits/rank<r>/`` for every rank (0 the edge server, 1 the fed server, 2.. the device hosts): the CA
  certificate, the rank's own password, the run's secret, ``rank.env`` (the ``ADAPTPLAN_*`` variables) and
  ``run.sh``, the one command the rank runs (``python -m adaptplan.distributed`` with the training options given
  here, from the kit's folder, so relative paths such as ``--device-data`` or ``--out`` are the kit's), and a
  copy of each file the training options name (``--system``, ``--constants``, ``--plan``, ``--config``: read
  here, so a missing file is named now, not on every rank later), the option pointing at the copy.

The broker then starts as ``cd <folder>/broker && mosquitto -c mosquitto.conf``; each machine gets its kit and
runs ``./run.sh``.
"""

from __future__ import annotations

import ipaddress
import os
import pwd
import re
import secrets
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from adaptplan.errors import InputError
from adaptplan.fileio import MAX_FILE_BYTES
from trainers.distributed.broker import (
    MQTT_MAX_PACKET_BYTES,
    BrokerLimits,
    acl_text,
    broker_settings,
    find_tool,
    make_certificates,
    run_tool,
)
from trainers.distributed.environment import RUNTIME_ENV, SECRET_FILE_ENV
from trainers.distributed.layout import RankLayout
from trainers.distributed.mqtt_login import BROKER_ENV, CA_ENV, PASSWORD_FILE_ENV, RUN_ENV, user

BROKER_USER = "mosquitto"
"""The user Debian's mosquitto drops to when started as root (its ``user`` setting's default)."""
PYTHON_ENV = "ADAPTPLAN_PYTHON"
"""The interpreter a kit's ``run.sh`` starts (default ``python3``: the one adaptplan is installed in)."""


@dataclass(frozen=True)
class Deployment:
    """What :func:`provision` wrote: the folder, the broker's part, one kit per rank, the run's topic prefix and
    the user the broker runs as."""

    folder: Path
    broker: Path
    kits: dict[int, Path]
    run: str
    broker_user: str


FILE_OPTIONS = ("--system", "--constants", "--plan", "--config")
"""Training options that name a file every rank reads: copied into each kit (:func:`kit_files`)."""
def kit_files(train_args: list[str]) -> tuple[list[str], dict[str, bytes]]:
    """``train_args`` with each :data:`FILE_OPTIONS` value (``--flag VALUE`` or ``--flag=VALUE``) replaced by the
    name of its copy in the kit (``system.toml`` for ``--system x/sys.toml``), and those copies' bytes by name.
    InputError naming the flag for a file that is missing, not a regular file or over the
    :data:`adaptplan.fileio.MAX_FILE_BYTES` adaptplan reads of an input file."""
    out, files = list(train_args), {}
    for i, arg in enumerate(train_args):
        flag, _, inline = arg.partition("=")
        if flag not in FILE_OPTIONS or (not inline and i + 1 >= len(train_args)):
            continue
        value = inline or train_args[i + 1]
        path = Path(value).expanduser()
        if not path.is_file():
            raise InputError(f"{value!r} is not a file here: provision copies it into every kit", field=flag)
        if path.stat().st_size > MAX_FILE_BYTES:
            raise InputError(f"{value!r} is over {MAX_FILE_BYTES:,} bytes", field=flag)
        name = flag.removeprefix("--") + "".join(path.suffixes[-1:])
        files[name] = path.read_bytes()
        if inline:
            out[i] = f"{flag}={name}"
        else:
            out[i + 1] = name
    return out, files


HOST_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")
"""A DNS name (RFC 1123 labels), what the broker's certificate can be made for besides an IP address."""


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` → (host, port), the host an IP address or a DNS name; an InputError naming ``--broker``
    otherwise."""
    host, _, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise InputError(f"{address!r}: an IPv6 address goes in brackets, e.g. [::1]:8883", field="--broker")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(f"{address!r} is not host:port (e.g. broker.example.org:8883)", field="--broker")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if len(host) > 253 or not HOST_NAME.fullmatch(host) or host.replace(".", "").isdigit():
            raise InputError(f"{host[:80]!r} is neither an IP address nor a host name (letters, digits, - and . "
                             "only, at most 253)", field="--broker") from None
    return host, int(port)


def broker_user() -> str:
    """As root: ``mosquitto`` where that user exists (the broker drops root to it), else root; otherwise this
    user (a broker started by a normal user runs as that user)."""
    me = pwd.getpwuid(os.geteuid()).pw_name
    if os.geteuid() != 0:
        return me
    try:
        pwd.getpwnam(BROKER_USER)
        return BROKER_USER
    except KeyError:
        return me


def _private(path: Path, text: str | bytes, mode: int = 0o600) -> Path:
    """Write ``path`` readable by its owner only (created so: never world-readable, not even for an instant)."""
    data = text.encode() if isinstance(text, str) else text
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.chmod(path, mode)
    except OSError as exc:                      # (a failed write names no file: this one is named)
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    return path


def _folder(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def make_authority(ca: Path, broker: Path, host: str, days: int) -> None:
    """The deployment's CA (its key stays in ``ca``) and, in ``broker``, the CA certificate and the broker's
    certificate for ``host`` and its key."""
    ca_crt, crt, key = make_certificates(ca, host, days)
    for path in (ca_crt, crt, key):
        shutil.copyfile(path, broker / path.name)
        os.chmod(broker / path.name, 0o600)
    key.unlink()                       # the broker's key lives in the broker's folder only


def broker_config(port: int, run_user: str, limits: BrokerLimits) -> str:
    """``mosquitto.conf``, every path relative to the broker's folder (the broker starts from it)."""
    return (f"# written by adaptplan provision; start from this folder: mosquitto -c mosquitto.conf\n"
            f"user {run_user}\nlistener {port}\ncafile ca.crt\ncertfile broker.crt\nkeyfile broker.key\n"
            + broker_settings(limits))


def rank_env(rank: int, world: int, host: str, port: int, run: str) -> str:
    """A kit's ``rank.env``: the variables the rank reads (paths relative to the kit's folder)."""
    values = {"RANK": str(rank), "WORLD_SIZE": str(world), RUNTIME_ENV: "mqtt", BROKER_ENV: f"{host}:{port}",
              CA_ENV: "ca.crt", PASSWORD_FILE_ENV: f"{user(rank)}.password", RUN_ENV: run,
              SECRET_FILE_ENV: "run.secret"}
    return "".join(f"{k}={shlex.quote(v)}\n" for k, v in values.items())


def run_script(rank: int, world: int, role: str, train_args: list[str]) -> str:
    """A kit's ``run.sh``: the rank's one command, from the kit's folder."""
    return ("#!/bin/sh\n"
            f"# adaptplan rank {rank} of {world} ({role}), written by adaptplan provision\n"
            'cd "$(dirname "$0")" || exit 2\n'
            "set -a\n. ./rank.env\nset +a\n"
            f'exec "${{{PYTHON_ENV}:-python3}}" -m adaptplan.distributed {shlex.join(train_args)} "$@"\n')


def provision(folder: Path, address: str, num_devices: int, world: int, train_args: list[str],
              run: str | None = None, days: int = 365,
              largest_frame: Callable[[], int | None] = lambda: None) -> Deployment:
    """Write a deployment (module docstring) into ``folder``, which must not exist or be empty; the broker's limits
    derived from the run's largest frame (bytes), which ``largest_frame()`` gives once the other inputs are checked
    (None: MQTT's largest packet)."""
    host, port = split_address(address)
    train_args, copies = kit_files(train_args)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise InputError(f"{str(folder)!r} exists and is not an empty folder: give a new one", field="--out")
    run = secrets.token_hex(6) if run is None else run
    if not run.replace("-", "").replace("_", "").isalnum() or len(run) > 64:
        raise InputError(f"{run!r} is not a run name (letters, digits, - and _, at most 64)", field="--run")
    layout = RankLayout(world, num_devices)
    hasher = find_tool("mosquitto_passwd", "mosquitto")
    largest_frame_bytes = largest_frame()
    existed = folder.exists()
    try:
        return _write(folder, host, port, num_devices, world, train_args, copies, run, days, largest_frame_bytes,
                      layout, hasher)
    except (OSError, RuntimeError) as exc:      # a full disk, a folder not ours to write, openssl's own failure
        if existed:
            for child in folder.iterdir():       # it was empty: what is in it now is this run's
                if child.is_dir():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
        else:
            shutil.rmtree(folder, ignore_errors=True)
        where = f"{exc.filename}: " if isinstance(exc, OSError) and exc.filename else ""
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InputError(f"cannot write the deployment into {str(folder)!r} ({where}{why}); nothing of it was kept",
                         field="--out") from None


def _write(folder: Path, host: str, port: int, num_devices: int, world: int, train_args: list[str],
           copies: dict[str, bytes], run: str, days: int, largest_frame_bytes: int | None, layout: RankLayout,
           hasher: str) -> Deployment:
    """The files of :func:`provision`, its inputs checked."""
    _folder(folder)
    ca, broker = _folder(folder / "ca"), _folder(folder / "broker")
    make_authority(ca, broker, host, days)
    passwords = {r: secrets.token_hex(16) for r in range(world)}
    _private(broker / "passwd", "".join(f"{user(r)}:{p}\n" for r, p in passwords.items()))
    run_tool([hasher, "-U", str(broker / "passwd")], "hashing the ranks' passwords")
    os.chmod(broker / "passwd", 0o600)
    _private(broker / "acl", acl_text(run, world))
    owner = broker_user()
    limits = BrokerLimits.for_run(world, largest_frame_bytes or MQTT_MAX_PACKET_BYTES)
    _private(broker / "mosquitto.conf", broker_config(port, owner, limits))
    if owner != pwd.getpwuid(os.geteuid()).pw_name:          # root provisions for the broker's own user
        entry = pwd.getpwnam(owner)
        for path in [broker, *broker.iterdir()]:
            os.chown(path, entry.pw_uid, entry.pw_gid)
    secret = secrets.token_hex(32)
    args = list(train_args) if "--devices" in train_args else ["--devices", str(num_devices), *train_args]
    kits: dict[int, Path] = {}
    _folder(folder / "kits")
    for r in range(world):
        kit = kits[r] = _folder(folder / "kits" / user(r))
        _private(kit / "ca.crt", (ca / "ca.crt").read_bytes())
        _private(kit / f"{user(r)}.password", passwords[r] + "\n")
        _private(kit / "run.secret", secret + "\n")
        _private(kit / "rank.env", rank_env(r, world, host, port, run))
        _private(kit / "run.sh", run_script(r, world, layout.describe(r), args), mode=0o700)
        for name, data in copies.items():
            _private(kit / name, data)
    return Deployment(folder, broker, kits, run, owner)
