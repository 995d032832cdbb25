"""Algorithm 3 (BCD) and the exact references (docs/model.md §5.3, §7.6)."""

import math

import numpy as np
import pytest

from adaptplan.constants import ConvergenceConstants
from adaptplan.errors import InfeasibleError, InputError
from adaptplan.system import generate_system
from solvers.bcd import solve_bcd
from solvers.exact import solve_exact, solve_exhaustive
from solvers.milfp import _cbc_solver_class
from solvers.problem import PlanningProblem
from solvers.synthetic import synthetic_profile, vgg16_cifar_profile
from tests.solver_instances import small_problem, vgg16_problem

needs_cbc = pytest.mark.skipif(_cbc_solver_class() is None, reason="CBC is optional and not installed")


def _assert_monotone(result):
    values = [h["objective"] for h in result.history]
    assert all(v2 <= v1 * (1 + 1e-12) for v1, v2 in zip(values, values[1:])), values


def test_bcd_within_0_1_percent_of_joint_optimum_on_200_instances():
    gaps, single_gaps, heterogeneous = [], [], 0
    for seed in range(200):
        problem = small_problem(seed, num_devices=2 + seed % 3, num_cuts=3 + seed % 3)
        best = solve_exhaustive(problem)
        single = solve_bcd(problem, multistart=False, certify=False)  # Algorithm 3 from the shallowest cut only
        _assert_monotone(single)
        assert single.status == "converged" and single.iterations <= 10
        bcd = solve_bcd(problem, certify=False)  # default: multistart on these small instances (certificate: test_certificate)
        _assert_monotone(bcd)
        assert bcd.objective <= single.objective
        assert bcd.objective >= best.objective * (1 - 1e-9)
        gaps.append(bcd.objective / best.objective - 1)
        single_gaps.append(single.objective / best.objective - 1)
        heterogeneous += len(set(best.cuts)) > 1
    gaps, single_gaps = np.array(gaps), np.array(single_gaps)
    assert np.mean(gaps <= 1e-3) >= 0.99, sorted(gaps)[-5:]
    assert np.mean(single_gaps <= 1e-3) >= 0.9  # single-start BCD: blockwise optima on a few
    assert heterogeneous >= 10  # the instances exercise heterogeneous optimal cuts


@pytest.mark.parametrize("seed", range(8))
def test_exact_method_equals_exhaustive(seed):
    problem = small_problem(seed + 500)
    exact, brute = solve_exact(problem), solve_exhaustive(problem)
    assert exact.status == "optimal"
    assert exact.objective == pytest.approx(brute.objective, rel=1e-7)


def test_bcd_from_several_initial_cut_vectors():
    problem = small_problem(7, num_devices=4, num_cuts=5)
    best = solve_exhaustive(problem).objective
    for start in ([1, 1, 1, 1], [2, 1, 3, 1], list(problem.feasible_candidates[-1:]) * 4):
        result = solve_bcd(problem, initial_cuts=start)
        _assert_monotone(result)
        assert result.objective <= best * (1 + 1e-3)


def test_bcd_vgg16_default_scenario_matches_exact(vgg16):
    small = vgg16_problem(num_devices=10)
    assert solve_bcd(small, multistart=False).objective == pytest.approx(solve_exact(small).objective, rel=1e-3)
    problem = vgg16
    bcd = solve_bcd(problem, multistart=False)
    assert 1 <= bcd.interval < problem.convergence.interval_bound(max(bcd.cuts))
    rounds, aggregations, total = problem.total_latency(bcd.interval, bcd.cuts)
    assert aggregations == rounds // bcd.interval
    assert total == pytest.approx(bcd.objective, rel=2e-3)  # eq. (26) vs relaxation (28), §8 A3


@needs_cbc
def test_bcd_cbc_backend():
    problem = small_problem(3, num_devices=3, num_cuts=4)
    result = solve_bcd(problem, backend="cbc")
    assert result.backend == "cbc"
    assert result.objective == pytest.approx(solve_exhaustive(problem).objective, rel=1e-3)


def test_unreachable_epsilon_raises_with_reason():
    profile = vgg16_cifar_profile()
    constants = ConvergenceConstants(beta=5.0, gamma=0.01, theta=2.3, epsilon=0.01, sigma2=(1.0,) * 16, G2=(2e-3,) * 16)
    with pytest.raises(InfeasibleError, match="unreachable.*raise epsilon"):
        PlanningProblem.from_parts(profile, generate_system(20, 0), constants)
    deep = ConvergenceConstants(beta=5.0, gamma=0.01, theta=2.3, epsilon=0.1, sigma2=(1.0,) * 16, G2=(10.0,) * 16)
    with pytest.raises(InfeasibleError, match="shallowest candidate"):
        PlanningProblem.from_parts(profile, generate_system(20, 0), deep)


def test_input_validation(vgg16):
    profile = synthetic_profile(6)
    with pytest.raises(InputError, match="profile has 6 cut points"):
        PlanningProblem.from_parts(profile, generate_system(3, 0), ConvergenceConstants.placeholder(5))
    with pytest.raises(InputError, match="outside 1..6"):
        PlanningProblem.from_parts(profile, generate_system(3, 0), ConvergenceConstants.placeholder(6), candidates=[0, 2])
    with pytest.raises(InputError, match="max_vectors"):
        solve_exhaustive(vgg16, max_vectors=1000)
    assert math.isinf(vgg16.objective(100, [16] * 20))
