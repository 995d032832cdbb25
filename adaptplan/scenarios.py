"""Built-in scenarios.

The default scenario (``adaptplan plan`` with no arguments) is VGG-16 on CIFAR-10 (3×32×32,
fp32), profiled by this project's profiler and shipped as package data, 20 devices drawn by
:func:`adaptplan.system.generate_system` with seed 0 from the **placeholder** ranges of docs/model.md §6.1,
and the **placeholder** constants of docs/model.md §6.1 (not the paper's Table II values, which were not
recovered). Regenerate the profile with::

    adaptplan profile vgg16-cifar --input 3x32x32 -o adaptplan/data/vgg16_cifar10.json
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

from adaptplan.constants import ConvergenceConstants
from adaptplan.model_profile import ModelProfile
from adaptplan.system import SystemSpec, generate_system

DEFAULT_PROFILE_RESOURCE = "vgg16_cifar10.json"
DEFAULT_DEVICES = 20
DEFAULT_SEED = 0


@dataclass(frozen=True)
class Scenario:
    name: str
    profile: ModelProfile
    system: SystemSpec
    constants: ConvergenceConstants


def default_profile() -> ModelProfile:
    """The shipped VGG-16/CIFAR-10 profile (package data)."""
    text = resources.files("adaptplan").joinpath("data", DEFAULT_PROFILE_RESOURCE).read_text(encoding="utf-8")
    return ModelProfile.from_json(json.loads(text))


def default_scenario(devices: int = DEFAULT_DEVICES, seed: int = DEFAULT_SEED) -> Scenario:
    """VGG-16/CIFAR-10, ``devices`` generated devices (seed ``seed``), placeholder constants."""
    profile = default_profile()
    return Scenario(
        name=f"vgg16-cifar10, {devices} devices (seed {seed}), placeholder constants of docs/model.md §6.1",
        profile=profile,
        system=generate_system(devices, seed),
        constants=ConvergenceConstants.placeholder(profile.num_cuts),
    )
