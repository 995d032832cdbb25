"""A defence's FLOPs on the latency model (adaptplan/defence_cost.py): eqs. (16) and (21) with ο^F_j and ο^B_j
written out, the counts of the module docstring at a hand-computed cut, the server's terms untouched, the profile
file round trip, and a defended run's simulated device stages longer (its uplink the same)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from adaptplan.cli import main
from adaptplan.defence_cost import defence_flops, with_defence_cost
from adaptplan.latency import LatencyModel
from adaptplan.model_profile import ModelProfile
from adaptplan.system import DeviceSpec, SystemSpec
from solvers.synthetic import synthetic_profile
from trainers.run.history import History


def _system() -> SystemSpec:
    devices = tuple(DeviceSpec(flops=f, up_bps=1e7, down_bps=2e7, fed_up_bps=1e7, fed_down_bps=1e7) for f in (1e9, 3e9))
    return SystemSpec(batch_size=8, server_flops=1e11, edge_to_fed_bps=1e8, fed_to_edge_bps=1e8, devices=devices)


def test_the_counts_at_one_cut_are_the_module_docstrings() -> None:
    fp, bp = defence_flops(True, True, True, 4, 10.0, np.array([6.0]))
    assert fp.tolist() == [3 * 6 + 6 + 3 * 4 * (10 + 6) + 10 * 4]          # clip 3d, noise d, NoPeek 3b(n + d) + 10b
    assert bp.tolist() == [4 * 6 + 6 * 4 * 6 + 20 * 4]                      # clip 4d, NoPeek 6bd + 20b
    fp, bp = defence_flops(False, False, False, 4, 10.0, np.array([6.0, 2.0]))
    assert fp.tolist() == [0.0, 0.0] and bp.tolist() == [0.0, 0.0]


def test_eqs_16_and_21_charge_the_defence_on_the_device_only() -> None:
    profile = synthetic_profile(5, seed=2)
    defended = with_defence_cost(profile, True, True, True, 8)
    plain, charged = LatencyModel(profile, _system()), LatencyModel(defended, _system())
    values = profile.psi / profile.bits_per_value
    fp, bp = defence_flops(True, True, True, 8, float(np.prod(profile.input_shape)), values)
    fp[-1] = bp[-1] = 0.0                                                      # the model's output is never sent
    f = np.array([1e9, 3e9])[:, None]
    assert np.allclose(charged.client_fp - plain.client_fp, 8 * fp[None, :] / f, rtol=1e-12)
    assert np.allclose(charged.client_bp - plain.client_bp, 8 * bp[None, :] / f, rtol=1e-12)
    for name in ("upload", "download", "server_fp_per_device", "server_bp_per_device", "model_up"):
        assert np.array_equal(getattr(charged, name), getattr(plain, name)), name
    assert with_defence_cost(profile, False, False, False, 8) is profile


def test_a_defended_profile_round_trips_through_its_file(tmp_path: Path) -> None:
    defended = with_defence_cost(synthetic_profile(4, seed=1), True, False, True, 16)
    defended.save(tmp_path / "p.json")
    again = ModelProfile.load(tmp_path / "p.json")
    assert again == defended and np.array_equal(again.defence_fp, defended.defence_fp) and again.defence_fp[0] > 0


def test_a_defended_runs_device_stages_are_longer_and_its_uplink_the_same(tmp_path: Path) -> None:
    argv = ["train", "--algorithm", "sfl-v2", "--dataset", "synthetic", "--model", "mlp", "--devices", "2", "--cuts",
            "1", "--batch-size", "8", "--rounds", "1", "--no-progress", "--static-resources", "--threads", "1"]
    assert main([*argv, "--out", str(tmp_path / "plain")]) == 0
    assert main([*argv, "--activation-clip", "1", "--nopeek", "0.1", "--out", str(tmp_path / "nopeek")]) == 0
    plain, nopeek = (History.load(tmp_path / k).records[0].stage_seconds for k in ("plain", "nopeek"))
    assert nopeek["device FP"] > plain["device FP"] and nopeek["device BP"] > plain["device BP"]
    assert nopeek["uplink"] == pytest.approx(plain["uplink"], rel=1e-12)          # the same bytes
