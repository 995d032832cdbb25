"""The world model: SystemSpec, latency eqs. (16)-(26), Corollary 1, Plan — against hand-computed values."""

import json
import math

import numpy as np
import pytest

from adaptplan.constants import ConvergenceConstants
from adaptplan.convergence import ConvergenceModel
from adaptplan.errors import InfeasibleError, InputError
from adaptplan.latency import LatencyModel, total_latency
from adaptplan.model_profile import ModelProfile
from adaptplan.plan import Plan
from adaptplan.system import SystemProcess, SystemSpec, generate_system


def test_latency_terms_match_hand_computation(toy_profile, toy_system):
    model = LatencyModel(toy_profile, toy_system)
    bd = model.breakdown([1, 2])
    # (16)+(17): device 0: 10*1e9/1e11 + 10*8e6/1e7 = 0.1 + 8.0; device 1: 0.1 + 2.0
    np.testing.assert_allclose(bd.client_fp + bd.upload, [8.1, 2.1])
    assert bd.server_fp == pytest.approx(0.03)   # (18): 10*(2e9 + 1e9)/1e12
    assert bd.server_bp == pytest.approx(0.06)   # (19): 10*(4e9 + 2e9)/1e12
    np.testing.assert_allclose(bd.download + bd.client_bp, [4.2, 1.2])  # (20)+(21)
    assert bd.t_split == pytest.approx(8.1 + 0.03 + 0.06 + 4.2)
    # (22)-(25): S_n = (5e6 - 1e6) + 0 = 4e6 bits over 1e8 bit/s
    np.testing.assert_allclose(bd.model_up, [0.1, 1.0])
    assert bd.edge_model_up == pytest.approx(0.04)
    np.testing.assert_allclose(bd.model_down, [0.05, 0.5])
    assert bd.t_agg == pytest.approx(1.5)
    assert model.t_split([1, 2]) == pytest.approx(bd.t_split)
    assert model.t_agg([1, 2]) == pytest.approx(bd.t_agg)
    assert bd.dominant_stage == "client FP + upload"


def test_edge_server_payload_can_dominate_aggregation(toy_profile, toy_system):
    slow_edge = SystemSpec(**{**toy_system.__dict__, "edge_to_fed_bps": 1e5})
    bd = LatencyModel(toy_profile, slow_edge).breakdown([1, 3])  # S_n = 8e6 bits
    assert bd.edge_model_up == pytest.approx(80.0)
    assert bd.agg_up_max == pytest.approx(80.0)


def test_server_bp_flops_replaces_varpi_difference(toy_profile, toy_system):
    cuts = tuple(c.__class__(**{**c.__dict__, "server_bp_flops": 7e9 - c.bp_flops}) for c in toy_profile.cut_points)
    profile = ModelProfile(model="toy", input_shape=(3, 8, 8), bits_per_value=32, cut_points=cuts)
    bd = LatencyModel(profile, toy_system).breakdown([1, 2])
    assert bd.server_bp == pytest.approx(10 * (5e9 + 3e9) / 1e12)


def test_total_latency_eq26():
    assert total_latency(8583, 8, 0.16690, 0.44189) == pytest.approx(8583 * 0.16690 + 1072 * 0.44189)


def test_convergence_matches_spec_worked_example():
    model = ConvergenceModel(ConvergenceConstants.placeholder(16), num_devices=20)
    assert model.c == pytest.approx(0.06)
    assert model.d(5) == pytest.approx(1e-4)
    assert model.interval_bound(5) == pytest.approx(24.4949, abs=1e-4)
    assert model.rounds(8, 5) == pytest.approx(8582.1, abs=0.1)
    assert model.objective(8, 5, 0.16690, 0.44189) == pytest.approx(1906.4, abs=0.1)
    for interval, expected in [(6, 1961.9), (7, 1920.4), (9, 1914.4), (10, 1942.0)]:
        assert model.objective(interval, 5, 0.16690, 0.44189) == pytest.approx(expected, abs=0.1)


def test_infeasible_target_names_the_constraint():
    constants = ConvergenceConstants(beta=5, gamma=0.01, theta=2.3, epsilon=0.01, sigma2=(1.0,) * 16, G2=(2e-3,) * 16)
    model = ConvergenceModel(constants, num_devices=20)
    with pytest.raises(InfeasibleError, match="epsilon=0.01 is unreachable"):
        model.check_reachable()
    ok = ConvergenceModel(ConvergenceConstants.placeholder(16), 20)
    assert math.isinf(ok.objective(25, 5, 1.0, 1.0))
    with pytest.raises(InfeasibleError, match="I must be < 24.49"):
        ok.rounds(25, 5)


def test_system_json_and_toml_round_trip(tmp_path):
    system = generate_system(5, seed=3)
    for name in ("s.json", "s.toml"):
        system.save(tmp_path / name)
        assert SystemSpec.load(tmp_path / name) == system


def test_system_validation_names_device_and_field(tmp_path, toy_system):
    data = toy_system.to_json()
    data["devices"][1]["up_bps"] = 0
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"system.devices\[1\].up_bps: must be > 0"):
        SystemSpec.load(path)
    del data["devices"][0]["flops"]
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"system.devices\[0\]: missing required key 'flops'"):
        SystemSpec.load(path)
    data = toy_system.to_json()
    data["colour"] = "red"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match="unknown key 'colour'"):
        SystemSpec.load(path)


def test_generator_is_deterministic_and_within_ranges():
    a, b = generate_system(50, seed=1), generate_system(50, seed=1)
    assert a == b and a != generate_system(50, seed=2)
    flops = a.device_array("flops")
    assert flops.min() >= 0.5e12 and flops.max() <= 1.5e12
    assert a.device_array("down_bps").min() >= 350e6


def test_per_round_redraw_and_noise():
    process = SystemProcess(generate_system(200, seed=0), seed=7, redraw=True, noise_cv=0.1)
    assert process.state(3) == process.state(3)
    assert process.state(3) != process.state(4)
    assert process.state(3).device_array("down_bps").tolist() == process.base.device_array("down_bps").tolist()
    truth, seen = process.state(5).device_array("flops"), process.measured(5).device_array("flops")
    ratio = seen / truth
    assert abs(ratio.mean() - 1) < 0.03 and 0.07 < ratio.std() < 0.13


def test_profile_round_trip_and_validation(tmp_path, toy_profile):
    profile = toy_profile
    profile.save(tmp_path / "p.json")
    assert ModelProfile.load(tmp_path / "p.json") == profile
    data = profile.to_json()
    data["cut_points"][2]["fp_flops"] = 1.0
    with pytest.raises(InputError, match="cumulative"):
        ModelProfile.from_json(data)
    data = profile.to_json()
    data["cut_points"][0]["flops"] = 1.0
    with pytest.raises(InputError, match=r"profile.cut_points\[0\]: unknown key 'flops'"):
        ModelProfile.from_json(data)


def test_constants_length_mismatch():
    with pytest.raises(InputError, match="sigma2 has 3 entries but G2 has 2"):
        ConvergenceConstants(beta=1, gamma=0.1, theta=1, epsilon=1, sigma2=(1, 1, 1), G2=(1, 1))


def test_plan_round_trip(tmp_path):
    plan = Plan(interval=8, cuts=(4, 4, 5), rounds=8583, aggregations=1072, round_latency_s=0.1669,
                aggregation_latency_s=0.4419, total_latency_s=1906.21, objective_s=1906.4,
                solver={"method": "bcd", "iterations": 3}, breakdown={"server FP": 0.1})
    plan.save(tmp_path / "plan.json")
    assert Plan.load(tmp_path / "plan.json") == plan
    assert plan.deepest_cut == 5


def test_a_step_above_one_over_beta_is_planned_with_eq15_as_a_model():
    """γ = 0.5 > 1/β = 0.2: Corollary 1's R is still eq. (15) written out, 2ϑ/(γ(c − dI²))."""
    constants = ConvergenceConstants(beta=5, gamma=0.5, theta=2.3, epsilon=100, sigma2=(1.0,) * 3, G2=(2e-3,) * 3)
    model = ConvergenceModel(constants, num_devices=20)
    model.check_reachable()
    c = 100 - 5 * 0.5 * 3.0 / 20
    d = 4 * 25 * 0.25 * 2 * 2e-3
    assert model.rounds(3, 2) == pytest.approx(2 * 2.3 / (0.5 * (c - d * 9)), rel=1e-12)


def test_saving_onto_a_folder_is_an_input_error(tmp_path, toy_system):
    with pytest.raises(InputError, match="is a folder"):
        toy_system.save(tmp_path)
    assert list(tmp_path.iterdir()) == []
