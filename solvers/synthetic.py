"""Model profiles for solver tests and benchmarks (numpy only; no torch).

* :func:`vgg16_cifar_profile` — VGG-16 for CIFAR-10 (13 conv + 3 FC 512-512-10), computed
  analytically as described in docs/model.md §7.1: ρ_j cumulative forward FLOPs (2 per
  multiply–add), ϖ_j = 2ρ_j, ψ_j = χ_j the fp32 bits of the (pooled) output of layer j, δ_j the
  cumulative parameter bits. ρ_16 ≈ 0.6275 GFLOP and δ_16 ≈ 487.8 Mbit as in §7.1.
* :func:`synthetic_profile` — a random L-cut profile with monotone cumulative FLOPs/parameters
  and non-monotone activation sizes (conv-net-like: activations shrink at "pooling" cuts).

These stand in for the profiler's measured profile until it ships as package data.
"""

from __future__ import annotations

import numpy as np

from adaptplan.model_profile import CutPoint, ModelProfile

_VGG16_CONV = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


def _profile(name: str, shape: tuple[int, ...], rho, varpi, act_bits, param_bits, names) -> ModelProfile:
    cuts = tuple(
        CutPoint(index=k + 1, name=names[k], fp_flops=float(rho[k]), bp_flops=float(varpi[k]),
                 activation_bits=float(act_bits[k]), gradient_bits=float(act_bits[k]),
                 client_param_bits=float(param_bits[k]))
        for k in range(len(rho))
    )
    return ModelProfile(model=name, input_shape=shape, bits_per_value=32, cut_points=cuts)


def vgg16_cifar_profile() -> ModelProfile:
    """The 16-cut VGG-16/CIFAR-10 profile of docs/model.md §7.1 (bits per value 32, 2 FLOPs per MAC)."""
    channels, size = 3, 32
    flops, params, acts, names = [], [], [], []
    total_flops = total_params = 0.0
    conv_layers = [c for c in _VGG16_CONV]
    for k, item in enumerate(conv_layers):
        if item == "M":
            continue
        out = int(item)
        total_flops += 2.0 * size * size * out * channels * 9
        total_params += out * channels * 9 + out
        channels = out
        pooled = k + 1 < len(conv_layers) and conv_layers[k + 1] == "M"
        out_size = size // 2 if pooled else size
        flops.append(total_flops)
        params.append(total_params * 32)
        acts.append(channels * out_size * out_size * 32)
        names.append(f"conv{len(flops)}")
        size = out_size
    features = channels * size * size
    for width in (512, 512, 10):
        total_flops += 2.0 * features * width
        total_params += features * width + width
        flops.append(total_flops)
        params.append(total_params * 32)
        acts.append(width * 32)
        names.append(f"fc{len(flops) - 13}")
        features = width
    rho = np.array(flops)
    return _profile("vgg16", (3, 32, 32), rho, 2.0 * rho, acts, params, names)


def synthetic_profile(num_cuts: int, seed: int = 0, *, total_gflops: float = 0.6, total_mbit: float = 480.0,
                      input_bits: float = 3 * 32 * 32 * 32) -> ModelProfile:
    """Random conv-net-like profile with ``num_cuts`` cut points.

    Per-block FLOPs are log-uniform (cumulative sums are monotone), parameters grow towards the
    output (late blocks are wide), and the activation size follows a noisy decreasing trend with
    occasional increases (channel expansion), so it is non-monotone. Units: FLOPs per sample,
    bits per sample, bits.
    """
    rng = np.random.default_rng(seed)
    block_flops = rng.lognormal(0.0, 0.6, num_cuts)
    rho = np.cumsum(block_flops) / block_flops.sum() * total_gflops * 1e9
    block_params = rng.lognormal(0.0, 0.8, num_cuts) * np.linspace(0.2, 2.0, num_cuts)
    delta = np.cumsum(block_params) / block_params.sum() * total_mbit * 1e6
    factors = rng.choice([0.5, 1.0, 2.0, 0.25], size=num_cuts, p=[0.35, 0.3, 0.2, 0.15])
    act = input_bits * 4.0 * np.cumprod(factors)
    act = np.clip(act, 320.0, input_bits * 16)
    varpi = rho * rng.uniform(1.8, 2.2)
    names = [f"block{k + 1}" for k in range(num_cuts)]
    return _profile(f"synthetic{num_cuts}", (3, 32, 32), rho, varpi, act, delta, names)
