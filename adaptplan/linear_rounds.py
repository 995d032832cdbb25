"""Rounds to a target accuracy linear in the aggregation interval, fitted to pilot runs, and the plan that minimises
the simulated seconds under it (docs/model.md §12 "A rounds law linear in I").

Eq. (15) grows the rounds with the drift term 4γ²I²A_{L_c}: quadratic in I and ordered by the cut through A_{L_c}
(eq. 29, estimated at w⁰). What `adaptplan bench plans` measured (docs/measured.md, issue 66) is neither: with label
skew the rounds to 30 % grew about linearly in I (2 label shards per device, every device at cut 4: 50, 80, 142 rounds
at I = 1, 2, 4), and cuts 2–4 drifted alike while A_{L_c} differed 10 ×. This module models exactly that, and no more:

    R(I) = R₁ · (1 + κ (I − 1))                                    (rounds to the target accuracy)

with R₁ the rounds at I = 1 and κ ≥ 0 the relative cost of one more round between averages, the same at every cut.
It is the form of the local-SGD bounds whose step size is tuned to the horizon (there the heterogeneity term of the
rounds grows as I, not I²), not a bound of the paper's; it is adaptplan's addition and a claim only as far as the
bench's held-out settings measured it.

* **Fit** (:func:`fit_linear_rounds`): least squares of the pilots' measured rounds R_k on their intervals I_k,
  R_k ≈ p + q·I_k; R₁ = p + q, κ = q / R₁. Where q ≤ 0 (the pilots show no cost of a longer interval) κ = 0 and R₁ is
  the mean R_k (also where q = 0). The pilots must span two intervals.
* **Plan** (:func:`plan_linear_rounds`): the rounds do not depend on the cuts, so at each interval I the best cuts
  are the latency-best ones, the MS step (34) with no drift term (its ratio's denominator I·c is then the same for
  every cut vector, and Dinkelbach's MILP, or the threshold sweep, minimises I·T_split + T_agg exactly). The plan is
  the I of 1..I_max (with its cuts) that minimises the relaxed seconds Θ(I) = R(I)·(T_split + T_agg / I), eq. (28)'s
  form with the law's rounds: every I is tried, so the plan is the exact optimum of Θ over that range. I_max is the
  pilots' longest interval: the law is not extrapolated past what the pilots measured (without that cap, on the IID
  bench the law's small κ sent two seeds to I = 22 and 31 at cut 4, far past the pilots' I = 8). Its prediction is
  eq. (26) with ⌈R(I)⌉ rounds.

**Per cut** (:class:`PerCutRounds`; docs/model.md §12 "Per cut"): where the rounds depend on the cut — a defence
whose accuracy cost differs by cut (NoPeek on the IID bench: about 44 rounds at cut 1, 64–96 at cut 3, 110 to never
at cuts 4–5) — each cut gets its own law, R_j(I) = R₁(j)·(1 + κ_j(I − 1)) fitted to that cut's pilots, valid only
across the intervals it was piloted at (a cut piloted at I = 1 alone plans only I = 1), and
R(x, I) = max_i R_{x_i}(I): the plan converges as its slowest-converging cut. Each pilot counts for its deepest cut
(train every device of a pilot at one cut). Planned (:func:`plan_per_cut_rounds`) exactly under the law: at each I,
for each threshold r among the usable cuts' R_j(I), the latency-best cuts among those with R_j(I) ≤ r, scored at
their own max; a cut never piloted (or whose pilots missed the target) is never planned. It is adaptplan's
addition, a claim only as far as the bench measured it (benchmarks/results/plans/README.md).

Units: rounds, seconds (T_split, T_agg of §2.4), κ per round of interval (dimensionless).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Sequence

import numpy as np

from adaptplan.calibration import PilotRun
from adaptplan.constants import ConvergenceConstants
from adaptplan.convergence import whole_rounds
from adaptplan.errors import InfeasibleError, InputError
from adaptplan.latency import LatencyModel, total_latency
from adaptplan.model_profile import ModelProfile
from adaptplan.plan import Plan
from adaptplan.system import SystemSpec
from solvers.bcd import choose_ms_method
from solvers.dinkelbach import solve_dinkelbach
from solvers.leakage_budget import LeakageBudget
from solvers.problem import PlanningProblem
from solvers.threshold import solve_ms_exact


@dataclass(frozen=True)
class LinearRounds:
    """R(I) = ``rounds_at_one``·(1 + ``kappa``·(I − 1)) rounds to ``target_accuracy`` (module docstring), fitted to
    ``pilots``; ``message`` says how."""

    rounds_at_one: float
    kappa: float
    target_accuracy: float
    pilots: tuple[PilotRun, ...]
    message: str
    law: ClassVar[str] = "linear"

    def rounds(self, interval: float) -> float:
        """R(I), real-valued rounds."""
        return self.rounds_at_one * (1.0 + self.kappa * (interval - 1.0))

    def rounds_for(self, cuts: Sequence[int], interval: float) -> float:
        """R(I), whatever the cuts."""
        return self.rounds(interval)

    def solver(self) -> dict[str, Any]:
        return {"method": "linear-rounds", "rounds_at_one": self.rounds_at_one, "kappa": self.kappa,
                "message": self.message}

    def plan(self, profile: ModelProfile, system: SystemSpec, candidates: Sequence[int] | None = None,
             leakage: LeakageBudget | None = None) -> "LinearRoundsPlan":
        """:func:`plan_linear_rounds` under this law."""
        return plan_linear_rounds(self, profile, system, candidates=candidates, leakage=leakage)

    def to_json(self) -> dict[str, Any]:
        return {"law": "linear", "target_accuracy": self.target_accuracy, "rounds_at_one": self.rounds_at_one,
                "kappa": self.kappa, "message": self.message,
                "pilots": pilots_json(self.pilots, lambda p: self.rounds(p.interval))}


def pilots_json(pilots: Sequence[PilotRun], fitted: Callable[[PilotRun], float]) -> list[dict[str, Any]]:
    """Each pilot as a law's JSON keeps it: its source, interval, deepest cut, measured and ``fitted`` rounds."""
    return [{"source": p.source, "interval": p.interval, "deepest_cut": p.deepest_cut, "measured_rounds": p.rounds,
             "fitted_rounds": fitted(p)} for p in pilots]


def fit_linear_rounds(pilots: Sequence[PilotRun]) -> LinearRounds:
    """The law fitted to ``pilots`` (module docstring "Fit"); :class:`InputError` naming ``--pilots`` where they do
    not span two intervals, are read for different targets, or give no positive R₁."""
    if len({p.interval for p in pilots}) < 2:
        raise InputError(f"a rounds law linear in I needs pilots at two intervals at least, got "
                         f"{sorted({p.interval for p in pilots})}: add a pilot with another --interval", field="--pilots")
    if len({p.target_accuracy for p in pilots}) != 1:
        raise InputError("the pilots must be read for one target accuracy", field="--pilots")
    intervals = np.array([float(p.interval) for p in pilots])
    rounds = np.array([float(p.rounds) for p in pilots])
    centred = intervals - intervals.mean()
    q = float(centred @ (rounds - rounds.mean()) / (centred @ centred))     # R ≈ p + q·I, least squares
    p = float(rounds.mean() - q * intervals.mean())
    if q <= 0:
        at_one, kappa = float(np.mean(rounds)), 0.0
        message = (f"the {len(pilots)} pilots show no cost of a longer interval, so κ = 0: the rounds are "
                   f"{at_one:.4g} at every I and the plan's I is the longest tried")
    else:
        at_one = float(p + q)
        if at_one <= 0:
            raise InputError(f"the pilots' line R = {p:.4g} + {q:.4g}·I gives no positive rounds at I = 1: add a "
                             "pilot at --interval 1", field="--pilots")
        kappa = float(q / at_one)
        message = (f"R(I) = {at_one:.4g}·(1 + {kappa:.3g}·(I − 1)) rounds to {pilots[0].target_accuracy:.1%}, "
                   f"fitted to {len(pilots)} pilots")
    return LinearRounds(at_one, kappa, pilots[0].target_accuracy, tuple(pilots), message)


@dataclass(frozen=True)
class PerCutRounds:
    """R(x, I) = max_i R_{x_i}(I) rounds to ``target_accuracy`` (module docstring "Per cut"): ``laws[j]`` cut j's own
    law R_j(I) = R₁(j)·(1 + κ_j(I − 1)) (:func:`fit_linear_rounds` of its pilots; a cut piloted at one interval I₀
    only: its mean rounds there, κ_j = 0), valid on ``intervals[j]`` = (the cut's shortest, longest pilot interval);
    fitted to ``pilots``; ``message`` says how."""

    laws: dict[int, LinearRounds]
    intervals: dict[int, tuple[int, int]]
    target_accuracy: float
    pilots: tuple[PilotRun, ...]
    message: str
    law: ClassVar[str] = "per-cut"

    def usable(self, interval: float) -> list[int]:
        """The cuts the law knows at ``interval`` (piloted across it), in order."""
        return [j for j, (lo, hi) in sorted(self.intervals.items()) if lo <= interval <= hi]

    def rounds_for(self, cuts: Sequence[int], interval: float) -> float:
        """R(x, I), real-valued rounds; :class:`InputError` naming ``cuts`` for a cut not piloted across I."""
        outside = sorted({int(c) for c in cuts} - set(self.usable(interval)))
        if outside:
            known = "; ".join(f"cut {j}: I {lo}–{hi}" if lo < hi else f"cut {j}: I = {lo}"
                              for j, (lo, hi) in sorted(self.intervals.items()))
            raise InputError(f"cut{'s' if len(outside) > 1 else ''} {', '.join(map(str, outside))} had no pilots across "
                             f"I = {interval:g} (piloted: {known})", field="cuts")
        return max(self.laws[int(c)].rounds(interval) for c in cuts)

    def plan(self, profile: ModelProfile, system: SystemSpec, candidates: Sequence[int] | None = None,
             leakage: LeakageBudget | None = None) -> "LinearRoundsPlan":
        """:func:`plan_per_cut_rounds` under this law."""
        return plan_per_cut_rounds(self, profile, system, candidates=candidates, leakage=leakage)

    def _by_cut(self) -> dict[str, dict[str, Any]]:
        return {str(j): {"rounds_at_one": law.rounds_at_one, "kappa": law.kappa, "intervals": list(self.intervals[j])}
                for j, law in sorted(self.laws.items())}

    def solver(self) -> dict[str, Any]:
        return {"method": "per-cut-rounds", "by_cut": self._by_cut(), "message": self.message}

    def to_json(self) -> dict[str, Any]:
        return {"law": self.law, "target_accuracy": self.target_accuracy, "by_cut": self._by_cut(),
                "message": self.message,
                "pilots": pilots_json(self.pilots, lambda p: self.laws[p.deepest_cut].rounds(p.interval))}


def fit_per_cut_rounds(pilots: Sequence[PilotRun]) -> PerCutRounds:
    """The law per cut fitted to ``pilots`` (module docstring "Per cut"), each pilot counted for its deepest cut: per
    cut, :func:`fit_linear_rounds` of its pilots where they span two intervals, else their mean rounds at their one
    interval; :class:`InputError` naming ``--pilots`` for pilots read for different targets (or a cut's line that
    gives no positive R₁)."""
    if not pilots:
        raise InputError("a rounds law per cut needs pilots", field="--pilots")
    if len({p.target_accuracy for p in pilots}) != 1:
        raise InputError("the pilots must be read for one target accuracy", field="--pilots")
    by_cut: dict[int, list[PilotRun]] = {}
    for p in pilots:
        by_cut.setdefault(p.deepest_cut, []).append(p)
    laws, intervals, said = {}, {}, []
    for j, own in sorted(by_cut.items()):
        spans = sorted({p.interval for p in own})
        intervals[j] = (spans[0], spans[-1])
        if len(spans) > 1:
            laws[j] = fit_linear_rounds(own)
            said.append(f"cut {j}: R₁ {laws[j].rounds_at_one:.4g}, κ {laws[j].kappa:.3g}, I {spans[0]}–{spans[-1]}")
        else:
            mean = float(np.mean([p.rounds for p in own]))
            laws[j] = LinearRounds(mean, 0.0, own[0].target_accuracy, tuple(own), f"{mean:.4g} rounds at I = {spans[0]}")
            said.append(f"cut {j}: {mean:.4g} rounds at I = {spans[0]}")
    message = (f"R(x, I) = max_i R_(x_i)(I) rounds to {pilots[0].target_accuracy:.1%}, per cut ({'; '.join(said)}); "
               f"fitted to {len(pilots)} pilots")
    return PerCutRounds(laws, intervals, pilots[0].target_accuracy, tuple(pilots), message)


RoundsLaw = LinearRounds | PerCutRounds
"""A rounds law fitted to pilots (``--rounds-law linear`` or ``per-cut``)."""
ROUNDS_LAW_TYPES = (LinearRounds, PerCutRounds)


def fit_rounds_law(pilots: Sequence[PilotRun], law: str) -> RoundsLaw:
    """The law named ``law`` (``linear`` or ``per-cut``) fitted to ``pilots``."""
    return fit_per_cut_rounds(pilots) if law == "per-cut" else fit_linear_rounds(pilots)


@dataclass(frozen=True)
class LinearRoundsPlan:
    """The plan under a :class:`LinearRounds` law: ``cuts`` (1-based, one per device) and ``interval`` I; the law's
    ``rounds`` R(I) (real); ``objective_s`` Θ(I) and, per I tried, ``by_interval`` (I, Θ(I) in seconds, its cuts).
    :func:`as_plan` scores it as a :class:`~adaptplan.plan.Plan` (eq. 26's seconds)."""

    cuts: tuple[int, ...]
    interval: int
    rounds: float
    objective_s: float
    by_interval: tuple[tuple[int, float, tuple[int, ...]], ...]

    @property
    def integer_rounds(self) -> int:
        """⌈R(I)⌉ (:func:`adaptplan.convergence.whole_rounds`)."""
        return whole_rounds(self.rounds)


def latency_problem(profile: ModelProfile, system: SystemSpec, candidates: Sequence[int] | None = None,
                    leakage: LeakageBudget | None = None) -> PlanningProblem:
    """The MS step's instance without a drift term: constants with every σ_j², G_j² zero and c = 1, 2ϑ/γ = 1, so
    that its objective (28) at (I, x) is T_split(x) + T_agg(x)/I, the seconds per round; each device restricted to
    the cuts its memory and ``leakage`` budget admit (:mod:`solvers.leakage_budget`)."""
    L = profile.num_cuts
    constants = ConvergenceConstants(beta=1.0, gamma=1.0, theta=0.5, epsilon=1.0, sigma2=(0.0,) * L, G2=(0.0,) * L)
    return PlanningProblem.from_parts(profile, system, constants, candidates, leakage)


def plan_linear_rounds(law: LinearRounds, profile: ModelProfile, system: SystemSpec, *,
                       candidates: Sequence[int] | None = None, max_interval: int | None = None,
                       leakage: LeakageBudget | None = None) -> LinearRoundsPlan:
    """The plan minimising Θ(I) = R(I)·(T_split + T_agg/I) over I = 1..``max_interval`` (default: the pilots'
    longest interval) with each I's latency-best cuts (module docstring "Plan"), each device within its ``leakage``
    budget; ties go to the smaller I."""
    if max_interval is None:
        max_interval = max(p.interval for p in law.pilots)
    if max_interval < 1:
        raise InputError(f"must be at least 1, got {max_interval}", field="max_interval")
    problem = latency_problem(profile, system, candidates, leakage)
    tried = _latency_best_by_interval(law, problem, range(1, max_interval + 1))
    interval, objective, cuts = min(tried, key=lambda t: (t[1], t[0]))
    return LinearRoundsPlan(cuts, interval, law.rounds(interval), objective, tuple(tried))


def _latency_best_by_interval(law: RoundsLaw, problem: PlanningProblem,
                              intervals: Sequence[int]) -> list[tuple[int, float, tuple[int, ...]]]:
    """Per I of ``intervals``: (I, R(x, I)·(T_split + T_agg/I), x) with x the latency-best cuts of ``problem``."""
    method = choose_ms_method(problem)
    cache: dict = {}
    cuts: tuple[int, ...] = problem.initial_cuts()
    tried: list[tuple[int, float, tuple[int, ...]]] = []
    for interval in intervals:
        ms = (solve_dinkelbach(problem, interval, warm_cuts=cuts) if method == "milp"
              else solve_ms_exact(problem, interval, warm_cuts=cuts, cache=cache))
        cuts = tuple(int(c) for c in ms.cuts)
        tried.append((interval, law.rounds_for(cuts, interval) * problem.objective(interval, cuts), cuts))
    return tried


def plan_per_cut_rounds(law: PerCutRounds, profile: ModelProfile, system: SystemSpec, *,
                        candidates: Sequence[int] | None = None, max_interval: int | None = None,
                        leakage: LeakageBudget | None = None) -> LinearRoundsPlan:
    """The plan minimising R(x, I)·(T_split + T_agg/I) under the law per cut (module docstring "Per cut") over
    I = 1..``max_interval`` (default: the pilots' longest) and the cuts among ``candidates`` piloted across each I:
    at each I, for each threshold r of the usable cuts' R_j(I), the latency-best cuts among those with R_j(I) ≤ r;
    ties go to the smaller I, then the smaller threshold; each device within its ``leakage`` budget (a threshold
    whose cuts leave a device none its budget or memory admits is skipped). Its ``by_interval`` holds each I's best
    (an I no candidate was piloted across is left out); where there is none, the reason the last restriction was
    refused, else an :class:`InputError` naming ``--pilots``."""
    if max_interval is None:
        max_interval = max(hi for _, hi in law.intervals.values())
    if max_interval < 1:
        raise InputError(f"must be at least 1, got {max_interval}", field="max_interval")
    allowed = set(candidates if candidates is not None else range(1, profile.num_cuts + 1))
    problems: dict[tuple[int, ...], PlanningProblem | None] = {}
    tried, refused = [], None
    for interval in range(1, max_interval + 1):
        usable = [j for j in law.usable(interval) if j in allowed]
        best: tuple[int, float, tuple[int, ...]] | None = None
        for threshold in sorted({law.laws[j].rounds(interval) for j in usable}):
            under = tuple(j for j in usable if law.laws[j].rounds(interval) <= threshold)
            if under not in problems:
                try:
                    problems[under] = latency_problem(profile, system, under, leakage)
                except (InputError, InfeasibleError) as exc:      # a device with no cut under this threshold
                    problems[under], refused = None, exc
            problem = problems[under]
            if problem is None:
                continue
            (entry,) = _latency_best_by_interval(law, problem, [interval])
            if best is None or entry[1] < best[1]:
                best = entry
        if best is not None:
            tried.append(best)
    if not tried:
        if refused is not None:
            raise refused
        raise InputError(f"no cut the plan may use was piloted at an interval up to {max_interval} ({law.message})",
                         field="--pilots")
    interval, objective, cuts = min(tried, key=lambda t: (t[1], t[0]))
    return LinearRoundsPlan(cuts, interval, law.rounds_for(cuts, interval), objective, tuple(tried))


def score(law: RoundsLaw, profile: ModelProfile, system: SystemSpec, cuts: Sequence[int],
          interval: int, solver: dict[str, Any] | None = None) -> Plan:
    """The :class:`~adaptplan.plan.Plan` of (``cuts``, ``interval``) under ``law`` (docs/formats.md "Plan"): ⌈R(I)⌉
    rounds, ⌊rounds/I⌋ aggregations, eq. (26)'s seconds, Θ(I) = R(I)·(T_split + T_agg/I) as ``objective_s``, the stage
    breakdown of §2.4; ``solver`` default: a given plan scored by the law."""
    breakdown = LatencyModel(profile, system).breakdown(cuts)
    real = law.rounds_for(cuts, interval)
    rounds = whole_rounds(real)
    t_split, t_agg = breakdown.t_split, breakdown.t_agg
    return Plan(interval=int(interval), cuts=tuple(int(c) for c in cuts), rounds=rounds,
                aggregations=rounds // int(interval), round_latency_s=t_split, aggregation_latency_s=t_agg,
                total_latency_s=total_latency(rounds, int(interval), t_split, t_agg),
                objective_s=real * (t_split + t_agg / interval),
                solver=solver or {"method": "given", "rounds_law": law.law}, breakdown=breakdown.stages())


def as_plan(chosen: LinearRoundsPlan, law: RoundsLaw, profile: ModelProfile,
            system: SystemSpec) -> Plan:
    """``chosen`` scored by :func:`score`, with the law in ``solver`` (``method`` "linear-rounds" or
    "per-cut-rounds", R₁, κ, the longest interval tried)."""
    return score(law, profile, system, chosen.cuts, chosen.interval,
                 {**law.solver(), "max_interval": len(chosen.by_interval)})
