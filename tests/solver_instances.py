"""Shared small random instances for the solver tests (not a conftest: import explicitly)."""

from __future__ import annotations

from itertools import product

import numpy as np

from adaptplan.constants import ConvergenceConstants
from adaptplan.system import SystemRanges, generate_system
from solvers.problem import PlanningProblem
from solvers.synthetic import synthetic_profile, vgg16_cifar_profile


def small_problem(seed: int, *, num_devices: int | None = None, num_cuts: int | None = None) -> PlanningProblem:
    """A random small instance: N ≤ 4 devices, ≤ 6 candidate cuts, heterogeneous devices and
    per-layer G_j² drawn so that the optimal cuts and intervals vary across seeds."""
    rng = np.random.default_rng(seed)
    N = int(num_devices or rng.integers(2, 5))
    L = int(num_cuts or rng.integers(3, 7)) + 1  # L cut points, candidates 1..L−1
    profile = synthetic_profile(L, seed=seed + 1000, total_gflops=float(rng.uniform(0.1, 2.0)),
                                total_mbit=float(rng.uniform(20, 500)))
    ranges = SystemRanges(device_flops=(float(rng.uniform(0.01, 0.5)) * 1e12, 2e12),
                          up_bps=(float(rng.uniform(5, 50)) * 1e6, 100e6), down_bps=(100e6, 400e6),
                          server_flops=float(rng.uniform(5, 50)) * 1e12, edge_fed_bps=float(rng.uniform(100, 1000)) * 1e6)
    system = generate_system(N, seed, ranges)
    G2 = tuple(float(g) for g in rng.uniform(1e-5, 1e-3, L))
    constants = ConvergenceConstants(beta=5.0, gamma=0.01, theta=2.3, epsilon=0.1, sigma2=(0.5 * N / L,) * L, G2=G2)  # noise floor 0.025 < ε
    return PlanningProblem.from_parts(profile, system, constants)


def vgg16_problem(num_devices: int = 20, seed: int = 0) -> PlanningProblem:
    """VGG-16 (docs/model.md §7.1) with the §6.1 placeholder system and constants."""
    return PlanningProblem.from_parts(vgg16_cifar_profile(), generate_system(num_devices, seed),
                                      ConvergenceConstants.placeholder(16))


def exhaustive_at_interval(problem: PlanningProblem, interval: int) -> float:
    """Minimum of objective (28) over all cut vectors at fixed I (brute force, seconds)."""
    vectors = np.array(list(product(problem.candidates.tolist(), repeat=problem.num_devices)))
    a, b = problem.latency.stage_latencies(vectors)
    margin = problem.convergence.c - problem.convergence.d_per_cut[vectors.max(axis=1) - 1] * interval**2
    values = np.where(margin > 0, problem.scale * (interval * a + b) / (interval * np.where(margin > 0, margin, 1)), np.inf)
    return float(values.min())

def stressed(problem, seed):
    """Rescale the matrices in place so that the model-exchange terms (t3, t4 caps) and server costs matter."""
    rng = np.random.default_rng(seed)
    lat, N = problem.latency, problem.num_devices
    lat.model_up = lat.model_up * rng.uniform(0.01, 300, (N, 1))
    lat.model_down = lat.model_down * rng.uniform(0.01, 300, (N, 1))
    lat.fp_up = lat.fp_up * rng.uniform(0.1, 10, (N, 1))
    lat.down_bp = lat.down_bp * rng.uniform(0.1, 10, (N, 1))
    scale = rng.uniform(0.01, 100)
    lat.server_fp_per_device = lat.server_fp_per_device * scale
    lat.server_bp_per_device = lat.server_bp_per_device * scale
    return problem
