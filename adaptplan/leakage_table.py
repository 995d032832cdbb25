"""The leakage table file (docs/formats.md "Leakage table"): what each cut of a model gives away, as ``adaptplan
profile MODEL --leakage --leakage-out FILE`` measured it, and the planner's budget over it (``adaptplan plan
--leakage-table FILE --max-leakage METRIC=LIMIT``; :class:`solvers.leakage_budget.LeakageBudget`).

JSON::

    {"format": "adaptplan-leakage", "version": 1,
     "model": {"name": ..., "num_cuts": L, "structure_sha256": ...},     # the profile's identity()
     "dataset": "cifar10-subset", "samples": 256,
     "figures": {"dcor": [d_1, ..., d_{L-1}], "norm_auc": [...], ...},  # one value per cut 1..L−1
     "defence": "none", "weights": "initial"}                               # optional, these by default

Each figure is one of :data:`METRICS`; a plan checks that the table was measured on the profile's model (the same
structure hash).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Mapping

from adaptplan.errors import InputError
from adaptplan.fileio import check_keys, load_file, save_json
from adaptplan.model_profile import ModelProfile

FORMAT, VERSION = "adaptplan-leakage", 1
AT_MOST = ("dcor", "norm_auc", "direction_auc", "psnr", "ssim")
"""Figures where a smaller value leaks less: a budget is an upper limit."""
AT_LEAST = ("mse",)
"""Figures where a larger value leaks less (reconstruction error): a budget is a lower limit."""
METRICS = AT_MOST + AT_LEAST


@dataclass(frozen=True)
class LeakageTable:
    """``figures[metric]``: the values at cuts 1..L−1 of the model ``model`` (a profile's identity)."""

    model: dict[str, Any]
    dataset: str
    samples: int
    figures: dict[str, list[float]]
    defence: str = "none"
    """The defence setting the figures were measured under (``profile --leakage-defence``, as
    :class:`adaptplan.defence_cost.DefenceSetting` names it)."""
    weights: str = "initial"
    """The model's weights the figures were measured at: ``initial`` (``profile``) or ``trained, round R`` (``train
    --leakage-out``)."""

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "model": dict(self.model), "dataset": self.dataset,
                "samples": self.samples, "figures": {k: list(v) for k, v in self.figures.items()},
                "defence": self.defence, "weights": self.weights}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "LeakageTable":
        check_keys(data, ("format", "version", "model", "dataset", "samples", "figures"), ("defence", "weights"), "leakage")
        if data["format"] != FORMAT or data["version"] != VERSION:
            raise InputError(f"must be {FORMAT!r} version {VERSION}", field="leakage.format")
        model, figures = data["model"], data["figures"]
        if not isinstance(model, dict) or not isinstance(model.get("num_cuts"), int) or "structure_sha256" not in model:
            raise InputError("must be a profile's identity (name, num_cuts, structure_sha256)", field="leakage.model")
        if not isinstance(figures, dict) or not figures:
            raise InputError(f"must map figures ({', '.join(METRICS)}) to one value per cut", field="leakage.figures")
        for name, values in figures.items():
            if name not in METRICS:
                raise InputError(f"unknown figure {name!r}; valid: {', '.join(METRICS)}", field="leakage.figures")
            if not isinstance(values, list) or len(values) != model["num_cuts"] - 1 or not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
                raise InputError(f"must be {model['num_cuts'] - 1} finite numbers, one per cut 1..L−1",
                                 field=f"leakage.figures.{name}")
        defence = data.get("defence", "none")
        if not isinstance(defence, str):
            raise InputError("must be a defence setting's name, e.g. 'none' or 'clip=4,noise=1'", field="leakage.defence")
        weights = data.get("weights", "initial")
        if not isinstance(weights, str):
            raise InputError("must say which weights were measured, e.g. 'initial'", field="leakage.weights")
        return cls(dict(model), str(data["dataset"]), int(data["samples"]),
                   {k: [float(v) for v in vs] for k, vs in figures.items()}, defence, weights)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "LeakageTable":
        return load_file(path, "leakage table", cls.from_json)

    def save(self, path: str | os.PathLike) -> None:
        save_json(self.to_json(), path)

    def figure(self, profile: ModelProfile, metric: str) -> list[float]:
        """``metric``'s values at cuts 1..L−1, from a table that must be of the profile's model (a budget over them:
        ``solvers.leakage_budget.LeakageBudget.uniform(metric, table.figure(profile, metric), limit, N)``)."""
        if self.model.get("structure_sha256") != profile.identity()["structure_sha256"]:
            raise InputError(f"was measured on {self.model.get('name')!r} ({self.model.get('num_cuts')} cuts), not on "
                             f"the profile's {profile.model!r} ({profile.num_cuts} cuts)", field="--leakage-table")
        if metric not in self.figures:
            raise InputError(f"the table has no {metric!r} (it has {', '.join(self.figures)})", field="--max-leakage")
        return list(self.figures[metric])


def parse_budget(text: str, num_devices: int | None = None) -> tuple[str, tuple[float, ...]]:
    """``"dcor=0.9"`` → ("dcor", (0.9,)): one limit for every device; ``"dcor=0.9,0.5,0.7"`` → one limit per device,
    device i's the i-th, as many as ``num_devices`` when it is given. InputError naming --max-leakage otherwise."""
    name, sep, values = text.partition("=")
    try:
        limits = tuple(float(v) for v in values.split(","))
    except ValueError:
        limits = (math.nan,)
    if not sep or name.strip() not in METRICS or not all(math.isfinite(v) for v in limits):
        raise InputError(f"expected METRIC=LIMIT (one limit for every device) or METRIC=L0,L1,… (one per device) with "
                         f"METRIC one of {', '.join(METRICS)} and finite limits, e.g. dcor=0.9; got {text!r}",
                         field="--max-leakage")
    if num_devices is not None and len(limits) not in (1, num_devices):
        raise InputError(f"{len(limits)} limits for {num_devices} devices: give one limit for every device or one per "
                         f"device", field="--max-leakage")
    return name.strip(), limits


def check_budget_pair(table: str | None, budget: str | None, fields: tuple[str, str] = ("--leakage-table",
                                                                                       "--max-leakage")) -> None:
    """A leakage budget needs both its table and its limits, or neither: InputError naming the one given (its field of
    ``fields``, the table's then the budget's) and the flag it needs."""
    if (table is None) == (budget is None):
        return
    given, flag, needed = ((fields[1], "--max-leakage", "--leakage-table FILE") if table is None
                           else (fields[0], "--leakage-table", "--max-leakage METRIC=LIMIT"))
    raise InputError(f"{flag} needs {needed}", field=given)
