"""Shared check for the training flags' error path: exit code 2 and one line naming the flag."""

from __future__ import annotations

from adaptplan.cli import main

TRAIN_COMMON = ["--dataset", "synthetic", "--devices", "4", "--rounds", "1", "--no-progress"]


def assert_train_flag_error(argv: list[str], flag: str, capsys) -> None:
    """``adaptplan train ARGV`` (tiny synthetic run) exits 2 with one stderr line naming ``flag``."""
    assert main(["train", *argv, *TRAIN_COMMON]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0], err
