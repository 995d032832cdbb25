"""How the edge server's messages reach the other roles: the :class:`Network` a runtime provides,
and :class:`LocalNetwork`, the simulator's, which delivers them in this process
(docs/architecture.md "Where the roles run").

The round loop (:class:`trainers.engine.split_engine.SplitEngine`) talks to the devices and the fed server only
through a network: it sends messages (:mod:`trainers.roles.messages`, :mod:`trainers.roles.protocol`) and
receives the replies it expects, one per source in each source's order. The hosts that handle
them (:mod:`trainers.roles.hosts`) are the same in every runtime; the torch.distributed network
(:class:`trainers.distributed.network.RankNetwork`) puts them on other processes.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

from torch import nn

from trainers.roles.core import Device, FedServer
from trainers.roles.hosts import DeviceHost, FedHost, take
from trainers.roles.messages import MessageMismatchError
from trainers.roles.protocol import EDGE, FED, Address, RoundEnd, Take

if TYPE_CHECKING:  # pragma: no cover
    from trainers.engine.clock import SimClock


class Network(Protocol):
    """What the edge server needs from a runtime."""

    def send(self, to: Address, msg: Any) -> None:
        """Deliver ``msg`` to ``to`` (a device index or FED); messages to one host keep their order."""

    def receive(self, sources: Sequence[Address], allow_absent: bool = False) -> list[Any]:
        """The next message the edge server gets from each entry of ``sources`` (a source may appear
        several times: that many, in its order). With ``allow_absent`` a device whose host is lost
        (a real runtime: it died or stayed silent past the time-out) is skipped and becomes absent
        (:meth:`absent_devices`) instead of failing the run."""

    def absent_devices(self) -> set[int]:
        """The devices lost so far (their host died or stayed silent): none in one process."""

    def readmit(self) -> list[int]:
        """Devices whose lost host came back as a new process, set up again (as at the start); their
        devices are present again. None in one process."""

    def hosts(self, devices: Sequence[int]) -> list[list[int]]:
        """``devices`` grouped by the host that holds them, each group in ``devices``' order."""

    def device_blocks(self, device: int) -> nn.ModuleList | None:
        """Device ``device``'s client blocks (then its head's, under a U-shaped split) as modules, for evaluation: the
        live ones where they are in this process, else a copy made once until a message changes them; None when the
        device is lost (only where the algorithm allows absence)."""

    def begin_round(self, round_index: int, clock: "SimClock | None") -> None:
        """A round starts (the clock's system of the round sets the link rates where links are emulated)."""

    def end_round(self, round_index: int) -> dict[str, dict[str, float]] | None:
        """Every host checks its models for NaN/inf (:class:`NonFiniteError`); the measured seconds per
        stage and role (``StageLedger.by_role``) of the round where a runtime measures them, else None."""

    def release(self) -> None:
        """Training is over (the last round trained and evaluated): nothing more is sent to the hosts.
        A runtime of processes lets them end now, not after the run's files are written
        (a rank held on past its time-out would end with a failure). Nothing to do in one process."""


class LocalNetwork:
    """Every device in one :class:`DeviceHost` and the fed server in a :class:`FedHost`, in this
    process: a message is handled when it is sent. Messages between two hosts wait for the edge
    server's :class:`~trainers.roles.protocol.Take`, as they do between processes."""

    def __init__(self, devices: DeviceHost, fed: FedHost) -> None:
        self.device_host = devices
        self.fed_host = fed
        self.inbox: dict[Address, deque] = {}
        self.between: dict[tuple[str, str], deque] = {}

    # ---- the simulator's own views (tests, inspection) -------------------------------------------------
    @property
    def devices(self) -> list[Device]:
        return [self.device_host.devices[i] for i in sorted(self.device_host.devices)]

    @property
    def fed(self) -> FedServer:
        return self.fed_host.fed

    # ---- Network ----------------------------------------------------------------------------------------
    @staticmethod
    def _host_key(address: Address) -> str:
        return FED if address == FED else "devices"

    def _host(self, address: Address) -> DeviceHost | FedHost:
        if address == EDGE:
            raise MessageMismatchError("the edge server sends to the devices and the fed server, not to itself")
        return self.fed_host if address == FED else self.device_host

    def _emitter(self, sender: Address) -> Callable[[Address, Any], None]:
        def emit(to: Address, msg: Any) -> None:
            if to == EDGE:
                source = FED if sender == FED else getattr(msg, "device", sender)
                self.inbox.setdefault(source, deque()).append(msg)
            else:
                self.between.setdefault((self._host_key(sender), self._host_key(to)), deque()).append(msg)
        return emit

    def send(self, to: Address, msg: Any) -> None:
        host = self._host(to)
        if isinstance(msg, Take):
            queue = self.between.get((self._host_key(msg.source), self._host_key(to)))
            if not queue:
                raise MessageMismatchError(f"{_name(to)} was told to take a message from {_name(msg.source)}, "
                                           "which sent none")
            take(host, msg, queue.popleft(), self._emitter(to))
        else:
            host.handle(msg, self._emitter(to))

    def receive(self, sources: Sequence[Address], allow_absent: bool = False) -> list[Any]:
        out = []
        for s in sources:
            queue = self.inbox.get(s)
            if not queue:
                raise MessageMismatchError(f"the edge server expected a message from {_name(s)}, which sent none")
            out.append(queue.popleft())
        return out

    def absent_devices(self) -> set[int]:
        return set()

    def readmit(self) -> list[int]:
        return []

    def hosts(self, devices: Sequence[int]) -> list[list[int]]:
        return [list(devices)] if devices else []

    def device_blocks(self, device: int) -> nn.ModuleList:
        if device not in self.device_host.heads:
            return self.device_host.device(device).blocks          # the device's live list itself
        return nn.ModuleList(self.device_host.held_blocks(device))

    def begin_round(self, round_index: int, clock: "SimClock | None") -> None:
        pass

    def end_round(self, round_index: int) -> dict[str, dict[str, float]] | None:
        if self.device_host.devices:
            self.send(next(iter(self.device_host.devices)), RoundEnd(round_index))
        return None

    def release(self) -> None:
        pass


def _name(address: Address) -> str:
    return "the fed server" if address == FED else "the edge server" if address == EDGE else f"device {address}"
