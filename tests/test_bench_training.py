"""`adaptplan bench training`: its JSON agrees with `adaptplan train --policy` runs of the same options."""

from __future__ import annotations

import json

from adaptplan.cli import main


def test_bench_training_json_matches_the_runs_own_records(tmp_path, capsys) -> None:
    report = tmp_path / "bench.json"
    common = ["--devices", "20", "--dataset", "synthetic", "--eval-every", "2", "--test-samples", "400"]
    assert main(["bench", "training", "--policies", "adaptsfl,rma+rms", "--partition", "iid", "--rounds", "6",
                 "--target-accuracy", "0.2", "--workers", "1", "--json", str(report), *common]) == 0
    data = json.loads(report.read_text())
    assert data["target_accuracy"] == 0.2 and set(data["policies"]) == {"adaptsfl", "rma+rms"}
    for policy in ("adaptsfl", "rma+rms"):
        run = tmp_path / policy
        extra = ["--replan-every", "50"] if policy == "adaptsfl" else []
        assert main(["train", "--policy", policy, "--rounds", "6", "--lr", "0.05", "--momentum", "0.9", "--threads", "1",
                     "--batch-size", "16", "--no-progress", "--max-test-samples", "400", "--out", str(run), *extra,
                     *common[:-2]]) == 0
        history = json.loads((run / "history.json").read_text())
        evaluated = [r for r in history["records"] if r["accuracy"] is not None]
        reached = next((r for r in evaluated if r["accuracy"] >= 0.2), None)
        figures = data["policies"][policy]
        assert figures["final_accuracy"] == evaluated[-1]["accuracy"]
        assert figures["rounds_to_target"] == (reached["round"] if reached else None)
        assert figures["time_to_target_s"] == (reached["sim_seconds"] if reached else None)
        assert figures["converged_round"] is None               # 3 evaluations cannot make a 5-evaluation streak


def test_bench_training_bad_flags_exit_2(capsys) -> None:
    assert main(["bench", "training", "--policies", "adaptsfl,random"]) == 2
    assert "--policies" in capsys.readouterr().err
    assert main(["bench", "training", "--partition", "noniid"]) == 2
    assert "--partition" in capsys.readouterr().err
    assert main(["bench", "training", "--workers", "0"]) == 2
    assert "--workers" in capsys.readouterr().err
