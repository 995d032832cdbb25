"""The shipped default-scenario profile is exactly what the profiler produces (so it is regenerable),
and it is the paper's VGG-16 (docs/model.md §7.1)."""

import pytest

from adaptplan.scenarios import default_profile, default_scenario


def test_shipped_profile_is_regenerated_by_the_profiler():
    from profilers import profile_model
    from trainers.inputs.models import build_model

    fresh = profile_model(build_model("vgg16-cifar", (3, 32, 32), 10), (3, 32, 32), model_name="vgg16-cifar")
    assert fresh.to_json() == default_profile().to_json()


def test_default_profile_matches_spec_vgg16():
    profile = default_profile()
    assert profile.num_cuts == 16                                   # 13 conv + 3 FC
    assert profile.rho[-1] == pytest.approx(0.6275e9, rel=1e-3)    # ρ_16 = 0.6275 GFLOP per sample
    assert profile.delta[-1] == pytest.approx(487.8e6, rel=1e-3)   # δ_16 = 487.8 Mbit
    assert profile.delta[-1] == 15_245_130 * 32


def test_default_scenario_is_deterministic():
    a, b = default_scenario(), default_scenario()
    assert a.system == b.system and a.system.num_devices == 20
    assert a.constants.num_cuts == a.profile.num_cuts
