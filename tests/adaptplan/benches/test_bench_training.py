"""`adaptplan bench training`: its JSON agrees with `adaptplan train --policy` runs of the same options."""

from __future__ import annotations

import json

from adaptplan.cli import main
from adaptplan.crossing import first_crossing


def test_bench_training_json_matches_the_runs_own_records(tmp_path, capsys) -> None:
    report = tmp_path / "bench.json"
    common = ["--devices", "20", "--dataset", "synthetic", "--eval-every", "2", "--test-samples", "400"]
    assert main(["bench", "training", "--policies", "adaptsfl,rma+rms", "--partition", "iid", "--rounds", "6",
                 "--target-accuracy", "0.2", "--more-targets", "0.15,0.3", "--workers", "1", "--json", str(report),
                 *common]) == 0
    printed = capsys.readouterr()
    assert f"wrote {report}" in printed.err.splitlines()                  # the file named (issue 37)
    header = next(line for line in printed.out.splitlines() if "policy" in line)
    assert "s→15%" in header and "s→30%" in header
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
        reached = first_crossing([(r["accuracy"], r["round"], r["sim_seconds"]) for r in evaluated], 0.2)
        figures = data["policies"][policy]
        assert figures["final_accuracy"] == evaluated[-1]["accuracy"]
        assert figures["rounds_to_target"] == (reached.at[0] if reached else None)         # interpolated
        assert figures["time_to_target_s"] == (reached.at[1] if reached else None)
        assert figures["converged_round"] is None               # 3 evaluations cannot make a 5-evaluation streak
        for more in (0.15, 0.3):
            hit = first_crossing([(r["accuracy"], r["sim_seconds"]) for r in evaluated], more)
            assert figures["time_to_accuracy_s"][f"{more:g}"] == (hit.at[0] if hit else None)
        assert data["curves"]["iid"][policy] == [[r["sim_seconds"], r["accuracy"]] for r in evaluated]


def test_bench_training_bad_flags_exit_2(capsys) -> None:
    assert main(["bench", "training", "--more-targets", "0.3,1.5"]) == 2
    assert "--more-targets" in capsys.readouterr().err
    assert main(["bench", "training", "--policies", "adaptsfl,random"]) == 2
    assert "--policies" in capsys.readouterr().err
    assert main(["bench", "training", "--partition", "noniid"]) == 2
    assert "--partition" in capsys.readouterr().err
    assert main(["bench", "training", "--workers", "0"]) == 2
    assert "--workers" in capsys.readouterr().err


def test_resource_scales_multiply_the_generated_ranges() -> None:
    from trainers.config.train_config import TrainConfig
    from trainers.run.driver import Trainer

    times = {}
    for k in (0.5, 2.0):
        trainer = Trainer(TrainConfig.flat(dataset="synthetic", devices=4, rounds=1, cuts=(2,), lr=0.01, progress=False,
                                      flops_scale=k, bandwidth_scale=k))
        times[k] = trainer.clock.stage_times(1, [2] * 4)
    # the same seeded draws, ranges scaled by k: compute and transfer times scale by 1/k
    assert (times[0.5].client_fp == 4 * times[2.0].client_fp).all()
    assert abs(times[0.5].upload / times[2.0].upload - 4).max() < 1e-12
    assert times[0.5].edge_to_fed_bps * 4 == times[2.0].edge_to_fed_bps


def test_sweep_runs_one_group_per_value_and_bad_sweeps_exit_2(tmp_path, capsys) -> None:
    out = tmp_path / "sweep"
    assert main(["bench", "training", "--policies", "sfl", "--partition", "iid", "--rounds", "2", "--devices", "20",
                 "--dataset", "synthetic", "--eval-every", "2", "--workers", "1", "--sweep", "bandwidth=0.5,2",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "sweep bandwidth" in text and "bandwidth=0.5" in text and "bandwidth=2" in text
    assert (out / "sweep-bandwidth.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for bad in ("speed=1", "bandwidth=", "bandwidth=0,1", "device-flops=a", "noise-cv=-1"):
        assert main(["bench", "training", "--sweep", bad]) == 2
        assert "--sweep" in capsys.readouterr().err
