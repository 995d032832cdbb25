"""Batched client computation (docs/engine.md "Batched client passes").

Devices that hold the same client blocks (the same cut) run them with different weights, so their
mini-batches cannot simply be concatenated. :class:`ClientBatcher` runs them as ONE call instead:
the devices' parameters are stacked along a new leading dimension and the blocks are applied with
``torch.func.vmap`` over ``torch.func.functional_call`` (a convolution with per-device weights
becomes one grouped convolution, a linear layer one batched matrix product). The backward is one
call too: the cut gradients of all devices of the batch are stacked and back-propagated once, and
each device's slice of the stacked parameter gradients becomes that device's ``.grad``.

Every device keeps its own state as before: its blocks stay the storage of its parameters (the
stack is a copy made at each forward, one copy of the client parameters per round), its own
optimizer steps them (so SGD with momentum and weight decay, Adam and per-device gradient
clipping are the per-device code itself), its sampler draws its own indices, its step counter and
pending activation are its own. Checkpoints, re-partitioning, aggregation and evaluation see
ordinary per-device modules. The results equal the per-device path's up to floating-point
rounding (vmap computes the same sums in another order): tests/trainers/roles/test_batching.py checks losses and
all parameters after several rounds within 1e-6.

A batch holds the devices of one group with the same cut and the same drawn batch size. Blocks
that vmap cannot run exactly fall back to the per-device path, decided once per cut:

* modules with batch statistics or running buffers (BatchNorm; any block with buffers, which a
  vmapped call could not update in place);
* random modules (Dropout and its variants): per-device masks would come from another random stream;
* any other operation vmap rejects (random functional calls, data-dependent control flow...): the
  first batched forward raises, nothing has changed yet, and that cut stays per-device;
* devices with a defence of their activations (trainers/roles/defences.py), which each clip, noise and penalise
  their own.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch
from torch import nn

from trainers.config.train_config import CLIENT_BATCHING  # noqa: F401  (the valid modes, kept torch-free in the config)
from trainers.roles.core import index_tensor, random_layer
from trainers.roles.messages import Activation

if TYPE_CHECKING:  # pragma: no cover
    from trainers.roles.core import Device


def use_batching(mode: str, device: torch.device) -> bool:
    """``--client-batching``: ``on``/``off`` as said; ``auto`` batches on CUDA only (on a CPU the
    per-device calls were measured faster: vmap's grouped convolutions are slow there, while on a
    GPU one call replaces N small kernel launches per layer)."""
    if mode == "auto":
        return device.type == "cuda"
    return mode == "on"


def unbatchable_reason(blocks: Sequence[nn.Module]) -> str | None:
    """Why client ``blocks`` must run per device (module docstring), or None when they can be batched."""
    for block in blocks:
        for module in block.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                return f"{type(module).__name__} (batch statistics and running buffers)"
        randomized = random_layer(block)
        if randomized is not None:
            return f"{type(randomized).__name__} (random masks)"
        if next(block.buffers(), None) is not None:
            return f"buffers in {type(block).__name__} (updated in place)"
    if not any(p.requires_grad for block in blocks for p in block.parameters()):
        return "no trainable parameters"
    return None


class ClientBatch:
    """The devices of one batched client forward, until the last of them has its reply."""

    def __init__(self, members: list["Device"], params: list[list[nn.Parameter]], leaves: list[torch.Tensor],
                 output: torch.Tensor) -> None:
        self.members = members
        self.params = params          # params[i][k]: device i's k-th parameter
        self.leaves = leaves          # leaves[k]: the k-th parameter of every device, stacked (a leaf of the graph)
        self.output: torch.Tensor | None = output   # (devices, batch, ...) activations, with the graph
        self.grads: dict[int, torch.Tensor | None] = {}

    def deliver(self, device: "Device", grad: torch.Tensor | None) -> None:
        """Device ``device`` received its cut gradient (None: drop its step); the last one triggers
        the batched backward and every member's optimizer step."""
        self.grads[device.index] = grad
        if len(self.grads) == len(self.members):
            self._backward()

    def _backward(self) -> None:
        grads = [self.grads[d.index] for d in self.members]
        output, self.output = self.output, None
        assert output is not None, "a group's backward runs once"
        if all(g is None for g in grads):
            return
        stacked = torch.stack([g if g is not None else torch.zeros_like(output[i]) for i, g in enumerate(grads)])
        output.backward(stacked)
        for i, (device, g) in enumerate(zip(self.members, grads)):
            if g is None:
                continue
            for p, leaf in zip(self.params[i], self.leaves):
                if leaf.grad is not None:
                    p.grad = leaf.grad[i] if p.grad is None else p.grad + leaf.grad[i]
            device.optimizer.step()
        self.leaves = []


class ClientBatcher:
    """Runs the client forwards of a group of devices, batched where the module docstring allows."""

    def __init__(self, template: nn.Sequential) -> None:
        self.template = template
        self.reasons: dict[int, str | None] = {}      # cut → why it runs per device (None: batched)
        self._skeletons: dict[int, nn.Module] = {}

    def reason(self, cut: int) -> str | None:
        if cut not in self.reasons:
            self.reasons[cut] = unbatchable_reason([self.template[j] for j in range(cut)])
        return self.reasons[cut]

    def _skeleton(self, cut: int) -> nn.Module:
        """The client blocks 0..cut−1 without storage: ``functional_call`` supplies every parameter."""
        if cut not in self._skeletons:
            self._skeletons[cut] = copy.deepcopy(nn.Sequential(*[self.template[j] for j in range(cut)])).to("meta")
        return self._skeletons[cut]

    def forward(self, devices: Sequence["Device"], round_index: int, batch: dict[int, int]) -> dict[int, Activation]:
        """Eq. (2) for every device of ``devices``; returns their activations in ``devices``' order."""
        for dev in devices:
            dev.begin_step(round_index)
        drawn = {dev.index: dev.sampler.next(batch[dev.index]) for dev in devices}
        groups: dict[tuple[int, int], list["Device"]] = {}
        for dev in devices:
            groups.setdefault((dev.cut, drawn[dev.index].size), []).append(dev)
        out: dict[int, Activation] = {}
        for (cut, _), members in groups.items():
            if len(members) > 1 and self.reason(cut) is None and not any(dev.defence.active for dev in members) \
                    and self._forward_batch(members, drawn, round_index, out):
                continue
            for dev in members:
                x, y = dev.samples(drawn[dev.index])
                h = x
                for block in dev.blocks:
                    h = block(h)
                out[dev.index] = dev.send(round_index, h, y, x=x)
        return {dev.index: out[dev.index] for dev in devices}

    def _forward_batch(self, members: list["Device"], drawn: dict[int, np.ndarray], round_index: int,
                       out: dict[int, Activation]) -> bool:
        from torch.func import functional_call, vmap

        cut, first = members[0].cut, members[0]
        names = [name for name, _ in first.blocks.named_parameters()]
        params = [[p for _, p in dev.blocks.named_parameters()] for dev in members]
        leaves = [torch.stack([ps[k].detach() for ps in params]).requires_grad_(params[0][k].requires_grad)
                  for k in range(len(names))]
        idx = index_tensor(np.concatenate([drawn[dev.index] for dev in members]), first.x.device)
        n = len(members)
        x = first.x[idx].reshape(n, -1, *first.x.shape[1:])
        y = first.y[idx].reshape(n, -1)
        skeleton = self._skeleton(cut)
        try:
            h = vmap(lambda p, xb: functional_call(skeleton, p, (xb,)))(dict(zip(names, leaves)), x)
        except (RuntimeError, NotImplementedError, ValueError, TypeError) as exc:   # vmap cannot run these blocks
            self.reasons[cut] = f"vmap failed: {str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}"
            return False
        batch = ClientBatch(members, params, leaves, h)
        for i, dev in enumerate(members):
            out[dev.index] = dev.send(round_index, h[i], y[i], batch)
        return True
