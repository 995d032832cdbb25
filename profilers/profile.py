"""``profile_model``: the per-cut :class:`~adaptplan.model_profile.ModelProfile` of a model
(docs/formats.md "Model profile"; ρ_j, ϖ_j, ψ_j, χ_j, δ_j of docs/model.md, eqs. (16)–(25)).

Per block k (chain of :mod:`profilers.chain`), one sample, random N(0, 1) input, eval mode:

* fp_k: forward FLOPs (fvcore × 2, i.e. **2 FLOPs per multiply–add**, attention included,
  :mod:`profilers.flops`);
* bp_k: backward FLOPs (torch's FlopCounterMode, grouped convolutions corrected), the input
  gradient computed for k ≥ 2 only (the device never needs ∂ℓ/∂x of block 1).

The profile's ``flop_counting`` records the counters, the ops counted as zero, and the forward
total by a second, independent counter (FlopCounterMode); a disagreement above
:data:`CHECK_TOLERANCE` is warned about.

Then, for cut j: ``fp_flops`` = Σ_{k≤j} fp_k (ρ_j); ``bp_flops`` = Σ_{k≤j} bp_k (ϖ_j);
``server_bp_flops`` = Σ_{k>j} bp_k, every block k > j computing its input gradient (the server
returns ∂ℓ/∂a_j; with this per-block accounting it equals ϖ_L − ϖ_j); ``activation_bits`` =
``gradient_bits`` = numel of the cut tensor per sample × bits_per_value (ψ_j = χ_j);
``client_param_bits`` = parameters of blocks 1..j × bits_per_value (δ_j).
"""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import replace
from itertools import accumulate
from typing import Any, Sequence

import torch
from torch import nn

from adaptplan.errors import InputError
from adaptplan.fileio import positive_int
from adaptplan.model_profile import CutPoint, ModelProfile
from profilers.chain import Chain, build_chain
from profilers.flops import BACKWARD_COUNTER, CHECK_COUNTER, FORWARD_COUNTER, BlockFlops, count_flops
from profilers.memory import client_memory_bytes
from profilers.sizes import parameter_count, tensor_bits
from profilers.timing import BlockTimes, measure_block_times
from profilers.tracing import example_batch

CHECK_TOLERANCE = 0.10
"""Largest relative difference between the two forward counts before a warning. They differ by
design only in what one counts and the other does not (norm layers, adaptive average pooling)."""


class FlopCheckWarning(UserWarning):
    """The two independent FLOP counters disagree on a profile's forward total."""


class StemWarning(UserWarning):
    """A model whose stem is made for large (ImageNet) images profiled at a small input."""


SMALL_IMAGE_SIDE = 64
"""Images up to this side (pixels) are small: CIFAR, MNIST, Tiny-ImageNet."""
STEM_SHRINK = 4
"""A first cut point whose feature map is this many times smaller a side than the input marks an
ImageNet stem (a 7×7 stride-2 convolution and a stride-2 max-pool: 224 → 56)."""
CIFAR_VARIANTS = {"resnet18": "resnet18-cifar", "resnet34": "resnet34-cifar", "resnet50": "resnet50-cifar"}


def stem_note(name: str, input_shape: tuple[int, ...], output_shapes: Sequence[tuple[int, ...]]) -> str | None:
    """A one-line note when ``name``'s first spatial cut point shrinks a small image
    (≤ :data:`SMALL_IMAGE_SIDE` pixels a side) by :data:`STEM_SHRINK` or more a side — an ImageNet stem
    that leaves the later layers 1- or 2-pixel maps and a fraction of the FLOPs the network was
    designed for; ``None`` otherwise. Names the CIFAR-style built-in when there is one."""
    if len(input_shape) != 3 or max(input_shape[1:]) > SMALL_IMAGE_SIDE:
        return None
    first = next((s for s in output_shapes if len(s) == 3), None)
    if first is None or first[1] * STEM_SHRINK > input_shape[1]:
        return None
    last = [s for s in output_shapes if len(s) == 3][-1]
    variant = CIFAR_VARIANTS.get(name)
    fix = (f"use {variant}, its CIFAR-style variant (3x3 stride-1 stem)" if variant else
           "use a model made for small images (e.g. resnet18-cifar or vgg16-cifar) or larger images")
    return (f"{name} shrinks the {input_shape[1]}x{input_shape[2]} input to {first[1]}x{first[2]} in its first block "
            f"(a stem made for 224x224 ImageNet images); its last feature map is {last[1]}x{last[2]}. For "
            f"{input_shape[1]}x{input_shape[2]} images {fix}")


def check_input_shape(input_shape: Sequence[int]) -> tuple[int, ...]:
    """``input_shape`` as a tuple of positive ints (per sample, no batch dimension)."""
    shape = tuple(input_shape)
    if not shape or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in shape):
        raise InputError(f"must be positive integers per sample, e.g. (3, 32, 32); got {input_shape!r}", field="input_shape")
    return shape


def profile_model(model: nn.Module | Chain | str, input_shape: Sequence[int], model_name: str | None = None,
                  bits_per_value: int = 32, measure_time: bool = False, batch_size: int = 16, repeats: int = 5,
                  num_classes: int = 10, progress: bool = False, optimizer: str = "sgd") -> ModelProfile:
    """Profile ``model`` at every cut point j = 1..L (see the module docstring for definitions).

    Args:
        model: an ``nn.Module`` (traced by :func:`profilers.build_chain`), an already built
            :class:`Chain`, or a model name for :func:`profilers.models.resolve_model`.
        input_shape: per-sample input shape, e.g. ``(3, 32, 32)``.
        model_name: the profile's ``model`` field (default: the name given, else the class name).
        bits_per_value: bits per activation/gradient/parameter value (32 for float32).
        measure_time: also measure cumulative ``fp_seconds``/``bp_seconds`` per sample on this
            machine (median of ``repeats`` batches of ``batch_size``) and fill ``timing``.
        num_classes: only used when ``model`` is a name.
        progress: tqdm progress bars for the long steps.
        optimizer: the device optimizer for ``client_memory_bytes`` (:mod:`profilers.memory`, one
            mini-batch of ``batch_size``); ``None`` skips the memory measurement.

    Returns:
        ModelProfile with FLOPs per sample (2 per multiply–add), bits per sample, and bits.
    """
    shape = check_input_shape(input_shape)
    positive_int(bits_per_value, "bits_per_value")
    if isinstance(model, str):
        from profilers.models import resolve_model

        model_name = model_name or model
        model = resolve_model(model, num_classes=num_classes, input_shape=shape)
    x = example_batch(shape)
    chain = model if isinstance(model, Chain) else build_chain(model, x)
    name = model_name or type(model.blocks if isinstance(model, Chain) else model).__name__
    note = stem_note(name, shape, chain.output_shapes)
    if note:
        warnings.warn(note, StemWarning, stacklevel=2)
    modes = [b.training for b in chain.blocks]
    chain.blocks.eval()
    try:
        counts, bp_with_input, params, values = _per_block(chain, x, progress)
    finally:
        for block, mode in zip(chain.blocks, modes):
            block.train(mode)
    times = measure_block_times(chain.blocks, shape, batch_size, repeats, progress=progress) if measure_time else None
    profile = _assemble(name, shape, bits_per_value, chain.names, [c.fp for c in counts], [c.bp for c in counts],
                        bp_with_input, params, values, times)
    profile = replace(profile, flop_counting=flop_counting(name, counts))
    if optimizer is None:
        return profile
    memory = client_memory_bytes(chain.blocks, shape, batch_size, optimizer)
    return replace(profile, memory={"batch_size": batch_size, "optimizer": optimizer},
                   cut_points=tuple(replace(c, client_memory_bytes=m) for c, m in zip(profile.cut_points, memory)))


def flop_counting(name: str, counts: list[BlockFlops]) -> dict[str, Any]:
    """The profile's ``flop_counting`` record (docs/formats.md); warns when the counters disagree."""
    fp = sum(c.fp for c in counts)
    check = sum(c.check_fp for c in counts)
    difference = (fp - check) / fp if fp else 0.0
    zero_ops: Counter = sum((c.zero_ops for c in counts), Counter())
    if abs(difference) > CHECK_TOLERANCE:
        warnings.warn(f"{name}: forward FLOPs {fp:.4g} ({FORWARD_COUNTER}) and {check:.4g} ({CHECK_COUNTER}) differ by "
                      f"{100 * difference:.1f}%; ops counted as zero: {', '.join(sorted(zero_ops)) or 'none'}",
                      FlopCheckWarning, stacklevel=3)
    return {
        "forward": FORWARD_COUNTER,
        "backward": BACKWARD_COUNTER,
        "zero_flop_ops": sorted(zero_ops),
        "check": {"counter": CHECK_COUNTER, "fp_flops": check, "relative_difference": round(difference, 6)},
    }


def _per_block(chain: Chain, x: torch.Tensor, progress: bool
               ) -> tuple[list[BlockFlops], list[float], list[int], list[tuple[int, ...]]]:
    counts, bp_with_input, params, shapes = [], [], [], []
    blocks = list(enumerate(chain.blocks))
    if progress:
        from tqdm import tqdm

        blocks = tqdm(blocks, desc="counting FLOPs", unit="block", leave=False)
    for k, block in blocks:
        count = count_flops(block, x, input_grad=k > 0)  # the device never computes ∂ℓ/∂x of block 1
        counts.append(count)
        bp_with_input.append(count.bp if k > 0 else 0.0)
        params.append(parameter_count(block))
        with torch.no_grad():
            x = block(x)
        shapes.append(tuple(int(s) for s in x.shape[1:]))
    return counts, bp_with_input, params, shapes


def _assemble(name: str, shape: tuple[int, ...], bits: int, names: list[str], fp: list[float], bp: list[float],
              bp_with_input: list[float], params: list[int], shapes: list[tuple[int, ...]],
              times: BlockTimes | None) -> ModelProfile:
    rho, varpi, delta = list(accumulate(fp)), list(accumulate(bp)), list(accumulate(params))
    server_bp = [float(sum(bp_with_input[j + 1:])) for j in range(len(fp))]
    fp_s = list(accumulate(times.forward_s)) if times else [None] * len(fp)
    bp_s = list(accumulate(times.backward_s)) if times else [None] * len(fp)
    cuts = tuple(
        CutPoint(index=j + 1, name=names[j], fp_flops=rho[j], bp_flops=varpi[j],
                 activation_bits=float(tensor_bits(shapes[j], bits)), gradient_bits=float(tensor_bits(shapes[j], bits)),
                 client_param_bits=float(delta[j] * bits), server_bp_flops=server_bp[j],
                 fp_seconds=fp_s[j], bp_seconds=bp_s[j])
        for j in range(len(fp))
    )
    return ModelProfile(model=name, input_shape=shape, bits_per_value=bits, cut_points=cuts,
                        timing=times.timing_info() if times else None)
