"""FLOPs per sample of one block, forward and backward, **2 FLOPs per multiply–add**
(docs/formats.md "Model profile"; ρ_j, ϖ_j of docs/model.md eqs. (16)–(21)).

Two independent counters are used, each where it is right, and each checks the other:

* **Forward** — fvcore's ``FlopCountAnalysis`` (jit trace; one multiply–add = 1, so × 2 here),
  with two handles added: ``aten::scaled_dot_product_attention`` (Q·Kᵀ and P·V, ≈ 4 % of
  ViT-B/16) and ``aten::lstm`` (the gates' products, :func:`lstm_multiply_adds`). fvcore also counts
  normalisation layers (BatchNorm in eval: 1 per value; LayerNorm and GroupNorm: 5 per value) and
  adaptive average pooling; every other op (ReLU, add, softmax, pooling...) counts as zero and is
  listed in :attr:`BlockFlops.zero_ops`.
* **Backward** — ``torch.utils.flop_counter.FlopCounterMode`` on a real forward + backward, with
  the convolution backward formula replaced by :func:`conv_backward_flop`: torch's own formula
  ignores ``groups`` and counts a depthwise convolution's backward at ~groups × its forward
  (MobileNetV2: 11.7 instead of ~1.2 GFLOPs); and with the CPU attention and LSTM kernels counted (torch
  registers the first for the GPU kernels only, the second nowhere). Elementwise ops and norms count zero.
* **Check** — the same FlopCounterMode forward count (matmuls, convolutions, attention; norms and
  elementwise ops count zero there) is kept as :attr:`BlockFlops.check_fp` so every profile can be
  compared with a second, independent counter.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

FVCORE_TO_PROFILE = 2.0
"""fvcore counts 1 per multiply–add; the profile (docs/formats.md) counts 2."""

FORWARD_COUNTER = "fvcore FlopCountAnalysis x 2 (+ scaled_dot_product_attention)"
BACKWARD_COUNTER = "torch.utils.flop_counter.FlopCounterMode (grouped-convolution backward corrected)"
CHECK_COUNTER = "torch.utils.flop_counter.FlopCounterMode forward"


@dataclass
class BlockFlops:
    """FLOPs of one block per sample (2 per multiply–add).

    Attributes:
        fp: forward FLOPs (fvcore × 2).
        bp: backward FLOPs (input gradient included iff it was requested).
        check_fp: forward FLOPs by FlopCounterMode (the independent cross-check of ``fp``).
        zero_ops: ops fvcore met in the forward and counted as zero, with their call counts.
    """

    fp: float
    bp: float
    check_fp: float
    zero_ops: Counter = field(default_factory=Counter)


def conv_backward_flop(grad_out_shape: Any, x_shape: Any, w_shape: Any, _bias: Any, _stride: Any, _padding: Any,
                       _dilation: Any, transposed: bool, _output_padding: Any, _groups: Any, output_mask: Any,
                       out_shape: Any = None, **kwargs: Any) -> int:
    """FLOPs of ``aten.convolution_backward`` (2 per multiply–add), correct for any ``groups``.

    Every multiply–add of the forward convolution, out[n,o,p] += w[o,c,k]·x[n,c,p+k], appears
    once in the input gradient (∂x[n,c,p+k] += w[o,c,k]·∂out[n,o,p]) and once in the weight
    gradient (∂w[o,c,k] += x[n,c,p+k]·∂out[n,o,p]). So each requested gradient costs exactly the
    forward count, N·C_out·|out|·(C_in/groups)·|k| multiply–adds (``w_shape`` already holds
    C_in/groups; for a transposed convolution the roles of input and output swap). The bias
    gradient (a sum) counts zero, as in torch's formula.
    """
    spatial = (x_shape if transposed else grad_out_shape)[2:]  # positions the kernel is applied at
    forward = 2 * grad_out_shape[0] * math.prod(w_shape) * math.prod(spatial)
    return forward * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


def _sdpa_fvcore(inputs: list[Any], outputs: list[Any]) -> int:
    """fvcore handle for ``aten::scaled_dot_product_attention``: multiply–adds of Q·Kᵀ and P·V."""
    from fvcore.nn.jit_handles import get_shape

    q, k, v = (get_shape(t) for t in inputs[:3])
    batch = math.prod(q[:-2])
    return batch * q[-2] * k[-2] * (q[-1] + v[-1])


def lstm_multiply_adds(steps_times_batch: int, input_size: int, hidden: int, layers: int = 1,
                       directions: int = 1) -> int:
    """Multiply–adds of an LSTM's forward over ``steps_times_batch`` = T·B positions: per layer and direction the
    four gates' input and recurrent products, 4h·(in_l + h) per position, in_0 = ``input_size``, in_l = d·h after.
    The gates' elementwise work counts zero, as every elementwise op here."""
    total, width = 0, input_size
    for _ in range(layers):
        total += directions * steps_times_batch * 4 * hidden * (width + hidden)
        width = directions * hidden
    return total


def _lstm_fvcore(inputs: list[Any], outputs: list[Any]) -> int:
    """fvcore handle for ``aten::lstm`` (input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
    batch_first): :func:`lstm_multiply_adds` from the input's and output's shapes."""
    from fvcore.nn.jit_handles import get_shape

    x, out = get_shape(inputs[0]), get_shape(outputs[0])
    directions = 2 if inputs[7].toIValue() else 1
    return lstm_multiply_adds(x[0] * x[1], x[-1], out[-1] // directions, int(inputs[4].toIValue()), directions)


def _rnn_layer_flop(x_shape: Any, w_ih: Any, w_hh: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    """FLOPs of the CPU kernel of one LSTM layer, ``aten.mkldnn_rnn_layer`` (T, B, in): 2 per multiply–add of the
    gates' products, (4h·in + 4h·h) per position, from the weights' shapes (torch registers no formula for it)."""
    return 2 * x_shape[0] * x_shape[1] * (math.prod(w_ih) + math.prod(w_hh))


def _rnn_layer_backward_flop(x_shape: Any, w_ih: Any, w_hh: Any, *args: Any, out_shape: Any = None,
                             **kwargs: Any) -> int:
    """``aten.mkldnn_rnn_layer_backward``: twice the forward — each gate product's gradient with respect to its
    input (the layer's input and the previous hidden state) and to its weight, one product each."""
    return 2 * _rnn_layer_flop(x_shape, w_ih, w_hh)


def _custom_formulas() -> dict[Any, Any]:
    """FlopCounterMode formulas replaced or added: the grouped-convolution backward, and the CPU
    attention kernel (``_scaled_dot_product_flash_attention_for_cpu`` and its backward), which
    torch registers for the GPU kernels only, with torch's own attention formulas."""
    from torch.utils import flop_counter

    aten = torch.ops.aten
    formulas: dict[Any, Any] = {aten.convolution_backward: conv_backward_flop}
    if hasattr(aten, "mkldnn_rnn_layer"):
        formulas[aten.mkldnn_rnn_layer] = _rnn_layer_flop
        formulas[aten.mkldnn_rnn_layer_backward] = _rnn_layer_backward_flop
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        formulas[aten._scaled_dot_product_flash_attention_for_cpu] = (
            lambda q, k, v, *args, out_shape=None, **kwargs: flop_counter.sdpa_flop_count(q, k, v))
        formulas[aten._scaled_dot_product_flash_attention_for_cpu_backward] = (
            lambda grad, q, k, v, *args, out_shape=None, **kwargs: flop_counter.sdpa_backward_flop_count(grad, q, k, v))
    return formulas


CUSTOM_FORMULAS = _custom_formulas()

_ARITHMETIC_IGNORED = {"aten::relu", "aten::relu_", "aten::clamp", "aten::clamp_", "aten::max", "aten::eq", "aten::ge",
                       "aten::gt", "aten::floor", "aten::floor_divide", "aten::remainder", "aten::__and__",
                       "aten::bitwise_not"}
"""Ops fvcore ignores without reporting although they compute; reported in ``zero_ops`` here, so that
the list names every op counted as zero except pure data movement (view, reshape, cat, ...)."""


def count_flops(block: nn.Module, x: torch.Tensor, input_grad: bool) -> BlockFlops:
    """Forward and backward FLOPs per sample of ``block`` on the batch ``x`` (see the module docstring).

    Args:
        input_grad: whether ∂ℓ/∂x is computed (False for the first block on the device).
    """
    fp, zero_ops = _fvcore_forward(block, x)
    check, bp = _torch_counts(block, x, input_grad)
    return BlockFlops(fp=fp, bp=bp, check_fp=check, zero_ops=zero_ops)


def _torch_counts(block: nn.Module, x: torch.Tensor, input_grad: bool) -> tuple[float, float]:
    """(forward, backward) FLOPs per sample by FlopCounterMode, grouped-conv backward corrected."""
    x = x.detach().requires_grad_(input_grad)
    with FlopCounterMode(display=False, custom_mapping=CUSTOM_FORMULAS) as forward_counter:
        block(x)
    with FlopCounterMode(display=False, custom_mapping=CUSTOM_FORMULAS) as total_counter:
        out = block(x)
        if out.requires_grad:
            out.backward(torch.ones_like(out))
    block.zero_grad(set_to_none=True)
    forward = float(forward_counter.get_total_flops())
    backward = float(total_counter.get_total_flops()) - forward
    return forward / x.shape[0], backward / x.shape[0]


def _fvcore_forward(block: nn.Module, x: torch.Tensor) -> tuple[float, Counter]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fvcore's import and jit tracing warn (deprecations, tracer)
        from fvcore.nn import FlopCountAnalysis

        logging.getLogger("fvcore").setLevel(logging.ERROR)
        analysis = FlopCountAnalysis(block, (x,))
        analysis.set_op_handle("aten::scaled_dot_product_attention", _sdpa_fvcore)
        analysis.set_op_handle("aten::lstm", _lstm_fvcore)
        if isinstance(getattr(analysis, "_ignored_ops", None), set):  # report fvcore's silently ignored arithmetic too
            analysis._ignored_ops -= _ARITHMETIC_IGNORED
        analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False).tracer_warnings("none")
        total = analysis.total()
        zero_ops = Counter(analysis.unsupported_ops())
    return FVCORE_TO_PROFILE * float(total) / x.shape[0], zero_ops


def forward_flops(block: nn.Module, x: torch.Tensor) -> float:
    """Forward FLOPs per sample of ``block`` on input batch ``x`` (2 per multiply–add, via fvcore)."""
    return _fvcore_forward(block, x)[0]


def backward_flops(block: nn.Module, x: torch.Tensor, input_grad: bool) -> float:
    """Backward FLOPs per sample of ``block`` on input batch ``x`` (2 per multiply–add).

    Args:
        input_grad: whether ∂ℓ/∂x is computed (False for the first block on the device).
    """
    return _torch_counts(block, x, input_grad)[1]


class TotalFlops(TorchDispatchMode):
    """The FLOPs of every op run inside it, by FlopCounterMode's formulas (with :data:`CUSTOM_FORMULAS`), as one total
    (``total``) and without FlopCounterMode's module hooks, which ``torch.autograd.grad`` inside the counted code
    does not support (GAPSL's and SCALA's server steps): for counting whole training rounds."""

    def __init__(self) -> None:
        super().__init__()
        from torch.utils.flop_counter import flop_registry, shape_wrapper

        self.formulas = {**flop_registry, **{op: shape_wrapper(f) for op, f in CUSTOM_FORMULAS.items()}}   # as FlopCounterMode
        self.total = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = self.formulas.get(func._overloadpacket)
        if formula is not None:
            self.total += int(formula(*args, **kwargs, out_val=out))
        return out
