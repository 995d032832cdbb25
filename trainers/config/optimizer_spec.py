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
    ``weight_decay`` L2 coefficient; ``clip_norm`` maximum gradient 2-norm (None = no clipping)."""

    name: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0
    clip_norm: float | None = None

    def build(self, params: Sequence["nn.Parameter"]) -> "torch.optim.Optimizer":
        """The torch optimizer over ``params`` (torch is imported here, not with the spec)."""
        import torch

        if self.name == "adam":
            return torch.optim.Adam(params, lr=self.lr, weight_decay=self.weight_decay)
        return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)
