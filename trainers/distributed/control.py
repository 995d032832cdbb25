"""The messages that run a rank, besides the roles' own (:mod:`trainers.roles.messages`,
:mod:`trainers.roles.protocol`): joining, setting a device rank up, link rates, the round's report,
stopping and failing (docs/distributed.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from trainers.roles.defences import ActivationDefence
from trainers.roles.optim import OptimizerSpec


@dataclass
class Envelope:
    """Every message between ranks travels in one: ``t_send`` (:func:`time.time` when it was
    handed to the transport), ``rate`` (bit/s of its link when links are emulated) and
    ``charged_bytes`` (what the latency model charges for it, when more than the message: the edge
    server's blocks, one copy per device instance, eq. 25). ``arrived`` is set by the receiver."""

    msg: Any
    t_send: float
    rate: float | None = None
    charged_bytes: int | None = None
    arrived: float = 0.0


@dataclass
class Layout:
    """Rank 0 → every rank: how many devices the run has (the rank layout follows)."""

    num_devices: int


@dataclass
class DeviceSpec:
    """One device a device rank builds: its cut, the positions of its samples in the data set (not
    the samples), its batch size, sampler seed and optimizer, its defence, and under a U-shaped split
    (``defence.head``) its head's optimizer (the server's settings, :mod:`trainers.roles.head`)."""

    cut: int
    positions: torch.Tensor
    batch_size: int
    seed: list[int]
    optimizer: OptimizerSpec
    defence: ActivationDefence = field(default_factory=ActivationDefence)
    head_optimizer: OptimizerSpec | None = None


@dataclass
class Setup:
    """Rank 0 → a device rank: build these devices from the data set and model ``source`` names
    (``dataset``, ``model``, ``model_width``, ``num_train``, ``num_classes``) and the chain's
    ``initial`` weights."""

    source: dict[str, Any]
    initial: list[dict[str, torch.Tensor]]
    devices: dict[int, DeviceSpec] = field(default_factory=dict)


@dataclass
class Ready:
    devices: list[int]


@dataclass
class LinkRates:
    """The round's link rates (bit/s) where links are emulated: per device ``up_bps``,
    ``down_bps``, ``fed_up_bps``, ``fed_down_bps``; and ``edge_to_fed_bps``, ``fed_to_edge_bps``."""

    devices: dict[int, dict[str, float]]
    edge_to_fed_bps: float
    fed_to_edge_bps: float


@dataclass
class Report:
    """A rank's answer to RoundEnd: the seconds it measured per stage and participant."""

    seconds: dict[str, dict[Any, float]]


@dataclass
class Stop:
    """Rank 0 → every rank still in the run: the run is done; ``lost`` the device ranks it took out
    of the run (partial participation), whose undelivered frames nobody waits for."""

    lost: list[int] = field(default_factory=list)


@dataclass
class Abort:
    reason: str


@dataclass
class Rejoin:
    """A device rank started again (its earlier process died) → rank 0: its first frame, numbered
    0. Rank 0 sets its devices up again at the next round's start where the algorithm allows
    absence (docs/mqtt.md "Churn"); elsewhere the run stops, to be resumed."""


@dataclass
class Readmit:
    """Rank 0 → the fed server: device rank ``rank`` came back as a new process: number the frames
    to and from it anew."""

    rank: int


@dataclass
class Alive:
    """Rank 0 → a rank it has sent nothing else for a while (:data:`~trainers.distributed.session.HEARTBEAT_FACTOR`
    time-outs): it is alive, only busy (evaluating, re-planning, writing its files). The receiving channel takes
    it in and waits on, so the rank's silence timer measures a hung or dead rank 0, never a long pause."""


@dataclass
class RoleError:
    """A role's own error on a rank (``nonfinite``, ``mismatch``, ``input``): rank 0 raises it as its own; ``bad``:
    a message from the device rank ``blame`` that its role may not send (trainers.roles.checks), which rank 0
    raises as that rank's failure; ``lost``: the device rank ``blame``, which this rank waited on, is gone or
    silent (``message`` says which), raised at rank 0 as that rank's failure. Only a server's ``blame`` is believed: a
    device rank's error that names another rank is its own failure (:data:`trainers.distributed.transport.SERVER_RANKS`)."""

    kind: str
    message: str
    blame: int | None = None


RANK_MESSAGES = (Envelope, Layout, DeviceSpec, Setup, Ready, LinkRates, Report, Stop, Abort, RoleError, Rejoin, Readmit,
                 Alive)
