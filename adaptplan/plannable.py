"""Instance-level limits: a (profile, system, constants) triple whose numbers are each in range can
still combine into latencies or an interval bound that the solvers cannot handle (a MILP coefficient
above ~10²⁰ is infinity to HiGHS; an interval bound of 10¹⁵⁰ rounds overflows I³). This module
refuses such instances with one message naming the cause, before any solver runs.
"""

from __future__ import annotations

import math

import numpy as np

from adaptplan.constants import ConvergenceConstants
from adaptplan.errors import InputError
from adaptplan.latency import LatencyModel
from adaptplan.model_profile import ModelProfile
from adaptplan.system import SystemSpec

MAX_STAGE_SECONDS = 1e9     # longest stage of one round or aggregation the planner accepts (≈ 32 years)
MAX_INTERVAL_BOUND = 1e9    # largest interval bound √(c/d) in rounds (a G² this small: use 0 instead)


def check_latencies(profile: ModelProfile, system: SystemSpec) -> None:
    """Raise :class:`InputError` when a stage latency of §2.4 (seconds) exceeds :data:`MAX_STAGE_SECONDS`
    for some device and cut; the message names the stage, the device and the cut."""
    model = LatencyModel(profile, system)
    n = system.num_devices
    per_device = {"client FP + upload": model.fp_up, "download + client BP": model.down_bp,
                  "model upload to the fed server": model.model_up, "model download from the fed server": model.model_down}
    for stage, seconds in per_device.items():
        i, j = np.unravel_index(int(np.argmax(seconds)), seconds.shape)
        _check_stage(float(seconds[i, j]), f"{stage} of device {i} at cut {j + 1}")
    server = n * model.server_per_device
    _check_stage(float(server.max()), f"server FP + BP at cut {int(np.argmax(server)) + 1}")
    edge_bits = n * float(profile.delta[-1])
    _check_stage(edge_bits / min(system.edge_to_fed_bps, system.fed_to_edge_bps), "edge <-> fed server model transfer")


def _check_stage(seconds: float, what: str) -> None:
    if not seconds <= MAX_STAGE_SECONDS:
        raise InputError(f"{what} would take {seconds:.3g} s, more than the {MAX_STAGE_SECONDS:g} s the planner "
                         f"handles; check the profile's FLOPs/bits against the system's FLOP/s and bit/s",
                         field="system")


def check_interval_bound(constants: ConvergenceConstants, num_devices: int) -> None:
    """Raise :class:`InputError` when the interval bound √(c/d) of Corollary 1 exceeds
    :data:`MAX_INTERVAL_BOUND` rounds for a cut with d = 4β²γ²A_ℓ > 0 (a G_j² that tiny is not drift:
    write 0)."""
    from adaptplan.convergence import ConvergenceModel

    model = ConvergenceModel(constants, num_devices)
    c = model.c
    if c <= 0:
        return   # unreachable target: the planner's own message explains it
    d = model.d_per_cut
    positive = d[d > 0]
    if positive.size and not c / float(positive.min()) <= MAX_INTERVAL_BOUND**2:
        bound = math.sqrt(c / float(positive.min())) if math.isfinite(c / float(positive.min())) else math.inf
        raise InputError(f"the smallest non-zero G_j^2 gives an interval bound sqrt(c/d) of {bound:.3g} rounds, "
                         f"more than {MAX_INTERVAL_BOUND:g}; write 0 for a block without gradient drift or use "
                         f"realistic beta, gamma and G2", field="constants.G2")


def check_plannable(profile: ModelProfile, system: SystemSpec, constants: ConvergenceConstants) -> None:
    """Both checks above; called by :class:`adaptplan.planner.Planner` before solving."""
    check_latencies(profile, system)
    check_interval_bound(constants, system.num_devices)
