"""Joining the process group and running one rank (docs/distributed.md).

Every rank reads the torchrun environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``), joins a gloo process group, and learns the layout from rank 0. Rank 0 then runs
the usual :class:`trainers.run.driver.Trainer` with the simulator's round loop on a
:class:`~trainers.distributed.network.RankNetwork` (:class:`EdgeSession`); the others host their
roles and serve rank 0's messages (:func:`serve_rank`, :mod:`trainers.distributed.serve`).

A failure anywhere ends every rank with one line: rank 0 tells the others why (``abort``) before
it exits; a rank that loses rank 0 names it. Exit codes: 0 done, 2 a user error (rank 0's
message), 3 a rank failed or timed out.
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
import threading
import time
from typing import Any, Callable

import torch.distributed as dist

from adaptplan.errors import InputError
from trainers.config.host import use_cpu
from trainers.distributed.control import Abort, Alive, Layout, Rejoin, Stop
from trainers.distributed.environment import RUNTIME_ENV, run_key, store_file, wire_trace
from trainers.distributed.layout import EDGE_RANK, FED_RANK, SETUP_TIMEOUT_FACTOR, RankLayout
from trainers.distributed.network import RankNetwork
from trainers.distributed.serve import RankLoop, WorkerOptions
from trainers.distributed.transport import AbortRun, Channel, FrameChannel, PeerError
from trainers.engine.split_engine import SplitEngine
from trainers.roles.messages import DevicesLost

EXIT_RANK_FAILED = 3
HEARTBEAT_FACTOR = 0.5
"""Rank 0 sends a rank :class:`Alive` after this many ``--rank-timeout`` without another message to it, so a
long pause of rank 0 (an evaluation, a re-plan, the run's files) never runs out the other ranks' 1.5 time-outs
of allowed silence (:data:`trainers.distributed.serve.IDLE_FACTOR`); a stopped or dead rank 0 sends none."""


class DistributedRunError(RuntimeError):
    """A rank died, hung or aborted; the message names it (its rank, role and devices)."""


def in_rank() -> bool:
    """True inside a process started as a rank (torchrun or ``adaptplan train --distributed``)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


NO_TIMEOUT = datetime.timedelta(days=365)


def join(timeout: float) -> tuple[int, int, Any]:
    """Join the gloo process group from the environment (every rank within ``SETUP_TIMEOUT_FACTOR``
    time-outs); (rank, world size, the group for the transfers). The rendezvous is the local run's
    store file when ``ADAPTPLAN_STORE_FILE`` is set (no socket), else torchrun's TCP store. The
    transfers' group has no time-out of its own: :class:`Channel` bounds every wait."""
    if runtime() == "mqtt":        # the broker connects the ranks: no process group
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), None
    if not dist.is_initialized():
        wait = datetime.timedelta(seconds=timeout * SETUP_TIMEOUT_FACTOR)
        path = store_file()
        if path:
            world = int(os.environ["WORLD_SIZE"])
            dist.init_process_group("gloo", store=dist.FileStore(path, world), rank=int(os.environ["RANK"]),
                                    world_size=world, timeout=wait)
        else:
            dist.init_process_group("gloo", init_method="env://", timeout=wait)
    group = dist.new_group(backend="gloo", timeout=NO_TIMEOUT)
    return dist.get_rank(), dist.get_world_size(), group


def runtime() -> str:
    """``mqtt`` when the ranks meet at a broker (``ADAPTPLAN_RUNTIME=mqtt``), else ``gloo``."""
    return "mqtt" if os.environ.get(RUNTIME_ENV, "").strip().lower() == "mqtt" else "gloo"


def open_channel(timeout: float, describe: Callable[[int], str], group: Any, key: bytes) -> FrameChannel:
    """This rank's channel — over gloo, or over the broker of ``ADAPTPLAN_MQTT_*`` — authenticating
    with ``key`` and tracing when asked to."""
    if runtime() == "mqtt":
        from trainers.distributed.mqtt import MqttChannel, broker_login

        rank = int(os.environ["RANK"])
        return MqttChannel(rank, int(os.environ["WORLD_SIZE"]), timeout, describe, key, broker_login(),
                           trace=wire_trace(rank), wait_seconds=timeout * SETUP_TIMEOUT_FACTOR)
    return Channel(timeout, describe, group, key=key, trace=wire_trace(dist.get_rank()))


def joined_where() -> str:
    """Where this rank met the others, for its line on joining: the broker and run over MQTT."""
    if runtime() != "mqtt":
        return " over torch.distributed"
    from trainers.distributed.mqtt_login import BROKER_ENV, RUN_ENV

    return f" at the broker {os.environ.get(BROKER_ENV, '')} (run {os.environ.get(RUN_ENV, '')})"


def leave(channel: FrameChannel) -> None:
    """Deliver what is queued (a peer that stopped receiving is passed over: a device rank taken out
    of the run, or one that already ended). The process group is not destroyed: its receiving threads are
    blocked in gloo until the process ends (:func:`adaptplan.distributed.main` ends it with
    ``os._exit`` after flushing its output)."""
    channel.close()
    channel.flush(timeout=channel.timeout, skip_lost=True)


class EdgeSession:
    """Rank 0's side: the engine factory for :class:`~trainers.run.driver.Trainer`, and the clean end
    (``stop`` to every rank) or the abort (the reason to every rank)."""

    def __init__(self, num_devices: int, timeout: float, emulate_links: bool, threads: int | None,
                 source: dict[str, Any] | None = None) -> None:
        key = run_key()
        self.source = dict(source or {})
        rank, world, group = join(timeout)
        if rank != EDGE_RANK:
            raise RuntimeError(f"the edge session runs on rank {EDGE_RANK}, not {rank}")
        use_cpu(threads or 1)
        self.layout = RankLayout(world, num_devices)
        self.channel = open_channel(timeout, self.layout.describe, group, key)
        self.emulate_links = emulate_links
        self.network: RankNetwork | None = None
        for r in self.others:
            self.channel.send(Layout(num_devices), r)
        self._ended = threading.Event()
        threading.Thread(target=self._heartbeat, daemon=True, name="heartbeat").start()

    def _heartbeat(self) -> None:
        """Until the run ends or the ranks are released: :class:`Alive` to each rank still in the run that rank 0
        has sent nothing for :data:`HEARTBEAT_FACTOR` time-outs (checked four times as often)."""
        period = HEARTBEAT_FACTOR * self.channel.timeout
        while not self._ended.wait(period / 4) and not self.released:
            now = time.monotonic()
            for r in self.others:
                if now - self.channel.last_sent.get(r, now) >= period and not self.channel.restarted(r):
                    try:
                        self.channel.send(Alive(), r)
                    except Exception:   # noqa: BLE001 - a rank that stopped receiving: rank 0's own waits name it
                        pass

    @property
    def others(self) -> list[int]:
        """The ranks still in the run (a device rank lost under partial participation is not)."""
        lost = self.network.lost if self.network is not None else {}
        return [FED_RANK] + [r for r in self.layout.device_ranks if r not in lost]

    def engine_factory(self, chain: Any, *args: Any, **kwargs: Any) -> SplitEngine:
        """The simulator's engine, its devices and fed server on the other ranks. A second engine of the run (its
        strategy moved to another model: docs/engine.md "A change of model") sets the ranks up again around it,
        the device ranks it took out of the run staying out."""
        network = RankNetwork(self.channel, self.layout, self.emulate_links, self.source, previous=self.network)
        self.network = network
        kwargs["network"] = network.setup
        return SplitEngine(chain, *args, **kwargs)

    @property
    def released(self) -> bool:
        """Whether the other ranks were told to stop (training ended: :meth:`RankNetwork.release`)."""
        return self.network is not None and self.network.released

    def finish(self) -> None:
        """The clean end: :class:`Stop` to every rank (where training's end has not sent it already), then
        deliver what is queued."""
        self._ended.set()
        if self.network is not None:
            self.network.release()
        else:
            for r in self.others:
                self.channel.send(Stop([]), r)
        leave(self.channel)

    def abort(self, reason: str) -> None:
        """Best effort: tell every rank why the run stops (a device rank's new process too); never raises.
        Ranks already released (a failure after training ended, e.g. writing a plot) have ended with
        code 0 and are told nothing: rank 0 alone reports it."""
        self._ended.set()
        if self.released:
            return
        for r in self.others:
            if self.channel.restarted(r):
                self.channel.admit(r)
            try:
                self.channel.send(Abort(reason), r)
            except Exception:   # noqa: BLE001 - a dead peer cannot be told; the others still are
                pass
        self.channel.closing = True
        try:
            self.channel.flush(timeout=5.0, skip_lost=True)
        except Exception:   # noqa: BLE001 - a peer that takes nothing within 5 s is left to the launcher
            pass


def run_edge(num_devices: int, timeout: float, emulate_links: bool, threads: int | None,
             body: Callable[[Callable[..., SplitEngine]], int], source: dict[str, Any] | None = None) -> int:
    """Run ``body(engine_factory)`` (the train command's work) as rank 0, then stop or abort every
    rank; ``source`` (dataset, model, model_width) is what the device ranks build from."""
    session = EdgeSession(num_devices, timeout, emulate_links, threads, source)
    try:
        code = body(session.engine_factory)
    except (PeerError, DevicesLost) as exc:
        session.abort(f"rank 0 (edge server) stopped: {exc}")
        raise DistributedRunError(str(exc)) from None
    except BaseException as exc:
        session.abort(f"rank 0 (edge server) stopped: {' '.join(str(exc).split())[:300] or type(exc).__name__}")
        raise
    session.finish()
    return code


def serve_rank(options: WorkerOptions) -> int:
    """Ranks 1.. : serve rank 0's commands until it says stop. One line and exit code 3 on failure."""
    timeout, threads = options.timeout, options.threads
    signal.signal(signal.SIGINT, signal.SIG_IGN)          # rank 0 decides when an interrupted run stops
    try:
        key = run_key()
    except InputError as exc:
        print(f"adaptplan train: rank {os.environ.get('RANK')}: {exc}", file=sys.stderr)
        return 2
    rank, world, group = join(timeout)
    use_cpu(threads or 1)
    describe = {EDGE_RANK: "edge server"}.get
    try:
        channel = open_channel(timeout, lambda r: describe(r) or f"rank {r}", group, key)
    except InputError as exc:          # the broker cannot be reached, or refused this rank's login
        print(f"adaptplan train: rank {rank}: {exc}", file=sys.stderr)
        return 2
    who = f"rank {rank}"
    if channel.rejoining:              # an earlier process of this rank died: ask rank 0 to take it back
        channel.send(Rejoin(), EDGE_RANK)
    try:
        first = channel.recv(EDGE_RANK, timeout=timeout * SETUP_TIMEOUT_FACTOR).msg
        if not isinstance(first, Layout):
            raise PeerError(EDGE_RANK, "edge server", f"sent a {type(first).__name__} before the layout")
        layout = RankLayout(world, int(first.num_devices))
        channel.describe = layout.describe
        who = f"rank {rank} ({layout.describe(rank)})"
        loop = RankLoop(channel, layout, timeout * SETUP_TIMEOUT_FACTOR, options)
        loop.say(f"joined the run of {world} ranks{joined_where()}")
        loop.serve()
    except AbortRun as exc:
        print(f"adaptplan train: {who} stopped: {exc}", file=sys.stderr)
        return EXIT_RANK_FAILED
    except PeerError as exc:
        print(f"adaptplan train: {who} ended: {exc}", file=sys.stderr)
        return EXIT_RANK_FAILED
    except Exception as exc:   # noqa: BLE001 - a bug here: one line, the others see this rank go
        text = " ".join(str(exc).split())[:300]
        print(f"adaptplan train: {who} internal error: {type(exc).__name__}: {text}", file=sys.stderr)
        return EXIT_RANK_FAILED
    leave(channel)
    return 0
