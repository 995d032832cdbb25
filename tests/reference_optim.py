"""A hand-written SGD for the reference implementations of the tests: momentum, weight decay and
gradient-norm clipping written out (torch.optim.SGD's update with dampening 0 and
torch.nn.utils.clip_grad_norm_'s rule), with per-model state that a caller may restart."""

from __future__ import annotations

import torch
from torch import nn


class HandSGD:
    """p ← p − lr·v with v ← m·v + (g + wd·p) (v = g + wd·p at the first step after a restart), the
    gradients g first scaled by min(1, clip / (‖g‖₂ + 1e-6)) over all of the model's parameters."""

    def __init__(self, lr: float, momentum: float = 0.0, weight_decay: float = 0.0, clip: float | None = None) -> None:
        self.lr, self.momentum, self.weight_decay, self.clip = lr, momentum, weight_decay, clip
        self.buffers: dict[int, dict[int, torch.Tensor]] = {}

    def restart(self, model: nn.Module) -> None:
        """Forget ``model``'s momentum (a device that loads the global model)."""
        self.buffers.pop(id(model), None)

    @torch.no_grad()
    def step(self, model: nn.Module) -> None:
        params = [p for p in model.parameters() if p.grad is not None]
        if not params:
            return
        if self.clip is not None:
            norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params))
            factor = min(1.0, self.clip / (float(norm) + 1e-6))
            for p in params:
                p.grad.mul_(factor)
        state = self.buffers.setdefault(id(model), {})
        for p in params:
            d = p.grad + self.weight_decay * p
            if self.momentum:
                v = state.get(id(p))
                v = d.clone() if v is None else self.momentum * v + d
                state[id(p)] = v
                d = v
            p -= self.lr * d
            p.grad = None
