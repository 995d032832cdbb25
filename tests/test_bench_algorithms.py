"""`adaptplan bench algorithms`: its table and JSON agree with the runs' own histories; bad flags exit 2."""

from __future__ import annotations

import json

from adaptplan.bench_algorithms import budget_seconds
from adaptplan.bench_runs import RunResult
from adaptplan.cli import main


def test_accuracy_at_budget_is_the_last_evaluation_reached() -> None:
    r = RunResult("iid", "psl", 30, 0.4, 3.0, 1.0, None, None, None, None, None, [(1.0, 0.2), (2.0, 0.3), (3.0, 0.4)])
    assert r.accuracy_at(0.5) is None
    assert r.accuracy_at(2.0) == 0.3 and r.accuracy_at(2.9) == 0.3 and r.accuracy_at(3.0) == 0.4
    other = RunResult("iid", "gas", 30, 0.5, 1.5, 1.0, 1.2, 30, None, None, None, [(1.5, 0.5)])
    assert budget_seconds([r, other], "iid") == 1.5


def test_bench_json_matches_a_plain_training_run(tmp_path, capsys) -> None:
    out = tmp_path / "bench"
    argv = ["bench", "algorithms", "--algorithms", "psl,scala", "--partitions", "iid", "--rounds", "4", "--devices", "4",
            "--dataset", "synthetic", "--eval-every", "2", "--workers", "1", "--cuts", "3", "--test-samples", "400",
            "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    data = json.loads((out / "results.json").read_text())
    runs = {r["algorithm"]: r for r in data["runs"]}
    assert set(runs) == {"psl", "scala"} and (out / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert data["budgets_s"]["iid"] == min(r["sim_seconds"] for r in runs.values())
    # the same options through `adaptplan train` give the same curve
    run_dir = tmp_path / "scala"
    assert main(["train", "--algorithm", "scala", "--dataset", "synthetic", "--devices", "4", "--rounds", "4",
                 "--eval-every", "2", "--cuts", "3", "--threads", "1",      # SCALA's own defaults, as in the bench
                 "--no-progress", "--out", str(run_dir)]) == 0
    history = json.loads((run_dir / "history.json").read_text())
    curve = [[r["sim_seconds"], r["accuracy"]] for r in history["records"] if r["accuracy"] is not None]
    assert runs["scala"]["curve"] == curve
    table = (out / "table.txt").read_text()
    assert "psl" in table and f"{100 * runs['psl']['final_accuracy']:.1f}%" in table
    assert printed.startswith(table)                          # the table is printed too, then the files written
    assert printed.endswith(f"wrote {out / 'table.txt'}, {out / 'results.json'}, {out / 'accuracy.png'}\n")


def test_bench_algorithms_bad_flags_exit_2(capsys) -> None:
    assert main(["bench", "algorithms", "--algorithms", "splitfed"]) == 2
    assert "--algorithms" in capsys.readouterr().err
    assert main(["bench", "algorithms", "--partitions", "noniid"]) == 2
    assert "--partitions" in capsys.readouterr().err
    assert main(["bench", "algorithms", "--rounds", "0"]) == 2
    assert "--rounds" in capsys.readouterr().err
