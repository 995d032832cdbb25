"""adaptplan.calibration and adaptplan.crossing: the fit of c and κ to pilot runs against eq. (15) written out by hand,
its edges (one pilot, one drift load, no drift seen, no fit), the pilots read from run folders, and the crossing."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from adaptplan.calibration import PilotRun, calibrate, calibrated, drift_load
from adaptplan.constants import ConvergenceConstants
from adaptplan.convergence import ConvergenceModel
from adaptplan.crossing import Crossing, first_crossing
from adaptplan.errors import InputError
from trainers.run.pilots import read_pilot

N = 4
K = ConvergenceConstants(beta=8.0, gamma=0.05, theta=2.3, epsilon=1.0, sigma2=(0.01, 0.02, 0.05),
                         G2=(0.002, 0.03, 0.07))


def rounds_of(c: float, kappa: float, interval: int, cut: int) -> float:
    """Eq. (15) written out: 2ϑ / (γ (c − κ·4β²γ²·A_{L_c}·I²)), A_ℓ = Σ_{j≤ℓ} G_j²."""
    A = sum(K.G2[:cut])
    return 2 * K.theta / (K.gamma * (c - kappa * 4 * K.beta ** 2 * K.gamma ** 2 * A * interval ** 2))


def pilot(interval: int, cut: int, rounds: float, name: str = "p") -> PilotRun:
    return PilotRun(name, interval, cut, 0.3, rounds)


def test_drift_load_is_the_drift_term_of_eq15_at_kappa_one() -> None:
    assert drift_load(K, 4, 2) == pytest.approx(4 * 64 * 0.0025 * 0.032 * 16, rel=1e-12)


def test_one_pilot_fits_epsilon_so_that_eq15_gives_its_rounds_and_keeps_the_bound() -> None:
    fit = calibrate(K, [pilot(2, 2, 40.0)], N)
    x = 4 * 64 * 0.0025 * 0.032 * 4
    assert fit.kappa == 1.0 and fit.c == pytest.approx(2 * 2.3 / (0.05 * 40.0) + x, rel=1e-12)
    floor = 8.0 * 0.05 * 0.08 / N                          # βγΣσ²/N
    assert fit.constants.epsilon == pytest.approx(fit.c + floor, rel=1e-12)
    assert fit.constants.G2 == K.G2 and fit.constants.beta == K.beta and fit.constants.theta == K.theta
    assert ConvergenceModel(fit.constants, N).rounds(2, 2) == pytest.approx(40.0, rel=1e-12)
    assert fit.fitted_rounds == pytest.approx((40.0,), rel=1e-12)
    assert "κ = 1" in fit.message
    slow = calibrate(K, [pilot(2, 2, 400.0)], N)                    # a margin c − x = 2ϑ/(γR) = 0.23, below 1
    assert slow.fitted_rounds == pytest.approx((400.0,), rel=1e-12)


def test_two_pilots_recover_c_and_kappa_exactly_and_predict_a_third_plan() -> None:
    c, kappa = 2.0, 0.05
    runs = [pilot(1, 3, rounds_of(c, kappa, 1, 3)), pilot(8, 3, rounds_of(c, kappa, 8, 3))]
    fit = calibrate(K, runs, N)
    assert fit.c == pytest.approx(c, rel=1e-9) and fit.kappa == pytest.approx(kappa, rel=1e-9)
    assert fit.constants.G2 == pytest.approx(tuple(kappa * g for g in K.G2), rel=1e-9)
    model = ConvergenceModel(fit.constants, N)
    assert model.rounds(4, 2) == pytest.approx(rounds_of(c, kappa, 4, 2), rel=1e-9)
    assert fit.fitted_rounds == pytest.approx(tuple(p.rounds for p in runs), rel=1e-9)


def test_three_pilots_are_a_least_squares_fit_of_the_normal_equations() -> None:
    runs = [pilot(1, 3, 42.0), pilot(4, 3, 45.0), pilot(8, 3, 60.0)]
    m = np.array([2 * 2.3 / (0.05 * p.rounds) for p in runs])
    x = np.array([drift_load(K, p.interval, p.deepest_cut) for p in runs])
    n, sx, sxx, sm, sxm = len(x), x.sum(), (x * x).sum(), m.sum(), (x * m).sum()
    slope = (n * sxm - sx * sm) / (n * sxx - sx * sx)        # m = c − κx by ordinary least squares
    fit = calibrate(K, runs, N)
    assert fit.kappa == pytest.approx(-slope, rel=1e-9)
    assert fit.c == pytest.approx((sm - slope * sx) / n, rel=1e-9)


def test_pilots_that_show_no_cost_of_a_longer_interval_give_kappa_zero() -> None:
    fit = calibrate(K, [pilot(1, 3, 43.0), pilot(8, 3, 40.0)], N)        # I = 8 was faster
    assert fit.kappa == 0.0 and fit.c == pytest.approx(np.mean([2 * 2.3 / (0.05 * 43), 2 * 2.3 / (0.05 * 40)]))
    assert all(g == 0 for g in fit.constants.G2) and "no cost of a longer interval" in fit.message


def test_pilots_with_the_same_rounds_at_two_drift_loads_see_no_drift() -> None:
    fit = calibrate(K, [pilot(1, 3, 43.0), pilot(8, 3, 43.0)], N)         # slope 0 up to rounding
    assert fit.kappa == pytest.approx(0.0, abs=1e-12) and fit.c == pytest.approx(2 * 2.3 / (0.05 * 43))


def test_a_fitted_line_below_zero_at_a_pilots_plan_fits_it_infinite_rounds() -> None:
    # the line fitted to four pilots falls below zero at the fourth's drift load (m_4 > 0 lies above it)
    runs = [pilot(1, 1, 1.0), pilot(2, 3, 1e6), pilot(3, 3, 1e6), pilot(8, 3, 50.0)]
    fit = calibrate(K, runs, N)
    x = [drift_load(K, p.interval, p.deepest_cut) for p in runs]
    margins = [fit.c - fit.kappa * xk for xk in x]
    assert margins[3] < 0 < margins[0] and math.isinf(fit.fitted_rounds[3])
    assert fit.fitted_rounds[0] == pytest.approx(2 * 2.3 / (0.05 * margins[0]), rel=1e-12)


def test_pilots_at_one_drift_load_keep_the_bound_and_fit_the_mean() -> None:
    fit = calibrate(K, [pilot(2, 2, 40.0), pilot(2, 2, 50.0)], N)
    x = drift_load(K, 2, 2)
    assert fit.kappa == 1.0 and fit.c == pytest.approx(np.mean([2 * 2.3 / (0.05 * r) + x for r in (40.0, 50.0)]))
    assert "2 pilots at one drift load" in fit.message


def test_pilots_that_cannot_be_fitted_are_an_input_error_naming_the_pilots() -> None:
    for runs, words in [([], "at least one pilot"), ([pilot(1, 4, 10.0)], "cuts 1..3"), ([pilot(1, 0, 10.0)], "cuts 1..3"),
                        ([pilot(1, 1, 10.0), PilotRun("q", 1, 1, 0.4, 10.0)], "one target accuracy")]:
        with pytest.raises(InputError, match=words) as info:
            calibrate(K, runs, N)
        assert info.value.field == "--pilots"


def test_a_very_slow_long_pilot_still_fits_a_positive_c() -> None:
    fit = calibrate(K, [pilot(1, 1, 1.0), pilot(8, 3, 1e9)], N)
    assert fit.c > 0 and fit.kappa > 0 and fit.fitted_rounds[0] == pytest.approx(1.0, rel=1e-6)


def test_a_calibration_applied_to_reestimated_constants_keeps_c_and_kappa() -> None:
    fit = calibrate(K, [pilot(1, 3, 42.0), pilot(8, 3, 60.0)], N)
    later = ConvergenceConstants(beta=20.0, gamma=0.05, theta=1.1, epsilon=0.1, sigma2=(0.1, 0.1, 0.1),
                                 G2=(0.01, 0.02, 0.03))
    again = fit.apply(later, N)
    assert again == calibrated(later, fit.c, fit.kappa, N)
    model = ConvergenceModel(again, N)
    assert model.c == pytest.approx(fit.c, rel=1e-12)
    assert model.d(3) == pytest.approx(fit.kappa * 4 * 400 * 0.0025 * 0.06, rel=1e-12)
    data = fit.to_json()
    assert data["kappa"] == fit.kappa and ConvergenceConstants.from_json(data["constants"]) == fit.constants
    assert [p["measured_rounds"] for p in data["pilots"]] == [42.0, 60.0]


# ---- crossings ----------------------------------------------------------------------------------------------------
def test_first_crossing_interpolates_every_coordinate_and_marks_an_upper_bound() -> None:
    points = [(0.1, 5, 1.0), (0.3, 10, 3.0), (0.2, 15, 4.0), (0.5, 20, 8.0)]
    assert first_crossing(points, 0.2) == Crossing((7.5, 2.0))              # half-way from 0.1 to 0.3
    found = first_crossing(points, 0.4)                                     # the dip below 0.3 does not count
    assert found is not None and found.at == pytest.approx((15 + 5 * 2 / 3, 4 + 4 * 2 / 3)) and not found.upper_bound
    assert first_crossing(points, 0.05) == Crossing((5.0, 1.0), upper_bound=True)
    assert first_crossing(points, 0.3) == Crossing((10.0, 3.0))             # exactly at an evaluation
    assert first_crossing(points, 0.6) is None and first_crossing([], 0.1) is None


# ---- pilots read from run folders ------------------------------------------------------------------------------------
def write_run(folder, accuracies: dict[int, float], plans=None, **config) -> None:
    """A history.json of ``len(plans)`` rounds: round t trained ``plans[t-1]`` ((cuts, I)), evaluated where given."""
    plans = plans or [([2, 2], 4)] * max(accuracies)
    records = [{"round": t, "train_loss": 1.0, "accuracy": accuracies.get(t), "test_loss": None,
                "sim_seconds": 0.5 * t, "round_sim_seconds": 0.5, "wall_seconds": 0.1 * t, "bytes_up": 0,
                "bytes_down": 0, "bytes_server": 0, "aggregated": False, "replanned": False,
                "cuts": cuts, "interval": interval} for t, (cuts, interval) in enumerate(plans, start=1)]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "history.json").write_text(json.dumps({"meta": {"config": {"lr": 0.05, "devices": 2, **config}},
                                                     "events": [], "records": records}))


def test_a_pilot_is_its_plan_and_its_interpolated_rounds_to_the_target(tmp_path) -> None:
    write_run(tmp_path / "a", {5: 0.2, 10: 0.4})
    run = read_pilot(tmp_path / "a", 0.3, {"lr": 0.05, "devices": 2})
    assert run == PilotRun(str(tmp_path / "a"), 4, 2, 0.3, 7.5)
    assert math.isclose(read_pilot(tmp_path / "a", 0.4).rounds, 10.0)
    write_run(tmp_path / "mixed", {5: 0.2, 10: 0.4}, plans=[([1, 3], 2)] * 10)
    assert read_pilot(tmp_path / "mixed", 0.3).deepest_cut == 3              # L_c = the deepest device's cut


def test_a_pilot_that_cannot_calibrate_is_one_message_naming_the_pilots(tmp_path) -> None:
    write_run(tmp_path / "low", {5: 0.2, 10: 0.25})
    write_run(tmp_path / "moved", {5: 0.2, 10: 0.4}, plans=[([2, 2], 4)] * 6 + [([1, 1], 4)] * 4)
    write_run(tmp_path / "other", {5: 0.2, 10: 0.4}, lr=0.1)
    cases = [(tmp_path / "none", "holds no history.json"),
             (tmp_path / "low", "never reached 30.0% test accuracy (at best 25.0% in 10 rounds)"),
             (tmp_path / "moved", "changed its plan before reaching 30.0% (2 plans)"),
             (tmp_path / "other", "trained with lr = 0.1, this run with 0.05"),
             (tmp_path / "no cut", "records no device's cut before reaching 30.0%")]      # (hostile_files: max([]))
    write_run(tmp_path / "no cut", {5: 0.2, 10: 0.4}, plans=[([], 4)] * 10)
    for folder, words in cases:
        with pytest.raises(InputError) as info:
            read_pilot(folder, 0.3, {"lr": 0.05, "devices": 2})
        assert info.value.field == "--pilots" and words in info.value.message
    # round 8 trained the new plan, and the accuracy crossed 30 % between the evaluations of rounds 5 and 10 (7.5)
    write_run(tmp_path / "at8", {5: 0.2, 10: 0.4}, plans=[([2, 2], 4)] * 7 + [([1, 1], 4)] * 3)
    with pytest.raises(InputError, match="changed its plan before reaching 30.0%"):
        read_pilot(tmp_path / "at8", 0.3)
    # a plan changed after the target was reached does not matter
    write_run(tmp_path / "late", {5: 0.2, 10: 0.4}, plans=[([2, 2], 4)] * 10 + [([1, 1], 4)] * 4)
    assert read_pilot(tmp_path / "late", 0.3).rounds == 7.5
