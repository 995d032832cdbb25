"""AdaptSFL (docs/model.md §2.1, eqs. 2–9; Algorithm 1 §5.4).

Layout: w_{c,i} = blocks 1..ℓ_i on device i; w_{n,i} = blocks ℓ_i+1..L_c, one copy per device on
the edge server (non-common part); w_s = blocks L_c+1..L, shared (common part), L_c = max_i ℓ_i.

Each round all devices run in parallel at w^{t−1}: eq. (3) server forward; eq. (4) w_s steps once
with the device-averaged gradient (weights |𝒟_i|/Σ|𝒟|, i.e. 1/N for the paper's equal datasets);
eq. (5) each w_{n,i} steps with its own g_{n,i}; eq. (6) each device steps w_{c,i} with its cut
gradient. Eq. (7): when t mod I = 0 the forged models w_{f,i} = [w_{c,i}; w_{n,i}] (blocks 1..L_c)
are uploaded by the devices and the edge server, averaged by the fed server and sent back. Cuts may
be heterogeneous; re-planning (Algorithm 1) re-partitions at aggregation rounds (trainers.run.driver).
"""

from __future__ import annotations

from typing import Hashable

from trainers.api import Aggregation, RoundContext, Strategy, every_interval


class AdaptSFL(Strategy):
    name = "adaptsfl"
    averages_clients = True

    def server_owner(self, device: int, block: int, deepest_cut: int) -> Hashable:
        return device if block < deepest_cut else None      # w_{n,i} per device, w_s shared

    def aggregation(self, ctx: RoundContext) -> Aggregation | None:
        return every_interval(ctx, range(ctx.deepest_cut))  # eq. (7) over w_{f,i}
