"""Device memory budgets (issue 16): every solver honours them, against a brute force written here;
bad memory input is one message and exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from itertools import product

import numpy as np
import pytest

from adaptplan.errors import InputError
from adaptplan.model_profile import ModelProfile
from adaptplan.planner import Planner
from adaptplan.report import format_plan
from adaptplan.system import SystemSpec
from solvers.baselines import BASELINES, ams_cuts
from solvers.bcd import solve_bcd
from solvers.dinkelbach import solve_dinkelbach
from solvers.exact import solve_exact
from solvers.problem import PlanningProblem
from solvers.threshold import solve_ms_exact
from tests.solver_instances import small_problem


def with_memory(problem: PlanningProblem, seed: int) -> PlanningProblem:
    """``problem`` with non-monotone client memory per cut and per-device budgets that rule out some
    cuts for some devices (every device keeps at least its cheapest cut)."""
    rng = np.random.default_rng(seed)
    profile, system = problem.latency.profile, problem.latency.system
    need = rng.uniform(1e6, 1e8, profile.num_cuts)
    cuts = tuple(replace(c, client_memory_bytes=float(m)) for c, m in zip(profile.cut_points, need))
    profile = replace(profile, cut_points=cuts, memory={"batch_size": system.batch_size, "optimizer": "adam"})
    cand_need = np.sort(need[problem.candidates - 1])
    budgets = rng.uniform(cand_need[0], cand_need[-1] * 1.2, system.num_devices)
    budgets[0] = cand_need[min(1, cand_need.size - 1)]  # device 0: at most two candidate cuts fit
    system = replace(system, devices=tuple(replace(d, memory_bytes=float(b)) for d, b in zip(system.devices, budgets)))
    return PlanningProblem.from_parts(profile, system, problem.convergence.constants, candidates=problem.candidates)


def fitting(problem: PlanningProblem) -> list[list[int]]:
    """Per device, the candidate cuts whose client memory fits its budget (from the raw fields)."""
    need = [c.client_memory_bytes for c in problem.latency.profile.cut_points]
    return [[int(j) for j in problem.candidates if need[j - 1] <= d.memory_bytes] for d in problem.latency.system.devices]


def brute(problem: PlanningProblem, interval: int | None = None) -> float:
    """min of (28) over every memory-feasible cut vector and (given or every feasible) I, by enumeration."""
    vectors = np.array(list(product(*fitting(problem))))
    a, b = problem.latency.stage_latencies(vectors)
    conv = problem.convergence
    d = conv.d_per_cut[vectors.max(axis=1) - 1]
    intervals = [interval] if interval else range(1, 200)
    best = np.inf
    for I in intervals:
        margin = conv.c - d * I * I
        values = np.where(margin > 0, problem.scale * (I * a + b) / (I * np.where(margin > 0, margin, 1.0)), np.inf)
        best = min(best, float(values.min()))
    return best


def fits(problem: PlanningProblem, cuts) -> bool:
    return all(c in ok for c, ok in zip(cuts, fitting(problem)))


@pytest.mark.parametrize("seed", range(12))
def test_constrained_optima_match_brute_force(seed):
    problem = with_memory(small_problem(seed), seed)
    assert any(len(ok) < problem.candidates.size for ok in fitting(problem))  # the budgets bind
    optimum = brute(problem)
    exact = solve_exact(problem)
    assert fits(problem, exact.cuts) and exact.objective == pytest.approx(optimum, rel=1e-9)
    plan = solve_bcd(problem)
    assert fits(problem, plan.cuts) and plan.objective >= optimum * (1 - 1e-12)
    assert plan.objective == pytest.approx(optimum, rel=1e-9)
    for interval in (1, plan.interval):
        at_interval = brute(problem, interval)
        if np.isfinite(at_interval):
            for ms in (solve_ms_exact(problem, interval, max_sweeps=None), solve_dinkelbach(problem, interval)):
                assert fits(problem, ms.cuts) and ms.objective == pytest.approx(at_interval, rel=1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_baselines_only_use_cuts_that_fit(seed):
    problem = with_memory(small_problem(seed + 100), seed)
    for name, policy in BASELINES.items():
        for draw in range(3):
            assert fits(problem, policy(problem, draw, "highs").cuts), name
    lat = problem.latency
    per_device = lat.fp_up + lat.down_bp + lat.server_per_device[None, :]
    expected = [min(ok, key=lambda j: per_device[i, j - 1]) for i, ok in enumerate(fitting(problem))]
    assert list(ams_cuts(problem)) == expected


def test_device_that_fits_no_cut_names_it_and_the_memory_needed():
    problem = with_memory(small_problem(5), 5)
    profile, system = problem.latency.profile, problem.latency.system
    smallest = min(c.client_memory_bytes for c in profile.cut_points[:-1])
    devices = list(system.devices)
    devices[1] = replace(devices[1], memory_bytes=smallest * 0.5)
    with pytest.raises(InputError) as err:
        PlanningProblem.from_parts(profile, replace(system, devices=tuple(devices)), problem.convergence.constants)
    assert "device 1" in str(err.value) and f"{smallest:.6g}" in str(err.value)


def test_report_marks_memory_bound_devices():
    problem = with_memory(small_problem(2), 2)
    profile, system = problem.latency.profile, problem.latency.system
    planner = Planner(profile, system, problem.convergence.constants)
    plan = planner.plan()
    text = format_plan(plan, profile, system)
    need = profile.client_memory
    bound = [any(need[j - 1] > d.memory_bytes for j in range(c + 1, plan.deepest_cut + 1))
             for c, d in zip(plan.cuts, system.devices)]
    assert "memory MiB used/budget" in text
    assert f"{sum(bound)} of {system.num_devices} devices are memory-bound" in text
    rows = [line for line in text.splitlines() if line.split()[:1] and line.split()[0].isdigit() and "/" in line]
    assert [row.rstrip().endswith("*") for row in rows] == bound


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "adaptplan.cli", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("change,needle", [
    (lambda devs: [{**devs[0], "memory_bytes": -5.0}] + devs[1:], "memory_bytes"),
    (lambda devs: [{**devs[0], "memory_bytes": 0}] + devs[1:], "memory_bytes"),
    (lambda devs: [{**devs[0], "memory_bytes": 1e9}] + devs[1:], "every device or on none"),
    (lambda devs: [{**d, "memory_bytes": 10.0} for d in devs], "device 0"),
])
def test_bad_memory_input_is_one_line_and_exit_2(tmp_path, change, needle):
    problem = with_memory(small_problem(1), 1)
    paths = {}
    for name, obj in (("profile", problem.latency.profile), ("constants", problem.convergence.constants)):
        paths[name] = tmp_path / f"{name}.json"
        obj.save(paths[name])
    data = problem.latency.system.to_json()
    data["devices"] = change([{k: v for k, v in d.items() if k != "memory_bytes"} for d in data["devices"]])
    paths["system"] = tmp_path / "system.json"
    paths["system"].write_text(json.dumps(data))
    result = _cli("plan", "--profile", str(paths["profile"]), "--system", str(paths["system"]),
                  "--constants", str(paths["constants"]))
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and needle in result.stderr


def test_memory_fields_round_trip_and_partial_profile_is_rejected():
    problem = with_memory(small_problem(1), 1)
    profile, system = problem.latency.profile, problem.latency.system
    assert ModelProfile.from_json(profile.to_json()) == profile
    assert SystemSpec.from_json(system.to_json()) == system
    data = profile.to_json()
    del data["cut_points"][1]["client_memory_bytes"]
    with pytest.raises(InputError, match="client_memory_bytes"):
        ModelProfile.from_json(data)
    data = profile.to_json()
    data["memory"]["batch_size"] = system.batch_size + 1
    with pytest.raises(InputError, match="batch size"):
        PlanningProblem.from_parts(ModelProfile.from_json(data), system, problem.convergence.constants)
