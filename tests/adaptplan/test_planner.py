"""The planner and the planning commands: planner and baseline contracts on instances where the checked
term matters (the RMA interval range, AMS's server share, rounds and objective at the deepest cut,
warm-started re-planning, a fixed cut that admits no I), the planner's last result, limits and gap,
the command line's interrupt line and messages, and plans, systems and profiles on disk."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

import adaptplan.planner as planner_module
from adaptplan.cli import main
from adaptplan.cli.commands import system as system_command
from adaptplan.constants import ConvergenceConstants
from adaptplan.errors import InfeasibleError, InputError
from adaptplan.fileio import non_empty_list, show
from adaptplan.model_profile import ModelProfile
from adaptplan.plan import Plan
from adaptplan.planner import Planner, build_plan
from adaptplan.report import memory_bound
from adaptplan.system import SystemRanges, SystemSpec, generate_system
from solvers.baselines import RANDOM_INTERVAL_RANGE, ams_cuts, random_interval, solve_fixed_cut, solve_rma_ams, solve_rma_ms, solve_rma_rms
from solvers.problem import PlanningProblem
from solvers.synthetic import synthetic_profile
from tests import reference_model as ref
from tests.binding_instances import asymmetric_problem, parts
from tests.solver_instances import vgg16_problem


# ---- from test_planner_contracts.py (merged by subject) ----------------------------------------
def test_random_interval_is_uniform_on_1_to_25(vgg16):
    """§6.2 / §8 A12: I ~ U{1, …, 25} (literal spec values, not the code's constant)."""
    assert RANDOM_INTERVAL_RANGE == (1, 25)
    problem = vgg16
    assert problem.convergence.interval_bound(1) > 26  # the shallowest cut admits every I ≤ 25
    rng = np.random.default_rng(0)
    draws = [random_interval(problem, 1, rng) for _ in range(1000)]
    assert set(draws) == set(range(1, 26))
    counts = np.bincount(draws, minlength=26)[1:]
    assert counts.min() > 15 and counts.max() < 70  # ≈ 40 each


def test_random_interval_is_capped_by_feasibility(vgg16):
    problem = vgg16
    conv = problem.convergence
    top = math.ceil(conv.interval_bound(15)) - 1  # deepest candidate: I_max < 25
    assert top < 25
    rng = np.random.default_rng(1)
    assert set(random_interval(problem, 15, rng) for _ in range(500)) == set(range(1, top + 1))


def test_random_baselines_draw_their_interval_from_1_to_25(vgg16):
    problem = vgg16
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


# ---- from test_planner_fresh.py (merged by subject) ----------------------------------------
def test_an_interrupted_command_says_so_in_one_line_and_exits_130(monkeypatch, capsys) -> None:
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(system_command, "run", interrupted)
    assert main(["system", "--devices", "2"]) == 130
    captured = capsys.readouterr()
    assert captured.err == "adaptplan system: interrupted\n" and captured.out == ""


def test_system_to_a_file_names_the_file_and_the_devices(tmp_path, capsys) -> None:
    target = tmp_path / "s.json"
    assert main(["system", "--devices", "3", "--seed", "4", "-o", str(target)]) == 0
    captured = capsys.readouterr()
    assert captured.err == f"wrote {target} (3 devices)\n" and captured.out == ""
    assert len(json.loads(target.read_text())["devices"]) == 3


# ---- file values: lists, messages -----------------------------------------------------------------------
def test_a_list_may_hold_exactly_max_items() -> None:
    assert non_empty_list([1, 2, 3], "x", max_items=3) == [1, 2, 3]
    with pytest.raises(InputError, match=r"^x: must have at most 3 entries, got 4$"):
        non_empty_list([1, 2, 3, 4], "x", max_items=3)


def test_show_cuts_long_text_and_describes_huge_integers() -> None:
    text = "a" * 100
    assert show(text) == repr(text)[:57] + "..." and len(show(text)) == 60
    assert show("a" * 58) == repr("a" * 58)                       # 60 characters with its quotes: kept whole
    assert show(10**200) == "an integer of about 201 digits"
    assert show(2**128 - 1) == repr(2**128 - 1)                    # 128 bits: still printed
    assert show(2**128) == "an integer of about 39 digits"         # 129 bits: ⌊129·log10 2⌋ + 1
    assert show(True) == "True"


# ---- the planner -------------------------------------------------------------------------------------------
def _parts(num_cuts: int = 5, devices: int = 3):
    return synthetic_profile(num_cuts, seed=1), generate_system(devices, 0), ConvergenceConstants.placeholder(num_cuts)


def test_the_planner_keeps_the_solver_result_of_its_last_plan() -> None:
    profile, system, constants = _parts()
    planner = Planner(profile, system, constants)
    assert planner.last_result is None
    plan = planner.plan()
    assert planner.last_result.cuts == plan.cuts and planner.last_result.interval == plan.interval


def test_the_planner_refuses_an_interval_bound_beyond_its_limit() -> None:
    profile, system, constants = _parts()
    tiny = dataclasses.replace(constants, G2=(1e-30,) * profile.num_cuts)
    with pytest.raises(InputError, match=r"^constants\.G2: the smallest non-zero G_j\^2 gives an interval bound"):
        Planner(profile, system, tiny)


def test_a_plans_gap_is_relative_to_its_objective() -> None:
    profile, system, constants = _parts()
    problem = Planner(profile, system, constants).problem
    exact = build_plan(problem, (1, 1, 1), 2, {})
    bounded = build_plan(problem, (1, 1, 1), 2, {}, lower_bound=0.75 * exact.objective_s)
    assert bounded.lower_bound_s == pytest.approx(0.75 * exact.objective_s)
    assert bounded.gap == pytest.approx(0.25)


# ---- plans and systems on disk -------------------------------------------------------------------------------
def test_a_plan_with_no_aggregation_round_trips(tmp_path) -> None:
    profile, system, constants = _parts()
    plan = build_plan(Planner(profile, system, constants).problem, (2, 1, 2), 3, {"method": "given"})
    data = plan.to_json()
    data.update(rounds=2, aggregations=0)                          # fewer rounds than I: no aggregation yet
    again = Plan.from_json(data)
    assert (again.rounds, again.aggregations) == (2, 0)
    again.save(tmp_path / "p.json")
    assert Plan.load(tmp_path / "p.json") == again


def test_a_system_round_trips_through_its_file(tmp_path) -> None:
    system = generate_system(4, 9)
    system.save(tmp_path / "s.json")
    assert SystemSpec.load(tmp_path / "s.json") == system


def test_memory_budgets_are_checked_per_device(tmp_path) -> None:
    data = generate_system(3, 1).to_json()
    data["devices"][0]["memory_bytes"] = 1e9
    data["devices"][1]["memory_bytes"] = -5.0
    data["devices"][2]["memory_bytes"] = 1e9
    with pytest.raises(InputError, match=r"^system\.devices\[1\]\.memory_bytes: "):
        SystemSpec.from_json(data)
    data["devices"][1]["memory_bytes"] = 1e9
    del data["devices"][2]["memory_bytes"]
    with pytest.raises(InputError, match=r"device 2 lacks it"):
        SystemSpec.from_json(data)
    for d in data["devices"]:
        d.pop("memory_bytes", None)
    data["devices"][1]["memory_bytes"] = 1e9                      # device 0 has none, device 1 has one
    with pytest.raises(InputError, match=r"^system\.devices\[1\]\.memory_bytes: .*device 1 has it but device 0 does not"):
        SystemSpec.from_json(data)


def test_ranges_need_a_positive_batch_size() -> None:
    assert SystemRanges().batch_size == 16
    with pytest.raises(InputError, match=r"^batch_size: "):
        SystemRanges(batch_size=0)


def test_a_profiles_timing_must_be_an_object() -> None:
    data = synthetic_profile(4, seed=2).to_json()
    data["timing"] = [1, 2]
    with pytest.raises(InputError, match=r"^profile\.timing: must be an object$"):
        ModelProfile.from_json(data)


def test_a_profiles_identity_names_it_and_hashes_its_structure() -> None:
    profile = synthetic_profile(4, seed=2)
    identity = profile.identity()
    assert identity["name"] == profile.model and identity["num_cuts"] == 4
    structure = [[c.name, float(c.activation_bits), float(c.client_param_bits)] for c in profile.cut_points]
    expected = hashlib.sha256(json.dumps([list(profile.input_shape), structure]).encode()).hexdigest()
    assert identity["structure_sha256"] == expected


def test_a_device_is_memory_bound_when_a_cut_up_to_the_deepest_does_not_fit() -> None:
    """memory_bound: some cut j with ℓ_i < j ≤ L_c needs more than device i's memory_bytes."""
    profile = synthetic_profile(4, seed=0)
    points = tuple(dataclasses.replace(c, client_memory_bytes=100.0 * (k + 1)) for k, c in enumerate(profile.cut_points))
    profile = dataclasses.replace(profile, cut_points=points, memory={"batch_size": 16, "optimizer": "sgd"})  # 100..400 B
    system = generate_system(3, 0)
    budgets = (250.0, 1000.0, 150.0)
    system = dataclasses.replace(system, devices=tuple(dataclasses.replace(d, memory_bytes=m)
                                                       for d, m in zip(system.devices, budgets)))
    # deepest cut 3: device 0 (cut 1) would need 300 > 250 at j = 3; device 1 is the deepest; device 2
    # (cut 2) would need 300 > 150 at j = 3
    bound = memory_bound(SimpleNamespace(cuts=(1, 3, 2), deepest_cut=3), profile, system)
    assert bound.tolist() == [True, False, True]
    assert memory_bound(SimpleNamespace(cuts=(1, 2, 1), deepest_cut=2), profile, system).tolist() == [False, False, True]
    assert memory_bound(SimpleNamespace(cuts=(1, 3, 2), deepest_cut=3), profile, generate_system(3, 0)) is None
