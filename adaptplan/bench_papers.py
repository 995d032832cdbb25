"""`adaptplan bench papers`: the comparison each source paper headlines, re-run at the built-in scale
over several seeds, with a verdict per claim.

Every run is one ``adaptplan train`` run (worker processes, :mod:`adaptplan.bench_runs`) on the
shipped data set (``cifar10-subset``, model ``cnn``; ``--quick``: ``synthetic``). A job config names
only what the comparison itself needs — algorithm, partition, devices, rounds, seed, evaluation,
one cut for every device (AdaptSFL's policies plan their own) and the algorithm options that define
the setting (participation, CycleSL's base) — so each algorithm trains with its own defaults
(:class:`trainers.config.TrainConfig`): nothing is tuned to make a claim hold. Seed s (0..n-1)
draws the partition, the model's initial weights and the samplers; the system trace is the same
for every seed.

The claims (one row each; A is the algorithm the paper says is better, B its baseline):

1. GAPSL vs PSL, Dirichlet α = 0.1, N devices: final test accuracy, A − B in points.
2. SCALA vs SplitFed V1 and vs V2, 2 label shards per device, 2N devices, participation 0.2 for all three.
3. CyclePSL vs PSL and CycleSFL vs SFL-V1, Dirichlet α = 0.1, N devices, every device in every
   round for all four (CycleSL's own default participation would set a few devices a round against
   the baselines' N).
4. GAS vs SFL-V1, Dirichlet α = 0.1, N devices: simulated seconds to the target accuracy, B / A
   (> 1: A is faster). One GAS round is one global iteration of C·E device steps (C active devices,
   E local steps: GAS's defaults), so GAS runs ⌈R·N / (C·E)⌉ rounds: the device steps of R
   synchronous rounds of N devices. Times are compared on the simulated-time axis.
5. AdaptSFL (policy adaptsfl, re-planning every 50 rounds) vs RMA+RMS and vs SFL (the policies of
   ``bench training``), IID, N devices: simulated seconds to the target, B / A.

**Figures per claim.** Per seed s the difference d_s (points) or the ratio r_s = t_B / t_A; a run
that never reaches the target has no time: r_s = ∞ when only B missed it, 0 when only A did, none
when both did. The measured value is the mean of d_s, or the geometric mean of the finite r_s (the
seeds where both reached the target; geometric, so that a seed 3× faster and one 3× slower average
to 1); the spread is their min..max (and ± the sample standard deviation of the differences); the
runs that missed the target are counted ("B not reached in k/n seeds").

**Verdict rule.** Each seed's sign: + when it agrees with the claim (d_s > 0; r_s > 1, including
only B missing the target), − when it contradicts it (d_s < 0; r_s < 1, including only A missing),
0 otherwise (a tie, or neither reaching the target). Then, in this order:

* "does not hold at this scale" if the mean has the wrong sign or is zero (mean d ≤ 0; mean r ≤ 1;
  with no seed where both reached the target: fewer + seeds than − seeds, or none of either);
* "holds" if every seed's sign is +;
* "within noise" otherwise (the mean has the claimed sign, but the seeds disagree).

"holds" says only that the sign agrees in every seed; the size of the effect is in the table next
to the paper's.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from adaptplan.bench_runs import RunResult, pct, run_jobs, seconds
from adaptplan.errors import InputError

PAPERS = ("gapsl", "scala", "cyclesl", "gas", "adaptsfl")
DEFAULT_ROUNDS = 150
DEFAULT_DEVICES = 10
DEFAULT_SEEDS = 3
DEFAULT_TARGET = 0.3
REPLAN_EVERY = 50           # AdaptSFL's re-planning period Q (as `bench training`)
PARTICIPATION = 0.2         # SCALA's comparison: every algorithm's fraction of devices per round
CUT = 2                     # one cut for every device (cnn has 5 cut points)
EVALUATIONS = 15            # evaluations per run (eval_every = rounds // EVALUATIONS)
TEST_SAMPLES = 500
QUICK: dict[str, Any] = {"dataset": "synthetic", "rounds": 4, "devices": 4, "seeds": 1}
PSL_FAMILY_COST = 2.5       # relative cost of a device step of GAPSL, PSL, CyclePSL (per-device models to evaluate)
VERDICTS = ("holds", "within noise", "does not hold at this scale")


@dataclass(frozen=True)
class Run:
    """One algorithm of a comparison: its label and the TrainConfig fields that set it."""

    label: str
    config: Mapping[str, Any]


@dataclass(frozen=True)
class Claim:
    """One headline comparison: ``a`` (the label the paper says wins) against ``b``; ``metric`` is
    ``accuracy`` (final test accuracy, A − B in points) or ``time`` (simulated s to target, B / A)."""

    paper: str
    claim: str          # one line in words
    a: str
    b: str
    metric: str


@dataclass(frozen=True)
class Paper:
    key: str
    title: str
    source: str         # the paper's setting and numbers
    setting: str        # the setting at this scale
    runs: tuple[Run, ...]
    claims: tuple[Claim, ...]


def gas_steps(devices: int) -> tuple[int, int]:
    """GAS's default (active devices C for ``devices``; local steps E), read from
    :data:`trainers.config.ALGORITHM_OPTIONS` and GAS's own rule for C
    (:func:`trainers.strategies.gas.active_devices`)."""
    from trainers.config import algorithm_options
    from trainers.strategies.gas import active_devices

    options = algorithm_options("gas", {})
    return active_devices(options["active"], devices), options["local_steps"]


def gas_rounds(rounds: int, devices: int) -> int:
    """GAS global iterations holding the device steps of ``rounds`` synchronous rounds of ``devices``."""
    active, local = gas_steps(devices)
    return max(1, math.ceil(rounds * devices / (active * local)))


def papers(rounds: int = DEFAULT_ROUNDS, devices: int = DEFAULT_DEVICES, target: float = DEFAULT_TARGET,
           dataset: str = "cifar10-subset") -> dict[str, Paper]:
    """The five comparisons at ``rounds`` rounds and ``devices`` devices (SCALA's: twice as many)."""
    skew = {"partition": "dirichlet", "dirichlet_alpha": 0.1}
    cut = {"cuts": (CUT,) * devices}
    part = {"participation": PARTICIPATION}
    full = {"participation": 1.0}          # CycleSL's comparison: the same participation as PSL's and SFL-V1's
    scala_devices = 2 * devices
    shards = {"partition": "shards", "devices": scala_devices, "cuts": (CUT,) * scala_devices}
    c, e = gas_steps(devices)
    r_gas = gas_rounds(rounds, devices)
    common = f"{dataset} / cnn, {rounds} rounds"
    out = [
        Paper("gapsl", "GAPSL (arXiv 2603.18540)",
              "CIFAR-10 / VGG-16, Dirichlet α=0.1, 10 devices: GAPSL 63.3% vs PSL 47.3% (+16.0 points)",
              f"{common}, Dirichlet α=0.1, {devices} devices, cut {CUT}",
              (Run("gapsl", {"algorithm": "gapsl", **skew, **cut}), Run("psl", {"algorithm": "psl", **skew, **cut})),
              (Claim("gapsl", "GAPSL beats PSL under label skew (paper: +16.0 pts)", "gapsl", "psl", "accuracy"),)),
        Paper("scala", "SCALA",
              "quantity skew (2 classes per client), 10% participation: SCALA 82.70% vs SFL-V1 60.97% (+21.7 points); "
              "SFL-V2 also below SCALA",
              f"{common}, 2 label shards per device, {scala_devices} devices, participation {PARTICIPATION} for all, "
              f"cut {CUT}",
              tuple(Run(a, {"algorithm": a, **shards, "extra": dict(part)}) for a in ("scala", "sfl-v1", "sfl-v2")),
              (Claim("scala", "SCALA beats SFL-V1, skew + partial part. (paper: +21.7)", "scala", "sfl-v1", "accuracy"),
               Claim("scala", "SCALA beats SFL-V2, skew + partial participation", "scala", "sfl-v2", "accuracy"))),
        Paper("cyclesl", "CycleSL",
              "CIFAR-100, Dirichlet α=0.1: PSL 55.9% → CyclePSL 65.0% (+9.1); SFL-V1 38.8% → CycleSFL 52.2% (+13.4)",
              f"{common}, Dirichlet α=0.1, {devices} devices, cut {CUT}, every device in every round for all four "
              f"(CycleSL's own default participation would compare a few devices a round against PSL's {devices})",
              (Run("cyclepsl", {"algorithm": "cyclesl", **skew, **cut, "extra": {"cycle_base": "psl", **full}}),
               Run("psl", {"algorithm": "psl", **skew, **cut}),
               Run("cyclesfl", {"algorithm": "cyclesl", **skew, **cut, "extra": {"cycle_base": "sfl", **full}}),
               Run("sfl-v1", {"algorithm": "sfl-v1", **skew, **cut})),
              (Claim("cyclesl", "CyclePSL beats PSL under label skew (paper: +9.1 pts)", "cyclepsl", "psl", "accuracy"),
               Claim("cyclesl", "CycleSFL beats SFL-V1 under label skew (paper: +13.4)", "cyclesfl", "sfl-v1",
                     "accuracy"))),
        Paper("gas", "GAS (AAAI 2025)",
              "heterogeneous devices, Fig. 4: 60% accuracy in 30 vs 60 simulated minutes against CA²FL (2× faster)",
              f"{dataset} / cnn, Dirichlet α=0.1, {devices} devices, cut {CUT}; SFL-V1 {rounds} rounds, GAS {r_gas} "
              f"global iterations of C·E = {c}·{e} device steps (its defaults) = the same device steps; compared on "
              f"the simulated-time axis: simulated s to {target:.0%}",
              (Run("gas", {"algorithm": "gas", **skew, **cut, "rounds": r_gas}),
               Run("sfl-v1", {"algorithm": "sfl-v1", **skew, **cut})),
              (Claim("gas", f"GAS reaches {target:.0%} sooner than sync. SFL-V1 (paper: 2×)", "gas", "sfl-v1",
                     "time"),)),
        Paper("adaptsfl", "AdaptSFL (ToN 2025)",
              "AdaptSFL reaches the target accuracy in less simulated time than RMA+RMS and SFL (Figs. 5–6)",
              f"{common}, IID, {devices} devices, policies plan cuts and interval (adaptsfl re-plans every "
              f"{REPLAN_EVERY} rounds); simulated s to {target:.0%}",
              (Run("adaptsfl", {"algorithm": "adaptsfl", "partition": "iid", "policy": "adaptsfl",
                                "replan_every": REPLAN_EVERY}),
               Run("rma+rms", {"algorithm": "adaptsfl", "partition": "iid", "policy": "rma+rms"}),
               Run("sfl", {"algorithm": "adaptsfl", "partition": "iid", "policy": "sfl"})),
              (Claim("adaptsfl", f"AdaptSFL reaches {target:.0%} sooner than RMA+RMS", "adaptsfl", "rma+rms", "time"),
               Claim("adaptsfl", f"AdaptSFL reaches {target:.0%} sooner than SFL", "adaptsfl", "sfl", "time"))),
    ]
    return {p.key: p for p in out}


def parse_papers(text: str) -> list[str]:
    """``gapsl,scala,...`` → the named papers in the order given (unknown or none: InputError naming --papers)."""
    names = list(dict.fromkeys(n.strip().lower() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in PAPERS]
    if unknown:
        raise InputError(f"unknown paper {unknown[0]!r}; valid: {', '.join(PAPERS)}", field="--papers")
    if not names:
        raise InputError(f"name at least one of {', '.join(PAPERS)}", field="--papers")
    return names


def jobs(selected: Sequence[str], seeds: Sequence[int], rounds: int = DEFAULT_ROUNDS, devices: int = DEFAULT_DEVICES,
         target: float = DEFAULT_TARGET, dataset: str = "cifar10-subset", test_samples: int = TEST_SAMPLES,
         device: str = "auto", client_batching: str = "auto") -> list[dict[str, Any]]:
    """One job per (paper, run, seed): ``{"group": paper, "label", "seed", "target", "config"}``."""
    catalogue = papers(rounds, devices, target, dataset)
    out = []
    for key in selected:
        for run in catalogue[key].runs:
            for seed in seeds:
                config: dict[str, Any] = {"dataset": dataset, "model": "cnn", "devices": devices, "rounds": rounds,
                                          "threads": 1, "progress": False, "max_test_samples": test_samples,
                                          "device": device, "client_batching": client_batching}
                config.update({k: (dict(v) if isinstance(v, dict) else v) for k, v in run.config.items()})
                config["seed"] = seed
                config["eval_every"] = max(1, config["rounds"] // EVALUATIONS)
                out.append({"group": key, "label": run.label, "seed": seed, "target": target, "config": config})
    return out


def run_paper_bench(selected: Sequence[str] = PAPERS, seeds: Sequence[int] = range(DEFAULT_SEEDS),
                    rounds: int = DEFAULT_ROUNDS, devices: int = DEFAULT_DEVICES, target: float = DEFAULT_TARGET,
                    dataset: str = "cifar10-subset", test_samples: int = TEST_SAMPLES, workers: int | None = None,
                    progress: bool = True,
                    device: str = "auto", client_batching: str = "auto") -> tuple[list[dict[str, Any]], list[RunResult]]:
    """Run every job and return the jobs with their results, in the jobs' order. A configuration two
    papers share (PSL of GAPSL and CycleSL, SFL-V1 of CycleSL and GAS) is trained once; the slowest
    runs start first."""
    todo = jobs(selected, list(seeds), rounds, devices, target, dataset, test_samples, device, client_batching)
    keys = [json.dumps(j["config"], sort_keys=True, default=list) for j in todo]
    unique = list(dict.fromkeys(keys))
    first = {k: todo[keys.index(k)] for k in unique}
    unique.sort(key=lambda k: -cost(first[k]["config"]))
    results = run_jobs([{f: first[k][f] for f in ("group", "label", "target", "config")} for k in unique], workers,
                       "bench papers", progress)
    by_key = dict(zip(unique, results))
    return todo, [replace(by_key[k], group=j["group"], label=j["label"]) for k, j in zip(keys, todo)]


def cost(config: Mapping[str, Any]) -> float:
    """A run's rough relative cost (device steps, weighted), to start the slow runs first: load balancing only."""
    extra = config.get("extra", {})
    if config["algorithm"] == "gas":
        active, local = gas_steps(config["devices"])
        return 1.5 * config["rounds"] * active * local
    steps = config["rounds"] * config["devices"] * extra.get("participation", 1.0)
    psl_like = config["algorithm"] in ("gapsl", "psl") or extra.get("cycle_base") == "psl"
    return steps * (PSL_FAMILY_COST if psl_like else 1.0)


# ---- figures and verdicts ------------------------------------------------------------------------------------------

def accuracy_difference(a: RunResult, b: RunResult) -> float | None:
    """Final test accuracy of A minus B's, in percentage points (None when either has none)."""
    if a.final_accuracy is None or b.final_accuracy is None:
        return None
    return 100.0 * (a.final_accuracy - b.final_accuracy)


def time_ratio(a: RunResult, b: RunResult, target: float) -> float | None:
    """Simulated seconds to ``target`` of B over A's: ∞ when only B never reached it, 0 when only A
    never did, None when neither did."""
    ta, tb = a.time_to(target), b.time_to(target)
    if ta is None and tb is None:
        return None
    if tb is None:
        return math.inf
    if ta is None:
        return 0.0
    if ta <= 0:
        return math.inf if tb > 0 else 1.0
    return tb / ta


def agreement(value: float | None, metric: str) -> int:
    """+1 when a seed's value agrees with the claim, −1 when it contradicts it, 0 otherwise."""
    if value is None:
        return 0
    centre = 1.0 if metric == "time" else 0.0
    return (value > centre) - (value < centre)


@dataclass
class Comparison:
    """A claim measured over seeds (module docstring: figures and verdict rule)."""

    claim: Claim
    seeds: list[int]
    values: list[float | None]          # per seed: d_s (points) or r_s (ratio; inf/0 when one side missed the target)
    signs: list[int]
    mean: float | None
    low: float | None
    high: float | None
    std: float | None
    a_missed: int = 0                   # seeds whose A run never reached the target (time metric)
    b_missed: int = 0
    verdict: str = ""
    a_times: list[float | None] = field(default_factory=list)
    b_times: list[float | None] = field(default_factory=list)
    budgets: list[float] = field(default_factory=list)           # time claims: the shorter run's simulated s, per seed
    a_at_budget: list[float | None] = field(default_factory=list)  # test accuracy at that budget
    b_at_budget: list[float | None] = field(default_factory=list)

    @property
    def equal_time(self) -> str:
        """Time claims: the mean test accuracy of A and B at the equal simulated-time budget ("" otherwise)."""
        if not self.budgets:
            return ""
        a = [v for v in self.a_at_budget if v is not None]
        b = [v for v in self.b_at_budget if v is not None]
        return (f"at equal simulated time (the shorter run's, mean {statistics.fmean(self.budgets):.3g} s): "
                f"{self.claim.a} {pct(statistics.fmean(a)) if a else '-'} vs {self.claim.b} "
                f"{pct(statistics.fmean(b)) if b else '-'} (mean over seeds)")

    @property
    def measured(self) -> str:
        if self.mean is None:
            return "-"
        return f"{self.mean:+.1f} pts" if self.claim.metric == "accuracy" else f"{self.mean:.2f}×"

    @property
    def spread(self) -> str:
        n = len(self.seeds)
        if self.claim.metric == "accuracy":
            if self.low is None:
                return "-"
            text = f"{self.low:+.1f}..{self.high:+.1f}" if n > 1 else f"{self.low:+.1f} (1 seed)"
            return text + (f" (±{self.std:.1f})" if self.std is not None else "")
        text = "-" if self.low is None else (f"{self.low:.2f}..{self.high:.2f}×" if self.low != self.high or n == 1
                                             else f"{self.low:.2f}×")
        if self.a_missed and self.a_missed == self.b_missed:
            missed = [f"A and B not reached in {self.a_missed}/{n} seeds"]
        else:
            missed = [f"{side} not reached in {k}/{n} seeds" for side, k in (("A", self.a_missed), ("B", self.b_missed))
                      if k]
        return text + ("; " + ", ".join(missed) if missed else "")

    def to_json(self) -> dict[str, Any]:
        def finite(v: float | None) -> float | None:
            return v if v is not None and math.isfinite(v) else None

        per_seed = []
        for i, seed in enumerate(self.seeds):
            row: dict[str, Any] = {"seed": seed, "value": finite(self.values[i]), "sign": self.signs[i]}
            if self.claim.metric == "time":
                row.update(a_seconds_to_target=self.a_times[i], b_seconds_to_target=self.b_times[i],
                           equal_time_budget_s=self.budgets[i], a_accuracy_at_budget=self.a_at_budget[i],
                           b_accuracy_at_budget=self.b_at_budget[i])
            per_seed.append(row)
        return {**asdict(self.claim), "measured": finite(self.mean), "low": finite(self.low), "high": finite(self.high),
                "std": self.std, "a_not_reached": self.a_missed, "b_not_reached": self.b_missed,
                "per_seed": per_seed, "verdict": self.verdict,
                "units": "percentage points, A - B" if self.claim.metric == "accuracy"
                else "simulated seconds to target, B / A (> 1: A faster); measured: geometric mean over the seeds where "
                     "both reached the target"}


def verdict(values: Sequence[float | None], metric: str, mean: float | None) -> str:
    """The verdict rule of the module docstring."""
    signs = [agreement(v, metric) for v in values]
    if mean is not None:
        wrong = mean <= (1.0 if metric == "time" else 0.0)
    else:
        wrong = signs.count(1) <= signs.count(-1)
    if wrong:
        return "does not hold at this scale"
    if signs and all(s == 1 for s in signs):
        return "holds"
    return "within noise"


def compare(claim: Claim, a_runs: Sequence[RunResult], b_runs: Sequence[RunResult], seeds: Sequence[int],
            target: float) -> Comparison:
    """Measure ``claim`` from the A and B runs of each seed (``a_runs[i]``, ``b_runs[i]``: seed ``seeds[i]``)."""
    if not (len(a_runs) == len(b_runs) == len(seeds)):
        raise ValueError("one A run and one B run per seed")
    if claim.metric == "accuracy":
        values = [accuracy_difference(a, b) for a, b in zip(a_runs, b_runs)]
        present = [v for v in values if v is not None]
    else:
        values = [time_ratio(a, b, target) for a, b in zip(a_runs, b_runs)]
        present = [v for v in values if v is not None and 0 < v < math.inf]
    if claim.metric == "accuracy":
        mean = statistics.fmean(present) if present else None
    else:                   # ratios: the geometric mean, so that B/A and A/B average alike
        mean = math.exp(statistics.fmean(math.log(v) for v in present)) if present else None
    finite = [v for v in values if v is not None and (claim.metric == "accuracy" or 0 < v < math.inf)]
    std = statistics.stdev(present) if claim.metric == "accuracy" and len(present) > 1 else None
    comparison = Comparison(claim, list(seeds), values, [agreement(v, claim.metric) for v in values], mean,
                            min(finite) if finite else None, max(finite) if finite else None, std)
    if claim.metric == "time":
        comparison.a_times = [a.time_to(target) for a in a_runs]
        comparison.b_times = [b.time_to(target) for b in b_runs]
        comparison.a_missed = sum(t is None for t in comparison.a_times)
        comparison.b_missed = sum(t is None for t in comparison.b_times)
        comparison.budgets = [min(a.sim_seconds, b.sim_seconds) for a, b in zip(a_runs, b_runs)]
        comparison.a_at_budget = [a.accuracy_at(t) for a, t in zip(a_runs, comparison.budgets)]
        comparison.b_at_budget = [b.accuracy_at(t) for b, t in zip(b_runs, comparison.budgets)]
    comparison.verdict = verdict(values, claim.metric, mean)
    return comparison


def comparisons(todo: Sequence[Mapping[str, Any]], results: Sequence[RunResult], selected: Sequence[str],
                catalogue: Mapping[str, Paper], target: float) -> list[Comparison]:
    """Every claim of the selected papers, measured from the runs."""
    cell = {(j["group"], j["label"], j["seed"]): r for j, r in zip(todo, results)}
    seeds = list(dict.fromkeys(j["seed"] for j in todo))
    out = []
    for key in selected:
        for claim in catalogue[key].claims:
            out.append(compare(claim, [cell[key, claim.a, s] for s in seeds], [cell[key, claim.b, s] for s in seeds],
                               seeds, target))
    return out


# ---- output --------------------------------------------------------------------------------------------------------

COLUMNS = (("paper", 8), ("claim", 55), ("metric", 19), ("measured (mean)", 15), ("spread over seeds", 36),
           ("verdict", 27))


def _row(cells: Sequence[str]) -> str:
    return "  ".join(f"{c:<{w}}" for c, (_, w) in zip(cells, COLUMNS)).rstrip()


def table(found: Sequence[Comparison], catalogue: Mapping[str, Paper], todo: Sequence[Mapping[str, Any]],
          results: Sequence[RunResult], target: float) -> str:
    """The claims table, the settings, a plain summary of what does not hold, and the per-run table."""
    seeds = list(dict.fromkeys(j["seed"] for j in todo))
    lines = [f"Paper claims at this scale, {len(seeds)} seed(s) ({', '.join(map(str, seeds))}). A = the claimed "
             f"winner, B = its baseline; pts A−B: final test accuracy difference in percentage points; s to "
             f"{target:.0%}, B/A: simulated seconds to {target:.0%} accuracy, B's over A's (> 1: A faster; mean: "
             f"geometric, over the seeds where both reached it)",
             _row([name for name, _ in COLUMNS]), _row(["-" * w for _, w in COLUMNS])]
    for c in found:
        metric = "final acc., pts A−B" if c.claim.metric == "accuracy" else f"s to {target:.0%}, B/A"
        lines.append(_row([c.claim.paper, c.claim.claim, metric, c.measured, c.spread, c.verdict]))
    lines.append("")
    lines.append("Settings (paper → here):")
    for key in dict.fromkeys(c.claim.paper for c in found):
        paper = catalogue[key]
        lines.append(f"  {paper.title}: {paper.source}")
        lines.append(f"    here: {paper.setting}")
    failing = [c for c in found if c.verdict != "holds"]
    lines.append("")
    if not failing:
        lines.append("Every claim holds at this scale (the sign agrees in every seed; sizes above).")
    for c in failing:
        lines.append(f"{'DOES NOT HOLD' if c.verdict.startswith('does not') else 'WITHIN NOISE'}: {c.claim.claim} "
                     f"— measured {c.measured}, {c.spread}")
    for c in found:
        if c.equal_time:
            lines.append(f"For context ({c.claim.paper}, not part of the verdict): {c.equal_time}")
    lines.append("")
    lines.append(run_table(todo, results, target))
    return "\n".join(lines)


def run_table(todo: Sequence[Mapping[str, Any]], results: Sequence[RunResult], target: float) -> str:
    """Final test accuracy of every run (paper, algorithm × seed); for the time claims also the
    simulated seconds to the target in brackets (``[-]``: never reached)."""
    seeds = list(dict.fromkeys(j["seed"] for j in todo))
    cell = {(j["group"], j["label"], j["seed"]): r for j, r in zip(todo, results)}
    timed = {"gas", "adaptsfl"}
    lines = [f"Final test accuracy per run (seconds: simulated s to {target:.0%}, [-] = not reached)",
             f"  {'paper':<9} {'run':<10} " + " ".join(f"{'seed ' + str(s):>16}" for s in seeds) + f" {'mean':>7}"]
    for group, label in dict.fromkeys((j["group"], j["label"]) for j in todo):
        row = []
        for s in seeds:
            r = cell[group, label, s]
            text = pct(r.final_accuracy)
            if group in timed:
                text += f" [{seconds(r.time_to(target))}]"
            if r.diverged_round:
                text += f" NaN@{r.diverged_round}"
            row.append(f"{text:>16}")
        finals = [cell[group, label, s].final_accuracy for s in seeds]
        mean = statistics.fmean([f for f in finals if f is not None]) if any(f is not None for f in finals) else None
        lines.append(f"  {group:<9} {label:<10} " + " ".join(row) + f" {pct(mean):>7}")
    return "\n".join(lines)


def save_json(found: Sequence[Comparison], catalogue: Mapping[str, Paper], todo: Sequence[Mapping[str, Any]],
              results: Sequence[RunResult], target: float, path: str | os.PathLike) -> None:
    """``{"target_accuracy", "seeds", "papers": {KEY: {title, source, setting}}, "claims": [...],
    "runs": [every run's figures, with its paper, label, seed and config]}``."""
    keys = list(dict.fromkeys(j["group"] for j in todo))
    data = {"target_accuracy": target, "seeds": list(dict.fromkeys(j["seed"] for j in todo)),
            "verdict_rule": "does not hold at this scale: the mean has the wrong sign or is zero (no seed where "
                            "both reached the target: fewer seeds for the claim than against it); holds: every seed "
                            "agrees with the claim; within noise: otherwise (the seeds disagree)",
            "papers": {k: {"title": catalogue[k].title, "source": catalogue[k].source, "setting": catalogue[k].setting}
                       for k in keys},
            "claims": [c.to_json() for c in found],
            "runs": [{"paper": j["group"], "label": j["label"], "seed": j["seed"],
                      "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in j["config"].items()},
                      **asdict(r), "time_to_target_s": r.time_to(target)} for j, r in zip(todo, results)]}
    Path(path).write_text(json.dumps(data, indent=2, allow_nan=False), encoding="utf-8")


def mean_curve(runs: Sequence[RunResult]) -> list[tuple[float, float, float, float]]:
    """(mean simulated s, mean, min, max accuracy) at each evaluation index the runs all reached."""
    n = min((len(r.curve) for r in runs), default=0)
    out = []
    for k in range(n):
        accs = [r.curve[k][1] for r in runs]
        out.append((statistics.fmean(r.curve[k][0] for r in runs), statistics.fmean(accs), min(accs), max(accs)))
    return out


def plot(todo: Sequence[Mapping[str, Any]], results: Sequence[RunResult], catalogue: Mapping[str, Paper],
         target: float, path: str | os.PathLike) -> None:
    """One panel per paper: test accuracy against simulated seconds, the mean over seeds per algorithm
    (by evaluation index) with its min..max band; the target as a dotted line on the timed panels."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys(j["group"] for j in todo))
    fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 4), squeeze=False)
    for ax, group in zip(axes[0], groups):
        for label in dict.fromkeys(j["label"] for j in todo if j["group"] == group):
            curve = mean_curve([r for j, r in zip(todo, results) if j["group"] == group and j["label"] == label])
            if curve:
                xs = [p[0] for p in curve]
                line, = ax.plot(xs, [p[1] for p in curve], marker="o", markersize=3, label=label)
                ax.fill_between(xs, [p[2] for p in curve], [p[3] for p in curve], color=line.get_color(),
                                alpha=0.15)
        if group in ("gas", "adaptsfl"):
            ax.axhline(target, color="grey", linestyle=":", linewidth=1)
        ax.set_title(catalogue[group].title, fontsize=10)
        ax.set_xlabel("simulated seconds")
        ax.set_ylabel("test accuracy (mean over seeds)")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
