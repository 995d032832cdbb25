"""docs/model.md §7, the worked numeric example, end to end: VGG-16 (§7.1), N = 20 with the §6.1
placeholder constants, ten devices cut at layer 4 and ten at layer 5 — every printed figure of §7.2–§7.5,
through the latency model, Theorem 2 and ``build_plan`` (⌈R⌉ = 8,583 rounds, 1,072 aggregations,
eq. (26) = 1,906.21 s).

The spec does not print the random device draws, only the per-device maxima of §7.2. The system below
reproduces them: nineteen devices at the fast end of the §6.1 ranges and one slow device (index 19, cut
5) whose FLOP/s and rates are solved from the printed maxima. Everything else follows from the profile
and the constants.
"""

import dataclasses

import pytest

from adaptplan.constants import ConvergenceConstants
from adaptplan.planner import Planner, build_plan
from adaptplan.scenarios import default_profile
from solvers.bcd import ma_step
from solvers.interval import best_interval, interval_objective, newton_interval
from solvers.synthetic import vgg16_cifar_profile
from tests import reference_model as ref
from tests.worked_example import CUTS


def test_7_1_profile_and_constants():
    profile = vgg16_cifar_profile()
    assert profile.num_cuts == 16
    # the analytic profile equals the profiler's measurement of the torch VGG-16 shipped as the default scenario
    measured = default_profile()
    for name in ("rho", "psi", "chi", "delta"):
        assert getattr(profile, name).tolist() == getattr(measured, name).tolist(), name
    assert profile.names == [f"conv{k}" for k in range(1, 14)] + ["fc1", "fc2", "fc3"]
    assert profile.cut_points[-1].client_param_bits == 15_245_130 * 32
    assert (profile.model, profile.input_shape, profile.bits_per_value) == ("vgg16", (3, 32, 32), 32)
    assert profile.cut_points[-1].fp_flops == pytest.approx(0.6275e9, rel=1e-3)
    assert profile.cut_points[-1].client_param_bits == pytest.approx(487.8e6, rel=1e-3)
    assert all(p.bp_flops == 2 * p.fp_flops and p.gradient_bits == p.activation_bits for p in profile.cut_points)
    constants = ConvergenceConstants.placeholder(16)
    assert (constants.beta, constants.gamma, constants.theta, constants.epsilon) == (5.0, 0.01, 2.3, 0.1)
    assert constants.sigma2 == (1.0,) * 16 and constants.G2 == (2e-3,) * 16
    assert sum(constants.G2[:5]) == pytest.approx(0.01)  # A_5


def test_7_2_latency_terms(example):
    bd = example.latency.breakdown(CUTS)
    assert bd.fp_upload_max == pytest.approx(0.12497, abs=5e-6)
    assert bd.server_fp == pytest.approx(0.00266, abs=5e-6)
    assert bd.server_bp == pytest.approx(0.00533, abs=5e-6)
    assert bd.download_bp_max == pytest.approx(0.03394, abs=5e-6)
    assert bd.t_split == pytest.approx(0.16690, abs=5e-6)
    assert max(bd.model_up) == pytest.approx(0.25298, abs=5e-6)
    assert bd.edge_model_up == pytest.approx(0.18891, abs=5e-6)
    assert max(bd.model_down) == pytest.approx(0.05075, abs=5e-6)
    assert bd.edge_model_down == pytest.approx(0.18891, abs=5e-6)
    assert bd.t_agg == pytest.approx(0.25298 + 0.18891, abs=5e-6)
    a, b = example.latency.stage_latencies([CUTS])
    assert (a[0], b[0]) == (pytest.approx(0.16690, abs=5e-6), pytest.approx(0.44189, abs=5e-6))
    profile, system = example.latency.profile, example.latency.system
    assert ref.stage_terms(profile, system, CUTS)["t_agg"] == pytest.approx(bd.t_agg, rel=1e-12)


def test_7_3_and_7_4_theorem_2(example):
    conv = example.convergence
    assert conv.c == pytest.approx(0.06, abs=1e-15)
    assert conv.d(5) == pytest.approx(1e-4, rel=1e-12)
    assert conv.interval_bound(5) == pytest.approx(24.49, abs=5e-3)
    a, b = example.stage_latencies(CUTS)
    assert newton_interval(a, b, 0.06, 1e-4) == pytest.approx(8.108701, abs=2e-5)
    assert interval_objective(8, a, b, conv.c, conv.d(5)) == pytest.approx(4.14435, abs=1e-4)  # a, b printed to 5 decimals: ±9e-5
    assert interval_objective(9, a, b, conv.c, conv.d(5)) == pytest.approx(4.16184, abs=1e-4)
    assert best_interval(a, b, conv.c, conv.d(5)) == 8
    assert ma_step(example, CUTS) == 8
    brute = min(range(1, 25), key=lambda I: interval_objective(I, a, b, conv.c, conv.d(5)))
    assert brute == 8


@pytest.mark.parametrize("interval, expected", [(6, 1961.9), (7, 1920.4), (8, 1906.4), (9, 1914.4), (10, 1942.0)])
def test_7_5_objective_table(example, interval, expected):
    assert example.objective(interval, CUTS) == pytest.approx(expected, abs=0.06)
    profile, system, constants = example.latency.profile, example.latency.system, example.convergence.constants
    assert ref.objective(profile, system, constants, interval, CUTS) == pytest.approx(expected, abs=0.06)


def test_7_5_build_plan_reports_8583_rounds_1072_aggregations_1906_21_s(example):
    plan = build_plan(example, CUTS, 8, {"method": "given"})
    assert example.convergence.rounds(8, 5) == pytest.approx(8582.1, abs=0.05)
    assert plan.rounds == 8583                       # ⌈R⌉, not ⌊R⌋
    assert plan.aggregations == 1072                 # ⌊8583/8⌋
    assert plan.total_latency_s == pytest.approx(1906.21, abs=0.01)   # eq. (26) with integers
    assert plan.objective_s == pytest.approx(1906.4, abs=0.06)        # relaxed (28)
    assert plan.round_latency_s == pytest.approx(0.16690, abs=5e-6)
    assert plan.aggregation_latency_s == pytest.approx(0.44189, abs=5e-6)
    assert plan.interval == 8 and plan.cuts == CUTS and plan.deepest_cut == 5
    assert plan.breakdown["client FP + upload"] == pytest.approx(0.12497, abs=5e-6)
    assert plan.breakdown["model upload"] == pytest.approx(0.25298, abs=5e-6)
    assert plan.breakdown["model download"] == pytest.approx(0.18891, abs=5e-6)
    evaluated = Planner(example.latency.profile, example.latency.system).evaluate(CUTS, 8)
    assert dataclasses.replace(evaluated, model=None) == plan  # evaluate() adds the model identity only


def test_7_5_exact_eq26_is_also_minimised_at_8(example):
    totals = {I: build_plan(example, CUTS, I, {}).total_latency_s for I in range(1, 25)}
    assert min(totals, key=totals.get) == 8
    profile, system, constants = example.latency.profile, example.latency.system, example.convergence.constants
    for I in (1, 7, 8, 9, 24):
        plan = build_plan(example, CUTS, I, {})
        R, aggregations, total = ref.exact_total(profile, system, constants, I, CUTS)
        assert (plan.rounds, plan.aggregations) == (R, aggregations)
        assert plan.total_latency_s == pytest.approx(total, rel=1e-12)
        assert abs(plan.total_latency_s / plan.objective_s - 1) < 2e-4 or I == 24  # relaxation error < 0.02 %
