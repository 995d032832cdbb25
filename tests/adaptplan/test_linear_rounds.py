"""The rounds law linear in I (docs/model.md §12): its least-squares fit written out, its refusals, and its plan
against brute force over every cut vector and interval of small systems."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import adaptplan.linear_rounds as linear
from adaptplan.calibration import PilotRun
from adaptplan.errors import InputError
from adaptplan.latency import LatencyModel
from adaptplan.scenarios import default_profile
from adaptplan.system import generate_system


def _pilot(interval: int, rounds: float, target: float = 0.3, cut: int = 4) -> PilotRun:
    return PilotRun(f"p{interval}", interval, cut, target, rounds)


def test_the_fit_is_least_squares_of_rounds_on_the_interval_with_r1_its_value_at_one() -> None:
    law = linear.fit_linear_rounds([_pilot(1, 50.0), _pilot(2, 80.0), _pilot(4, 142.0)])
    # R ≈ p + q·I by least squares: I = (1, 2, 4), mean 7/3; R mean 272/3
    i, r = np.array([1.0, 2.0, 4.0]), np.array([50.0, 80.0, 142.0])
    q = float(((i - i.mean()) * (r - r.mean())).sum() / ((i - i.mean()) ** 2).sum())
    p = float(r.mean() - q * i.mean())
    assert law.rounds_at_one == pytest.approx(p + q) and law.kappa == pytest.approx(q / (p + q))
    assert law.rounds(4) == pytest.approx(p + 4 * q) and law.rounds(1) == pytest.approx(p + q)
    assert q == pytest.approx(30.7142857) and law.target_accuracy == 0.3
    assert law.message.startswith(f"R(I) = {p + q:.4g}·(1 + {q / (p + q):.3g}·(I − 1)) rounds to 30.0%")
    two = linear.fit_linear_rounds([_pilot(1, 43.0), _pilot(8, 64.0)])          # two pilots: the line through them
    assert (two.rounds_at_one, two.kappa) == (pytest.approx(43.0), pytest.approx(3.0 / 43.0))
    data = two.to_json()
    assert data["law"] == "linear" and [p["fitted_rounds"] for p in data["pilots"]] == \
        [pytest.approx(43.0), pytest.approx(64.0)]


def test_pilots_showing_no_cost_of_a_longer_interval_give_kappa_zero_and_the_mean_rounds() -> None:
    law = linear.fit_linear_rounds([_pilot(1, 60.0), _pilot(8, 50.0)])
    assert (law.kappa, law.rounds_at_one) == (0.0, 55.0) and law.rounds(8) == 55.0
    assert "κ = 0" in law.message
    flat = linear.fit_linear_rounds([_pilot(1, 60.0), _pilot(8, 60.0)])             # a zero slope is no cost either
    assert flat.kappa == 0.0 and flat.rounds(5) == pytest.approx(60.0) and "show no cost" in flat.message
    # the edge just above: a slope of 5/7 round per interval step is a cost, κ = (5/7)/R₁ with R₁ = 50
    small = linear.fit_linear_rounds([_pilot(1, 50.0), _pilot(8, 55.0)])
    assert (small.rounds_at_one, small.kappa) == (pytest.approx(50.0), pytest.approx(5 / 7 / 50))
    assert small.message.startswith("R(I) = 50·(1 + 0.0143·(I − 1))")


def test_r1_must_be_positive_refused_at_zero_and_taken_just_above() -> None:
    """R₁ = p + q: the line through (2, 10) and (4, 30) is R = −10 + 10·I, zero at I = 1 (refused); through (2, 10.5)
    and (4, 30.5) R₁ = 0.5 > 0 is taken, κ = q/R₁ = 20."""
    with pytest.raises(InputError) as caught:
        linear.fit_linear_rounds([_pilot(2, 10.0), _pilot(4, 30.0)])
    assert caught.value.field == "--pilots" and "gives no positive rounds at I = 1" in caught.value.message
    law = linear.fit_linear_rounds([_pilot(2, 10.5), _pilot(4, 30.5)])
    assert (law.rounds_at_one, law.kappa) == (pytest.approx(0.5), pytest.approx(20.0))


@pytest.mark.parametrize("pilots, said", [
    ([_pilot(4, 50.0)], "needs pilots at two intervals at least, got [4]"),
    ([_pilot(2, 50.0), _pilot(2, 70.0)], "got [2]"),
    ([_pilot(1, 50.0), _pilot(2, 70.0, target=0.4)], "one target accuracy"),
    ([_pilot(4, 10.0), _pilot(8, 100.0)], "gives no positive rounds at I = 1"),     # R = −80 + 22.5·I
])
def test_pilots_the_law_cannot_be_fitted_to_are_refused_naming_pilots(pilots, said) -> None:
    with pytest.raises(InputError) as caught:
        linear.fit_linear_rounds(pilots)
    assert caught.value.field == "--pilots" and said in caught.value.message


def _brute_force(law: linear.LinearRounds, model: LatencyModel, cuts_range, intervals):
    """min over every cut vector and interval of R(I)·(T_split + T_agg/I), ties to the smaller I."""
    best = None
    for interval in intervals:
        for cuts in itertools.product(cuts_range, repeat=model.num_devices):
            value = law.rounds(interval) * (model.t_split(cuts) + model.t_agg(cuts) / interval)
            if best is None or value < best[0] * (1 - 1e-12):
                best = (value, interval, cuts)
    return best


@pytest.mark.parametrize("seed, pilots", [
    (0, [(1, 50.0), (8, 64.0)]), (1, [(1, 43.0), (4, 147.0)]), (2, [(1, 57.0), (4, 123.0)]),
    (3, [(1, 40.0), (2, 41.0)]), (4, [(1, 45.0), (6, 45.5)]),
])
def test_the_plan_is_the_brute_force_optimum_over_every_cut_vector_and_interval_up_to_the_longest_pilot(
        seed, pilots) -> None:
    profile, system = default_profile(), generate_system(3, seed)
    law = linear.fit_linear_rounds([_pilot(i, r) for i, r in pilots])
    model = LatencyModel(profile, system)
    top = max(i for i, _ in pilots)
    value, interval, cuts = _brute_force(law, model, range(1, profile.num_cuts), range(1, top + 1))
    plan = linear.plan_linear_rounds(law, profile, system)
    assert plan.objective_s == pytest.approx(value, rel=1e-9) and plan.interval == interval
    assert [i for i, _, _ in plan.by_interval] == list(range(1, top + 1))            # never past the pilots
    # the prediction: eq. (26) with ⌈R(I)⌉ rounds on the plan's own cuts
    rounds = math.ceil(law.rounds(plan.interval) * (1 - 1e-12))          # ⌈R⌉, an R whole up to rounding kept
    assert plan.integer_rounds == rounds and plan.rounds == pytest.approx(law.rounds(plan.interval))
    scored = linear.as_plan(plan, law, profile, system)
    assert (scored.rounds, scored.aggregations, scored.cuts, scored.interval) == \
        (rounds, rounds // plan.interval, plan.cuts, plan.interval)
    assert scored.total_latency_s == pytest.approx(rounds * model.t_split(plan.cuts)
                                                   + (rounds // plan.interval) * model.t_agg(plan.cuts))
    assert scored.objective_s == pytest.approx(value) and scored.solver["method"] == "linear-rounds"
    assert scored.solver["max_interval"] == top and scored.solver["kappa"] == law.kappa


def test_kappa_zero_plans_the_longest_interval_and_kappa_one_or_more_plans_every_round() -> None:
    profile, system = default_profile(), generate_system(4, 7)
    flat = linear.fit_linear_rounds([_pilot(1, 50.0), _pilot(6, 50.0)])
    assert linear.plan_linear_rounds(flat, profile, system).interval == 6
    assert linear.plan_linear_rounds(flat, profile, system, max_interval=9).interval == 9
    steep = linear.fit_linear_rounds([_pilot(1, 50.0), _pilot(3, 150.0)])           # κ = 1: R = 50·I
    assert steep.kappa == pytest.approx(1.0) and linear.plan_linear_rounds(steep, profile, system).interval == 1
    with pytest.raises(InputError) as caught:
        linear.plan_linear_rounds(flat, profile, system, max_interval=0)
    assert caught.value.field == "max_interval"
    assert linear.plan_linear_rounds(flat, profile, system, max_interval=1).interval == 1      # the edge: I = 1 only


def test_the_threshold_sweep_and_the_milp_give_the_same_plan(monkeypatch) -> None:
    profile, system = default_profile(), generate_system(12, 3)
    law = linear.fit_linear_rounds([_pilot(1, 45.0), _pilot(8, 70.0)])
    milp = linear.plan_linear_rounds(law, profile, system)
    monkeypatch.setattr(linear, "choose_ms_method", lambda problem: "threshold")
    sweep = linear.plan_linear_rounds(law, profile, system)
    assert sweep.interval == milp.interval
    assert [v for _, v, _ in sweep.by_interval] == pytest.approx([v for _, v, _ in milp.by_interval], rel=1e-9)


# ---- the law per cut (docs/model.md §12 "Per cut") ---------------------------------------------------------------

def test_the_law_per_cut_fits_each_cuts_own_line_and_knows_it_only_across_its_pilots_intervals() -> None:
    pilots = [_pilot(1, 40.0, cut=1), _pilot(1, 62.0, cut=2), _pilot(1, 58.0, cut=2), _pilot(1, 50.0, cut=3),
              _pilot(8, 85.0, cut=3), _pilot(4, 72.0, cut=2)]
    law = linear.fit_per_cut_rounds(pilots)
    assert law.intervals == {1: (1, 1), 2: (1, 4), 3: (1, 8)}
    assert (law.laws[1].rounds_at_one, law.laws[1].kappa) == (40.0, 0.0)                # one interval: its mean
    assert law.laws[2] == linear.fit_linear_rounds([pilots[1], pilots[2], pilots[5]])   # the cut's own least squares
    assert (law.laws[3].rounds_at_one, law.laws[3].kappa) == (pytest.approx(50.0), pytest.approx(35 / 7 / 50))
    assert law.rounds_for([1, 3, 3], 1) == pytest.approx(50.0)                           # as slow as its slowest cut
    assert law.rounds_for([3], 5) == pytest.approx(70.0)
    assert law.rounds_for([2, 3], 4) == pytest.approx(max(law.laws[2].rounds(4), 65.0))
    assert law.usable(1) == [1, 2, 3] and law.usable(4) == [2, 3] and law.usable(5) == [3] and law.usable(9) == []
    for cuts, interval, said in (([1, 3], 2, "cut 1 had no pilots across I = 2"), ([4], 1, "cut 4 had no pilots"),
                                 ([2, 3], 6, "cut 2 had no pilots across I = 6 (piloted: cut 1: I = 1; cut 2: I 1–4")):
        with pytest.raises(InputError) as caught:
            law.rounds_for(cuts, interval)
        assert caught.value.field == "cuts" and said in caught.value.message
    data = law.to_json()
    assert data["law"] == "per-cut" and data["by_cut"]["3"] == {"rounds_at_one": pytest.approx(50.0),
                                                               "kappa": pytest.approx(0.1), "intervals": [1, 8]}
    assert [p["fitted_rounds"] for p in data["pilots"]][-2:] == [pytest.approx(85.0), pytest.approx(law.laws[2].rounds(4))]
    assert "cut 1: 40 rounds at I = 1" in law.message and "cut 3: R₁ 50, κ 0.1, I 1–8" in law.message
    faster = linear.fit_per_cut_rounds([_pilot(1, 60.0, cut=2), _pilot(8, 50.0, cut=2)])   # no cost: κ = 0, the mean
    assert faster.laws[2].kappa == 0.0 and faster.rounds_for([2], 8) == 55.0
    twice = linear.fit_per_cut_rounds([_pilot(4, 40.0, cut=1), _pilot(4, 44.0, cut=1)])     # one interval, two runs
    assert twice.intervals == {1: (4, 4)} and twice.rounds_for([1], 4) == 42.0


@pytest.mark.parametrize("pilots, said", [
    ([], "needs pilots"),
    ([_pilot(1, 50.0, cut=1), _pilot(4, 70.0, cut=1, target=0.4)], "one target accuracy"),
    ([_pilot(4, 10.0, cut=2), _pilot(8, 100.0, cut=2), _pilot(1, 30.0, cut=1)], "gives no positive rounds at I = 1"),
])
def test_pilots_the_law_per_cut_cannot_be_fitted_to_are_refused_naming_pilots(pilots, said) -> None:
    with pytest.raises(InputError) as caught:
        linear.fit_per_cut_rounds(pilots)
    assert caught.value.field == "--pilots" and said in caught.value.message


def _brute_force_per_cut(law: linear.PerCutRounds, model: LatencyModel, cuts_range, intervals):
    """min over every interval and every vector of cuts piloted across it of R(x, I)·(T_split + T_agg/I), ties to the
    smaller I."""
    best = None
    for interval in intervals:
        usable = [c for c in cuts_range if c in law.usable(interval)]
        for cuts in itertools.product(usable, repeat=model.num_devices):
            value = law.rounds_for(cuts, interval) * (model.t_split(cuts) + model.t_agg(cuts) / interval)
            if best is None or value < best[0] * (1 - 1e-12):
                best = (value, interval, cuts)
    return best


@pytest.mark.parametrize("seed, pilots", [
    (0, [(1, 1, 44.0), (2, 1, 65.0), (3, 1, 64.0), (4, 1, 130.0), (3, 8, 74.0)]),      # NoPeek's shape
    (1, [(1, 1, 50.0), (2, 1, 50.0), (3, 1, 50.0), (4, 1, 50.0), (5, 1, 50.0), (4, 8, 64.0), (2, 4, 52.0)]),
    (2, [(2, 1, 90.0), (3, 1, 45.0), (5, 1, 40.0), (3, 4, 120.0), (5, 2, 41.0)]),       # cuts 1 and 4 never piloted
    (3, [(1, 1, 30.0), (3, 1, 80.0), (4, 1, 81.0), (1, 2, 31.0), (4, 3, 70.0), (4, 6, 85.0)]),
])
def test_the_plan_per_cut_is_the_brute_force_optimum_over_every_piloted_cut_vector_and_interval(seed, pilots) -> None:
    profile, system = default_profile(), generate_system(3, seed)
    law = linear.fit_per_cut_rounds([_pilot(i, r, cut=j) for j, i, r in pilots])
    model = LatencyModel(profile, system)
    top = max(i for _, i, _ in pilots)
    value, interval, cuts = _brute_force_per_cut(law, model, range(1, profile.num_cuts + 1), range(1, top + 1))
    plan = law.plan(profile, system)
    assert plan.objective_s == pytest.approx(value, rel=1e-9) and plan.interval == interval
    assert set(plan.cuts) <= set(law.usable(plan.interval))
    assert plan.rounds == pytest.approx(law.rounds_for(plan.cuts, plan.interval))
    assert [i for i, _, _ in plan.by_interval] == [i for i in range(1, top + 1) if law.usable(i)]
    scored = linear.as_plan(plan, law, profile, system)
    assert scored.solver["method"] == "per-cut-rounds" and scored.objective_s == pytest.approx(value, rel=1e-9)
    piloted = sorted(law.intervals)
    restricted = law.plan(profile, system, candidates=[piloted[0]])                     # candidates kept
    assert set(restricted.cuts) == {piloted[0]} and restricted.interval <= law.intervals[piloted[0]][1]
    with pytest.raises(InputError) as caught:
        law.plan(profile, system, candidates=[c for c in range(1, 30) if c not in law.intervals][:1])
    assert caught.value.field == "--pilots"


def test_with_every_cut_piloted_alike_the_plan_per_cut_is_the_linear_laws_plan() -> None:
    profile, system = default_profile(), generate_system(4, 5)
    alike = [(j, i, r) for j in range(1, profile.num_cuts + 1) for i, r in ((1, 50.0), (6, 60.0))]
    law = linear.fit_per_cut_rounds([_pilot(i, r, cut=j) for j, i, r in alike])
    same = linear.plan_linear_rounds(linear.fit_linear_rounds([_pilot(1, 50.0), _pilot(6, 60.0)]), profile, system)
    plan = law.plan(profile, system)
    assert (plan.cuts, plan.interval) == (same.cuts, same.interval)
    assert plan.objective_s == pytest.approx(same.objective_s, rel=1e-12)


def test_under_a_leakage_budget_both_laws_plan_the_brute_force_optimum_over_the_cuts_each_device_may_use() -> None:
    """Device i may cut at j only where the table's figure at j is within its limit (solvers/leakage_budget.py): the
    plans keep to it and are the optimum over the admitted vectors; a budget that admits no piloted cut for a device
    names it."""
    from adaptplan.errors import InfeasibleError
    from solvers.leakage_budget import LeakageBudget

    profile, system = default_profile(), generate_system(3, 11)
    L = profile.num_cuts
    values = np.linspace(0.9, 0.3, L - 1)                                     # dCor falling with depth
    budget = LeakageBudget("dcor", values, np.array([0.95, 0.6, 0.75]))       # device 1 only deep, device 2 middle
    admitted = budget.admissible(3, L)
    model = LatencyModel(profile, system)
    per_cut = linear.fit_per_cut_rounds([_pilot(1, 40.0 + 5 * j, cut=j) for j in range(1, L)]
                                        + [_pilot(8, 90.0, cut=L - 1), _pilot(4, 70.0, cut=2)])
    flat = linear.fit_linear_rounds([_pilot(1, 50.0), _pilot(8, 64.0)])
    for law in (per_cut, flat):
        best = None
        for interval in range(1, 9):
            usable = per_cut.usable(interval) if law is per_cut else list(range(1, L + 1))
            options = [[j for j in usable if admitted[i, j - 1]] for i in range(3)]
            for cuts in itertools.product(*options):
                value = law.rounds_for(cuts, interval) * (model.t_split(cuts) + model.t_agg(cuts) / interval)
                if best is None or value < best[0] * (1 - 1e-12):
                    best = (value, interval, cuts)
        plan = law.plan(profile, system, leakage=budget)
        assert all(admitted[i, c - 1] for i, c in enumerate(plan.cuts))
        assert not all(admitted[i, c - 1] for i, c in enumerate(law.plan(profile, system).cuts))   # the budget binds
        assert plan.objective_s == pytest.approx(best[0], rel=1e-9) and plan.interval == best[1]
    tight = LeakageBudget("dcor", values, np.array([0.95, 0.1, 0.75]))       # device 1: no cut within 0.1
    for law in (per_cut, flat):
        with pytest.raises((InputError, InfeasibleError)) as caught:
            law.plan(profile, system, leakage=tight)
        assert "device 1" in str(caught.value)
