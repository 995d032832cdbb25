"""SGLR (Pal, Uniyal, Park et al. 2021, "Server-side local gradient averaging and learning rate acceleration for
scalable split learning"), CycleSL's baseline: parallel split learning whose server returns an **averaged**
cut-layer gradient instead of each device's own, written against docs/algorithms.md "SGLR".

Each round ⌈ρN⌉ devices (``--participation``, at least 2: averaging one device's gradient is PSL) forward one
mini-batch. The server steps as PSL (eqs. 3–5: every participant at the same w_s, the |𝒟_i|-weighted mean of
their server gradients) and takes each one's G_i = ∂F_i/∂a_i at the pre-update w_s. Then (CSL-8) a random
⌊φ·n_t⌋ of the participants (φ = ``--averaged-fraction``; the CycleSL authors' SGLR: half) receive, in every row,
the one averaged row ḡ = Σ_{i∈A_t} |𝒟_i| Σ_j G_i[j] / Σ_{i∈A_t} |𝒟_i|·b_i, the others their own G_i
(φ = 1: every participant gets ḡ, the broadcast of SGLR's abstract). Client models are never averaged.

SGLR's second idea, a learning rate per side, is ``--client-lr`` / ``--server-lr``. The defaults are CycleSL's
baseline setting: Adam with one rate for clients and server ("identical ... across different SL algorithms for a
fair comparison", CycleSL's set-up and Table 10) and 5 % attendance. Evaluation as PSL: the mean over the
devices present of [w_{c,i}; w_s].
"""

from __future__ import annotations

from typing import Sequence

from torch import nn

from trainers.api import (
    Activation,
    CutGradient,
    ModelViews,
    RoundContext,
    ServerPasses,
    Strategy,
    answer,
    common_gradient_rows,
    parallel_step,
)


class SGLR(Strategy):
    name = "sglr"
    server_step = "own"              # its own serve (the module docstring's server step)
    min_participants = 2             # averaging one device's cut gradient is PSL

    def __init__(self, participation: float = 0.05, averaged_fraction: float = 0.5) -> None:
        super().__init__(participation)
        self.averaged_fraction = float(averaged_fraction)

    def serve(self, edge: ServerPasses, ctx: RoundContext, arrivals: Sequence[Activation]) -> list[CutGradient]:
        replies = parallel_step(edge, ctx, arrivals)                                  # PSL: eqs. (3)–(5)
        grads = {r.device: r.tensor for r in replies if r.tensor is not None}
        grads = common_gradient_rows(ctx, arrivals, grads, self.averaged_fraction)    # CSL-8
        return [answer(a, grads[a.device]) for a in arrivals]

    def eval_models(self, view: ModelViews) -> list[nn.Module]:
        return [view.device_model(d) for d in view.present()]
