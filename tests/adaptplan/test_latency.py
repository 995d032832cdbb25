"""Both latency paths (``LatencyModel.breakdown`` and the vectorised ``stage_latencies`` every solver uses)
against the plain-Python reference of eqs. (16)–(26) on random systems where every max term binds somewhere:
asymmetric device rates, slow and asymmetric edge↔fed links, slow servers, profiles with and without
explicit server BP FLOPs."""

import numpy as np
import pytest

from adaptplan.constants import ConvergenceConstants
from adaptplan.latency import LatencyModel, total_latency
from adaptplan.model_profile import CutPoint, ModelProfile
from adaptplan.system import DeviceSpec, SystemSpec
from solvers.problem import PlanningProblem
from solvers.synthetic import synthetic_profile
from tests import reference_model as ref


def _log_uniform(rng, low, high):
    return float(np.exp(rng.uniform(np.log(low), np.log(high))))


def random_system(rng, num_devices):
    """Every rate drawn independently over three decades, so no two directions are equal."""
    devices = tuple(DeviceSpec(flops=_log_uniform(rng, 1e10, 2e12), up_bps=_log_uniform(rng, 1e6, 1e9),
                               down_bps=_log_uniform(rng, 1e6, 1e9), fed_up_bps=_log_uniform(rng, 1e6, 1e9),
                               fed_down_bps=_log_uniform(rng, 1e6, 1e9)) for _ in range(num_devices))
    return SystemSpec(batch_size=int(rng.integers(1, 64)), server_flops=_log_uniform(rng, 1e10, 1e14),
                      edge_to_fed_bps=_log_uniform(rng, 1e5, 1e9), fed_to_edge_bps=_log_uniform(rng, 1e5, 1e9),
                      devices=devices)


def with_server_bp(profile, rng):
    """The same profile with explicit (non-cumulative) server BP FLOPs per cut (eq. (19) variant)."""
    total = profile.cut_points[-1].bp_flops
    cuts = tuple(CutPoint(**{**p.__dict__, "server_bp_flops": (total - p.bp_flops) * float(rng.uniform(1.0, 1.5))})
                 for p in profile.cut_points)
    return ModelProfile(model=profile.model, input_shape=profile.input_shape, bits_per_value=32, cut_points=cuts)


def _instances(count=60):
    rng = np.random.default_rng(2024)
    for k in range(count):
        profile = synthetic_profile(int(rng.integers(3, 9)), seed=k)
        if k % 3 == 0:
            profile = with_server_bp(profile, rng)
        system = random_system(rng, int(rng.integers(1, 7)))
        cut_matrix = rng.integers(1, profile.num_cuts + 1, size=(8, system.num_devices))
        yield profile, system, cut_matrix


def test_breakdown_and_stage_latencies_equal_the_reference_on_random_systems():
    binds = dict.fromkeys(("device up", "edge up", "device down", "edge down"), 0)
    for profile, system, cut_matrix in _instances():
        model = LatencyModel(profile, system)
        t_split, t_agg = model.stage_latencies(cut_matrix)
        for k, cuts in enumerate(cut_matrix.tolist()):
            expected = ref.stage_terms(profile, system, cuts)
            bd = model.breakdown(cuts)
            for name in ("client_fp", "upload", "download", "client_bp", "model_up", "model_down"):
                np.testing.assert_allclose(getattr(bd, name), expected[name], rtol=1e-12, err_msg=name)
            for name in ("server_fp", "server_bp", "edge_model_up", "edge_model_down", "fp_upload_max",
                         "download_bp_max", "t_split", "t_agg"):
                assert getattr(bd, name) == pytest.approx(expected[name], rel=1e-12, abs=1e-300), name
            assert t_split[k] == pytest.approx(expected["t_split"], rel=1e-12)
            assert t_agg[k] == pytest.approx(expected["t_agg"], rel=1e-12)
            assert model.t_split(cuts) == pytest.approx(expected["t_split"], rel=1e-12)
            assert model.t_agg(cuts) == pytest.approx(expected["t_agg"], rel=1e-12)
            binds["device up"] += max(expected["model_up"]) > expected["edge_model_up"]
            binds["edge up"] += expected["edge_model_up"] > max(expected["model_up"])
            binds["device down"] += max(expected["model_down"]) > expected["edge_model_down"]
            binds["edge down"] += expected["edge_model_down"] > max(expected["model_down"])
    assert min(binds.values()) >= 30, binds  # each side of both aggregation maxima decides T_agg many times


def test_stage_latencies_with_a_fixed_deepest_cut():
    """S_n = Σ_i(δ_L − δ_ℓi) with L fixed above the vector's own deepest cut (the exact solvers' μ₆ = δ_L)."""
    for profile, system, cut_matrix in _instances(20):
        model = LatencyModel(profile, system)
        L = profile.num_cuts
        _, t_agg = model.stage_latencies(cut_matrix, deepest=L)
        for k, cuts in enumerate(cut_matrix.tolist()):
            terms = ref.stage_terms(profile, system, cuts)
            S_n = sum(profile.cut_points[L - 1].client_param_bits - profile.cut_points[l - 1].client_param_bits for l in cuts)
            expected = (max(max(terms["model_up"]), S_n / system.edge_to_fed_bps)
                        + max(max(terms["model_down"]), S_n / system.fed_to_edge_bps))
            assert t_agg[k] == pytest.approx(expected, rel=1e-12)


def test_slow_edge_links_in_each_direction_set_t_agg():
    """A slow edge→fed link only changes the upload max, a slow fed→edge link only the download max."""
    rng = np.random.default_rng(5)
    profile = synthetic_profile(5, seed=3)
    base = random_system(rng, 3)
    cuts = [1, 1, 5]  # S_n = 2(δ_5 − δ_1) > 0
    fast = SystemSpec(**{**base.__dict__, "edge_to_fed_bps": 1e12, "fed_to_edge_bps": 1e12})
    slow_up = SystemSpec(**{**fast.__dict__, "edge_to_fed_bps": 1e3})
    slow_down = SystemSpec(**{**fast.__dict__, "fed_to_edge_bps": 1e3})
    S_n = 2 * (profile.cut_points[4].client_param_bits - profile.cut_points[0].client_param_bits)
    t_fast = LatencyModel(profile, fast).t_agg(cuts)
    for system, direction in ((slow_up, "up"), (slow_down, "down")):
        model = LatencyModel(profile, system)
        bd = model.breakdown(cuts)
        assert model.t_agg(cuts) == pytest.approx(ref.stage_terms(profile, system, cuts)["t_agg"], rel=1e-12)
        assert model.t_agg(cuts) > t_fast + S_n / 1e3 * 0.99
        if direction == "up":
            assert bd.agg_up_max == pytest.approx(S_n / 1e3) and bd.agg_down_max < 100
        else:
            assert bd.agg_down_max == pytest.approx(S_n / 1e3) and bd.agg_up_max < 100


def test_objective_and_total_latency_equal_the_reference():
    rng = np.random.default_rng(11)
    for k, (profile, system, cut_matrix) in enumerate(_instances(15)):
        L = profile.num_cuts
        constants = ConvergenceConstants(beta=5.0, gamma=0.01, theta=float(rng.uniform(1, 3)), epsilon=0.1,
                                         sigma2=(0.5 * system.num_devices / L,) * L,
                                         G2=tuple(float(g) for g in rng.uniform(1e-5, 1e-3, L)))
        problem = PlanningProblem.from_parts(profile, system, constants, candidates=range(1, L + 1))
        for cuts in cut_matrix.tolist():
            for interval in (1, 2, 5, 13):
                expected = ref.objective(profile, system, constants, interval, cuts)
                got = problem.objective(interval, cuts)
                if np.isinf(expected):
                    assert np.isinf(got)
                    continue
                assert got == pytest.approx(expected, rel=1e-10)
                assert problem.total_latency(interval, cuts) == pytest.approx(
                    ref.exact_total(profile, system, constants, interval, cuts), rel=1e-10)


def test_total_latency_eq26_integer_aggregations():
    assert total_latency(10, 3, 2.0, 5.0) == 10 * 2.0 + 3 * 5.0
    assert total_latency(9, 3, 2.0, 5.0) == 9 * 2.0 + 3 * 5.0
    assert total_latency(2, 3, 2.0, 5.0) == 4.0


def test_split_and_aggregation_latency_are_the_section_2_4_formulas():
    """The one implementation of T_split and T_agg (§2.4) that the breakdown and the vectorised
    stage latencies both call, written out on two cut vectors of three devices."""
    from adaptplan.latency import aggregation_latency, non_common_bits, split_latency

    fp_up = np.array([[1.0, 4.0, 2.0], [3.0, 1.0, 1.0]])
    down_bp = np.array([[2.0, 1.0, 5.0], [1.0, 1.0, 2.0]])
    assert split_latency(fp_up, np.array([0.5, 0.25]), down_bp).tolist() == [4.0 + 0.5 + 5.0, 3.0 + 0.25 + 2.0]
    up, down = np.array([[1.0, 2.0, 3.0]]), np.array([[0.5, 0.5, 0.5]])
    assert aggregation_latency(up, np.array([4.0]), down, np.array([0.25])).tolist() == [4.0 + 0.5]
    assert aggregation_latency(up, np.array([1.0]), down, np.array([0.75])).tolist() == [3.0 + 0.75]
    delta = np.array([10.0, 30.0, 60.0])
    cuts = np.array([[0, 2, 1], [1, 1, 1]])
    assert non_common_bits(delta, cuts, cuts.max(axis=1)).tolist() == [(60 - 10) + 0 + (60 - 30), 0.0]
