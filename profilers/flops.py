"""Per-block FLOP counts, per sample, in the profile's convention **2 FLOPs per multiply–add**.

* Forward (ρ, spec/adaptsfl.md §1): fvcore's ``FlopCountAnalysis`` per block. fvcore counts one
  multiply–add as 1 "flop" (and its norm/pooling handles as 1 per element) and elementwise ops
  (ReLU, add, dropout) as 0, so its total is multiplied by 2 here.
* Backward (ϖ): ``torch.utils.flop_counter.FlopCounterMode`` (already 2 per multiply–add; counts
  matmul/conv/attention only), measured as FLOPs(forward + backward) − FLOPs(forward) per block.
  Whether the block's input needs a gradient is a parameter: the device never needs ∂ℓ/∂x for
  block 1, every later block must return ∂ℓ/∂(its input).
"""

from __future__ import annotations

import logging
import warnings

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

FVCORE_TO_PROFILE = 2.0
"""fvcore counts 1 per multiply–add; the profile (formats.md) counts 2."""


def forward_flops(block: nn.Module, x: torch.Tensor) -> float:
    """Forward FLOPs per sample of ``block`` on input batch ``x`` (2 per multiply–add, via fvcore)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fvcore's import and jit tracing warn (deprecations, tracer)
        from fvcore.nn import FlopCountAnalysis

        logging.getLogger("fvcore").setLevel(logging.ERROR)
        analysis = FlopCountAnalysis(block, (x,))
        analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False).tracer_warnings("none")
        total = analysis.total()
    return FVCORE_TO_PROFILE * float(total) / x.shape[0]


def backward_flops(block: nn.Module, x: torch.Tensor, input_grad: bool) -> float:
    """Backward FLOPs per sample of ``block`` on input batch ``x`` (2 per multiply–add).

    Args:
        input_grad: whether ∂ℓ/∂x is computed (False for the first block on the device).
    """
    x = x.detach().requires_grad_(input_grad)
    with FlopCounterMode(display=False) as forward_counter:
        block(x)
    with FlopCounterMode(display=False) as total_counter:
        out = block(x)
        if out.requires_grad:
            out.backward(torch.ones_like(out))
    block.zero_grad(set_to_none=True)
    return float(total_counter.get_total_flops() - forward_counter.get_total_flops()) / x.shape[0]
