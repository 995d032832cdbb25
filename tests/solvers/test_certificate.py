"""The certificate (issue 16): every lower bound is ≤ the brute-force optimum written here, and it is
tight (gap 0) where the method is exact."""

from __future__ import annotations

from itertools import product

import numpy as np
import pytest

from adaptplan.plan import Plan
from adaptplan.planner import Planner
from adaptplan.report import format_plan
from solvers.bcd import solve_bcd
from solvers.certificate import certify, interval_bounds
from solvers.exact import solve_exact, solve_exhaustive
from solvers.lagrange import lagrangian_bound
from solvers.threshold import solve_ms_exact
from tests.solver_instances import exhaustive_at_interval, small_problem, stressed


def brute_optimum(problem) -> float:
    """min over every cut vector and every integer I of (28), by enumeration."""
    vectors = np.array(list(product(problem.candidates.tolist(), repeat=problem.num_devices)))
    a, b = problem.latency.stage_latencies(vectors)
    conv = problem.convergence
    d = conv.d_per_cut[vectors.max(axis=1) - 1]
    best = np.inf
    for I in range(1, 400):
        margin = conv.c - d * I * I
        if not (margin > 0).any():
            break
        values = np.where(margin > 0, (I * a + b) / (I * np.where(margin > 0, margin, 1.0)), np.inf)
        best = min(best, problem.scale * float(values.min()))
    return best


@pytest.mark.parametrize("seed", range(25))
def test_bare_algorithm_3_bound_is_below_the_optimum_and_tight_when_optimal(seed):
    problem = small_problem(seed)
    optimum = brute_optimum(problem)
    result = solve_bcd(problem, multistart=False)
    assert result.lower_bound <= optimum * (1 + 1e-12)
    assert result.objective >= optimum * (1 - 1e-12)
    assert 0 <= result.gap == pytest.approx((result.objective - result.lower_bound) / result.objective)
    if result.objective <= optimum * (1 + 1e-12):  # BCD found the optimum: the certificate proves it
        assert result.gap == 0 and result.lower_bound == result.objective


@pytest.mark.parametrize("seed", range(4))
def test_exact_methods_have_gap_zero(seed):
    problem = small_problem(seed + 50)
    optimum = brute_optimum(problem)
    for result in (solve_exhaustive(problem), solve_exact(problem)):
        assert result.lower_bound <= optimum * (1 + 1e-12)
        assert result.gap == 0 and result.objective == pytest.approx(optimum, rel=1e-9)


@pytest.mark.parametrize("seed", range(10))
def test_budgeted_threshold_bound_is_valid(seed):
    """However early the sweep budget stops the search, its lower bound stays ≤ the optimum at I; with no
    budget it equals the optimum."""
    problem = stressed(small_problem(seed + 300, num_devices=4, num_cuts=6), seed)
    for interval in (1, 3, 6):
        optimum = exhaustive_at_interval(problem, interval)
        if not np.isfinite(optimum):
            continue
        for budget in (0, 1, 2, 5):
            result = solve_ms_exact(problem, interval, max_sweeps=budget)
            assert result.lower_bound <= optimum * (1 + 1e-12) <= result.objective * (1 + 2e-12)
        exact = solve_ms_exact(problem, interval, max_sweeps=None)
        assert exact.status == "converged" and exact.lower_bound == pytest.approx(optimum, rel=1e-11)


@pytest.mark.parametrize("seed", range(10))
def test_lagrangian_bound_is_below_the_numerator_minimum(seed):
    problem = stressed(small_problem(seed + 700), seed)
    lat, I = problem.latency, 3.0
    for L in problem.candidates.tolist():
        cols = np.arange(1, L + 1)
        vectors = np.array(list(product(cols.tolist(), repeat=problem.num_devices)))
        a, b = lat.stage_latencies(vectors, deepest=L)
        best = float((I * a + b).min())
        j = cols - 1
        bound = lagrangian_bound(lat.fp_up[:, j], lat.down_bp[:, j], lat.model_up[:, j], lat.model_down[:, j],
                                 lat.server_per_device[j], lat.delta[L - 1] - lat.delta[j], I,
                                 lat.system.edge_to_fed_bps, lat.system.fed_to_edge_bps, iterations=30)
        assert bound <= best * (1 + 1e-12)


def test_interval_bounds_never_exceed_the_optimum_at_any_interval():
    """From exact values at a few intervals, the concavity bound at every other integer I is ≤ the optimum there."""
    problem = small_problem(11)
    scale = problem.scale
    exact = {I: exhaustive_at_interval(problem, I) / scale for I in (3, 7, 12)}  # I < 3: the left extension
    intervals, bound = interval_bounds(problem, exact)
    for I, value in zip(intervals.tolist(), bound.tolist()):
        assert value <= exhaustive_at_interval(problem, I) / scale * (1 + 1e-12)
    for I, value in exact.items():
        assert bound[I - 1] == pytest.approx(value, rel=1e-12)


def test_plan_json_and_table_carry_the_certificate():
    problem = small_problem(4)
    profile, system = problem.latency.profile, problem.latency.system
    plan = Planner(profile, system, problem.convergence.constants).plan()
    data = plan.to_json()
    assert data["lower_bound_s"] <= brute_optimum(problem) * (1 + 1e-12)
    assert data["gap"] == pytest.approx((data["objective_s"] - data["lower_bound_s"]) / data["objective_s"])
    assert Plan.from_json(data) == plan
    assert "certificate:" in format_plan(plan, profile, system)


def test_certificate_with_loose_ms_bounds_is_not_rounded_up():
    """MS steps that only bound their optimum 0.5 % low: the certificate must stay ≤ the optimum (no
    'proven optimal' claim from a tolerance), while the exact steps prove the same plan optimal."""
    problem = small_problem(17)  # heterogeneous optimal cuts (5, 5, 6, 1): the separable bound alone is 49 % low
    best = solve_bcd(problem, multistart=True, certify=False)
    optimum = brute_optimum(problem)
    assert best.objective == pytest.approx(optimum, rel=1e-9)

    def loose(I, warm):
        result = solve_ms_exact(problem, I, max_sweeps=None)
        result.lower_bound *= 0.995
        return result

    cert = certify(problem, best, {}, loose)
    assert cert.lower_bound <= 0.995 * optimum * (1 + 1e-9) and cert.gap >= 0.004
    exact = certify(problem, best, {}, lambda I, warm: solve_ms_exact(problem, I, max_sweeps=None))
    assert exact.lower_bound == exact.objective == pytest.approx(optimum, rel=1e-9)


def test_bcd_with_a_weak_ms_step_reports_a_true_gap(monkeypatch):
    """An MS step that never improves (and bounds nothing) leaves BCD at its start: the reported bound
    stays below the optimum and the gap says how far the plan is."""
    import solvers.bcd as bcd_module
    from solvers.result import SolveResult

    def stuck(problem, interval, *, warm_cuts=None, cache=None, **options):
        cuts = tuple(warm_cuts)
        return SolveResult(cuts=cuts, interval=interval, objective=problem.objective(interval, cuts), status="budget",
                           method="threshold", backend="threshold", lower_bound=0.0)

    monkeypatch.setattr(bcd_module, "solve_ms_exact", stuck)
    problem = small_problem(17)
    optimum = brute_optimum(problem)
    result = solve_bcd(problem, ms_method="threshold", multistart=False)
    assert result.objective > optimum * 1.001
    assert result.lower_bound <= optimum * (1 + 1e-12)
    assert result.gap >= 1 - optimum / result.objective - 1e-12


def test_the_certificate_line_says_proven_optimal_only_at_a_zero_gap():
    import dataclasses

    problem = small_problem(4)
    profile, system = problem.latency.profile, problem.latency.system
    plan = Planner(profile, system, problem.convergence.constants).plan()
    proven = dataclasses.replace(plan, lower_bound_s=plan.objective_s, gap=0.0)
    assert "gap 0% (proven optimal)" in format_plan(proven, profile, system)
    open_gap = dataclasses.replace(plan, lower_bound_s=0.975 * plan.objective_s, gap=0.025)
    text = format_plan(open_gap, profile, system)
    assert "gap 2.5% (at most 2.5% above the optimum)" in text and "proven optimal" not in text
    assert "certificate:" not in format_plan(dataclasses.replace(plan, lower_bound_s=None, gap=None), profile, system)
