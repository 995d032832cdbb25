"""`adaptplan bench plans`: the planner's plan measured against the plans a user could have picked by hand.

For one setting (data set, model, devices, partition, the one training setting of every run) and several seeds, it
trains with AdaptSFL's algorithm

* the planner's plan: the default ``adaptplan train`` without ``--cuts``, planned once before round 1 (the built-in
  planner on round 1's generated system, docs/model.md §6.1's placeholder constants, γ = the learning rate); what it
  predicted (its rounds and eq. 26's seconds) is read from the run's first ``plan`` event;
* the calibrated planner: the same planner with the run's constants estimated from its model and data and fitted to
  two pilots (``train --pilots``, docs/model.md §10), which are two of the grid's runs of the same seed: every device at
  the deepest cut the planner may choose (L − 1) at the grid's smallest interval and at its largest interval that
  reached the target, the pair whose drift loads 4β²γ²A_{L_c}I² differ most; its prediction is to the target
  accuracy, and the same fit predicts every fixed plan's time too (:func:`attach_fit`);
* the calibrated planner linear in I: rounds to the target R(I) = R₁(1 + κ(I − 1)) fitted to the same two pilots,
  the same at every cut, and at each I the latency-best cuts (:mod:`adaptplan.linear_rounds`, docs/model.md §12);
  the bench plans it on the seed's round-1 system and trains it as a fixed plan; its law predicts every fixed plan
  too (``linear_fit_by_seed`` in the JSON);
* the calibrated planner linear per cut: each cut its own law R_j(I) = R₁(j)(1 + κ_j(I − 1)) across the intervals
  it was piloted at, R(x, I) = max_i R_{x_i}(I) (:class:`adaptplan.linear_rounds.PerCutRounds`), fitted to the grid's
  runs of the seed with every device at each cut at I = 1 and of the cut fastest there at the grid's largest interval
  that reached the target (:func:`per_cut_pilots`), planned and trained as the previous one (``per_cut_fit_by_seed``);
* a grid of fixed plans: every device at cut j, for each cut point j of the model, × each interval I of the grid;
  and each device at its own latency-best cut for that I (:func:`latency_best_cuts`) × each I;

under a leakage budget (``--leakage-table``, ``--max-leakage``: one limit for every device or one each) the grid's
one-cut plans and the pilots keep to the cuts every device may use (:meth:`BenchSetting.allowed_cuts`), each device's
latency-best cut to its own (:meth:`BenchSetting.device_cuts`), and every planner plans within it, so the planners are
measured against the plans a user could pick under the same budget;

through the benchmarks' job runner (:func:`adaptplan.benches.runs.run_jobs`), and ranks them by the simulated
seconds to a target test accuracy, interpolated between evaluations (:func:`time_to_target`). Times are simulated
seconds (the latency model's clock), accuracies fractions.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from adaptplan.benches.runs import RunResult, not_reached, run_jobs
from adaptplan.benches.workload import Workload
from adaptplan.constants import ConvergenceConstants
from adaptplan.crossing import first_crossing
from adaptplan.defence_cost import DefenceSetting, head_cuts
from adaptplan.errors import InputError
from adaptplan.latency import LatencyModel, total_latency
from adaptplan.linear_rounds import RoundsLaw, as_plan, fit_rounds_law, score
from adaptplan.model_profile import ModelProfile
from adaptplan.report import Empty, format_table
from adaptplan.system import SystemSpec
from solvers.leakage_budget import LeakageBudget, check_every_device_within

DEFAULT_INTERVALS = (1, 2, 4, 8)
DEFAULT_SEEDS = (0, 1, 2)
ALGORITHM = "adaptsfl"
"""Every plan trains AdaptSFL's algorithm (heterogeneous cuts, client models averaged every I rounds)."""

INTERPOLATION_NOTE = ("time to target: simulated seconds at which the test accuracy first reaches the target, "
                      "linearly interpolated between the evaluation before the crossing and the one at or after it; "
                      "'≤' marks a run already at the target at its first evaluation (no earlier evaluation to "
                      "interpolate from: that evaluation's time, an upper bound). rounds→target: the round of the "
                      "first evaluation at or above the target. Mean over seeds, spread min–max.")


# ---- the plans -----------------------------------------------------------------------------------------------

PLANNERS = {"planner": "planner", "calibrated": "calibrated planner", "linear": "calibrated, linear in I",
            "per_cut": "calibrated, linear per cut"}
"""The kinds of plan the planner makes (their labels): the paper's, the one calibrated on pilots (eq. 15), the one
whose rounds are linear in I (:mod:`adaptplan.linear_rounds`) and the one whose R₁ is measured per cut."""

@dataclass(frozen=True)
class PlanSpec:
    """One plan of the bench: ``kind`` is ``"planner"`` (cuts and I its own), ``"calibrated"`` (the planner's, with
    constants fitted to pilots), ``"uniform"`` (every device at cut ``cut``) or ``"latency-best"`` (each device at its
    own cut, ``cuts``); ``interval`` I in rounds (None: the planner's)."""

    kind: str
    interval: int | None = None
    cut: int | None = None                     # 1-based cut index of every device ("uniform")
    cuts: tuple[int, ...] | None = None        # 1-based cut per device ("uniform", "latency-best")

    @property
    def label(self) -> str:
        """Its name in the table and the JSON: ``planner``, ``cut 2, I=4``, ``latency-best, I=4``."""
        if self.kind in PLANNERS:
            return PLANNERS[self.kind]
        head = f"cut {self.cut}" if self.kind == "uniform" else "latency-best"
        return f"{head}, I={self.interval}"

    @property
    def slug(self) -> str:
        """Its run folder's name: ``planner``, ``cut2-I4``, ``latency-best-I4``."""
        if self.kind in PLANNERS:
            return self.kind
        return f"cut{self.cut}-I{self.interval}" if self.kind == "uniform" else f"latency-best-I{self.interval}"


def latency_best_cuts(model: LatencyModel, interval: int, cuts: Sequence[int] | None = None,
                      per_device: Sequence[Sequence[int]] | None = None) -> list[int]:
    """Each device's latency-best cut (1-based) for aggregation interval ``interval`` I: the cut j that minimises
    that device's mean per-round latency over one aggregation period, eq. (26) over I rounds divided by I, i.e.
    T_split + T_agg / I (docs/model.md §2.4: its forward, upload, share of the server stage, download and backward
    every round, its model upload and download every I rounds; seconds), with the latency model of ``model``'s
    system on that device alone, among ``cuts`` (default every cut point), or device i among ``per_device[i]`` (each
    device's own budget). Ties go to the shallower cut."""
    best = []
    for i, device in enumerate(model.system.devices):
        mine = per_device[i] if per_device is not None else cuts
        allowed = np.asarray(mine if mine is not None else range(1, model.num_cuts + 1))
        vectors = allowed[:, None]                                  # one single-device cut vector per cut
        alone = LatencyModel(model.profile, replace(model.system, devices=(device,)))
        t_split, t_agg = alone.stage_latencies(vectors)
        per_round = [total_latency(interval, interval, float(ts), float(ta)) / interval for ts, ta in zip(t_split, t_agg)]
        best.append(int(allowed[int(np.argmin(per_round))]))
    return best


def grid_cuts(num_cuts: int, head: int = 0) -> list[int]:
    """The cuts the grid trains at: 1..L, or under a U-shaped split of a ``head`` of K blocks the ones that leave the
    edge server a block before it, 1..L − K − 1 (:func:`adaptplan.defence_cost.head_cuts`)."""
    return head_cuts(num_cuts, head) if head else list(range(1, num_cuts + 1))


def plan_grid(cuts: Sequence[int], intervals: Sequence[int], latency_best: Mapping[int, Sequence[int]]) -> list[PlanSpec]:
    """The bench's plans: the planner's, then every device at cut j for each j of ``cuts`` (the bench's
    :meth:`BenchSetting.allowed_cuts`) × each I of ``intervals``, then each I with ``latency_best[I]`` (one cut per
    device, :func:`latency_best_cuts`)."""
    devices = len(latency_best[intervals[0]])
    plans = [PlanSpec("planner")]
    plans += [PlanSpec("uniform", interval, cut, (cut,) * devices) for cut in cuts for interval in intervals]
    plans += [PlanSpec("latency-best", interval, None, tuple(int(c) for c in latency_best[interval]))
              for interval in intervals]
    return plans


def pilot_plans(cuts: Sequence[int], num_cuts: int, intervals: Sequence[int], devices: int) -> list[PlanSpec]:
    """The calibrated planner's candidate pilots (module docstring): every device at the deepest of ``cuts`` (the
    bench's allowed cuts) below L (L − 1 of every cut; under a U-shaped split of K blocks L − K − 1; under a budget the
    deepest within it; cut L where it is the only one), at each interval of ``intervals`` from the smallest up."""
    cut = max([c for c in cuts if c < num_cuts] or cuts)
    return [PlanSpec("uniform", interval, cut, (cut,) * devices) for interval in sorted(intervals)]


@dataclass(frozen=True)
class BenchSetting(Workload):
    """What every run of the bench trains on besides its plan and seed (:class:`adaptplan.benches.workload.Workload`),
    evaluated every 5 rounds by default (the time to target is interpolated between evaluations)."""

    eval_every: int = 5
    leakage_table: str | None = None
    max_leakage: str | None = None
    """A leakage budget over ``leakage_table`` (``METRIC=LIMIT`` for every device or ``METRIC=L0,L1,…``; None: none)."""

    def run_config(self, seed: int, plan: PlanSpec | None = None) -> dict[str, Any]:
        """TrainConfig flat keys of ``plan``'s run with ``seed`` (the planner's without ``plan``; a planner's run
        plans within the leakage budget)."""
        config = self.config(ALGORITHM, seed, planned=True)
        if plan is not None and plan.kind not in PLANNERS:
            config.update(cuts=list(plan.cuts or ()), interval=plan.interval)
        elif plan is not None and self.max_leakage is not None:
            config.update(leakage_table=self.leakage_table, max_leakage=self.max_leakage)
        return config

    def budget(self, profile: ModelProfile) -> LeakageBudget | None:
        """The leakage budget over ``profile``'s cuts (None without), its table checked against the model and the
        bench's defence setting."""
        if self.max_leakage is None or self.leakage_table is None:
            return None
        defence = DefenceSetting.parse(self.defence, "--defence").name if self.defence != "none" else "none"
        return LeakageBudget.from_table(self.leakage_table, self.max_leakage, profile, self.devices, defence,
                                        "--leakage-table")[0]

    def device_cuts(self, profile: ModelProfile, budget: LeakageBudget | None) -> list[list[int]]:
        """Each device's cuts: :func:`grid_cuts`, and of them those within its own leakage ``budget`` (the bench's,
        :meth:`budget`) where there is one (InputError naming --max-leakage for a device it admits none, as the
        planner says it)."""
        cuts = grid_cuts(profile.num_cuts, self.head)
        if budget is None:
            return [cuts] * self.devices
        admitted = budget.admissible(self.devices, profile.num_cuts)
        try:
            check_every_device_within(budget, admitted, np.asarray(cuts), None)
        except InputError as exc:
            raise InputError(exc.message, field="--max-leakage") from None
        return [[c for c in cuts if admitted[i, c - 1]] for i in range(self.devices)]

    def allowed_cuts(self, profile: ModelProfile) -> list[int]:
        """The cuts of the grid's plans that put every device at one cut (:meth:`shared_cuts` of
        :meth:`device_cuts`)."""
        return self.shared_cuts(self.device_cuts(profile, self.budget(profile)))

    def shared_cuts(self, per_device: Sequence[Sequence[int]]) -> list[int]:
        """The cuts of ``per_device`` (each device's, :meth:`device_cuts`) every device may use (InputError naming
        --max-leakage when there is none)."""
        shared = [c for c in per_device[0] if all(c in mine for mine in per_device)]
        if not shared:
            raise InputError(f"no cut is within every device's budget ({self.max_leakage}): the grid's plans that put "
                             "every device at one cut need one; give the strictest devices a looser limit",
                             field="--max-leakage")
        return shared

    def describe(self, seeds: Sequence[int]) -> list[str]:
        """The lines printed above the table: the data, the training setting, the plans, the measure."""
        partition = self.partition + (f" (α = {self.alpha:g})" if self.partition.startswith("dirichlet") else "")
        setting = self.setting.describe().replace("each algorithm's own", "each plan's I")
        model = self.model + (f" (width {self.model_width})" if self.model_width else "")
        defended = "" if self.defence == "none" else f", every device defending its activations: {self.defence}"
        if self.max_leakage is not None:
            defended += (f", every plan within the leakage budget {self.max_leakage} of {self.leakage_table} (the grid "
                         "at the cuts within it)")
        pilot = f"L − {self.head + 1}, the deepest before the head" if self.head else "L − 1"
        pilot = "the deepest within the budget" if self.max_leakage is not None else pilot
        return [f"bench plans: {model} on {self.dataset}, {self.devices} devices, {partition} partition, "
                f"seeds {','.join(map(str, seeds))}, target {self.target:.0%}{defended}",
                f"  setting — {setting}",
                f"  every plan trains {ALGORITHM}; the planner planned once before round 1 (round 1's generated "
                "system, placeholder constants, γ = lr); the calibrated planner the same with constants estimated from "
                f"the run and fitted to two pilots of the grid (every device at cut {pilot}, the smallest and the "
                "largest I; its predictions are to the target); the planner linear in I the rounds R₁(1 + κ(I − 1)) fitted to "
                "the same pilots, latency-best cuts at each I, I up to the pilots' longest (docs/model.md §12); "
                "the planner linear per cut a law per cut, fitted to the grid's runs of every cut at I = 1 and of the "
                "cut fastest there at the largest I that reached the target, each cut only across its pilots' "
                "intervals, as slow as its slowest cut (§12 \"Per cut\"); "
                "the system trace is the same in every seed; "
                f"evaluation every {self.eval_every} rounds on "
                f"{'every' if self.test_samples is None else self.test_samples} test samples",
                f"  {INTERPOLATION_NOTE}"]


@dataclass(frozen=True)
class Probe:
    """What the bench needs of a seed's setting before any run: the model's profile, round 1's system (the one the
    planners plan on), each I's latency-best cuts, the cuts the grid may put every device at
    (:meth:`BenchSetting.allowed_cuts`) and the leakage budget (None: none)."""

    profile: ModelProfile
    system: SystemSpec
    latency_best: dict[int, list[int]]
    cuts: list[int]
    leakage: LeakageBudget | None = None

    def predict(self, constants: ConvergenceConstants, cuts: Sequence[int], interval: int) -> tuple[int, float] | None:
        """(⌈R⌉ of eq. 15, eq. 26's seconds) of the plan (``cuts``, ``interval``) under ``constants`` on this
        setting; None where the plan cannot reach the target under them (c − dI² ≤ 0)."""
        from adaptplan.errors import InfeasibleError
        from adaptplan.planner import Planner

        try:
            plan = Planner(self.profile, self.system, constants).evaluate(cuts, interval)
        except InfeasibleError:
            return None
        return plan.rounds, plan.total_latency_s


def probe(bench: BenchSetting, seed: int, intervals: Sequence[int]) -> Probe:
    """The :class:`Probe` of ``bench``'s run with ``seed``: from a trainer built as the runs build theirs (nothing
    trained), on round 1's system."""
    from trainers.config.train_config import TrainConfig
    from trainers.run.driver import Trainer

    config = {**bench.run_config(seed), "rounds": 1, "cuts": [1], "interval": 1}
    trainer = Trainer(TrainConfig.flat(**config))
    model = trainer.clock.latency_model(1)
    budget = bench.budget(trainer.profile)
    per_device = bench.device_cuts(trainer.profile, budget)
    return Probe(trainer.profile, trainer.clock.system(1),
                 {interval: latency_best_cuts(model, interval, per_device=per_device) for interval in intervals},
                 bench.shared_cuts(per_device), budget)


def grid_jobs(bench: BenchSetting, seeds: Sequence[int], cuts: Sequence[int],
              latency_best: Mapping[int, Mapping[int, Sequence[int]]], intervals: Sequence[int],
              runs_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """One :func:`~adaptplan.benches.runs.run_jobs` job per (seed, plan of :func:`plan_grid` over ``cuts``), each run
    in ``runs_dir/seed<s>/<plan slug>``; ``latency_best[seed][I]``: the latency-best cuts."""
    jobs = []
    for seed in seeds:
        for plan in plan_grid(cuts, intervals, latency_best[seed]):
            jobs.append({"group": "plans", "label": plan.label, "seed": seed, "plan": plan, "target": bench.target,
                         "config": bench.run_config(seed, plan),
                         "folder": str(Path(runs_dir) / f"seed{seed}" / plan.slug)})
    return jobs


def _config_key(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, default=list)


def run_grid(jobs: Sequence[dict[str, Any]], workers: int | None = None, progress: bool = True) -> list[RunResult]:
    """Each job's :class:`RunResult`, in order; jobs of the same setting (a latency-best plan whose cuts are all the
    same cut j is the plan of cut j) train once."""
    unique: dict[str, dict[str, Any]] = {}
    for job in jobs:
        unique.setdefault(_config_key(job["config"]), job)
    runnable = [{k: v for k, v in job.items() if k not in ("plan", "prediction")} for job in unique.values()]
    done = dict(zip(unique, run_jobs(runnable, workers, "bench plans", progress)))
    return [replace(done[_config_key(job["config"])], label=job["label"]) for job in jobs]


# ---- time to target --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Crossing:
    """When a run first reached the target: ``seconds`` simulated; ``upper_bound`` where it was already there at its
    first evaluation (no earlier evaluation to interpolate from)."""

    seconds: float
    upper_bound: bool = False


def time_to_target(curve: Sequence[tuple[float, float]], target: float) -> Crossing | None:
    """The simulated seconds at which the accuracy of ``curve`` ((simulated s, accuracy) per evaluation, in order)
    first reaches ``target``, interpolated as :func:`adaptplan.crossing.first_crossing` does; None when no
    evaluation reaches it."""
    found = first_crossing([(accuracy, seconds) for seconds, accuracy in curve], target)
    return None if found is None else Crossing(found.at[0], found.upper_bound)


@dataclass
class Prediction:
    """What the planner predicted for its plan (its first ``plan`` event): the cuts and I it chose, its rounds and
    eq. 26's total seconds: to the target accuracy where ``calibrated`` (the history's ``meta.calibration``, whose
    fitted constants ``constants`` also are), else to an ε-stationary point of its constants."""

    cuts: list[int]
    interval: int
    rounds: int | None
    latency_s: float | None
    calibrated: bool = False
    constants: dict[str, Any] | None = None


def read_prediction(folder: str | os.PathLike) -> Prediction | None:
    """The planner's :class:`Prediction` from the first ``plan`` event of the run in ``folder`` (its history.json);
    None where there is no such history. Rounds and seconds are None where the run fell back to the default plan."""
    from trainers.run.history import History

    path = Path(folder) / "history.json"
    if not path.exists():
        return None
    history = History.load(path)
    event = next((e for e in history.events if e.get("event") == "plan"), None)
    if event is None:
        return None
    plan = event.get("plan") or {}
    calibration = history.meta.get("calibration")
    return Prediction([int(c) for c in event["cuts"]], int(event["interval"]), plan.get("rounds"),
                      plan.get("total_latency_s"), calibration is not None,
                      calibration.get("constants") if calibration else None)


@dataclass
class PlanResult:
    """One plan over the seeds: its runs and each run's :class:`Crossing` (None: not reached); for the planner, the
    plan it chose and what it predicted, per seed."""

    plan: PlanSpec                              # the first seed's (a latency-best plan's cuts may differ by seed)
    runs: dict[int, RunResult]
    target: float
    predictions: dict[int, Prediction | None] = field(default_factory=dict)
    seed_cuts: dict[int, list[int]] = field(default_factory=dict)     # a fixed plan's cuts per seed (default: plan's)
    fit: dict[int, tuple[int, float] | None] = field(default_factory=dict)   # per seed: the calibrated fit's (⌈R⌉, s)
    linear_fit: dict[int, tuple[int, float]] = field(default_factory=dict)  # per seed: the linear law's (⌈R⌉, s)
    per_cut_fit: dict[int, tuple[int, float]] = field(default_factory=dict)  # per seed: the law per cut's (⌈R⌉, s)

    def predicted(self) -> tuple[float | None, float | None, str]:
        """(mean predicted seconds, mean predicted rounds, what to): a planner's own prediction, else the calibrated
        fit's for this plan, over the seeds; Nones where a seed has none."""
        if self.plan.kind in PLANNERS:
            pairs = [(p.latency_s, p.rounds) if p else (None, None) for p in self.predictions.values()]
            to = "ε" if self.plan.kind == "planner" else "target"
        else:
            pairs = [(f[1], f[0]) if f else (None, None) for f in self.fit.values()]
            to = "target"
        if not pairs or any(x is None or r is None for x, r in pairs):
            return None, None, to
        return statistics.fmean(x for x, _ in pairs if x is not None), \
            statistics.fmean(r for _, r in pairs if r is not None), to

    @property
    def crossings(self) -> dict[int, Crossing | None]:
        return {seed: time_to_target(r.curve, self.target) for seed, r in self.runs.items()}

    @property
    def times(self) -> list[float] | None:
        """Each seed's simulated seconds to target, or None unless every seed reached it."""
        found = list(self.crossings.values())
        return None if any(c is None for c in found) else [c.seconds for c in found if c is not None]

    @property
    def mean_s(self) -> float | None:
        """Mean simulated seconds to target over the seeds (None unless every seed reached it)."""
        times = self.times
        return statistics.fmean(times) if times else None

    @property
    def upper_bound(self) -> bool:
        """Some seed reached the target at its first evaluation (its time an upper bound)."""
        return any(c is not None and c.upper_bound for c in self.crossings.values())

    @property
    def mean_rounds(self) -> float | None:
        """Mean rounds to the target, interpolated between evaluations (None unless every seed reached it)."""
        rounds = [r.rounds_to_target for r in self.runs.values()]
        return None if any(r is None for r in rounds) else statistics.fmean(r for r in rounds if r is not None)

    def why_missing(self) -> str:
        """Why the mean is empty: the seeds that missed and the first one's reason."""
        missed = [seed for seed, c in self.crossings.items() if c is None]
        if not missed:
            return ""
        reason = not_reached(self.runs[missed[0]], self.target)
        return f"not reached in seed{'s' if len(missed) > 1 else ''} {','.join(map(str, missed))}: {reason}"

    def cuts_by_seed(self) -> dict[int, list[int] | None]:
        """The cut vector each seed's run started with."""
        if self.plan.kind not in PLANNERS:
            return {seed: self.seed_cuts.get(seed, list(self.plan.cuts or ())) for seed in self.runs}
        return {seed: (p.cuts if p else None) for seed, p in self.predictions.items()}

    def intervals_by_seed(self) -> dict[int, int | None]:
        if self.plan.kind not in PLANNERS:
            return {seed: self.plan.interval for seed in self.runs}
        return {seed: (p.interval if p else None) for seed, p in self.predictions.items()}


def collect(jobs: Sequence[dict[str, Any]], results: Sequence[RunResult], target: float) -> list[PlanResult]:
    """The jobs' results grouped by plan label (in the jobs' order; a latency-best plan's cuts kept per seed), the
    planner's with its predictions read from its runs' folders."""
    grouped: dict[str, PlanResult] = {}
    for job, result in zip(jobs, results):
        plan: PlanSpec = job["plan"]
        entry = grouped.setdefault(plan.label, PlanResult(plan, {}, target))
        entry.runs[job["seed"]] = result
        if plan.kind in PLANNERS:
            entry.predictions[job["seed"]] = job["prediction"] if "prediction" in job else read_prediction(job["folder"])
        else:
            entry.seed_cuts[job["seed"]] = list(plan.cuts or ())
    return list(grouped.values())


# ---- ranking -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Standing:
    """A plan's place: ``rank`` 1-based among all ``of`` plans by mean seconds to target (ties share the better
    rank; plans that missed the target in a seed rank after every plan that reached it and get None), and its mean
    as a multiple of the best fixed plan's (``best``: that plan's label)."""

    rank: int | None
    of: int
    ratio: float | None
    best: str | None


def standing(result: PlanResult, results: Sequence[PlanResult]) -> Standing:
    """``result``'s :class:`Standing` among ``results``."""
    fixed = [r for r in results if r.plan.kind not in PLANNERS and r.mean_s is not None]
    best = min(fixed, key=lambda r: r.mean_s if r.mean_s is not None else float("inf"), default=None)
    mine = result.mean_s
    if mine is None:
        return Standing(None, len(results), None, best.plan.label if best else None)
    rank = 1 + sum(1 for r in results if r.mean_s is not None and r.mean_s < mine)
    ratio = mine / best.mean_s if best is not None and best.mean_s else None
    return Standing(rank, len(results), ratio, best.plan.label if best else None)


# ---- output --------------------------------------------------------------------------------------------------

def show_cuts(cuts: Sequence[int] | None) -> str:
    """A cut vector for the table: ``all 2``, the vector for ≤ 8 devices, else counts (``2×15, 3×5``)."""
    if not cuts:
        return "-"
    if len(set(cuts)) == 1:
        return f"all {cuts[0]}"
    if len(cuts) <= 8:
        return ",".join(map(str, cuts))
    return ", ".join(f"{c}×{list(cuts).count(c)}" for c in sorted(set(cuts)))


def _same(values: dict[int, Any]) -> Any:
    """The one value every seed has, else None."""
    distinct = {json.dumps(v) for v in values.values()}
    return next(iter(values.values())) if len(distinct) == 1 else None


def table(results: Sequence[PlanResult], bench: BenchSetting, seeds: Sequence[int], missing: Sequence[str] = ()) -> str:
    """The setting, then one row per plan: cuts, I, mean seconds to target (min–max), mean rounds to target, seeds
    that reached it, rank among all plans, × the best fixed plan, and what was predicted (a planner's own prediction,
    a fixed plan's by the calibrated fit) with predicted/measured; under it why a cell is empty, then each planner's
    standing in one line, and ``missing``: why a planner has no row."""
    headers = ["plan", "cuts", "I", "s→target", "min–max s", "rounds→target", "reached", "rank", "× best fixed",
               "predicted s", "predicted rounds", "predicted/measured"]
    rows = [_row(r, results) for r in results]
    lines = bench.describe(seeds) + [format_table(headers, rows)]
    lines += [summary(r, results) for r in results if r.plan.kind in PLANNERS]
    lines += list(missing)
    return "\n".join(lines)


def _row(r: PlanResult, results: Sequence[PlanResult]) -> list[str]:
    why = r.why_missing()
    place = standing(r, results)
    times = r.times
    cuts, interval = _same(r.cuts_by_seed()), _same(r.intervals_by_seed())
    mark = "≤" if r.upper_bound else ""
    rank: str = Empty(why) if place.rank is None else f"{place.rank} of {place.of}"
    if place.ratio is not None:
        ratio: str = f"{place.ratio:.2f}"
    else:
        ratio = Empty(why or "no fixed plan reached the target in every seed")
    seconds, rounds, to = r.predicted()
    if r.plan.kind == "planner":
        no_prediction = "the planner's prediction is missing in a seed (fallback plan)"
    elif r.plan.kind in PLANNERS:
        no_prediction = f"the {r.plan.label} planner's prediction is missing in a seed"
    else:
        no_prediction = "no calibrated fit (no calibrated planner run), or the fit says the plan cannot reach the target"
    mark_to = "" if to == "target" else " (to ε)"
    forecast = [Empty(no_prediction) if seconds is None else f"{seconds:.3g}{mark_to}",
                Empty(no_prediction) if rounds is None else f"{rounds:.4g}{mark_to}",
                Empty(no_prediction if seconds is None else why) if seconds is None or r.mean_s is None
                else f"{seconds / r.mean_s:.2f}"]
    return [r.plan.label,
            Empty("differs by seed (results JSON)") if cuts is None else show_cuts(cuts),
            Empty("differs by seed (results JSON)") if interval is None else str(interval),
            Empty(why) if r.mean_s is None else f"{mark}{r.mean_s:.3g}",
            Empty(why) if times is None else f"{min(times):.3g}–{max(times):.3g}",
            Empty(why) if r.mean_rounds is None else f"{r.mean_rounds:.3g}",
            f"{sum(c is not None for c in r.crossings.values())}/{len(r.runs)}",
            rank, ratio, *forecast]


def summary(planner: PlanResult, results: Sequence[PlanResult]) -> str:
    """One line: a planner's rank and ratio to the best fixed plan, beside what it predicted."""
    place = standing(planner, results)
    best = next((r for r in results if r.plan.label == place.best), None)
    seconds, rounds, to = planner.predicted()
    name = planner.plan.label
    if seconds is None or rounds is None:
        said = "its prediction is missing in a seed"
    elif to == "target":
        said = f"it predicted {rounds:.4g} rounds, {seconds:.3g} s to the target (mean over seeds, calibrated)"
    else:
        said = (f"it predicted {rounds:.4g} rounds, {seconds:.3g} s (eq. 26: to an ε-stationary point of its "
                "constants, not to the target)")
    if place.rank is None:
        return f"{name}: {planner.why_missing()}; {said}"
    measured = f"measured {planner.mean_s:.3g} s, {planner.mean_rounds:.3g} rounds to target"
    versus = (f"{place.ratio:.2f}× the best fixed plan ({place.best}: {best.mean_s:.3g} s)"
              if place.ratio is not None and best is not None and best.mean_s is not None
              else "no fixed plan reached the target in every seed")
    return f"{name}: rank {place.rank} of {place.of}, {versus}; {measured}; {said}"


def to_json(results: Sequence[PlanResult], bench: BenchSetting, seeds: Sequence[int],
            intervals: Sequence[int]) -> dict[str, Any]:
    """The bench as JSON: the setting, the measure, and per plan its cuts and I per seed, each run's time to
    target, rounds, final accuracy and accuracy curve, the mean and spread, its rank and ratio, what was predicted
    (a planner's predictions per seed; a fixed plan's by the calibrated fit per seed)."""
    plans = []
    for r in results:
        place = standing(r, results)
        crossings = r.crossings
        seconds, rounds, to = r.predicted()
        plans.append({
            "label": r.plan.label, "kind": r.plan.kind, "interval": r.plan.interval,
            "cuts_by_seed": {str(s): c for s, c in r.cuts_by_seed().items()},
            "interval_by_seed": {str(s): i for s, i in r.intervals_by_seed().items()},
            "mean_time_to_target_s": r.mean_s, "min_time_to_target_s": min(r.times) if r.times else None,
            "max_time_to_target_s": max(r.times) if r.times else None, "mean_rounds_to_target": r.mean_rounds,
            "upper_bound": r.upper_bound, "not_reached": r.why_missing() or None,
            "rank": place.rank, "of": place.of, "ratio_to_best_fixed": place.ratio,
            "mean_predicted_s": seconds, "mean_predicted_rounds": rounds, "predicted_to": to,
            "predicted_over_measured": seconds / r.mean_s if seconds is not None and r.mean_s else None,
            "runs": [{"seed": s, "time_to_target_s": c.seconds if c else None,
                      "upper_bound": bool(c and c.upper_bound), "rounds_to_target": run.rounds_to_target,
                      "final_accuracy": run.final_accuracy, "rounds": run.rounds, "sim_seconds": run.sim_seconds,
                      "diverged_round": run.diverged_round, "curve": [list(p) for p in run.curve]}
                     for s, run in r.runs.items() for c in [crossings[s]]],
            **({"predictions": {str(s): (vars(p) if p else None) for s, p in r.predictions.items()}}
               if r.plan.kind in PLANNERS else
               {"fit_by_seed": {str(s): (list(f) if f else None) for s, f in r.fit.items()},
                "linear_fit_by_seed": {str(s): list(f) for s, f in r.linear_fit.items()},
                "per_cut_fit_by_seed": {str(s): list(f) for s, f in r.per_cut_fit.items()}})})
    standings = {r.plan.kind: standing(r, results) for r in results if r.plan.kind in PLANNERS}
    return {"target_accuracy": bench.target, "time_to_target": INTERPOLATION_NOTE, "seeds": list(seeds),
            "intervals": list(intervals), "algorithm": ALGORITHM,
            "data": {"dataset": bench.dataset, "model": bench.model, "model_width": bench.model_width,
                     "devices": bench.devices, "partition": bench.partition, "alpha": bench.alpha,
                     "eval_every": bench.eval_every, "test_samples": bench.test_samples},
            "setting": bench.setting.to_json(), "plans": plans,
            **{kind: {"rank": place.rank, "of": place.of, "ratio_to_best_fixed": place.ratio, "best_fixed": place.best}
               for kind, place in standings.items()}}


def save_json(results: Sequence[PlanResult], bench: BenchSetting, seeds: Sequence[int], intervals: Sequence[int],
              path: str | os.PathLike) -> None:
    """:func:`to_json` written (atomically) to ``path``."""
    from adaptplan.fileio import save_json as write

    write(to_json(results, bench, seeds, intervals), path)


def heat_grid(results: Sequence[PlanResult], intervals: Sequence[int]) -> tuple[list[str], np.ndarray]:
    """(row names, mean seconds to target, shape (rows, len(intervals)), NaN where not reached): a row per cut
    ``cut j`` in order, then ``latency-best``."""
    names = list(dict.fromkeys(r.plan.label.split(",")[0] for r in results if r.plan.kind not in PLANNERS))
    grid = np.full((len(names), len(intervals)), np.nan)
    for r in results:
        if r.plan.kind not in PLANNERS and r.plan.interval is not None and r.plan.interval in intervals \
                and r.mean_s is not None:
            grid[names.index(r.plan.label.split(",")[0]), list(intervals).index(r.plan.interval)] = r.mean_s
    return names, grid


def planner_cell(results: Sequence[PlanResult], intervals: Sequence[int], kind: str = "planner") -> tuple[int, int] | None:
    """(row, column) of the heat-map cell that is the plan of the planner of ``kind`` (:data:`PLANNERS`; its cuts and
    I the same in every seed), or None where its plan is not on the grid."""
    planner = next((r for r in results if r.plan.kind == kind), None)
    if planner is None:
        return None
    cuts, interval = _same(planner.cuts_by_seed()), _same(planner.intervals_by_seed())
    if cuts is None or interval not in intervals:
        return None
    names, _ = heat_grid(results, intervals)
    match = next((r for r in results if r.plan.kind not in PLANNERS and r.plan.interval == interval
                  and _same(r.cuts_by_seed()) == list(cuts)), None)
    return None if match is None else (names.index(match.plan.label.split(",")[0]), list(intervals).index(interval))


def plot(results: Sequence[PlanResult], intervals: Sequence[int], path: str | os.PathLike) -> None:
    """:func:`heat_map` written to ``path``."""
    import matplotlib.pyplot as plt

    fig = heat_map(results, intervals)
    fig.savefig(path)
    plt.close(fig)


def heat_map(results: Sequence[PlanResult], intervals: Sequence[int]) -> Any:
    """Heat-map (a matplotlib Figure): cut (rows, then the latency-best cuts) × I (columns), colour = mean simulated seconds to target,
    each cell's value written in it ("not reached" on grey); the planner's plan outlined in red and the calibrated
    planner's in orange (dashed) where they are on the grid, their figures in the title either way."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    names, grid = heat_grid(results, intervals)
    fig, ax = plt.subplots(figsize=(1.4 * len(intervals) + 3.0, 0.55 * len(names) + 2.2), layout="constrained")
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="0.85")
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, aspect="auto")
    finite = grid[np.isfinite(grid)]
    for (row, col), value in np.ndenumerate(grid):
        bright = finite.size and np.isfinite(value) and value > (finite.min() + finite.max()) / 2
        ax.text(col, row, "not\nreached" if np.isnan(value) else f"{value:.3g}", ha="center", va="center",
                fontsize=8, color="black" if bright or np.isnan(value) else "white")
    ax.set_xticks(range(len(intervals)), [str(i) for i in intervals])
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("aggregation interval I (rounds); latency-best: each device's own cut for that I")
    ax.set_ylabel("cut of every device")
    if finite.size:
        fig.colorbar(image, ax=ax, label="mean simulated s to target")
    titles = []
    for kind, colour, style, inset in (("planner", "red", "solid", 0.0), ("calibrated", "orange", "dashed", 0.08),
                                       ("linear", "magenta", "dotted", 0.16), ("per_cut", "cyan", "dashdot", 0.24)):
        planner = next((r for r in results if r.plan.kind == kind), None)
        if planner is None:
            continue
        cell = planner_cell(results, intervals, kind)
        if cell is not None:
            ax.add_patch(Rectangle((cell[1] - 0.5 + inset, cell[0] - 0.5 + inset), 1 - 2 * inset, 1 - 2 * inset,
                                   fill=False, edgecolor=colour, linestyle=style, linewidth=2.5))
        cuts, interval = _same(planner.cuts_by_seed()), _same(planner.intervals_by_seed())
        value = "not reached" if planner.mean_s is None else f"{planner.mean_s:.3g} s"
        where = f"{colour} box" if cell is not None else "not on the grid"
        by_seed = ", ".join(str(i) for i in planner.intervals_by_seed().values())
        titles.append(f"{planner.plan.label} (cuts {show_cuts(cuts) if cuts else 'vary'}, "
                      f"I = {interval or by_seed + ' by seed'}; {where}): {value}")
    if titles:
        ax.set_title("\n".join(titles), fontsize=9)
    return fig


# ---- the bench -----------------------------------------------------------------------------------------------

def pilot_pairs(bench: BenchSetting, seeds: Sequence[int], grid: Sequence[dict[str, Any]],
                results: Sequence[RunResult], cuts: Sequence[int], num_cuts: int,
                intervals: Sequence[int]) -> tuple[dict[int, tuple[str, str]], list[str]]:
    """({seed: the folders of its two pilots}, a line for each seed without). The pilots are two of the grid's runs of
    the seed at cut L − 1 (:func:`pilot_plans`): the smallest interval, and the largest interval whose run reached the
    target (the largest of the grid where it did; a longer one that never reached it has no rounds to fit)."""
    pairs, missing = {}, []
    candidates = [p.label for p in pilot_plans(cuts, num_cuts, intervals, bench.devices)]
    for seed in seeds:
        runs = {job["label"]: (job, result) for job, result in zip(grid, results)
                if job["seed"] == seed and job["label"] in candidates}
        reached = [label for label in candidates if time_to_target(runs[label][1].curve, bench.target) is not None]
        if candidates[0] not in reached or len(reached) < 2:
            missed = [candidates[0]] if candidates[0] not in reached else candidates[1:]
            missing.append(f"calibrated planners: no run in seed {seed}: their pilot{'s' if len(missed) > 1 else ''} "
                           f"{', '.join(missed)} did not reach {bench.target:.0%}")
            continue
        pairs[seed] = (runs[reached[0]][0]["folder"], runs[reached[-1]][0]["folder"])
    return pairs, missing


def calibrated_jobs(bench: BenchSetting, pairs: Mapping[int, tuple[str, str]],
                    runs_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """One job per seed of ``pairs`` (:func:`pilot_pairs`): the calibrated planner's run (``train --pilots``), in
    ``runs_dir/seed<s>/calibrated``."""
    plan = PlanSpec("calibrated")
    return [{"group": "plans", "label": plan.label, "seed": seed, "plan": plan, "target": bench.target,
             "config": {**bench.run_config(seed, plan), "pilots": ",".join(folders), "target_accuracy": bench.target},
             "folder": str(Path(runs_dir) / f"seed{seed}" / plan.slug)}
            for seed, folders in pairs.items()]


def per_cut_pilot_labels(seconds: Mapping[str, float], cuts: Sequence[int], intervals: Sequence[int],
                         target: float) -> tuple[list[str], str | None]:
    """(the labels of the planner per cut's pilots, None) or ([], why there are none), from one seed's runs that
    reached ``target`` (label → simulated seconds to it): every device at each of ``cuts`` at I = 1, then the cut among
    them that reached it soonest at the largest of ``intervals`` where it reached it too."""
    at_one = {j: PlanSpec("uniform", 1, j).label for j in cuts}
    reached = [j for j in cuts if at_one[j] in seconds]
    if not reached:
        return [], f"no cut reached {target:.0%} at I = 1"
    fastest = min(reached, key=lambda j: seconds[at_one[j]])
    longest = next((label for i in sorted(intervals, reverse=True) if i > 1
                    for label in [PlanSpec("uniform", i, fastest).label] if label in seconds), None)
    if longest is None:
        return [], f"cut {fastest}, the fastest at I = 1, reached {target:.0%} at no longer interval"
    return [at_one[j] for j in reached] + [longest], None


def per_cut_pilots(bench: BenchSetting, seeds: Sequence[int], grid: Sequence[dict[str, Any]],
                   results: Sequence[RunResult], cuts: Sequence[int],
                   intervals: Sequence[int]) -> tuple[dict[int, list[str]], list[str]]:
    """({seed: the folders of the planner per cut's pilots}, a line for each seed without): the grid's runs of the
    seed chosen by :func:`per_cut_pilot_labels` among ``cuts`` (the bench's allowed cuts)."""
    pilots, missing = {}, []
    for seed in seeds:
        runs = {job["label"]: (job["folder"], crossing.seconds) for job, result in zip(grid, results)
                if job["seed"] == seed for crossing in [time_to_target(result.curve, bench.target)]
                if crossing is not None}
        labels, why = per_cut_pilot_labels({label: s for label, (_, s) in runs.items()},
                                           cuts, intervals, bench.target)
        if why is not None:
            missing.append(f"calibrated planner per cut: no run in seed {seed}: {why}")
            continue
        pilots[seed] = [runs[label][0] for label in labels]
    return pilots, missing


def pilot_laws(bench: BenchSetting, pilots: Mapping[int, Sequence[str]], law: str) -> dict[int, RoundsLaw]:
    """Per seed of ``pilots`` (run folders), the rounds law ``law`` (``linear`` or ``per-cut``) fitted to them, read
    as ``train --pilots`` reads them (rounds to the target interpolated between evaluations)."""
    from trainers.run.pilots import read_pilot

    return {seed: fit_rounds_law([read_pilot(folder, bench.target) for folder in folders], law)
            for seed, folders in pilots.items()}


def law_candidates(bench: BenchSetting, probe: Probe) -> list[int] | None:
    """The cuts a rounds law's plan may use: a U-shaped split's (:func:`grid_cuts`), else the law's own (None: every
    cut); a leakage budget is the probe's, given beside them."""
    return grid_cuts(probe.profile.num_cuts, bench.head) if bench.head else None


def linear_jobs(bench: BenchSetting, laws: Mapping[int, RoundsLaw], probes: Mapping[int, Probe],
                runs_dir: str | os.PathLike, kind: str = "linear") -> list[dict[str, Any]]:
    """One job per seed of ``laws``: the plan of the law on the seed's round-1 system (its ``plan``:
    :func:`adaptplan.linear_rounds.plan_linear_rounds` or ``plan_per_cut_rounds``), trained as a fixed plan in
    ``runs_dir/seed<s>/<kind>``, with its prediction (⌈R⌉ rounds, eq. 26's seconds) in the job's ``prediction``."""
    plan = PlanSpec(kind)
    jobs = []
    for seed, law in laws.items():
        found = probes[seed]
        chosen = as_plan(law.plan(found.profile, found.system, candidates=law_candidates(bench, found),
                                  leakage=found.leakage), law, found.profile, found.system)
        prediction = Prediction(list(chosen.cuts), chosen.interval, chosen.rounds, chosen.total_latency_s,
                                calibrated=True)
        jobs.append({"group": "plans", "label": plan.label, "seed": seed, "plan": plan, "target": bench.target,
                     "config": {**bench.run_config(seed, plan), "cuts": list(chosen.cuts), "interval": chosen.interval},
                     "folder": str(Path(runs_dir) / f"seed{seed}" / plan.slug), "prediction": prediction})
    return jobs


def attach_linear_fit(results: Sequence[PlanResult], laws: Mapping[int, RoundsLaw],
                      probes: Mapping[int, Probe], name: str = "linear_fit") -> None:
    """Each fixed plan's ``linear_fit`` (or ``name``) per seed: ⌈R⌉ of that seed's law and eq. (26)'s seconds for its
    cuts on the seed's round-1 system (:func:`adaptplan.linear_rounds.score`); none where the law per cut has no
    pilots of a cut at the plan's interval."""
    for seed, law in laws.items():
        for r in results:
            cuts = r.cuts_by_seed().get(seed) or ()
            if r.plan.kind not in PLANNERS and r.plan.interval is not None and seed in r.runs:
                try:
                    scored = score(law, probes[seed].profile, probes[seed].system, cuts, r.plan.interval)
                except InputError:
                    continue                           # a cut the law per cut has no pilots of at that interval
                getattr(r, name)[seed] = (scored.rounds, scored.total_latency_s)


def attach_fit(results: Sequence[PlanResult], probes: Mapping[int, Probe]) -> None:
    """Each fixed plan's ``fit`` per seed: its rounds and seconds to the target predicted by that seed's calibrated
    constants (the calibrated planner's run's ``meta.calibration``) on that seed's :class:`Probe`."""
    calibrated = next((r for r in results if r.plan.kind == "calibrated"), None)
    if calibrated is None:
        return
    for seed, prediction in calibrated.predictions.items():
        if prediction is None or prediction.constants is None:
            continue
        constants = ConvergenceConstants.from_json(prediction.constants)
        for r in results:
            if r.plan.kind not in PLANNERS and r.plan.interval is not None and seed in r.runs:
                cuts = r.cuts_by_seed()[seed]
                r.fit[seed] = probes[seed].predict(constants, cuts or (), r.plan.interval)


def run_plans_bench(bench: BenchSetting, seeds: Sequence[int] = DEFAULT_SEEDS,
                    intervals: Sequence[int] = DEFAULT_INTERVALS, runs_dir: str | os.PathLike = "bench-plans-runs",
                    workers: int | None = None, progress: bool = True) -> tuple[list[PlanResult], list[str]]:
    """Train every plan of :func:`plan_grid` for every seed, then the calibrated planners on two of them
    (:func:`pilot_pairs`, :func:`calibrated_jobs`, :func:`linear_jobs`; runs in ``runs_dir``: a run that ended there
    is read back, a stopped one continues);
    return them grouped by plan, with the calibrated fit's predictions of the fixed plans (:func:`attach_fit`), and
    the lines saying why a seed has no calibrated run."""
    probes = {seed: probe(bench, seed, intervals) for seed in seeds}
    num_cuts, cuts = next(iter(probes.values())).profile.num_cuts, next(iter(probes.values())).cuts
    jobs = grid_jobs(bench, seeds, cuts, {seed: p.latency_best for seed, p in probes.items()}, intervals, runs_dir)
    results = run_grid(jobs, workers, progress)
    pairs, missing = pilot_pairs(bench, seeds, jobs, results, cuts, num_cuts, intervals)
    laws = pilot_laws(bench, pairs, "linear")
    per_cut, missing_per_cut = per_cut_pilots(bench, seeds, jobs, results, cuts, intervals)
    cut_laws = pilot_laws(bench, per_cut, "per-cut")
    more = calibrated_jobs(bench, pairs, runs_dir) + linear_jobs(bench, laws, probes, runs_dir) \
        + linear_jobs(bench, cut_laws, probes, runs_dir, "per_cut")
    if more:
        jobs, results = [*jobs, *more], [*results, *run_grid(more, workers, progress)]
    grouped = collect(jobs, results, bench.target)
    attach_fit(grouped, probes)
    attach_linear_fit(grouped, laws, probes)
    attach_linear_fit(grouped, cut_laws, probes, "per_cut_fit")
    return grouped, missing + missing_per_cut
