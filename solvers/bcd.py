"""AdaptSFL's joint planner: block coordinate descent over (I) and (x, μ) — Algorithm 3
(docs/model.md §5.3).

Each iteration does an exact MA step (Theorem 2, :func:`solvers.interval.best_interval`, with
a = T_split(x), b = T_agg(x), d = 4β²γ²A_{L_c(x)}) and an exact MS step (Dinkelbach, Algorithm 2,
:func:`solvers.dinkelbach.solve_dinkelbach`, warm-started at the previous cuts). Both steps
minimise the same objective (28), so Θ⁽ᵏ⁾ is non-increasing; the loop stops when
|Θ⁽ᵏ⁻¹⁾ − Θ⁽ᵏ⁾| ≤ ϵ_B·Θ⁽ᵏ⁾ or (I, x) repeats. BCD is blockwise optimal, not globally optimal in
general; :func:`solvers.exact.solve_exact` certifies the gap.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Callable, Sequence

from solvers.certificate import GAP_TOLERANCE
from solvers.certificate import certify as certify_plan
from solvers.dinkelbach import solve_dinkelbach
from solvers.interval import best_interval
from solvers.problem import PlanningProblem
from solvers.result import SolveResult
from solvers.threshold import applicable, solve_ms_exact


def ma_step(problem: PlanningProblem, cuts: Sequence[int], *, max_interval: int | None = None) -> int:
    """Theorem 2 for fixed cuts: a = T_split(x), b = T_agg(x), c, d = 4β²γ²A_{L_c} (eqs. (32)/(33))."""
    a, b = problem.stage_latencies(cuts)
    conv = problem.convergence
    return best_interval(a, b, conv.c, conv.d(int(max(cuts))), max_interval=max_interval)


#: ``multistart=None`` enables the restarts when N × (number of candidates) is at most this.
MULTISTART_AUTO_SIZE = 1000

#: ``ms_method="auto"`` uses the MILP (Algorithm 2) when N × (number of candidates) is at most this,
#: else the exact threshold sweep (:mod:`solvers.threshold`). Measured: HiGHS needs ~19 s per BCD at
#: N=100 × 20 cuts, the sweep 0.01–0.1 s per MS step there; both agree to 1e-9.
MS_AUTO_SIZE = 400
MS_METHODS = ("auto", "milp", "threshold")


def choose_ms_method(problem: PlanningProblem, ms_method: str = "auto") -> str:
    """Resolve ``ms_method`` to ``"milp"`` or ``"threshold"`` (auto: size switch, and the MILP whenever
    the threshold method's monotonicity premise fails, see :func:`solvers.threshold.applicable`)."""
    if ms_method not in MS_METHODS:
        raise ValueError(f"ms_method must be one of {MS_METHODS}, got {ms_method!r}")
    if ms_method != "auto":
        return ms_method
    if problem.num_devices * problem.candidates.size > MS_AUTO_SIZE and applicable(problem):
        return "threshold"
    return "milp"


def solve_bcd(problem: PlanningProblem, *, backend: str = "highs", initial_cuts: Sequence[int] | None = None,
              tol: float = 1e-9, max_iterations: int = 50, mip_gap: float = 1e-9,
              time_limit: float | None = None, max_interval: int | None = None,
              multistart: bool | None = None, ms_method: str = "auto", certify: bool = True,
              node_limit: int | None = None) -> SolveResult:
    """Algorithm 3: jointly plan the interval I and the cut vector x.

    Args:
        problem: the instance.
        backend: MILP backend of the MS step, ``"highs"`` or ``"cbc"``.
        initial_cuts: x⁰ (1-based); default the shallowest feasible candidate for every device.
        tol: ϵ_B, relative change of Θ that stops the loop.
        max_iterations: cap on BCD iterations.
        mip_gap, time_limit, node_limit: passed to each MILP solve (time limit per MILP, seconds;
            node limit per MILP, branch-and-bound nodes: deterministic, unlike the time limit).
        max_interval: optional cap on I (needed only when d = 0, see :mod:`solvers.interval`).
        multistart: also run Algorithm 3 from every uniform start x⁰ = (ℓ, …, ℓ), ℓ a feasible
            candidate, and keep the best plan (BCD stops at blockwise optima: on small random
            instances single-start BCD was within 0.1 % of the optimum on ~96 % of them,
            multistart on all we tried). ``None`` = on when N·|candidates| ≤
            :data:`MULTISTART_AUTO_SIZE`. Costs one BCD run per start.
        ms_method: MS step solver: ``"milp"`` (Algorithm 2, Dinkelbach + MILP (35)), ``"threshold"``
            (:func:`solvers.threshold.solve_ms_exact`, the same exact optimum of (34) without MILPs)
            or ``"auto"`` (see :func:`choose_ms_method`). The chosen one is in ``backend`` and in
            every history record (``ms_method``).
        certify: compute ``lower_bound`` (:func:`solvers.certificate.certify`, from the MS steps'
            own bounds plus up to :data:`solvers.certificate.CERTIFICATE_CALLS` more MS steps at
            the intervals where the bound is weakest; a better plan found on the way is kept and
            BCD is re-run from it). ``False`` leaves ``lower_bound`` at ``nan``.

    Returns:
        SolveResult with method ``"bcd"``; ``history`` holds one record per iteration with the MA
        interval, the MS cuts and Θ (seconds); ``lower_bound`` ≤ the optimum of (28) and ``gap``.
    """
    start = time.perf_counter()
    first = tuple(int(c) for c in initial_cuts) if initial_cuts is not None else problem.initial_cuts()
    problem.latency.check_cuts(first)
    if multistart is None:
        multistart = problem.num_devices * problem.candidates.size <= MULTISTART_AUTO_SIZE
    starts = [first] + ([problem.start_cuts(int(c)) for c in problem.feasible_candidates] if multistart else [])
    models: dict[int, SolveResult] = {}
    sweep_cache: dict = {}  # interval-independent structures of the threshold sweep, shared by all MS steps
    method = choose_ms_method(problem, ms_method)

    def ms_step(interval: int, cuts: tuple[int, ...]) -> SolveResult:
        return _ms_step(problem, interval, cuts, models, sweep_cache, backend if method == "milp" else "threshold",
                        mip_gap, time_limit, node_limit)

    def run(x0: tuple[int, ...]) -> SolveResult:
        return _bcd_run(problem, x0, ms_step, tol, max_iterations, max_interval)

    runs = [run(x0) for x0 in dict.fromkeys(starts)]
    best = min(runs, key=lambda r: r.objective)
    if certify:
        cert = certify_plan(problem, best, dict(models), ms_step, max_interval=max_interval)
        if cert.objective < best.objective * (1 - 1e-12):  # the certificate's MS steps found a better plan
            runs.append(run(cert.cuts))
            best = min(runs, key=lambda r: r.objective)
            if cert.objective < best.objective:
                best = replace(best, cuts=cert.cuts, interval=cert.interval, objective=cert.objective)
        best.lower_bound = min(cert.lower_bound, best.objective)
        if best.lower_bound >= best.objective * (1 - GAP_TOLERANCE):
            best.lower_bound = best.objective
    best.nodes = sum(m.nodes for m in models.values())  # threshold branch-and-bound nodes of every MS step
    best.iterations = sum(r.iterations for r in runs)
    best.milp_solves = sum(r.milp_solves for r in runs)
    best.seconds = time.perf_counter() - start
    if len(runs) > 1:
        best.message += f" (best of {len(runs)} starts)"
    return best


def _ms_step(problem: PlanningProblem, interval: int, cuts: tuple[int, ...], models: dict[int, SolveResult],
             sweep_cache: dict, backend: str, mip_gap: float, time_limit: float | None,
             node_limit: int | None) -> SolveResult:
    """The MS step at ``interval`` warm-started at ``cuts``, cached per interval in ``models`` (each MS
    step is exact or carries its own lower bound, so one per interval suffices); ``milp_solves`` of a
    cached result counts 0."""
    if interval in models:
        return replace(models[interval], milp_solves=0)
    if backend == "threshold":  # MS step by threshold sweeps (solvers.threshold)
        ms = solve_ms_exact(problem, interval, warm_cuts=cuts, cache=sweep_cache)
    else:  # MS step (Algorithm 2), warm-started at the current cuts
        ms = solve_dinkelbach(problem, interval, backend=backend, warm_cuts=cuts, mip_gap=mip_gap, time_limit=time_limit,
                              node_limit=node_limit)
    models[interval] = ms
    return ms


def _bcd_run(problem: PlanningProblem, cuts: tuple[int, ...], ms_step: Callable[[int, tuple[int, ...]], SolveResult],
             tol: float, max_iterations: int, max_interval: int | None) -> SolveResult:
    """One run of Algorithm 3 from x⁰ = ``cuts`` with the MS step ``ms_step(I, warm_cuts)``."""
    start = time.perf_counter()
    theta_prev, interval, status = math.inf, 0, "max_iterations"
    history: list[dict] = []
    milp_solves, unproven = 0, ""
    backend = ""
    seen: set[tuple[int, tuple[int, ...]]] = set()
    for k in range(1, max_iterations + 1):
        interval = ma_step(problem, cuts, max_interval=max_interval)  # MA step (Theorem 2)
        ms = ms_step(interval, cuts)
        ms_solves, backend = ms.milp_solves, ms.backend
        if problem.objective(interval, ms.cuts) > problem.objective(interval, cuts):
            ms = replace(ms, cuts=cuts)  # guard against MIP-tolerance noise: never worsen Θ
        milp_solves += ms_solves
        if ms.status != "converged":
            unproven = unproven or ms.status
        cuts = ms.cuts
        theta = problem.objective(interval, cuts)
        history.append({"iteration": k, "interval": interval, "cuts": cuts, "objective": theta,
                        "milp_solves": ms_solves, "ms_method": "threshold" if backend == "threshold" else "milp"})
        key = (interval, cuts)
        if key in seen or abs(theta_prev - theta) <= tol * theta:
            status = "converged"
            break
        seen.add(key)
        theta_prev = theta
    objective = problem.objective(interval, cuts)
    if status == "converged" and unproven:
        status = unproven  # some MS step stopped on a time or node limit or its sweep budget: not blockwise optimal
    return SolveResult(cuts=cuts, interval=interval, objective=objective, success=math.isfinite(objective),
                       status=status, message=f"BCD {status} after {len(history)} iteration(s), I={interval}",
                       method="bcd", iterations=len(history), milp_solves=milp_solves,
                       seconds=time.perf_counter() - start, backend=backend, history=history)
