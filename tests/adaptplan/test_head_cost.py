"""A U-shaped split on the clock (adaptplan/defence_cost.py ``with_head_on_device``): the head's compute moves to the
device, its features and their gradient cross the links, its parameters join the device's model; the plan keeps the
edge server a block before the head."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from adaptplan.cli import main
from adaptplan.defence_cost import DefenceSetting, head_cuts, with_head_on_device
from adaptplan.errors import InputError
from adaptplan.latency import LatencyModel
from adaptplan.system import DeviceSpec, SystemSpec
from solvers.synthetic import synthetic_profile


def _system() -> SystemSpec:
    devices = tuple(DeviceSpec(flops=f, up_bps=1e7, down_bps=2e7, fed_up_bps=1e7, fed_down_bps=3e7) for f in (1e9, 3e9))
    return SystemSpec(batch_size=8, server_flops=1e11, edge_to_fed_bps=1e8, fed_to_edge_bps=1e8, devices=devices)


def test_each_allowed_cut_gains_the_heads_compute_links_and_parameters_written_out() -> None:
    profile = synthetic_profile(6, seed=3)
    head = 2
    k = profile.num_cuts - head - 1                      # 0-based position of cut L − K, the head's input
    u = with_head_on_device(profile, head)
    rho, varpi, psi, chi, delta = profile.rho, profile.varpi, profile.psi, profile.chi, profile.delta
    for j in range(profile.num_cuts):
        c, p = u.cut_points[j], profile.cut_points[j]
        if j < k:
            assert c.fp_flops == pytest.approx(rho[j] + rho[-1] - rho[k], rel=1e-12)
            assert c.bp_flops == pytest.approx(varpi[j] + varpi[-1] - varpi[k], rel=1e-12)
            assert c.activation_bits == pytest.approx(psi[j] + chi[k], rel=1e-12)       # the head's gradient goes up
            assert c.gradient_bits == pytest.approx(chi[j] + psi[k], rel=1e-12)         # its features come down
            assert c.client_param_bits == pytest.approx(delta[j] + delta[-1] - delta[k], rel=1e-12)
        else:     # refused: the whole model on the device (cut L's compute and parameters), sizes as they were
            last = profile.cut_points[-1]
            assert (c.fp_flops, c.bp_flops, c.client_param_bits) == (last.fp_flops, last.bp_flops, last.client_param_bits)
            assert (c.activation_bits, c.gradient_bits) == (p.activation_bits, p.gradient_bits)
    assert u.cut_points[-1] == profile.cut_points[-1]
    shaped = LatencyModel(u, _system())
    b, fs = 8.0, 1e11
    for j in range(k):      # eq. (18): the server's forward ends at the head's input
        assert shaped.server_fp_per_device[j] == pytest.approx(b * (rho[k] - rho[j]) / fs, rel=1e-9)
        assert shaped.server_bp_per_device[j] == pytest.approx(b * (varpi[k] - varpi[j]) / fs, rel=1e-9)
        assert shaped.upload[1, j] == pytest.approx(b * (psi[j] + chi[k]) / 1e7, rel=1e-12)
        assert shaped.model_down[1, j] == pytest.approx((delta[j] + delta[-1] - delta[k]) / 3e7, rel=1e-12)
    assert with_head_on_device(profile, 0) is profile
    assert head_cuts(6, 2) == [1, 2, 3] and head_cuts(6, 0) == [1, 2, 3, 4, 5]


def test_a_measured_server_backward_loses_the_heads_share() -> None:
    profile = synthetic_profile(5, seed=1)
    from dataclasses import replace

    measured = replace(profile, cut_points=tuple(replace(c, server_bp_flops=100.0 * (5 - j))
                                                 for j, c in enumerate(profile.cut_points)))
    u = with_head_on_device(measured, 1)
    # cuts 1..3 lose cut 4's (the head's input) share; cuts 4 and 5 stand for the whole model on the device (cut 5's)
    assert [c.server_bp_flops for c in u.cut_points] == [500.0 - 200.0, 400.0 - 200.0, 300.0 - 200.0, 100.0, 100.0]


@pytest.mark.parametrize("head", [-1, 4, 9])
def test_a_head_that_leaves_no_cut_is_refused_naming_the_field(head: int) -> None:
    profile = synthetic_profile(5, seed=1)
    if head < 0:
        with pytest.raises(InputError, match="--defences"):
            DefenceSetting.parse(f"head={head}")
        return
    with pytest.raises(InputError, match="1..3 blocks") as err:
        with_head_on_device(profile, head, "--defence")
    assert err.value.field == "--defence"


def test_the_setting_parses_names_and_configures_a_head() -> None:
    setting = DefenceSetting.parse("nopeek=0.5,head=2")
    assert (setting.head, setting.nopeek, setting.name) == (2, 0.5, "nopeek=0.5,head=2")
    assert DefenceSetting.parse(setting.name) == setting and setting.config()["u_shaped"] == 2
    with pytest.raises(InputError, match="whole number"):
        DefenceSetting.parse("head=1.5")


def test_plan_under_a_head_keeps_every_device_before_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile, system = tmp_path / "p.json", tmp_path / "s.json"
    synthetic_profile(6, seed=3).save(profile)
    system.write_text(json.dumps(_system().to_json()))
    base = ["plan", "--profile", str(profile), "--system", str(system), "--json"]
    assert main(base) == 0
    free = json.loads(capsys.readouterr().out)
    assert main([*base, "--defence", "head=3"]) == 0
    shaped = json.loads(capsys.readouterr().out)
    assert max(shaped["cuts"]) <= 2 and max(free["cuts"]) >= 1
    assert main([*base, "--defence", "head=3", "--cuts", "4,5"]) == 2
    assert "--cuts" in capsys.readouterr().err
