"""Small hand-made instances shared by the world-model and CLI tests (numbers chosen for hand computation)."""

from adaptplan.model_profile import CutPoint, ModelProfile
from adaptplan.system import DeviceSpec, SystemSpec


def three_cut_profile(**overrides) -> ModelProfile:
    rho, varpi, psi, delta = [1e9, 2e9, 3e9], [2e9, 4e9, 6e9], [8e6, 4e6, 1e3], [1e6, 5e6, 9e6]
    cuts = tuple(CutPoint(index=j + 1, name=f"layer{j + 1}", fp_flops=rho[j], bp_flops=varpi[j], activation_bits=psi[j],
                          gradient_bits=psi[j], client_param_bits=delta[j]) for j in range(3))
    return ModelProfile(model="toy", input_shape=(3, 8, 8), bits_per_value=32, cut_points=cuts, **overrides)


def two_device_system() -> SystemSpec:
    return SystemSpec(batch_size=10, server_flops=1e12, edge_to_fed_bps=1e8, fed_to_edge_bps=1e8, devices=(
        DeviceSpec(flops=1e11, up_bps=1e7, down_bps=2e7, fed_up_bps=1e7, fed_down_bps=2e7),
        DeviceSpec(flops=2e11, up_bps=2e7, down_bps=4e7, fed_up_bps=5e6, fed_down_bps=1e7),
    ))
