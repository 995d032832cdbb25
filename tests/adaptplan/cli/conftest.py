"""The plan commands' shared input: the toy profile and system (tests/adaptplan/conftest.py) and constants with a
reachable ε, written as the three JSON files ``adaptplan plan`` reads."""

from pathlib import Path

import pytest

from adaptplan.constants import ConvergenceConstants


@pytest.fixture
def toy_plan_files(tmp_path, toy_profile, toy_system) -> tuple[dict[str, Path], ConvergenceConstants]:
    """``({"profile": …, "system": …, "constants": …}, constants)``: the files in ``tmp_path`` and the constants."""
    constants = ConvergenceConstants(beta=5, gamma=0.01, theta=2.3, epsilon=0.1, sigma2=(1.0,) * 3, G2=(2e-3,) * 3)
    paths = {name: tmp_path / f"{name}.json" for name in ("profile", "system", "constants")}
    toy_profile.save(paths["profile"])
    toy_system.save(paths["system"])
    constants.save(paths["constants"])
    return paths, constants
