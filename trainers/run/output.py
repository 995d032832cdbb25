"""What a run writes into its folder besides checkpoints: ``config.toml`` (the run as a file), ``history.json`` /
``history.csv`` and ``accuracy.png`` (docs/formats.md). Each write failure is one InputError naming ``--out``;
without a folder (``out`` None) nothing is written."""

from __future__ import annotations

from pathlib import Path

from adaptplan.errors import InputError
from trainers.config.run_file import FILE_NAME as RUN_FILE
from trainers.config.run_file import run_file_text
from trainers.config.train_config import TrainConfig
from trainers.run.checkpoint import write_atomic
from trainers.run.history import History


def save_run_file(out: str | None, config: TrainConfig) -> None:
    """``config.toml``: the run as a file (trainers/config/run_file.py), written before the first round (again on a
    resume, with the options it gave anew)."""
    if not out:
        return
    try:
        write_atomic(Path(out) / RUN_FILE, run_file_text(config).encode())
    except OSError as exc:
        raise InputError(f"cannot write {RUN_FILE} into {out!r}: {exc.strerror or exc}", field="--out") from None


def save_history(out: str | None, history: History) -> None:
    """history.json/.csv into ``out``; a write failure is one InputError naming the path and the cause."""
    if not out:
        return
    try:
        history.save(out)
    except OSError as exc:
        raise InputError(f"cannot write the history into {out!r}: {exc.strerror or exc}", field="--out") from None


def keep_history(out: str | None, history: History) -> None:
    """Write the history on the way out of a failed round; a failure to write is not allowed to hide the failure
    that stopped the run."""
    try:
        save_history(out, history)
    except InputError:
        pass


def save_plot(out: str | None, history: History) -> None:
    """``accuracy.png`` in ``out``: the run's accuracy curves (trainers/run/plotting.py)."""
    if not out:
        return
    from trainers.run.plotting import plot_histories, run_label

    plot_histories([(run_label(Path(out).name, history), history)], Path(out) / "accuracy.png")
