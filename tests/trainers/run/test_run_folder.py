"""A run folder is a trust boundary (issue 25, first part): resuming imports no code the command line did not
name, a checkpoint copied from another run is refused, and a killed run's temporary files are cleaned up."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from adaptplan.cli import main

ROOT = Path(__file__).resolve().parents[3]
FAST = ["--dataset", "synthetic", "--model", "mlp", "--devices", "2", "--cuts", "1", "--batch-size", "8",
        "--eval-every", "1", "--threads", "1", "--no-progress"]


def adaptplan(cwd: Path, *argv: str) -> subprocess.CompletedProcess:
    code = "import sys; from adaptplan.cli import main; sys.exit(main(sys.argv[1:]))"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-P", "-c", code, *argv], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env=env)


def test_resuming_imports_only_a_user_model_named_on_the_command_line(tmp_path) -> None:
    (tmp_path / "trojan.py").write_text(textwrap.dedent("""
        from pathlib import Path
        from torch import nn
        Path("imported.txt").write_text("the module ran")          # what a received run folder could do
        def net(num_classes=10):
            return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, num_classes))
    """))
    common = ["--dataset", "synthetic", "--devices", "2", "--cuts", "1", "--batch-size", "8", "--threads", "1",
              "--no-progress"]
    first = adaptplan(tmp_path, "train", "--model", "trojan:net", *common, "--rounds", "2", "--checkpoint-every", "1",
                      "--out", "run")
    assert first.returncode == 0, first.stderr
    marker = tmp_path / "imported.txt"
    marker.unlink()
    refused = adaptplan(tmp_path, "train", "--out", "run", "--resume", "--rounds", "3")
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert "--resume" in lines[0] and "trains the user model 'trojan:net'" in lines[0] and "--model trojan:net" in lines[0]
    assert not marker.exists()                                      # nothing was imported
    named = adaptplan(tmp_path, "train", "--out", "run", "--resume", "--rounds", "3", "--model", "trojan:net",
                      "--checkpoint-every", "1")
    assert named.returncode == 0, named.stderr
    assert marker.exists()
    trusted = adaptplan(tmp_path, "train", "--out", "run", "--resume", "--rounds", "4", "--trust-run-folder")
    assert trusted.returncode == 0, trusted.stderr


def test_trust_run_folder_applies_to_resume_only(tmp_path, capsys) -> None:
    assert main(["train", *FAST, "--rounds", "1", "--trust-run-folder", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--trust-run-folder" in err[0] and "applies to --resume" in err[0]


def test_a_checkpoint_copied_from_another_run_is_refused(tmp_path, capsys) -> None:
    for name, seed in (("a", "0"), ("b", "1")):
        assert main(["train", *FAST, "--rounds", "2", "--checkpoint-every", "1", "--seed", seed,
                     "--out", str(tmp_path / name)]) == 0
    history = (tmp_path / "a" / "history.json").read_text()
    shutil.copy(tmp_path / "b" / "checkpoint.pt", tmp_path / "a" / "checkpoint.pt")
    capsys.readouterr()
    assert main(["train", "--out", str(tmp_path / "a"), "--resume", "--rounds", "3"]) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("plan from")]
    assert len(err) == 1 and "belongs to another run" in err[0] and "--resume" in err[0], err
    assert (tmp_path / "a" / "history.json").read_text() == history          # nothing rewritten
    assert main(["train", "--out", str(tmp_path / "b"), "--resume", "--rounds", "3"]) == 0   # its own run goes on
    # the issue 36 harness, second run: a history without a run id (as written before ids) beside a checkpoint with one
    import json

    doc = json.loads(history)
    del doc["meta"]["run_id"]
    (tmp_path / "a" / "history.json").write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["train", "--out", str(tmp_path / "a"), "--resume", "--rounds", "3"]) == 2
    assert "has a run id" in capsys.readouterr().err


def test_every_checkpoint_has_its_history_beside_it_so_a_copied_one_is_refused_in_a_folder_without(
        tmp_path, capsys, monkeypatch) -> None:
    """Issue 36 C4: a run killed mid-run used to leave a checkpoint without history.json, so another run's
    checkpoint copied into such a folder was continued. Every checkpoint is now written after the history (the
    history's run id is the checkpoint's when the checkpoint is written), and a checkpoint that says so is
    refused in a folder without history.json."""
    import json

    import trainers.run.driver as run_module

    seen = []
    real = run_module.save_checkpoint

    def spy(state, out):
        history = json.loads((Path(out) / "history.json").read_text())
        seen.append((history["meta"]["run_id"] == state["run_id"], len(history["records"]) == state["round"]))
        return real(state, out)

    monkeypatch.setattr(run_module, "save_checkpoint", spy)
    assert main(["train", *FAST, "--rounds", "3", "--checkpoint-every", "1", "--out", str(tmp_path / "b")]) == 0
    assert seen == [(True, True)] * 3
    killed = tmp_path / "killed"
    killed.mkdir()
    shutil.copy(tmp_path / "b" / "checkpoint.pt", killed / "checkpoint.pt")       # no history beside it
    capsys.readouterr()
    assert main(["train", "--out", str(killed), "--resume", "--rounds", "4"]) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("plan from")]
    assert len(err) == 1 and "no history.json" in err[0] and "--resume" in err[0], err
    assert main(["train", "--out", str(tmp_path / "b"), "--resume", "--rounds", "4"]) == 0   # its own folder goes on


def test_a_checkpoint_that_nothing_ties_to_the_folders_run_is_refused(tmp_path, capsys) -> None:
    """Issue 36 item 2, the harness's last two accepted swaps: a checkpoint stripped of its run id (and of
    history_beside) in a folder without history.json used to be resumed as one written before ids; so was any
    checkpoint beside an unreadable history.json. Each is now refused with one line naming --resume; the run's
    own folder still resumes."""
    from trainers.run.checkpoint import load_checkpoint, save_checkpoint

    source = tmp_path / "source"
    assert main(["train", *FAST, "--rounds", "2", "--checkpoint-every", "1", "--out", str(source)]) == 0
    state = load_checkpoint(source, validate=False)

    def refused(folder: Path, edit, history: str | None) -> str:
        folder.mkdir()
        edited = dict(state)
        edit(edited)
        save_checkpoint(edited, folder)                    # framed anew: a valid SHA-256 header
        if history is not None:
            (folder / "history.json").write_text(history)
        capsys.readouterr()
        assert main(["train", "--out", str(folder), "--resume", "--rounds", "3"]) == 2
        err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("plan from")]
        assert len(err) == 1 and "--resume" in err[0] and "Traceback" not in err[0], err
        return err[0]

    def strip(s: dict) -> None:
        del s["run_id"], s["history_beside"]

    def legacy(s: dict) -> None:
        del s["history_beside"]

    history = (source / "history.json").read_text()
    assert "carries no run id" in refused(tmp_path / "stripped", strip, None)
    assert "carries no run id" in refused(tmp_path / "stripped-beside", strip, history)
    assert "no history.json" in refused(tmp_path / "legacy", legacy, None)
    assert "cannot be read" in refused(tmp_path / "unreadable", lambda s: None, "{not json")
    assert main(["train", "--out", str(source), "--resume", "--rounds", "3"]) == 0


def test_a_killed_writes_temporary_files_are_removed_when_the_folder_is_used_again(tmp_path) -> None:
    run = tmp_path / "run"
    assert main(["train", *FAST, "--rounds", "1", "--checkpoint-every", "1", "--out", str(run)]) == 0
    stale = [run / ".checkpoint.pt.k1ll3d.tmp", run / ".history.json.x.tmp"]
    for path in stale:
        path.write_bytes(b"")
    keep = run / ".notes.tmp"
    keep.write_text("mine")
    assert main(["train", "--out", str(run), "--resume", "--rounds", "2"]) == 0
    assert not any(path.exists() for path in stale) and keep.read_text() == "mine"


def test_a_model_name_that_ends_the_process_is_refused_with_one_line(tmp_path) -> None:
    """`--model sys:exit` used to exit 0 with no output and `os:abort` to kill the process (exit 134); a factory or
    a module that calls sys.exit() is a failed build."""
    (tmp_path / "quits.py").write_text(textwrap.dedent("""
        import sys
        def factory(num_classes=10):
            sys.exit(3)
    """))
    (tmp_path / "quitsonimport.py").write_text("import sys\nsys.exit(0)\n")
    for spec, message in (("sys:exit", "is a built-in function"), ("os:abort", "is a built-in function"),
                          ("quits:factory", "building model 'quits:factory' failed: SystemExit"),
                          ("quitsonimport:net", "importing module 'quitsonimport'")):
        result = adaptplan(tmp_path, "profile", spec, "--input", "3x8x8")
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and message in lines[0], (spec, result.stderr)


def test_interrupted_survives_pickling_as_a_bench_worker_sends_it() -> None:
    """A bench's worker process returns its run's Interrupted to the bench through pickle; rebuilt from its message
    alone it raised TypeError in the bench's result reader (seen 2026-11-30: stopped workers were then killed at
    the grace instead of exiting)."""
    import pickle
    import signal

    from trainers.run.folder import Interrupted

    sent = Interrupted(signal.SIGTERM, 19200, "/runs/a", "adaptplan train --out /runs/a --resume")
    got = pickle.loads(pickle.dumps(sent))
    assert type(got) is Interrupted and str(got) == str(sent)
    assert (got.signum, got.round, got.saved, got.resume) == (signal.SIGTERM, 19200, "/runs/a",
                                                               "adaptplan train --out /runs/a --resume")
