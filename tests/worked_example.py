"""docs/model.md §7's worked example as a planning problem (the ``example`` fixture of tests/conftest.py): VGG-16
(§7.1), N = 20 with the §6.1 placeholder constants, ten devices cut at layer 4 and ten at layer 5 (``CUTS``).

The spec does not print the random device draws, only the per-device maxima of §7.2: nineteen devices at the
fast end of the §6.1 ranges and one slow device (index 19, cut 5) whose FLOP/s and rates are solved from the
printed maxima.
"""

from __future__ import annotations

from adaptplan.constants import ConvergenceConstants
from adaptplan.system import DeviceSpec, SystemSpec
from solvers.problem import PlanningProblem
from solvers.synthetic import vgg16_cifar_profile

CUTS = (4,) * 10 + (5,) * 10
B = 16


def _slow_device(profile) -> DeviceSpec:
    """The device that sets all four per-device maxima of §7.2 at cut 5."""
    p = profile.cut_points[4]
    # T_s^F + T_s^B = Σ_i b(ρ_L − ρ_ℓi)/f_s · (1 + 2), since ϖ = 2ρ (§7.1)
    server = 3 * B * sum(profile.cut_points[-1].fp_flops - profile.cut_points[c - 1].fp_flops for c in CUTS) / 50e12
    flops = 0.6e12
    fp_upload = 0.16690 - server - 0.03394  # a = T_split = 0.16690 s (§7.2)
    return DeviceSpec(flops=flops,
                      up_bps=B * p.activation_bits / (fp_upload - B * p.fp_flops / flops),
                      down_bps=B * p.gradient_bits / (0.03394 - B * p.bp_flops / flops),
                      fed_up_bps=p.client_param_bits / 0.25298,
                      fed_down_bps=p.client_param_bits / 0.05075)


def worked_example_problem() -> PlanningProblem:
    """The §7 problem: VGG-16, the §6.1 placeholder constants, nineteen fast devices and the slow one."""
    profile = vgg16_cifar_profile()
    fast = DeviceSpec(flops=1.5e12, up_bps=80e6, down_bps=380e6, fed_up_bps=80e6, fed_down_bps=380e6)
    system = SystemSpec(batch_size=16, server_flops=50e12, edge_to_fed_bps=500e6, fed_to_edge_bps=500e6,
                        devices=(fast,) * 19 + (_slow_device(profile),))
    constants = ConvergenceConstants.placeholder(16)
    return PlanningProblem.from_parts(profile, system, constants)
