"""Planner and baseline contracts with instances where the checked term matters: the RMA interval range is the
spec's literal U{1..25}; AMS weighs the server's share (slow server); plans report rounds and objective at the
deepest cut L_c; re-planning warm-starts from the cuts in force; a fixed cut that admits no I raises."""

import math

import numpy as np
import pytest

import adaptplan.planner as planner_module
from adaptplan.constants import ConvergenceConstants
from adaptplan.errors import InfeasibleError
from adaptplan.planner import Planner, build_plan
from adaptplan.system import SystemSpec
from solvers.baselines import (RANDOM_INTERVAL_RANGE, ams_cuts, random_interval, solve_fixed_cut, solve_rma_ams,
                               solve_rma_ms, solve_rma_rms)
from solvers.problem import PlanningProblem
from tests import reference_model as ref
from tests.binding_instances import asymmetric_problem, parts
from tests.solver_instances import vgg16_problem


def test_random_interval_is_uniform_on_1_to_25():
    """§6.2 / §8 A12: I ~ U{1, …, 25} (literal spec values, not the code's constant)."""
    assert RANDOM_INTERVAL_RANGE == (1, 25)
    problem = vgg16_problem()
    assert problem.convergence.interval_bound(1) > 26  # the shallowest cut admits every I ≤ 25
    rng = np.random.default_rng(0)
    draws = [random_interval(problem, 1, rng) for _ in range(1000)]
    assert set(draws) == set(range(1, 26))
    counts = np.bincount(draws, minlength=26)[1:]
    assert counts.min() > 15 and counts.max() < 70  # ≈ 40 each


def test_random_interval_is_capped_by_feasibility():
    problem = vgg16_problem()
    conv = problem.convergence
    top = math.ceil(conv.interval_bound(15)) - 1  # deepest candidate: I_max < 25
    assert top < 25
    rng = np.random.default_rng(1)
    assert set(random_interval(problem, 15, rng) for _ in range(500)) == set(range(1, top + 1))


def test_random_baselines_draw_their_interval_from_1_to_25():
    problem = vgg16_problem()
    intervals = {solve_rma_ams(problem, seed=s).interval for s in range(60)}
    assert intervals <= set(range(1, 26)) and len(intervals) > 10
    for seed in range(5):
        result = solve_rma_rms(problem, seed=seed)
        assert 1 <= result.interval <= min(25, math.ceil(problem.convergence.interval_bound(max(result.cuts))) - 1)
    assert 1 <= solve_rma_ms(problem, seed=3).interval <= 25


def _own_round_time(profile, system, i, j):
    """Device i alone at cut j: (16)+(17)+(20)+(21) plus its share of (18)+(19) at full f_s."""
    b, d, p, last = system.batch_size, system.devices[i], profile.cut_points[j - 1], profile.cut_points[-1]
    return (b * p.fp_flops / d.flops + b * p.activation_bits / d.up_bps + b * p.gradient_bits / d.down_bps
            + b * p.bp_flops / d.flops + b * (last.fp_flops - p.fp_flops) / system.server_flops
            + b * (last.bp_flops - p.bp_flops) / system.server_flops)


@pytest.mark.parametrize("server_flops", [1e10, 3e11, 1e14])
def test_ams_cuts_weigh_the_servers_share(server_flops):
    base = vgg16_problem(num_devices=20, seed=2)
    profile, system, constants = parts(base)
    system = SystemSpec(**{**system.__dict__, "server_flops": server_flops})
    problem = PlanningProblem.from_parts(profile, system, constants)
    feasible = problem.feasible_candidates.tolist()
    expected = tuple(min(feasible, key=lambda j: _own_round_time(profile, system, i, j)) for i in range(20))
    assert ams_cuts(problem) == expected
    if server_flops == 1e10:  # a slow server pushes every device to its deepest feasible cut
        assert expected == (max(feasible),) * 20
    assert solve_rma_ams(problem, seed=0).cuts == expected


def test_fixed_cut_that_admits_no_interval_raises():
    """Growing G_j²: the deeper candidates violate c − d(ℓ)·1² > 0, so fixing every device there must raise."""
    base = asymmetric_problem(4, num_devices=2, num_cuts=5)
    profile, system, constants = parts(base)
    c = ref.c_value(constants, 2)
    k = 4 * constants.beta ** 2 * constants.gamma ** 2
    G2 = (0.2 * c / k, 0.2 * c / k, 0.2 * c / k, 0.6 * c / k, 0.1 * c / k)  # A_ℓ k/c = 0.2, 0.4, 0.6, 1.2, 1.3
    problem = PlanningProblem.from_parts(profile, system, ConvergenceConstants(**{**constants.__dict__, "G2": G2}))
    assert problem.feasible_candidates.tolist() == [1, 2, 3]
    for cut in (1, 2, 3):
        assert solve_fixed_cut(problem, cut).success
    with pytest.raises(InfeasibleError, match="I must be <"):
        solve_fixed_cut(problem, 4)


def test_plans_report_rounds_and_objective_at_the_deepest_cut():
    problem = asymmetric_problem(110, num_devices=3, num_cuts=5)
    profile, system, constants = parts(problem)
    for cuts in ((1, 3, 2), (3, 1, 1), (2, 2, 4), (4, 1, 4)):
        interval = 3
        plan = build_plan(problem, cuts, interval, {"method": "given"})
        rounds, aggregations, total = ref.exact_total(profile, system, constants, interval, cuts)
        assert (plan.rounds, plan.aggregations) == (rounds, aggregations)
        assert plan.total_latency_s == pytest.approx(total, rel=1e-12)
        assert plan.objective_s == pytest.approx(ref.objective(profile, system, constants, interval, cuts), rel=1e-12)
        assert plan.deepest_cut == max(cuts)


def test_replan_warm_starts_from_the_cuts_in_force(monkeypatch):
    problem = asymmetric_problem(111, num_devices=3, num_cuts=5)
    profile, system, constants = parts(problem)
    planner = Planner(profile, system, constants)
    first = planner.plan()
    seen = []
    real = planner_module.solve_bcd

    def spy(problem, **kwargs):
        seen.append(kwargs.get("initial_cuts"))
        return real(problem, **kwargs)

    monkeypatch.setattr(planner_module, "solve_bcd", spy)
    for cuts in ((3, 1, 2), (1, 1, 1)):
        warm = build_plan(planner.problem, cuts, first.interval, {"method": "given"})
        again = planner.replan(system=system, warm_start=warm)
        assert tuple(seen[-1]) == cuts
        assert again.objective_s <= warm.objective_s * (1 + 1e-12)
    planner.replan()
    assert seen[-1] is None
    two = asymmetric_problem(111, num_devices=2, num_cuts=5)
    planner.replan(warm_start=build_plan(two, (1, 2), 1, {}))
    assert seen[-1] is None  # a warm start for another number of devices is ignored


def _steep_problem():
    """A_1 small, A_2 large: I_max(1) ≥ 25 but I_max(ℓ ≥ 2) = 3, so the cut that bounds a random I matters."""
    base = asymmetric_problem(4, num_devices=3, num_cuts=5)
    profile, system, constants = parts(base)
    c = ref.c_value(constants, 3)
    k = 4 * constants.beta ** 2 * constants.gamma ** 2
    A1, A2 = c / (k * 30.0 ** 2), c / (k * 3.5 ** 2)  # I_max(1) = 29, I_max(2) = 3
    G2 = (A1, A2 - A1, 1e-9, 1e-9, 1e-9)
    problem = PlanningProblem.from_parts(profile, system, ConvergenceConstants(**{**constants.__dict__, "G2": G2}))
    assert ref.max_interval(problem.convergence.constants, 3, 1) == 29
    assert [ref.max_interval(problem.convergence.constants, 3, cut) for cut in (2, 3, 4)] == [3, 3, 3]
    return problem


def test_rma_ms_draws_up_to_25_for_the_shallowest_cut():
    """RMA+MS draws I ~ U{1..25} ∩ feasible for the shallowest candidate (I_max = 29 here), then MS at that I."""
    problem = _steep_problem()
    results = [solve_rma_ms(problem, seed=s) for s in range(40)]
    intervals = {r.interval for r in results}
    assert max(intervals) > 3 and intervals <= set(range(1, 26))
    for r in results:
        assert r.success and r.status == "policy" and math.isfinite(r.objective)
        value, _, _ = ref.brute_force(*parts(problem), problem.candidates.tolist(), [r.interval])
        assert r.objective == pytest.approx(value, rel=1e-7)


def test_rma_baselines_bound_the_interval_by_their_deepest_cut():
    """RMA+AMS / RMA+RMS: I must be feasible for L_c = max(cuts), not for a shallower device's cut."""
    problem = _steep_problem()
    for seed in range(30):
        for result in (solve_rma_ams(problem, seed=seed), solve_rma_rms(problem, seed=seed)):
            top = ref.max_interval(problem.convergence.constants, 3, max(result.cuts))
            assert 1 <= result.interval <= min(25, top)
            assert result.success and result.status == "policy"
    ams = ams_cuts(problem)
    assert len(set(ams)) > 1 and min(ams) == 1  # heterogeneous: min(cuts) would allow I up to 25
    assert {solve_rma_ams(problem, seed=s).interval for s in range(30)} == {1, 2, 3}


def test_replan_with_new_constants_and_system_uses_them():
    problem = asymmetric_problem(111, num_devices=3, num_cuts=5)
    profile, system, constants = parts(problem)
    planner = Planner(profile, system, constants)
    planner.plan()
    looser = ConvergenceConstants(**{**constants.__dict__, "epsilon": 0.3, "G2": tuple(10 * g for g in constants.G2)})
    plan = planner.replan(constants=looser)
    assert planner.constants == looser and planner.problem.convergence.constants == looser
    value, interval, cuts = ref.brute_force(profile, system, looser, problem.candidates.tolist())
    assert plan.objective_s == pytest.approx(value, rel=1e-3)
    assert plan.rounds == ref.exact_total(profile, system, looser, plan.interval, plan.cuts)[0]
    faster = SystemSpec(**{**system.__dict__, "server_flops": 1e15, "edge_to_fed_bps": 1e10, "fed_to_edge_bps": 1e10})
    plan = planner.replan(system=faster)
    assert planner.system == faster and planner.constants == looser
    assert plan.total_latency_s == pytest.approx(ref.exact_total(profile, faster, looser, plan.interval, plan.cuts)[2],
                                                 rel=1e-12)
