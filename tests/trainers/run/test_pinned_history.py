"""history.json's event names pinned literally against the docs (trainers/run/history.py reads them back on
``--resume`` and ``adaptplan plot``): every plan ``source`` docs/formats.md names — ``cuts``, ``plan``,
``planner``, ``default``, ``policy``, ``whole-model`` — and every event kind docs/usage.md names — ``plan``,
``replan``, ``replan-infeasible`` — is read back; a name spelled otherwise is refused naming the field. The names
are written out here as the docs write them (and found in the docs' text), not taken from the reader's table."""

from __future__ import annotations

from pathlib import Path

import pytest

from adaptplan.errors import InputError
from trainers.run.history import History

ROOT = Path(__file__).resolve().parents[3]
FORMATS = (ROOT / "docs/formats.md").read_text(encoding="utf-8")
USAGE = (ROOT / "docs" / "usage.md").read_text(encoding="utf-8")
SOURCES = ("cuts", "plan", "planner", "default", "policy", "whole-model")
KINDS = ("plan", "replan", "replan-infeasible")
RECORD = {"round": 1, "train_loss": 2.30, "accuracy": 0.11, "test_loss": 2.29, "sim_seconds": 1.71,
          "round_sim_seconds": 1.71, "wall_seconds": 0.4, "bytes_up": 1048576, "bytes_down": 1048576,
          "bytes_server": 0, "aggregated": True, "replanned": False, "cuts": [4, 4], "interval": 1}
"""docs/formats.md's example record (two devices)."""


def history(events: list[dict]) -> dict:
    return {"meta": {}, "events": events, "records": [RECORD]}


def test_the_documented_sources_are_the_docs_words() -> None:
    sentence = FORMATS.split('says where the plan came from', 1)[1].split("\n\n", 1)[0]
    for source in SOURCES:
        assert f"`{source}`" in sentence, source
    assert "`event` (plan, replan, replan-infeasible)" in USAGE


@pytest.mark.parametrize("source", SOURCES)
def test_a_plan_event_of_every_documented_source_is_read_back(source: str) -> None:
    loaded = History.from_json(history([{"event": "plan", "round": 0, "source": source, "cuts": [4, 4],
                                         "interval": 1}]))
    assert loaded.events[0]["source"] == source and loaded.records[0].cuts == [4, 4]


@pytest.mark.parametrize("kind", KINDS)
def test_every_documented_event_kind_is_read_back(kind: str) -> None:
    assert History.from_json(history([{"event": kind, "round": 3}])).events[0]["event"] == kind


@pytest.mark.parametrize("field, event", [
    ("history.events[0].source", {"event": "plan", "round": 0, "source": "whole_model"}),
    ("history.events[0].source", {"event": "plan", "round": 0, "source": "Planner"}),
    ("history.events[0].event", {"event": "re-plan", "round": 3}),
    ("history.events[0].event", {"event": "replan_infeasible", "round": 3}),
])
def test_a_name_spelled_otherwise_is_refused_naming_the_field(field: str, event: dict) -> None:
    with pytest.raises(InputError) as caught:
        History.from_json(history([event]))
    assert caught.value.field == field


def test_the_documented_example_record_round_trips(tmp_path) -> None:
    loaded = History.from_json(history([]))
    loaded.save(tmp_path)
    again = History.load(tmp_path)
    record = again.to_json()["records"][0]
    assert {k: record[k] for k in RECORD} == RECORD
    header = (tmp_path / "history.csv").read_text().splitlines()[0].split(",")
    assert set(RECORD) <= set(header)                          # "history.csv holds the same per-round columns"
