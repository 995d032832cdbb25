"""Generated planning instances for benchmarks and scaling tests (numpy only; no torch).

* :func:`random_problem` — the synthetic scenario of the solver benchmark: a conv-net-like profile
  (:func:`solvers.synthetic.synthetic_profile`), devices from the §6.1 placeholder ranges, the
  placeholder constants with σ_j² = 0.5·N/L (noise floor 0.025 < ε = 0.1 for every N and L).
* :func:`adversarial_problem` — instances built to defeat the threshold method's pruning
  (issue 16): activation sizes that jump up and down along the model over three orders of
  magnitude (ψ_j = χ_j log-uniform in [10³, 10⁶] bits per sample), device FLOP/s and all four link
  rates drawn log-uniformly over two orders of magnitude with a Pareto (α = 1.2) tail on top, and
  near-tied devices (every device has a twin whose resources differ by a relative 10⁻⁹).
  Optionally every device gets a memory budget (bytes) that admits only some of the cuts.

Units: FLOPs per sample, bits per sample, bits, FLOP/s, bit/s, bytes.
"""

from __future__ import annotations

import numpy as np

from adaptplan.constants import ConvergenceConstants
from adaptplan.model_profile import CutPoint, ModelProfile
from adaptplan.system import DeviceSpec, SystemSpec, generate_system
from solvers.problem import PlanningProblem
from solvers.synthetic import synthetic_profile


def _constants(num_devices: int, num_cut_points: int) -> ConvergenceConstants:
    """Placeholder constants (§6.1) with σ_j² = 0.5·N/L so that (βγ/N)Σσ_j² = 0.025 < ε = 0.1."""
    k = ConvergenceConstants.placeholder(num_cut_points)
    return ConvergenceConstants(beta=k.beta, gamma=k.gamma, theta=k.theta, epsilon=k.epsilon,
                                sigma2=(0.5 * num_devices / num_cut_points,) * num_cut_points, G2=k.G2)


def random_problem(num_devices: int, num_cut_points: int, seed: int) -> PlanningProblem:
    """The benchmark's random instance: synthetic profile, placeholder system ranges and constants."""
    profile = synthetic_profile(num_cut_points, seed=seed)
    return PlanningProblem.from_parts(profile, generate_system(num_devices, seed),
                                      _constants(num_devices, num_cut_points))


def adversarial_profile(num_cut_points: int, seed: int) -> ModelProfile:
    """A profile whose activation sizes are far from monotone (log-uniform in [10³, 10⁶] bits per
    sample, independently per cut); FLOPs and parameters cumulative as the format requires, and
    ``client_memory_bytes`` = 4× the parameter bytes + 16 samples × 4 activation bytes (so that
    memory budgets have something to bite on)."""
    rng = np.random.default_rng(seed)
    rho = np.cumsum(rng.lognormal(0.0, 1.0, num_cut_points)) * 2e7
    varpi = rho * rng.uniform(1.5, 2.5)
    delta = np.cumsum(rng.lognormal(0.0, 1.0, num_cut_points)) * 1e6
    act = np.exp(rng.uniform(np.log(1e3), np.log(1e6), num_cut_points))
    memory = 4.0 * delta / 8.0 + 16 * 4.0 * act / 8.0
    cuts = tuple(CutPoint(index=k + 1, name=f"block{k + 1}", fp_flops=float(rho[k]), bp_flops=float(varpi[k]),
                          activation_bits=float(act[k]), gradient_bits=float(act[k]),
                          client_param_bits=float(delta[k]), client_memory_bytes=float(memory[k]))
                 for k in range(num_cut_points))
    return ModelProfile(model=f"adversarial{num_cut_points}", input_shape=(3, 32, 32), bits_per_value=32,
                        cut_points=cuts, memory={"batch_size": 16, "optimizer": "adam"})


def _heavy(rng: np.random.Generator, low: float, n: int) -> np.ndarray:
    """Log-uniform over [low, 100·low] times a Pareto(1.2) factor capped at 10 (heavy tail)."""
    base = np.exp(rng.uniform(np.log(low), np.log(100 * low), n))
    return base * np.minimum(1.0 + rng.pareto(1.2, n), 10.0)


def adversarial_system(num_devices: int, seed: int, *, memory_bytes: tuple[float, float] | None = None,
                       batch_size: int = 16) -> SystemSpec:
    """Heavy-tailed, two-orders-of-magnitude device resources in near-tied pairs (module docstring).
    ``memory_bytes`` = (low, high) draws a log-uniform per-device memory budget in bytes."""
    rng = np.random.default_rng(seed)
    half = (num_devices + 1) // 2
    columns = [_heavy(rng, 1e10, half), _heavy(rng, 1e6, half), _heavy(rng, 1e7, half),
               _heavy(rng, 1e6, half), _heavy(rng, 1e7, half)]
    base = np.stack(columns, axis=1)
    twins = base * (1.0 + 1e-9 * rng.standard_normal(base.shape))
    values = np.concatenate([base, twins])[:num_devices]
    memory = None
    if memory_bytes is not None:
        low, high = memory_bytes
        memory = np.exp(rng.uniform(np.log(low), np.log(high), num_devices))
    devices = tuple(DeviceSpec(*(float(v) for v in row), **({} if memory is None else {"memory_bytes": float(memory[i])}))
                    for i, row in enumerate(values))
    return SystemSpec(batch_size=batch_size, server_flops=5e12, edge_to_fed_bps=5e8, fed_to_edge_bps=5e8,
                      devices=devices)


def adversarial_problem(num_devices: int, num_cut_points: int, seed: int, *,
                        memory_bytes: tuple[float, float] | None = None) -> PlanningProblem:
    """:func:`adversarial_profile` × :func:`adversarial_system` with the benchmark's constants; candidate
    cuts 1..L−1."""
    return PlanningProblem.from_parts(adversarial_profile(num_cut_points, seed),
                                      adversarial_system(num_devices, seed, memory_bytes=memory_bytes),
                                      _constants(num_devices, num_cut_points))
