"""``train --mlflow`` (issue 37 item 1; trainers/run/tracking.py ``MlflowLog``): the run's parameters, every round's
history fields as metrics, the final evaluation and the run folder's files as artifacts, read back with MLflow's
own client — from the local store in the run folder and from a real ``mlflow server`` started here; a resumed run
logs on into its MLflow run; wrong values and an unreachable server are one line naming the flag."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import warnings
from pathlib import Path

import pytest

from adaptplan.cli import main

pytest.importorskip("mlflow")

TINY = ["train", "--algorithm", "adaptsfl", "--dataset", "synthetic", "--model", "mlp", "--devices", "3", "--cuts", "2",
        "--interval", "2", "--eval-every", "2", "--no-progress", "--threads", "1"]


def client(uri: str):
    from mlflow.tracking import MlflowClient

    warnings.simplefilter("ignore")
    return MlflowClient(tracking_uri=uri)


def logged_run(out: Path):
    """The MLflow client and run the run folder ``out`` names (its mlflow-run.txt)."""
    from trainers.run.tracking import mlflow_store

    uri, run_id = (out / "mlflow-run.txt").read_text().split()
    tracking = client(mlflow_store(uri, out)[0])
    return tracking, tracking.get_run(run_id)


def check_against_history(out: Path, rounds: int, first_rounds: int | None = None) -> None:
    """Every parameter equals the run's configuration (``first_rounds``: a resumed run's parameters are the first
    run's, its new value a tag); every tag of every round equals history.json's field."""
    from trainers.run.history import RoundRecord
    from trainers.run.tracking import record_tags

    tracking, run = logged_run(out)
    assert run.info.status == "FINISHED" and run.info.run_name == out.name
    doc = json.loads((out / "history.json").read_text())
    config = doc["meta"]["config"]
    params = run.data.params
    assert params["algorithm"] == "adaptsfl" and json.loads(params["lr"]) == config["lr"]
    assert json.loads(params["devices"]) == 3 and json.loads(params["rounds"]) == (first_rounds or rounds)
    if first_rounds is not None:
        assert json.loads(run.data.tags["resumed.rounds"]) == rounds
        assert json.loads(run.data.tags["resumed.resume"]) is True
    assert set(params) == {k for k in config if k != "extra"} | {f"extra.{k}" for k in config["extra"]}
    expected: dict[str, list[tuple[int, float]]] = {}
    for raw in doc["records"]:
        record = RoundRecord(**raw)
        for tag, value in record_tags(record).items():
            expected.setdefault(tag, []).append((record.round, value))
    assert {"accuracy/global", "loss/train", "time/sim_seconds", "bytes/up", "plan/interval"} <= set(expected)
    for tag, values in expected.items():
        got = sorted((m.step, m.value) for m in tracking.get_metric_history(run.info.run_id, tag))
        assert [s for s, _ in got] == [s for s, _ in values], tag
        assert all(abs(a - b) <= 1e-9 * max(1.0, abs(b)) for (_, a), (_, b) in zip(got, values)), tag
    assert len(expected["loss/train"]) == rounds
    names = {a.path for a in tracking.list_artifacts(run.info.run_id)}
    assert {"history.json", "history.csv", "config.toml", "accuracy.png"} <= names


def test_the_local_store_holds_every_parameter_and_every_rounds_fields(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    assert main([*TINY, "--rounds", "4", "--out", str(out), "--mlflow", "local", "--participation", "0.5"]) == 0
    assert capsys.readouterr().err.count(f"MLflow: creating {out / 'mlflow.db'} (MLflow builds its database") == 1
    assert (out / "mlflow-run.txt").read_text().split()[0] == "local"   # no absolute path: the folder may move
    assert (out / "mlflow.db").is_file()
    check_against_history(out, 4)
    assert json.loads(logged_run(out)[1].data.params["extra.participation"]) == 0.5     # an algorithm's own option


def test_a_resumed_run_logs_on_into_its_mlflow_run(tmp_path) -> None:
    out = tmp_path / "run"
    assert main([*TINY, "--rounds", "6", "--checkpoint-every", "2", "--out", str(out), "--mlflow", "local"]) == 0
    _, whole = logged_run(out)
    whole_losses = [m.value for m in sorted(logged_run(out)[0].get_metric_history(whole.info.run_id, "loss/train"),
                                            key=lambda m: m.step)]
    part = tmp_path / "part"
    assert main([*TINY, "--rounds", "4", "--checkpoint-every", "2", "--out", str(part), "--mlflow", "local"]) == 0
    first_id = logged_run(part)[1].info.run_id
    assert main(["train", "--out", str(part), "--resume", "--rounds", "6", "--no-progress"]) == 0
    tracking, run = logged_run(part)
    assert run.info.run_id == first_id                                   # the same MLflow run, logged on
    steps = sorted(tracking.get_metric_history(run.info.run_id, "loss/train"), key=lambda m: m.step)
    assert [m.step for m in steps] == [1, 2, 3, 4, 5, 6]
    assert [m.value for m in steps] == pytest.approx(whole_losses, rel=1e-9)
    check_against_history(part, 6, first_rounds=4)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real tracking server (``mlflow server``, SQLite backend, artifacts proxied) on a free loopback port."""
    executable = shutil.which("mlflow", path=str(Path(sys.executable).parent)) or shutil.which("mlflow")
    if executable is None:
        pytest.skip("the mlflow command is not installed")
    folder = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    proc = subprocess.Popen([executable, "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                             "--backend-store-uri", f"sqlite:///{folder / 'db.sqlite'}",
                             "--artifacts-destination", str(folder / "artifacts")],
                            cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as reply:
                if reply.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"mlflow server did not start: {proc.stderr.read()[-2000:] if proc.stderr else ''}")
        time.sleep(0.3)
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_a_real_tracking_server_gets_the_same_run(tmp_path, mlflow_server) -> None:
    out = tmp_path / "served"
    assert main([*TINY, "--rounds", "4", "--out", str(out), "--mlflow", mlflow_server]) == 0
    assert (out / "mlflow-run.txt").read_text().split()[0] == mlflow_server
    check_against_history(out, 4)
    assert not (out / "mlflow.db").exists()


def test_wrong_values_and_an_unreachable_server_are_one_line_naming_the_flag(tmp_path, capsys) -> None:
    for value, message in (("mlruns", "'mlruns' is not an MLflow tracking URI: 'local' (a store in the run folder)"),
                           ("ftp://x", "'ftp://x' is not an MLflow tracking URI"),
                           ("local", "'local' is a store in the run folder: give --out too")):
        assert main([*TINY, "--rounds", "1", "--mlflow", value]) == 2
        assert f"--mlflow: {message}" in capsys.readouterr().err
    port = free_port()                                                   # nothing listens there
    out = tmp_path / "unreachable"
    started = time.monotonic()
    assert main([*TINY, "--rounds", "1", "--out", str(out), "--mlflow", f"http://127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err
    assert f"--mlflow: MLflow at 'http://127.0.0.1:{port}' cannot be used" in err and "Traceback" not in err
    assert time.monotonic() - started < 60
    assert not (out / "history.json").exists()                           # nothing trained
