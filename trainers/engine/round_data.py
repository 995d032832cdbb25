"""The data the engine's facade and its parts exchange (trainers.engine.seams): the partitioned
:class:`DeviceData`, a round's :class:`RoundStats`, the simulated clock's :class:`RoundTimeline` of the running round
(its :class:`RoundTally` of bytes and samples) and the asynchronous loop's :class:`AsyncLoopState` between global
iterations. Imports nothing of the engine's parts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from adaptplan.fileio import is_finite_number, is_int
from adaptplan.limits import MAX_ROUNDS
from trainers.engine.clock import StageLedger
from trainers.engine.state_schema import is_device_list

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import torch


@dataclass
class DeviceData:
    """Training data and its partition: ``parts[i]`` are device i's sample indices into x_train that it trains
    on, ``local_test[i]`` those it holds out for the local evaluation protocol (none by default)."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    parts: list[np.ndarray]
    num_classes: int | None = None
    local_test: list[np.ndarray] = field(default_factory=list)


@dataclass
class RoundStats:
    """What one round did: mean training loss over the devices that reported one, bytes
    (device→server ``bytes_up``, server→device ``bytes_down``, edge↔fed ``bytes_server``),
    whether client-side averaging happened, the participants, the round's simulated seconds,
    the seconds of each stage (the longest device's, per stage; ``server`` = the edge server's busy
    time) and the strategy's metrics; a real runtime adds the measured seconds per stage and of the round;
    ``samples``: the training samples the devices' activation messages carried (GAS: the active devices' steps);
    ``seconds_by_role`` the simulated and ``measured_seconds_by_role`` the measured seconds per stage and role
    (``StageLedger.by_role``: what a measured system is fitted to, :mod:`adaptplan.measured_system`)."""

    loss: float
    bytes_up: int
    bytes_down: int
    bytes_server: int
    aggregated: bool
    participants: list[int] = field(default_factory=list)
    sim_seconds: float = 0.0
    stage_seconds: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    measured_stage_seconds: dict[str, float] = field(default_factory=dict)
    measured_round_seconds: float | None = None
    samples: int = 0
    seconds_by_role: dict[str, dict[str, float]] = field(default_factory=dict)
    measured_seconds_by_role: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass
class RoundTally:
    """What one round moved and trained on, in bytes per link and in samples: device→edge ``up`` (activations,
    labels, client-model uploads), edge→device ``down`` (gradients, downloads), edge↔fed ``server``, and the
    training ``samples`` the devices' activations carried. Reset at each round's start (``SplitEngine.run_round``)."""

    up: int = 0
    down: int = 0
    server: int = 0
    samples: int = 0


@dataclass
class RoundTimeline:
    """The simulated clock's account of the running round, in one owner: the seconds each role spent in each stage
    (``ledger``), when the edge server is next free (``server_free``, simulated s) and what the round moved and
    trained on (``tally``). The engine starts one at each round (:meth:`next_round`); its parts add to it; the
    round's record reads it (``SplitEngine.round_stats``). ``server_free`` outlives the round, for the asynchronous
    loop, whose time runs on across global iterations (a synchronous group sets it to its start); so does
    ``releases``, each device's count of activations sent so far (the step its latest activation carries: what a
    privacy accountant composes over, trainers/engine/privacy_account.py)."""

    ledger: StageLedger = field(default_factory=StageLedger)
    tally: RoundTally = field(default_factory=RoundTally)
    server_free: float = 0.0
    releases: dict[int, int] = field(default_factory=dict)

    def next_round(self) -> "RoundTimeline":
        """An empty account for the next round, the edge server free when it was, the releases as they were."""
        return RoundTimeline(server_free=self.server_free, releases=self.releases)

    def count(self, msg: Any) -> None:
        """An :class:`~trainers.roles.messages.Activation` reached the edge server: its bytes and samples, and its
        device's releases so far."""
        self.tally.up += msg.num_bytes
        self.tally.samples += int(msg.tensor.shape[0])
        self.releases[int(msg.device)] = max(self.releases.get(int(msg.device), 0), int(msg.step))


@dataclass
class AsyncLoopState:
    """Where the loop stands between global iterations: ``now`` (simulated s at the last aggregation), the
    ``active`` slots' devices in slot order, each active device's local ``steps`` so far and its ``clock`` (the
    simulated s at which it is ready to forward). When the edge server is next free is the engine's
    :class:`RoundTimeline`'s, written beside them in the checkpoint."""

    now: float
    active: list[int]
    steps: dict[int, int]
    clock: dict[int, float]

    @classmethod
    def start(cls, first: list[int]) -> "AsyncLoopState":
        return cls(0.0, list(first), {d: 0 for d in first}, {d: 0.0 for d in first})

    def to_dict(self, server_free: float) -> dict[str, Any]:
        """The checkpoint's ``async`` part, with the edge server's ``server_free``."""
        return {"now": self.now, "active": list(self.active), "steps": dict(self.steps), "clock": dict(self.clock),
                "server_free": server_free}

    @classmethod
    def from_dict(cls, state: Any, num_devices: int) -> "tuple[AsyncLoopState, float]":
        """The state a checkpoint holds and its ``server_free``; ValueError naming what does not fit
        ``num_devices`` devices: the active devices distinct devices of the run, a step count (an integer in
        [0, MAX_ROUNDS]) and a clock per active device, every time a finite number of simulated seconds ≥ 0."""
        keys = {"now", "active", "steps", "clock", "server_free"}
        if not isinstance(state, dict) or set(state) != keys:
            raise ValueError(f"engine async state must hold exactly {sorted(keys)}")
        active = state["active"]
        if not active or not is_device_list(active, num_devices):
            raise ValueError(f"engine async active must list distinct devices of 0..{num_devices - 1}")
        for name in ("steps", "clock"):
            if not isinstance(state[name], dict) or set(state[name]) != set(active):
                raise ValueError(f"engine async {name} must hold one value per active device")
        if not all(is_int(v) and 0 <= v <= MAX_ROUNDS for v in state["steps"].values()):
            raise ValueError(f"engine async steps must be integers in [0, {MAX_ROUNDS:,}]")
        times = [state["now"], state["server_free"], *state["clock"].values()]
        if not all(is_finite_number(t) and t >= 0 for t in times):
            raise ValueError("engine async now, server_free and clock must be finite simulated seconds ≥ 0")
        return (cls(float(state["now"]), list(active), {int(d): int(v) for d, v in state["steps"].items()},
                    {int(d): float(v) for d, v in state["clock"].items()}), float(state["server_free"]))
