"""CLI behaviour a new user meets first: closed pipes, channels-last shapes, own models on the path."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_closed_pipe_is_quiet():
    """`adaptplan plan | head -c 0`: the reader is gone before the plan is printed."""
    proc = subprocess.Popen([sys.executable, "-m", "adaptplan.cli", "plan"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    proc.wait(timeout=300)
    assert err == "", err
    assert proc.returncode in (0, 141)


def test_channels_last_input_is_one_line_with_the_fix():
    result = subprocess.run([sys.executable, "-m", "adaptplan.cli", "profile", "resnet18", "--input", "32x32x3"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "looks channels-last" in lines[0] and "3x32x32" in lines[0]


def test_own_model_from_the_working_directory_without_pythonpath(tmp_path):
    (tmp_path / "mymodels.py").write_text(textwrap.dedent("""
        from torch import nn
        def tiny(num_classes=10):
            return nn.Sequential(nn.Flatten(), nn.Linear(12, 5), nn.ReLU(), nn.Linear(5, num_classes))
    """))
    # -P: the working directory is not put on sys.path by Python (as for the `adaptplan` script);
    # PYTHONPATH names this checkout only, not tmp_path
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    code = "import sys; from adaptplan.cli import main; sys.exit(main(sys.argv[1:]))"
    result = subprocess.run([sys.executable, "-P", "-c", code, "profile", "mymodels:tiny", "--input", "3x2x2"],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert "2 cut points" in result.stdout
