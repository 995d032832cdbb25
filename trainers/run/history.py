"""Per-round records of a run (JSON + CSV), the paper's convergence criterion and the
time-to-target-accuracy metric. Simulated seconds (``sim_seconds``) and wall-clock seconds
(``wall_seconds``) are separate columns and are never mixed.
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Sequence

from adaptplan.crossing import first_crossing
from adaptplan.errors import InputError
from adaptplan.fileio import (
    atomic_write,
    check_keys,
    finite_number,
    int_in_range,
    load_file,
    mapping_value,
    non_negative_number,
    number_in_range,
    positive_int,
    save_text,
    show,
    text_value,
)
from adaptplan.limits import MAX_CUT_POINTS, MAX_DEVICES, MAX_NUM_CLASSES, MAX_ROUNDS, MAX_STEPS

MAX_BYTES = 2**63 - 1   # bytes of one round's traffic in a history file


@dataclass
class RoundRecord:
    """One round t. ``accuracy``/``test_loss`` are None on rounds without evaluation (global protocol: the test
    set); ``local_accuracy`` the local protocol's (each device's model on its own held-out samples, pooled; None
    without a local split), ``local_sampled_accuracy`` the same over the round's participants only (the CycleSL
    authors' protocol). Seconds are
    cumulative at the end of round t; bytes are this round's (device→server ``bytes_up``,
    server→device ``bytes_down``, edge↔fed ``bytes_server``). ``cuts``/``interval`` = the plan in force.
    ``participants`` the devices that trained; ``stage_seconds`` the round's seconds per stage (the
    longest device's, per stage; ``server`` = the edge server's busy time); ``metrics`` the
    algorithm's own per-round figures (e.g. GAPSL's selection ratio). A torch.distributed run adds the wall
    seconds it measured per stage (same stages, the longest participant's) and for the whole round."""

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
    measured_stage_seconds: dict[str, float] = field(default_factory=dict)
    measured_round_seconds: float | None = None
    local_accuracy: float | None = None
    local_sampled_accuracy: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON object: what ``dataclasses.asdict`` gives, built field by field — its fields are
        numbers, flags, lists of numbers and objects of numbers, so one shallow copy of each list and object is a
        full copy (``asdict`` deep-copies value by value: 6 of a 20,000-round history's 19 s to save)."""
        return {name: (list(value) if isinstance(value, list) else dict(value) if isinstance(value, dict) else value)
                for name, value in ((name, getattr(self, name)) for name in RECORD_FIELDS)}


RECORD_FIELDS = tuple(f.name for f in fields(RoundRecord))
OPTIONAL_RECORD_FIELDS = ("participants", "stage_seconds", "metrics",     # absent in histories written before Engine v2
                          "measured_stage_seconds", "measured_round_seconds",   # set by the torch.distributed runtime
                          "local_accuracy",                                     # absent before the local protocol
                          "local_sampled_accuracy")                             # absent before its sampled variant

def chance_floor(num_classes: int | None) -> float:
    """Twice chance, 2/M for M classes (0 when M is unknown): evaluations below it do not count towards convergence."""
    return 2.0 / num_classes if num_classes else 0.0


def first_converged(accuracies: Sequence[float], floor: float, min_gain: float = 0.02, patience: int = 5) -> int | None:
    """The paper's convergence criterion (AdaptSFL, docs/model.md §6.1) over a run's evaluations in order: the index
    of the first evaluation after which the accuracy's increase from one evaluation to the next has stayed below
    ``min_gain`` (a fraction) for ``patience`` consecutive evaluations; None if never. Evaluations below ``floor``
    neither count nor start a streak, so a run still near chance is not "converged"."""
    streak = 0
    for k in range(1, len(accuracies)):
        if accuracies[k] < floor:
            streak = 0
            continue
        streak = streak + 1 if accuracies[k] - accuracies[k - 1] < min_gain else 0
        if streak >= patience:
            return k
    return None


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
        """The last global test accuracy (the final evaluation of a run that did not end on one)."""
        final = self.meta.get("final_evaluation")
        if final is not None:
            return final["accuracy"]
        ev = self.evaluated
        return ev[-1].accuracy if ev else None

    @property
    def final_local_accuracy(self) -> float | None:
        """The last local-protocol accuracy (None without a local split)."""
        return self.final_local("local_accuracy")

    @property
    def final_local_sampled_accuracy(self) -> float | None:
        """The last local-protocol accuracy over the round's participants (None without a local split)."""
        return self.final_local("local_sampled_accuracy")

    def final_local(self, name: str) -> float | None:
        """The last value of the record field ``name`` (the final evaluation's where the run did not end on one)."""
        final = self.meta.get("final_evaluation")
        if final is not None:
            return final.get(name)
        ev = self.evaluated
        return getattr(ev[-1], name) if ev else None

    def converged_round(self, min_gain: float = 0.02, patience: int = 5, floor: float | None = None) -> int | None:
        """The paper's criterion (docs/model.md §6.1, :func:`first_converged`) on the test accuracy: the first
        evaluated round after which the increase stays below ``min_gain`` for ``patience`` consecutive evaluations;
        None if never. ``floor`` default: twice chance, 2/M for the run's M classes in ``meta["num_classes"]`` (0
        when unknown)."""
        if floor is None:
            classes = self.meta.get("num_classes")
            floor = chance_floor(classes if isinstance(classes, int) and 0 < classes <= MAX_NUM_CLASSES else None)
        ev = self.evaluated
        k = first_converged([float(r.accuracy or 0.0) for r in ev], floor, min_gain, patience)   # evaluated: never None
        return None if k is None else ev[k].round

    def time_to_accuracy(self, target: float) -> float | None:
        """Simulated seconds at which test accuracy first reaches ``target`` (None if never)."""
        for r in self.evaluated:
            if r.accuracy is not None and r.accuracy >= target:
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
            out["to_target"] = self.to_target(target)
        return out

    def to_target(self, target: float) -> dict[str, Any]:
        """When the test accuracy first reached ``target``: ``rounds`` and simulated ``seconds``, interpolated between
        evaluations (:func:`adaptplan.crossing.first_crossing`; ``upper_bound`` where the first evaluation had it;
        None where never); with a calibrated plan (``meta["calibration"]`` for this target) also what the first
        plan predicted, eq. (15)'s ⌈R⌉ and eq. (26)'s seconds, and measured/predicted."""
        found = first_crossing([(float(r.accuracy), float(r.round), r.sim_seconds) for r in self.evaluated
                                if r.accuracy is not None], target)
        out: dict[str, Any] = {"rounds": None if found is None else found.at[0],
                               "seconds": None if found is None else found.at[1],
                               "upper_bound": bool(found and found.upper_bound)}
        calibration = self.meta.get("calibration")
        plan = next((e.get("plan") for e in self.events if e.get("event") == "plan"), None)
        if isinstance(calibration, dict) and calibration.get("target_accuracy") == target and plan:
            out["predicted_rounds"], out["predicted_seconds"] = plan["rounds"], plan["total_latency_s"]
            out["measured_over_predicted"] = (None if found is None or not plan["total_latency_s"]
                                              else found.at[1] / plan["total_latency_s"])
        return out

    def stage_comparison(self) -> list[dict[str, Any]]:
        """Per stage, over the rounds of a torch.distributed run that recorded both: the mean predicted
        seconds (latency model, ``stage_seconds``), the mean measured seconds, their ratio
        (measured/predicted; None when nothing was predicted) and the number of rounds. The last row,
        ``round``, compares the whole round (``round_sim_seconds`` vs ``measured_round_seconds``)."""
        from trainers.engine.clock import STAGES

        rows = []
        measured = [r for r in self.records if r.measured_stage_seconds]
        pairs = {s: [(r.stage_seconds[s], r.measured_stage_seconds[s]) for r in measured
                     if s in r.stage_seconds and s in r.measured_stage_seconds] for s in STAGES}
        pairs["round"] = [(r.round_sim_seconds, r.measured_round_seconds) for r in measured
                          if r.measured_round_seconds is not None]
        for stage, values in pairs.items():
            if not values:
                continue
            predicted = sum(p for p, _ in values) / len(values)
            actual = sum(m for _, m in values) / len(values)
            rows.append({"stage": stage, "predicted_s": predicted, "measured_s": actual,
                         "ratio": actual / predicted if predicted > 0 else None, "rounds": len(values)})
        return rows

    def to_json(self) -> dict[str, Any]:
        return {"meta": self.meta, "events": self.events, "summary": self.summary(self.meta.get("target_accuracy")),
                "records": [r.to_json() for r in self.records]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "History":
        """Rebuild a history; a malformed one raises InputError naming the offending field
        (``history.records[3].sim_seconds: must be ≥ 0 s, got -1``)."""
        check_keys(data, ("records",), ("meta", "events", "summary"), "history")
        if not isinstance(data["records"], list):
            raise InputError(f"must be a list of per-round records, got {show(data['records'])}", field="history.records")
        meta = _meta_from_json(data.get("meta", {}))
        events = data.get("events", [])
        if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
            raise InputError(f"must be a list of objects, got {show(events)}", field="history.events")
        for k, event in enumerate(events):
            _check_event(event, f"history.events[{k}]")
        mapping_value(data.get("summary", {}), "history.summary")
        records = [_record_from_json(r, f"history.records[{k}]") for k, r in enumerate(data["records"])]
        return cls(records, meta, list(events))

    def save(self, folder: str | os.PathLike) -> None:
        """Write ``history.json`` (:func:`history_text`) and ``history.csv`` into ``folder``, each atomically (fsync
        + rename). The run folder writes both before every checkpoint, so both are built in time linear in the
        rounds with small constants (a 20,000-round history in about 3 s rather than 19 s)."""
        folder = Path(folder)
        data = self.to_json()
        save_text(history_text(data), folder / "history.json")
        text = io.StringIO(newline="")
        writer = csv.writer(text)
        writer.writerow(RECORD_FIELDS)
        for row in data["records"]:      # this save's own copies, written to history.json already: reused as rows
            row["cuts"] = " ".join(map(str, row["cuts"]))
            row["participants"] = " ".join(map(str, row["participants"]))
            for name in ("stage_seconds", "metrics", "measured_stage_seconds"):
                row[name] = _SORTED_JSON(row[name])
            writer.writerow([row[n] for n in RECORD_FIELDS])
        encoded = text.getvalue().encode("utf-8")
        atomic_write(folder / "history.csv", lambda fh: fh.write(encoded))

    @classmethod
    def load(cls, path: str | os.PathLike) -> "History":
        p = Path(path)
        if p.is_dir():
            p = p / "history.json"
        return load_file(p, "history", cls.from_json)


_SORTED_JSON = json.JSONEncoder(sort_keys=True).encode      # json.dumps(value, sort_keys=True), one encoder for all
_ONE_LINE_JSON = json.JSONEncoder().encode                  # json.dumps(value): the C encoder (no indent)


def history_text(data: dict[str, Any]) -> str:
    """``history.json``'s text: the object indented by two spaces as :func:`adaptplan.fileio.save_json` writes it,
    except that each of ``data["records"]`` (the last key) is one line — readable, ``grep``-able, and three times
    quicker to write than indenting every field of every round (the indenting encoder is pure Python)."""
    head = {k: v for k, v in data.items() if k != "records"}
    text = json.dumps(head, indent=2)
    records = data.get("records", [])
    lines = ",\n".join("    " + _ONE_LINE_JSON(r) for r in records)
    body = f'"records": [\n{lines}\n  ]' if records else '"records": []'
    return (text[:-2] + ",\n  " if head else "{\n  ") + body + "\n}\n"


EVENT_KINDS = ("plan", "replan", "replan-infeasible", "model")
PLAN_SOURCES = ("cuts", "plan", "planner", "default", "policy", "whole-model")


def _check_event(event: dict[str, Any], field: str) -> None:
    """A plan event as the run writes it (docs/formats.md "history.json"): its kind and round, and where present its
    source and plans (cuts, interval; the plan's predicted rounds and seconds, which a calibrated run's summary divides
    by), or a change of model's stage and blocks; the other keys (solver details, constants, reasons) are kept as
    they are."""
    kind = event.get("event")
    if kind not in EVENT_KINDS:
        raise InputError(f"must be one of {', '.join(EVENT_KINDS)}, got {show(kind)}", field=f"{field}.event")
    int_in_range(event.get("round"), f"{field}.round", 0, MAX_ROUNDS)
    if "source" in event and event["source"] not in PLAN_SOURCES:
        raise InputError(f"must be one of {', '.join(PLAN_SOURCES)}, got {show(event['source'])}", field=f"{field}.source")
    for key in ("cuts", "old_cuts"):
        if key in event:
            _cuts(event[key], f"{field}.{key}")
    for key in ("interval", "old_interval", "stage", "num_blocks"):
        if key in event:
            positive_int(event[key], f"{field}.{key}", MAX_ROUNDS)
    if "block_names" in event and (not isinstance(event["block_names"], list)
                                   or not all(isinstance(n, str) for n in event["block_names"])):
        raise InputError(f"must be a list of block names, got {show(event['block_names'])}", field=f"{field}.block_names")
    if "plan" in event:
        plan = mapping_value(event["plan"], f"{field}.plan")
        for key in ("rounds", "total_latency_s"):
            if key in plan:
                non_negative_number(plan[key], f"{field}.plan.{key}")


def _number(value: Any, field: str) -> float:
    """A loss: a number; NaN/inf are kept (a diverged run records them), booleans and text are not."""
    if isinstance(value, float):
        return value
    return finite_number(value, field)   # an integer within the number limits, or a named error


def _flag(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise InputError(f"must be true or false, got {show(value)}", field=field)
    return value


def _cuts(value: Any, field: str) -> list[int]:
    if not isinstance(value, list) or len(value) > MAX_DEVICES:
        raise InputError(f"must be a list of at most {MAX_DEVICES:,} cut indices, got {show(value)}", field=field)
    return [positive_int(c, f"{field}[{i}]", MAX_CUT_POINTS) for i, c in enumerate(value)]


def _optional(check: Callable[[Any, str], Any]) -> Callable[[Any, str], Any]:
    return lambda value, field: None if value is None else check(value, field)


def _fraction(value: Any, field: str) -> float:
    return number_in_range(value, field, 0.0, 1.0)


def _seconds(value: Any, field: str) -> float:
    return non_negative_number(value, field, "s")


def _bytes(value: Any, field: str) -> int:
    return int_in_range(value, field, 0, MAX_BYTES, "bytes")


# the check of every RoundRecord field (a history file's ``records[k]``)
_RECORD_CHECKS: dict[str, Callable[[Any, str], Any]] = {
    "round": lambda v, f: positive_int(v, f, MAX_STEPS), "train_loss": _number,
    "accuracy": _optional(_fraction), "test_loss": _optional(_number),
    "sim_seconds": _seconds, "round_sim_seconds": _seconds, "wall_seconds": _seconds,
    "bytes_up": _bytes, "bytes_down": _bytes, "bytes_server": _bytes,
    "aggregated": _flag, "replanned": _flag, "cuts": _cuts, "interval": lambda v, f: positive_int(v, f, MAX_ROUNDS),
}


def _participants(value: Any, field: str) -> list[int]:
    if not isinstance(value, list) or len(value) > MAX_DEVICES:
        raise InputError(f"must be a list of at most {MAX_DEVICES:,} device indices, got {show(value)}", field=field)
    return [int_in_range(i, f"{field}[{k}]", 0, MAX_DEVICES - 1) for k, i in enumerate(value)]


def _numbers_by_name(check: Callable[[Any, str], Any]) -> Callable[[Any, str], dict[str, Any]]:
    """An object of name → value, each value checked by ``check``."""
    return lambda value, field: {k: check(v, f"{field}.{k}") for k, v in mapping_value(value, field).items()}


# the optional RoundRecord fields (absent in histories written before Engine v2)
_OPTIONAL_RECORD_CHECKS: dict[str, Callable[[Any, str], Any]] = {
    "participants": _participants, "stage_seconds": _numbers_by_name(_seconds), "metrics": _numbers_by_name(_number),
    "measured_stage_seconds": _numbers_by_name(_seconds), "measured_round_seconds": _optional(_seconds),
    "local_accuracy": _optional(_fraction),
    "local_sampled_accuracy": _optional(_fraction),
}
assert set(_OPTIONAL_RECORD_CHECKS) == set(OPTIONAL_RECORD_FIELDS)


def _record_from_json(entry: Any, where: str) -> RoundRecord:
    check_keys(entry, _RECORD_CHECKS, _OPTIONAL_RECORD_CHECKS, where)
    checks = {**_RECORD_CHECKS, **{k: c for k, c in _OPTIONAL_RECORD_CHECKS.items() if k in entry}}
    return RoundRecord(**{name: check(entry[name], f"{where}.{name}") for name, check in checks.items()})


def _meta_from_json(value: Any) -> dict[str, Any]:
    """A history's ``meta``: an object; the parts that are read back (``config``, ``config.algorithm``,
    ``final_evaluation.accuracy``, ``target_accuracy``) must have their types."""
    meta = dict(mapping_value(value, "history.meta"))
    if "config" in meta:
        config = mapping_value(meta["config"], "history.meta.config")
        if config.get("algorithm") is not None:
            text_value(config["algorithm"], "history.meta.config.algorithm", 100)
    if meta.get("final_evaluation") is not None:
        final = mapping_value(meta["final_evaluation"], "history.meta.final_evaluation")
        _optional(_fraction)(final.get("accuracy"), "history.meta.final_evaluation.accuracy")
        for name in ("local_accuracy", "local_sampled_accuracy"):
            _optional(_fraction)(final.get(name), f"history.meta.final_evaluation.{name}")
    _optional(_fraction)(meta.get("target_accuracy"), "history.meta.target_accuracy")
    return meta
