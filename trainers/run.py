"""The synchronous training driver: ``run(config) -> History``.

Builds data, model, chain, profile, system process, clock, plan and engine from one
:class:`~trainers.config.TrainConfig`, then runs rounds t = 1..R (spec §5.4, Algorithm 1):
engine round → (at aggregation rounds, every Q rounds) re-plan and re-partition → charge the
simulated clock for the cuts in force during the round → evaluate every ``eval_every`` rounds →
checkpoint every K rounds. ``Trainer`` exposes the engine for tests.

Plan resolution, in order: explicit ``cuts`` (+ ``interval``, default 1); ``plan_path``; the
built-in planner (``adaptplan.planner.Planner`` on the model profile and the round-1 system);
if planning fails or is unavailable, the documented default: every device at cut ⌈L/2⌉, I = 1.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from adaptplan.errors import InputError
from adaptplan.model_profile import ModelProfile
from adaptplan.system import SystemProcess, SystemSpec, generate_system
from trainers.checkpoint import load_checkpoint, save_checkpoint
from trainers.clock import SimClock, sequential_profile
from trainers.config import TrainConfig
from trainers.engine import DeviceData, SplitEngine
from trainers.history import History, RoundRecord
from trainers.models import build_model
from trainers.partition import partition_indices
from trainers.strategies import make_strategy

DATA_DIR_ENV = "ADAPTPLAN_DATA"
DEFAULT_DATA_DIR = "/work/shared/data"


# ---- data (thin switchable loader) ---------------------------------------------------------------
@dataclass
class Dataset:
    """Tensors of one dataset: images float (N, C, H, W), labels int64 (N,)."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int = 10


def load_data(name: str, root: str | None = None) -> Dataset:
    """Load dataset ``name``. ``synthetic`` is built here (fast tests); everything else goes through
    ``trainers.datasets.load_dataset`` when that module exists, else a local reader of the npz
    files in ``root`` / $ADAPTPLAN_DATA / /work/shared/data (cifar10-subset, mnist)."""
    if name == "synthetic":
        return _synthetic()
    try:
        from trainers.datasets import load_dataset  # type: ignore[import-not-found]
    except ImportError:
        return _load_npz(name, root)
    d = load_dataset(name, root=root)
    return Dataset(d.x_train, d.y_train.long(), d.x_test, d.y_test.long(),
                   int(getattr(d, "num_classes", int(d.y_train.max()) + 1)))


def _synthetic(n: int = 2400, classes: int = 10, seed: int = 1234) -> Dataset:
    """Learnable Gaussian class clusters, shape (1, 8, 8); 2000 train / 400 test."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, 1, 8, 8, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    x = centers[y] + 0.8 * torch.randn(n, 1, 8, 8, generator=g)
    return Dataset(x[:2000], y[:2000], x[2000:], y[2000:], classes)


def _load_npz(name: str, root: str | None) -> Dataset:
    folder = Path(root or os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR)
    if name == "cifar10-subset":
        d = np.load(folder / "cifar10_subset.npz")
        xtr, xte = (torch.from_numpy(d[k]).float().div(255) for k in ("x_train", "x_test"))
        mean = xtr.mean(dim=(0, 2, 3), keepdim=True)
        std = xtr.std(dim=(0, 2, 3), keepdim=True)
        return Dataset((xtr - mean) / std, torch.from_numpy(d["y_train"]).long(), (xte - mean) / std,
                       torch.from_numpy(d["y_test"]).long())
    if name == "mnist":
        d = np.load(folder / "mnist_test.npz")
        x = (torch.from_numpy(d["x"]).float().div(255) - 0.1307) / 0.3081
        y = torch.from_numpy(d["y"]).long()
        perm = torch.from_numpy(np.random.default_rng(0).permutation(x.shape[0]))
        train, test = perm[:8000], perm[8000:]
        return Dataset(x[train], y[train], x[test], y[test])
    raise InputError(f"dataset {name!r} needs trainers.datasets (torchvision with --data-root); "
                     f"available offline: cifar10-subset, mnist, synthetic", field="dataset")


# ---- model, chain, profile ---------------------------------------------------------------------------
def build_chain(model: nn.Module, example: torch.Tensor) -> tuple[nn.Sequential, list[str] | None, Any]:
    """(blocks, names, chain object) via ``profilers.build_chain``; an ``nn.Sequential`` fallback
    (children are the blocks) when profilers is unavailable."""
    try:
        from profilers import build_chain as _build
    except ImportError:
        if not isinstance(model, nn.Sequential):
            raise InputError("profilers is unavailable and the model is not an nn.Sequential", field="model")
        return model, None, None
    chain = _build(model, example)
    return chain.blocks, list(chain.names), chain


def model_profile(chain_obj: Any, blocks: nn.Sequential, input_shape: tuple[int, ...], name: str) -> ModelProfile:
    """``profilers.profile_model`` on the chain; the sequential fallback if profilers is unavailable."""
    try:
        from profilers import profile_model
    except ImportError:
        return sequential_profile(blocks, input_shape, name)
    profile = profile_model(chain_obj if chain_obj is not None else blocks, input_shape, model_name=name)
    if profile.num_cuts != len(blocks):
        raise InputError(f"profile has {profile.num_cuts} cut points but the chain has {len(blocks)} blocks", field="profile")
    return profile


# ---- planning ---------------------------------------------------------------------------------------------
@dataclass
class ReplanRequest:
    """What a planner sees at a re-planning point (Algorithm 1): the round just finished, the
    measured system for the next round, the profile, and the plan in force."""

    round: int
    system: SystemSpec
    profile: ModelProfile
    cuts: list[int]
    interval: int


Planner = Callable[[ReplanRequest], tuple[list[int], int]]


def default_planner(constants: Any = None) -> Planner:
    """A planner callable backed by ``adaptplan.planner.Planner``: ``plan()`` on the first call,
    ``replan(system=..., warm_start=...)`` afterwards. Constants default to the §6.1 placeholders."""
    state: dict[str, Any] = {}

    def plan(request: ReplanRequest) -> tuple[list[int], int]:
        from adaptplan.constants import ConvergenceConstants
        from adaptplan.planner import Planner as _Planner

        consts = constants or ConvergenceConstants.placeholder(request.profile.num_cuts)
        if "planner" not in state:
            state["planner"] = _Planner(request.profile, request.system, consts)
            result = state["planner"].plan()
        else:
            result = state["planner"].replan(system=request.system, warm_start=state["plan"])
        state["plan"] = result
        return list(result.cuts), int(result.interval)

    return plan


# ---- the trainer -------------------------------------------------------------------------------------------
class Trainer:
    """Build everything from ``config`` and run it; ``engine``, ``history``, ``clock`` are public.

    ``planner`` (a :data:`Planner` callable) is used for the initial plan when no cuts/plan are
    given and for re-planning when ``replan_every`` is set; default :func:`default_planner`.
    ``system`` overrides the generated system (``generate_system(devices, system_seed)``).
    """

    def __init__(self, config: TrainConfig, planner: Planner | None = None, system: SystemSpec | None = None,
                 constants: Any = None, data: Dataset | None = None) -> None:
        config.validate()
        self.config = config
        if config.threads:
            torch.set_num_threads(config.threads)
        torch.manual_seed(config.seed)
        self.dataset = data or load_data(config.dataset, config.data_root)
        x_test, y_test = self.dataset.x_test, self.dataset.y_test
        if config.max_test_samples:
            x_test, y_test = x_test[:config.max_test_samples], y_test[:config.max_test_samples]
        input_shape = tuple(int(s) for s in self.dataset.x_train.shape[1:])
        model = build_model(config.model, input_shape, self.dataset.num_classes, config.model_width)
        self.blocks, self.block_names, chain_obj = build_chain(model, self.dataset.x_train[:2])
        self.profile = model_profile(chain_obj, self.blocks, input_shape, f"{config.model}-{config.dataset}")
        if constants is None and config.constants_path:
            from adaptplan.constants import ConvergenceConstants
            constants = ConvergenceConstants.load(config.constants_path)
        self.planner = planner or default_planner(constants)
        base = system
        if base is None:
            base = SystemSpec.load(config.system_path) if config.system_path else generate_system(config.devices, config.system_seed)
        if base.num_devices != config.devices:
            raise InputError(f"system has {base.num_devices} devices but devices = {config.devices}", field="devices")
        self.process = SystemProcess(base, seed=config.system_seed, redraw=config.redraw_resources, noise_cv=config.noise_cv)
        self.clock = SimClock(self.profile, self.process, config.batch_size)
        parts = partition_indices(self.dataset.y_train.numpy(), config.devices, config.partition, config.seed,
                                  config.dirichlet_alpha)
        cuts, interval, source = self._initial_plan()
        self.strategy = make_strategy(config.algorithm)
        self.engine = SplitEngine(self.blocks, cuts, self.strategy,
                                  DeviceData(self.dataset.x_train, self.dataset.y_train, x_test, y_test, parts),
                                  config.optimizer_kwargs(), config.batch_size, seed=config.seed, interval=interval,
                                  batch_devices=config.batch_devices)
        self.history = History(meta={"config": config.to_json(), "plan_source": source,
                                     "num_blocks": len(self.blocks), "block_names": self.block_names,
                                     "target_accuracy": config.target_accuracy})
        self.history.events.append({"round": 0, "event": "plan", "source": source, "cuts": cuts, "interval": interval})
        self.start_round = 0
        self.last_replan = 0
        self.wall_offset = 0.0

    def _initial_plan(self) -> tuple[list[int], int, str]:
        c, L = self.config, len(self.blocks)
        if c.cuts is not None:
            return list(c.cuts), c.interval or 1, "cuts"
        if c.plan_path is not None and not c.replan_every:
            from adaptplan.plan import Plan
            plan = Plan.load(c.plan_path)
            if len(plan.cuts) != c.devices:
                raise InputError(f"plan has {len(plan.cuts)} cuts but devices = {c.devices}", field="plan.cuts")
            return list(plan.cuts), c.interval or plan.interval, "plan"
        try:
            cuts, interval = self.planner(ReplanRequest(0, self.clock.system(1), self.profile, [], 1))
        except (ImportError, InputError) as exc:
            if c.replan_every:
                raise InputError(f"re-planning needs a working planner, but planning failed: {exc}", field="replan_every") from None
            return [math.ceil(L / 2)] * c.devices, c.interval or 1, f"default (planner unavailable: {exc})"
        if c.algorithm == "sl" and len(set(cuts)) > 1:
            cuts = [max(cuts)] * c.devices          # one client model for all devices
        return list(cuts), c.interval or interval, "planner"

    # ---- checkpoint ---------------------------------------------------------------------------------------
    def state_dict(self, round_index: int, wall: float) -> dict[str, Any]:
        return {"round": round_index, "engine": self.engine.state_dict(), "torch_rng": torch.get_rng_state(),
                "numpy_rng": np.random.get_state(), "clock_seconds": self.clock.seconds, "last_replan": self.last_replan,
                "wall_seconds": wall, "history": self.history.to_json(), "config": self.config.to_json(),
                "partitions": [p.copy() for p in self.engine.data.parts]}

    def resume(self) -> None:
        """Continue from ``config.out/checkpoint.pt``: the options that shape the run must match."""
        if not self.config.out:
            raise InputError("--resume needs --out (the run folder holding checkpoint.pt)", field="resume")
        state = load_checkpoint(self.config.out)
        saved, now = state["config"], self.config.to_json()
        for key in now:
            if key in ("rounds", "resume", "progress", "out", "checkpoint_every", "threads", "target_accuracy", "eval_every"):
                continue
            if saved.get(key) != now[key]:
                raise InputError(f"differs from the checkpointed run ({saved.get(key)!r} vs {now[key]!r})", field=key)
        self.engine.data.parts = [np.asarray(p) for p in state["partitions"]]
        self.engine.load_state_dict(state["engine"])
        torch.set_rng_state(state["torch_rng"])
        np.random.set_state(state["numpy_rng"])
        self.clock.seconds = float(state["clock_seconds"])
        self.last_replan = int(state["last_replan"])
        self.wall_offset = float(state["wall_seconds"])
        self.history = History.from_json(state["history"])
        self.history.meta["config"] = now
        self.start_round = int(state["round"])

    # ---- the loop -----------------------------------------------------------------------------------------
    def run(self) -> History:
        c, engine = self.config, self.engine
        if c.resume:
            self.resume()
        bar = None
        if c.progress:
            from tqdm import tqdm
            bar = tqdm(total=c.rounds, initial=self.start_round, unit="round", dynamic_ncols=True)
        t0 = time.perf_counter()
        try:
            for t in range(self.start_round + 1, c.rounds + 1):
                cuts_in_force, interval_in_force = list(engine.cuts), engine.interval
                stats = engine.run_round(t)
                replanned = self._maybe_replan(t, stats.aggregated)
                round_seconds = self.clock.charge(t, cuts_in_force, stats.aggregated, self.strategy)
                acc = test_loss = None
                if t % c.eval_every == 0:
                    acc, test_loss = self.evaluate()
                wall = self.wall_offset + time.perf_counter() - t0
                self.history.append(RoundRecord(t, stats.loss, acc, test_loss, self.clock.seconds, round_seconds, wall,
                                                stats.bytes_up, stats.bytes_down, stats.bytes_server, stats.aggregated,
                                                replanned, cuts_in_force, interval_in_force))
                if c.checkpoint_every and c.out and t % c.checkpoint_every == 0:
                    save_checkpoint(self.state_dict(t, wall), c.out)
                if bar is not None:
                    last = self.history.final_accuracy
                    bar.set_postfix_str(f"acc={last if last is None else f'{last:.3f}'} sim={self.clock.seconds:.1f}s")
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        last = self.history.records[-1] if self.history.records else None
        if last is not None and last.accuracy is None:
            # final evaluation of a run that does not end on an eval round: kept out of the records so
            # that a run interrupted there and resumed has exactly the records of an uninterrupted one
            acc, test_loss = self.evaluate()
            self.history.meta["final_evaluation"] = {"round": last.round, "accuracy": acc, "test_loss": test_loss,
                                                     "sim_seconds": last.sim_seconds}
        else:
            self.history.meta.pop("final_evaluation", None)
        if c.out:
            self.history.save(c.out)
        return self.history

    def evaluate(self) -> tuple[float, float]:
        """Test accuracy and loss; the mean over the strategy's ``eval_models`` (one averaged model,
        or every device's model for PSL)."""
        results = [self.engine.evaluate(m, self.config.eval_batch_size) for m in self.strategy.eval_models(self.engine)]
        return float(np.mean([r[0] for r in results])), float(np.mean([r[1] for r in results]))

    def _maybe_replan(self, t: int, aggregated: bool) -> bool:
        """Algorithm 1: at an aggregation round, if Q rounds passed since the last re-plan, call the
        planner with the measured system of the next round and re-partition without losing state."""
        Q = self.config.replan_every
        if not Q or not aggregated or t - self.last_replan < Q or t >= self.config.rounds:
            return False
        request = ReplanRequest(t, self.clock.process.measured(t + 1), self.profile, list(self.engine.cuts), self.engine.interval)
        request = dataclasses.replace(request, system=dataclasses.replace(request.system, batch_size=self.config.batch_size))
        cuts, interval = self.planner(request)
        if self.config.algorithm == "sl" and len(set(cuts)) > 1:
            cuts = [max(cuts)] * len(cuts)
        old = (list(self.engine.cuts), self.engine.interval)
        self.engine.set_cuts(cuts)
        self.engine.interval = int(interval)
        self.last_replan = t
        self.history.events.append({"round": t, "event": "replan", "old_cuts": old[0], "old_interval": old[1],
                                    "cuts": list(cuts), "interval": int(interval)})
        return True


def run(config: TrainConfig, **kwargs: Any) -> History:
    """Run one training job; keyword arguments go to :class:`Trainer` (planner, system, constants, data)."""
    return Trainer(config, **kwargs).run()
