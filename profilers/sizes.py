"""Sizes in bits: activations/gradients crossing a cut (ψ_j, χ_j) and client parameters (δ_j),
docs/model.md §1 and docs/formats.md "Model profile"."""

from __future__ import annotations

import math
from typing import Sequence

from torch import nn


def parameter_count(module: nn.Module) -> int:
    """Number of trainable-or-not parameters (``module.parameters()``, buffers such as BatchNorm
    running statistics excluded: they are not exchanged by model averaging, eqs. (22)–(25))."""
    return sum(p.numel() for p in module.parameters())


def tensor_bits(shape: Sequence[int], bits_per_value: int) -> int:
    """Bits of one sample's tensor of per-sample ``shape`` (batch dimension dropped)."""
    return math.prod(int(s) for s in shape) * int(bits_per_value)
