"""Experiment tracking (issue 37 item 1; trainers/run/tracking.py): a run with a folder writes TensorBoard event
files in RUN/tensorboard with every field of its history per round, read back here with TensorBoard's own
reader and compared with history.json."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from adaptplan.cli import main

pytest.importorskip("tensorboard")


ROOT = Path(__file__).resolve().parents[3]


def documented_tags() -> set[str]:
    """The tags docs/formats.md "Tracking" names (``<stage>``, ``<name>`` standing for any one word)."""
    section = (ROOT / "docs/formats.md").read_text(encoding="utf-8").split("## Tracking", 1)[1].split("**MLflow**")[0]
    return set(re.findall(r"`([a-z_]+/[a-z_<>]+)`", section))


def matches(tag: str, documented: set[str]) -> bool:
    return any(re.fullmatch(re.sub(r"<[a-z]+>", "[^/]+", re.escape(d)), tag) for d in documented)


def events(folder: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(folder / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0,
                                                                               "histograms": 0})
    accumulator.Reload()
    return accumulator


def test_every_history_field_of_every_round_is_in_the_event_file(tmp_path) -> None:
    """AdaptSFL re-planning every 2 rounds (an aggregation every round): each record field has its tag, each tag
    one value per round where the field has one, equal to history.json's; the re-planning rounds have a text
    event naming the plan; the configuration is there."""
    from trainers.run.history import RoundRecord
    from trainers.run.tracking import GROUPS, SCALARS

    out = tmp_path / "run"
    assert main(["train", "--algorithm", "adaptsfl", "--dataset", "synthetic", "--model", "mlp", "--devices", "3",
                 "--rounds", "4", "--eval-every", "2", "--policy", "adaptsfl", "--replan-every", "2", "--interval",
                 "1", "--out", str(out), "--no-progress"]) == 0
    history = json.loads((out / "history.json").read_text())["records"]
    found = events(out)
    tags = set(found.Tags()["scalars"])
    logged = {f.name for f in dataclasses.fields(RoundRecord)} - {"round"}
    assert logged == set(SCALARS) | set(GROUPS) | {"cuts", "participants"}      # every field has its tag(s)
    for field, tag in SCALARS.items():
        rounds = [(r["round"], float(r[field])) for r in history if r.get(field) is not None]
        if field == "measured_round_seconds":                                    # a distributed run's only
            assert not rounds and tag not in tags
            continue
        got = [(e.step, e.value) for e in found.Scalars(tag)]
        assert [s for s, _ in got] == [s for s, _ in rounds], tag
        assert all(v == pytest.approx(w, rel=1e-6) for (_, v), (_, w) in zip(got, rounds)), tag
    assert [e.step for e in found.Scalars("accuracy/local")] == [2, 4]          # both protocols, on evaluation rounds
    assert [e.value for e in found.Scalars("plan/replanned")] == [0.0, 1.0, 0.0, 1.0]
    for stage, value in history[0]["stage_seconds"].items():
        assert found.Scalars(f"stage_seconds/{stage}")[0].value == pytest.approx(value, rel=1e-6)
    assert [e.value for e in found.Scalars("plan/cut_mean")] == [1.0] * 4
    assert [e.value for e in found.Scalars("participants/count")] == [3.0] * 4
    assert [h.step for h in found.Histograms("plan/cuts")] == [1, 2, 3, 4]
    texts = {tag: [(e.step, e.tensor_proto.string_val[0].decode()) for e in found.Tensors(tag)]
             for tag in found.Tags()["tensors"]}
    assert [s for s, _ in texts["plan/events/text_summary"]] == [2, 4]
    assert "re-planned, cuts [1, 1, 1], interval 1" in texts["plan/events/text_summary"][0][1]
    assert '"algorithm": "adaptsfl"' in texts["config/text_summary"][0][1]
    # the names are docs/formats.md's, literally: every tag written is documented, every documented one written
    # (but a distributed run's measured seconds)
    documented = documented_tags()
    assert len(documented) == 22, sorted(documented)
    assert all(matches(tag, documented) for tag in tags), sorted(t for t in tags if not matches(t, documented))
    literal = {t for t in documented if "<" not in t} - {"time/measured_round_seconds", "plan/cuts", "plan/events"}
    assert literal <= tags, literal - tags
    assert any(matches(t, {"stage_seconds/<stage>"}) for t in tags) and any(t.startswith("metrics/") for t in tags) \
        or not history[0]["metrics"]
    assert "plan/cuts" in found.Tags()["histograms"] and "plan/events/text_summary" in found.Tags()["tensors"]


def test_the_cut_tag_is_the_mean_of_unequal_cuts_and_participants_a_count() -> None:
    """docs/formats.md: ``plan/cut_mean`` the mean cut in force, ``participants/count`` how many trained."""
    from trainers.run.history import RoundRecord
    from trainers.run.tracking import record_tags

    record = RoundRecord(3, 1.5, None, None, 2.0, 0.5, 9.0, 10, 20, 0, False, True, [1, 2, 4, 4], 2,
                         participants=[0, 3], stage_seconds={"server": 0.25}, metrics={"aligned": 3, "note": "x"})
    tags = record_tags(record)
    assert tags["plan/cut_mean"] == 11 / 4 and tags["participants/count"] == 2.0
    assert (tags["loss/train"], tags["time/sim_seconds"], tags["time/round_sim_seconds"], tags["time/wall_seconds"]) \
        == (1.5, 2.0, 0.5, 9.0)
    assert (tags["bytes/up"], tags["bytes/down"], tags["bytes/server"]) == (10.0, 20.0, 0.0)
    assert (tags["plan/interval"], tags["plan/aggregated"], tags["plan/replanned"]) == (2.0, 0.0, 1.0)
    assert tags["stage_seconds/server"] == 0.25 and tags["metrics/aligned"] == 3.0 and "metrics/note" not in tags
    assert not {"accuracy/global", "loss/test", "accuracy/local", "time/measured_round_seconds"} & set(tags)
    assert all(matches(tag, documented_tags()) for tag in tags)


def test_a_resumed_run_logs_its_new_rounds_after_the_checkpoints(tmp_path) -> None:
    out = tmp_path / "run"
    argv = ["train", "--algorithm", "psl", "--dataset", "synthetic", "--model", "mlp", "--devices", "3", "--cuts", "2",
            "--eval-every", "1", "--checkpoint-every", "2", "--out", str(out), "--no-progress"]
    assert main([*argv, "--rounds", "2"]) == 0
    assert main(["train", "--out", str(out), "--resume", "--rounds", "4", "--no-progress"]) == 0
    logged = sorted((e.step, e.value) for e in events(out).Scalars("loss/train"))    # files in either order
    assert [s for s, _ in logged] == [1, 2, 3, 4] and len(list((out / "tensorboard").iterdir())) == 2   # one per run
    losses = [r["train_loss"] for r in json.loads((out / "history.json").read_text())["records"]]
    assert [v for _, v in logged] == pytest.approx(losses, rel=1e-6)


def test_a_field_added_to_the_record_is_logged_under_record(tmp_path) -> None:
    """A record field the tracker does not name is logged as record/<field>, never dropped."""
    from trainers.run.tracking import record_tags

    @dataclasses.dataclass
    class Later:
        round: int
        train_loss: float
        new_figure: float
        nothing: float | None = None

    assert record_tags(Later(3, 0.5, 7.0)) == {"loss/train": 0.5, "record/new_figure": 7.0}
