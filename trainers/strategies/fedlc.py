"""FedLC (Zhang, Li, Li et al., "Federated learning with label distribution skew via logits calibration", ICML
2022), SCALA's FL baseline: FedAvg whose devices train on calibrated logits, written against docs/algorithms.md
"FedLC".

As FedAvg (trainers/strategies/fedavg.py: no split, I local steps, |𝒟_k|-weighted average), with device k's
loss the calibrated cross-entropy of its logits s: F_k = mean over its batch of −log softmax(s − τ·n_k^(−1/4))_y,
n_k its samples per class (shared once, as SCALA's and GAS's label counts; a class it lacks counted as 10⁻⁸,
FL-bench's FedLC client, so that class is pushed down by 100·τ). τ = ``--lc-tau``. Test accuracy uses the raw
logits of the global model.
"""

from __future__ import annotations

import torch

from trainers.api import (
    Aggregation,
    DeviceLoss,
    RoundContext,
    Strategy,
    calibrated_ce,
    every_interval,
)


class FedLC(Strategy):
    name = "fedlc"
    averages_clients = True

    def __init__(self, participation: float = 0.1, lc_tau: float = 1.0) -> None:
        super().__init__(participation)
        self.tau = float(lc_tau)

    def device_loss(self, ctx: RoundContext) -> DeviceLoss:
        def calibrated(device: int, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return calibrated_ce(logits, labels, ctx.label_counts[device], self.tau)
        return calibrated

    def aggregation(self, ctx: RoundContext) -> Aggregation | None:
        return every_interval(ctx, range(ctx.num_blocks))
