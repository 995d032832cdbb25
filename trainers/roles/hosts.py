"""The roles as message handlers: what a process hosting devices, or the fed server, does with each
message (:mod:`trainers.roles.messages`, :mod:`trainers.roles.protocol`). The same handlers run in the simulator
(all devices in one :class:`DeviceHost`, :class:`trainers.engine.network.LocalNetwork`) and on the ranks of
a torch.distributed run (a :class:`DeviceHost` per device rank, :mod:`trainers.distributed.serve`).

A handler answers through ``emit(to, message)``; ``to`` is :data:`~trainers.roles.protocol.EDGE`,
:data:`~trainers.roles.protocol.FED` or a device index (its host).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from torch import nn

from trainers.roles.batching import ClientBatcher
from trainers.roles.checks import BadMessageError, check_upload
from trainers.roles.core import AGGREGATION_RULES, Device, FedServer
from trainers.roles.head import Head
from trainers.roles.messages import (
    Activation,
    BlockState,
    CutGradient,
    HeadForward,
    MessageMismatchError,
    ModelDownload,
    ModelUpload,
    check_all_finite,
)
from trainers.roles.protocol import (
    EDGE,
    FED,
    AggregationRule,
    Average,
    Blocks,
    Forward,
    GetBlocks,
    GetState,
    Groups,
    RoundEnd,
    Send,
    SetState,
    State,
    Take,
    Upload,
)

Emit = Callable[[Any, Any], None]


def device_finite_items(device: Device) -> list[tuple[Any, str, int | str]]:
    """(parameter, what, device) of every client-model parameter, for :func:`check_all_finite`."""
    return [(p, f"client model block {j + 1}", device.index) for j, block in enumerate(device.blocks)
            for p in block.parameters()]


def _devices_named(msg: Any) -> list[int]:
    """The devices a message to a device host is about (those whose models handling it may change)."""
    if isinstance(msg, Forward):
        return [d for d, _ in msg.items]
    device = getattr(msg, "device", None)
    return [device] if isinstance(device, int) else []


class DeviceHost:
    """Devices ``devices`` (index → :class:`~trainers.roles.core.Device`) of one process; ``batcher``
    runs a group's client forwards as one call where it can (``--client-batching``).

    A model changes only through the roles' messages, so the round's NaN/inf check
    (:class:`~trainers.roles.protocol.RoundEnd`) looks at the devices some message named since the last
    check passed, and at devices never checked; under partial participation the others, whose models no
    message could have changed, are not read again (at 100 devices and ρ = 0.1 a tenth of the tensors).

    ``heads`` (a U-shaped split, :mod:`trainers.roles.head`): each device's head, which keeps its labels, answers
    the edge server's features, steps when the device does and travels in its model messages."""

    def __init__(self, devices: dict[int, Device], batcher: ClientBatcher | None = None,
                 heads: dict[int, Head] | None = None) -> None:
        self.devices = devices
        self.batcher = batcher
        self.heads = heads or {}
        self._checked: set[int] = set()  # devices found finite at the last check and named by no message since

    def device(self, index: int) -> Device:
        try:
            return self.devices[index]
        except KeyError:
            raise MessageMismatchError(f"a message for device {index}, which is not hosted here "
                                       f"(devices {sorted(self.devices)})") from None

    def handle(self, msg: Any, emit: Emit) -> None:
        self._checked.difference_update(_devices_named(msg))
        if isinstance(msg, Forward):
            self.forward(msg, emit)
        elif isinstance(msg, CutGradient):
            self.device(msg.device).backward(msg)                      # eq. (6)
            if msg.device in self.heads:
                self.heads[msg.device].finish(msg)
        elif isinstance(msg, HeadForward):
            emit(EDGE, self.head(msg.device).reply(msg))
        elif isinstance(msg, ModelDownload):
            self.device(msg.device).download(self.heads[msg.device].download(msg) if msg.device in self.heads else msg)
        elif isinstance(msg, Upload):
            emit(msg.to, self.upload(msg))
        elif isinstance(msg, GetBlocks):
            emit(EDGE, Blocks(msg.device, [block.state_dict() for block in self.held_blocks(msg.device)]))
        elif isinstance(msg, GetState) and msg.device is not None:      # None: the fed server's (FedHost)
            emit(EDGE, State(msg.device, self.state(msg.device)))
        elif isinstance(msg, SetState) and msg.device is not None:
            self.set_state(msg.device, msg.state)
        elif isinstance(msg, RoundEnd):
            self.check_finite(msg.round)
        else:
            raise MessageMismatchError(f"a device host cannot handle a {type(msg).__name__}")

    def held_blocks(self, device: int) -> list[nn.Module]:
        """The blocks device ``device`` holds, in their order: its client blocks, then its head's (a U-shaped split)."""
        return [*self.device(device).blocks, *(self.heads[device].blocks if device in self.heads else [])]

    def head(self, device: int) -> Head:
        if device not in self.heads:
            raise MessageMismatchError(f"features for device {device}, which keeps no head (no U-shaped split)")
        return self.heads[device]

    def upload(self, msg: Upload) -> ModelUpload:
        """Device ``msg.device``'s blocks among ``msg.blocks``: its client blocks and its head's."""
        up = self.device(msg.device).upload(msg.round, msg.blocks, msg.weight, msg.with_optimizer)
        if msg.device in self.heads:
            up.blocks.update(self.heads[msg.device].upload(msg.blocks, msg.with_optimizer))
        return up

    def state(self, device: int) -> dict[str, Any]:
        state = self.device(device).state_dict()
        return {**state, "head": self.heads[device].state_dict()} if device in self.heads else state

    def set_state(self, device: int, state: dict[str, Any]) -> None:
        if device in self.heads:
            if "head" not in state:
                raise ValueError(f"device {device}'s state must hold its head (a U-shaped split's run writes it)")
            self.heads[device].load_state_dict(state["head"])
            state = {k: v for k, v in state.items() if k != "head"}
        self.device(device).load_state_dict(state)

    def check_finite(self, round_index: int) -> None:
        """:func:`check_all_finite` of the client models of the devices that may have changed (class
        docstring); a :class:`~trainers.roles.messages.NonFiniteError` names the first offending device."""
        changed = [d for d in self.devices if d not in self._checked]
        check_all_finite([item for d in changed for item in device_finite_items(self.devices[d])
                          + (self.heads[d].finite_items() if d in self.heads else [])], round_index)
        self._checked.update(changed)

    def forward(self, msg: Forward, emit: Emit) -> None:
        """Eq. (2) for every device of the message, one after the other or batched; their
        activations are emitted in the message's order."""
        if self.batcher is not None and len(msg.items) > 1:
            batch = dict(msg.items)
            out = self.batcher.forward([self.device(d) for d, _ in msg.items], msg.round, batch)
            for d, _ in msg.items:
                emit(EDGE, self.leaving(out[d]))
            return
        for d, b in msg.items:
            emit(EDGE, self.leaving(self.device(d).forward(msg.round, b, msg.recompute)))

    def leaving(self, msg: Activation) -> Activation | HeadForward:
        """An activation as it leaves the host: under a U-shaped split its labels stay with the device's head."""
        return self.heads[msg.device].keep(msg) if msg.device in self.heads else msg


class FedHost:
    """The fed server's messages: uploads folded into the running average (or kept for a
    hand-off), averages finished, blocks sent on (``fed`` does the arithmetic)."""

    def __init__(self, fed: FedServer | None = None) -> None:
        self.fed = fed or FedServer()
        self.kept: dict[int, ModelUpload] = {}
        self.latest: dict[tuple[int, int], BlockState] = {}
        """The last :class:`Average`'s blocks, by (group, block)."""

    def handle(self, msg: Any, emit: Emit) -> None:
        if isinstance(msg, ModelUpload):
            self.fed.add(msg)
        elif isinstance(msg, Average):
            self.latest = self.fed.finish(msg.round)
        elif isinstance(msg, Groups):
            try:
                self.fed.set_groups(msg.groups)
            except ValueError as err:
                raise MessageMismatchError(str(err)) from None
        elif isinstance(msg, AggregationRule):
            if msg.rule not in AGGREGATION_RULES or not 0.0 <= float(msg.trim) < 0.5:
                raise MessageMismatchError(f"the fed server has no aggregation rule {msg.rule!r} (trim {msg.trim})")
            self.fed.rule = (msg.rule, float(msg.trim))
        elif isinstance(msg, Send):
            blocks = {j: b for j, b in ((j, self.block(ref, msg.device)) for j, ref in msg.refs.items()) if b is not None}
            emit(msg.to, ModelDownload(msg.device, msg.round, msg.receiver, blocks, msg.cut,
                                       fresh_optimizer=msg.fresh_optimizer))
            for ref in msg.refs.values():
                if ref[0] == "kept":
                    self.kept.pop(ref[1], None)
        elif isinstance(msg, GetState):
            emit(EDGE, State(None, self.fed.state_dict()))
        elif isinstance(msg, SetState):
            self.fed.load_state_dict(msg.state)
            self.latest = {}
        elif isinstance(msg, RoundEnd):
            pass
        else:
            raise MessageMismatchError(f"the fed server cannot handle a {type(msg).__name__}")

    def keep(self, key: int, upload: ModelUpload) -> None:
        self.kept[key] = upload

    def block(self, ref: tuple, device: int) -> BlockState | None:
        """The block a :class:`Send` reference names (an average or a global block of ``device``'s group, or of
        the group the reference names); None for a global block not averaged yet."""
        kind = ref[0]
        if kind in ("avg", "global"):
            group = int(ref[2]) if len(ref) > 2 else self.fed.group(device)
            if kind == "global":
                state = self.fed.globals.get(group, {}).get(ref[1])
                return None if state is None else BlockState(state)
            if (group, ref[1]) not in self.latest:
                raise MessageMismatchError(f"the last average holds no block {ref[1]} of group {group} "
                                           f"(device {device}'s)")
            return self.latest[group, ref[1]]
        if kind == "kept":
            return self.kept[ref[1]].blocks[ref[2]]
        raise MessageMismatchError(f"the fed server holds no block {ref!r}")


def take(host: DeviceHost | FedHost, order: Take, msg: Any, emit: Emit) -> None:
    """Deliver ``msg``, taken from ``order.source`` as the edge server ordered: a fed server keeps
    an upload under ``order.keep`` instead of folding it. An upload the order describes (``expect``) is checked
    first (:func:`~trainers.roles.checks.check_upload`: a :class:`~trainers.roles.checks.BadMessageError` names the
    device), and the order's ``weight`` replaces the one the device stated (issue 67 E8)."""
    if order.expect is not None:
        if not isinstance(msg, ModelUpload):
            raise BadMessageError(int(order.source), "model upload", "type", f"is a {type(msg).__name__}")
        check_upload(msg, int(order.source), list(order.expect), order.expect)
    if order.weight is not None and isinstance(msg, ModelUpload):
        msg = dataclasses.replace(msg, weight=float(order.weight))
    if order.keep is not None:
        if not isinstance(host, FedHost) or not isinstance(msg, ModelUpload):
            raise MessageMismatchError(f"only the fed server keeps uploads (got a {type(msg).__name__})")
        host.keep(order.keep, msg)
    else:
        host.handle(msg, emit)


__all__ = ["DeviceHost", "FedHost", "FED", "EDGE", "take", "device_finite_items"]
