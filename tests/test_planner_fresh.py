"""Planner-side behaviour found untested by a fresh mutation sample (docs/mutation.md): the command
line's interrupt line, what ``system -o`` says it wrote, list and message limits of input files, the
planner's last result, limits and gap, plans/systems/profiles on disk."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from types import SimpleNamespace

import pytest

from adaptplan.cli import main
from adaptplan.commands import system as system_command
from adaptplan.constants import ConvergenceConstants
from adaptplan.errors import InputError
from adaptplan.fileio import non_empty_list, show
from adaptplan.model_profile import ModelProfile
from adaptplan.plan import Plan
from adaptplan.planner import Planner, build_plan
from adaptplan.report import memory_bound
from adaptplan.system import SystemRanges, SystemSpec, generate_system
from solvers.synthetic import synthetic_profile


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
