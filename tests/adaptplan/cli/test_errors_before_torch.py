"""Errors before torch (issue 37 item 4): every command checks its flags and the files it names before it imports
torch, so a wrong value is refused in a second — here with torch and torchvision made unimportable, each case one
line naming the flag or file, exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
BLOCKED = r"""
import json, sys
for name in ("torch", "torchvision", "fvcore"):
    sys.modules[name] = None                      # `import torch` raises ImportError from here on
from adaptplan.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    import contextlib, io
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    results.append([code, err.getvalue(), [m for m in ("torch", "torchvision") if sys.modules.get(m) is not None]])
print(json.dumps(results))
"""


def test_a_bad_value_is_refused_without_torch(tmp_path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    done = tmp_path / "done"
    done.mkdir()
    (done / "history.json").write_text("{\n  \"meta\": {}, \"records\": []}")        # begins as a run's history does
    cases = [
        (["train", "--devices", "0"], "--devices: must be an integer ≥ 1"),
        (["train", "--algorithm", "sfl-v3"], "--algorithm: unknown value 'sfl-v3'"),
        (["train", "--lr", "-1"], "--lr: must be in (0, 1e+06]"),
        (["train", "--model", "resnet19"], "--model: unknown model 'resnet19' (similar: resnet18"),
        (["train", "--dataset", "nope"], "--dataset: invalid choice: 'nope'"),
        (["train", "--resume"], "--resume: needs --out"),
        (["train", "--system", str(bad)], "system: missing required key"),
        (["train", "--constants", str(bad)], "constants: missing required key"),
        (["train", "--plan", str(tmp_path / "absent.json")], "does not exist"),
        (["train", "--device-data", str(tmp_path / "absent")], "--device-data: "),
        (["train", "--out", str(bad)], "--out: "),
        (["train", "--out", str(done)], "already holds a run"),
        (["train", "--config", str(bad)], "--config: "),
        (["train", "--mlflow", "mlruns"], "--mlflow: 'mlruns' is not an MLflow tracking URI"),
        (["train", "--mlflow", "local"], "--mlflow: 'local' is a store in the run folder: give --out too"),
        (["split-data", "--devices", "3", "--out", str(bad)], "--out: "),
        (["profile", "resnet19", "--input", "3x32x32"], "MODEL: unknown model 'resnet19'"),
        (["profile", "resnet18", "--input", "3x32"], "--input: expected CxHxW"),
        (["profile", "resnet18"], "--input: required: the per-sample input shape CxHxW"),   # and no --dataset
        (["profile", "resnet18-cifar", "--input", "32x32x3"], "--input: 32x32x3 looks channels-last"),  # was accepted
        (["split-data", "--dataset", "nope", "--devices", "3", "--out", str(tmp_path / "d")], "--dataset: unknown"),
        (["provision", "--broker", "x", "--devices", "3", "--out", str(tmp_path / "p")], "--broker: 'x' is not"),
        (["provision", "--broker", "x:1", "--devices", "3", "--out", str(tmp_path / "p"), "--", "--rounds", "0"],
         "--rounds: must be an integer ≥ 1"),
        (["bench", "engine", "--algorithm", "nope"], "--algorithm: unknown value 'nope'"),
        (["bench", "engine", "--model", "resnet19"], "--model: unknown model"),
        (["bench", "papers", "--paper", "nope"], "--paper: unknown paper 'nope'"),
        (["plot", str(tmp_path / "absent")], "no history.json"),
        (["plan", "--devices", "0"], "--devices: must be an integer in 1..10,000"),
        (["system", "--devices", "0"], "--devices: must be an integer in 1..10,000"),
    ]
    out = subprocess.run([sys.executable, "-c", BLOCKED, json.dumps([argv for argv, _ in cases])], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for (argv, expected), (code, err, loaded) in zip(cases, json.loads(out.stdout.splitlines()[-1])):
        assert code == 2 and expected in err and err.count("\n") == 1, (argv, code, err)
        assert "internal error" not in err and "Traceback" not in err and not loaded, (argv, err)
