"""Run folders, checkpoints and stops that lose nothing: resume from the folder alone, refused
reuse, locking, hostile or damaged checkpoints, changed inputs, SIGTERM, divergence, plan identity."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adaptplan.cli import main
from adaptplan.errors import InputError
from trainers.run.checkpoint import CHECKPOINT_NAME, MAGIC, decode, encode, load_checkpoint, write_atomic
from trainers.run.folder import RunFolder

BASE = ["train", "--dataset", "synthetic", "--devices", "3", "--batch-size", "8", "--cuts", "3", "--threads", "1",
        "--no-progress", "--eval-every", "2"]


def records(folder: Path) -> list[dict]:
    rows = json.loads((folder / "history.json").read_text())["records"]
    return [{k: v for k, v in r.items() if k != "wall_seconds"} for r in rows]


def test_resume_from_the_folder_alone_equals_an_uninterrupted_run(tmp_path, capsys) -> None:
    full, part = tmp_path / "full", tmp_path / "part"
    common = [*BASE, "--algorithm", "sfl-v1", "--lr", "0.05", "--momentum", "0.9", "--checkpoint-every", "2"]
    assert main([*common, "--rounds", "4", "--out", str(full)]) == 0
    assert main([*common, "--rounds", "2", "--out", str(part)]) == 0
    assert main(["train", "--out", str(part), "--resume", "--rounds", "4", "--no-progress"]) == 0
    assert records(full) == records(part) and len(records(full)) == 4
    capsys.readouterr()
    assert main(["train", "--out", str(part), "--resume", "--rounds", "6", "--lr", "0.1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--lr: cannot change on --resume (the run used 0.05)" in err


def test_a_used_folder_needs_resume_or_overwrite(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    argv = [*BASE, "--algorithm", "psl", "--rounds", "2", "--out", str(out)]
    assert main(argv) == 0
    first = (out / "history.json").read_bytes()
    capsys.readouterr()
    assert main(argv) == 2
    assert "already holds a run (history.json); pass --resume to continue it or --overwrite" in capsys.readouterr().err
    assert (out / "history.json").read_bytes() == first
    assert main([*argv[:-2], "--rounds", "1", "--out", str(out), "--overwrite"]) == 0
    assert len(records(out)) == 1
    capsys.readouterr()
    assert main([*argv, "--overwrite", "--resume"]) == 2
    assert "choose one" in capsys.readouterr().err


@pytest.mark.parametrize("given", [[], ["--overwrite"]])
def test_a_folder_that_is_neither_empty_nor_a_run_is_refused_before_anything_is_written(tmp_path, capsys, given) -> None:
    """Issue 67 F1: --out / (or /etc, or a project's folder) is refused, with or without --overwrite, and nothing in
    it is touched: a user's own config.toml and history.json survive."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "config.toml").write_text("mine = 1\n")
    (project / "history.json").write_text('{"my": "history"}')
    (project / "notes.txt").write_text("keep me")
    before = {p.name: p.read_bytes() for p in project.iterdir()}
    assert main([*BASE, "--algorithm", "psl", "--rounds", "1", "--out", str(project), *given]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith(f"--out: {str(project)!r} holds files that are not an adaptplan run's "
                                             "('config.toml', 'history.json', 'notes.txt'): name a new or empty "
                                             "folder, or the folder of an earlier adaptplan train run"), err
    assert {p.name: p.read_bytes() for p in project.iterdir()} == before
    with pytest.raises(InputError, match=r"^--out: '/' holds files that are not an adaptplan run's \("):
        RunFolder("/", overwrite=True).check()


def test_an_empty_folder_a_killed_runs_leftovers_and_an_earlier_run_are_taken(tmp_path, capsys) -> None:
    leftovers = tmp_path / "killed"
    leftovers.mkdir()
    (leftovers / ".adaptplan.lock").write_text("123")
    (leftovers / ".history.json.abc.tmp").write_text("half")
    (tmp_path / "empty").mkdir()
    for folder in (leftovers, tmp_path / "empty"):
        assert main([*BASE, "--algorithm", "psl", "--rounds", "1", "--out", str(folder)]) == 0
    run = tmp_path / "empty"
    (run / "notes.txt").write_text("the user's note beside the run")
    for name in ("history.json", "checkpoint.pt"):       # a run is known by its own files' first bytes
        (run / name).unlink(missing_ok=True)
    assert main([*BASE, "--algorithm", "psl", "--rounds", "1", "--out", str(run), "--overwrite"]) == 0   # config.toml
    assert (run / "notes.txt").read_text() == "the user's note beside the run" and len(records(run)) == 1
    (run / "config.toml").write_text("mine = 1\n")
    (run / "history.json").write_text('{"meta": {}}')
    capsys.readouterr()
    assert main([*BASE, "--algorithm", "psl", "--rounds", "1", "--out", str(run), "--overwrite"]) == 2
    assert "holds files that are not an adaptplan run's" in capsys.readouterr().err


def test_a_checkpoint_beyond_the_stated_size_or_a_history_nested_too_deep_is_one_line(tmp_path, capsys,
                                                                                      monkeypatch) -> None:
    """Issue 67 C6 (a 3 GiB checkpoint was read whole) and C5 (a 10⁶-deep history.json beside the checkpoint was an
    internal RecursionError on --resume)."""
    import trainers.run.checkpoint as checkpoint

    out = tmp_path / "run"
    assert main([*BASE, "--algorithm", "psl", "--rounds", "2", "--checkpoint-every", "2", "--out", str(out)]) == 0
    size = (out / CHECKPOINT_NAME).stat().st_size
    monkeypatch.setattr(checkpoint, "MAX_CHECKPOINT_BYTES", size - 1)
    capsys.readouterr()
    assert main(["train", "--out", str(out), "--resume", "--rounds", "4", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"holds {size:,} bytes, more than the {size - 1:,} a checkpoint may hold" in err
    monkeypatch.undo()
    text = (out / "history.json").read_text()
    (out / "history.json").write_text(text.replace('"meta": {', '"meta": {"deep": ' + "[" * 10**5 + "]" * 10**5 + ",", 1))
    assert main(["train", "--out", str(out), "--resume", "--rounds", "4", "--no-progress"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("plan from")]
    assert len(err) == 1 and "history.json beside the checkpoint" in err[0] and "(RecursionError)" in err[0], err


def test_a_locked_folder_is_refused(tmp_path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".adaptplan.lock").write_text("9" * 20)        # a stale, longer owner record
    with RunFolder(tmp_path / "run"):
        assert (tmp_path / "run" / ".adaptplan.lock").read_text() == str(os.getpid())   # replaced, not overwritten in part
        with pytest.raises(InputError, match=rf"in use by another adaptplan run \(process {os.getpid()}\)"):
            RunFolder(tmp_path / "run").__enter__()
    with RunFolder(tmp_path / "run"):      # released again
        pass


class Payload:
    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_planted_pickle_payload_never_runs(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    assert main([*BASE, "--algorithm", "psl", "--rounds", "2", "--checkpoint-every", "1", "--out", str(out)]) == 0
    marker = tmp_path / "pwned"
    payload = Payload()
    payload.marker = marker
    import io

    import torch

    buffer = io.BytesIO()
    torch.save({"config": payload}, buffer)
    data = buffer.getvalue()
    import hashlib

    (out / CHECKPOINT_NAME).write_bytes(MAGIC + hashlib.sha256(data).hexdigest().encode() + b"\n" + data)
    capsys.readouterr()
    assert main(["train", "--out", str(out), "--resume", "--rounds", "3"]) == 2
    err = capsys.readouterr().err
    assert "holds something other than tensors and plain values" in err and err.count("\n") == 1
    assert not marker.exists()
    raw = pickle.dumps(payload)              # an old-style bare pickle is refused before anything is read
    (out / CHECKPOINT_NAME).write_bytes(raw)
    assert main(["train", "--out", str(out), "--resume", "--rounds", "3"]) == 2
    assert "not an adaptplan checkpoint" in capsys.readouterr().err and not marker.exists()


@pytest.mark.parametrize("damage, message", [
    (lambda b: b"", "not an adaptplan checkpoint"),
    (lambda b: b[: len(b) // 2], "is damaged"),
    (lambda b: b[:-10] + bytes(x ^ 1 for x in b[-10:]), "is damaged"),
    (lambda b: b"{\"config\": {}}", "not an adaptplan checkpoint"),
    (lambda b: encode({"config": {"algorithm": "psl"}}), "lacks"),
    (lambda b: encode(["a", "list"]), "does not hold a run's state"),
])
def test_damaged_checkpoints_are_one_message(tmp_path, capsys, damage, message) -> None:
    out = tmp_path / "run"
    assert main([*BASE, "--algorithm", "psl", "--rounds", "2", "--checkpoint-every", "1", "--out", str(out)]) == 0
    path = out / CHECKPOINT_NAME
    path.write_bytes(damage(path.read_bytes()))
    capsys.readouterr()
    code = main([*BASE, "--algorithm", "psl", "--rounds", "3", "--out", str(out), "--resume"])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1, err


def test_checkpoint_state_of_wrong_shape_is_refused(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    assert main([*BASE, "--algorithm", "psl", "--rounds", "2", "--checkpoint-every", "1", "--out", str(out)]) == 0
    state = load_checkpoint(out)
    first = state["engine"]["devices"][0]["blocks"][0]
    key = next(iter(first))
    import torch

    first[key] = torch.zeros(7, 7)
    (out / CHECKPOINT_NAME).write_bytes(encode(state))
    capsys.readouterr()
    assert main(["train", "--out", str(out), "--resume", "--rounds", "3"]) == 2
    assert "does not fit this run" in capsys.readouterr().err
    state["round"] = -3
    (out / CHECKPOINT_NAME).write_bytes(encode(state))
    assert main(["train", "--out", str(out), "--resume", "--rounds", "3"]) == 2
    assert "round: must be an integer in [0, 1000000000], got -3" in capsys.readouterr().err


def test_a_changed_system_file_is_refused_on_resume(tmp_path, capsys) -> None:
    system = tmp_path / "system.json"
    assert main(["system", "--devices", "3", "--seed", "1", "-o", str(system)]) == 0
    out = tmp_path / "run"
    argv = [*BASE, "--algorithm", "psl", "--checkpoint-every", "1", "--system", str(system), "--out", str(out)]
    assert main([*argv, "--rounds", "2"]) == 0
    assert main(["system", "--devices", "3", "--seed", "2", "-o", str(system)]) == 0
    capsys.readouterr()
    assert main(["train", "--out", str(out), "--resume", "--rounds", "3"]) == 2
    assert "--system: the system file" in capsys.readouterr().err


def test_write_failure_keeps_the_previous_file(tmp_path) -> None:
    path = tmp_path / "checkpoint.pt"
    write_atomic(path, b"first")
    (tmp_path / "blocker").write_bytes(b"a file where the run folder should be")
    with pytest.raises(InputError, match="cannot write .*blocker.*the previous file there, if any, is intact"):
        write_atomic(tmp_path / "blocker" / "checkpoint.pt", b"second")
    assert path.read_bytes() == b"first" and not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))
    assert decode(encode({"a": 1}), "x") == {"a": 1}


def test_divergence_stops_with_the_history_kept(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    code = main([*BASE, "--algorithm", "psl", "--rounds", "50", "--lr", "1e4", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "training diverged at round" in err and "NaN or inf" in err and "--lr" in err
    assert err.strip().count("\n") == 1         # the plan line, then one error line
    kept = records(out)
    stopped = int(err.split("training diverged at round ")[1].split(":")[0])
    assert len(kept) == stopped - 1


def test_a_plan_for_another_model_is_refused(tmp_path, capsys) -> None:
    plan_file = tmp_path / "vgg_plan.json"
    assert main(["plan", "--json", "-o", str(plan_file)]) == 0          # VGG-16, 20 devices: the default scenario
    plan = json.loads(plan_file.read_text())
    assert plan["model"]["name"] == "vgg16-cifar" and plan["model"]["num_cuts"] == 16
    plan["cuts"] = [2, 2, 2]                     # 3 devices within the small cnn's cut points: only the identity differs
    plan_file.write_text(json.dumps(plan))
    capsys.readouterr()
    argv = ["train", "--dataset", "synthetic", "--devices", "3", "--batch-size", "8", "--rounds", "1", "--no-progress",
            "--plan", str(plan_file)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--plan: the plan was made for model 'vgg16-cifar' (16 cut points" in err and err.count("\n") == 1
    del plan["model"]                           # a plan without identity (older or hand-written files) is refused
    plan_file.write_text(json.dumps(plan))
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        "adaptplan train: error: plan.model: the plan does not say which model it was made for, so it cannot be "
        f"checked against --model cnn: make it with adaptplan plan --profile (which records the model), or give it as "
        f"--cuts 2,2,2 --interval {plan['interval']}\n")
    assert main([*argv[:-2], "--cuts", "2,2,2", "--interval", str(plan["interval"])]) == 0   # ... which runs


def test_sigterm_saves_a_checkpoint_and_resume_continues(tmp_path) -> None:
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "adaptplan.cli", *BASE, "--algorithm", "psl", "--rounds", "100000", "--out", str(out)]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[3])
    assert "plan from --cuts" in proc.stderr.readline()
    time.sleep(1.5)
    proc.send_signal(signal.SIGTERM)
    err = proc.stderr.read()
    assert proc.wait(60) == 128 + signal.SIGTERM
    assert "interrupted by SIGTERM after round" in err and "--resume" in err and "Traceback" not in err
    done = len(records(out))
    assert load_checkpoint(out)["round"] == done >= 1
    assert main(["train", "--out", str(out), "--resume", "--rounds", str(done + 2), "--no-progress"]) == 0
    assert len(records(out)) == done + 2


def test_plot_legend_names_the_algorithm_once(tmp_path, monkeypatch) -> None:
    import trainers.run.plotting

    runs = {"psl": "psl", "mine": "sfl-v1"}
    for folder, algorithm in runs.items():
        assert main([*BASE, "--algorithm", algorithm, "--rounds", "2", "--out", str(tmp_path / folder)]) == 0
    seen = {}
    original = trainers.run.plotting.plot_histories

    def spy(histories, out, title="x"):
        seen["labels"] = [label for label, _ in histories]
        return original(histories, out, title)

    monkeypatch.setattr(trainers.run.plotting, "plot_histories", spy)
    assert main(["plot", str(tmp_path / "psl"), str(tmp_path / "mine"), "-o", str(tmp_path / "p.png")]) == 0
    assert seen["labels"] == ["psl: cnn", "mine: sfl-v1, cnn"]        # the algorithm once; the model too (issue 37)


def test_checkpoint_round_trip_and_input_digests(tmp_path) -> None:
    import hashlib

    import numpy as np
    import torch

    from trainers.run.checkpoint import file_digest, save_checkpoint

    state = {"round": 7, "weights": torch.arange(6.0).reshape(2, 3), "parts": [np.array([3, 1, 2])],
             "pair": (np.int64(4), np.float32(0.5)), "name": "psl"}
    path = save_checkpoint(state, tmp_path)
    assert path == tmp_path / CHECKPOINT_NAME and path.read_bytes().startswith(MAGIC)
    loaded = load_checkpoint(tmp_path, validate=False)      # the container only: not a run's state
    assert loaded["round"] == 7 and loaded["name"] == "psl" and torch.equal(loaded["weights"], state["weights"])
    assert torch.equal(loaded["parts"][0], torch.tensor([3, 1, 2])) and loaded["pair"] == (4, 0.5)
    data = tmp_path / "system.json"
    data.write_bytes(b'{"devices": []}')
    assert file_digest(None) is None
    assert file_digest(data) == hashlib.sha256(b'{"devices": []}').hexdigest()
    with pytest.raises(InputError, match="cannot read") as info:
        file_digest(tmp_path)                               # a folder cannot be read as a file
    assert info.value.field == str(tmp_path)


def test_a_released_folder_can_be_left_and_locked_again(tmp_path) -> None:
    folder = RunFolder(tmp_path / "run")
    second = RunFolder(tmp_path / "run")
    with folder:
        folder.release()                  # let go early (as a refused folder does) ...
        second.__enter__()                # ... so another run can take the folder at once
    try:                                  # leaving the first block did not free the second run's lock
        with pytest.raises(InputError, match="in use by another adaptplan run"):
            RunFolder(tmp_path / "run").__enter__()
    finally:
        second.__exit__(None, None, None)
    with RunFolder(tmp_path / "run"):
        pass


def test_resume_without_a_checkpoint_says_how_to_get_one(tmp_path) -> None:
    with pytest.raises(InputError, match=r"no checkpoint at .*checkpoint\.pt'; the run must have been started with "
                                         r"--checkpoint-every") as info:
        load_checkpoint(tmp_path)
    assert info.value.field == "--resume"


def test_a_plan_for_a_model_with_as_many_cuts_but_another_structure_is_refused(tmp_path, capsys) -> None:
    plan_file = tmp_path / "plan.json"
    assert main(["plan", "--json", "-o", str(plan_file)]) == 0
    plan = json.loads(plan_file.read_text())
    argv = ["train", "--dataset", "synthetic", "--devices", "3", "--batch-size", "8", "--rounds", "1", "--no-progress",
            "--plan", str(plan_file)]
    del plan["model"]
    plan["cuts"] = [2, 2, 2]
    plan_file.write_text(json.dumps(plan))
    capsys.readouterr()
    from trainers.config.train_config import TrainConfig
    from trainers.run.driver import Trainer

    # the identity of the very model trained ...
    identity = Trainer(TrainConfig.flat(dataset="synthetic", devices=3, batch_size=8, rounds=1, cuts=(2, 2, 2),
                                   progress=False)).profile.identity()
    for sha, accepted in ((identity["structure_sha256"], True), ("0" * 64, False)):   # ... and of a look-alike
        plan["model"] = {**identity, "structure_sha256": sha}
        plan_file.write_text(json.dumps(plan))
        capsys.readouterr()
        assert main(argv) == (0 if accepted else 2)
    assert "--plan: the plan was made for model" in capsys.readouterr().err


def test_any_failure_in_a_round_keeps_the_history_and_is_raised_as_it_was(tmp_path, monkeypatch) -> None:
    """A lost rank (or any error inside a round) stops the run; rounds 1..t−1 are in history.json,
    and the error reaches the caller unchanged (the distributed runtime names the rank in it)."""
    from trainers.config.train_config import TrainConfig
    from trainers.engine.split_engine import SplitEngine
    from trainers.run.driver import Trainer

    out = tmp_path / "run"
    trainer = Trainer(TrainConfig.flat(dataset="synthetic", devices=3, batch_size=8, cuts=(3,), rounds=6, progress=False,
                                  out=str(out), threads=1))
    real = SplitEngine.run_round

    def lost_at_4(engine, t):
        if t == 4:
            raise ConnectionError("rank 3 (device 1) closed its connection (it died or was killed)")
        return real(engine, t)

    monkeypatch.setattr(SplitEngine, "run_round", lost_at_4)
    with pytest.raises(ConnectionError, match="rank 3"):
        trainer.run()
    assert [r["round"] for r in records(out)] == [1, 2, 3]


def test_a_failure_while_checkpointing_or_evaluating_keeps_the_history_too(tmp_path, monkeypatch) -> None:
    """A rank lost while rank 0 fetches the device states for a checkpoint (after round 4 was
    recorded), or during an evaluation (before round 3 is): the history holds every finished round."""
    from trainers.config.train_config import TrainConfig
    from trainers.run.driver import Trainer

    def trainer(name: str) -> Trainer:
        return Trainer(TrainConfig.flat(dataset="synthetic", devices=3, batch_size=8, cuts=(3,), rounds=6, progress=False,
                                   out=str(tmp_path / name), threads=1, checkpoint_every=2, eval_every=3))

    checkpointing = trainer("checkpoint")
    real = Trainer.state_dict

    def lost_at_4(self, t, wall):
        if t == 4:
            raise ConnectionError("rank 3 (device 1) closed its connection (it died or was killed)")
        return real(self, t, wall)

    monkeypatch.setattr(Trainer, "state_dict", lost_at_4)
    with pytest.raises(ConnectionError, match="rank 3"):
        checkpointing.run()
    assert [r["round"] for r in records(tmp_path / "checkpoint")] == [1, 2, 3, 4]
    evaluating = trainer("evaluate")
    monkeypatch.setattr(Trainer, "evaluate", lambda self, *a: (_ for _ in ()).throw(ConnectionError("rank 2 lost")))
    with pytest.raises(ConnectionError, match="rank 2 lost"):
        evaluating.run()
    assert [r["round"] for r in records(tmp_path / "evaluate")] == [1, 2]


def test_a_stopped_run_writes_its_history_once(tmp_path, monkeypatch) -> None:
    """SIGTERM: the run writes its history and its checkpoint at the end of the round, then stops, without writing
    the history again on the way out (a 16,000-round history takes 12 s to write: a stopped bench's workers spent
    that twice). The history holds the rounds up to the stop, and the run resumes from it."""
    import os
    import signal

    import trainers.run.driver as driver
    from trainers.config.train_config import TrainConfig
    from trainers.run.driver import Trainer
    from trainers.run.folder import Interrupted

    out = tmp_path / "run"
    trainer = Trainer(TrainConfig.flat(dataset="synthetic", devices=3, batch_size=8, cuts=(3,), rounds=6, progress=False,
                                       out=str(out), threads=1, checkpoint_every=4))
    saved, real_round, real_save = [], Trainer._round, driver.save_history

    def stop_after_2(self, t, out_, wall):
        record = real_round(self, t, out_, wall)
        if t == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return record

    monkeypatch.setattr(Trainer, "_round", stop_after_2)
    monkeypatch.setattr(driver, "save_history", lambda o, history: saved.append(len(history.records)) or real_save(o, history))
    with pytest.raises(Interrupted, match="after round 2"):
        trainer.run()
    assert saved == [2]
    assert [r["round"] for r in records(out)] == [1, 2]
