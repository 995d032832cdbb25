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
import sys
from pathlib import Path
from typing import Any, Protocol, Sequence

from trainers.config.train_config import MLFLOW_LOCAL
from trainers.run.checkpoint import CHECKPOINT_NAME
from trainers.run.folder import RUN_FILES
from trainers.run.folder import TRACKING_FOLDER as FOLDER  # the event files' folder in a run folder

SCALARS = {"accuracy": "accuracy/global", "local_accuracy": "accuracy/local",
           "local_sampled_accuracy": "accuracy/local_sampled", "train_loss": "loss/train",
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


class RoundObserver(Protocol):
    """What watches a run round by round: :class:`TensorBoardLog`, :class:`MlflowLog`, and whatever a caller adds to
    :attr:`Trainer.observers <trainers.run.driver.Trainer>` (``train --leakage-every``). ``log`` gets each round's
    record after it joins the history (before the round's checkpoint, so what it writes to ``history.meta`` is saved
    with it); ``close`` the run's end: ``status`` FINISHED, KILLED (stopped, resumable) or FAILED, and the final
    evaluation when the run did not end on an evaluation round."""

    def log(self, record: Any) -> None: ...

    def close(self, status: str, final: dict[str, Any] | None) -> None: ...


def tracking_logs(config: Any, out: str | None) -> Sequence[RoundObserver]:
    """The run's experiment tracking (module docstring): TensorBoard event files where it has a folder, MLflow with
    ``--mlflow``."""
    logs: list[RoundObserver] = [TensorBoardLog(out, config.to_json())] if out else []
    if config.run.mlflow:
        logs.append(MlflowLog(config.run.mlflow, out, config.to_json(), resume=config.run.resume))
    return logs


def replan_event(record: Any) -> str:
    """The text of a re-planning round's event (TensorBoard's ``plan/events``, MLflow's ``plan_events.txt``)."""
    return f"round {record.round}: re-planned, cuts {record.cuts}, interval {record.interval}"


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
            writer.add_text("plan/events", replan_event(record), global_step=record.round)

    def close(self, status: str = "FINISHED", final: dict[str, Any] | None = None) -> None:
        """Flush and close the event files (whatever the run's ``status``; the final evaluation is in the
        history)."""
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None


MLFLOW_DB = "mlflow.db"
MLFLOW_ARTIFACTS = "mlartifacts"
MLFLOW_RUN_ID = "mlflow-run.txt"
"""The run folder's record of its MLflow run (``URI`` and run id, one per line): a resumed run logs on into it."""
EXPERIMENT = "adaptplan"
ARTIFACTS = tuple(name for name in RUN_FILES if name != CHECKPOINT_NAME)
"""The run folder's files logged as the MLflow run's artifacts when the run ends (those that exist): every run
file but the checkpoint."""


def mlflow_store(uri: str, out: Path | None) -> tuple[str, str | None]:
    """(tracking URI, artifact location or None) of ``--mlflow URI`` for the run folder ``out``: ``local`` is the
    SQLite file ``out/mlflow.db`` with the artifacts in ``out/mlartifacts``; any other URI is MLflow's."""
    if uri != MLFLOW_LOCAL:
        return uri, None
    assert out is not None, "--mlflow local needs --out"
    return f"sqlite:///{(out / MLFLOW_DB).resolve()}", (out / MLFLOW_ARTIFACTS).resolve().as_uri()


class MlflowLog:
    """The run logged to MLflow (docs/formats.md "Tracking"): one MLflow run in the experiment ``adaptplan``,
    named after the run folder, with every configuration value as a parameter, every round's record as metrics
    (the tags of :func:`record_tags`, step = round), re-planning events as the text artifact ``plan_events.txt``
    and, when the run ends, the run folder's :data:`ARTIFACTS`; its status FINISHED, KILLED (stopped by a signal)
    or FAILED. ``uri`` ``local`` is MLflow's default database, one SQLite file ``RUN/mlflow.db`` (MLflow 3
    refuses its older file store unless told otherwise). A resumed run logs on into the MLflow run its folder
    names. The tracking server is asked once when the run starts (an unreachable one is an InputError naming
    ``--mlflow``); a failure later is reported once on stderr and the training goes on."""

    def __init__(self, uri: str, out: str | None, config: dict[str, Any], resume: bool = False) -> None:
        import logging
        import os
        import warnings

        from adaptplan.errors import InputError

        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")     # an unreachable server: one line, at once
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
        try:
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise InputError("needs the mlflow package: pip install 'adaptplan[mlflow]'", field="--mlflow") from None
        logging.getLogger("mlflow").setLevel(logging.WARNING)
        self.out = Path(out) if out else None
        self.given = uri                    # written to mlflow-run.txt: "local" stays valid where the folder moves
        uri, artifacts = mlflow_store(uri, self.out)
        if self.given == MLFLOW_LOCAL and self.out is not None and not (self.out / MLFLOW_DB).exists():
            print(f"MLflow: creating {self.out / MLFLOW_DB} (MLflow builds its database schema once per run folder: "
                  "10-20 s on 2 cores)", file=sys.stderr, flush=True)
        self.uri = uri
        self.events: list[str] = []
        self._warned = False
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.client = MlflowClient(tracking_uri=uri)
                resumed = self._resumed_run() if resume else None
                if resumed is None:
                    experiment = self.client.get_experiment_by_name(EXPERIMENT)
                    experiment_id = (experiment.experiment_id if experiment is not None
                                     else self.client.create_experiment(EXPERIMENT, artifact_location=artifacts))
                    name = self.out.resolve().name if self.out else str(config.get("algorithm", "run"))
                    self.run_id: str = self.client.create_run(experiment_id, run_name=name).info.run_id
                    self._log_params(config)
                else:
                    self.run_id = resumed
                    self.client.update_run(self.run_id, status="RUNNING")
                    self._tag_changed_options(config)
        except Exception as exc:  # an unreachable server, a refused login, a store that cannot be written
            raise InputError(f"MLflow at {uri[:120]!r} cannot be used ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0][:160] if str(exc) else ''})", field="--mlflow") from None
        if self.out is not None:
            (self.out / MLFLOW_RUN_ID).write_text(f"{self.given}\n{self.run_id}\n")

    def _resumed_run(self) -> str | None:
        """The MLflow run this run folder logged to, where it is at this URI (None: a new one)."""
        if self.out is None or not (self.out / MLFLOW_RUN_ID).is_file():
            return None
        lines = (self.out / MLFLOW_RUN_ID).read_text().splitlines()
        if len(lines) != 2 or lines[0] not in (self.given, self.uri):   # the URI given (an older folder: resolved)
            return None
        try:
            self.client.get_run(lines[1])
        except Exception:   # noqa: BLE001 - deleted meanwhile, or another server: start a new MLflow run
            return None
        return lines[1]

    @staticmethod
    def _param_values(config: dict[str, Any]) -> dict[str, str]:
        """The configuration as MLflow parameters: flat keys (``extra.<option>`` for an algorithm's own), values
        as text (JSON where they are not text)."""
        flat = {k: v for k, v in config.items() if k != "extra"}
        flat.update({f"extra.{k}": v for k, v in (config.get("extra") or {}).items()})
        return {k: v if isinstance(v, str) else json.dumps(v) for k, v in sorted(flat.items())}

    def _log_params(self, config: dict[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(k, v) for k, v in self._param_values(config).items()]
        for i in range(0, len(params), 100):                         # MLflow takes 100 parameters per batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def _tag_changed_options(self, config: dict[str, Any]) -> None:
        """A resumed run's options that differ from the parameters (which MLflow keeps as first logged): the tag
        ``resumed.<key>`` with the value in force from now on."""
        from mlflow.entities import RunTag

        logged = self.client.get_run(self.run_id).data.params
        tags = [RunTag(f"resumed.{k}", v) for k, v in self._param_values(config).items() if logged.get(k) != v]
        if tags:
            self.client.log_batch(self.run_id, tags=tags)

    def _safely(self, what: str, call: Any) -> None:
        import sys
        import warnings

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                call()
        except Exception as exc:  # noqa: BLE001 - tracking must never stop the training
            if not self._warned:
                print(f"adaptplan train: warning: --mlflow: {what} failed ({type(exc).__name__}: "
                      f"{str(exc).splitlines()[0][:160] if str(exc) else ''}); the run goes on", file=sys.stderr)
                self._warned = True

    def log(self, record: Any) -> None:
        """Every field of ``record`` as metrics at step ``record.round``."""
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(tag, value, now, record.round) for tag, value in record_tags(record).items()]
        if record.replanned:
            self.events.append(replan_event(record))
        self._safely(f"logging round {record.round}",
                     lambda: [self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])
                              for i in range(0, len(metrics), 1000)])

    def close(self, status: str = "FINISHED", final: dict[str, Any] | None = None) -> None:
        """End the MLflow run with ``status``: the final evaluation (``final/<field>``), the events and the run
        folder's artifacts logged first."""
        def finish() -> None:
            import time

            from mlflow.entities import Metric

            if final:
                now, step = int(time.time() * 1000), int(final.get("round", 0))
                self.client.log_batch(self.run_id, metrics=[Metric(f"final/{k}", float(v), now, step)
                                                            for k, v in final.items() if k != "round" and _number(v)])
            if self.events:
                self.client.log_text(self.run_id, "\n".join(self.events) + "\n", "plan_events.txt")
            for name in ARTIFACTS if self.out is not None else ():
                assert self.out is not None
                if (self.out / name).is_file():
                    self.client.log_artifact(self.run_id, str(self.out / name))

        self._safely("logging the run's artifacts", finish)
        self._safely("ending the MLflow run", lambda: self.client.set_terminated(self.run_id, status=status))
