"""``adaptplan train --distributed`` on one machine: start the ranks, watch them, report.

The ranks are started as ``python -m adaptplan.distributed ARGS`` with torchrun's environment
contract (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), bound to
loopback (``MASTER_ADDR=127.0.0.1``, ``GLOO_SOCKET_IFNAME=lo`` unless set), so the same entry
point runs under ``torchrun`` across machines. The launcher gives its ranks a fresh secret
(``ADAPTPLAN_SECRET``: every frame is authenticated with it) and a rendezvous file in a folder only
this user can read (``ADAPTPLAN_STORE_FILE``: no TCP store), so a local run listens on loopback only.
Rank 0 (edge server, run folder, progress) writes
to this terminal; the other ranks' messages are collected and printed when one fails.

When a rank ends with an error or a signal, the others get ``GRACE_SECONDS`` to stop on their own
(rank 0 aborts them with the reason; a lost connection ends them at once) before they are
terminated — after a device or fed server rank's end, ``detect_seconds`` more (the time rank 0 may take to
notice it: over MQTT a dead rank is named after ``--rank-timeout``), and after rank 0's own end a fresh
``GRACE_SECONDS`` for the ranks it aborted, instead of what was left of that allowance; then one line per
failed rank and where to resume from. Under an algorithm that allows partial participation (``partial=True``:
SCALA, CycleSL, GAS) a device rank's end is not a failure: rank 0 goes on without its devices (and says so);
the run ends when rank 0 and the fed server have, device ranks still running then having been taken out of it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trainers.config.train_config import resume_command
from trainers.distributed.environment import SECRET_ENV, SECRET_FILE_ENV, STORE_ENV
from trainers.distributed.layout import EDGE_RANK, FED_RANK, RankLayout
from trainers.distributed.session import EXIT_RANK_FAILED

GRACE_SECONDS = 5.0
POLL_SECONDS = 0.1


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_environment(rank: int, world_size: int, port: int, secret: str = "", store: str = "") -> dict[str, str]:
    """torchrun's variables for ``rank`` on loopback, plus the run's ``secret`` and ``store`` file."""
    env = dict(os.environ)
    env.pop(SECRET_FILE_ENV, None)
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **{SECRET_ENV: secret, STORE_ENV: store})
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env


def _status(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def launch_local(train_args: list[str], world_size: int, num_devices: int, out: str | None,
                 runtime: str = "gloo", partial: bool = False, detect_seconds: float = 0.0,
                 largest_frame_bytes: int | None = None) -> int:
    """Run ``adaptplan train`` ``train_args`` as ``world_size`` ranks here; the exit code of the run.
    With ``runtime="mqtt"`` the ranks meet at a Mosquitto broker started for the run on 127.0.0.1
    (TLS, one password per rank, trainers/distributed/broker.py), stopped at the end; its packet limit and
    queues derived from ``largest_frame_bytes`` (:mod:`trainers.distributed.frame_bound`; None: MQTT's own)."""
    layout = RankLayout(world_size, num_devices)
    port = free_port()
    logs = Path(tempfile.mkdtemp(prefix="adaptplan-ranks-"))     # mode 0700: the store and the logs are ours
    secret = secrets.token_hex(32)
    store = str(logs / "store")
    command = [sys.executable, "-m", "adaptplan.distributed", *train_args]
    procs: list[subprocess.Popen] = []
    terminated: set[int] = set()
    broker = None
    try:
        if runtime == "mqtt":
            from trainers.distributed.broker import MQTT_MAX_PACKET_BYTES, rank_broker_environment, start_local_broker

            broker = start_local_broker(logs / "broker", world_size, free_port(),
                                        largest_frame_bytes or MQTT_MAX_PACKET_BYTES)
        for rank in range(world_size):
            env = rank_environment(rank, world_size, port, secret, store)
            if broker is not None:
                env.update(rank_broker_environment(broker, rank))
            if rank == 0:
                procs.append(subprocess.Popen(command, env=env))
            else:
                with open(logs / f"rank{rank}.log", "wb") as log:
                    procs.append(subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=log))
        terminated = _watch(procs, partial, detect_seconds)
    except KeyboardInterrupt:          # rank 0 stops at the end of the round with a checkpoint; then the others
        for p in procs:
            try:
                p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
    finally:
        terminated |= _stop(procs)
        if broker is not None:
            broker.stop()
    return _exit_code([p.wait() for p in procs], layout, logs, terminated, out, runtime, partial)


def _watch(procs: list[subprocess.Popen], partial: bool, detect_seconds: float = 0.0) -> set[int]:
    """Wait for the ranks; a rank that failed stops the others after a grace period (module docstring: GRACE_SECONDS,
    plus ``detect_seconds`` while rank 0 has yet to notice; a fresh GRACE_SECONDS from rank 0's end); the ranks stopped are
    returned. With ``partial``, the run is over once the edge and fed server ranks finished (device ranks still
    running then were taken out of it and are stopped by the caller)."""
    deadline: float | None = None
    edge_done = False
    while any(p.poll() is None for p in procs):
        polled = [p.poll() for p in procs]
        if partial and polled[EDGE_RANK] == 0 and polled[FED_RANK] == 0:
            break
        counted = polled[:FED_RANK + 1] if partial else polled
        now = time.monotonic()
        if deadline is None and any(c not in (None, 0) for c in counted):
            deadline = now + GRACE_SECONDS + detect_seconds       # rank 0 ended already: replaced just below
        if deadline is not None and not edge_done and polled[EDGE_RANK] is not None:
            edge_done = True                # rank 0 ended (it told the others why): they get a grace of their own,
            deadline = now + GRACE_SECONDS  # and no more time for rank 0 to notice (it has ended)
        if deadline is not None and now > deadline:
            return _stop(procs)
        time.sleep(POLL_SECONDS)
    return set()


def _exit_code(codes: list[int], layout: RankLayout, logs: Path, terminated: set[int], out: str | None,
               runtime: str, partial: bool) -> int:
    """The run's exit code from the ranks' codes, after one line per failed rank (and where to resume) on
    stderr; the rank logs are removed. Interrupted (Ctrl-C, SIGTERM), rank 0 stopped at the end of a round and said
    where the run continues from; the others ended when it told them, and a device rank lost before (partial
    participation) was named by rank 0 as the run went on without it: nothing more is said."""
    interrupted = codes[EDGE_RANK] in (128 + signal.SIGINT, 128 + signal.SIGTERM)
    try:
        if all(c == 0 for c in codes) or (partial and codes[EDGE_RANK] == 0 and codes[FED_RANK] == 0):
            return 0
        if codes[0] == 2:              # a user error: rank 0 said it; the others only stopped because of it
            return 2
        for rank, code in enumerate([] if interrupted else codes):
            line = _failure_line(rank, code, layout, logs, rank in terminated)
            if line:
                print(f"adaptplan train: {line}", file=sys.stderr)
    finally:
        shutil.rmtree(logs, ignore_errors=True)
    if out and not interrupted and (Path(out) / "checkpoint.pt").exists():
        print(f"adaptplan train: the run stopped; its last checkpoint is in {out}: continue with "
              f"{resume_command(out, distributed=True, transport=runtime)}", file=sys.stderr)
    return codes[0] if codes[0] > 0 else EXIT_RANK_FAILED


def _failure_line(rank: int, code: int, layout: RankLayout, logs: Path, terminated: bool) -> str | None:
    """What to say about one rank: nothing when it finished or only relayed rank 0's reason."""
    who = f"rank {rank} ({layout.describe(rank)})"
    if code == 0:
        return None
    if terminated:
        return f"{who} did not stop within {GRACE_SECONDS:g} s of the failure and was terminated"
    if code < 0:
        return f"{who} {_status(code)}"
    if rank == 0:
        return None                # rank 0 wrote its own line to this terminal
    text = (logs / f"rank{rank}.log").read_text(errors="replace").strip().splitlines()
    ours = [line for line in text if line.startswith("adaptplan ")]
    if ours and " stopped: " in ours[-1]:
        return None                # told by rank 0, which named the cause
    return ours[-1].split(": ", 1)[1] if ours else f"{who} {_status(code)}"


def _stop(procs: list[subprocess.Popen]) -> set[int]:
    """Terminate ranks still running (SIGTERM, then SIGKILL after 5 s); the ranks terminated."""
    alive = {rank: p for rank, p in enumerate(procs) if p.poll() is None}
    for p in alive.values():
        p.terminate()
    deadline = time.monotonic() + 5.0
    for p in alive.values():
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
    return set(alive)
