"""SplitFed V1 and V2 (Thapa et al., AAAI 2022), written against the paper.

* **V1**: the edge server keeps one server-side model copy per device; all devices run in
  parallel, each copy steps with its own device's gradient; every I rounds (I = 1 in the paper)
  the fed server averages the client models and the server copies (FedAvg weighted by |𝒟_i|).
  With plain SGD and I = 1 this equals AdaptSFL with the same cuts. ``server_copies = "slot"`` keeps
  one copy per *slot* of the round instead, as the CycleSL authors' SplitFed V1 does: C = ⌈ρN⌉ copies,
  the k-th participant of an aggregation period trains on copy k (its optimizer state stepped every
  period, whoever fills the slot), every copy receiving the average. Per device, a copy trains and is
  averaged only when its device is drawn (about every 1/ρ periods), and keeps its weights and optimizer
  state from then (docs/algorithms.md "SplitFed V1's server copies").
* **V2**: one shared server model; client forwards run in parallel at w_c^{t−1}; the edge server
  processes the devices' activations **one at a time in simulated arrival order**
  (``server_mode = "arrival"``), stepping after each, and returns each device its gradient from
  the server model current at that moment; the client models are FedAvg'd every I rounds. (The
  published code instead shares one client model sequentially — the known error.)
"""

from __future__ import annotations

from typing import Any, Hashable

from trainers.api import Aggregation, RoundContext, Strategy, every_interval, sample_count


class SFLV1(Strategy):
    name = "sfl-v1"
    averages_clients = True
    optional_state = frozenset({"slots"})

    def __init__(self, participation: float = 1.0, server_copies: str = "device") -> None:
        super().__init__(participation)
        self.server_copies = server_copies
        self.num_slots = 0
        self.slots: dict[int, int] = {}          # device → its slot in the current aggregation period

    def validate(self, ctx: RoundContext) -> None:
        self.num_slots = sample_count(ctx, self.participation, self.min_participants)

    def server_owner(self, device: int, block: int, deepest_cut: int) -> Hashable:
        """Device ``device``'s own copy, or its slot's (a device outside the period: slot device mod C, a copy
        it never trains on)."""
        if self.server_copies == "device":
            return device
        return self.slots.get(device, device % self.num_slots)

    def participants(self, ctx: RoundContext) -> list[int]:
        drawn = super().participants(ctx)
        self.slots = {d: k for k, d in enumerate(drawn)}
        return drawn

    def state_dict(self) -> dict[str, Any]:
        return {"slots": dict(self.slots)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.slots = {int(d): int(k) for d, k in state.get("slots", {}).items()}

    def check_state(self, ctx: RoundContext) -> None:
        """The slots restored: distinct slots 0..C−1 of devices of the run (ValueError otherwise)."""
        if any(not 0 <= d < ctx.num_devices for d in self.slots) or \
                sorted(self.slots.values()) != list(range(len(self.slots))) or len(self.slots) > max(self.num_slots, 1):
            raise ValueError(f"SplitFed V1's slots must give distinct devices of the run the slots 0..{self.num_slots - 1}")

    def aggregation(self, ctx: RoundContext) -> Aggregation | None:
        return every_interval(ctx, range(ctx.num_blocks))   # client models and server copies


class SFLV2(Strategy):
    name = "sfl-v2"
    averages_clients = True
    server_mode = "arrival"

    def aggregation(self, ctx: RoundContext) -> Aggregation | None:
        return every_interval(ctx, range(ctx.deepest_cut))
