"""benchmarks/device_check.py on a machine without CUDA: it compares the CPU's batched client passes with the
per-device ones for the algorithms asked for, says what it skipped, and refuses an unknown algorithm."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "device_check.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300,
                          cwd=SCRIPT.parents[1])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only half")
def test_the_cpu_half_checks_the_algorithms_asked_for() -> None:
    done = run("--algorithm", "gapsl,psl,sl", "--rounds", "2")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    # every device, then half of them (SL draws no participants: one line)
    assert [line.split()[:2] for line in lines[:-1]] == [["gapsl", "ρ=1"], ["gapsl", "ρ=0.5"], ["psl", "ρ=1"],
                                                         ["psl", "ρ=0.5"], ["sl", "ρ=1"]]
    for line in lines[:-1]:
        loss, params = map(float, re.search(r"cpu/on: loss (\S+) params (\S+)", line).groups())
        assert loss <= 1e-6 and params <= 1e-6
    assert lines[-1] == "no CUDA here: the CUDA runs and the CUDA↔CPU resume were skipped"


def test_an_unknown_algorithm_is_refused() -> None:
    done = run("--algorithm", "psl,fedsgd")
    assert done.returncode == 2
    assert "--algorithm: unknown fedsgd (choose from sl, psl," in done.stderr


def test_a_participation_outside_the_unit_interval_is_refused() -> None:
    done = run("--algorithm", "psl", "--participation", "1.5")
    assert done.returncode == 2
    assert "--participation: a fraction in (0, 1], got 1.5" in done.stderr
