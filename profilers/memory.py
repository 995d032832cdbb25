"""Device memory of a client part, per cut point (``client_memory_bytes`` of docs/formats.md).

For cut j the device trains blocks 1..j on one mini-batch of ``batch_size`` samples and needs, in
bytes:

* the parameters of blocks 1..j, their gradients (1×) and the optimizer state
  (:data:`adaptplan.model_profile.OPTIMIZER_STATE`: SGD 0×, SGD with momentum 1×, Adam 2× the
  parameter bytes);
* the activations autograd keeps for the backward pass: every tensor saved for backward by
  blocks 1..j (measured with ``torch.autograd.graph.saved_tensors_hooks`` during a real forward
  pass on a batch, parameters and shared storages counted once), plus the cut activation itself,
  which the device holds until the server's gradient comes back.

Buffers (e.g. BatchNorm statistics) count with the parameters; the framework's own workspace and
the code are not counted.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from adaptplan.errors import InputError
from adaptplan.model_profile import OPTIMIZER_STATE


def saved_activation_bytes(block: nn.Module, x: torch.Tensor) -> tuple[int, torch.Tensor]:
    """(bytes autograd saves for backward when ``block`` runs on batch ``x``, the block's output)."""
    params = {p.untyped_storage().data_ptr() for p in block.parameters()}
    seen: set[int] = set()
    total = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal total
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key not in params and key not in seen:
            seen.add(key)
            total += storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = block(x)
    return total, out


def client_memory_bytes(blocks: nn.Sequential, input_shape: Sequence[int], batch_size: int,
                        optimizer: str = "sgd") -> list[float]:
    """``client_memory_bytes`` for every cut j = 1..L (module docstring), bytes; the blocks run in
    training mode on a random N(0, 1) batch of ``batch_size`` samples of per-sample ``input_shape``."""
    if optimizer not in OPTIMIZER_STATE:
        raise InputError(f"must be one of {', '.join(OPTIMIZER_STATE)}, got {optimizer!r}", field="optimizer")
    copies = 2 + OPTIMIZER_STATE[optimizer]  # parameters + gradients + optimizer state
    modes = [b.training for b in blocks]
    blocks.train()
    x = torch.randn(batch_size, *input_shape)
    out: list[float] = []
    weights: float = 0
    activations = 0
    try:
        for block in blocks:
            weights += sum(p.numel() * p.element_size() for p in block.parameters())
            weights += sum(b.numel() * b.element_size() for b in block.buffers()) / copies  # buffers: one copy
            saved, x = saved_activation_bytes(block, x)
            activations += saved
            out.append(float(copies * weights + activations + x.numel() * x.element_size()))
            x = x.detach().requires_grad_(True)
    finally:
        for block, mode in zip(blocks, modes):
            block.train(mode)
    return out
