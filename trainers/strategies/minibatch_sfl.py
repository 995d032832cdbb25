"""MiniBatch-SFL (Huang, Tian, Tang, arXiv:2308.11953), GAS's and SCALA's SFL baseline, as GAS's authors run it
(their ``baseline/Minibatch-SFL.py``, github.com/eejiarong/GAS), written against docs/algorithms.md "MiniBatch-SFL".

A global iteration is I rounds (``--interval``, the code's E = 20 local iterations) of ⌈ρN⌉ devices drawn at its
start (``--participation``, the code's 10 of 20) that download the global client model; device k's mini-batch is
B_k = max(⌊|𝒟_k|·b·|𝒞| / Σ_{𝒞}|𝒟_j|⌋, 1) (the code's ``fed_avg_freqs × BatchSizeSever``). In every round each
device's cut gradient is ∂/∂A_k of the mean cross-entropy of its own logits through the server at its pre-update
weights, and the server takes one step on the mean cross-entropy of the concatenated activations; at the end of the
global iteration the participants' client models are averaged by |𝒟_k|. That is SCALA's round with no logit
adjustment on either side (SCALA's ablation CA-SFL, ``scala --la-tau 0``): the same parameters, tested.
"""

from __future__ import annotations

from typing import Sequence

from trainers.api import (
    Activation,
    Aggregation,
    CutGradient,
    RoundContext,
    ServerPasses,
    Strategy,
    concatenated_step,
    every_interval,
    mean_ce,
    proportional_batch,
)


class MiniBatchSFL(Strategy):
    name = "minibatch-sfl"
    server_step = "own"              # the concatenated step below
    averages_clients = True
    min_participants = 2             # concatenating one device's activations is SplitFed
    reset_client_optimizer = True    # a global iteration's participants start from the global model, fresh state

    def __init__(self, participation: float = 0.5) -> None:      # the code's 10 of 20 devices
        super().__init__(participation)

    def batch_size(self, ctx: RoundContext, device: int) -> int:
        return proportional_batch(ctx, device)

    def serve(self, edge: ServerPasses, ctx: RoundContext, arrivals: Sequence[Activation]) -> list[CutGradient]:
        return concatenated_step(edge, ctx, arrivals, lambda d, z, y: mean_ce(z, y), mean_ce)

    def aggregation(self, ctx: RoundContext) -> Aggregation | None:
        return every_interval(ctx, range(ctx.deepest_cut), recipients="none")    # downloaded at the next start
