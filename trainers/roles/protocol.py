"""The control messages that drive the roles, next to the four data messages of
:mod:`trainers.roles.messages` (docs/architecture.md "Where the roles run").

The edge server runs the round loop; it tells the hosts of the devices and the fed server what to
do with these messages, and the hosts (:mod:`trainers.roles.hosts`) answer with data messages or the
receipts below. Every runtime carries the same messages: the simulator in one process
(:class:`trainers.engine.network.LocalNetwork`), torch.distributed between ranks
(:class:`trainers.distributed.network.RankNetwork`).

Messages between two hosts (a device's upload to the fed server, the fed server's download to a
device) are taken in when the edge server says so (:class:`Take`), in the order it says: the
numbers do not depend on which message happens to arrive first.

=================  ==================  =====================================================
message            from → to           meaning
=================  ==================  =====================================================
:class:`Forward`   edge → device host  run the client forward (eq. 2) of these devices
:class:`Upload`    edge → device host  send these blocks to the fed server (or the edge)
:class:`Take`      edge → any host     take the next message from ``source`` now
:class:`Average`   edge → fed server   finish the running average (it becomes the global model)
:class:`Groups`    edge → fed server   average each group of devices apart, one global model per group
:class:`Send`      edge → fed server   send blocks it holds as a ModelDownload to ``to``
:class:`GetBlocks` edge → device host  reply :class:`Blocks`: the device's client blocks
:class:`GetState`  edge → any host     reply :class:`State` (a checkpoint's part)
:class:`SetState`  edge → any host     load a checkpoint's part
:class:`RoundEnd`  edge → any host     check the models for NaN/inf (the round's end)
=================  ==================  =====================================================

Nothing is acknowledged that the edge server can work out itself: the sizes of the blocks (bytes)
follow from the model, so uploads and averages send no receipts and nobody waits for one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

FED = "fed"
EDGE = "edge"
Address = Any
"""A device index (its host), :data:`FED` or :data:`EDGE`."""


@dataclass
class Forward:
    """Run eq. (2) for each (device, batch size) of ``items``; each device replies an Activation.
    ``recompute``: the devices recompute their forward at backward time (docs/engine.md "Recomputed client forwards")."""

    round: int
    items: list[tuple[int, int]]
    recompute: bool = False


@dataclass
class Upload:
    """Device ``device`` sends its blocks among ``blocks`` (those below its cut) as a ModelUpload to
    ``to`` (:data:`FED` or :data:`EDGE`)."""

    device: int
    round: int
    blocks: list[int]
    weight: float
    with_optimizer: bool = False
    to: str = FED


@dataclass
class Take:
    """Take the next message from ``source`` now. At the fed server an upload is folded into the
    running average, or kept under ``keep`` (a hand-off's, sent on by :class:`Send`); with ``expect`` (the blocks
    asked for, their entries, shapes and dtypes: :data:`trainers.roles.checks.Schema`) it is checked first, and with
    ``weight`` that FedAvg weight (|D_i|, the edge server's) replaces the one the upload states."""

    source: Address
    keep: int | None = None
    weight: float | None = None
    expect: dict[int, dict[str, tuple[tuple[int, ...], str]]] | None = None


@dataclass
class Average:
    """Finish the average of the uploads folded since the last one (FedServer.finish); it becomes
    the latest average (``("avg", j)`` in :class:`Send`) and the global model."""

    round: int


@dataclass
class Groups:
    """From now on the fed server averages each group of devices apart and keeps one global model per group
    (FedConcat's clusters): ``groups[i]`` is device i's group (0, 1, ...). A :class:`Send` for a device names its
    group's blocks (``("avg", j)``, ``("global", j)``); ``("global", j, g)`` names group g's. Before any
    :class:`Groups`, every device is in group 0."""

    groups: tuple[int, ...]


@dataclass
class AggregationRule:
    """From now on the fed server combines uploads by ``rule`` (:data:`trainers.roles.core.AGGREGATION_RULES`;
    ``trim`` the trimmed-mean's β), instead of FedAvg's mean."""

    rule: str
    trim: float = 0.0


@dataclass
class Send:
    """The fed server sends a ModelDownload for device ``device`` to ``to`` with the blocks
    ``refs`` names: ``("avg", j)`` the latest average, ``("global", j)`` the global model (blocks
    not averaged yet are left out), both of ``device``'s group (:class:`Groups`), ``("global", j, g)`` group g's,
    ``("kept", key, j)`` a kept upload (released once sent).
    ``charged_bytes``: what the latency model charges the link for it when that is more than the
    message (the edge server's blocks: one copy per device instance, eq. 25)."""

    to: Address
    device: int
    round: int
    receiver: str
    refs: dict[int, tuple]
    cut: int | None = None
    fresh_optimizer: bool = False
    charged_bytes: int | None = None


@dataclass
class GetBlocks:
    """Reply :class:`Blocks` with device ``device``'s client blocks (evaluation, tests)."""

    device: int


@dataclass
class Blocks:
    device: int
    states: list[dict[str, torch.Tensor]]


@dataclass
class GetState:
    """Reply :class:`State` with the state of device ``device`` (``None``: the fed server's)."""

    device: int | None = None


@dataclass
class State:
    device: int | None
    state: dict[str, Any] = field(default_factory=dict)


@dataclass
class SetState:
    device: int | None
    state: dict[str, Any] = field(default_factory=dict)


@dataclass
class RoundEnd:
    """The round is over: a host checks its models for NaN/inf (NonFiniteError naming the device)."""

    round: int


CONTROL_MESSAGES = (Forward, Upload, Take, Average, Groups, AggregationRule, Send, GetBlocks, Blocks, GetState, State,
                    SetState, RoundEnd)
