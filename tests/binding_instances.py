"""Small instances on which every term of the world model can bind (import explicitly; not a conftest).

Unlike ``tests/solver_instances.small_problem`` (generated systems: r_{e→f} = r_{f→e}, uplinks and
downlinks from two shared ranges), every rate here is drawn independently over three decades and the
edge↔fed link is slow and asymmetric, so the aggregation maxima (22)–(25) are decided by the devices on
some instances and by the edge server's payload S_n on others, in either direction.
"""

from __future__ import annotations

import numpy as np

from adaptplan.constants import ConvergenceConstants
from adaptplan.system import DeviceSpec, SystemSpec
from solvers.problem import PlanningProblem
from solvers.synthetic import synthetic_profile


def _log_uniform(rng, low, high):
    return float(np.exp(rng.uniform(np.log(low), np.log(high))))


def asymmetric_problem(seed: int, num_devices: int = 3, num_cuts: int = 5) -> PlanningProblem:
    """N devices, candidates 1..num_cuts−1, independent log-uniform rates, r_{e→f} ≠ r_{f→e} (one slow)."""
    rng = np.random.default_rng(seed)
    profile = synthetic_profile(num_cuts, seed=seed + 77, total_gflops=float(rng.uniform(0.2, 2.0)),
                                total_mbit=float(rng.uniform(20, 400)))
    devices = tuple(DeviceSpec(flops=_log_uniform(rng, 5e10, 2e12), up_bps=_log_uniform(rng, 5e6, 5e8),
                               down_bps=_log_uniform(rng, 5e6, 5e8), fed_up_bps=_log_uniform(rng, 5e6, 5e8),
                               fed_down_bps=_log_uniform(rng, 5e6, 5e8)) for _ in range(num_devices))
    links = [_log_uniform(rng, 2e6, 5e7), _log_uniform(rng, 2e8, 2e9)]
    rng.shuffle(links)
    system = SystemSpec(batch_size=16, server_flops=_log_uniform(rng, 1e11, 5e13), edge_to_fed_bps=links[0],
                        fed_to_edge_bps=links[1], devices=devices)
    L = num_cuts
    constants = ConvergenceConstants(beta=5.0, gamma=0.01, theta=2.3, epsilon=0.1, sigma2=(0.5 * num_devices / L,) * L,
                                     G2=tuple(float(g) for g in rng.uniform(1e-5, 1e-3, L)))
    return PlanningProblem.from_parts(profile, system, constants)


def parts(problem: PlanningProblem):
    """(profile, system, constants) of a problem, for the reference model."""
    return problem.latency.profile, problem.latency.system, problem.convergence.constants
