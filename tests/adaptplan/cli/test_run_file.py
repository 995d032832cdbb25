"""Runs as files (issue 37 item 2; trainers/config/run_file.py, adaptplan/cli/run_file.py, docs/formats.md "Run
files"): every run folder holds the config.toml that reproduces its run bit for bit; ``train --config FILE`` reads
one, the command line's flags override it, and a key or value the command line would not take is one error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adaptplan.cli import main

SMALL = ["--dataset", "synthetic", "--model", "mlp", "--devices", "3", "--rounds", "4", "--eval-every", "2",
         "--no-progress"]


def records(folder: Path) -> list[tuple]:
    """What a run computed, round by round (wall-clock and measured seconds left out)."""
    data = json.loads((folder / "history.json").read_text())
    keep = ("round", "train_loss", "accuracy", "test_loss", "sim_seconds", "bytes_up", "bytes_down", "bytes_server",
            "cuts", "interval", "participants", "local_accuracy", "stage_seconds", "metrics")
    return [tuple(json.dumps(r.get(k), sort_keys=True) for k in keep) for r in data["records"]]


def config_of(folder: Path) -> dict:
    config = dict(json.loads((folder / "history.json").read_text())["meta"]["config"])
    config.pop("out")
    return config


@pytest.mark.parametrize("argv", [
    ["--algorithm", "sfl-v1", "--cuts", "2", "--lr", "0.05", "--seed", "3", "--participation", "0.67",
     "--static-resources"],
    ["--algorithm", "gapsl", "--cuts", "2", "--k-min", "0.34", "--server-step", "sum", "--momentum", "0.5"],
])
def test_a_run_folders_config_toml_reproduces_the_run_bit_for_bit(tmp_path, argv) -> None:
    assert main(["train", *SMALL, *argv, "--out", str(tmp_path / "a")]) == 0
    text = (tmp_path / "a" / "config.toml").read_text()
    assert not any(line.startswith("out =") for line in text.splitlines()) and "no-progress = true" in text
    assert main(["train", "--config", str(tmp_path / "a" / "config.toml"), "--out", str(tmp_path / "b")]) == 0
    assert records(tmp_path / "b") == records(tmp_path / "a") and len(records(tmp_path / "a")) == 4
    assert config_of(tmp_path / "b") == config_of(tmp_path / "a")
    assert (tmp_path / "b" / "config.toml").read_text() == text              # a fixed point


def test_a_python_only_option_is_written_under_its_key_and_read_back(tmp_path) -> None:
    """An option without a flag (here ``model_width``, set through the Python API) is written under its flat key
    where it differs from its default, and ``train --config`` takes it."""
    from trainers.config.train_config import TrainConfig
    from trainers.run.driver import run

    run(TrainConfig.flat(algorithm="psl", dataset="synthetic", model="mlp", devices=3, rounds=3, eval_every=3,
                         model_width=8, cuts=[2, 2, 2], out=str(tmp_path / "api")))
    assert "model_width = 8" in (tmp_path / "api" / "config.toml").read_text().splitlines()
    assert main(["train", "--config", str(tmp_path / "api" / "config.toml"), "--out", str(tmp_path / "cli")]) == 0
    assert records(tmp_path / "cli") == records(tmp_path / "api")
    assert config_of(tmp_path / "cli")["model_width"] == 8


def test_the_command_lines_flags_override_the_file(tmp_path) -> None:
    run_file = tmp_path / "run.toml"
    run_file.write_text('algorithm = "psl"\ndataset = "synthetic"\nmodel = "mlp"\ndevices = 3\nrounds = 5\n'
                        'eval_every = 1\nno-progress = true\ncuts = [2, 2, 2]\n')
    assert main(["train", "--config", str(run_file), "--rounds", "2", "--out", str(tmp_path / "r")]) == 0
    assert len(records(tmp_path / "r")) == 2 and config_of(tmp_path / "r")["algorithm"] == "psl"
    assert main(["train", f"--config={run_file}", "--devices", "4", "--rounds", "1", "--cuts", "2",
                 "--out", str(tmp_path / "s")]) == 0
    assert config_of(tmp_path / "s")["devices"] == 4 and config_of(tmp_path / "s")["cuts"] == [2, 2, 2, 2]


@pytest.mark.parametrize("content, message", [
    ("batchsize = 16\n", r"run.toml: batchsize: 'batchsize' is not an option of adaptplan train \(did you mean "
                         r"'batch-size'\?\)"),
    ("no-progress = 3\n", r"run.toml: no-progress: must be true or false, got 3"),
    ("lr = true\n", r"run.toml: lr: takes a value"),
    ("cuts = []\n", r"run.toml: cuts: must be a list of numbers or texts"),
    ("cuts = [2, true]\n", r"run.toml: cuts: must be a list of numbers or texts"),
    ("cuts = [2, [3]]\n", r"run.toml: cuts: must be a list of numbers or texts"),
    ("[data]\ndevices = 3\n", r"run.toml: data: \[data\] is a table; a run file is flat: write each option as a "
                               r"top-level `name = value` line"),
    ("learning_rate = 0.1\n", r"run.toml: learning_rate: 'learning_rate' is not an option of adaptplan train \(did you "
                              r"mean 'lr'\?\)"),
    ("epochs = 3\n", r"run.toml: epochs: 'epochs' is not an option of adaptplan train \(did you mean 'rounds'\?\)"),
    ("devices = \n", r"--config .*run.toml is not TOML"),
    ("rounds = " + "[" * 2000 + "]" * 2000 + "\n", r"--config .*run.toml nests deeper than 32 levels"),   # F2
    ("rounds = " + "[" * 33 + "]" * 33 + "\n", r"--config .*run.toml nests deeper than 32 levels"),
    ("config = \"other.toml\"\n", r"'config' is not an option"),
])
def test_a_key_or_value_the_command_line_would_not_take_is_one_error(tmp_path, capsys, content, message) -> None:
    run_file = tmp_path / "run.toml"
    run_file.write_text(content)
    assert main(["train", "--config", str(run_file)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("adaptplan train: error: ") and "Traceback" not in err, err
    assert __import__("re").search(message, err), err


def test_a_mistyped_value_is_the_flags_own_error_and_a_missing_file_is_named(tmp_path, capsys) -> None:
    run_file = tmp_path / "run.toml"
    run_file.write_text('devices = "three"\n')
    assert main(["train", "--config", str(run_file)]) == 2
    assert "--devices" in capsys.readouterr().err
    assert main(["train", "--config", str(tmp_path / "absent.toml")]) == 2
    assert "absent.toml' does not exist" in capsys.readouterr().err
    assert main(["train", "--config"]) == 2
    assert "--config" in capsys.readouterr().err
    assert main(["train", "--config", str(tmp_path)]) == 2                    # a folder
    assert f"{str(tmp_path)!r} is not a file" in capsys.readouterr().err


def test_every_other_name_answers_with_an_option_of_train() -> None:
    """The names other tools use (learning_rate...) each point at a flag that exists, and none is itself one."""
    from adaptplan.cli import build_parser
    from adaptplan.cli.run_file import OTHER_NAMES

    train = next(a for a in build_parser()._subparsers._group_actions[0].choices.values() if a.prog.endswith("train"))
    flags = {s.removeprefix("--") for a in train._actions for s in a.option_strings if s.startswith("--")}
    assert set(OTHER_NAMES.values()) <= flags and not set(OTHER_NAMES) & flags
