"""Baseline policies (docs/model.md §6.2, §8 A12) against AdaptSFL's BCD."""

import math

import pytest

from adaptplan.errors import InputError
from solvers.baselines import (
    BASELINES,
    RANDOM_INTERVAL_RANGE,
    ams_cuts,
    dama_interval,
    solve_fixed_cut,
    solve_ma_rms,
    solve_psl,
    solve_rma_ams,
    solve_rma_ms,
    solve_rma_rms,
    solve_sfl,
)
from solvers.bcd import solve_bcd
from solvers.dinkelbach import solve_dinkelbach
from solvers.exact import solve_exhaustive
from solvers.interval import best_interval
from tests.solver_instances import small_problem, vgg16_problem


@pytest.fixture(scope="module")
def vgg():
    problem = vgg16_problem()
    return problem, solve_bcd(problem)


def test_every_baseline_is_no_better_than_bcd(vgg):
    problem, bcd = vgg
    for name, policy in BASELINES.items():
        for seed in range(3):
            result = policy(problem, seed, "highs")
            assert result.method == name
            assert len(result.cuts) == problem.num_devices
            assert result.objective >= bcd.objective * (1 - 1e-9), name
            if name != "psl":
                assert result.success and result.objective == pytest.approx(problem.objective(result.interval, result.cuts))


def test_random_policies_are_seeded_and_in_range(vgg):
    problem, _ = vgg
    feasible = set(problem.feasible_candidates.tolist())
    for policy in (solve_rma_rms, solve_ma_rms):
        a, b = policy(problem, seed=4), policy(problem, seed=4)
        assert (a.cuts, a.interval) == (b.cuts, b.interval)
        assert set(a.cuts) <= feasible
    intervals = {solve_rma_rms(problem, seed=s).interval for s in range(40)}
    assert len(intervals) > 5 and all(RANDOM_INTERVAL_RANGE[0] <= I <= RANDOM_INTERVAL_RANGE[1] for I in intervals)
    rma_ms = solve_rma_ms(problem, seed=1)
    assert rma_ms.objective == pytest.approx(solve_dinkelbach(problem, rma_ms.interval).objective, rel=1e-9)


def test_ma_rms_uses_theorem_2(vgg):
    problem, _ = vgg
    result = solve_ma_rms(problem, seed=2)
    a, b = problem.stage_latencies(result.cuts)
    assert result.interval == best_interval(a, b, problem.convergence.c, problem.convergence.d(max(result.cuts)))


def test_dama_interval_is_depth_aware(vgg):
    problem, _ = vgg
    shallow, deep = dama_interval(problem, [1] * 20), dama_interval(problem, [10] * 20)
    assert shallow > deep >= 1
    conv = problem.convergence
    assert conv.d(10) * deep**2 <= 0.5 * conv.c < conv.d(10) * (deep + 1) ** 2


def test_ams_cuts_minimise_each_devices_round_time(vgg):
    problem, _ = vgg
    cuts = ams_cuts(problem)
    lat = problem.latency
    for i, cut in enumerate(cuts):
        own = lambda j: lat.fp_up[i, j - 1] + lat.down_bp[i, j - 1] + lat.server_fp_per_device[j - 1] + lat.server_bp_per_device[j - 1]
        assert all(own(cut) <= own(j) + 1e-15 for j in problem.feasible_candidates)
    assert solve_rma_ams(problem, seed=0).cuts == cuts


def test_fixed_cut_sfl_and_psl(vgg):
    problem, bcd = vgg
    best_fixed = min(solve_fixed_cut(problem, c).objective for c in problem.feasible_candidates)
    assert best_fixed >= bcd.objective * (1 - 1e-9)
    sfl = solve_sfl(problem)
    assert sfl.interval == 1 and sfl.objective > bcd.objective  # §6.3: adaptive MA beats I = 1
    psl = solve_psl(problem)
    assert not psl.success and psl.status == "unbounded_drift" and math.isinf(psl.objective)
    assert psl.history[0]["round_latency_s"] == pytest.approx(problem.latency.t_split(psl.cuts))
    with pytest.raises(InputError):
        solve_fixed_cut(problem, 99)


def test_sfl_equals_brute_force_at_interval_one():
    problem = small_problem(11, num_devices=3, num_cuts=4)
    sfl = solve_sfl(problem)
    brute = min(problem.objective(1, cuts) for cuts in __import__("itertools").product(problem.candidates.tolist(), repeat=3))
    assert sfl.objective == pytest.approx(brute, rel=1e-9)
    assert solve_exhaustive(problem).objective <= sfl.objective


def test_dama_interval_never_goes_below_one_even_past_the_budget() -> None:
    """I = max(1, ⌊√(κc/d(L_c))⌋) capped by the largest feasible interval — and still 1, the smallest
    interval there is, when even I = 1 breaks c − d(L_c)·I² > 0."""
    from adaptplan.constants import ConvergenceConstants
    from solvers.problem import PlanningProblem

    base = small_problem(5, num_devices=3, num_cuts=4)
    L = base.latency.profile.num_cuts
    k = base.convergence.constants
    # d(ℓ) = 4β²γ²·Σ_{j≤ℓ} G_j²: cut 1 is feasible, from cut 2 on d(ℓ) exceeds c = ε − (βγ/N)Σσ²
    G2 = (1e-4,) + (100.0,) * (L - 1)
    constants = ConvergenceConstants(beta=k.beta, gamma=k.gamma, theta=k.theta, epsilon=k.epsilon, sigma2=k.sigma2, G2=G2)
    problem = PlanningProblem.from_parts(base.latency.profile, base.latency.system, constants)
    assert problem.convergence.c - problem.convergence.d(2) <= 0 < problem.convergence.c - problem.convergence.d(1)
    assert dama_interval(problem, [1, 2, 1]) == 1
    c, d = base.convergence.c, base.convergence.d(2)
    assert dama_interval(base, [1, 2, 1], budget=0.5) == max(1, int((0.5 * c / d) ** 0.5))
