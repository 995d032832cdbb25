"""Whether a checkpoint may be continued by the run now asked for (``--resume``), beside the checkpoint's own
schema (:mod:`trainers.run.checkpoint_schema`, which has checked each field's form on load): the options that shape
the run are the checkpointed run's, its input files unchanged, the checkpoint this folder's run's, and its sample
indices within the data set. Each refusal is one InputError naming the option or ``--resume``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from adaptplan.errors import InputError
from trainers.config.train_config import RESUMABLE, TrainConfig, as_saved_run_trained


def check_same_run(config: TrainConfig, state: Mapping[str, Any], input_digests: Mapping[str, str | None],
                   uses_total_rounds: bool) -> dict[str, Any]:
    """The run's configuration (``config.to_json()``) after checking it against the checkpoint's: every option a
    resumed run may not change is the same (``--rounds`` too where the algorithm's schedule depends on the total,
    GAPSL's eq. 2), and every input file (system, plan, constants) has the SHA-256 it had when the run started."""
    saved, now = as_saved_run_trained(state["config"]), config.to_json()
    if uses_total_rounds and saved.get("rounds") != now["rounds"]:
        raise InputError(f"{config.algorithm}'s schedule depends on the run's total rounds T (GAPSL's eq. 2: "
                         f"K^t grows with t/T), so a resumed run keeps --rounds {saved.get('rounds')} (asked: "
                         f"{now['rounds']}); start a new run for more rounds", field="rounds")
    for key in now:
        if key not in RESUMABLE and saved.get(key) != now[key]:
            raise InputError(f"differs from the checkpointed run ({saved.get(key)!r} vs {now[key]!r})", field=key)
    for name, digest in (state["inputs"] or {}).items():
        if digest != input_digests.get(name):
            raise InputError(f"the {name} file {now.get(name + '_path')!r} changed since the run started (its SHA-256 "
                             "differs from the checkpoint's); resume with the same file, or start again with "
                             "--overwrite", field=f"{name}_path")
    return now


def check_run_identity(state: Mapping[str, Any], out: str, where: str) -> None:
    """A checkpoint continues the run whose history is in its folder: the run id (drawn when the run
    started, kept in history.json and every checkpoint) must match; a checkpoint copied from another run
    is refused. Since every checkpoint is written after the history (``history_beside``), a folder without
    history.json holds no run to continue: its checkpoint is refused, as is a checkpoint without a run id
    (one written before ids existed could come from any run) and one with an id beside a history without
    one. The id ties a checkpoint to its run against mistakes and copies, not against someone who can
    write the folder: the files carry no secret (docs/formats.md, the checkpoint fields)."""
    mine = state.get("run_id")                           # its form was checked on load
    if mine is None:
        raise InputError(f"the {where} carries no run id (it was written before adaptplan gave runs one), so "
                         "nothing ties it to this folder's run; start again with --overwrite", field="--resume")
    history_path = Path(out) / "history.json"
    if not history_path.is_file():
        raise InputError(f"the folder has no history.json, which the run that wrote the {where} keeps beside "
                         "every checkpoint: the checkpoint was copied from another run folder, or the history "
                         "was removed; copy the whole folder, or start again with --overwrite",
                         field="--resume")
    try:
        theirs = json.loads(history_path.read_text(encoding="utf-8")).get("meta", {}).get("run_id")
    except (OSError, ValueError, AttributeError, RecursionError) as exc:   # atomic: no torn write of this run
        raise InputError(f"history.json beside the {where} cannot be read ({type(exc).__name__}), so nothing ties "
                         "the checkpoint to this folder's run; restore the folder's history.json, or start again "
                         "with --overwrite", field="--resume") from None
    if theirs is None:                       # a run that gives its checkpoints an id writes it into its history
        raise InputError(f"the {where} has a run id (run id {str(mine)[:12]}…) and the history beside it none: "
                         "the history comes from another run, or was edited; copy the whole folder, or start "
                         "again with --overwrite", field="--resume")
    if theirs != mine:
        raise InputError(f"the {where} belongs to another run (run id {str(mine)[:12]}…) than the history beside it "
                         f"(run id {str(theirs)[:12]}…): a checkpoint copied from another run folder is not "
                         "continued; copy the whole folder, or start again with --overwrite", field="--resume")


def checked_partitions(state: Mapping[str, Any], n_train: int, dataset: str,
                       where: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(each device's training indices, its held-out indices) of the checkpoint, every index below the data set's
    ``n_train`` training samples (none held out where an older checkpoint has no local split)."""
    parts = state["partitions"]
    local_test = state.get("local_test", [np.zeros(0, dtype=np.int64)] * len(parts))
    for i, part in enumerate([*parts, *local_test]):
        if len(part) and int(part.max()) >= n_train:
            raise InputError(f"the {where} gives device {i % len(parts)} sample index {int(part.max())}, beyond the "
                             f"{n_train} training samples of {dataset}; start the run again with --overwrite",
                             field="--resume")
    return [np.asarray(p) for p in parts], [np.asarray(p) for p in local_test]
