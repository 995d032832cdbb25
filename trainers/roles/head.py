"""A U-shaped split's device side (issue 71 item 2; docs/privacy.md "A U-shaped split"): the model's last K blocks
(the head) and the labels stay on the device, so no label leaves it.

The device's :class:`~trainers.roles.core.Device` role is unchanged: it still runs blocks 0..ℓ_i−1 (eq. 2) and
steps with its cut gradient (eq. 6). Its host (:class:`trainers.roles.hosts.DeviceHost`) keeps beside it a
:class:`Head`: the labels of the pending activation are kept here and the activation leaves without them; the
edge server runs its blocks ℓ_i..k−1 (k = L − K) and sends their output h_k (:class:`HeadForward`); the head
answers F_i = CE(head(h_k), y), the mean cross-entropy over the mini-batch, and ∂F_i/∂h_k (:class:`HeadGradient`),
from which the edge server back-propagates through its blocks exactly as from its own loss (the chain rule,
:meth:`trainers.roles.passes.ServerPass.loss`). When the cut gradient comes the head steps with ∂F_i/∂w_head of
the same forward, with the optimizer settings its layers have on the edge server (the server's rate: moving
layers to the device changes where they run, not how they train). The head is part of the device's model
(uploaded, averaged, handed on and checkpointed with its client blocks, block indices k..L−1). Under noise on the
head's gradient (``--head-clip``, ``--head-noise``) the gradient it sends is each sample's clipped and noised
(:meth:`trainers.roles.defences.ActivationDefence.released_gradient`); its own step keeps the exact one.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Iterable

import torch
from torch import nn

from trainers.roles.core import block_state, check_block_state, load_block, load_noise_state, own_state, shared_copy
from trainers.roles.defences import ActivationDefence
from trainers.roles.messages import (
    Activation,
    BlockState,
    CutGradient,
    HeadForward,
    HeadGradient,
    MessageMismatchError,
    ModelDownload,
    check_finite,
)
from trainers.roles.optim import OptimizerSpec, RoleOptimizer


class Head:
    """Device ``index``'s head: the last ``size`` K blocks of ``template``, k..L−1 with k = L − K (module docstring),
    trained with ``optimizer`` (the server's settings); ``defence``'s clip and noise on its gradient, the noise drawn
    from the stream of the device's sampler ``seed``."""

    def __init__(self, index: int, template: nn.Sequential, size: int, optimizer: OptimizerSpec,
                 defence: ActivationDefence | None = None, seed: Any = None) -> None:
        if not 1 <= size < len(template):
            raise ValueError(f"a head holds 1..{len(template) - 1} blocks, got {size}")
        self.index, self.template, self.start = index, template, len(template) - size
        self.optimizer_spec = optimizer
        self.blocks = nn.ModuleList(shared_copy(template[j]) for j in self.indices)
        self.optimizer = RoleOptimizer(optimizer, self.blocks.parameters())
        self.shared: set[int] = set(range(len(self.blocks)))      # positions still sharing the template's tensors
        self.pending: tuple[int, int, torch.Tensor] | None = None  # (round, step, labels) of the unanswered step
        self.grads: list[torch.Tensor] | None = None               # ∂F_i/∂w_head of that step's forward
        self.seconds = (0.0, 0.0)                                  # the last reply's forward and backward (s, measured)
        self.defence = defence if defence is not None else ActivationDefence(head=size)
        self.noise_rng = self.defence.head_generator(seed, next(template.parameters(), torch.empty(0)).device)

    @property
    def indices(self) -> range:
        """The head's block indices k..L−1."""
        return range(self.start, len(self.template))

    # ---- the exchange -------------------------------------------------------------------------------
    def keep(self, msg: Activation) -> Activation:
        """``msg`` as it leaves the device: its labels kept here (for its step), none sent."""
        self.pending, self.grads = (msg.round, msg.step, msg.labels), None
        return dataclasses.replace(msg, labels=msg.labels.new_empty(0))

    def reply(self, msg: HeadForward) -> HeadGradient:
        """F_i and ∂F_i/∂h_k of the features ``msg`` carries for the pending step; ∂F_i/∂w_head kept for its step
        (a second request for the step, at the same weights, replaces it)."""
        pending = self.pending
        if msg.device != self.index or pending is None or (msg.round, msg.step) != pending[:2]:
            expected = "nothing" if pending is None else f"round {pending[0]}, step {pending[1]}"
            raise MessageMismatchError(f"features for (device {msg.device}, round {msg.round}, step {msg.step}) "
                                       f"delivered to device {self.index}'s head, which expects {expected}")
        labels = pending[2]
        if msg.tensor.dim() == 0 or msg.tensor.shape[0] != labels.shape[0]:
            raise MessageMismatchError(f"features of {tuple(msg.tensor.shape)} for a step of {labels.shape[0]} samples "
                                       f"(device {self.index}, round {msg.round})")
        check_finite(msg.tensor, "features message", msg.round, self.index)
        for j in sorted(self.shared):          # this step changes them: the head's own copy
            own_state(self.blocks[j])
        self.shared.clear()
        start = time.perf_counter()
        h = msg.tensor.detach().requires_grad_(True)
        z = h
        for block in self.blocks:
            z = block(z)
        loss = nn.functional.cross_entropy(z, labels)
        forward = time.perf_counter()
        params = list(self.blocks.parameters())
        grads = torch.autograd.grad(loss, [h, *params], allow_unused=True)
        sent = self._released(grads[0] if grads[0] is not None else torch.zeros_like(h))
        self.seconds = (forward - start, time.perf_counter() - forward)
        self.grads = [g if g is not None else torch.zeros_like(p) for g, p in zip(grads[1:], params)]
        return HeadGradient(self.index, msg.round, msg.step, loss.detach(), sent)

    def _released(self, grad: torch.Tensor) -> torch.Tensor:
        """∂F_i/∂h_k as it leaves the device: b per-sample rows b·∂F_i/∂h_k released by the defence, over b."""
        if self.defence.head_clip <= 0:
            return grad
        b = grad.shape[0]
        return self.defence.released_gradient(grad * b, self.noise_rng) / b

    def finish(self, msg: CutGradient) -> None:
        """The step's reply came: the head steps with ∂F_i/∂w_head, or drops it with the step (``msg.tensor`` None)."""
        pending, grads = self.pending, self.grads
        self.pending, self.grads = None, None
        if pending is None or (msg.round, msg.step) != pending[:2] or msg.tensor is None:
            return          # the device itself refuses a reply that answers no activation of its (Device.backward)
        if grads is None:
            raise MessageMismatchError(f"device {self.index} got its cut gradient for round {msg.round}, step "
                                       f"{msg.step} before its head was asked for the loss")
        for p, g in zip(self.blocks.parameters(), grads):
            p.grad = g
        self.optimizer.step()

    # ---- model messages -----------------------------------------------------------------------------
    def upload(self, blocks: Iterable[int], with_optimizer: bool = False) -> dict[int, BlockState]:
        """The head's blocks among ``blocks`` (block index → state, with the optimizer's when asked)."""
        opt = self.optimizer if with_optimizer else None
        return {j: block_state(self.blocks[j - self.start], opt) for j in blocks if j in self.indices}

    def download(self, msg: ModelDownload) -> ModelDownload:
        """Load the head's blocks of ``msg``; the message with the others (the client blocks')."""
        for j, bs in msg.blocks.items():
            if j in self.indices:
                load_block(self.blocks[j - self.start], bs, self.optimizer, msg.fresh_optimizer, self.shared, j - self.start)
        return dataclasses.replace(msg, blocks={j: b for j, b in msg.blocks.items() if j not in self.indices})

    def finite_items(self) -> list[tuple[Any, str, int]]:
        """(parameter, what, device) of every head parameter, for the round's NaN/inf check."""
        return [(p, f"head block {j + 1}", self.index) for j, block in zip(self.indices, self.blocks)
                for p in block.parameters()]

    # ---- checkpoint ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state = {"blocks": [b.state_dict() for b in self.blocks], "optimizer": self.optimizer.state_dict()}
        return state if self.noise_rng is None else {**state, "noise_rng": self.noise_rng.get_state()}

    def load_state_dict(self, state: Any) -> None:
        if not isinstance(state, dict) or not isinstance(state.get("blocks"), list) \
                or len(state["blocks"]) != len(self.blocks):
            raise ValueError(f"device {self.index}'s head must be the states of its {len(self.blocks)} blocks")
        for j, (block, sd) in zip(self.indices, zip(self.blocks, state["blocks"])):
            check_block_state(block, sd, f"device {self.index}'s head block {j}")
            own_state(block)
            block.load_state_dict(sd)
        self.optimizer = RoleOptimizer(self.optimizer_spec, self.blocks.parameters())
        self.optimizer.load_state_dict(state["optimizer"])
        load_noise_state(self.noise_rng, state, f"device {self.index}'s head")
        self.shared, self.pending, self.grads = set(), None, None
