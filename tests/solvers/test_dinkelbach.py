"""MS step: Dinkelbach (35) on the MILFP (34) equals brute force at fixed I (docs/model.md §5.1–§5.2, §7.6)."""

import math

import pytest

from adaptplan.errors import InfeasibleError
from solvers.dinkelbach import solve_dinkelbach
from solvers.interval import max_feasible_interval
from solvers.milfp import _cbc_solver_class
from tests.solver_instances import exhaustive_at_interval, small_problem

needs_cbc = pytest.mark.skipif(_cbc_solver_class() is None, reason="CBC is optional and not installed")


def _intervals(problem):
    conv = problem.convergence
    top = max_feasible_interval(conv.c, conv.d(int(problem.feasible_candidates[0])))
    return sorted({1, max(1, top // 4), max(1, top // 2), top})


@pytest.mark.parametrize("seed", range(12))
def test_highs_equals_brute_force(seed):
    problem = small_problem(seed)
    for I in _intervals(problem):
        expected = exhaustive_at_interval(problem, I)
        if not math.isfinite(expected):
            continue
        result = solve_dinkelbach(problem, I)
        assert result.status == "converged"
        assert result.objective == pytest.approx(expected, rel=1e-7)
        assert 1 <= result.milp_solves <= 6


@needs_cbc
@pytest.mark.parametrize("seed", range(3))
def test_cbc_equals_brute_force(seed):
    problem = small_problem(seed, num_devices=3, num_cuts=4)
    I = _intervals(problem)[1]
    result = solve_dinkelbach(problem, I, backend="cbc", warm_cuts=(1,) * 3)
    assert result.backend == "cbc" and result.status == "converged"
    assert result.objective == pytest.approx(exhaustive_at_interval(problem, I), rel=1e-7)


def test_lambda_sequence_non_increasing_and_ratio_is_objective(vgg16):
    problem = vgg16
    result = solve_dinkelbach(problem, 8, warm_cuts=(1,) * 20)
    lambdas = [h["lambda"] for h in result.history]
    assert all(l2 <= l1 + 1e-12 for l1, l2 in zip(lambdas, lambdas[1:]))
    assert problem.scale * result.history[-1]["lambda"] == pytest.approx(result.objective, rel=1e-9)


def test_vgg16_worked_example_latency_terms(vgg16):
    """§7.2 terms that do not depend on the random device draws (server FP/BP, edge upload)."""
    problem = vgg16
    parts = problem.latency.breakdown([4] * 10 + [5] * 10)
    assert parts.server_fp == pytest.approx(0.00266, abs=1e-5)
    assert parts.server_bp == pytest.approx(0.00533, abs=1e-5)
    assert parts.edge_model_up == pytest.approx(0.18891, abs=1e-5)
    assert problem.convergence.c == pytest.approx(0.06)
    assert problem.convergence.d(5) == pytest.approx(1e-4)


def test_infeasible_interval_raises():
    problem = small_problem(0)
    conv = problem.convergence
    too_large = max_feasible_interval(conv.c, conv.d(int(problem.feasible_candidates[0]))) + 1
    with pytest.raises(InfeasibleError, match="I must be <"):
        solve_dinkelbach(problem, too_large)
