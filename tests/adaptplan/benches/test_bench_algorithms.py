"""`adaptplan bench algorithms`: its table and JSON agree with the runs' own histories; bad flags exit 2."""

from __future__ import annotations

import json

from adaptplan.benches.algorithms import budget_seconds
from adaptplan.benches.runs import RunResult
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
    # one setting for both, GAPSL §IV-A4's, printed above the table and kept in the JSON
    assert data["setting"]["client_lr"] == 0.005 and data["setting"]["server_lr"] == 0.01
    assert data["setting"]["sources"]["client_lr"].startswith("GAPSL")
    # the same options through `adaptplan train` give the same curve: SCALA with the comparison's setting, not its own
    run_dir = tmp_path / "scala"
    assert main(["train", "--algorithm", "scala", "--dataset", "synthetic", "--devices", "4", "--rounds", "4",
                 "--eval-every", "2", "--cuts", "3", "--threads", "1", "--optimizer", "sgd", "--lr", "0.01",
                 "--client-lr", "0.005", "--server-lr", "0.01", "--momentum", "0.9", "--weight-decay", "0",
                 "--clip-norm", "0", "--participation", "1", "--interval", "1", "--batch-size", "16",
                 "--client-state", "keep", "--no-progress", "--out", str(run_dir)]) == 0
    history = json.loads((run_dir / "history.json").read_text())
    curve = [[r["sim_seconds"], r["accuracy"]] for r in history["records"] if r["accuracy"] is not None]
    assert runs["scala"]["curve"] == curve
    assert data["setting"]["client_state"] == "keep"         # SCALA's own convention would restart: not this table's
    table = (out / "table.txt").read_text()
    assert "psl" in table and f"{100 * runs['psl']['final_accuracy']:.1f}%" in table
    assert table.count("setting — every method: SGD, lr client 0.005 / server 0.01, momentum 0.9, weight decay 0, "
                       "clipping off, batch 16, participation 1, local rounds between averages 1, 4 rounds, a device's "
                       "optimizer state kept when it loads the global model") == 1
    assert printed.startswith(table)                          # the table is printed too, then the files written
    assert printed.endswith(f"wrote {out / 'table.txt'}, {out / 'results.json'}, {out / 'accuracy.png'}\n")


def test_every_algorithm_of_a_comparison_gets_the_same_setting() -> None:
    """The jobs of one comparison differ only in what makes each algorithm itself: the optimizer, rates,
    momentum, decay, clipping, batch, participation (GAS: C = ⌈ρN⌉) and local rounds are the setting's."""
    from adaptplan.benches.comparison import GAPSL_SETTING
    from trainers.algorithms import REGISTRY
    from trainers.config.train_config import ALGORITHMS, TrainConfig

    setting = GAPSL_SETTING.with_overrides(participation=0.5, local_steps=2, rounds=3)
    configs = {a: TrainConfig.flat(algorithm=a, devices=10, dataset="synthetic", cuts=(2,), **setting.fields(a, 10))
               for a in ALGORITHMS if a != "sl"}
    for a, c in configs.items():
        assert (c.optim.optimizer, c.optim.client_lr, c.optim.server_lr, c.optim.momentum, c.optim.weight_decay, c.optim.clip_norm, c.data.batch_size,
                c.run.rounds) == ("sgd", 0.005, 0.01, 0.9, 0.0, 0.0, 16, 3), a
        entry = REGISTRY[a]
        if entry.active_option is not None:             # it counts its active devices (GAS, FedBuff: C = ⌈ρN⌉)
            assert c.extra == {entry.active_option: 5, entry.local_rounds_option: 2}, a
        else:
            assert c.extra == {"participation": 0.5} and c.plan.interval == 2, a
    assert setting.sources["participation"] == "given on the command line"


def test_bench_algorithms_bad_flags_exit_2(capsys) -> None:
    assert main(["bench", "algorithms", "--algorithms", "sl,psl", "--participation", "0.5"]) == 2
    assert "participation" in capsys.readouterr().err
    assert main(["bench", "algorithms", "--algorithms", "splitfed"]) == 2
    assert "--algorithms" in capsys.readouterr().err
    assert main(["bench", "algorithms", "--partitions", "noniid"]) == 2
    assert "--partitions" in capsys.readouterr().err
    assert main(["bench", "algorithms", "--rounds", "0"]) == 2
    assert "--rounds" in capsys.readouterr().err
