"""Experiment tracking: every run with a folder writes TensorBoard event files into ``RUN/tensorboard/``
(torch's ``SummaryWriter``), one step per round, every field of its history record (docs/formats.md "Tracking").

Tags, by record field (:class:`~trainers.run.history.RoundRecord`): ``accuracy/global`` and ``accuracy/local``
(the two evaluation protocols, on the rounds that evaluate), ``loss/train`` and ``loss/test``, ``time/sim_seconds``
(cumulative simulated seconds), ``time/round_sim_seconds``, ``time/wall_seconds`` and, in a distributed run,
``time/measured_round_seconds``; ``stage_seconds/<stage>`` and ``measured_stage_seconds/<stage>`` (s per stage of
the round); ``bytes/up``, ``bytes/down``, ``bytes/server``; the plan in force, ``plan/interval``,
``plan/cut_mean`` and the histogram ``plan/cuts`` (one cut per device); ``plan/aggregated`` and
``plan/replanned`` (0 or 1), with a text entry ``plan/events`` naming the new plan at each re-planning;
``participants/count``; the algorithm's own figures as ``metrics/<name>``. The run's configuration is a text
entry ``config`` at its first step. Any record field not named here is logged as ``record/<field>``, so a field
added later is never dropped silently.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from trainers.run.folder import TRACKING_FOLDER as FOLDER  # the event files' folder in a run folder

SCALARS = {"accuracy": "accuracy/global", "local_accuracy": "accuracy/local", "train_loss": "loss/train",
           "test_loss": "loss/test", "sim_seconds": "time/sim_seconds", "round_sim_seconds": "time/round_sim_seconds",
           "wall_seconds": "time/wall_seconds", "measured_round_seconds": "time/measured_round_seconds",
           "bytes_up": "bytes/up", "bytes_down": "bytes/down", "bytes_server": "bytes/server",
           "interval": "plan/interval", "aggregated": "plan/aggregated", "replanned": "plan/replanned"}
"""Record field → the scalar tag it is logged under."""
GROUPS = {"stage_seconds": "stage_seconds", "measured_stage_seconds": "measured_stage_seconds", "metrics": "metrics"}
"""Record fields holding a dict of numbers → the tag prefix of its entries."""


def record_tags(record: Any) -> dict[str, float]:
    """The scalars of one round's record, by tag (module docstring); fields that are None are left out."""
    out: dict[str, float] = {}
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if f.name == "round" or value is None:
            continue
        if f.name in GROUPS:
            out.update({f"{GROUPS[f.name]}/{k}": float(v) for k, v in value.items() if _number(v)})
        elif f.name == "cuts":
            if value:
                out["plan/cut_mean"] = sum(value) / len(value)
        elif f.name == "participants":
            out["participants/count"] = float(len(value))
        elif _number(value):
            out[SCALARS.get(f.name, f"record/{f.name}")] = float(value)
    return out


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value))


class TensorBoardLog:
    """The event files of the run in ``out`` (created on the first round logged; a resumed run appends a new
    file whose steps go on from its checkpoint's round)."""

    def __init__(self, out: str | Path, config: dict[str, Any]) -> None:
        self.folder = Path(out) / FOLDER
        self.config = config
        self._writer: Any = None

    def _open(self, step: int) -> Any:
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(self.folder))
            self._writer.add_text("config", "```\n" + json.dumps(self.config, indent=1, sort_keys=True) + "\n```",
                                  global_step=step)
        return self._writer

    def log(self, record: Any) -> None:
        """Every field of ``record`` at step ``record.round``."""
        writer = self._open(record.round)
        for tag, value in record_tags(record).items():
            writer.add_scalar(tag, value, global_step=record.round)
        if record.cuts:
            import numpy as np

            writer.add_histogram("plan/cuts", np.asarray(record.cuts), global_step=record.round)
        if record.replanned:
            writer.add_text("plan/events", f"round {record.round}: re-planned, cuts {record.cuts}, interval "
                                           f"{record.interval}", global_step=record.round)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None
