"""FedProx (Li, Sahu, Zaheer et al., "Federated optimization in heterogeneous networks", MLSys 2020), SCALA's FL
baseline: FedAvg whose devices minimise F_k(w) + μ/2·‖w − w^t‖², written against docs/algorithms.md "FedProx".

As FedAvg (trainers/strategies/fedavg.py: no split, I local steps of the ⌈ρN⌉ devices drawn per global round,
the |𝒟_k|-weighted average), with each local step's gradient ∇F_k(w_k) + μ(w_k − w^t): w^t is the global model
the device downloaded at the start of the round (or the initial one), kept by its optimizer as its proximal
anchor and checkpointed with it. μ = ``--prox-mu``. Evaluation: the global model.
"""

from __future__ import annotations

import dataclasses

from trainers.api import Aggregation, OptimizerSpec, RoundContext, Strategy, every_interval


class FedProx(Strategy):
    name = "fedprox"
    averages_clients = True

    def __init__(self, participation: float = 0.1, prox_mu: float = 1.0) -> None:
        super().__init__(participation)
        self.mu = float(prox_mu)

    def optimizer(self, role: str, spec: OptimizerSpec) -> OptimizerSpec:
        return dataclasses.replace(spec, proximal_mu=self.mu) if role == "client" else spec

    def aggregation(self, ctx: RoundContext) -> Aggregation | None:
        return every_interval(ctx, range(ctx.num_blocks))
