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

def test_the_law_per_cut_takes_r1_at_each_cut_and_kappa_from_the_longer_pilots_written_out() -> None:
    pilots = [_pilot(1, 40.0, cut=1), _pilot(1, 62.0, cut=2), _pilot(1, 58.0, cut=2), _pilot(1, 50.0, cut=3),
              _pilot(8, 85.0, cut=3), _pilot(4, 72.0, cut=2)]
    law = linear.fit_per_cut_rounds(pilots)
    assert law.rounds_at_one == {1: 40.0, 2: 60.0, 3: 50.0}                  # the two cut-2 pilots averaged
    kappa = ((85 / 50 - 1) / 7 + (72 / 60 - 1) / 3) / 2                      # 0.1 and 0.0667: their mean
    assert law.kappa == pytest.approx(kappa, rel=1e-12)
    assert law.rounds_for([1, 3, 3], 5) == pytest.approx(50.0 * (1 + 4 * kappa))     # as slow as its slowest cut
    assert law.rounds_for([2, 1], 1) == 60.0 and law.rounds_for([1], 1) == 40.0
    with pytest.raises(InputError) as caught:
        law.rounds_for([1, 4], 2)
    assert caught.value.field == "cuts" and "cut 4 had no pilot at I = 1" in caught.value.message
    data = law.to_json()
    assert data["law"] == "per-cut" and data["rounds_at_one"] == {"1": 40.0, "2": 60.0, "3": 50.0}
    faster = linear.fit_per_cut_rounds([_pilot(1, 60.0, cut=2), _pilot(8, 50.0, cut=2)])   # no cost: κ = 0, not < 0
    assert faster.kappa == 0.0 and faster.rounds_for([2], 8) == 60.0


@pytest.mark.parametrize("pilots, said", [
    ([_pilot(2, 50.0, cut=1), _pilot(4, 70.0, cut=1)], "needs a pilot at --interval 1"),
    ([_pilot(1, 50.0, cut=1), _pilot(4, 70.0, cut=2)], "a longer interval at a cut piloted at I = 1 (1)"),
    ([_pilot(1, 50.0, cut=1), _pilot(4, 70.0, cut=1, target=0.4)], "one target accuracy"),
])
def test_pilots_the_law_per_cut_cannot_be_fitted_to_are_refused_naming_pilots(pilots, said) -> None:
    with pytest.raises(InputError) as caught:
        linear.fit_per_cut_rounds(pilots)
    assert caught.value.field == "--pilots" and said in caught.value.message


def _brute_force_per_cut(law: linear.PerCutRounds, model: LatencyModel, cuts_range, intervals):
    """min over every cut vector of piloted cuts and interval of R(x, I)·(T_split + T_agg/I), ties to the smaller I."""
    best = None
    for interval in intervals:
        for cuts in itertools.product([c for c in cuts_range if c in law.rounds_at_one], repeat=model.num_devices):
            value = law.rounds_for(cuts, interval) * (model.t_split(cuts) + model.t_agg(cuts) / interval)
            if best is None or value < best[0] * (1 - 1e-12):
                best = (value, interval, cuts)
    return best


@pytest.mark.parametrize("seed, at_one, longer", [
    (0, {1: 44.0, 2: 65.0, 3: 64.0, 4: 130.0}, (3, 8, 74.0)),        # NoPeek's shape: deep cuts slow
    (1, {1: 50.0, 2: 50.0, 3: 50.0, 4: 50.0, 5: 50.0}, (4, 8, 64.0)),  # no cost by cut: the linear law's plan
    (2, {2: 90.0, 3: 45.0, 5: 40.0}, (3, 4, 120.0)),                  # cuts 1 and 4 never piloted
    (3, {1: 30.0, 3: 80.0, 4: 81.0}, (1, 2, 31.0)),
])
def test_the_plan_per_cut_is_the_brute_force_optimum_over_every_piloted_cut_vector_and_interval(
        seed, at_one, longer) -> None:
    profile, system = default_profile(), generate_system(3, seed)
    pilots = [_pilot(1, r, cut=j) for j, r in at_one.items()] + [_pilot(longer[1], longer[2], cut=longer[0])]
    law = linear.fit_per_cut_rounds(pilots)
    model = LatencyModel(profile, system)
    value, interval, cuts = _brute_force_per_cut(law, model, range(1, profile.num_cuts + 1), range(1, longer[1] + 1))
    plan = law.plan(profile, system)
    assert plan.objective_s == pytest.approx(value, rel=1e-9) and plan.interval == interval
    assert set(plan.cuts) <= set(at_one) and plan.rounds == pytest.approx(law.rounds_for(plan.cuts, plan.interval))
    assert [i for i, _, _ in plan.by_interval] == list(range(1, longer[1] + 1))
    scored = linear.as_plan(plan, law, profile, system)
    assert scored.solver["method"] == "per-cut-rounds" and scored.objective_s == pytest.approx(value, rel=1e-9)
    if seed == 1:         # the same R₁ everywhere: the plan of the linear law with that R₁ and κ
        same = linear.plan_linear_rounds(linear.LinearRounds(50.0, law.kappa, 0.3, law.pilots, ""), profile, system)
        assert (plan.cuts, plan.interval) == (same.cuts, same.interval)
    restricted = law.plan(profile, system, candidates=[min(at_one)])       # candidates kept
    assert set(restricted.cuts) == {min(at_one)}
    with pytest.raises(InputError) as caught:
        law.plan(profile, system, candidates=[c for c in range(1, profile.num_cuts + 1) if c not in at_one][:1] or [99])
    assert caught.value.field == "--pilots"
