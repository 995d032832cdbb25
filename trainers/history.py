"""Per-round records of a run (JSON + CSV), the paper's convergence criterion and the
time-to-target-accuracy metric. Simulated seconds (``sim_seconds``) and wall-clock seconds
(``wall_seconds``) are separate columns and are never mixed.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from adaptplan.errors import InputError
from adaptplan.fileio import check_keys, load_mapping, save_json


@dataclass
class RoundRecord:
    """One round t. ``accuracy``/``test_loss`` are None on rounds without evaluation. Seconds are
    cumulative at the end of round t; bytes are this round's (device→server ``bytes_up``,
    server→device ``bytes_down``, edge↔fed ``bytes_server``). ``cuts``/``interval`` = the plan in force.
    ``participants`` the devices that trained; ``stage_seconds`` the round's seconds per stage (the
    longest device's, per stage; ``server`` = the edge server's busy time); ``metrics`` the
    algorithm's own per-round figures (e.g. GAPSL's selection ratio)."""

    round: int
    train_loss: float
    accuracy: float | None
    test_loss: float | None
    sim_seconds: float
    round_sim_seconds: float
    wall_seconds: float
    bytes_up: int
    bytes_down: int
    bytes_server: int
    aggregated: bool
    replanned: bool
    cuts: list[int]
    interval: int
    participants: list[int] = field(default_factory=list)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


OPTIONAL_RECORD_FIELDS = ("participants", "stage_seconds", "metrics")   # absent in histories written before Engine v2

@dataclass
class History:
    """All rounds of a run plus run metadata (config, events)."""

    records: list[RoundRecord] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)

    def append(self, record: RoundRecord) -> None:
        self.records.append(record)

    @property
    def evaluated(self) -> list[RoundRecord]:
        return [r for r in self.records if r.accuracy is not None]

    @property
    def final_accuracy(self) -> float | None:
        final = self.meta.get("final_evaluation")
        if final is not None:
            return final["accuracy"]
        ev = self.evaluated
        return ev[-1].accuracy if ev else None

    def converged_round(self, min_gain: float = 0.02, patience: int = 5, floor: float | None = None) -> int | None:
        """The paper's criterion (docs/model.md §6.1): the first evaluated round after which the test-accuracy
        increase stays below ``min_gain`` for ``patience`` consecutive evaluations; None if never.
        Evaluations below ``floor`` (default: twice chance, 2/M for the run's M classes in
        ``meta["num_classes"]``; 0 when unknown) neither count nor start a streak, so a run still
        near chance is not "converged"."""
        if floor is None:
            classes = self.meta.get("num_classes")
            floor = 2.0 / classes if isinstance(classes, int) and classes > 0 else 0.0
        ev = self.evaluated
        streak = 0
        for prev, cur in zip(ev, ev[1:]):
            if cur.accuracy < floor:
                streak = 0
                continue
            streak = streak + 1 if cur.accuracy - prev.accuracy < min_gain else 0
            if streak >= patience:
                return cur.round
        return None

    def time_to_accuracy(self, target: float) -> float | None:
        """Simulated seconds at which test accuracy first reaches ``target`` (None if never)."""
        for r in self.evaluated:
            if r.accuracy >= target:
                return r.sim_seconds
        return None

    def summary(self, target: float | None = None) -> dict[str, Any]:
        conv = self.converged_round()
        out: dict[str, Any] = {"rounds": len(self.records), "final_accuracy": self.final_accuracy,
                               "converged_round": conv,
                               "sim_seconds": self.records[-1].sim_seconds if self.records else 0.0,
                               "wall_seconds": self.records[-1].wall_seconds if self.records else 0.0}
        if conv is not None:
            rec = next(r for r in self.records if r.round == conv)
            out["converged_accuracy"], out["converged_sim_seconds"] = rec.accuracy, rec.sim_seconds
        if target is not None:
            out["target_accuracy"], out["time_to_target_s"] = target, self.time_to_accuracy(target)
        return out

    def to_json(self) -> dict[str, Any]:
        return {"meta": self.meta, "events": self.events, "summary": self.summary(self.meta.get("target_accuracy")),
                "records": [asdict(r) for r in self.records]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "History":
        """Rebuild a history; a malformed one raises InputError naming the offending part."""
        check_keys(data, ("records",), ("meta", "events", "summary"), "history")
        if not isinstance(data["records"], list):
            raise InputError("must be a list of per-round records", field="history.records")
        if not isinstance(data.get("meta", {}), dict) or not isinstance(data.get("events", []), list):
            raise InputError("meta must be an object and events a list", field="history")
        names = [f.name for f in fields(RoundRecord)]
        records = []
        for k, r in enumerate(data["records"]):
            check_keys(r, [n for n in names if n not in OPTIONAL_RECORD_FIELDS], OPTIONAL_RECORD_FIELDS,
                       f"history.records[{k}]")
            records.append(RoundRecord(**r))
        return cls(records, dict(data.get("meta", {})), list(data.get("events", [])))

    def save(self, folder: str | os.PathLike) -> None:
        """Write ``history.json`` and ``history.csv`` into ``folder`` (atomic JSON)."""
        folder = Path(folder)
        save_json(self.to_json(), folder / "history.json")
        tmp = folder / "history.csv.tmp"
        names = [f.name for f in fields(RoundRecord)]
        with open(tmp, "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(names)
            for r in self.records:
                row = asdict(r)
                row["cuts"] = " ".join(map(str, r.cuts))
                row["participants"] = " ".join(map(str, r.participants))
                for name in ("stage_seconds", "metrics"):
                    row[name] = json.dumps(row[name], sort_keys=True)
                writer.writerow([row[n] for n in names])
        os.replace(tmp, folder / "history.csv")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "History":
        p = Path(path)
        if p.is_dir():
            p = p / "history.json"
        return cls.from_json(load_mapping(p, "history"))
