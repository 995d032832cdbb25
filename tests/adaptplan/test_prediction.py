"""adaptplan.prediction and the Planner's estimate → calibrate → predict → compare (docs/api.md "Plan, train and check
in your own loop"): predictions against eq. (15) and eq. (26) written out, a measured run's crossing interpolated by
hand, the refusals, and the estimation step on a model against profilers.estimate_constants called directly."""

from __future__ import annotations

import math

import pytest

from adaptplan.calibration import PilotRun
from adaptplan.constants import ConvergenceConstants
from adaptplan.errors import InfeasibleError, InputError
from adaptplan.planner import Planner
from adaptplan.prediction import Comparison, Prediction, compare
from adaptplan.system import generate_system
from solvers.synthetic import synthetic_profile

N = 4
K = ConvergenceConstants(beta=8.0, gamma=0.05, theta=2.3, epsilon=1.0, sigma2=(0.01, 0.02, 0.05),
                         G2=(0.002, 0.03, 0.07))


def planner() -> Planner:
    return Planner(synthetic_profile(3), generate_system(N, seed=0), K)


def rounds_of(c: float, kappa: float, interval: int, cut: int) -> float:
    """Eq. (15) written out: 2ϑ / (γ (c − κ·4β²γ²·A_{L_c}·I²))."""
    return 2 * K.theta / (K.gamma * (c - kappa * 4 * K.beta ** 2 * K.gamma ** 2 * sum(K.G2[:cut]) * interval ** 2))


def test_a_measured_run_is_interpolated_between_its_evaluations_and_divided_by_the_prediction() -> None:
    prediction = Prediction((2, 2), 4, 50, 10.0, 0.3)
    found = compare(prediction, [(10, 0.1, 2.0), (20, 0.25, 4.0), (30, 0.35, 6.5), (40, 0.5, 9.0)])
    share = (0.3 - 0.25) / (0.35 - 0.25)                     # by hand: half-way from round 20 to round 30
    assert found.rounds == pytest.approx(20 + share * 10, rel=1e-12)
    assert found.seconds == pytest.approx(4.0 + share * 2.5, rel=1e-12)
    assert found.measured_over_predicted == pytest.approx(found.seconds / 10.0, rel=1e-12) and not found.upper_bound
    assert found.describe() == ("measured 25 rounds, 5.25 simulated s to 30.0% (interpolated); predicted 50 rounds, "
                                "10 simulated s to 30.0% test accuracy: measured/predicted 0.53")


def test_a_run_that_never_reached_or_started_above_the_target_says_so() -> None:
    prediction = Prediction((1,), 1, 5, 2.0, 0.9)
    never = compare(prediction, [(5, 0.2, 1.0), (10, 0.5, 2.0)])
    assert never == Comparison(prediction, None, None, False) and never.measured_over_predicted is None
    assert never.describe().startswith("never reached 90.0% test accuracy; predicted 5 rounds")
    first = compare(prediction, [(5, 0.95, 1.0), (10, 0.97, 2.0)])
    assert (first.rounds, first.seconds, first.upper_bound) == (5.0, 1.0, True)
    assert "at or before the first evaluation" in first.describe()
    assert compare(Prediction((1,), 1, 5, 0.0, 0.9), [(5, 0.95, 1.0)]).measured_over_predicted is None
    assert Comparison(prediction, 7.0, None, False).describe().startswith("never reached 90.0%")   # no seconds


def test_an_uncalibrated_prediction_cannot_be_measured_and_says_how_to_calibrate() -> None:
    prediction = Prediction((1,), 1, 5, 2.0, None)
    assert prediction.describe().endswith("to an ε-stationary point of its constants (uncalibrated: not an accuracy)")
    with pytest.raises(InputError) as caught:
        compare(prediction, [(5, 0.95, 1.0)])
    assert caught.value.field == "prediction.target_accuracy" and "Planner.calibrate" in caught.value.message


def test_predict_scores_a_plan_with_eq15_and_eq26_and_names_the_calibrated_target() -> None:
    p = planner()
    before = p.predict(p.evaluate((2, 2, 2, 2), 3))
    assert before.target_accuracy is None and (before.cuts, before.interval) == ((2, 2, 2, 2), 3)
    fixed = p.evaluate((2, 2, 2, 2), 3)
    assert before.rounds == fixed.rounds and before.seconds == fixed.total_latency_s
    rounds = math.ceil(2 * K.theta / (K.gamma * (1.0 - 8 * 0.05 * 0.08 / N - 4 * 64 * 0.0025 * 0.032 * 9)))
    assert fixed.rounds == rounds                                        # eq. (15) by hand
    assert fixed.total_latency_s == pytest.approx(rounds * fixed.round_latency_s
                                                  + (rounds // 3) * fixed.aggregation_latency_s, rel=1e-12)   # (26)
    c, kappa = 2.0, 0.05
    fit = p.calibrate([PilotRun("a", 1, 3, 0.3, rounds_of(c, kappa, 1, 3)),
                       PilotRun("b", 8, 3, 0.3, rounds_of(c, kappa, 8, 3))])
    assert p.calibration is fit and p.constants == fit.constants
    after = p.predict(p.evaluate((2, 2, 2, 2), 3))
    assert after.target_accuracy == 0.3 and after.rounds == math.ceil(rounds_of(c, kappa, 3, 2) - 1e-9)
    planned = p.predict()                                                # no plan given: the planner's own plan
    best = p.plan()
    assert (planned.cuts, planned.interval, planned.rounds) == (best.cuts, best.interval, best.rounds)
    assert p.compare(after, [(1, 0.1, 0.5), (200, 0.5, 100.0)]).rounds == pytest.approx(1 + 199 * 0.5, rel=1e-12)


def test_one_pilot_makes_the_planner_predict_its_own_rounds_at_its_plan() -> None:
    p = planner()
    p.calibrate([PilotRun("only", 2, 3, 0.4, 57.3)])
    assert p.evaluate((3, 3, 3, 3), 2).rounds == 58                      # ⌈57.3⌉


def tiny_model():
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.ReLU()), nn.Sequential(nn.Linear(8, 8), nn.ReLU()),
                         nn.Linear(8, 10))


def tiny_batches():
    import torch

    generator = torch.Generator().manual_seed(3)
    return [(torch.randn(8, 1, 8, 8, generator=generator), torch.randint(0, 10, (8,), generator=generator))
            for _ in range(4)]


def test_estimate_is_estimate_constants_on_the_model_with_epsilon_twice_the_noise_floor() -> None:
    from profilers.gradstats import estimate_constants

    p = planner()
    got = p.estimate(tiny_model(), tiny_batches(), gamma=0.05)
    direct = estimate_constants(tiny_model(), tiny_batches(), gamma=0.05, epsilon=1.0, num_batches=4)
    for name in ("beta", "sigma2", "G2", "theta", "gamma"):
        assert getattr(got, name) == pytest.approx(getattr(direct, name), rel=1e-9), name
    assert got.epsilon == pytest.approx(2 * 0.05 * direct.beta * sum(direct.sigma2) / N, rel=1e-9)
    assert p.constants == got
    given = p.estimate(tiny_model(), tiny_batches(), gamma=0.05, epsilon=3.5)
    assert given.epsilon == 3.5 and p.problem.convergence.constants == given == p.constants


def test_estimate_after_calibrate_keeps_the_fitted_c_and_kappa() -> None:
    p = planner()
    fit = p.calibrate([PilotRun("a", 1, 3, 0.3, 40.0), PilotRun("b", 8, 3, 0.3, 60.0)])
    again = p.estimate(tiny_model(), tiny_batches(), gamma=0.05, epsilon=9.0)       # ε given: the fit's c wins
    assert again.epsilon == pytest.approx(fit.c + again.noise_floor(N), rel=1e-12)
    from profilers.gradstats import estimate_constants

    direct = estimate_constants(tiny_model(), tiny_batches(), gamma=0.05, num_batches=4)
    assert again.G2 == pytest.approx(tuple(fit.kappa * g for g in direct.G2), rel=1e-9)


def test_estimate_on_a_model_of_other_blocks_is_refused_naming_model() -> None:
    from torch import nn

    p = Planner(synthetic_profile(4), generate_system(N, seed=0), ConvergenceConstants.placeholder(4))
    with pytest.raises(InputError) as caught:
        p.estimate(tiny_model(), tiny_batches(), gamma=0.05)
    assert caught.value.field == "model" and "3 blocks but the profile 4 cut points" in caught.value.message
    assert isinstance(tiny_model(), nn.Sequential)


def test_constants_that_reach_nothing_are_refused_when_planning_not_when_estimated() -> None:
    from profilers.gradstats import estimate_constants

    floor = estimate_constants(tiny_model(), tiny_batches(), gamma=0.05, num_batches=4).noise_floor(N)
    p = planner()
    p.estimate(tiny_model(), tiny_batches(), gamma=0.05, epsilon=floor * (1 + 1e-9))   # c ≈ 0: nothing reaches it
    with pytest.raises(InfeasibleError, match="I must be < "):
        p.plan()
