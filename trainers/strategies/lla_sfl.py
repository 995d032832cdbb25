"""LLA-SFL, SCALA's ablation "SFL with only Local Logit Adjustments" (Yang & Liu, SCALA §5.2, Fig. 4 and Table
II), written against docs/algorithms.md "LLA-SFL".

SplitFed V1 (a server copy per device, client and server copies |𝒟_k|-averaged every I rounds, ⌈ρN⌉ devices
per global iteration) whose device k trains on the logit-adjusted cross-entropy with its own label distribution,
SCALA's eq. (13): F_k = mean CE(z_k + τ·log(P_k + ε), y), ε = 10⁻¹²: its server copy steps and its cut gradient
come from that one loss. Without SCALA's concatenation the adjustment sees only the device's own labels — which is
what the ablation isolates. Test accuracy uses raw logits of the global model.
"""

from __future__ import annotations

from typing import Hashable

import torch

from trainers.api import (
    Aggregation,
    DeviceLoss,
    RoundContext,
    Strategy,
    every_interval,
    label_prior,
    logit_adjusted_ce,
)


class LLASFL(Strategy):
    name = "lla-sfl"
    averages_clients = True

    def __init__(self, participation: float = 0.1, la_tau: float = 1.0) -> None:
        super().__init__(participation)
        self.tau = float(la_tau)

    def server_owner(self, device: int, block: int, deepest_cut: int) -> Hashable:
        return device                                             # SplitFed V1: a server copy per device

    def device_loss(self, ctx: RoundContext) -> DeviceLoss:
        def adjusted(device: int, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return logit_adjusted_ce(logits, labels, label_prior(ctx.label_counts[device]), self.tau)  # eq. (13)
        return adjusted

    def aggregation(self, ctx: RoundContext) -> Aggregation | None:
        return every_interval(ctx, range(ctx.num_blocks))         # client models and server copies
