"""A finished run read as a pilot of calibration (docs/model.md §10): :func:`read_pilot`."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from adaptplan.calibration import PilotRun
from adaptplan.crossing import first_crossing
from adaptplan.errors import InputError
from trainers.run.history import History

PILOT_SETTING_KEYS = ("algorithm", "extra", "dataset", "partition", "dirichlet_alpha", "labels_per_device",
                      "size_exponent", "local_test_fraction", "model", "model_width", "devices", "batch_size", "lr",
                      "client_lr", "server_lr", "optimizer", "client_optimizer", "server_optimizer", "momentum",
                      "weight_decay", "clip_norm")
"""The training settings a pilot must share with the run it calibrates (a history's ``meta.config`` keys): all that
shape the rounds to an accuracy but the plan and the seed."""
ADDED_LATER = ("labels_per_device", "size_exponent")
"""Setting keys absent from histories written before them: such a history trained as :data:`SAVED_BEFORE` says."""


def read_pilot(folder: str | os.PathLike, target: float, setting: dict[str, Any] | None = None) -> PilotRun:
    """The :class:`PilotRun` of the finished run in ``folder`` (its history.json) for ``target`` (a fraction).

    It must have kept one plan (cuts and interval) up to the round it reached the target, and, where ``setting``
    (a run's ``meta.config``) is given, trained with the same :data:`PILOT_SETTING_KEYS`; otherwise :class:`InputError`
    naming ``--pilots`` and what differs."""
    path = Path(folder)
    if not (path / "history.json").is_file():
        raise InputError(f"{str(path)!r} holds no history.json: give the folder of a finished run (--out of "
                         "adaptplan train)", field="--pilots")
    history = History.load(path)
    from trainers.config.train_config import SAVED_BEFORE

    before = {k: SAVED_BEFORE[k] for k in ADDED_LATER}
    config = {**before, **history.meta.get("config", {})}
    setting = None if setting is None else {**before, **setting}
    differs = [key for key in PILOT_SETTING_KEYS if setting is not None and config.get(key) != setting.get(key)]
    if differs and setting is not None:
        key = differs[0]
        raise InputError(f"{str(path)!r} trained with {key} = {config.get(key)!r}, this run with "
                         f"{setting.get(key)!r}: a pilot must share every training setting but the plan",
                         field="--pilots")
    evaluations = [(float(r.accuracy), float(r.round)) for r in history.evaluated if r.accuracy is not None]
    found = first_crossing(evaluations, target)
    if found is None:
        best = max((accuracy for accuracy, _ in evaluations), default=None)
        reached = "no evaluation" if best is None else f"at best {best:.1%}"
        raise InputError(f"{str(path)!r} never reached {target:.1%} test accuracy ({reached} in "
                         f"{len(history.records)} rounds): train the pilot longer or lower --target-accuracy",
                         field="--pilots")
    rounds = found.at[0]
    plans = {(tuple(r.cuts), r.interval) for r in history.records if r.round <= math.ceil(rounds)}
    if len(plans) != 1:
        raise InputError(f"{str(path)!r} changed its plan before reaching {target:.1%} ({len(plans)} plans): a pilot "
                         "must train one plan (give it --cuts and --interval, without --replan-every)",
                         field="--pilots")
    cuts, interval = plans.pop()
    if not cuts:
        raise InputError(f"{str(path)!r} records no device's cut before reaching {target:.1%}: its history.json was "
                         "cut short or edited", field="--pilots")
    return PilotRun(str(path), int(interval), max(cuts), float(target), float(rounds))
