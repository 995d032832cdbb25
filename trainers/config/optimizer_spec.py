"""What an optimizer is, without torch: :class:`OptimizerSpec` (name, step size, momentum, decay,
clipping) as the configuration, the strategies and the wire pass it; :mod:`trainers.roles.optim` builds
and steps the torch optimizer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from torch import nn

OPTIMIZERS = ("sgd", "adam")


@dataclass(frozen=True)
class OptimizerSpec:
    """``name`` in :data:`OPTIMIZERS`; ``lr`` step size; ``momentum`` (SGD) / betas default (Adam);
    ``weight_decay`` L2 coefficient; ``clip_norm`` maximum gradient 2-norm (None = no clipping);
    ``proximal_mu`` μ of FedProx's proximal term μ/2·‖w − w_anchor‖², w_anchor the weights the role last
    downloaded (or started from): its gradient μ(w − w_anchor) is added before the step (0 = none).
    ``restart_on_download``: whether a device that loads a global client model restarts this optimizer's state
    (momentum, Adam's moments) — True, False, or None for the algorithm's own choice (its strategy's
    ``reset_client_optimizer``; docs/algorithms.md "Optimizer state")."""

    name: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0
    clip_norm: float | None = None
    proximal_mu: float = 0.0
    restart_on_download: bool | None = None

    def build(self, params: Sequence["nn.Parameter"]) -> "torch.optim.Optimizer":
        """The torch optimizer over ``params`` (torch is imported here, not with the spec)."""
        import torch

        if self.name == "adam":
            return torch.optim.Adam(params, lr=self.lr, weight_decay=self.weight_decay)
        return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)
