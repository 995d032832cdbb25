"""Shared CLI helpers: the function the installed ``adaptplan`` command runs, and the training
flags' error path (exit code 2 and one line naming the flag)."""

from __future__ import annotations

import contextlib
import importlib
import io
import tomllib
from pathlib import Path
from typing import Callable

from adaptplan.cli import main

ROOT = Path(__file__).resolve().parents[1]
TRAIN_COMMON = ["--dataset", "synthetic", "--devices", "4", "--rounds", "1", "--no-progress"]


def adaptplan_entry_point() -> Callable[[list[str] | None], int]:
    """The function the installed ``adaptplan`` script calls: pyproject.toml's ``[project.scripts]
    adaptplan = "module:function"`` (what pip writes the script from), imported with this interpreter.
    Calling it with ``argv`` is running ``adaptplan ARGV`` in this process (no interpreter start)."""
    spec = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]["adaptplan"]
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


def assert_train_flag_error(argv: list[str], flag: str, capsys) -> None:
    """``adaptplan train ARGV`` (tiny synthetic run) exits 2 with one stderr line naming ``flag``."""
    assert main(["train", *argv, *TRAIN_COMMON]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0], err


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:    # argparse
            code = exc.code if isinstance(exc.code, int) else 1
    return code, out.getvalue(), err.getvalue()
