"""SCALA: split federated learning with concatenated activations and logit adjustments (Yang &
Liu, arXiv:2405.04875), written against docs/algorithms.md SCALA (Part B).

A global iteration is I rounds (``--interval``) with one participant set 𝒞^t of ⌈ρK⌉ devices
(``--participation`` ρ), drawn uniformly without replacement at its start [B.2 step 0] (the runtime keeps
one draw per aggregation period for every strategy that averages client models). Device k's
batch is B_k = max(⌊|𝒟_k|·B/Σ_{𝒞^t}|𝒟_j|⌋, 1) with B = b·|𝒞^t| (eq. 3). In every round:

* cut gradients from the **pre-update** server (eq. 6, eq. 13): G_k = ∂ℓ_k/∂A_k with
  ℓ_k = mean CE(z_k + τ·log(P_k + ε), y) on device k's own server logits, P_k its local label
  distribution (shared once), ε = 1e-12;
* one server step on the **concatenated** batch (eq. 5, eq. 12): ℓ_s = mean CE(z + τ·log(P_s + ε), Y)
  over concat(A) with P_s the label distribution of the concatenated labels (``server_prior =
  "batch"``) or of the participants' label counts (``"round"``).
Both come from one forward of the concatenated activations (the weights are the same). At the end
of the global iteration the participants' client models are FedAvg'd by |𝒟_k| (eq. 8) into the global
client model w_c^{t+1}, which only the next global iteration's participants download, at its start [B.2
step 2] (the runtime's ``start_from_global``; a device not drawn holds whatever it last trained). Test
accuracy uses raw logits (no adjustment), on the global model of the last aggregation. The server model is shared; per-role optimizers come
from the run (the authors' code: SGD 0.01, momentum 0.9, weight decay 5e-4, clip 10).
"""

from __future__ import annotations

from typing import Sequence, cast

import numpy as np
import torch

from trainers.api import (
    Activation,
    Aggregation,
    CutGradient,
    RoundContext,
    ServerPasses,
    Strategy,
    concatenated_step,
    every_interval,
    label_prior,
    logit_adjusted_ce,
    proportional_batch,
)


class SCALA(Strategy):
    name = "scala"
    server_step = "own"              # its own serve (the module docstring's server step)
    averages_clients = True
    min_participants = 2             # concatenating one device's activations is SplitFed (docs/algorithms.md)
    reset_client_optimizer = True    # a global iteration's participants start from the global model, fresh state

    legacy_period_key = "current"    # checkpoints before the runtime kept the period held its participants here

    def __init__(self, participation: float = 0.1, la_tau: float = 1.0, server_prior: str = "batch") -> None:
        super().__init__(participation)
        self.tau, self.server_prior = float(la_tau), server_prior

    def batch_size(self, ctx: RoundContext, device: int) -> int:
        """Eq. (3): B_k = |𝒟_k|·B / Σ_{𝒞^t}|𝒟_j| with B = b·|𝒞^t| (at least 1)."""
        return proportional_batch(ctx, device)

    def serve(self, edge: ServerPasses, ctx: RoundContext, arrivals: Sequence[Activation]) -> list[CutGradient]:
        """One forward of the concatenated activations at the pre-update w_s gives both losses: each device's cut
        gradient from its own logit-adjusted loss (eqs. 6, 13) and the server's gradient from the LA-CE of the
        concatenated batch (eqs. 5, 12); then one server step."""
        labels = torch.cat([a.labels for a in arrivals])
        if self.server_prior == "batch":
            prior = label_prior(torch.bincount(labels, minlength=ctx.num_classes))
        else:
            prior = label_prior(cast(np.ndarray, sum(ctx.label_counts[a.device] for a in arrivals)))
        return concatenated_step(
            edge, ctx, arrivals,
            lambda d, z, y: logit_adjusted_ce(z, y, label_prior(ctx.label_counts[d]), self.tau),   # eq. (13)
            lambda z, y: logit_adjusted_ce(z, y, prior, self.tau))                                 # eq. (12)

    def aggregation(self, ctx: RoundContext) -> Aggregation | None:
        return every_interval(ctx, range(ctx.deepest_cut), recipients="none")    # eq. (8); downloaded at B.2 step 2
