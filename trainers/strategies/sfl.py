"""SplitFed V1 and V2 (Thapa et al., AAAI 2022), written against the paper.

* **V1**: the edge server keeps one server-side model copy per device; all devices run in
  parallel, each copy steps with its own device's gradient; every I rounds (I = 1 in the paper)
  the fed server averages the client models and the edge server averages the server copies
  (FedAvg, equal weights). With plain SGD and I = 1 this equals AdaptSFL with the same cuts.
* **V2**: one shared server model; client forwards run in parallel at w_c^{t−1}, the server then
  processes the devices' activations **sequentially** (in arrival order), stepping after each
  device, and returns each device its gradient from the server model current at that moment; the
  client models are FedAvg'd every I rounds. (The published code instead shares one client model
  sequentially — the known error.)
"""

from __future__ import annotations

from typing import Hashable

from trainers.strategies.base import Strategy


class SFLV1(Strategy):
    name = "sfl-v1"

    def server_owner(self, device: int, block: int, deepest_cut: int) -> Hashable:
        return device

    def aggregate(self, engine, round_index: int) -> bool:
        if not self.aggregation_due(engine):
            return False
        engine.average_blocks(range(engine.num_blocks))
        return True


class SFLV2(Strategy):
    name = "sfl-v2"

    def server_step(self, engine, round_index, msgs):
        return engine.server_step_sequential(msgs)

    def aggregate(self, engine, round_index: int) -> bool:
        if not self.aggregation_due(engine):
            return False
        engine.average_blocks(range(engine.deepest_cut))
        return True
