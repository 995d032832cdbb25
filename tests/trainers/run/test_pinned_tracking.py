"""Tracking names pinned literally against docs/formats.md "Tracking" (trainers/run/tracking.py), each name written
out here as the docs write it (and found in the docs' text), never read from the tracker's own tables: a distributed
run's ``time/measured_round_seconds`` and ``measured_stage_seconds/<stage>``, MLflow's ``final/<field>``,
``resumed.<key>``, ``extra.<option>``, the run folder's artifacts and store names; and a record of no cuts (an empty
plan list) logs no mean cut instead of failing. MLflow's client is replaced by a recorder (no store, no server)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from trainers.run.history import RoundRecord
from trainers.run.tracking import MlflowLog, mlflow_store, record_tags

ROOT = Path(__file__).resolve().parents[3]
TRACKING_DOC = (ROOT / "docs/formats.md").read_text(encoding="utf-8").split("## Tracking", 1)[1].split("\n## ")[0]


def documented(name: str) -> str:
    """``name`` after checking that docs/formats.md's "Tracking" section writes it (in backticks)."""
    assert f"`{name}`" in TRACKING_DOC, name
    return name


def record(**changes: Any) -> RoundRecord:
    base = dict(round=3, train_loss=1.5, accuracy=None, test_loss=None, sim_seconds=2.0, round_sim_seconds=0.5,
                wall_seconds=9.0, bytes_up=10, bytes_down=20, bytes_server=0, aggregated=False, replanned=False,
                cuts=[1, 2], interval=2)
    return RoundRecord(**{**base, **changes})


def test_a_distributed_rounds_measured_seconds_have_the_documented_tags() -> None:
    tags = record_tags(record(measured_round_seconds=3.5, measured_stage_seconds={"uplink": 0.25, "device FP": 0.75},
                              stage_seconds={"uplink": 0.125}))
    assert tags[documented("time/measured_round_seconds")] == 3.5
    prefix = documented("measured_stage_seconds/<stage>").split("/")[0]
    assert tags[f"{prefix}/uplink"] == 0.25 and tags[f"{prefix}/device FP"] == 0.75
    assert tags[documented("stage_seconds/<stage>").split("/")[0] + "/uplink"] == 0.125
    assert not any(t.startswith(("time/measured_seconds", "measured/", "record/")) for t in tags)


def test_a_record_of_no_cuts_logs_no_mean_cut() -> None:
    tags = record_tags(record(cuts=[], participants=[]))
    assert documented("plan/cut_mean") not in tags
    assert tags[documented("participants/count")] == 0.0
    assert tags[documented("plan/interval")] == 2.0


class Recorder:
    """MlflowClient's calls that MlflowLog makes, recorded."""

    def __init__(self, params: dict[str, str] | None = None) -> None:
        self.metrics: list[Any] = []
        self.tags: list[Any] = []
        self.params: list[Any] = []
        self.artifacts: list[str] = []
        self.texts: dict[str, str] = {}
        self.status: str | None = None
        self.logged = params or {}

    def log_batch(self, run_id: str, metrics=(), params=(), tags=()) -> None:
        self.metrics += list(metrics)
        self.params += list(params)
        self.tags += list(tags)

    def log_text(self, run_id: str, text: str, name: str) -> None:
        self.texts[name] = text

    def log_artifact(self, run_id: str, path: str) -> None:
        self.artifacts.append(Path(path).name)

    def set_terminated(self, run_id: str, status: str) -> None:
        self.status = status

    def get_run(self, run_id: str) -> Any:
        return SimpleNamespace(data=SimpleNamespace(params=self.logged))


def mlflow_log(client: Recorder, out: Path | None = None) -> MlflowLog:
    pytest.importorskip("mlflow")
    log = object.__new__(MlflowLog)
    log.client, log.run_id, log.events, log.out, log._warned = client, "run", [], out, False
    return log


def test_the_final_evaluation_is_logged_as_final_field_at_its_round() -> None:
    client = Recorder()
    mlflow_log(client).close("FINISHED", {"round": 7, "accuracy": 0.5, "test_loss": 1.25, "local_accuracy": 0.4})
    names = [documented("final/accuracy"), documented("final/test_loss"), documented("final/local_accuracy")]
    assert {m.key: (m.value, m.step) for m in client.metrics} == {names[0]: (0.5, 7), names[1]: (1.25, 7),
                                                                  names[2]: (0.4, 7)}
    assert client.status == "FINISHED"


def test_an_option_given_anew_on_resume_is_the_tag_resumed_key() -> None:
    client = Recorder(params={"rounds": "4", "lr": "0.05", "algorithm": "psl"})
    mlflow_log(client)._tag_changed_options({"rounds": 6, "lr": 0.05, "algorithm": "psl",
                                             "extra": {"participation": 0.5}})
    assert "`resumed.<key>`" in TRACKING_DOC and "`extra.<option>`" in TRACKING_DOC
    assert {t.key: t.value for t in client.tags} == {"resumed.rounds": "6", "resumed.extra.participation": "0.5"}


def test_parameters_are_flat_keys_text_or_json_and_extra_option() -> None:
    values = MlflowLog._param_values({"algorithm": "gas", "devices": 3, "cuts": [1, 2], "plan_path": None,
                                      "extra": {"k_min": 0.34}})
    assert values == {"algorithm": "gas", "devices": "3", "cuts": json.dumps([1, 2]), "plan_path": "null",
                      "extra.k_min": "0.34"}


def test_the_run_folders_artifacts_are_the_documented_four_files(tmp_path) -> None:
    """docs: "when the run ends, `history.json`, `history.csv`, `config.toml` and `accuracy.png` are its artifacts"
    (not the checkpoint); re-planning events are the text artifact `plan_events.txt`."""
    artifacts = ["history.json", "history.csv", "config.toml", "accuracy.png"]
    for name in [*artifacts, "checkpoint.pt"]:
        (tmp_path / name).write_bytes(b"x")
    client = Recorder()
    log = mlflow_log(client, tmp_path)
    log.events.append("round 2: re-planned, cuts [1, 1], interval 1")
    log.close("KILLED")
    assert sorted(client.artifacts) == sorted(documented(a) for a in artifacts)
    assert client.texts == {documented("plan_events.txt"): "round 2: re-planned, cuts [1, 1], interval 1\n"}
    assert client.status == "KILLED"


def test_local_is_the_sqlite_file_and_artifact_folder_of_the_run_folder(tmp_path) -> None:
    uri, artifacts = mlflow_store("local", tmp_path)
    assert uri == f"sqlite:///{(tmp_path / documented('RUN/mlflow.db').split('/')[1]).resolve()}"
    assert artifacts == (tmp_path / documented("RUN/mlartifacts/").split("/")[1]).resolve().as_uri()
    assert mlflow_store("http://host:5000", tmp_path) == ("http://host:5000", None)
