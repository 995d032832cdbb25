"""Parallel split learning (PSL, Jeon & Kim 2020; the ablation of docs/model.md §6.2): every device keeps
its own client model, which is **never averaged**; one shared server model.

Server update (documented choice): the shared server model takes one step per round with the
|𝒟_i|-weighted average of the devices' gradients (eq. 4's rule; the plain 1/N average for equal
local datasets), all devices at w_s^{t−1} (:func:`trainers.api.parallel_step`). Each device gets
∂F_i/∂a_i of its own mean loss.

Evaluation: there is no global client model, so the reported accuracy is the **mean over
devices** of the accuracy of [w_{c,i}; w_s] (each device's client model with the shared server).
"""

from __future__ import annotations

from torch import nn

from trainers.api import ModelViews, Strategy


class PSL(Strategy):
    name = "psl"
    averages_clients = False

    def eval_models(self, view: ModelViews) -> list[nn.Module]:
        return [view.device_model(d) for d in range(view.num_devices)]
