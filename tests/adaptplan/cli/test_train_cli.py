"""Driver, CLI, resume, re-planning with an injected planner, clock, and a real-data run."""

from __future__ import annotations

import csv
import json
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from adaptplan.cli import main
from adaptplan.errors import InputError
from trainers.algorithms import ALGORITHMS, REGISTRY
from trainers.config.train_config import TrainConfig
from trainers.run.checkpoint import load_checkpoint
from trainers.run.driver import ReplanRequest, Trainer
from trainers.strategies import STRATEGIES
from trainers.run.history import History, RoundRecord

torch.set_num_threads(1)

FAST = dict(dataset="synthetic", devices=4, batch_size=8, model_width=4, eval_every=2, threads=1,
            redraw_resources=True, lr=0.05)


def records(history: History) -> list[dict]:
    return [{k: v for k, v in asdict(r).items() if k != "wall_seconds"} for r in history.records]


def all_params(trainer: Trainer) -> list[torch.Tensor]:
    return [p.detach() for d in range(trainer.engine.num_devices) for p in trainer.engine.device_model(d).parameters()]


# an algorithm whose schedule depends on --rounds cannot resume for more (test_gapsl_resume_keeps_its_total_rounds;
# its interrupted run resumes identically: test_interrupted_run_resumes_identically)
@pytest.mark.parametrize("algorithm", [a for a in ALGORITHMS if not STRATEGIES[a].uses_total_rounds])
def test_resume_is_identical_to_uninterrupted(tmp_path: Path, algorithm: str) -> None:
    common = dict(FAST, algorithm=algorithm, interval=2, momentum=0.9, checkpoint_every=3,
                  cuts=(1, 2, 2, 4) if algorithm == "adaptsfl" else None if REGISTRY[algorithm].whole_model else (2,))
    full = Trainer(TrainConfig.flat(**common, rounds=6, out=str(tmp_path / "full")))
    full_history = full.run()
    Trainer(TrainConfig.flat(**common, rounds=3, out=str(tmp_path / "part"))).run()
    resumed = Trainer(TrainConfig.flat(**common, rounds=6, out=str(tmp_path / "part"), resume=True))
    resumed_history = resumed.run()
    assert records(full_history) == records(resumed_history)
    assert resumed_history.meta["config"] == resumed.config.to_json() and resumed_history.meta["config"]["rounds"] == 6
    walls = [r.wall_seconds for r in resumed_history.records]
    assert walls == sorted(walls) and walls[2] > 0               # the resumed rounds go on from the saved wall time
    for a, b in zip(all_params(full), all_params(resumed), strict=True):
        assert torch.equal(a, b)


def test_gapsl_resume_keeps_its_total_rounds(tmp_path: Path) -> None:
    """GAPSL's K^t = K_min + (t/T)·stab·(K_max − K_min) (eq. 2) depends on T = --rounds: a resume asking for
    more rounds would not reproduce an uninterrupted run, so it is refused, naming --rounds."""
    from adaptplan.errors import InputError

    common = dict(FAST, algorithm="gapsl", cuts=(2,), momentum=0.9, checkpoint_every=3)
    Trainer(TrainConfig.flat(**common, rounds=3, out=str(tmp_path / "part"))).run()
    with pytest.raises(InputError, match=r"keeps --rounds 3 \(asked: 6\)") as err:
        Trainer(TrainConfig.flat(**common, rounds=6, out=str(tmp_path / "part"), resume=True)).run()
    assert err.value.field == "rounds"


def test_interrupted_run_resumes_identically(tmp_path: Path) -> None:
    """A run stopped by SIGINT after round 3 (checkpoint and history saved then) and resumed with the same
    options equals the uninterrupted run — GAPSL included, whose schedule depends on --rounds."""
    import os
    import signal

    from trainers.run.folder import Interrupted

    common = dict(FAST, algorithm="gapsl", cuts=(2,), momentum=0.9, rounds=6)
    full = Trainer(TrainConfig.flat(**common, out=str(tmp_path / "full"))).run()
    part = Trainer(TrainConfig.flat(**common, out=str(tmp_path / "part")))
    run_round = part.engine.run_round

    def interrupting(t: int):
        stats = run_round(t)
        if t == 3:
            os.kill(os.getpid(), signal.SIGINT)     # honoured at the end of the round
        return stats

    part.engine.run_round = interrupting
    with pytest.raises(Interrupted) as info:
        part.run()
    assert (info.value.signum, info.value.round) == (signal.SIGINT, 3)
    assert load_checkpoint(tmp_path / "part")["round"] == 3
    assert [r.round for r in History.load(tmp_path / "part").records] == [1, 2, 3]
    resumed = Trainer(TrainConfig.flat(**common, out=str(tmp_path / "part"), resume=True))
    assert records(resumed.run()) == records(full)


def test_fixed_seed_is_deterministic_and_seed_matters() -> None:
    runs = [Trainer(TrainConfig.flat(**FAST, algorithm="psl", cuts=(3,), rounds=4, seed=s)).run() for s in (1, 1, 2)]
    assert records(runs[0]) == records(runs[1])
    assert records(runs[0]) != records(runs[2])


def test_resume_with_different_algorithm_is_an_input_error(tmp_path: Path) -> None:
    Trainer(TrainConfig.flat(**FAST, algorithm="psl", cuts=(3,), rounds=2, checkpoint_every=2, out=str(tmp_path))).run()
    with pytest.raises(InputError, match="algorithm"):
        Trainer(TrainConfig.flat(**FAST, algorithm="sfl-v2", cuts=(3,), rounds=4, out=str(tmp_path), resume=True)).run()


@pytest.mark.parametrize("replan_every, aggregations, replan_rounds", [
    # the planner alternates A = ([3, 5, 5, 1], I = 3) and B = ([2, 2, 4, 4], I = 2), A first (before round 1).
    # The devices aggregate I rounds after the last aggregation; an aggregation round t re-plans when
    # t − (last re-plan) ≥ Q (Algorithm 1).
    # Q = 2: 3 (→ B), 5 (5 − 3 ≥ 2 → A), 8 (→ B), 10 (→ A); the next aggregation, 13, is past round 12
    (2, [3, 5, 8, 10], [3, 5, 8, 10]),
    # Q = 3: 3 (→ B), 5 (5 − 3 < 3: B kept), 7 (→ A), 10 (→ B), 12 (12 − 10 < 3: B kept)
    (3, [3, 5, 7, 10, 12], [3, 7, 10]),
])
def test_replanning_with_injected_planner_moves_cuts(replan_every, aggregations, replan_rounds) -> None:
    A, B = ([3, 5, 5, 1], 3), ([2, 2, 4, 4], 2)
    calls: list[ReplanRequest] = []

    def fake_planner(request: ReplanRequest) -> tuple[list[int], int]:
        calls.append(request)
        return A if len(calls) % 2 else B

    config = TrainConfig.flat(**FAST, algorithm="adaptsfl", rounds=12, replan_every=replan_every)
    trainer = Trainer(config, planner=fake_planner)
    assert (trainer.engine.cuts, trainer.engine.interval) == A                # initial plan from the planner
    history = trainer.run()
    replans = [e for e in history.events if e["event"] != "plan"]
    assert [e["round"] for e in replans] == replan_rounds
    assert all(e["event"] == "replan" for e in replans)
    # the k-th re-plan replaces the plan in force by the planner's next answer, so the cuts really move
    in_force = [A if k % 2 == 0 else B for k in range(len(replans) + 1)]
    for k, e in enumerate(replans):
        assert (e["old_cuts"], e["old_interval"]) == in_force[k]
        assert (e["cuts"], e["interval"]) == in_force[k + 1] and e["cuts"] != e["old_cuts"]
    # the records: aggregation and re-plan flags at the derived rounds, and the plan in force during each round
    assert [r.round for r in history.records] == list(range(1, 13))
    assert [r.round for r in history.records if r.aggregated] == aggregations
    assert [r.round for r in history.records if r.replanned] == replan_rounds
    for r in history.records:
        plan = in_force[sum(t < r.round for t in replan_rounds)]
        assert (r.cuts, r.interval) == plan, r.round
    assert (trainer.engine.cuts, trainer.engine.interval) == in_force[-1]
    # the planner saw the round just finished, the plan in force and the next round's system
    assert [c.round for c in calls] == [0, *replan_rounds]
    assert (calls[0].cuts, calls[0].interval) == ([], 1)            # before training: no plan in force yet
    assert calls[0].system == trainer.clock.system(1) != trainer.clock.system(0)
    assert [(c.cuts, c.interval) for c in calls[1:]] == in_force[:-1]
    assert all(c.system.batch_size == config.data.batch_size for c in calls)


def test_clock_charges_latency_model_and_wall_time_is_separate() -> None:
    from adaptplan.latency import LatencyModel

    trainer = Trainer(TrainConfig.flat(**FAST, algorithm="adaptsfl", cuts=(2, 3, 3, 4), interval=2, rounds=4))
    history = trainer.run()
    for r in history.records:
        lm = LatencyModel(trainer.profile, trainer.clock.system(r.round))
        expected = lm.t_split(r.cuts) + (lm.t_agg(r.cuts) if r.aggregated else 0.0)
        assert r.round_sim_seconds == pytest.approx(expected, rel=1e-12)
    assert history.records[-1].sim_seconds == pytest.approx(sum(r.round_sim_seconds for r in history.records))
    assert len({r.round_sim_seconds for r in history.records if not r.aggregated}) > 1    # resources re-drawn


def test_convergence_criterion_and_time_to_target() -> None:
    accs = [0.1, 0.3, 0.5, 0.51, 0.52, 0.53, 0.535, 0.54, 0.6]
    h = History([RoundRecord(i + 1, 1.0, a, 1.0, 10.0 * (i + 1), 10.0, 0.0, 0, 0, 0, False, False, [1], 1)
                 for i, a in enumerate(accs)])
    assert h.converged_round() == 8            # gains < 0.02 for 5 consecutive evaluations: rounds 4..8
    assert h.time_to_accuracy(0.5) == 30.0 and h.time_to_accuracy(0.9) is None
    # a run stuck near chance (10 classes: 10%) never "converges"; a floor of 0 would fire at round 6
    flat = [0.10, 0.11, 0.10, 0.12, 0.11, 0.10, 0.11, 0.12, 0.25, 0.40, 0.41, 0.41, 0.42, 0.42, 0.42]
    h = History([RoundRecord(i + 1, 1.0, a, 1.0, 10.0 * (i + 1), 10.0, 0.0, 0, 0, 0, False, False, [1], 1)
                 for i, a in enumerate(flat)], meta={"num_classes": 10})
    assert h.converged_round(floor=0.0) == 6
    assert h.converged_round() == 15           # streak counted only from 0.40 ≥ 2/M = 0.2: rounds 11..15


def test_cli_train_outputs_and_plot(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    code = main(["train", "--algorithm", "sfl-v1", "--dataset", "synthetic", "--devices", "3", "--rounds", "4",
                 "--cuts", "3", "--batch-size", "8", "--eval-every", "2", "--out", str(out), "--checkpoint-every", "2",
                 "--target-accuracy", "0.2", "--threads", "1", "--no-progress"])
    assert code == 0
    history = History.load(out)
    with open(out / "history.csv", newline="") as fh:              # the CSV holds the same rounds
        rows = list(csv.DictReader(fh))
    assert [int(r["round"]) for r in rows] == [1, 2, 3, 4]
    assert [float(r["sim_seconds"]) for r in rows] == [r.sim_seconds for r in history.records]
    assert [r["accuracy"] for r in rows[::2]] == ["", ""] and float(rows[3]["accuracy"]) == history.records[3].accuracy
    assert (out / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [r.round for r in history.records] == [1, 2, 3, 4] and [r.round for r in history.evaluated] == [2, 4]
    assert all(r.cuts == [3, 3, 3] and r.interval == 1 and r.aggregated for r in history.records)   # SFL-V1: I = 1
    summary = json.loads(capsys.readouterr().out)
    assert summary == history.summary(0.2) and summary["rounds"] == 4 and summary["target_accuracy"] == 0.2
    reached = [r.sim_seconds for r in history.evaluated if r.accuracy >= 0.2]
    assert summary["time_to_target_s"] == (reached[0] if reached else None)
    assert load_checkpoint(out)["round"] == 4                     # --checkpoint-every 2: the last at round 4
    assert history.meta["config"]["algorithm"] == "sfl-v1" and history.meta["config"]["devices"] == 3
    assert main(["plot", str(out), str(out), "-o", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("argv, field", [
    (["--algorithm", "splitfed"], "algorithm"),
    (["--dataset", "imagenet"], "dataset"),
    (["--partition", "random"], "partition"),
    (["--cuts", "99"], "cuts[0]"),
])
def test_cli_bad_input_exit_2(argv, field, capsys) -> None:
    code = main(["train", "--dataset", "synthetic", "--devices", "2", "--rounds", "1", "--no-progress", *argv])
    assert code == 2
    assert field in capsys.readouterr().err


def test_real_data_end_to_end_mnist_above_chance() -> None:
    config = TrainConfig.flat(algorithm="adaptsfl", dataset="mnist", model="cnn", model_width=8, devices=5, rounds=150,
                         batch_size=16, lr=0.1, cuts=(1, 2, 2, 3, 3), interval=5, eval_every=50, partition="iid",
                         threads=1)
    history = Trainer(config).run()
    assert history.final_accuracy > 0.5


def test_model_names_go_through_one_resolver(capsys) -> None:
    from trainers.inputs.models import build_model

    config = TrainConfig.flat(**FAST, model="resnet18", algorithm="adaptsfl", rounds=1)     # validated, not trained
    assert config.model.name == "resnet18"
    model = build_model("resnet18", (3, 32, 32), 7)
    assert isinstance(model, torch.nn.Module) and model(torch.zeros(2, 3, 32, 32)).shape == (2, 7)
    with pytest.raises(InputError, match="model"):
        TrainConfig.flat(**FAST, model="nonsense")
    assert main(["train", "--dataset", "synthetic", "--devices", "2", "--rounds", "1", "--no-progress",
                 "--model", "nonsense"]) == 2
    err = capsys.readouterr().err
    assert "--model" in err and "cnn" in err and "resnet18" in err            # names the flag, lists valid names
    import warnings

    from profilers.profile import StemWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["train", "--dataset", "cifar10-subset", "--devices", "2", "--cuts", "1", "--rounds", "1",
                     "--no-progress", "--model", "resnet18", "--batch-size", "4", "--threads", "1",
                     "--max-test-samples", "8"]) == 0
    assert not [w for w in caught if issubclass(w.category, StemWarning)]   # said as train's line, not a Python warning
    err = capsys.readouterr().err      # the ImageNet stem on CIFAR images is said once, as profile says it
    assert err.count("warning: resnet18 shrinks the 32x32 input to 8x8 in its first block") == 1, err
    assert main(["profile", "cnn", "--input", "1x8x8", "--json"]) == 0            # the profiler uses the same resolver
    assert len(json.loads(capsys.readouterr().out)["cut_points"]) == 5


def test_help_says_own_models_are_imported_with_the_working_directory_on_the_path(capsys) -> None:
    """`train --help` (and `profile --help`) say how package.module:factory is found, as
    profilers.models does it (tests/adaptplan/cli/test_cli.py runs one from the working directory)."""
    for argv in (["train", "--help"], ["profile", "--help"]):
        assert main(argv) == 0
        text = " ".join(capsys.readouterr().out.split())
        assert "package.module:factory, your own function returning an nn.Module" in text
        assert "imported with the working directory on the import path (appended, after PYTHONPATH" in text


def test_default_plan_is_the_planners_and_is_recorded() -> None:
    from adaptplan.constants import ConvergenceConstants
    from adaptplan.planner import Planner

    trainer = Trainer(TrainConfig.flat(**{**FAST, "lr": 0.01}, algorithm="adaptsfl", rounds=2))   # γ = lr = placeholder's 0.01
    L = trainer.profile.num_cuts
    expected = Planner(trainer.profile, trainer.clock.system(1), ConvergenceConstants.placeholder(L)).plan()
    event = trainer.history.events[0]
    assert event["source"] == trainer.history.meta["plan_source"] == "planner"
    assert event["plan"] == expected.to_json() | {"solver": event["plan"]["solver"]}   # solver seconds differ
    assert trainer.engine.cuts == event["cuts"] == list(expected.cuts)
    assert trainer.engine.interval == event["interval"] == expected.interval
    # an unreachable target ε: an error naming the reason and the fixes ...
    unreachable = ConvergenceConstants.placeholder(L)
    unreachable = type(unreachable)(**{**unreachable.to_json(), "epsilon": 1e-6})
    with pytest.raises(InputError, match=r"no plan: target epsilon=1e-06 is unreachable.*--cuts, --plan.*--allow-fallback"):
        Trainer(TrainConfig.flat(**{**FAST, "lr": 0.01}, algorithm="adaptsfl", rounds=2), constants=unreachable)
    # ... or, when asked for, the documented default plan with the planner's reason recorded
    fallback = Trainer(TrainConfig.flat(**{**FAST, "lr": 0.01}, algorithm="adaptsfl", rounds=2, allow_fallback=True),
                       constants=unreachable)
    event = fallback.history.events[0]
    assert event["source"] == "default" and "epsilon" in event["reason"]
    assert fallback.engine.cuts == [(L + 1) // 2] * 4 and fallback.engine.interval == 1


def test_replan_every_with_the_real_planner(tmp_path: Path) -> None:
    out = tmp_path / "run"
    code = main(["train", "--dataset", "synthetic", "--devices", "4", "--rounds", "6", "--replan-every", "2", "--lr", "0.01",
                 "--interval", "2", "--batch-size", "8", "--eval-every", "3", "--out", str(out), "--threads", "1",
                 "--no-progress"])
    assert code == 0
    history = History.load(out)
    replans = [e for e in history.events if e["event"] == "replan"]
    # every Q = 2 rounds, the last one included: whether a round re-plans must not depend on --rounds,
    # or a run resumed with more rounds would differ from an uninterrupted one
    assert [e["round"] for e in replans] == [2, 4, 6]
    assert all(e["plan"]["solver"]["method"] == "bcd" and e["interval"] == 2 for e in replans)   # --interval wins
    assert [r.round for r in history.records if r.replanned] == [2, 4, 6]
    for e in replans[:-1]:                                        # the records show the plan in force
        assert history.records[e["round"]].cuts == e["cuts"]


def test_done_when_20_device_adaptsfl_on_cifar10_subset_plots_and_resumes_identically(tmp_path: Path) -> None:
    common = ["train", "--algorithm", "adaptsfl", "--dataset", "cifar10-subset", "--devices", "20", "--eval-every", "3",
              "--checkpoint-every", "3", "--threads", "1", "--no-progress"]
    full, part = tmp_path / "full", tmp_path / "part"
    assert main([*common, "--rounds", "6", "--out", str(full)]) == 0
    assert main([*common, "--rounds", "3", "--out", str(part)]) == 0
    assert main([*common, "--rounds", "6", "--out", str(part), "--resume"]) == 0
    a, b = History.load(full), History.load(part)
    assert a.events[0]["source"] == "planner" and len(a.events[0]["cuts"]) == 20
    assert len(a.records) == 6 and [r.round for r in a.evaluated] == [3, 6]
    assert records(a) == records(b)
    for folder in (full, part):
        assert (folder / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    sa, sb = (load_checkpoint(f)["engine"] for f in (full, part))
    assert sa["edge"]["keys"] == sb["edge"]["keys"]
    pairs = list(zip(sa["edge"]["instances"], sb["edge"]["instances"], strict=True))
    pairs += [(x, y) for da, db in zip(sa["devices"], sb["devices"], strict=True) for x, y in zip(da["blocks"], db["blocks"], strict=True)]
    assert len(pairs) > 20
    for x, y in pairs:
        assert all(torch.equal(x[k], y[k]) for k in x)


def test_planner_uses_the_training_learning_rate_and_sfl_aggregates_every_round() -> None:
    from adaptplan.constants import ConvergenceConstants

    # γ = --lr = 0.05 with 4 devices: noise floor (βγ/N)Σσ² = 5·0.05·5/4 = 0.3125 ≥ the placeholder ε = 0.1, so
    # the placeholder target becomes twice the floor (0.625) and the run has a plan; with 20 devices the floor
    # is 0.0625 and ε stays 0.1
    trainer = Trainer(TrainConfig.flat(**FAST, algorithm="adaptsfl", rounds=2))
    assert trainer.history.events[0]["source"] == "planner"
    L = trainer.profile.num_cuts
    raised = ConvergenceConstants.training_placeholder(L, 0.05, 4)
    assert L == 5 and raised.gamma == 0.05 and raised.epsilon == pytest.approx(0.625)
    assert ConvergenceConstants.training_placeholder(L, 0.05, 20).epsilon == 0.1
    with pytest.raises(InputError, match="not the learning rate"):
        Trainer(TrainConfig.flat(**FAST, algorithm="adaptsfl", rounds=2), constants=ConvergenceConstants.placeholder(L))
    # SplitFed takes the planner's cuts but aggregates every round unless --interval is given
    sfl = Trainer(TrainConfig.flat(**{**FAST, "lr": 0.01}, algorithm="sfl-v1", rounds=2))
    adapt = Trainer(TrainConfig.flat(**{**FAST, "lr": 0.01}, algorithm="adaptsfl", rounds=2))
    assert sfl.engine.cuts == adapt.engine.cuts and sfl.engine.interval == 1 < adapt.engine.interval


def test_evaluation_leaves_models_and_rng_untouched() -> None:
    trainer = Trainer(TrainConfig.flat(**FAST, algorithm="adaptsfl", rounds=1, cuts=(2,), interval=1))
    model = trainer.strategy.eval_models(trainer.engine)[0]
    state = torch.get_rng_state()
    first, second = trainer.evaluate(), trainer.evaluate()
    assert first == second and torch.equal(state, torch.get_rng_state()) and model.training


def test_user_system_keeps_its_resources_and_oversized_batches_are_rejected(tmp_path: Path) -> None:
    from adaptplan.system import generate_system

    path = tmp_path / "system.json"
    generate_system(4, 9).save(path)
    trainer = Trainer(TrainConfig.flat(**FAST, algorithm="adaptsfl", rounds=1, cuts=(2,), interval=1, system_path=str(path)))
    assert trainer.clock.system(1).devices == trainer.clock.system(7).devices == generate_system(4, 9).devices
    with pytest.raises(InputError, match="exceeds the smallest device"):
        Trainer(TrainConfig.flat(**{**FAST, "batch_size": 100_000}, algorithm="adaptsfl", rounds=1, cuts=(2,)))


def test_out_must_be_a_folder_and_bad_histories_exit_2(tmp_path: Path, capsys) -> None:
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    assert main(["train", "--dataset", "synthetic", "--devices", "4", "--rounds", "1", "--no-progress",
                 "--cuts", "2", "--out", str(blocker / "sub")]) == 2
    assert "--out" in capsys.readouterr().err
    common = ["train", "--dataset", "synthetic", "--devices", "4", "--rounds", "1", "--no-progress", "--cuts", "2"]
    assert main([*common, "--checkpoint-every", "1"]) == 2          # nowhere to write the checkpoint
    assert capsys.readouterr().err == "adaptplan train: error: --checkpoint-every: needs --out (where checkpoint.pt is written)\n"
    assert main([*common, "--out", str(tmp_path / "run"), "--resume", "--overwrite"]) == 2
    assert "--resume continues the run in --out; --overwrite replaces it" in capsys.readouterr().err
    for text in ("{bad", '{"records": [{"round": 1}]}', "[]", "\udcff"):
        bad = tmp_path / "history.json"
        bad.write_bytes(text.encode("utf-8", "surrogateescape"))
        assert main(["plot", str(bad), "-o", str(tmp_path / "p.png")]) == 2
        err = capsys.readouterr().err
        assert "history" in err and "Traceback" not in err


def test_resume_with_more_rounds_replans_like_an_uninterrupted_run(tmp_path: Path) -> None:
    base = ["train", "--dataset", "synthetic", "--model", "mlp", "--devices", "4", "--no-progress", "--threads", "1",
            "--cuts", "1,2,1,2", "--interval", "2", "--replan-every", "2", "--batch-size", "8", "--eval-every", "2", "--lr", "0.01"]
    assert main(base + ["--rounds", "8", "--out", str(tmp_path / "full")]) == 0
    assert main(base + ["--rounds", "4", "--out", str(tmp_path / "part"), "--checkpoint-every", "2"]) == 0
    assert main(base + ["--rounds", "8", "--out", str(tmp_path / "part"), "--checkpoint-every", "2", "--resume"]) == 0
    full, part = History.load(tmp_path / "full"), History.load(tmp_path / "part")
    assert [r.round for r in full.records if r.replanned] == [2, 4, 6, 8]
    assert records(full) == records(part)


def test_every_train_flag_reaches_its_config_field(tmp_path) -> None:
    from adaptplan.cli import build_parser
    from adaptplan.cli.commands.train import fields_from_args, explicit_fields, flag_of

    argv = ["train", "--algorithm", "gapsl", "--dataset", "synthetic", "--model", "mlp", "--devices", "6",
            "--partition", "dirichlet", "--alpha", "0.3", "--rounds", "7", "--plan", "p.json", "--reestimate",
            "--replan-every", "4", "--interval", "2", "--lr", "0.02", "--client-lr", "0.125", "--server-lr", "0.25",
            "--momentum", "0.5", "--weight-decay", "0.001", "--client-optimizer", "sgd", "--server-optimizer", "adam",
            "--optimizer", "adam", "--clip-norm", "10", "--k-min", "0.3", "--gda", "double_backprop",
            "--batch-size", "12", "--seed", "5", "--eval-every", "3", "--max-test-samples", "100", "--out", "run",
            "--checkpoint-every", "2", "--overwrite", "--allow-fallback", "--target-accuracy", "0.6",
            "--system", "s.json", "--system-seed", "9", "--static-resources", "--constants", "c.json",
            "--data-root", "data", "--download", "--threads", "2", "--no-progress", "--device", "cpu",
            "--client-batching", "on", "--distributed", "--ranks", "4", "--emulate-links", "--rank-timeout", "7",
            "--client-recompute", "off", "--server-pass-samples", "256", "--device-data", "devdata",
            "--local-test-fraction", "0.2", "--mlflow", "http://127.0.0.1:5000", "--pilots", "p1,p2",
            "--aggregation", "trimmed-mean", "--trim", "0.2", "--rounds-law", "linear", "--client-state", "restart",
            "--labels-per-device", "3", "--size-exponent", "0.5", "--activation-clip", "2.5", "--activation-noise", "0.75",
            "--nopeek", "0.125", "--privacy-delta", "1e-6", "--label-epsilon", "2", "--clip-per-value", "--u-shaped", "2",
            "--head-clip", "0.5", "--head-noise", "1.5", "--leakage-table", "leak.json", "--max-leakage", "dcor=0.9"]
    args = build_parser().parse_args(argv)
    assert fields_from_args(args) == dict(
        algorithm="gapsl", dataset="synthetic", model="mlp", devices=6, partition="dirichlet", dirichlet_alpha=0.3,
        rounds=7, batch_size=12, lr=0.02, client_lr=0.125, server_lr=0.25, client_optimizer="sgd", server_optimizer="adam",
        momentum=0.5, weight_decay=0.001, interval=2,
        cuts=None, plan_path="p.json",
        replan_every=4, policy=None, reestimate=True, seed=5, eval_every=3, max_test_samples=100, out="run",
        checkpoint_every=2, resume=False, overwrite=True, allow_fallback=True, target_accuracy=0.6,
        system_path="s.json", system_seed=9, redraw_resources=False, constants_path="c.json", data_root="data",
        download=True, threads=2, progress=False, optimizer="adam", clip_norm=10.0, device="cpu",
        client_batching="on", distributed=True, ranks=4, emulate_links=True, rank_timeout=7.0,
        client_recompute="off", server_pass_samples=256, extra={"k_min": 0.3, "gda": "double_backprop"},
        device_data="devdata", transport="gloo", local_test_fraction=0.2, mlflow="http://127.0.0.1:5000",
        pilots="p1,p2", aggregation="trimmed-mean", trim=0.2, rounds_law="linear", client_state="restart",
            labels_per_device=3, size_exponent=0.5, activation_clip=2.5, activation_noise=0.75, nopeek=0.125,
        privacy_delta=1e-6, label_epsilon=2.0, clip_per_value=True, u_shaped=2, head_clip=0.5,
        head_noise=1.5, leakage_table="leak.json", max_leakage="dcor=0.9")
    mqtt = fields_from_args(build_parser().parse_args(["train", "--runtime", "mqtt"]))
    assert (mqtt["distributed"], mqtt["transport"]) == (True, "mqtt")
    torch_runtime = fields_from_args(build_parser().parse_args(["train", "--runtime", "torch"]))
    assert (torch_runtime["distributed"], torch_runtime["transport"]) == (True, "gloo")
    simulator = fields_from_args(build_parser().parse_args(["train", "--runtime", "simulator"]))
    assert (simulator["distributed"], simulator["transport"]) == (False, "gloo")
    defaults = fields_from_args(build_parser().parse_args(["train", "--cuts", "3,3 4", "--policy", "sfl"]))
    assert defaults["cuts"] == [3, 3, 4] and defaults["policy"] == "sfl" and defaults["extra"] == {}
    assert (defaults["redraw_resources"], defaults["progress"], defaults["resume"]) == (True, True, False)
    # the flags named on a command line, as config fields (all algorithm options are "extra")
    assert explicit_fields(args.parser, ["--alpha=0.2", "--no-progress", "--gda", "x", "--rounds", "3",
                                         "--resume"]) == {"dirichlet_alpha", "progress", "extra", "rounds", "resume"}
    assert explicit_fields(args.parser, ["--roundsabc"]) == set()
    assert explicit_fields(args.parser, ["--runtime", "mqtt"]) == {"distributed", "transport"}
    # config fields back to the flags a user typed
    assert [flag_of(f) for f in ("dirichlet_alpha", "cuts[3]", "batch_size", "--resume", "$ADAPTPLAN_DATA_DIR",
                                 "history.meta")] == ["--alpha", "--cuts[3]", "--batch-size", "--resume",
                                                      "$ADAPTPLAN_DATA_DIR", "history.meta"]


def test_system_and_plan_must_fit_the_run(tmp_path: Path) -> None:
    from adaptplan.plan import Plan
    from adaptplan.system import generate_system

    with pytest.raises(InputError, match="system has 3 devices but devices = 4") as info:
        Trainer(TrainConfig.flat(**FAST, algorithm="psl", cuts=(2,), rounds=1), system=generate_system(3, 0))
    assert info.value.field == "devices"
    trainer = Trainer(TrainConfig.flat(**FAST, algorithm="psl", cuts=(2,), rounds=1), system=generate_system(4, 0))
    L = trainer.profile.num_cuts                           # 5 cut points of the small cnn
    plan_file = tmp_path / "plan.json"
    for cuts, message in (([1, L, 2, 2], None), ([1, L + 1, 2, 2], f"cut {L + 1} is outside 1..{L}"),
                          ([2, 2, 2], "plan has 3 cuts but devices = 4")):
        plan_file.write_text(json.dumps({"cuts": cuts, "interval": 2, "rounds": 10, "aggregations": 5,
                                         "round_latency_s": 1.0, "aggregation_latency_s": 1.0, "total_latency_s": 15.0,
                                         "objective_s": 15.0}))
        config = TrainConfig.flat(**FAST, algorithm="psl", rounds=1, plan_path=str(plan_file))
        if message is None:
            with pytest.raises(InputError, match="does not say which model") as info:
                Trainer(config)                                         # cuts in range, but for which model?
            assert info.value.field == "plan.model"
            plan_file.write_text(json.dumps({**json.loads(plan_file.read_text()), "model": trainer.profile.identity()}))
            trainer = Trainer(config)                                   # a plan made for this very model
            assert (trainer.engine.cuts, trainer.engine.interval) == (cuts, 2)
        else:
            with pytest.raises(InputError, match=message) as info:
                Trainer(config)
            assert info.value.field == "plan.cuts"


def test_adaptsfl_policy_replans_every_q_rounds() -> None:
    calls: list[int] = []

    def planner(request: ReplanRequest) -> tuple[list[int], int]:
        calls.append(request.round)
        return [2, 2, 3, 3], 1

    config = TrainConfig.flat(**{**FAST, "eval_every": 4}, algorithm="adaptsfl", policy="adaptsfl", replan_every=2, rounds=4)
    history = Trainer(config, planner=planner).run()
    assert calls == [0, 2, 4] and [e["round"] for e in history.events] == [0, 2, 4]
    history = Trainer(TrainConfig.flat(**{**FAST, "eval_every": 4}, algorithm="adaptsfl", policy="sfl", rounds=3),
                      planner=planner).run()
    assert [e["round"] for e in history.events] == [0]        # SFL decides once


def test_wall_seconds_are_elapsed_time_and_resume_needs_a_folder() -> None:
    import time

    start = time.perf_counter()
    history = Trainer(TrainConfig.flat(**FAST, algorithm="psl", cuts=(2,), rounds=3)).run()
    elapsed = time.perf_counter() - start
    walls = [r.wall_seconds for r in history.records]
    assert 0 < walls[0] <= walls[1] <= walls[2] <= elapsed
    with pytest.raises(InputError, match="--resume needs --out") as info:
        Trainer(TrainConfig.flat(**FAST, algorithm="psl", cuts=(2,), rounds=3, resume=True)).run()
    assert info.value.field == "resume"


def test_command_line_defaults_are_the_config_defaults() -> None:
    """`adaptplan train` with no flags trains what TrainConfig() describes (README: AdaptSFL with SGD, learning rate
    0.05, momentum 0.9, evaluation every 10 rounds; every optimizer option left to the algorithm's defaults) —
    except the progress bar, shown on a terminal by default."""
    from adaptplan.cli import build_parser
    from adaptplan.cli.commands.train import fields_from_args
    from trainers.config.train_config import DEFAULTS

    fields = fields_from_args(build_parser().parse_args(["train"]))
    defaults = dict(DEFAULTS)
    assert set(fields) <= set(defaults)
    assert set(defaults) - set(fields) == {"model_width", "batch_devices", "noise_cv", "bandwidth_scale", "flops_scale",
                                           "eval_batch_size"}       # Python-only options (benchmarks, tests)
    assert {k: v for k, v in fields.items() if v != defaults[k]} == {"progress": True}
    assert all(defaults[k] is None for k in ("optimizer", "lr", "client_lr", "server_lr", "momentum", "weight_decay",
                                              "clip_norm", "client_optimizer", "server_optimizer"))
    resolved = TrainConfig.flat(**fields)
    assert resolved.to_json() == TrainConfig().to_json() | {"progress": True}
    assert (resolved.optim.optimizer, resolved.optim.lr, resolved.optim.momentum, resolved.run.eval_every) == ("sgd", 0.05, 0.9, 10)
    assert (resolved.optim.client_lr, resolved.optim.server_lr, resolved.optim.weight_decay, resolved.optim.clip_norm) == (0.05, 0.05, 0.0, 0.0)


def test_sl_trains_every_device_at_the_deepest_planned_cut() -> None:
    trainer = Trainer(TrainConfig.flat(**FAST, algorithm="sl", rounds=1), planner=lambda request: ([1, 3, 2, 2], 4))
    assert trainer.engine.cuts == [3, 3, 3, 3] and trainer.engine.interval == 1     # one client model; SL never averages


def test_reported_accuracy_and_loss_are_the_means_over_the_evaluated_models() -> None:
    trainer = Trainer(TrainConfig.flat(**FAST, algorithm="psl", cuts=(2,), rounds=1))
    trainer.run()
    per_device = [trainer.engine.evaluate(trainer.engine.device_model(d)) for d in range(4)]
    accuracy, loss, _, _ = trainer.evaluate()
    assert accuracy == pytest.approx(sum(a for a, _ in per_device) / 4, rel=1e-12)
    assert loss == pytest.approx(sum(l for _, l in per_device) / 4, rel=1e-12)
    assert len({a for a, _ in per_device}) > 1 or len({l for _, l in per_device}) > 1     # the devices differ


@pytest.mark.parametrize("algorithm", ["psl", "sfl-v1", "sl"])
def test_the_local_protocol_pools_each_devices_model_on_its_own_held_out_samples(algorithm: str) -> None:
    """CycleSL §4.1's sample-wise split: ⌊10 %⌋ of each device's samples never trained on; the local accuracy is
    Σ_i correct_i / Σ_i n_i with device i's model (PSL: its own [w_c,i; w_s]; SplitFed: the global model; SL: the
    one client model) on its held-out samples."""
    trainer = Trainer(TrainConfig.flat(**FAST, algorithm=algorithm, cuts=(2,), rounds=2))
    trainer.run()
    data, engine = trainer.engine.data, trainer.engine
    sizes = [len(p) + len(q) for p, q in zip(data.parts, data.local_test)]
    assert [len(q) for q in data.local_test] == [int(0.1 * n) for n in sizes] and min(sizes) > 10
    for train, held in zip(data.parts, data.local_test):
        assert not set(train.tolist()) & set(held.tolist())
    correct, total = {}, {}
    for d, held in enumerate(data.local_test):
        model = {"psl": lambda: engine.device_model(d), "sl": lambda: engine.device_model(engine.strategy.holder),
                 "sfl-v1": lambda: engine.global_model()}[algorithm]()
        with torch.no_grad():
            model.eval()
            predictions = model(data.x_train[torch.from_numpy(held)]).argmax(1)
            model.train()
        correct[d], total[d] = int((predictions == data.y_train[torch.from_numpy(held)]).sum()), len(held)
    assert trainer.evaluate()[2] == pytest.approx(sum(correct.values()) / sum(total.values()), abs=1e-12)
    assert trainer.history.evaluated[-1].local_accuracy is not None
    # the CycleSL authors' protocol: the same, pooled over the round's participants only (here two of the four)
    sampled = [1, 3]
    assert trainer.evaluate(sampled)[3] == pytest.approx(sum(correct[d] for d in sampled) /
                                                         sum(total[d] for d in sampled), abs=1e-12)
    last = trainer.history.evaluated[-1]
    assert last.local_sampled_accuracy == pytest.approx(sum(correct[d] for d in last.participants) /
                                                        sum(total[d] for d in last.participants), abs=1e-12)


def test_no_local_split_trains_on_every_sample_and_reports_no_local_accuracy() -> None:
    trainer = Trainer(TrainConfig.flat(**FAST, algorithm="psl", cuts=(2,), rounds=2, local_test_fraction=0.0))
    history = trainer.run()
    n_train = int(trainer.engine.data.x_train.shape[0])
    assert sum(len(p) for p in trainer.engine.data.parts) == n_train                  # iid: every sample trains
    assert all(len(p) == 0 for p in trainer.engine.data.local_test)
    split = Trainer(TrainConfig.flat(**FAST, algorithm="psl", cuts=(2,), rounds=1))
    assert sum(len(p) for p in split.engine.data.parts) < n_train
    assert trainer.evaluate()[2] is None and history.final_local_accuracy is None
    assert trainer.evaluate([0, 1])[3] is None and history.final_local_sampled_accuracy is None


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_algorithm_stops_a_diverging_run_with_the_message_and_its_history(algorithm, tmp_path, capsys) -> None:
    """A learning rate of 10⁵ drives every algorithm to NaN/inf: one line "training diverged at round t" (exit 2),
    never an internal error (GAPSL's angles of eqs. 1–6 used to reach math.ceil(NaN)), and the history kept."""
    extra = ["--local-steps", "2"] if algorithm == "gas" else []
    if REGISTRY[algorithm].defaults.optimizer == "adam":
        extra += ["--optimizer", "sgd"]                                                    # Adam's steps stay ≤ lr
    out = tmp_path / algorithm
    code = main(["train", "--algorithm", algorithm, "--dataset", "synthetic", "--model", "mlp", "--devices", "4",
                 *([] if REGISTRY[algorithm].whole_model else ["--cuts", "1"]), "--rounds", "40", "--lr", "1e5", "--clip-norm", "0", "--batch-size", "8",
                 "--eval-every", "1", "--threads", "1", "--no-progress", "--out", str(out), *extra])
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("plan from")]
    assert code == 2 and len(err) == 1 and "error: --lr: training diverged at round" in err[0], err
    t = int(err[0].split("training diverged at round ")[1].split(":")[0])
    if t > 1:
        assert [r["round"] for r in json.loads((out / "history.json").read_text())["records"]] == list(range(1, t))


@pytest.mark.parametrize("algorithm, interval, rounds, said", [
    ("scala", None, 10, True),          # SCALA's default I = 20 > 10 rounds: never averaged
    ("scala", 10, 10, False),           # averaged at round 10: the edge is not said
    ("sfl-v1", 11, 10, True),
    ("psl", 20, 10, False),             # PSL never averages client models: nothing to say
])
def test_an_interval_longer_than_the_run_is_said_in_one_line(capsys, algorithm: str, interval: int | None, rounds: int,
                                                              said: bool) -> None:
    """Issue 65: a tour's SCALA run kept its default I = 20 within 10 rounds and never aggregated, silently."""
    argv = ["train", "--algorithm", algorithm, "--dataset", "synthetic", "--devices", "2", "--cuts", "1", "--rounds",
            str(rounds), "--no-progress", "--model", "mlp", "--batch-size", "4", "--threads", "1", "--eval-every",
            str(rounds), *(["--interval", str(interval)] if interval else [])]
    assert main(argv) == 0
    err = capsys.readouterr().err
    shown = interval or 20
    line = (f"warning: {algorithm} averages the devices' models every I = {shown} rounds, more than the run's {rounds} "
            f"(--rounds): this run never averages them; give --interval {rounds} or less to see it do so")
    assert err.count(line) == (1 if said else 0), err
    assert ("never averages them" in err) == said, err
