"""Builders the world-model, planner and CLI tests share: a three-cut toy profile and a two-device system with
numbers chosen for hand computation (tests/adaptplan/test_world_model.py writes its latencies out)."""

import pytest

from adaptplan.model_profile import CutPoint, ModelProfile
from adaptplan.system import DeviceSpec, SystemSpec


@pytest.fixture(scope="session")
def toy_profile() -> ModelProfile:
    """Three cut points: ρ_j 1, 2, 3 GFLOPs forward, ϖ_j 2, 4, 6 GFLOPs backward, ψ_j 8e6, 4e6, 1e3 bits of
    activations (= gradients), δ_j 1e6, 5e6, 9e6 bits of client parameters; input 3 × 8 × 8, 32-bit values."""
    rho, varpi, psi, delta = [1e9, 2e9, 3e9], [2e9, 4e9, 6e9], [8e6, 4e6, 1e3], [1e6, 5e6, 9e6]
    cuts = tuple(CutPoint(index=j + 1, name=f"layer{j + 1}", fp_flops=rho[j], bp_flops=varpi[j], activation_bits=psi[j],
                          gradient_bits=psi[j], client_param_bits=delta[j]) for j in range(3))
    return ModelProfile(model="toy", input_shape=(3, 8, 8), bits_per_value=32, cut_points=cuts)


@pytest.fixture(scope="session")
def toy_system() -> SystemSpec:
    """Two devices (0.1 and 0.2 TFLOP/s; links 1e7/2e7 and 2e7/4e7 bit/s), b = 10, a 1 TFLOP/s server and
    1e8 bit/s between the edge and the fed server. Frozen, so one instance serves every test."""
    return SystemSpec(batch_size=10, server_flops=1e12, edge_to_fed_bps=1e8, fed_to_edge_bps=1e8, devices=(
        DeviceSpec(flops=1e11, up_bps=1e7, down_bps=2e7, fed_up_bps=1e7, fed_down_bps=2e7),
        DeviceSpec(flops=2e11, up_bps=2e7, down_bps=4e7, fed_up_bps=5e6, fed_down_bps=1e7),
    ))
