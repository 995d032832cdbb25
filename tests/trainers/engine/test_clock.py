"""The simulated clock (trainers/engine/clock.py): eqs. (16)–(24) for the run's batch size and each round's system."""

from __future__ import annotations

import numpy as np
import torch

torch.set_num_threads(1)


def test_sim_clock_charges_eqs_16_to_24_for_the_runs_batch_and_each_rounds_system() -> None:
    from adaptplan.scenarios import default_scenario
    from adaptplan.system import SystemProcess
    from trainers.engine.clock import SimClock

    scenario = default_scenario()                               # 20 devices, system batch size 16
    profile, N, b = scenario.profile, scenario.system.num_devices, 8
    assert scenario.system.batch_size != b
    process = SystemProcess(scenario.system, seed=1, redraw=True)
    clock = SimClock(profile, process, batch_size=b)
    cuts = [(i % profile.num_cuts) + 1 for i in range(N)]

    def by_hand(t: int) -> dict[str, np.ndarray]:
        s = process.state(t)
        c = np.asarray(cuts) - 1
        f = np.array([d.flops for d in s.devices])
        rate = {k: np.array([getattr(d, k) for d in s.devices]) for k in ("up_bps", "down_bps", "fed_up_bps",
                                                                          "fed_down_bps")}
        return {"client_fp": b * profile.rho[c] / f,                                    # (16)
                "upload": b * profile.psi[c] / rate["up_bps"],                          # (17)
                "server": b * ((profile.rho[-1] - profile.rho[c]) + profile.server_bp[c]) / s.server_flops,  # (18)+(19)
                "download": b * profile.chi[c] / rate["down_bps"],                      # (20)
                "client_bp": b * profile.varpi[c] / f,                                  # (21)
                "model_up": profile.delta[c] / rate["fed_up_bps"],                      # (22)
                "model_down": profile.delta[c] / rate["fed_down_bps"]}                  # (24)

    first = clock.stage_times(3, cuts)
    for t in (3, 4, 3):                                          # round 3 again after 4: no stale system
        times = clock.stage_times(t, cuts)
        for name, expected in by_hand(t).items():
            np.testing.assert_allclose(getattr(times, name), expected, rtol=1e-12, err_msg=f"{name}, round {t}")
        assert times.batch_size == b
        assert (times.edge_to_fed_bps, times.fed_to_edge_bps) == (scenario.system.edge_to_fed_bps,
                                                                  scenario.system.fed_to_edge_bps)
    assert not np.allclose(clock.stage_times(4, cuts).client_fp, first.client_fp)    # re-drawn devices
    fixed = SimClock(profile, SystemProcess(scenario.system, seed=1, redraw=False), batch_size=b)
    np.testing.assert_array_equal(fixed.stage_times(2, cuts).upload, fixed.stage_times(9, cuts).upload)
