"""SplitFed V1 and V2 (Thapa et al., AAAI 2022), written against the paper.

* **V1**: the edge server keeps one server-side model copy per device; all devices run in
  parallel, each copy steps with its own device's gradient; every I rounds (I = 1 in the paper)
  the fed server averages the client models and the server copies (FedAvg weighted by |𝒟_i|).
  With plain SGD and I = 1 this equals AdaptSFL with the same cuts.
* **V2**: one shared server model; client forwards run in parallel at w_c^{t−1}; the edge server
  processes the devices' activations **one at a time in simulated arrival order**
  (``server_mode = "arrival"``), stepping after each, and returns each device its gradient from
  the server model current at that moment; the client models are FedAvg'd every I rounds. (The
  published code instead shares one client model sequentially — the known error.)
"""

from __future__ import annotations

from typing import Hashable

from trainers.api import Aggregation, RoundContext, Strategy, every_interval


class SFLV1(Strategy):
    name = "sfl-v1"
    averages_clients = True

    def server_owner(self, device: int, block: int, deepest_cut: int) -> Hashable:
        return device

    def aggregation(self, ctx: RoundContext) -> Aggregation | None:
        return every_interval(ctx, range(ctx.num_blocks))   # client models and server copies


class SFLV2(Strategy):
    name = "sfl-v2"
    averages_clients = True
    server_mode = "arrival"

    def aggregation(self, ctx: RoundContext) -> Aggregation | None:
        return every_interval(ctx, range(ctx.deepest_cut))
