"""`adaptplan bench papers`: the comparison each source paper headlines, run from its recipe file
(:mod:`adaptplan.benches.recipes`: ``adaptplan/benches/recipes/<paper>.toml``) over several seeds, with a verdict per claim.

A recipe fixes, for every method of one comparison, the one training setting (optimizer, rates, momentum,
weight decay, clipping, batch, participation, local rounds between averages, rounds), the data, partition,
model and cut, and the evaluation protocol that judges each claim (``global``: the test set; ``local``: each
device's model on its own held-out samples, CycleSL §4.1); each value is the paper's (its section or table)
or follows a scaling rule the file states. Nothing is tuned to make a claim hold. Every run is one
``adaptplan train`` run (worker processes, :mod:`adaptplan.benches.runs`); seed s (0..n-1) draws the
partition, the held-out split, the model's initial weights and the samplers; the system trace is the same for
every seed. ``--data-root DIR`` runs each recipe's ``[paper_scale]`` (the paper's own data set and model)
instead, nothing else changed.

**Tiers** (``--tier``): ``full`` (the default) is each recipe as written, its rounds raised where the plateau
check below found a baseline still rising (the table says which still are): SCALA's 18 runs of 28,800 rounds
alone are 20–35 CPU-hours (35–60 minutes per 14,400 rounds on 2 busy cores, measured), so the full tier takes
several sittings (``--out`` keeps every run; ended runs train on when a recipe's rounds grow, from the start where
their checkpoints are not kept); with SCALA at 2,400 rounds it was 3.7 CPU-hours (1 h 51 min of 2 cores,
measured). ``hour`` is the first half of every full-tier run: half the rounds, evaluated at the same rounds (half
the evaluations), a schedule over the run's length kept at the full run's (:func:`hour_tier`), nothing else
changed, so each hour-tier run is the exact prefix of its full-tier run and its verdicts are those of the full
tier's curves at half time; all five recipes at 3 seeds fit 60 minutes of 2 cores. A recipe may state another
first part in its ``[hour_tier]`` (rounds and evaluations, each with its rule;
:mod:`adaptplan.benches.recipes`). ``test`` (``--quick``) is the test tier: the synthetic data set, 4 devices,
4 rounds, 1 seed; its verdicts mean nothing.

**Plateau check.** For the baseline B of each claim: the mean over seeds of its accuracy (by the claim's protocol,
but see :func:`plateau_protocol`) over the last third of the evaluations, minus the same over the middle third, in
points. Below :data:`PLATEAU_RISE` points B has plateaued; otherwise the table says it is still rising, so that a
margin measured before B converged is not read as a converged one. A claim judged by the participants' figure
(``local-sampled``) is checked on the pooled figure of the same runs, the participants' rise printed beside it.

**Figures per claim.** Per seed s the difference d_s (points, by the claim's protocol) or the ratio r_s = t_B /
t_A of simulated seconds to the target; a run that never reaches the target has no time: r_s = ∞ when only B
missed it, 0 when only A did, none when both did. The measured value is the mean of d_s, or the geometric mean
of the finite r_s (the seeds where both reached the target; geometric, so that a seed 3× faster and one 3×
slower average to 1); the spread is their min..max (and ± the sample standard deviation of the differences);
the runs that missed the target are counted ("B not reached in k/n seeds").

**Verdict rule.** Each seed's sign: + when it agrees with the claim (d_s > 0; r_s > 1, including only B
missing the target), − when it contradicts it (d_s < 0; r_s < 1, including only A missing), 0 otherwise (a
tie, or neither reaching the target). Then, in this order:

* "does not hold at this scale" if the mean has the wrong sign or is zero (mean d ≤ 0; mean r ≤ 1; with no
  seed where both reached the target: fewer + seeds than − seeds, or none of either);
* "holds" if every seed's sign is +;
* "within noise" otherwise (the mean has the claimed sign, but the seeds disagree).

**Convergence claims** (``metric = "convergence"``: the paper states that B does not converge where A does, e.g.
SCALA's Table III, "SplitFedV1 and V2 fail to converge" under Dirichlet skew). The rule is the paper's own
convergence criterion (AdaptSFL §VII; docs/model.md §6.1, :func:`trainers.run.history.first_converged`): a run has
converged when its accuracy (by the claim's protocol) has gained less than 2 points from one evaluation to the next
for 5 evaluations in a row, evaluations below twice chance not counting; a diverged run has not. Per seed the value
is +1 when A converged and B did not, −1 when B converged, 0 when neither did; the verdict rule below reads these
signs, so "holds" means B failed to converge in every seed while A converged.

**Ordering claims** (``metric = "ordering"``, ``order``: the paper's ranking of several methods by final accuracy,
best first, e.g. SCALA's Table III column). Per seed the value is Kendall's τ (τ-a) between the claimed order and the
one the methods' final accuracies give (1: the claimed order exactly; a tie counts as neither agreeing nor not);
its sign is + only at τ = 1, − at τ ≤ 0; so "holds" means the claimed order in every seed, "does not hold" a mean
τ ≤ 0. A and B are the order's first and last (the plateau check watches the last).

"holds" says only that the sign agrees in every seed; the size of the effect is in the table next to the
paper's. Where the recipe gives the paper's figure as a number (a claim's ``margin``: points, or a ratio), the last
column sets the measured mean against it: "as large" (at least the paper's), "weaker" (the claimed direction,
smaller), "opposite" (no effect or the other way); a ratio bounded by the evaluation grid says it is a bound.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from adaptplan.benches import recipes
from adaptplan.benches.recipes import PROTOCOLS, Recipe
from adaptplan.benches.runs import RunResult, no_evaluation, no_local, pct, run_jobs, run_state, seconds
from adaptplan.errors import InputError
from adaptplan.report import Empty, empty_notes, format_table
from trainers.algorithms import algorithm as registered

PAPERS = recipes.NAMES
DEFAULT_SEEDS = 3
PSL_FAMILY_COST = 2.5       # relative cost of a device step of GAPSL, PSL, CyclePSL (per-device models to evaluate)
VERDICTS = ("holds", "within noise", "does not hold at this scale")
TIERS = ("full", "hour", "test")
PLATEAU_RISE = 2.0          # points: a baseline rising less over the last third of its evaluations has plateaued


@dataclass(frozen=True)
class Claim:
    """One headline comparison of paper ``paper``: ``a`` (the label the paper says wins) against ``b``; ``metric``
    is ``accuracy`` (final accuracy, A − B in points) or ``time`` (simulated s to target, B / A), by
    ``protocol`` (``global`` or ``local``) on the runs of ``group`` ("PAPER/PARTITION")."""

    paper: str
    claim: str          # one line in words
    a: str
    b: str
    metric: str
    protocol: str = "global"
    group: str = ""
    source: str = ""    # the paper's figure
    margin: float | None = None   # the paper's figure as a number (points; a ratio), where it gives one
    order: tuple[str, ...] = ()   # an ordering claim's methods, best first (a and b: its first and last)


def catalogue(selected: Sequence[str], tier: str = "full", data_root: str | None = None,
              fashion_mnist: bool = False) -> dict[str, Recipe]:
    """The recipes of the ``selected`` papers at ``tier`` (:data:`TIERS`, module docstring), at the paper's scale
    when ``data_root`` is given, on the whole Fashion-MNIST with ``fashion_mnist`` (the papers' images per device,
    :meth:`Recipe.on_full_fashion_mnist`)."""
    if tier not in TIERS:
        raise InputError(f"unknown tier {tier!r}; valid: {', '.join(TIERS)}", field="--tier")
    if data_root is not None and fashion_mnist:
        raise InputError("--full-fashion-mnist and --data-root each replace the recipes' data set: give one",
                         field="--full-fashion-mnist")
    out = {}
    for name in selected:
        recipe = recipes.load(name)
        if data_root is not None:
            recipe = recipe.at_paper_scale(data_root)
        if fashion_mnist:
            recipe = recipe.on_full_fashion_mnist()
        if tier == "hour":
            recipe = hour_tier(recipe)
        elif tier == "test":
            recipe = quick_tier(recipe)
        out[recipe.key] = recipe
    return out


def hour_tier(recipe: Recipe) -> Recipe:
    """The first part of every run of ``recipe``: the rounds and evaluations its ``[hour_tier]`` states (with their
    rules), else half the rounds evaluated at the same rounds (half the evaluations); a schedule over the run's
    length (GAPSL's T of eq. 2, the option ``horizon``) kept at the full run's; every other value kept. Each run
    then trains exactly as the first rounds of its full-tier run (when to evaluate changes no training)."""
    from trainers.algorithms import REGISTRY

    methods = tuple(replace(m, options={**m.options, "horizon": recipe.method_rounds(m)})
                    if any(o.name == "horizon" for o in REGISTRY[m.algorithm].options) else m for m in recipe.methods)
    stated, rules = recipe.hour_tier, recipe.hour_tier_rules
    sources = {**recipe.setting.sources, **({"rounds": f"rule: {rules['rounds']}"} if "rounds" in stated else {})}
    setting = replace(recipe.setting, rounds=stated.get("rounds", recipe.setting.rounds // 2), sources=sources)
    run = {**recipe.run, "evaluations": stated.get("evaluations", max(1, int(recipe.run["evaluations"]) // 2))}
    return replace(recipe, setting=setting, run=run, methods=methods,
                   sources={**recipe.sources, **{k: f"rule: {v}" for k, v in rules.items()}})


def quick_tier(recipe: Recipe) -> Recipe:
    """The test tier: the synthetic data set (synthetic-text for a text recipe), 4 devices, 4 rounds (2 evaluations), 100
    test samples, at most 2 local
    steps (a method's own too), its hour tier the first half ([hour_tier] states a part of the full run); every
    other value of the recipe kept. Its verdicts mean nothing."""
    setting = replace(recipe.setting, rounds=4, local_steps=None if recipe.setting.local_steps is None
                      else min(recipe.setting.local_steps, 2))
    text = int(recipe.run.get("model") == "leaf-lstm")          # a text recipe: generated windows, not images
    run = {**recipe.run, "dataset": ("synthetic", "synthetic-text")[text], "devices": 4, "evaluations": 2,
           "test_samples": 100}
    methods = tuple(replace(m, options={k: min(v, 2) if k == registered(m.algorithm).local_rounds_option else v
                                        for k, v in m.options.items()}) for m in recipe.methods)
    return replace(recipe, setting=setting, run=run, methods=methods, hour_tier={}, hour_tier_rules={})


def claims(recipe: Recipe) -> list[Claim]:
    return [Claim(recipe.key, c.text, c.a, c.b, c.metric, c.protocol, f"{recipe.key}/{c.partition}", c.paper,
                  c.margin, c.order) for c in recipe.claims]


def parse_papers(text: str) -> list[str]:
    """``gapsl,scala,...`` → the named papers in the order given (unknown or none: InputError naming --paper)."""
    names = list(dict.fromkeys(n.strip().lower() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in PAPERS]
    if unknown:
        raise InputError(f"unknown paper {unknown[0]!r}; valid: {', '.join(PAPERS)}", field="--paper")
    if not names:
        raise InputError(f"name at least one of {', '.join(PAPERS)}", field="--paper")
    return names


def jobs(book: Mapping[str, Recipe], seeds: Sequence[int], device: str = "auto", client_batching: str = "auto",
         target: float | None = None) -> list[dict[str, Any]]:
    """One job per (paper, partition, method, seed): ``{"group": "PAPER/PARTITION", "label", "seed", "target",
    "config"}``; ``target`` replaces the recipes' target accuracy."""
    out = []
    for recipe in book.values():
        for job in recipe.jobs(seeds, device, client_batching):
            out.append({**job, "target": job["target"] if target is None else target})
    return out


def run_paper_bench(book: Mapping[str, Recipe], seeds: Sequence[int] = range(DEFAULT_SEEDS), workers: int | None = None,
                    progress: bool = True,
                    device: str = "auto", client_batching: str = "auto",
                    target: float | None = None,
                    runs_dir: Path | None = None) -> tuple[list[dict[str, Any]], list[RunResult]]:
    """Run every job and return the jobs with their results, in the jobs' order. A configuration two
    comparisons share is trained once; every seed's runs train before the next seed's (so that a full tier stopped
    after a sitting has whole tables for its first seeds), the slowest of a seed's runs first. With ``runs_dir`` each run trains in its
    folder there (:func:`run_folder`), so that the same bench run again loses nothing: runs that ended are read
    back, stopped ones continue from their checkpoints (:func:`adaptplan.benches.runs.run_one`)."""
    todo = jobs(book, list(seeds), device, client_batching, target)
    keys = [json.dumps(j["config"], sort_keys=True, default=list) for j in todo]
    unique = list(dict.fromkeys(keys))
    first = {k: todo[keys.index(k)] for k in unique}
    unique.sort(key=lambda k: (first[k]["seed"], -cost(first[k]["config"])))
    work = [{**{f: first[k][f] for f in ("group", "label", "target", "config")},
             "round_weight": cost(first[k]["config"]) / max(1, first[k]["config"]["rounds"]),  # the bar's steps
             **({"folder": str(run_folder(runs_dir, first[k]))} if runs_dir is not None else {})} for k in unique]
    if runs_dir is not None and progress:
        states = [run_state(Path(w["folder"]), w) for w in work]
        ended, stopped, longer, again = (states.count(s) for s in ("ended", "stopped", "longer", "again"))
        if ended or stopped or longer or again:
            print(f"bench papers: of {len(work)} runs in {runs_dir}, {ended} ended before (read back), {stopped} "
                  f"continue from their checkpoints and {longer} go on from their last round to the recipe's longer "
                  "length" + (f"; {again} ended shorter without their checkpoints train again from the start to it"
                               if again else ""), file=sys.stderr)
    results = run_jobs(work, workers, "bench papers", progress)
    by_key = dict(zip(unique, results))
    return todo, [replace(by_key[k], group=j["group"], label=j["label"]) for k, j in zip(keys, todo)]


def run_folder(folder: Path, job: Mapping[str, Any]) -> Path:
    """Where ``job`` trains under ``folder``: ``folder/PAPER-PARTITION/LABEL-seedS/`` (beside its run file)."""
    return folder / job["group"].replace("/", "-") / f"{job['label']}-seed{job['seed']}"


def write_run_files(todo: Sequence[Mapping[str, Any]], folder: Path) -> list[Path]:
    """Every job of ``todo`` as a run file (docs/formats.md "Run files"), ``folder/PAPER-PARTITION/LABEL-seedS.toml``:
    ``adaptplan train --config FILE --out DIR`` trains that run alone, bit for bit as the bench does."""
    from trainers.config.run_file import run_file_text
    from trainers.config.train_config import TrainConfig

    written = []
    for job in todo:
        run = run_folder(folder, job)
        path = run.parent / f"{run.name}.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(run_file_text(TrainConfig.flat(**job["config"])), encoding="utf-8")
        written.append(path)
    return written


def cost(config: Mapping[str, Any]) -> float:
    """A run's rough relative cost (device steps, weighted), to start the slow runs first and to weigh the bar's
    rounds: an asynchronous method's round (``active`` and ``local_steps`` in its options: GAS, FedBuff, CA²FL) is a
    global iteration of active × E steps (GAS's ×1.5 for its server's generated activations)."""
    extra = config.get("extra", {})
    if "active" in extra and "local_steps" in extra:
        active = min(extra["active"], config["devices"]) if extra["active"] else -(-config["devices"] // 2)  # C
        steps = config["rounds"] * active * extra["local_steps"]
        return steps * (1.5 if config["algorithm"] == "gas" else 1.0)
    steps = config["rounds"] * config["devices"] * extra.get("participation", 1.0)
    psl_like = config["algorithm"] in ("gapsl", "psl") or extra.get("cycle_base") == "psl"
    return steps * (PSL_FAMILY_COST if psl_like else 1.0)


# ---- figures and verdicts ------------------------------------------------------------------------------------------

def accuracy_difference(a: RunResult, b: RunResult, protocol: str = "global") -> float | None:
    """Final accuracy of A minus B's by ``protocol``, in percentage points (None when either has none)."""
    fa, fb = a.final(protocol), b.final(protocol)
    if fa is None or fb is None:
        return None
    return 100.0 * (fa - fb)


def time_ratio(a: RunResult, b: RunResult, target: float, protocol: str = "global") -> float | None:
    """Simulated seconds to ``target`` of B over A's (by ``protocol``): ∞ when only B never reached it, 0 when
    only A never did, None when neither did."""
    ta, tb = a.time_to(target, protocol), b.time_to(target, protocol)
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
    """+1 when a seed's value agrees with the claim, −1 when it contradicts it, 0 otherwise (an ordering: +1 only for
    the claimed order itself, τ = 1; −1 for τ ≤ 0)."""
    if value is None:
        return 0
    if metric == "ordering":
        return 1 if value >= 1.0 - 1e-12 else -1 if value <= 0 else 0
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
    b_rise: float | None = None         # the plateau check of B (points, by plateau_protocol; module docstring)
    b_rise_as_judged: float | None = None   # the same by the claim's own protocol, where plateau_protocol differs
    bounds: list[str] = field(default_factory=list)   # time claims, per seed: "≥", "≤", "?" (a side's time bounded by
                                                       # its first evaluation) or ""
    orders: list[str] = field(default_factory=list)   # ordering claims, per seed: the measured order, best first

    @property
    def bounded(self) -> str:
        """How the grid bounds the measured ratio: "" (resolved in every seed), "≥"/"≤" (every seed with a value is a
        lower/upper bound), or a clause naming the bounded seeds."""
        marks = [m for m, v in zip(self.bounds, self.values) if v is not None and 0 < v < math.inf]
        if not any(marks):
            return ""
        if all(m == marks[0] for m in marks) and marks[0] in "≥≤":
            return marks[0]
        named = ", ".join(f"{m} in seed {s}" for s, m, v in zip(self.seeds, self.bounds, self.values) if m and v)
        return f" ({named}: a side crossed at its first evaluation)"

    @property
    def b_plateaued(self) -> bool | None:
        return None if self.b_rise is None else self.b_rise < PLATEAU_RISE

    @property
    def equal_time(self) -> str:
        """Time claims: the mean test accuracy of A and B at the equal simulated-time budget ("" otherwise)."""
        if not self.budgets:
            return ""
        a = [v for v in self.a_at_budget if v is not None]
        b = [v for v in self.b_at_budget if v is not None]
        none = "no evaluation by then"
        return (f"at equal simulated time (the shorter run's, mean {statistics.fmean(self.budgets):.3g} s): "
                f"{self.claim.a} {pct(statistics.fmean(a)) if a else none} vs {self.claim.b} "
                f"{pct(statistics.fmean(b)) if b else none} (mean over seeds)")

    @property
    def against_paper(self) -> str:
        """The measured mean against the paper's figure (the claim's ``margin``): "as large" (at least the paper's),
        "weaker" (the claimed direction, smaller), "opposite" (no effect or the other way); "" without a figure or a
        mean. A ratio bounded by the evaluation grid says so: a lower bound under the figure is "weaker or more"."""
        margin, mean = self.claim.margin, self.mean
        if margin is None or mean is None:
            return ""
        none = 1.0 if self.claim.metric == "time" else 0.0
        if mean <= none:
            return "opposite"
        if mean >= margin:
            return "as large" if self.bounded != "≤" else "as large or less (a bound)"
        return "weaker or more (a bound)" if self.bounded == "≥" else "weaker"

    @property
    def missing(self) -> str:
        """Why the claim has no measured value (its table cells read ``-``: :class:`adaptplan.report.Empty`)."""
        if self.claim.metric == "convergence":
            return "no seed"
        if self.claim.metric == "ordering":
            return "no seed where every method has a final accuracy"
        if self.claim.metric == "accuracy":
            return "no final accuracy of A and B in any seed"
        return "no seed where both A and B reached the target"

    @property
    def measured(self) -> str:
        if self.mean is None:
            return Empty(self.missing)
        if self.claim.metric == "convergence":
            n = len(self.seeds)
            return (f"{self.claim.b} did not converge in {self.b_missed}/{n} seeds, {self.claim.a} converged in "
                    f"{n - self.a_missed}/{n}")
        if self.claim.metric == "ordering":
            exact = self.signs.count(1)
            return f"τ {self.mean:+.2f}; the claimed order in {exact}/{len(self.seeds)} seeds"
        if self.claim.metric == "accuracy":
            return f"{self.mean:+.1f} pts"
        bound = self.bounded
        return f"{bound} {self.mean:.2f}×" if bound in ("≥", "≤") else f"{self.mean:.2f}×{bound}"

    @property
    def spread(self) -> str:
        n = len(self.seeds)
        if self.claim.metric == "convergence":
            return Empty("no final accuracy of B in any seed") if self.low is None else \
                f"{self.claim.b} final {self.low:.1f}..{self.high:.1f} %"
        if self.claim.metric == "ordering":
            if self.low is None:
                return Empty(self.missing)
            return f"τ {self.low:+.2f}..{self.high:+.2f}; seed {self.seeds[0]}: {self.orders[0]}" if self.orders \
                else f"τ {self.low:+.2f}..{self.high:+.2f}"
        if self.claim.metric == "accuracy":
            if self.low is None:
                return Empty(self.missing)
            text = f"{self.low:+.1f}..{self.high:+.1f}" if n > 1 else f"{self.low:+.1f} (1 seed)"
            return text + (f" (±{self.std:.1f})" if self.std is not None else "")
        text = "-" if self.low is None else (f"{self.low:.2f}..{self.high:.2f}×" if self.low != self.high or n == 1
                                             else f"{self.low:.2f}×")
        if self.a_missed and self.a_missed == self.b_missed:
            missed = [f"A and B not reached in {self.a_missed}/{n} seeds"]
        else:
            missed = [f"{side} not reached in {k}/{n} seeds" for side, k in (("A", self.a_missed), ("B", self.b_missed))
                      if k]
        text += "; " + ", ".join(missed) if missed else ""
        return Empty(self.missing, text) if self.low is None else text

    def to_json(self) -> dict[str, Any]:
        def finite(v: float | None) -> float | None:
            return v if v is not None and math.isfinite(v) else None

        per_seed = []
        for i, seed in enumerate(self.seeds):
            row: dict[str, Any] = {"seed": seed, "value": finite(self.values[i]), "sign": self.signs[i]}
            if self.orders:
                row["measured_order"] = self.orders[i]
            if self.claim.metric == "time":
                row.update(a_seconds_to_target=self.a_times[i], b_seconds_to_target=self.b_times[i],
                           value_bound={"≥": "lower", "≤": "upper", "?": "unresolved", "": None}[self.bounds[i]],
                           equal_time_budget_s=self.budgets[i], a_accuracy_at_budget=self.a_at_budget[i],
                           b_accuracy_at_budget=self.b_at_budget[i])
            per_seed.append(row)
        return {**asdict(self.claim), "measured": finite(self.mean), "low": finite(self.low), "high": finite(self.high),
                "std": self.std, "a_not_reached": self.a_missed, "b_not_reached": self.b_missed,
                "per_seed": per_seed, "verdict": self.verdict, "paper_margin": self.claim.margin,
                "against_paper": self.against_paper or None, "b_rise_pts": self.b_rise,
                "b_rise_protocol": plateau_protocol(self.claim.protocol),
                "b_rise_claim_protocol_pts": self.b_rise_as_judged, "b_plateaued": self.b_plateaued,
                "units": UNITS[self.claim.metric]}


UNITS = {"accuracy": "percentage points, A - B",
         "time": "simulated seconds to target, B / A (> 1: A faster); measured: geometric mean over the seeds where "
                 "both reached the target",
         "convergence": "per seed +1 (A converged, B did not), -1 (B converged), 0 (neither), by the paper's "
                        "criterion (gain < 2 points over 5 evaluations, counted above twice chance); measured: their "
                        "mean; low..high: B's final accuracy in percent",
         "ordering": "per seed Kendall's tau between the claimed order (best first) and the methods' final "
                     "accuracies: 1 = the claimed order; measured: its mean"}
"""What a claim's figures are, by metric (results.json's ``units``)."""


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
    if claim.metric == "convergence":
        return _convergence(claim, a_runs, b_runs, seeds)
    if claim.metric == "accuracy":
        values = [accuracy_difference(a, b, claim.protocol) for a, b in zip(a_runs, b_runs)]
        present = [v for v in values if v is not None]
    else:
        values = [time_ratio(a, b, target, claim.protocol) for a, b in zip(a_runs, b_runs)]
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
        comparison.a_times = [a.time_to(target, claim.protocol) for a in a_runs]
        comparison.b_times = [b.time_to(target, claim.protocol) for b in b_runs]
        comparison.a_missed = sum(t is None for t in comparison.a_times)
        comparison.b_missed = sum(t is None for t in comparison.b_times)
        comparison.bounds = [grid_bound(a.time_is_a_bound(target, claim.protocol), b.time_is_a_bound(target, claim.protocol))
                             for a, b in zip(a_runs, b_runs)]
        comparison.budgets = [min(a.sim_seconds, b.sim_seconds) for a, b in zip(a_runs, b_runs)]
        comparison.a_at_budget = [a.accuracy_at(t, claim.protocol) for a, t in zip(a_runs, comparison.budgets)]
        comparison.b_at_budget = [b.accuracy_at(t, claim.protocol) for b, t in zip(b_runs, comparison.budgets)]
    comparison.verdict = verdict(values, claim.metric, mean)
    return watch_plateau(comparison, b_runs)


def _convergence(claim: Claim, a_runs: Sequence[RunResult], b_runs: Sequence[RunResult],
                 seeds: Sequence[int]) -> Comparison:
    """A convergence claim measured per seed: +1 when A converged and B did not, −1 when B converged, 0 otherwise
    (module docstring); low..high: B's final accuracy (points)."""
    a_conv = [bool(a.converged(claim.protocol)) for a in a_runs]
    b_conv = [bool(b.converged(claim.protocol)) for b in b_runs]
    values: list[float | None] = [-1.0 if b else 1.0 if a else 0.0 for a, b in zip(a_conv, b_conv)]
    finals = [100.0 * f for f in (b.final(claim.protocol) for b in b_runs) if f is not None]
    mean = statistics.fmean(v for v in values if v is not None) if values else None
    comparison = Comparison(claim, list(seeds), values, [agreement(v, claim.metric) for v in values], mean,
                            min(finals) if finals else None, max(finals) if finals else None, None)
    comparison.a_missed, comparison.b_missed = a_conv.count(False), b_conv.count(False)   # seeds not converged
    comparison.verdict = verdict(values, claim.metric, mean)
    return watch_plateau(comparison, b_runs)


def kendall_tau(claimed: Sequence[str], finals: Mapping[str, float]) -> float:
    """Kendall's τ (τ-a) between the ``claimed`` order (best first) and the one the ``finals`` (accuracy per method)
    give: (concordant − discordant pairs) / all pairs, a tie in accuracy neither; 1 = the claimed order exactly."""
    pairs = [(claimed[i], claimed[j]) for i in range(len(claimed)) for j in range(i + 1, len(claimed))]
    score = sum((finals[better] > finals[worse]) - (finals[better] < finals[worse]) for better, worse in pairs)
    return score / len(pairs)


def compare_ordering(claim: Claim, runs: Mapping[str, Sequence[RunResult]], seeds: Sequence[int]) -> Comparison:
    """An ordering claim measured per seed: Kendall's τ between the claimed order and the methods' final accuracies
    (by the claim's protocol); None for a seed where a method has none. low..high: the seeds' τ."""
    finals = [{m: runs[m][i].final(claim.protocol) for m in claim.order} for i in range(len(seeds))]
    values: list[float | None] = [None if any(f is None for f in seed.values())
                                  else kendall_tau(claim.order, {m: float(f or 0.0) for m, f in seed.items()})
                                  for seed in finals]
    present = [v for v in values if v is not None]
    mean = statistics.fmean(present) if present else None
    comparison = Comparison(claim, list(seeds), values, [agreement(v, claim.metric) for v in values], mean,
                            min(present) if present else None, max(present) if present else None, None)
    comparison.verdict = verdict(values, claim.metric, mean)
    watch_plateau(comparison, runs[claim.b])
    comparison.orders = [" > ".join(sorted(claim.order, key=lambda m: -(seed[m] or 0.0))) for seed in finals]
    return comparison


def grid_bound(a_bounded: bool, b_bounded: bool) -> str:
    """What B/A is when a side's time is its first evaluation's (an upper bound on its crossing): A's → the ratio is a
    lower bound "≥", B's → an upper bound "≤", both → "?" (neither), neither → ""."""
    return {(True, False): "≥", (False, True): "≤", (True, True): "?"}.get((a_bounded, b_bounded), "")


def agreeing(value: float, threshold: float, decimals: int = 1) -> str:
    """``value`` signed, with the fewest decimals (from ``decimals``) at which it rounds to the same side of
    ``threshold`` as it is (1.99 against 2 prints +1.99, not +2.0); the shortest exact form (``repr``) where no
    fixed number of decimals up to 12 does."""
    for d in range(decimals, 13):
        text = f"{value:+.{d}f}"
        if (float(text) < threshold) == (value < threshold):
            return text
    return f"{value:+}"


def points(rise_pts: float | None) -> str:
    """A plateau check's rise as printed: signed points with enough digits to agree with its label, or "-"."""
    return "-" if rise_pts is None else f"{agreeing(rise_pts, PLATEAU_RISE)} pts"


def rise(runs: Sequence[RunResult], protocol: str = "global") -> float | None:
    """The plateau check: points by which the runs' mean accuracy (by ``protocol``, over seeds) averaged over the
    last third of the evaluations exceeds its average over the middle third; None with fewer than 3 evaluations."""
    accuracies = [point[1] for point in mean_curve(runs, protocol)]
    third = len(accuracies) // 3
    if third == 0:
        return None
    return 100.0 * (statistics.fmean(accuracies[-third:]) - statistics.fmean(accuracies[-2 * third:-third]))


def plateau_protocol(protocol: str) -> str:
    """The figure the plateau check reads for a claim judged by ``protocol``: the claim's own, but for the
    participants' figure (``local-sampled``), a new draw of the round's few devices at every evaluation, whose
    swings between evaluations are noise of the draw larger than the check's :data:`PLATEAU_RISE` points (CycleSL
    on Shakespeare, 5 of 100 roles a round: PSL seed 0 read 5.5 % and then 17.3 % at its last two evaluations,
    2026-12-07). Such a claim is checked on the pooled figure of the same runs (``local``: every device's held-out
    samples through its model, the same runs and evaluation rounds); the participants' rise is printed beside it."""
    return "local" if protocol == "local-sampled" else protocol


def watch_plateau(comparison: Comparison, b_runs: Sequence[RunResult]) -> Comparison:
    """Set ``comparison``'s plateau check of B (module docstring) from B's runs, and B's rise by the claim's own
    protocol where the check reads another (:func:`plateau_protocol`)."""
    protocol = comparison.claim.protocol
    comparison.b_rise = rise(b_runs, plateau_protocol(protocol))
    if plateau_protocol(protocol) != protocol:
        comparison.b_rise_as_judged = rise(b_runs, protocol)
    return comparison


def plateau_line(found: Sequence[Comparison], paper: str) -> str:
    """The plateau check of the baselines of ``paper``'s claims, one clause per (partition, baseline, protocol)."""
    seen: dict[tuple[str, str, str], Comparison] = {}
    for c in found:
        if c.claim.paper == paper:
            seen.setdefault((c.claim.group.split("/", 1)[1], c.claim.b, c.claim.protocol), c)
    clauses = [f"{b} ({group}, {plateau_protocol(protocol)}) {points(c.b_rise)}: "
               f"{'too few evaluations' if c.b_rise is None else 'plateaued' if c.b_rise < PLATEAU_RISE else 'STILL RISING'}"
               + ("" if plateau_protocol(protocol) == protocol
                  else f" (by the claim's {protocol} figure {points(c.b_rise_as_judged)})")
               for (group, b, protocol), c in seen.items()]
    return (f"  plateau check (each baseline's mean accuracy over the last third of its evaluations minus the middle "
            f"third's; < {PLATEAU_RISE:g} pts: plateaued): " + "; ".join(clauses))


def comparisons(todo: Sequence[Mapping[str, Any]], results: Sequence[RunResult], book: Mapping[str, Recipe],
                target: float | None = None) -> list[Comparison]:
    """Every claim of the recipes, measured from the runs (``target`` replaces the recipes' target accuracy)."""
    cell = {(j["group"], j["label"], j["seed"]): r for j, r in zip(todo, results)}
    seeds = list(dict.fromkeys(j["seed"] for j in todo))
    out = []
    for recipe in book.values():
        goal = recipe.target_accuracy if target is None else target
        for claim in claims(recipe):
            if claim.metric == "ordering":
                out.append(compare_ordering(claim, {m: [cell[claim.group, m, s] for s in seeds] for m in claim.order},
                                            seeds))
                continue
            out.append(compare(claim, [cell[claim.group, claim.a, s] for s in seeds],
                               [cell[claim.group, claim.b, s] for s in seeds], seeds, goal))
    return out


# ---- output --------------------------------------------------------------------------------------------------------

COLUMNS = ("claim", "the paper's figure", "metric", "measured (mean)", "spread over seeds", "verdict", "vs the figure")


def _aligned(rows: Sequence[Sequence[str]]) -> list[str]:
    """The claims table's lines, indented: a header, a rule and ``rows``, every column left-aligned."""
    table = format_table(list(COLUMNS), [list(row) for row in rows], numbers_right=False)
    return ["  " + line.rstrip() for line in table.splitlines()]


def metric_name(c: Comparison, target: float) -> str:
    if c.claim.metric == "convergence":
        return f"convergence ({c.claim.protocol}): A yes, B no"
    if c.claim.metric == "ordering":
        return f"order of final acc. ({c.claim.protocol}), Kendall τ"
    return (f"final acc. ({c.claim.protocol}), A−B" if c.claim.metric == "accuracy"
            else f"s to {target:.0%} ({c.claim.protocol}), B/A")


def table(found: Sequence[Comparison], book: Mapping[str, Recipe], todo: Sequence[Mapping[str, Any]],
          results: Sequence[RunResult], target: float | None = None) -> str:
    """Per paper: its title, the paper's figures, the one training setting of its methods, then its claims (paper's
    figure, measured mean, spread, verdict); then what does not hold, and the per-run table."""
    seeds = list(dict.fromkeys(j["seed"] for j in todo))
    lines = [f"Paper claims from their recipes (adaptplan/benches/recipes/*.toml), {len(seeds)} seed(s) "
             f"({', '.join(map(str, seeds))}). A = the claimed winner, B = its baseline; final acc.: A − B in "
             f"percentage points; s to target: simulated seconds, B's over A's (> 1: A faster; mean: geometric, over "
             f"the seeds where both reached it); (global) = the test set, (local) = each device's model on its own "
             f"held-out samples, (local-sampled) = the same over the round's participants only"]
    for key, recipe in book.items():
        goal = recipe.target_accuracy if target is None else target
        lines += ["", f"{recipe.title} — paper: {recipe.paper}",
                  f"  data: {recipe.run['dataset']}, {recipe.run['devices']} devices, model {recipe.run['model']}"
                  + (f", cut {recipe.run['cut']}" if recipe.run.get("cut") is not None else ", cuts by each policy")
                  + f"; partitions: {', '.join(p.label for p in recipe.partitions)}",
                  f"  setting — {recipe.setting.describe()}"]
        lines += _aligned([[c.claim.claim, c.claim.source, metric_name(c, goal), c.measured, c.spread, c.verdict,
                            c.against_paper or ("a statement: judged by the verdict"
                                                if c.claim.metric in ("convergence", "ordering")
                                                else "no number in the paper" if c.claim.margin is None
                                                else "no measured mean")]
                           for c in found if c.claim.paper == key])
        lines.append(plateau_line(found, key))
        lines += layout_table(recipe, todo, results)
    failing = [c for c in found if c.verdict != "holds"]
    lines.append("")
    if not failing:
        lines.append("Every claim holds here (the sign agrees in every seed; sizes above).")
    for c in failing:
        lines.append(f"{'DOES NOT HOLD' if c.verdict.startswith('does not') else 'WITHIN NOISE'}: {c.claim.claim} "
                     f"— measured {c.measured}, {c.spread}")
    for c in found:
        if c.equal_time:
            lines.append(f"For context ({c.claim.paper}, not part of the verdict): {c.equal_time}")
    lines.append("")
    lines.append(run_table(todo, results))
    return "\n".join(lines)


def layout_table(recipe: Recipe, todo: Sequence[Mapping[str, Any]], results: Sequence[RunResult]) -> list[str]:
    """The paper's table as it lays it out: one row per method, one column per partition (skew), each cell the
    final accuracy by the recipe's protocol, mean ± sample standard deviation over the seeds ("-" where no seed
    has one; the mean alone with one seed)."""
    finals: dict[tuple[str, str], list[float]] = {}
    for job, r in zip(todo, results):
        value = r.final(recipe.protocol)
        if value is not None and job["group"].split("/", 1)[0] == recipe.key:
            finals.setdefault((job["label"], job["group"].split("/", 1)[1]), []).append(100 * value)

    def cell(values: list[float]) -> str:
        if not values:
            return "-"
        return f"{statistics.fmean(values):.1f}" + (f" ± {statistics.stdev(values):.1f}" if len(values) > 1 else "")

    rows = [[m.label, *(cell(finals.get((m.label, p.label), [])) for p in recipe.partitions)] for m in recipe.methods]
    table = format_table(["method", *(p.label for p in recipe.partitions)], rows)
    return [f"  as the paper lays it out: final accuracy ({recipe.protocol}, %), mean ± s.d. over the seeds"] + \
        ["    " + line.rstrip() for line in table.splitlines()]


def run_table(todo: Sequence[Mapping[str, Any]], results: Sequence[RunResult]) -> str:
    """Final accuracy of every run (paper/partition, method × seed), global / local / local over the last round's
    participants (the local protocol the CycleSL authors' code runs); for runs with a target also
    the simulated seconds to it in brackets (``[-]``: never reached); under it, why any other figure reads ``-``."""
    seeds = list(dict.fromkeys(j["seed"] for j in todo))
    cell = {(j["group"], j["label"], j["seed"]): (j, r) for j, r in zip(todo, results)}
    width = max([len(g) for g, _, _ in cell] + [9])
    runs = max([len(label) for _, label, _ in cell] + [10])
    lines = ["Final accuracy per run, global / local / local over the round's participants (seconds: simulated s to "
             "the target, [-] = not reached)",
             f"  {'comparison':<{width}} {'run':<{runs}} " + " ".join(f"{'seed ' + str(s):>30}" for s in seeds)
             + f" {'mean':>23}"]
    empty: list[list[str]] = []
    for group, label in dict.fromkeys((j["group"], j["label"]) for j in todo):
        row = []
        for s in seeds:
            job, r = cell[group, label, s]
            figures = [pct(r.final_accuracy, no_evaluation(r)), pct(r.final_local_accuracy, no_local(r)),
                       pct(r.final_local_sampled_accuracy, no_local(r))]
            empty.append(figures)
            text = " / ".join(figures)
            if group.startswith(("gas/", "adaptsfl/")):
                text += f" [{seconds(r.time_to(job['target']))}]"
            if r.diverged_round:
                text += f" NaN@{r.diverged_round}"
            row.append(f"{text:>30}")
        means = []
        for protocol in PROTOCOLS:
            finals = [cell[group, label, s][1].final(protocol) for s in seeds]
            present = [f for f in finals if f is not None]
            means.append(pct(statistics.fmean(present)) if present else "-")
        lines.append(f"  {group:<{width}} {label:<{runs}} " + " ".join(row) + f" {' / '.join(means):>23}")
    return "\n".join(lines + empty_notes(list(PROTOCOLS), empty, indent="  "))


def save_json(found: Sequence[Comparison], book: Mapping[str, Recipe], todo: Sequence[Mapping[str, Any]],
              results: Sequence[RunResult], path: str | os.PathLike) -> None:
    """``{"seeds", "verdict_rule", "papers": {KEY: {title, paper, setting, run, sources, partitions, methods}},
    "claims": [...], "runs": [every run's figures, with its paper/partition, label, seed and config]}``."""
    data = {"seeds": list(dict.fromkeys(j["seed"] for j in todo)),
            "verdict_rule": "does not hold at this scale: the mean has the wrong sign or is zero (no seed where "
                            "both reached the target: fewer seeds for the claim than against it); holds: every seed "
                            "agrees with the claim; within noise: otherwise (the seeds disagree)",
            "papers": {k: {"title": r.title, "paper": r.paper, "protocol": r.protocol, "setting": r.setting.to_json(),
                           "run": dict(r.run), "sources": dict(r.sources),
                           "partitions": [asdict(p) for p in r.partitions],
                           "methods": [asdict(m) for m in r.methods]} for k, r in book.items()},
            "claims": [c.to_json() for c in found],
            "runs": [{"paper": j["group"].split("/")[0], "comparison": j["group"], "label": j["label"], "seed": j["seed"],
                      "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in j["config"].items()},
                      **asdict(r), "time_to_target_s": r.time_to(j["target"])} for j, r in zip(todo, results)]}
    Path(path).write_text(json.dumps(data, indent=2, allow_nan=False, default=dict), encoding="utf-8")


def mean_curve(runs: Sequence[RunResult], protocol: str = "global") -> list[tuple[float, float, float, float]]:
    """(mean simulated s, mean, min, max accuracy by ``protocol``) at each evaluation index the runs all reached."""
    curves = [r.points(protocol) for r in runs]
    n = min((len(c) for c in curves), default=0)
    out = []
    for k in range(n):
        accs = [c[k][1] for c in curves]
        out.append((statistics.fmean(c[k][0] for c in curves), statistics.fmean(accs), min(accs), max(accs)))
    return out


LOG_TIME_SPAN = 5.0
"""A panel whose slowest method runs this many times longer (simulated seconds) than its fastest draws time on a log
axis, so that the fast methods' curves are not squeezed against its left edge."""


def plot(todo: Sequence[Mapping[str, Any]], results: Sequence[RunResult], book: Mapping[str, Recipe],
         path: str | os.PathLike) -> None:
    """One panel per comparison (paper and partition), in rows of at most
    :data:`adaptplan.benches.runs.PANEL_COLUMNS`, each with its own axes: accuracy by the paper's protocol against
    simulated seconds, the mean over seeds per method (by evaluation index) with its min..max band, every evaluation
    a marker; the target as a dotted line where a claim is timed; a chance line at 1/M and a y-range from 0 over it
    and every point; time on a log axis where the methods' lengths differ :data:`LOG_TIME_SPAN`-fold or more; each
    panel's legend beside it, where it hides no point."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from adaptplan.benches.runs import panel_grid
    from trainers.run.plotting import chance_and_range

    groups = list(dict.fromkeys(j["group"] for j in todo))
    fig, axes = panel_grid(len(groups), panel=(6.2, 3.8))
    for ax, group in zip(axes, groups):
        recipe = book[group.split("/")[0]]
        protocol = recipe.protocol
        styles = iter(["-", "--", "-.", ":"] * 4)
        drawn: list[float] = []
        ends: list[float] = []
        starts: list[float] = []
        for label in dict.fromkeys(j["label"] for j in todo if j["group"] == group):
            curve = mean_curve([r for j, r in zip(todo, results) if j["group"] == group and j["label"] == label],
                               protocol)
            if curve:
                xs = [p[0] for p in curve]
                line, = ax.plot(xs, [p[1] for p in curve], marker="o", markersize=3, linestyle=next(styles),
                                label=label)
                ax.fill_between(xs, [p[2] for p in curve], [p[3] for p in curve], color=line.get_color(),
                                alpha=0.15)
                drawn += [v for p in curve for v in p[1:]]
                starts.append(xs[0])
                ends.append(xs[-1])
        if any(c.metric == "time" for c in recipe.claims):
            target = next(j["target"] for j in todo if j["group"] == group)
            ax.axhline(target, color="grey", linestyle=":", linewidth=1, label=f"target {target:.0%}")
            drawn.append(target)
        chance_and_range(ax, drawn, [r.num_classes for j, r in zip(todo, results) if j["group"] == group])
        log = bool(ends) and min(starts) > 0 and max(ends) >= LOG_TIME_SPAN * min(ends)
        if log:
            ax.set_xscale("log")
        ax.set_title(f"{recipe.title}: {group.split('/', 1)[1]}", fontsize=9)
        ax.set_xlabel("simulated seconds" + (" (log scale)" if log else ""))
        ax.set_ylabel(f"accuracy, {protocol} protocol\n(mean over seeds)")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    fig.savefig(path)
    plt.close(fig)
