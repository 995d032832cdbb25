"""The examples run as documented."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_replan_example_runs_and_replans():
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "replan_in_loop.py"), "--rounds", "60"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("round 1: cuts")
    assert "simulated seconds" in lines[-1]
