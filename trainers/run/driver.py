"""The synchronous training driver: ``run(config) -> History``.

Builds data, model, chain, profile, system process, clock, plan and engine from one
:class:`~trainers.config.train_config.TrainConfig`, then runs rounds t = 1..R (docs/model.md §5.4, Algorithm 1):
engine round → (at aggregation rounds, every Q rounds) re-plan and re-partition → charge the
simulated clock for the cuts in force during the round → evaluate every ``eval_every`` rounds →
checkpoint every K rounds. ``Trainer`` exposes the engine for tests.

Plan resolution, in order: explicit ``cuts`` (+ ``interval``, default 1); ``plan_path``; the
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

import dataclasses
import json
import math
import time
import uuid
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from adaptplan.calibration import Calibration
from adaptplan.constants import ConvergenceConstants
from adaptplan.convergence import step_note
from adaptplan.errors import InfeasibleError, InputError
from adaptplan.linear_rounds import LinearRounds
from adaptplan.measured_system import MeasuredRates
from adaptplan.plan import Plan
from adaptplan.system import SystemProcess, SystemRanges, SystemSpec, generate_system, scaled_ranges
from profilers import build_chain, profile_model
from profilers.models import check_model_output
from profilers.profile import StemWarning, stem_note
from trainers.algorithms import algorithm
from trainers.config.devices import resolve_device
from trainers.config.run_file import FILE_NAME as RUN_FILE
from trainers.config.run_file import run_file_text
from trainers.config.train_config import RESUMABLE, TrainConfig, as_saved_run_trained
from trainers.engine.clock import SimClock
from trainers.engine.execution import Execution
from trainers.engine.split_engine import DeviceData, RoundStats, SplitEngine
from trainers.inputs.datasets import Dataset, load_dataset
from trainers.inputs.device_data import read_manifest
from trainers.inputs.models import build_model
from trainers.inputs.partition import local_test_split, partition_indices, samples_before_split
from trainers.roles.messages import NonFiniteError
from trainers.run.checkpoint import file_digest, load_checkpoint, save_checkpoint, write_atomic
from trainers.run.estimation import RunData, pilot_calibration, run_constants
from trainers.run.folder import Interrupted, RunFolder, StopRequest
from trainers.run.history import History, RoundRecord
from trainers.run.planning import Planner, ReplanRequest, default_planner, linear_planner  # noqa: F401  (re-exported)
from trainers.run.tracking import MlflowLog, TensorBoardLog
from trainers.strategies import make_strategy


# ---- planning ---------------------------------------------------------------------------------------------
def _decision(result: "tuple[list[int], int] | Plan") -> tuple[list[int], int, dict[str, Any]]:
    """(cuts, interval, event fields) of a planner's answer: ``{"plan": Plan JSON}`` for a Plan,
    nothing more for a bare (cuts, interval)."""
    if isinstance(result, Plan):
        return list(result.cuts), int(result.interval), {"plan": result.to_json()}
    cuts, interval = result
    return [int(c) for c in cuts], int(interval), {}


# ---- the trainer -------------------------------------------------------------------------------------------
class Trainer:
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
        assert config.optim.lr is not None, "TrainConfig resolves the learning rate"
        self.config = config
        self.lr: float = config.optim.lr
        self.device = resolve_device(config.execution.device, field="device")       # no GPU for --device cuda: before any work
        self.algorithm = algorithm(config.algorithm)                       # the registry's entry: its traits
        self.strategy = make_strategy(config.algorithm, config.extra)     # its options are checked before any work
        if config.execution.threads:
            torch.set_num_threads(config.execution.threads)
        torch.manual_seed(config.run.seed)
        manifest = self._manifest()
        self.dataset = data if data is not None else self._load_data(manifest)
        x_test, y_test = self.dataset.x_test, self.dataset.y_test
        if config.run.max_test_samples:
            x_test, y_test = x_test[:config.run.max_test_samples], y_test[:config.run.max_test_samples]
        self._build_model()
        self.constants = self._checked_constants(constants)
        self.calibration = pilot_calibration(self.run_data, self.blocks) if config.plan.pilots else None
        if isinstance(self.calibration, Calibration):
            self.constants = self.calibration.constants
        self.planner, self.replan_every = self._planner(planner)
        self.process, self.clock = self._system_clock(system)
        parts, local_test = self._partition(manifest)
        cuts, interval, event = self._initial_plan()
        self.notes += [note for note in [self._interval_note(interval), self._step_note(event)] if note]
        self.engine = engine_factory(self.blocks, cuts, self.strategy,
                                  DeviceData(self.dataset.x_train, self.dataset.y_train, x_test, y_test, parts,
                                             self.dataset.num_classes, local_test),
                                  config.optimizer_spec("client"), config.data.batch_size, seed=config.run.seed,
                                  interval=interval, clock=self.clock,
                                  total_rounds=config.run.rounds, server_optimizer=config.optimizer_spec("server"),
                                  aggregation=(config.optim.aggregation, config.optim.trim),
                                  execution=Execution.resolve(self.device, config.execution.client_batching, config.execution.server_pass_samples,
                                                              config.execution.client_recompute, config.execution.batch_devices))
        self.history = History(meta={"config": config.to_json(), "plan_source": event["source"], "run_id": uuid.uuid4().hex,
                                     "num_blocks": len(self.blocks), "block_names": self.block_names,
                                     "target_accuracy": config.run.target_accuracy,
                                     "num_classes": self.dataset.num_classes,
                                     **({"calibration": self.calibration.to_json()} if self.calibration else {})})
        self.history.events.append({"round": 0, "event": "plan", **event, "cuts": cuts, "interval": interval})
        self.start_round = 0
        self.last_replan = 0
        self.wall_offset = 0.0
        self.measured_rates = MeasuredRates()
        self.input_digests = {name: file_digest(config.value(f"{name}_path"))
                              for name in ("system", "plan", "constants") if config.value(f"{name}_path")}

    def _manifest(self) -> Any:
        """The per-device data files' manifest (``--device-data``), checked against ``--devices``; None without."""
        c = self.config
        manifest = read_manifest(c.data.device_data) if c.data.device_data is not None else None
        if manifest is not None and len(manifest.devices) != c.data.devices:
            raise InputError(f"{c.data.device_data} holds the data of {len(manifest.devices)} devices, --devices is "
                             f"{c.data.devices}", field="devices")
        return manifest

    def _load_data(self, manifest: Any) -> Dataset:
        """The data set: from the manifest's files (a distributed run's edge server never holds the devices'
        samples) or by name."""
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
        chain = build_chain(model, self.dataset.x_train[:2])
        self.blocks, self.block_names = chain.blocks, list(chain.names)
        with warnings.catch_warnings():   # said once, by name, in self.notes
            warnings.simplefilter("ignore", StemWarning)
            self.profile = profile_model(chain, input_shape, model_name=f"{c.model.name}-{c.data.dataset}")
        self.notes = [note for note in [stem_note(c.model.name, input_shape, chain.output_shapes)] if note]

    @property
    def run_data(self) -> RunData:
        """What constants are estimated from: the configuration, the training samples, the blocks' names, the device."""
        return RunData(self.config, self.dataset.x_train, self.dataset.y_train, self.block_names, self.device)

    def _checked_constants(self, constants: ConvergenceConstants | None) -> ConvergenceConstants | None:
        """The convergence constants given or read from ``--constants``, checked against the model's cut points
        and the learning rate (Corollary 1 plans with the rate that trains)."""
        c = self.config
        if constants is None and c.plan.constants_path:
            constants = ConvergenceConstants.load(c.plan.constants_path)
        if constants is not None and len(constants.sigma2) != self.profile.num_cuts:
            raise InputError(f"the constants have {len(constants.sigma2)} cut points but {c.model.name} has "
                             f"{self.profile.num_cuts}; estimate them for this model (adaptplan profile --grad-stats)",
                             field="constants_path")
        if constants is not None and not math.isclose(constants.gamma, self.lr, rel_tol=1e-9):
            raise InputError(f"the constants' gamma = {constants.gamma:g} is not the learning rate --lr {c.optim.lr:g}; "
                             f"the plan (Corollary 1) must use the learning rate that trains", field="constants_path")
        return constants

    def _planner(self, planner: Planner | None) -> tuple[Planner, int | None]:
        """(the planner, re-plan every Q rounds): a planning policy's, or the AdaptSFL planner."""
        c = self.config
        if isinstance(self.calibration, LinearRounds):
            return planner or linear_planner(self.calibration), c.plan.replan_every
        if c.plan.policy is None:
            return planner or default_planner(self.constants, gamma=self.lr), c.plan.replan_every
        from trainers.run.policies import REDRAWING, policy_planner

        fixed = c.plan.cuts[0] if c.plan.cuts else None
        chosen = planner or policy_planner(c.plan.policy, self.constants, self.lr, c.run.seed, fixed)
        return chosen, 1 if c.plan.policy in REDRAWING else (c.plan.replan_every if c.plan.policy == "adaptsfl" else None)

    def _system_clock(self, system: SystemSpec | None) -> tuple[SystemProcess, SimClock]:
        """The system process (given, read from ``--system`` or generated; re-drawn each round only where
        generated: a system the user gave keeps its resources) and the simulated clock over it."""
        c = self.config
        self.ranges = scaled_ranges(SystemRanges(), c.system.flops_scale, c.system.bandwidth_scale)
        base = system
        if base is None:
            base = SystemSpec.load(c.system.path) if c.system.path else \
                generate_system(c.data.devices, c.system.seed, self.ranges)
        if base.num_devices != c.data.devices:
            raise InputError(f"system has {base.num_devices} devices but devices = {c.data.devices}", field="devices")
        generated = system is None and not c.system.path
        process = SystemProcess(base, seed=c.system.seed, redraw=c.system.redraw_resources and generated,
                                ranges=self.ranges, noise_cv=c.system.noise_cv)
        return process, SimClock(self.profile, process, c.data.batch_size)

    def _partition(self, manifest: Any) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(each device's training indices, its held-out indices): the manifest's or the partition's, then the
        local test split; the batch must fit the smallest device."""
        c = self.config
        parts = manifest.parts() if manifest is not None else partition_indices(
            self.dataset.y_train.numpy(), c.data.devices, c.data.partition, c.run.seed, c.data.dirichlet_alpha,
            min_size=samples_before_split(c.data.batch_size, c.data.local_test_fraction))
        parts, local_test = local_test_split(parts, c.data.local_test_fraction, c.run.seed)
        # rank 0 of a distributed run over per-device files holds no device's samples: no local evaluation there
        self.local_evaluation = c.data.local_test_fraction > 0 and not (manifest is not None and c.runtime.distributed)
        smallest = min(len(p) for p in parts)
        if c.data.batch_size > smallest:
            raise InputError(f"{c.data.batch_size} exceeds the smallest device's {smallest} training samples "
                             f"({c.data.partition} partition over {c.data.devices} devices)", field="batch_size")
        return parts, local_test

    def _initial_plan(self) -> tuple[list[int], int, dict[str, Any]]:
        """(cuts, interval, event fields) of the plan in force from round 1 (module docstring)."""
        c, L = self.config, len(self.blocks)
        if c.plan.cuts is not None and c.plan.policy is None:
            return list(c.plan.cuts), c.plan.interval or 1, {"source": "cuts"}   # c.plan.interval: --interval or the algorithm's
        if c.plan.path is not None:
            plan = Plan.load(c.plan.path)
            if len(plan.cuts) != c.data.devices:
                raise InputError(f"plan has {len(plan.cuts)} cuts but devices = {c.data.devices}", field="plan.cuts")
            outside = [cut for cut in plan.cuts if not 1 <= cut <= L]
            if outside:
                raise InputError(f"cut {outside[0]} is outside 1..{L}, the cut points of {c.model.name}", field="plan.cuts")
            self._check_plan_model(plan)
            return list(plan.cuts), c.plan.interval or plan.interval, {"source": "plan", "plan": plan.to_json()}
        estimated = self.planning_constants(0, self.blocks) if c.plan.reestimate else None
        try:
            cuts, interval, details = _decision(self.planner(ReplanRequest(0, self.clock.system(1), self.profile, [], 1,
                                                                           estimated)))
        except InfeasibleError as exc:
            if not c.plan.allow_fallback:
                raise InfeasibleError(f"the planner found no plan: {exc.message}. Give the plan yourself (--cuts, --plan), "
                                      f"change the target (--constants), or pass --allow-fallback to train every device "
                                      f"at cut {math.ceil(L / 2)} of {L} with I = 1", field=exc.field) from None
            return [math.ceil(L / 2)] * c.data.devices, c.plan.interval or 1, {"source": "default", "reason": str(exc)}
        source = {"source": "planner"} if c.plan.policy is None else {"source": "policy", "policy": c.plan.policy}
        if estimated is not None:
            details = {**details, "constants": estimated.to_json()}
        return self._one_client_model(cuts), c.plan.interval or self._planned_interval(interval), {**source, **details}

    def _step_note(self, event: dict[str, Any]) -> str | None:
        """:func:`adaptplan.convergence.step_note` for the constants the planner planned with (γ > 1/β)."""
        if event["source"] not in ("planner", "policy"):
            return None
        if "constants" in event:
            return step_note(ConvergenceConstants.from_json(event["constants"]))
        return step_note(self.constants) if self.constants is not None else None

    def _interval_note(self, interval: int) -> str | None:
        """One line where the algorithm averages the devices' models every I rounds and I exceeds the run's
        rounds: the run would end without ever averaging them (SCALA's default I = 20 in a 10-round run)."""
        rounds = self.config.run.rounds
        if not self.strategy.averages_clients or interval <= rounds:
            return None
        return (f"{self.config.algorithm} averages the devices' models every I = {interval} rounds, more than the run's "
                f"{rounds} (--rounds): this run never averages them; give --interval {rounds} or less to see it do so")

    def _check_plan_model(self, plan: Plan) -> None:
        """The plan must record its model (``plan.model``, written by every plan the planner makes) and
        have been made for this model's structure; a hand-written plan is given as ``--cuts`` and
        ``--interval`` instead, which the message spells out."""
        if plan.model is None:
            raise InputError(f"the plan does not say which model it was made for, so it cannot be checked against "
                             f"--model {self.config.model.name}: make it with adaptplan plan --profile (which records the "
                             f"model), or give it as --cuts {','.join(map(str, plan.cuts))} --interval {plan.interval}",
                             field="plan.model")
        mine = self.profile.identity()
        if plan.model["num_cuts"] != mine["num_cuts"] or plan.model["structure_sha256"] != mine["structure_sha256"]:
            raise InputError(f"the plan was made for model {plan.model['name']!r} ({plan.model['num_cuts']} cut points, "
                             f"structure {plan.model['structure_sha256'][:12]}…) but --model {self.config.model.name} on "
                             f"{self.config.data.dataset} has {mine['num_cuts']} cut points (structure "
                             f"{mine['structure_sha256'][:12]}…); plan for this model (adaptplan profile + adaptplan plan)",
                             field="plan_path")

    def describe_plan(self) -> str:
        """One line saying which plan the run starts with."""
        event = self.history.events[0]
        cuts = event["cuts"]
        counts = {c: cuts.count(c) for c in sorted(set(cuts))}
        spread = ", ".join(f"{n}× cut {c}" for c, n in counts.items())
        source = {"cuts": "--cuts", "plan": f"plan file {self.config.plan.path}", "planner": "the built-in planner",
                  "default": "the fallback (no feasible plan)", "policy": f"policy {self.config.plan.policy}"}[event["source"]]
        extra = ""
        if "plan" in event and self.calibration is not None:
            calibration = self.calibration
            extra = (f"; predicted {event['plan']['rounds']} rounds, {event['plan']['total_latency_s']:.4g} simulated s "
                     f"to {self.config.run.target_accuracy:.1%} test accuracy (eq. 26, calibrated on "
                     f"{len(calibration.pilots)} pilot{'s' if len(calibration.pilots) > 1 else ''}: {calibration.message})")
        elif "plan" in event:
            extra = (f"; predicted {event['plan']['rounds']} rounds, {event['plan']['total_latency_s']:.4g} s (eq. 26, "
                     f"to an ε-stationary point of {self._constants_origin(event)}; --pilots and --target-accuracy predict "
                     "to an accuracy)")
        return f"plan from {source}: {spread} of {len(self.blocks)} cut points, {self._describe_interval(event)}{extra}"

    def _constants_origin(self, event: dict[str, Any]) -> str:
        """Where the constants of an uncalibrated plan come from, said in the plan's line (issue 66 item 2: never
        silently the placeholders)."""
        if "constants" in event:
            return "the constants estimated from this run's initial model and data (--reestimate, Algorithm 1)"
        if self.constants is None:
            return ("docs/model.md §6.1's placeholder constants, not this run's (--reestimate estimates them from this "
                    "run; --pilots N fits them to this run)")
        return f"the constants of {self.config.value('constants_path')}" if self.config.value("constants_path") \
            else "the constants given"

    def _describe_interval(self, event: dict[str, Any]) -> str:
        """What the interval means for this algorithm: none for those that never average client models, GAS's
        own buffer, and where AdaptSFL's I = 1 comes from when --cuts replaced the plan."""
        if self.strategy.asynchronous:
            return "asynchronous: a round is one global iteration (its model buffer decides the averaging)"
        if not self.strategy.averages_clients:
            return "client models never averaged"
        text = f"interval I = {event['interval']}"
        if event["source"] == "cuts" and self.config.plan.interval is None and self.algorithm.planned_interval:
            text += " (--cuts without --interval: give --interval I, or leave out --cuts for the planner's I)"
        return text

    def _planned_interval(self, interval: int) -> int:
        """The planner's I is the decision of an algorithm that takes it (AdaptSFL, the registry's
        ``planned_interval``); SplitFed and the others aggregate every round (I = 1) unless ``--interval`` says
        otherwise — only the cuts are taken from the plan. A ``--policy`` decides the interval for every algorithm."""
        return interval if self.algorithm.planned_interval or self.config.plan.policy is not None else 1

    def _one_client_model(self, cuts: list[int]) -> list[int]:
        """An algorithm of one client model (vanilla SL) hands it from device to device: all devices at the
        deepest planned cut."""
        return [max(cuts)] * len(cuts) if self.algorithm.one_client_model else list(cuts)

    # ---- checkpoint ---------------------------------------------------------------------------------------
    def state_dict(self, round_index: int, wall: float) -> dict[str, Any]:
        """The run's state: tensors and plain values only (trainers.run.checkpoint loads it with weights_only)."""
        name, keys, pos, has_gauss, cached = np.random.get_state()
        extra = {"cuda_rng": torch.cuda.get_rng_state(self.device)} if self.device.type == "cuda" else {}
        return {**extra, "round": round_index, "engine": self.engine.state_dict(), "torch_rng": torch.get_rng_state(),
                "numpy_rng": [name, keys, int(pos), int(has_gauss), float(cached)], "clock_seconds": self.clock.seconds,
                "last_replan": self.last_replan, "wall_seconds": wall, "history": self.history.to_json(),
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
        saved, now = as_saved_run_trained(state["config"]), self.config.to_json()   # fields checked on load
        if self.strategy.uses_total_rounds and saved.get("rounds") != now["rounds"]:
            raise InputError(f"{self.config.algorithm}'s schedule depends on the run's total rounds T (GAPSL's eq. 2: "
                             f"K^t grows with t/T), so a resumed run keeps --rounds {saved.get('rounds')} (asked: "
                             f"{now['rounds']}); start a new run for more rounds", field="rounds")
        for key in now:
            if key in RESUMABLE:
                continue
            if saved.get(key) != now[key]:
                raise InputError(f"differs from the checkpointed run ({saved.get(key)!r} vs {now[key]!r})", field=key)
        for name, digest in (state["inputs"] or {}).items():
            if digest != self.input_digests.get(name):
                raise InputError(f"the {name} file {now.get(name + '_path')!r} changed since the run started (its SHA-256 "
                                 "differs from the checkpoint's); resume with the same file, or start again with "
                                 "--overwrite", field=f"{name}_path")
        self._check_run_identity(state, where)
        round_index = state["round"]
        n_train = int(self.engine.data.x_train.shape[0])
        local_test = state.get("local_test", [np.zeros(0, dtype=np.int64)] * len(state["partitions"]))
        for i, part in enumerate([*state["partitions"], *local_test]):
            if len(part) and int(part.max()) >= n_train:
                raise InputError(f"the {where} gives device {i % len(state['partitions'])} sample index "
                                 f"{int(part.max())}, beyond the {n_train} training samples of {self.config.data.dataset}; "
                                 "start the run again with --overwrite", field="--resume")
        try:
            self.engine.data.parts = [np.asarray(p) for p in state["partitions"]]
            self.engine.data.local_test = [np.asarray(p) for p in local_test]
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
        self.last_replan = int(state["last_replan"])
        self.wall_offset = float(state["wall_seconds"])
        self.history = History.from_json(state["history"])
        self.history.meta["config"] = now
        measured = self.history.meta.get("measured_system")
        self.measured_rates = MeasuredRates.from_json(measured["rates"], "history.json meta.measured_system.rates") \
            if isinstance(measured, dict) and "rates" in measured else MeasuredRates()
        self.start_round = int(state["round"])

    def _check_run_identity(self, state: dict[str, Any], where: str) -> None:
        """A checkpoint continues the run whose history is in its folder: the run id (drawn when the run
        started, kept in history.json and every checkpoint) must match; a checkpoint copied from another run
        is refused. Since every checkpoint is written after the history (``history_beside``), a folder without
        history.json holds no run to continue: its checkpoint is refused, as is a checkpoint without a run id
        (one written before ids existed could come from any run) and one with an id beside a history without
        one. The id ties a checkpoint to its run against mistakes and copies, not against someone who can
        write the folder: the files carry no secret (docs/formats.md, the checkpoint fields)."""
        mine = state.get("run_id")                           # its form was checked on load
        if mine is None:
            raise InputError(f"the {where} carries no run id (it was written before adaptplan gave runs one), so "
                             "nothing ties it to this folder's run; start again with --overwrite", field="--resume")
        history_path = Path(str(self.config.run.out)) / "history.json"
        if not history_path.is_file():
            raise InputError(f"the folder has no history.json, which the run that wrote the {where} keeps beside "
                             "every checkpoint: the checkpoint was copied from another run folder, or the history "
                             "was removed; copy the whole folder, or start again with --overwrite",
                             field="--resume")
        try:
            theirs = json.loads(history_path.read_text(encoding="utf-8")).get("meta", {}).get("run_id")
        except (OSError, ValueError, AttributeError, RecursionError) as exc:   # atomic: no torn write of this run
            raise InputError(f"history.json beside the {where} cannot be read ({type(exc).__name__}), so nothing ties "
                             "the checkpoint to this folder's run; restore the folder's history.json, or start again "
                             "with --overwrite", field="--resume") from None
        if theirs is None:                       # a run that gives its checkpoints an id writes it into its history
            raise InputError(f"the {where} has a run id (run id {str(mine)[:12]}…) and the history beside it none: "
                             "the history comes from another run, or was edited; copy the whole folder, or start "
                             "again with --overwrite", field="--resume")
        if theirs != mine:
            raise InputError(f"the {where} belongs to another run (run id {str(mine)[:12]}…) than the history beside it "
                             f"(run id {str(theirs)[:12]}…): a checkpoint copied from another run folder is not "
                             "continued; copy the whole folder, or start again with --overwrite", field="--resume")

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
        self._save_run_file(out)
        tracking = TensorBoardLog(out, c.to_json()) if out else None
        mlflow = MlflowLog(c.run.mlflow, out, c.to_json(), resume=c.run.resume) if c.run.mlflow else None
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
                    if tracking is not None:
                        tracking.log(record)
                    if mlflow is not None:
                        mlflow.log(record)
                    if bar is not None:
                        shown = self.history.final_accuracy
                        bar.set_postfix_str(f"acc={shown if shown is None else f'{shown:.3f}'} sim={self.clock.seconds:.1f}s")
                        bar.update(1)
                    signum = stop.signum if t < c.run.rounds else None      # a stop asked for before the last round
                    if out and (signum is not None or (c.run.checkpoint_every and t % c.run.checkpoint_every == 0)):
                        self._save_history(out)          # first: a folder with a checkpoint always has its history
                        save_checkpoint(self.state_dict(t, wall), out)
                    if signum is not None:
                        status = "KILLED"
                        raise Interrupted(signum, t, out, c.runtime.resume_command(out) if out else "")
            self._final_evaluation()
            self.engine.release()                # the other ranks end now, not after the files below
            self._save_history(out)
            self._save_plot(out)
            status = "FINISHED"
        except Interrupted:
            # its history and checkpoint were written just before it was raised (writing a 16,000-round history
            # again took 12 s, which kept a stopped bench's workers busy)
            raise
        except Exception:
            # a lost rank (in a round, a checkpoint's state fetch or an evaluation), a full disk...:
            # the rounds finished so far are kept (diverged runs saved theirs already)
            self._keep_history(out)
            raise
        finally:
            if bar is not None:
                bar.close()
            if tracking is not None:
                tracking.close()
            if mlflow is not None:
                mlflow.close(status, self.history.meta.get("final_evaluation"))
        return self.history

    def _round(self, t: int, out: str | None, wall: Callable[[], float]) -> RoundRecord:
        """Round ``t``: train, re-plan where Algorithm 1 says, evaluate on evaluation rounds; its record, the clock
        advanced (``wall()``: the run's wall seconds so far). NaN/inf stops the run with the history kept."""
        c, engine = self.config, self.engine
        cuts_in_force, interval_in_force = list(engine.cuts), engine.interval
        try:
            stats = engine.run_round(t)
            if stats.measured_seconds_by_role:
                self._measure(t, stats)
            replanned = self._maybe_replan(t, stats.aggregated)
            acc = test_loss = local = None
            if t % c.run.eval_every == 0:
                acc, test_loss, local = self.evaluate()
        except NonFiniteError as exc:
            self._save_history(out)
            kept = f"; the history up to round {t - 1} is in {out!r}" if out else ""
            raise InputError(f"training diverged at round {t}: {exc}{kept}; lower --lr or check the model",
                             field="lr") from None
        self.clock.seconds += stats.sim_seconds
        return RoundRecord(t, stats.loss, acc, test_loss, self.clock.seconds, stats.sim_seconds, wall(),
                           stats.bytes_up, stats.bytes_down, stats.bytes_server, stats.aggregated, replanned,
                           cuts_in_force, interval_in_force, stats.participants, stats.stage_seconds, stats.metrics,
                           stats.measured_stage_seconds, stats.measured_round_seconds, local)

    def _final_evaluation(self) -> None:
        """Evaluate a run that does not end on an evaluation round, into ``history.meta["final_evaluation"]``:
        kept out of the records so that a run interrupted there and resumed has exactly the records of an
        uninterrupted one."""
        last = self.history.records[-1] if self.history.records else None
        if last is not None and last.accuracy is None:
            acc, test_loss, local = self.evaluate()
            self.history.meta["final_evaluation"] = {"round": last.round, "accuracy": acc, "test_loss": test_loss,
                                                     "local_accuracy": local, "sim_seconds": last.sim_seconds}
        else:
            self.history.meta.pop("final_evaluation", None)

    def _keep_history(self, out: str | None) -> None:
        """Write the history on the way out of a failed round; a failure to write is not allowed
        to hide the failure that stopped the run."""
        try:
            self._save_history(out)
        except InputError:
            pass

    def _save_run_file(self, out: str | None) -> None:
        """``config.toml``: the run as a file (trainers/config/run_file.py), written before the first round (again
        on a resume, with the options it gave anew)."""
        if not out:
            return
        try:
            write_atomic(Path(out) / RUN_FILE, run_file_text(self.config).encode())
        except OSError as exc:
            raise InputError(f"cannot write {RUN_FILE} into {out!r}: {exc.strerror or exc}", field="--out") from None

    def _save_plot(self, out: str | None) -> None:
        """``accuracy.png`` in ``out``: the run's accuracy curves (trainers/run/plotting.py)."""
        if not out:
            return
        from trainers.run.plotting import plot_histories, run_label

        plot_histories([(run_label(Path(out).name, self.history), self.history)], Path(out) / "accuracy.png")

    def _save_history(self, out: str | None) -> None:
        """history.json/.csv into ``out``; a write failure is one InputError naming the path and the cause."""
        if not out:
            return
        try:
            self.history.save(out)
        except OSError as exc:
            raise InputError(f"cannot write the history into {out!r}: {exc.strerror or exc}", field="--out") from None

    def evaluate(self) -> tuple[float, float, float | None]:
        """Both evaluation protocols: global test accuracy and loss, the mean over the strategy's
        ``eval_models`` (the global model, or every device's model for PSL) on the test set; and the local
        accuracy, each device's model on its own held-out samples, pooled (None without a local split)."""
        results = [self.engine.evaluate(m, self.config.execution.eval_batch_size) for m in self.engine.eval_models()]
        local = self.engine.evaluate_local(self.config.execution.eval_batch_size) if self.local_evaluation else None
        return float(np.mean([r[0] for r in results])), float(np.mean([r[1] for r in results])), local

    def _measure(self, t: int, stats: RoundStats) -> None:
        """A runtime of processes measured round ``t``: its rates join the run's (adaptplan.measured_system), and
        history.json's ``meta.measured_system`` holds them, the base (round 1's system) and the system fitted so far."""
        self.measured_rates.add_round(self.clock.system(t), stats.seconds_by_role, stats.measured_seconds_by_role)
        base = self.clock.system(1)
        self.history.meta["measured_system"] = {"base": base.to_json(), "rates": self.measured_rates.to_json(),
                                                "system": self.measured_rates.fitted(base).to_json()}

    def _maybe_replan(self, t: int, aggregated: bool) -> bool:
        """Algorithm 1: at an aggregation round, if Q rounds passed since the last
        re-plan, call the planner with the measured system of the next round and re-partition without
        losing state. ``config.plan.interval``, if set, overrides the planner's I here too. An infeasible
        re-plan keeps the plan in force and records a ``replan-infeasible`` event with the reason."""
        Q = self.replan_every
        if not Q or not aggregated or t - self.last_replan < Q:
            return False
        system = dataclasses.replace(self.clock.process.measured(t + 1), batch_size=self.config.data.batch_size)
        if self.measured_rates.rates:              # a runtime of processes: the rates it measured so far
            system = self.measured_rates.fitted(system)
        old = (list(self.engine.cuts), self.engine.interval)
        self.last_replan = t
        estimated = self.planning_constants(t, self.engine.global_model()) if self.config.plan.reestimate else None
        try:
            cuts, interval, details = _decision(self.planner(ReplanRequest(t, system, self.profile, *old, estimated)))
        except InfeasibleError as exc:             # keep the plan in force, say why
            self.history.events.append({"round": t, "event": "replan-infeasible", "reason": str(exc),
                                        "cuts": old[0], "interval": old[1]})
            return False
        cuts, interval = self._one_client_model(cuts), self.config.plan.interval or self._planned_interval(interval)
        self.engine.set_cuts(cuts, t)
        self.engine.interval = interval
        if estimated is not None:
            details = {**details, "constants": estimated.to_json()}
        if self.measured_rates.rates:
            details = {**details, "system_from": "measured"}
        self.history.events.append({"round": t, "event": "replan", "old_cuts": old[0], "old_interval": old[1],
                                    "cuts": cuts, "interval": interval, **details})
        return True

    def planning_constants(self, t: int, model: torch.nn.Sequential) -> ConvergenceConstants:
        """Algorithm 1 (docs/model.md §5.4) with ``--reestimate``: β, σ_j², G_j² and ϑ estimated from the run's own
        ``model`` — its initial blocks before round 1 (the algorithm's first line), the global model of the
        aggregation round at a re-plan — on 8 mini-batches of its training data (seed t), with γ = --lr and the
        target ε in force (the constants file's, else the placeholder's); then the calibration's fit (--pilots),
        else an unreachable ε raised to twice the noise floor (as for placeholders)."""
        epsilon = (self.constants.epsilon if self.constants is not None
                   else ConvergenceConstants.placeholder(self.profile.num_cuts).epsilon)
        estimated = run_constants(self.run_data, model, t, epsilon)
        devices = self.config.data.devices
        return self.calibration.apply(estimated, devices) if isinstance(self.calibration, Calibration) \
            else estimated.reachable(devices)


def run(config: TrainConfig, **kwargs: Any) -> History:
    """Run one training job; keyword arguments go to :class:`Trainer` (planner, system, constants, data)."""
    return Trainer(config, **kwargs).run()
