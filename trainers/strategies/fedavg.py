"""FedAvg (McMahan et al., AISTATS 2017), the reference every SFL paper shows: federated learning with no split,
written against docs/algorithms.md "FedAvg".

Every device holds the whole model (all L blocks: the registry's ``whole_model``, so the run's cut is L for every
device). A global round is I local steps (``--interval``) of the ⌈ρN⌉ devices drawn at its start
(``--participation`` ρ; the runtime keeps one draw per aggregation period): each step w_k ← w_k − η∇F_k(w_k; ξ_k)
on a mini-batch of b samples; then the fed server averages the participants' models by |𝒟_k|,
w^{t+1} = Σ_k |𝒟_k| w_k / Σ_k |𝒟_k|, which they download (FedAvg's aggregation, eq. 7 over every block).

How it runs here: the loss is computed by the edge server role on the logits and labels the device sends
(b·M numbers and b labels a step, its gradient ∂F_k/∂s back: the engine's one exchange), which gives the
device's update of local training bit for bit (the server holds no blocks). docs/algorithms.md states what this
costs on the clock and what it reveals (the labels), against FedAvg's protocol, where nothing leaves the device
between averages.
"""

from __future__ import annotations

from trainers.api import Aggregation, RoundContext, Strategy, every_interval


class FedAvg(Strategy):
    name = "fedavg"
    averages_clients = True

    def __init__(self, participation: float = 0.1) -> None:      # SCALA's ρ for its FL baselines
        super().__init__(participation)

    def aggregation(self, ctx: RoundContext) -> Aggregation | None:
        return every_interval(ctx, range(ctx.num_blocks))       # the whole model, |𝒟_k|-weighted, every I steps
