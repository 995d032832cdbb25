"""The synchronous training driver: ``run(config) -> History``.

Builds data, model, chain, profile, system process, clock, plan and engine from one
:class:`~trainers.config.train_config.TrainConfig`, then runs rounds t = 1..R (docs/model.md §5.4, Algorithm 1):
engine round → (at aggregation rounds, every Q rounds) re-plan and re-partition → charge the
simulated clock for the cuts in force during the round → evaluate every ``eval_every`` rounds →
checkpoint every K rounds. ``Trainer`` exposes the engine for tests. It is the set-up and the loop; the plan (first
plan, its line, re-plans) is :class:`trainers.run.run_planning.RunPlanning`, whether a checkpoint may be continued
:mod:`trainers.run.resume_check`, the files beside the checkpoints :mod:`trainers.run.output`.

Plan resolution (``RunPlanning.initial_plan``), in order: explicit ``cuts`` (+ ``interval``, default 1); ``plan_path``; the
built-in planner (``adaptplan.planner.Planner`` on the model profile and the round-1 system, with
the constants of ``constants_path`` or the placeholders of docs/model.md §6.1); only if that plan is
infeasible (:class:`~adaptplan.errors.InfeasibleError`), the documented default: every device at
cut ⌈L/2⌉, I = 1, with the reason recorded. The history's events say which plan was in force from
which round (``plan``/``replan``/``replan-infeasible`` events; the planner's Plan JSON included).

The model is cut by ``profilers.build_chain`` (traced; one block per parameterised layer) and
profiled by ``profilers.profile_model`` on that chain, so cut index j means the same thing to the
engine, the clock and the planner.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Callable, Sequence

import numpy as np
import torch

from adaptplan.calibration import Calibration
from adaptplan.constants import ConvergenceConstants
from adaptplan.errors import InputError
from adaptplan.linear_rounds import RoundsLaw
from adaptplan.measured_system import MeasuredRates
from adaptplan.system import SystemProcess, SystemRanges, SystemSpec, generate_system, scaled_ranges
from profilers.models import check_model_output
from profilers.profile import stem_note
from trainers.algorithms import algorithm
from trainers.config.devices import resolve_device
from trainers.config.host import use_cpu
from trainers.config.train_config import TrainConfig
from trainers.engine.clock import SimClock
from trainers.engine.privacy_account import privacy_summary
from trainers.engine.split_engine import DeviceData, RoundStats, SplitEngine
from trainers.inputs.datasets import Dataset, load_dataset
from trainers.inputs.device_data import DeviceManifest, read_manifest
from trainers.inputs.models import build_model
from trainers.inputs.partition import local_test_split, partition_indices, samples_before_split
from trainers.inputs.skew import PartitionSkew
from trainers.roles.messages import NonFiniteError
from trainers.run.checkpoint import file_digest, load_checkpoint, save_checkpoint
from trainers.run.estimation import RunData
from trainers.run.folder import Interrupted, RunFolder, StopRequest
from trainers.run.history import History, RoundRecord
from trainers.run.output import keep_history, save_history, save_plot, save_run_file
from trainers.run.planning import Planner, ReplanRequest, default_planner, linear_planner  # noqa: F401  (re-exported)
from trainers.run.resume_check import check_run_identity, check_same_run, checked_partitions
from trainers.run.run_model import RunModel
from trainers.run.run_planning import RunPlanning
from trainers.run.tracking import RoundObserver, tracking_logs
from trainers.strategies import later_models, make_strategy


# ---- the trainer -------------------------------------------------------------------------------------------
class Trainer(RunModel):
    """Build everything from ``config`` and run it; ``engine``, ``history``, ``clock`` are public.

    ``planner`` (a :data:`Planner` callable) is used for the initial plan when no cuts/plan are
    given and for re-planning when ``replan_every`` is set; default :func:`default_planner`.
    ``system`` overrides the generated system (``generate_system(devices, system_seed)``);
    ``constants`` the training constants (else ``config.plan.constants_path``, else the placeholders);
    ``data`` the dataset (else ``trainers.inputs.datasets.load_dataset(config.data.dataset, config.data.data_root, config.data.download)``);
    ``engine_factory`` the runtime (the simulator by default; the torch.distributed runtime passes its own).
    """

    def __init__(self, config: TrainConfig, planner: Planner | None = None, system: SystemSpec | None = None,
                 constants: ConvergenceConstants | None = None, data: Dataset | None = None,
                 engine_factory: Callable[..., SplitEngine] = SplitEngine) -> None:
        config.validate()
        self.config = config
        self.device = resolve_device(config.execution.device, field="device")       # no GPU for --device cuda: before any work
        self.algorithm = algorithm(config.algorithm)                       # the registry's entry: its traits
        self.strategy = make_strategy(config.algorithm, config.extra)     # its options are checked before any work
        self.engine_factory = engine_factory
        use_cpu(config.execution.threads)
        torch.manual_seed(config.run.seed)
        manifest = self._manifest()
        self.dataset = data if data is not None else self._load_data(manifest)
        parts, local_test = self._partition(manifest)
        x_test, y_test = self.dataset.held_by(parts + local_test)     # a natural partition: its owners' test samples
        if config.run.max_test_samples:
            x_test, y_test = x_test[:config.run.max_test_samples], y_test[:config.run.max_test_samples]
        self._build_model()
        self.planning = RunPlanning(config, self.profile, self.blocks, self.run_data, self.algorithm, self.strategy,
                                    constants, planner)
        self.process, self.clock = self._system_clock(system)
        cuts, interval, event = self.planning.initial_plan(self.clock)
        self.notes += self.planning.notes(interval, event)
        self.model_change = self.strategy.model_change_round(interval)     # None: one model for the run
        self.engine = self._make_engine(cuts, interval, DeviceData(self.dataset.x_train, self.dataset.y_train, x_test,
                                                                   y_test, parts, self.dataset.num_classes, local_test))
        M = self.dataset.num_classes
        self.history = History(meta={"config": config.to_json(), "plan_source": event["source"], "run_id": uuid.uuid4().hex,
                                     "num_blocks": len(self.blocks), "block_names": self.block_names, "num_classes": M,
                                     "target_accuracy": config.run.target_accuracy,
                                     "partition_skew": PartitionSkew.of_parts(parts, self.dataset.y_train.numpy(), M).to_json(),
                                     **({"calibration": self.planning.calibration.to_json()}
                                        if self.planning.calibration else {})})
        self.history.events.append({"round": 0, "event": "plan", **event, "cuts": cuts, "interval": interval})
        self.start_round, self.wall_offset, self.measured_rates = 0, 0.0, MeasuredRates()
        self.observers: list[RoundObserver] = []    # more watchers of each round (train --leakage-every), after the logs
        self.input_digests = {name: file_digest(config.value(f"{name}_path"))
                              for name in ("system", "plan", "constants") if config.value(f"{name}_path")}

    def _manifest(self) -> DeviceManifest | None:
        """The per-device data files' manifest (``--device-data``), checked against ``--devices``; None without."""
        c = self.config
        manifest = read_manifest(c.data.device_data) if c.data.device_data is not None else None
        if manifest is not None and len(manifest.devices) != c.data.devices:
            raise InputError(f"{c.data.device_data} holds the data of {len(manifest.devices)} devices, --devices is "
                             f"{c.data.devices}", field="devices")
        return manifest

    def _load_data(self, manifest: DeviceManifest | None) -> Dataset:
        """The data set: from the manifest's files (a distributed run's edge server never holds the devices' samples) or by name."""
        c = self.config
        if manifest is not None:
            return manifest.dataset(with_samples=not c.runtime.distributed)
        return load_dataset(c.data.dataset, c.data.data_root, c.data.download)

    def _build_model(self) -> None:
        """The model as blocks (``self.blocks``, ``self.block_names``), its profile, and the stem note."""
        c = self.config
        input_shape = tuple(int(s) for s in self.dataset.x_train.shape[1:])
        model = build_model(c.model.name, input_shape, self.dataset.num_classes, c.model.width)
        check_model_output(model, c.model.name, input_shape, self.dataset.num_classes, field="model")
        chain = self._use_model(model)
        self.base_blocks, self.model_stage = self.blocks, 0      # the run's model (a strategy may move to another)
        later_models(self.strategy, self.base_blocks)               # ... which must be one it can be built from
        self.notes: list[str] = [note for note in [stem_note(c.model.name, input_shape, chain.output_shapes)] if note]

    @property
    def run_data(self) -> RunData:
        """What constants are estimated from: the configuration, the training samples, the blocks' names, the device."""
        return RunData(self.config, self.dataset.x_train, self.dataset.y_train, self.block_names, self.device)

    def _system_clock(self, system: SystemSpec | None) -> tuple[SystemProcess, SimClock]:
        """The system process (given, from ``--system``, or generated and then re-drawn each round) and its clock."""
        c = self.config
        self.ranges = scaled_ranges(SystemRanges(), c.system.flops_scale, c.system.bandwidth_scale)
        base = system if system is not None else (SystemSpec.load(c.system.path) if c.system.path else
                                                  generate_system(c.data.devices, c.system.seed, self.ranges))
        if base.num_devices != c.data.devices:
            raise InputError(f"system has {base.num_devices} devices but devices = {c.data.devices}", field="devices")
        generated = system is None and not c.system.path
        process = SystemProcess(base, seed=c.system.seed, redraw=c.system.redraw_resources and generated,
                                ranges=self.ranges, noise_cv=c.system.noise_cv)
        return process, SimClock(self.profile, process, c.data.batch_size)

    def _partition(self, manifest: DeviceManifest | None) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(each device's training indices, its held-out indices): the manifest's or the partition's, then the
        local test split; the batch must fit the smallest device."""
        c = self.config
        parts = manifest.parts() if manifest is not None else partition_indices(
            self.dataset.y_train.numpy(), c.data.devices, c.data.partition, c.run.seed, c.data.dirichlet_alpha,
            samples_before_split(c.data.batch_size, c.data.local_test_fraction), c.data.labels_per_device, c.data.size_exponent,
            self.dataset.groups)
        parts, local_test = local_test_split(parts, c.data.local_test_fraction, c.run.seed)
        # rank 0 of a distributed run over per-device files holds no device's samples: no local evaluation there
        self.local_evaluation = c.data.local_test_fraction > 0 and not (manifest is not None and c.runtime.distributed)
        smallest = min(len(p) for p in parts)
        if c.data.batch_size > smallest:
            raise InputError(f"{c.data.batch_size} exceeds the smallest device's {smallest} training samples "
                             f"({c.data.partition} partition over {c.data.devices} devices)", field="batch_size")
        return parts, local_test

    @property
    def constants(self) -> ConvergenceConstants | None:
        """The constants the run plans with (given, read, or the --pilots fit's; :class:`RunPlanning`)."""
        return self.planning.constants

    @property
    def calibration(self) -> Calibration | RoundsLaw | None:
        """The fit to --pilots, if any (:class:`RunPlanning`)."""
        return self.planning.calibration

    def describe_plan(self) -> str:
        """One line saying which plan the run starts with (:meth:`RunPlanning.describe`)."""
        return self.planning.describe(self.history.events[0])

    # ---- checkpoint ---------------------------------------------------------------------------------------
    def state_dict(self, round_index: int, wall: float) -> dict[str, Any]:
        """The run's state: tensors and plain values only (trainers.run.checkpoint loads it with weights_only)."""
        name, keys, pos, has_gauss, cached = np.random.get_state()
        extra = {"cuda_rng": torch.cuda.get_rng_state(self.device)} if self.device.type == "cuda" else {}
        return {**extra, "round": round_index, "engine": self.engine.state_dict(), "torch_rng": torch.get_rng_state(),
                "numpy_rng": [name, keys, int(pos), int(has_gauss), float(cached)], "clock_seconds": self.clock.seconds,
                "last_replan": self.planning.last_replan, "wall_seconds": wall, "history": self.history.to_json(),
                "run_id": self.history.meta.get("run_id"), "history_beside": True,
                "config": self.config.to_json(), "partitions": [p.copy() for p in self.engine.data.parts],
                "local_test": [p.copy() for p in self.engine.data.local_test],
                "inputs": self.input_digests}

    def resume(self) -> None:
        """Continue from ``config.run.out/checkpoint.pt``: the options that shape the run must match."""
        if not self.config.run.out:
            raise InputError("--resume needs --out (the run folder holding checkpoint.pt)", field="resume")
        state = load_checkpoint(self.config.run.out)
        where = f"checkpoint in {self.config.run.out!r}"
        now = check_same_run(self.config, state, self.input_digests, self.strategy.uses_total_rounds)
        check_run_identity(state, self.config.run.out, where)
        round_index = state["round"]
        parts, local_test = checked_partitions(state, int(self.engine.data.x_train.shape[0]), self.config.data.dataset,
                                               where)
        try:
            self.engine.data.parts, self.engine.data.local_test = parts, local_test
            if self.model_change is not None:     # the model of the strategy's stage at the checkpoint, then its state
                self.strategy.load_state_dict(state["engine"]["strategy"])
                if self.strategy.model_stage != self.model_stage:
                    self._rebuild_for_model()
            self.engine.load_state_dict(state["engine"])
            torch.set_rng_state(state["torch_rng"])
            if self.device.type == "cuda" and "cuda_rng" in state:
                torch.cuda.set_rng_state(state["cuda_rng"], self.device)
            name, keys, pos, has_gauss, cached = state["numpy_rng"]
            np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
            self.engine.check_models_finite(round_index)
        except (KeyError, TypeError, ValueError, RuntimeError, IndexError, OverflowError, AttributeError) as exc:
            raise InputError(f"the {where} does not fit this run ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
                             "start the run again with --overwrite", field="--resume") from None
        self.clock.seconds = float(state["clock_seconds"])
        self.planning.last_replan = int(state["last_replan"])
        self.wall_offset = float(state["wall_seconds"])
        self.history = History.from_json(state["history"])
        self.history.meta["config"] = now
        measured = self.history.meta.get("measured_system")
        self.measured_rates = MeasuredRates.from_json(measured["rates"], "history.json meta.measured_system.rates") \
            if isinstance(measured, dict) and "rates" in measured else MeasuredRates()
        self.start_round = int(state["round"])

    # ---- the loop -----------------------------------------------------------------------------------------
    def run(self) -> History:
        """Train rounds start+1..R (module docstring). With ``out``: the folder is checked, locked and
        owned by this run; SIGINT/SIGTERM stop at the end of a round with the checkpoint and history
        saved (:class:`~trainers.run.folder.Interrupted`); NaN/inf stops with the history up to the
        last complete round saved (an InputError naming the round, the device and ``--lr``)."""
        c = self.config
        if not c.run.out:
            if c.run.resume:
                raise InputError("--resume needs --out (the run folder holding checkpoint.pt)", field="resume")
            return self._train(None)
        with RunFolder(c.run.out, resume=c.run.resume, overwrite=c.run.overwrite):
            return self._train(c.run.out)

    def _train(self, out: str | None) -> History:
        c = self.config
        if c.run.resume:
            self.resume()
        save_run_file(out, self.config)
        observers = [*tracking_logs(c, out), *self.observers]
        status = "FAILED"
        bar = None
        if c.run.progress:
            from tqdm import tqdm
            bar = tqdm(total=c.run.rounds, initial=self.start_round, unit="round", dynamic_ncols=True)
        t0 = time.perf_counter()
        wall = self.wall_offset
        try:
            with StopRequest() as stop:
                for t in range(self.start_round + 1, c.run.rounds + 1):
                    record = self._round(t, out, lambda: self.wall_offset + time.perf_counter() - t0)
                    wall = record.wall_seconds
                    self.history.append(record)
                    for observer in observers:
                        observer.log(record)
                    if bar is not None:
                        shown = self.history.final_accuracy
                        bar.set_postfix_str(f"acc={shown if shown is None else f'{shown:.3f}'} sim={self.clock.seconds:.1f}s")
                        bar.update(1)
                    signum = stop.signum if t < c.run.rounds else None      # a stop asked for before the last round
                    if out and (signum is not None or (c.run.checkpoint_every and t % c.run.checkpoint_every == 0)):
                        save_history(out, self.history)          # first: a folder with a checkpoint always has its history
                        save_checkpoint(self.state_dict(t, wall), out)
                    if signum is not None:
                        status = "KILLED"
                        raise Interrupted(signum, t, out, c.runtime.resume_command(out) if out else "")
            self._final_evaluation()
            self.history.meta.update(privacy_summary(self.engine))
            self.engine.release()                # the other ranks end now, not after the files below
            save_history(out, self.history)
            save_plot(out, self.history)
            status = "FINISHED"
        except Interrupted:
            # its history and checkpoint were written just before it was raised (writing a 16,000-round history
            # again took 12 s, which kept a stopped bench's workers busy)
            raise
        except Exception:
            # a lost rank (in a round, a checkpoint's state fetch or an evaluation), a full disk...:
            # the rounds finished so far are kept (diverged runs saved theirs already)
            keep_history(out, self.history)
            raise
        finally:
            if bar is not None:
                bar.close()
            for observer in observers:
                observer.close(status, self.history.meta.get("final_evaluation"))
        return self.history

    def _round(self, t: int, out: str | None, wall: Callable[[], float]) -> RoundRecord:
        """Round ``t``: train, re-plan where Algorithm 1 says, evaluate on evaluation rounds; its record, the clock
        advanced (``wall()``: the run's wall seconds so far). NaN/inf stops the run with the history kept."""
        c, engine = self.config, self.engine
        cuts_in_force, interval_in_force = list(engine.cuts), engine.interval
        try:
            stats = engine.run_round(t)
            if stats.measured_seconds_by_role:
                record_measured(self.history, self.measured_rates, self.clock, t, stats)
            replanned = self.planning.maybe_replan(t, stats.aggregated, engine, self.clock, self.measured_rates,
                                                   self.history.events)
            acc = test_loss = local = sampled = None
            if t % c.run.eval_every == 0:
                acc, test_loss, local, sampled = self.evaluate(stats.participants)
        except NonFiniteError as exc:
            save_history(out, self.history)
            kept = f"; the history up to round {t - 1} is in {out!r}" if out else ""
            raise InputError(f"training diverged at round {t}: {exc}{kept}; lower --lr or check the model",
                             field="lr") from None
        self.clock.seconds += stats.sim_seconds
        record = RoundRecord(t, stats.loss, acc, test_loss, self.clock.seconds, stats.sim_seconds, wall(),
                             stats.bytes_up, stats.bytes_down, stats.bytes_server, stats.aggregated, replanned,
                             cuts_in_force, interval_in_force, stats.participants, stats.stage_seconds, stats.metrics,
                             stats.measured_stage_seconds, stats.measured_round_seconds, local, sampled)
        if self.model_change is not None:
            self._follow_model(t)
        return record

    def _final_evaluation(self) -> None:
        """Evaluate a run that does not end on an evaluation round, into ``history.meta["final_evaluation"]``:
        kept out of the records so that a run interrupted there and resumed has exactly the records of an
        uninterrupted one."""
        last = self.history.records[-1] if self.history.records else None
        if last is not None and last.accuracy is None:
            acc, test_loss, local, sampled = self.evaluate(last.participants)
            self.history.meta["final_evaluation"] = {"round": last.round, "accuracy": acc, "test_loss": test_loss,
                                                     "local_accuracy": local, "local_sampled_accuracy": sampled,
                                                     "sim_seconds": last.sim_seconds}
        else:
            self.history.meta.pop("final_evaluation", None)

    def evaluate(self, sampled: Sequence[int] = ()) -> tuple[float, float, float | None, float | None]:
        """Global test accuracy and loss (the mean over the strategy's ``eval_models`` on the test set); the local
        accuracy, each device's model on its own held-out samples pooled, and the same over the round's ``sampled``
        devices only (the CycleSL authors' protocol); both None without a local split."""
        batch = self.config.execution.eval_batch_size
        results = [self.engine.evaluate(m, batch) for m in self.engine.eval_models()]
        local = self.engine.evaluate_local(batch) if self.local_evaluation else None
        among = self.engine.evaluate_local(batch, list(sampled)) if self.local_evaluation and sampled else None
        return float(np.mean([r[0] for r in results])), float(np.mean([r[1] for r in results])), local, among


def record_measured(history: History, rates: MeasuredRates, clock: SimClock, t: int, stats: RoundStats) -> None:
    """A runtime of processes measured round ``t``: its rates join the run's ``rates`` (adaptplan.measured_system), and
    history.json's ``meta.measured_system`` holds them, the base (round 1's system) and the system fitted so far."""
    rates.add_round(clock.system(t), stats.seconds_by_role, stats.measured_seconds_by_role)
    base = clock.system(1)
    history.meta["measured_system"] = {"base": base.to_json(), "rates": rates.to_json(),
                                       "system": rates.fitted(base).to_json()}


def run(config: TrainConfig, **kwargs: Any) -> History:
    """Run one training job; keyword arguments go to :class:`Trainer` (planner, system, constants, data)."""
    return Trainer(config, **kwargs).run()
