"""Parallel split learning (PSL, Jeon & Kim 2020; the ablation of spec §6.2): every device keeps
its own client model, which is **never averaged**; one shared server model.

Server update (documented choice): the shared server model takes one step per round with the
device-averaged gradient (1/N)Σ_i g_{s,i} — the same rule as AdaptSFL's eq. (4) — computed at
w_s^{t−1} for all devices in parallel. Each device gets ∂F_i/∂a_i of its own mean loss.

Evaluation: there is no global client model, so the reported accuracy is the **mean over
devices** of the accuracy of [w_{c,i}; w_s] (each device's client model with the shared server).
"""

from __future__ import annotations

from trainers.strategies.base import Strategy


class PSL(Strategy):
    name = "psl"

    def eval_models(self, engine):
        return [engine.device_model(d) for d in range(engine.num_devices)]

    def round_seconds(self, breakdown, aggregated: bool) -> float:
        return breakdown.t_split
