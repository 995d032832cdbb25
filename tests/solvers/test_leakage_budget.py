"""Plans under a leakage budget (issue 71 item 4; solvers/leakage_budget.py, adaptplan/leakage_table.py): the
admissible matrix written out, the budgeted optimum equal to a brute force over the cuts within each device's budget,
a loose budget giving the unbudgeted plan, an infeasible budget naming the device and the smallest feasible budget,
and the command line from `profile --leakage-out` to `plan --max-leakage`."""

from __future__ import annotations

import json
from itertools import product

import numpy as np
import pytest

from adaptplan.cli import main
from adaptplan.errors import InputError
from adaptplan.leakage_table import LeakageTable, parse_budget
from adaptplan.planner import Planner
from solvers.bcd import solve_bcd
from solvers.leakage_budget import LeakageBudget
from solvers.problem import PlanningProblem
from tests.solver_instances import small_problem


def test_the_admissible_matrix_is_the_limits_written_out() -> None:
    """dCor at most the limit, MSE at least it; cut L never admitted."""
    dcor = LeakageBudget("dcor", np.array([0.9, 0.8, 0.6]), np.array([0.85, 0.6, 1.0]))
    assert dcor.admissible(3, 4).tolist() == [[False, True, True, False], [False, False, True, False],
                                              [True, True, True, False]]
    mse = LeakageBudget("mse", np.array([0.01, 0.02, 0.03]), np.array([0.02, 0.05]))
    assert mse.admissible(2, 4).tolist() == [[False, True, True, False], [False, False, False, False]]
    assert dcor.least(np.array([1, 2])) == (0.8, 2) and mse.least(np.array([1, 3])) == (0.03, 3)
    with pytest.raises(InputError, match="unknown leakage figure"):
        LeakageBudget("leak", np.array([0.1]), np.array([1.0]))
    with pytest.raises(InputError, match="2 interior"):
        dcor.admissible(3, 3)


def with_budget(problem: PlanningProblem, seed: int, strict_device: int = 0) -> tuple[PlanningProblem, np.ndarray]:
    """``problem`` under a dCor budget from a random decreasing table: one device allowed only its two deepest
    candidates, the others a random limit that still admits their deepest candidate."""
    rng = np.random.default_rng(seed)
    L = problem.num_cuts
    values = np.sort(rng.uniform(0.3, 1.0, L - 1))[::-1]
    deepest = values[problem.candidates[problem.candidates < L] - 1]
    limits = rng.uniform(deepest.min(), 1.0, problem.num_devices)
    limits[strict_device] = np.sort(deepest)[min(1, deepest.size - 1)]
    budget = LeakageBudget("dcor", values, limits)
    return PlanningProblem.from_parts(problem.latency.profile, problem.latency.system, problem.convergence.constants,
                                      candidates=problem.candidates, leakage=budget), limits


def within(problem: PlanningProblem) -> list[list[int]]:
    """Per device, the candidates whose figure is within its limit (from the raw table)."""
    budget = problem.leakage
    assert budget is not None
    return [[int(j) for j in problem.candidates if j < problem.num_cuts and budget.values[j - 1] <= limit]
            for limit in budget.limits]


@pytest.mark.parametrize("seed", range(8))
def test_the_budgeted_plan_is_the_optimum_over_the_cuts_within_budget(seed: int) -> None:
    problem, _ = with_budget(small_problem(seed), seed)
    allowed = within(problem)
    assert any(len(ok) < problem.candidates.size for ok in allowed)          # the budget binds
    best = min(problem.objective(interval, cuts) for cuts in product(*allowed) for interval in range(1, 150))
    plan = solve_bcd(problem)
    assert all(c in ok for c, ok in zip(plan.cuts, allowed))
    assert plan.objective == pytest.approx(best, rel=1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_a_loose_budget_plans_as_no_budget(seed: int) -> None:
    problem = small_problem(seed)
    L = problem.num_cuts
    loose = LeakageBudget.uniform("dcor", np.linspace(0.9, 0.5, L - 1), 1.0, problem.num_devices)
    profile, system, constants = problem.latency.profile, problem.latency.system, problem.convergence.constants
    free = Planner(profile, system, constants, candidates=problem.candidates).plan()
    bound = Planner(profile, system, constants, candidates=problem.candidates, leakage=loose).plan()
    assert (bound.cuts, bound.interval, bound.objective_s) == (free.cuts, free.interval, free.objective_s)


def test_an_infeasible_budget_names_the_device_and_the_smallest_feasible_budget() -> None:
    problem = small_problem(3)
    L = problem.num_cuts
    values = np.linspace(0.95, 0.6, L - 1)
    limits = np.full(problem.num_devices, 1.0)
    limits[1] = 0.5
    with pytest.raises(InputError) as info:
        PlanningProblem.from_parts(problem.latency.profile, problem.latency.system, problem.convergence.constants,
                                   leakage=LeakageBudget("dcor", values, limits))
    least = values[problem.candidates[problem.candidates < L] - 1].min()
    assert info.value.field == "max_leakage[1]"
    assert f"a budget of at least {least:g} is feasible" in info.value.message and "device 1's budget" in info.value.message


def test_parse_budget_and_a_table_of_another_model() -> None:
    assert parse_budget("dcor=0.9") == ("dcor", (0.9,)) and parse_budget(" mse =0.02") == ("mse", (0.02,))
    assert parse_budget("psnr=12,14.5,9", 3) == ("psnr", (12.0, 14.5, 9.0))
    assert parse_budget("psnr=12", 3) == ("psnr", (12.0,))
    with pytest.raises(InputError, match="2 limits for 3 devices") as info:
        parse_budget("psnr=12,14", 3)
    assert info.value.field == "--max-leakage"
    for bad in ("dcor", "dcor=x", "leak=1", "dcor=nan", "dcor=0.5,", "dcor=0.5,inf"):
        with pytest.raises(InputError) as info:
            parse_budget(bad)
        assert info.value.field == "--max-leakage"
    problem = small_problem(1)
    profile = problem.latency.profile
    table = LeakageTable({"name": "other", "num_cuts": profile.num_cuts, "structure_sha256": "0" * 64}, "synthetic", 8,
                         {"dcor": [0.5] * (profile.num_cuts - 1)})
    with pytest.raises(InputError) as info:
        table.figure(profile, "dcor")
    assert info.value.field == "--leakage-table" and "not on the profile's" in info.value.message
    assert LeakageTable.from_json(table.to_json()) == table
    broken = table.to_json() | {"figures": {"dcor": [0.5]}}
    with pytest.raises(InputError, match="finite numbers, one per cut"):
        LeakageTable.from_json(broken)


def test_profile_writes_the_table_and_plan_keeps_every_device_within_it(tmp_path, capsys) -> None:
    """`profile --leakage --leakage-out` then `plan --leakage-table --max-leakage`: every planned cut's dCor is within
    the limit; a budget below every cut's is one message naming the smallest feasible one, exit 2."""
    profile, leak = tmp_path / "profile.json", tmp_path / "leak.json"
    assert main(["profile", "mlp", "--input", "1x8x8", "-o", str(profile), "--leakage", "--dataset", "synthetic",
                 "--leakage-samples", "64", "--leakage-out", str(leak)]) == 0
    figures = json.loads(leak.read_text())["figures"]
    assert set(figures) == {"dcor", "norm_auc", "direction_auc"} and len(figures["dcor"]) == 2
    limit = max(figures["dcor"])                      # admits the cut of the largest dCor too: the free plan
    plan = tmp_path / "plan.json"
    assert main(["plan", "--profile", str(profile), "--devices", "4", "--leakage-table", str(leak), "--max-leakage",
                 f"dcor={min(figures['dcor'])}", "-o", str(plan)]) == 0
    cuts = json.loads(plan.read_text())["cuts"]
    assert all(figures["dcor"][c - 1] <= min(figures["dcor"]) for c in cuts)
    assert "leakage budget: dcor=" in (out := capsys.readouterr().out) and "(initial weights)" in out
    assert "the table holds for the model at those weights only" in out and "--leakage-every N" in out
    worst = tmp_path / "worst.json"
    worst.write_text(json.dumps(json.loads(leak.read_text()) | {"weights": "worst of rounds 0, 5, 10"}))
    assert main(["plan", "--profile", str(profile), "--devices", "4", "--leakage-table", str(worst), "--max-leakage",
                 f"dcor={limit}"]) == 0
    out = capsys.readouterr().out
    assert "(worst of rounds 0, 5, 10 weights)" in out and "holds for the model at those weights only" not in out
    assert main(["plan", "--profile", str(profile), "--devices", "4", "--leakage-table", str(leak), "--max-leakage",
                 f"dcor={limit}"]) == 0
    capsys.readouterr()
    assert main(["plan", "--profile", str(profile), "--devices", "4", "--leakage-table", str(leak), "--max-leakage",
                 f"dcor={min(figures['dcor']) / 2}"]) == 2
    err = capsys.readouterr().err
    assert "admits no candidate cut" in err and "is feasible" in err
    assert main(["plan", "--profile", str(profile), "--max-leakage", "dcor=0.5"]) == 2
    assert "--max-leakage needs --leakage-table FILE" in capsys.readouterr().err
    # one limit per device: device 2 alone held to the least-leaking cut, the others free
    strict, loose = min(figures["dcor"]), max(figures["dcor"])
    assert main(["plan", "--profile", str(profile), "--devices", "4", "--leakage-table", str(leak), "--max-leakage",
                 f"dcor={loose},{loose},{strict},{loose}", "-o", str(plan)]) == 0
    capsys.readouterr()
    cuts = json.loads(plan.read_text())["cuts"]
    assert figures["dcor"][cuts[2] - 1] <= strict
    assert any(figures["dcor"][c - 1] > strict for c in cuts)     # the others are not held to device 2's limit
    assert main(["plan", "--profile", str(profile), "--devices", "4", "--leakage-table", str(leak), "--max-leakage",
                 f"dcor={loose},{loose},{strict / 2},{loose}"]) == 2
    assert "device 2's budget" in capsys.readouterr().err
    assert main(["plan", "--profile", str(profile), "--devices", "4", "--leakage-table", str(leak), "--max-leakage",
                 f"dcor={loose},{loose}"]) == 2
    assert "2 limits for 4 devices" in capsys.readouterr().err


def test_memory_and_budget_both_bind() -> None:
    """A device's admissible cuts are those that fit its memory and are within its budget, not either: the plan's
    cuts satisfy both, and the matrix is the conjunction of the two written out."""
    from solvers.instances import adversarial_problem

    for seed in range(40):
        try:
            base = adversarial_problem(3, 6, seed, memory_bytes=(1e6, 1e9))
        except InputError:                      # a device that fits no cut: another seed
            continue
        memory = base.admissible
        if memory is None or memory[:, :-1].all():
            continue
        values = np.linspace(0.9, 0.4, base.num_cuts - 1)
        limit = float(values[1:][memory[:, 1:-1].all(axis=0)].max()) if memory[:, 1:-1].all(axis=0).any() else None
        if limit is None:
            continue
        budget = LeakageBudget.uniform("dcor", values, limit, 3)
        try:
            problem = PlanningProblem.from_parts(base.latency.profile, base.latency.system, base.convergence.constants,
                                                 leakage=budget)
        except InputError:
            continue
        expected = memory & budget.admissible(3, base.num_cuts)
        assert problem.admissible is not None and problem.admissible.tolist() == expected.tolist()
        assert (expected != memory).any() and (expected != budget.admissible(3, base.num_cuts)).any()
        plan = solve_bcd(problem)
        assert all(expected[i, c - 1] for i, c in enumerate(plan.cuts))
        return
    pytest.fail("no seed gave memory and budget that both bind")
