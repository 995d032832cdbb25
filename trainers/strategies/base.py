"""The strategy interface: an algorithm decides at each hook, the engine
(:class:`trainers.engine.SplitEngine`) does the work. Flower-style.

Hooks, in the order one round calls them (``SplitEngine.run_round``):

Layout (at construction and at every re-partition)
    ``client_owner(device)`` / ``server_owner(device, block, deepest_cut)`` — which instance holds a
    block: a device index (a per-device copy) or ``None`` (one instance shared by all devices).
    ``validate(engine)`` — reject unsupported cuts/devices with InputError. ``setup(engine)``.
Per round
    ``select(engine, t) -> participants``; ``schedule(engine, t, participants) -> groups`` (devices
    within a group run in parallel; groups run one after the other).
Per batch (for each group)
    ``client_forward(engine, device, t) -> ActivationMsg`` (eq. 2);
    ``order_arrivals(engine, t, msgs) -> msgs`` — arrival order / buffering (asynchronous
    strategies may reorder, hold back or release buffered messages; an event-driven driver will
    call the same hooks);
    ``server_step(engine, t, msgs) -> [GradientMsg]`` — receives ALL messages of the group, so a
    strategy may process them per device, concatenate them (SCALA), pick which devices' gradients
    update the server (GAPSL) or train the server first and answer from the updated model (CycleSL);
    ``client_step(engine, device, grad_msg)`` (eq. 6).
Per round, after the batches
    ``aggregate(engine, t) -> bool`` (client-side MA, eq. 7); ``eval_models(engine) -> [models]``
    (reported accuracy is their mean); ``round_seconds(breakdown, aggregated) -> seconds`` for the
    simulated clock, composed from adaptplan's latency terms (never re-implemented).
Checkpoint
    ``state_dict()`` / ``load_state_dict(state)`` for strategy-owned state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Hashable, Sequence

from torch import nn

from adaptplan.latency import LatencyBreakdown
from trainers.transport import ActivationMsg, GradientMsg

if TYPE_CHECKING:  # pragma: no cover
    from trainers.engine import SplitEngine


class Strategy:
    """Default behaviour: all devices every round, in parallel, per-device client models, one
    shared server model updated with the device-averaged gradient, no aggregation, evaluation of
    the averaged model, clock charge T_split (+ T_agg when aggregated) of spec §2.4."""

    name = "base"

    # layout
    def client_owner(self, device: int) -> Hashable:
        return device

    def server_owner(self, device: int, block: int, deepest_cut: int) -> Hashable:
        return None

    def validate(self, engine: "SplitEngine") -> None:
        """Raise InputError if the engine's cuts/devices do not suit the algorithm."""

    def setup(self, engine: "SplitEngine") -> None:
        """Called once after the engine built its models and optimizers."""

    # per round
    def select(self, engine: "SplitEngine", round_index: int) -> list[int]:
        return list(range(engine.num_devices))

    def schedule(self, engine: "SplitEngine", round_index: int, participants: Sequence[int]) -> list[list[int]]:
        return [list(participants)]

    # per batch
    def client_forward(self, engine: "SplitEngine", device: int, round_index: int) -> ActivationMsg:
        return engine.client_forward(device, round_index)

    def order_arrivals(self, engine: "SplitEngine", round_index: int, msgs: list[ActivationMsg]) -> list[ActivationMsg]:
        return msgs

    def server_step(self, engine: "SplitEngine", round_index: int, msgs: list[ActivationMsg]) -> list[GradientMsg]:
        return engine.server_step_parallel(msgs)

    def client_step(self, engine: "SplitEngine", device: int, msg: GradientMsg) -> None:
        engine.client_backward(device, msg)

    # after the batches
    def aggregation_due(self, engine: "SplitEngine") -> bool:
        """True when I rounds have passed since the last aggregation (``t mod I = 0`` for a fixed I)."""
        return engine.rounds_since_aggregation >= engine.interval

    def aggregate(self, engine: "SplitEngine", round_index: int) -> bool:
        return False

    def eval_models(self, engine: "SplitEngine") -> list[nn.Module]:
        return [engine.averaged_model()]

    def round_seconds(self, breakdown: LatencyBreakdown, aggregated: bool) -> float:
        """Eq. (26) per round: T_split + T_agg at aggregation rounds (seconds)."""
        return breakdown.t_split + (breakdown.t_agg if aggregated else 0.0)

    # checkpoint
    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
