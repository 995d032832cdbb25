"""CycleSL: server-client cyclical updates on resampled smashed data (Wang, Bozkir & Kasneci),
written against docs/algorithms.md CycleSL (Part A).

Each round ⌈ρN⌉ devices (``--participation``) forward one mini-batch and upload (F_i, Y_i); the
edge server, once all have arrived (a barrier, A.8):

1. pools the detached features D_S^f = ⊎_i {(F_ij, Y_ij, w_i = |𝒟_i|)} (CSL-2);
2. trains the shared server model **first**: E passes over D_S^f in a fresh random order, in
   chunks of b_S = b, one optimizer step per chunk on L_S = Σ_β w_j·CE_j / Σ_β w_j (CSL-3, CSL-4;
   ``server_phase="steps"``: E single resampled mini-batches, Algorithm 1 read literally;
   ``sample_weight="uniform"``: plain mean CE);
3. freezes it and answers each device with G_i = ∂/∂F_i of its own mean CE at θ_S^{t+1} (CSL-5);
4. the devices back-propagate G_i through the graph of their single forward — no re-forward
   (CSL-6; the runtime's devices keep that graph until the reply).

``cycle_base`` picks what the client side does: ``psl`` (CyclePSL: client models never averaged),
``sfl`` (CycleSFL: every I rounds the participants' client models are FedAvg'd by |𝒟_i| and
loaded into **all** N devices, CSL-7) or ``sglr`` (CycleSGLR: a random half of the participants
receives one averaged gradient row, CSL-8; client models never averaged). The paper uses Adam on both sides (``--optimizer adam``).
All devices share one cut (the pooled features must have one shape). Evaluation: PSL base — mean
over devices of [w_{c,i}; θ_S]; SFL base — the global model of the last aggregation.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from trainers.api import (
    Activation,
    Aggregation,
    CutGradient,
    InputError,
    ModelViews,
    RoundContext,
    ServerPasses,
    Strategy,
    answer,
    common_gradient_rows,
    every_interval,
    mean_ce,
)


class CycleSL(Strategy):
    name = "cyclesl"
    server_step = "own"              # its own serve (the module docstring's server step)
    min_participants = 2    # spec A.4.4: with one client the pool is its own batch and CycleSL degenerates

    def __init__(self, participation: float = 0.05, cycle_base: str = "psl", server_epochs: int = 1,
                 server_phase: str = "epochs", sample_weight: str = "data_size") -> None:
        super().__init__(participation)
        self.base, self.epochs, self.phase, self.sample_weight = cycle_base, server_epochs, server_phase, sample_weight
        self.averages_clients = cycle_base == "sfl"           # CyclePSL and CycleSGLR never average

    def validate(self, ctx) -> None:
        if len(set(ctx.cuts)) > 1:
            raise InputError(f"CycleSL pools the devices' features: it needs one cut for all devices, got "
                             f"{sorted(set(ctx.cuts))}", field="cuts")

    def server_batches(self, ctx, n: int) -> list[torch.Tensor]:
        """Index chunks of the pooled features for the server phase (CSL-4), drawn from the run's generator."""
        b = ctx.batch_size
        if self.phase == "steps":
            return [torch.from_numpy(ctx.rng.choice(n, size=min(b, n), replace=False)) for _ in range(self.epochs)]
        chunks = []
        for _ in range(self.epochs):
            order = torch.from_numpy(ctx.rng.permutation(n))
            chunks += list(order.split(b))
        return chunks

    def serve(self, edge: ServerPasses, ctx: RoundContext, arrivals: Sequence[Activation]) -> list[CutGradient]:
        devices = [a.device for a in arrivals]
        features = torch.cat([a.tensor for a in arrivals]).detach()                          # CSL-2
        labels = torch.cat([a.labels for a in arrivals])
        sizes = [float(ctx.data_sizes[d]) if self.sample_weight == "data_size" else 1.0 for d in devices]
        weights = torch.cat([torch.full((a.batch_size,), w, device=features.device) for a, w in zip(arrivals, sizes)])
        owners = edge.owners(devices)
        steps = samples = 0
        for idx in self.server_batches(ctx, features.shape[0]):                               # CSL-4
            idx = idx.to(features.device)
            per_sample = nn.functional.cross_entropy(edge.run_features(features[idx], devices[0]), labels[idx],
                                                     reduction="none")
            loss = (weights[idx] * per_sample).sum() / weights[idx].sum()                      # CSL-3
            loss.backward()
            edge.step(owners)
            steps += 1
            samples += int(idx.numel())
        ctx.metrics["server_steps"] = float(steps)
        # spec A.8: T_srv = [E·n_S·(ρ_s + ϖ_s) + n_S·(ρ_s + ϖ_s^in)]/f_s; the runtime charges the gradient pass
        # (one forward+backward per arrival, ϖ_s^in ≤ ϖ_s), the server phase's E·n_S samples are charged here
        ctx.charge_server(devices[0], samples=samples)

        def own_loss(device: int, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            loss = mean_ce(logits, labels)           # L_i at θ_S^{t+1}, the device's reported training loss
            ctx.record_loss(device, loss)
            return loss

        grads = edge.cut_gradients(arrivals, own_loss)                                         # CSL-5, θ_S^{t+1} frozen
        if self.base == "sglr":
            grads = common_gradient_rows(ctx, arrivals, grads)                                 # CSL-8
        return [answer(a, grads[a.device]) for a in arrivals]

    def aggregation(self, ctx: RoundContext) -> Aggregation | None:
        if self.base == "sfl":
            return every_interval(ctx, range(ctx.deepest_cut), recipients="all")             # CSL-7
        return None

    def eval_models(self, view: ModelViews) -> list[nn.Module]:
        if self.base == "sfl":
            return [view.global_model()]
        return [view.device_model(d) for d in view.present()]     # CyclePSL, CycleSGLR (absent devices left out)

