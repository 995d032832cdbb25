"""`Planner`: (ModelProfile, SystemSpec, ConvergenceConstants) → Plan (docs/architecture.md "Package map").

``Planner.plan()`` runs BCD (docs/model.md §5.3, Algorithm 3: Theorem-2 MA step ⇄ Dinkelbach
MS step). ``Planner.replan(system=..., constants=..., warm_start=plan)`` is the call Algorithm 1
(§5.4) makes inside a training loop when resources or constants change: it re-solves warm-started
from the cuts in force. ``Planner.evaluate(cuts, interval)`` scores a given decision with the same
model (used for fixed plans, baselines and the trainers' clock).

Inside a user's own training loop (docs/api.md "Plan, train and check in your own loop"): ``estimate(model,
batches, gamma=lr)`` measures the constants on the user's model and data (Algorithm 1), ``calibrate(pilots)`` fits them
to pilot runs for a target accuracy (docs/model.md §10), ``plan()`` then ``predict(plan)`` give the rounds and
simulated seconds to that accuracy, and ``compare(prediction, evaluations)`` sets a measured run beside them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

from adaptplan.calibration import ROUNDS_LAWS, Calibration, PilotRun, calibrate
from adaptplan.constants import ConvergenceConstants
from adaptplan.errors import InfeasibleError, InputError
from adaptplan.latency import total_latency
from adaptplan.linear_rounds import ROUNDS_LAW_TYPES, RoundsLaw, as_plan, fit_rounds_law, score
from adaptplan.model_profile import ModelProfile
from adaptplan.plan import Plan
from adaptplan.plannable import check_plannable
from adaptplan.prediction import Comparison, Prediction, compare
from adaptplan.system import SystemSpec
from solvers.bcd import solve_bcd
from solvers.certificate import GAP_TOLERANCE
from solvers.leakage_budget import LeakageBudget
from solvers.milfp import check_backend
from solvers.problem import PlanningProblem
from solvers.result import SolveResult


class Planner:
    """Plans cuts and the aggregation interval for one model on one system.

    Args:
        profile: per-cut model profile (ρ, ϖ, ψ, χ, δ).
        system: devices, servers and links (FLOP/s, bit/s).
        constants: β, γ, ϑ, ε, σ², G² (one per cut point); default: the placeholder constants
            of docs/model.md §6.1 (labelled as such, not the paper's values).
        candidates: allowed 1-based cut indices (default 1..L−1, docs/formats.md ``--cuts``).
        backend: MILP backend of the Dinkelbach MS step, ``"highs"`` or ``"cbc"``.
        leakage: a per-device leakage budget (:class:`solvers.leakage_budget.LeakageBudget`, e.g. over
            :meth:`adaptplan.leakage_table.LeakageTable.figure`): each device only at cuts within its limit.
    """

    def __init__(self, profile: ModelProfile, system: SystemSpec, constants: ConvergenceConstants | None = None,
                 *, candidates: Sequence[int] | None = None, backend: str = "highs",
                 leakage: LeakageBudget | None = None) -> None:
        if profile.num_cuts < 2:
            raise InputError(f"{profile.model} has no cut point but its output (L = 1), so it cannot be split between "
                             "devices and the server. Fix: profile a model with at least one interior cut (an "
                             "nn.Sequential of blocks, profiled with blocks='children')", field="profile.cut_points")
        self.profile = profile
        self.system = system
        self.constants = constants if constants is not None else ConvergenceConstants.placeholder(profile.num_cuts)
        check_plannable(profile, system, self.constants)
        self.candidates = None if candidates is None else tuple(int(c) for c in candidates)
        self.backend = check_backend(backend)
        self.leakage = leakage
        self._problem: PlanningProblem | None = PlanningProblem.from_parts(profile, system, self.constants,
                                                                         candidates=self.candidates, leakage=leakage)
        self.last_result: SolveResult | None = None
        self.calibration: Calibration | RoundsLaw | None = None

    @property
    def problem(self) -> PlanningProblem:
        """Problem (28) on the planner's profile, system and constants (raises InfeasibleError where even the
        shallowest cut at I = 1 cannot reach ε); built when first needed after :meth:`estimate` or :meth:`calibrate`."""
        if self._problem is None:
            self._problem = PlanningProblem.from_parts(self.profile, self.system, self.constants,
                                                       candidates=self.candidates, leakage=self.leakage)
        return self._problem

    def plan(self, initial_cuts: Sequence[int] | None = None) -> Plan:
        """Solve problem (28) with BCD and return the Plan (raises InfeasibleError with the reason); after
        :meth:`calibrate` with ``law="linear"`` or ``"per-cut"``, the plan under that law instead (docs/model.md §12)."""
        if isinstance(self.calibration, ROUNDS_LAW_TYPES):
            chosen = self.calibration.plan(self.profile, self.system, candidates=self.candidates, leakage=self.leakage)
            return dataclasses.replace(as_plan(chosen, self.calibration, self.profile, self.system),
                                       model=self.profile.identity())
        result = solve_bcd(self.problem, backend=self.backend, initial_cuts=initial_cuts)
        self.last_result = result
        if not result.success:
            raise InfeasibleError(result.message)
        plan = build_plan(self.problem, result.cuts, result.interval, result.solver_stats(),
                          lower_bound=result.lower_bound)
        return dataclasses.replace(plan, model=self.profile.identity())

    def replan(self, *, system: SystemSpec | None = None, constants: ConvergenceConstants | None = None,
               warm_start: Plan | None = None) -> Plan:
        """Re-plan for new resources and/or constants (Algorithm 1), warm-started from ``warm_start.cuts``.

        The planner's own system and constants are updated, so successive calls track the run.
        """
        self._use(system=system, constants=constants)
        initial = None
        if warm_start is not None and len(warm_start.cuts) == self.system.num_devices:
            initial = warm_start.cuts
        return self.plan(initial_cuts=initial)

    def evaluate(self, cuts: Sequence[int], interval: int, solver: dict | None = None) -> Plan:
        """The Plan for a given decision (cuts, I): ⌈R⌉ of eq. (15), eq. (26) and objective (28); under a linear
        rounds law (:meth:`calibrate`), ⌈R(I)⌉ of the law instead (:func:`adaptplan.linear_rounds.score`)."""
        if isinstance(self.calibration, ROUNDS_LAW_TYPES):
            plan = score(self.calibration, self.profile, self.system, cuts, interval, solver)
        else:
            plan = build_plan(self.problem, cuts, interval, solver or {"method": "given"})
        return dataclasses.replace(plan, model=self.profile.identity())

    def estimate(self, model: Any, batches: Sequence[Any], *, gamma: float, epsilon: float | None = None,
                 **options: Any) -> ConvergenceConstants:
        """Algorithm 1's estimation step: β, σ_j², G_j², ϑ of ``model`` (an ``nn.Module`` or a ``profilers.Chain``
        whose blocks are the profile's cut points) on ``batches`` (``(x, y)`` mini-batches of the data and batch
        size you train with, all of them used), γ = ``gamma`` (your learning rate); ``options`` go to
        :func:`profilers.estimate_constants`. The planner plans with them from now on: with an earlier
        :meth:`calibrate`'s c and κ; else with ``epsilon``, or, without one, ε = twice the noise floor βγΣσ_j²/N.
        Loads torch."""
        from profilers.gradstats import estimate_constants

        estimated = estimate_constants(model, batches, gamma=gamma, epsilon=1.0 if epsilon is None else epsilon,
                                       num_batches=len(batches), **options)
        if estimated.num_cuts != self.profile.num_cuts:
            raise InputError(f"the model has {estimated.num_cuts} blocks but the profile {self.profile.num_cuts} cut "
                             "points. Fix: estimate on the model that was profiled (the same blocks)", field="model")
        num_devices = self.system.num_devices
        if isinstance(self.calibration, Calibration):
            constants = self.calibration.apply(estimated, num_devices)
        else:
            constants = estimated if epsilon is not None else dataclasses.replace(
                estimated, epsilon=2 * estimated.noise_floor(num_devices))
        self._use(constants=constants)
        return constants

    def calibrate(self, pilots: Sequence[PilotRun], law: str = "eq15") -> Calibration | RoundsLaw:
        """Fit the planner to ``pilots`` (runs of this setting, one plan each, with the rounds at which each first
        reached one target accuracy), and plan with the fit from now on, so that plans and predictions are to that
        accuracy: ``law`` "eq15" fits the constants (docs/model.md §10), "linear" the rounds law linear in I (§12;
        the constants are then not used), "per-cut" that law with R₁ measured at each cut (§12 "Per cut")."""
        if law not in ROUNDS_LAWS:
            raise InputError(f"must be one of {', '.join(ROUNDS_LAWS)}, got {law!r}", field="law")
        if law != "eq15":
            self.calibration = fit_rounds_law(pilots, law)
            return self.calibration
        fit = calibrate(self.constants, pilots, self.system.num_devices)
        self._use(constants=fit.constants)
        self.calibration = fit
        return fit

    def predict(self, plan: Plan | None = None) -> Prediction:
        """What ``plan`` (default: a new :meth:`plan`) predicts on the planner's constants: ⌈R⌉ rounds (eq. 15) and
        simulated seconds (eq. 26), to the calibrated target accuracy, or to an ε-stationary point before
        :meth:`calibrate`. A plan made elsewhere is re-scored here with its cuts and interval."""
        scored = self.plan() if plan is None else self.evaluate(plan.cuts, plan.interval)
        target = None if self.calibration is None else self.calibration.pilots[0].target_accuracy
        return Prediction.of(scored, target)

    def compare(self, prediction: Prediction, evaluations: Sequence[Sequence[float]]) -> Comparison:
        """A measured run beside ``prediction``: ``evaluations`` are (round, test accuracy, simulated seconds) in
        order; the rounds and seconds at which it first reached the target are interpolated between them."""
        return compare(prediction, evaluations)

    def _use(self, *, system: SystemSpec | None = None, constants: ConvergenceConstants | None = None) -> None:
        """Plan from now on with ``system`` and/or ``constants`` (checked; problem (28) rebuilt when next needed)."""
        if system is None and constants is None:
            return
        self.system = system if system is not None else self.system
        self.constants = constants if constants is not None else self.constants
        check_plannable(self.profile, self.system, self.constants)
        self._problem = None


def build_plan(problem: PlanningProblem, cuts: Sequence[int], interval: int, solver: dict,
               lower_bound: float = math.nan) -> Plan:
    """Score (cuts, interval) on ``problem``: rounds = ⌈R⌉ (eq. 15), aggregations = ⌊rounds/I⌋,
    total latency eq. (26), relaxed objective (28), stage breakdown (§2.4), all in seconds; with a
    solver's ``lower_bound`` (seconds) also the certificate ``lower_bound_s`` and ``gap``."""
    cuts = tuple(int(c) for c in cuts)
    breakdown = problem.latency.breakdown(cuts)
    deepest = max(cuts)
    rounds = problem.convergence.integer_rounds(int(interval), deepest)
    t_split, t_agg = breakdown.t_split, breakdown.t_agg
    objective = problem.convergence.objective(interval, deepest, t_split, t_agg)
    certificate: dict[str, Any] = {}
    if math.isfinite(lower_bound) and math.isfinite(objective):
        bound = float(lower_bound)
        if bound >= objective * (1 - GAP_TOLERANCE):  # proven optimal (the two evaluations of (28) differ by ~1 ulp)
            bound = objective
        certificate = {"lower_bound_s": bound, "gap": (objective - bound) / objective}
    return Plan(
        interval=int(interval),
        cuts=cuts,
        rounds=rounds,
        aggregations=rounds // int(interval),
        round_latency_s=t_split,
        aggregation_latency_s=t_agg,
        total_latency_s=total_latency(rounds, int(interval), t_split, t_agg),
        objective_s=objective,
        solver=dict(solver),
        breakdown=breakdown.stages(),
        **certificate,
    )


def plan(profile: ModelProfile, system: SystemSpec, constants: ConvergenceConstants | None = None, **options) -> Plan:
    """One-call form of ``Planner(profile, system, constants, **options).plan()``."""
    return Planner(profile, system, constants, **options).plan()
