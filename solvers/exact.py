"""Exact references for problem (28) (docs/model.md §4.2).

* :func:`solve_exhaustive` — brute force over every cut vector (J^N of them, J candidates; only
  cuts that fit each device's memory) and
  every integer I in 1..I_max(L_c), vectorised with numpy. Independent of Theorem 2 and of the
  MILP; for small instances only (``max_vectors``).

* :func:`solve_exact` — a scalable exact method. Write Θ = (2ϑ/γ)·(I·a(x) + b(x)) / g_L(I) with
  a = T_split, b = T_agg and g_L(I) = I(c − d(L)I²), L = L_c. For a *fixed* deepest cut bound L
  (all cuts ≤ L, S_n and d evaluated at L — an over-estimate for vectors whose true deepest cut is
  shallower, so the minimum over L is still exact), the denominator does not depend on x, and

      min_x (I·a(x) + b_L(x)) = h_L(I),

  the lower envelope of the lines I ↦ I·a(x) + b_L(x). h_L is concave piecewise linear; its
  pieces are the *supported* Pareto points (a_k, b_k). They are found by a dichotomic
  (Eisner–Severance) parametric search over the weight w ∈ [1, I_max(L)]: solve the numerator MILP
  min w·a(x) + b_L(x) (the MILP of :class:`solvers.milfp.MSModel` with μ₆ = δ_L fixed and no μ₅)
  at the end points and at the intersection of every two adjacent lines. Then

      Θ* = (2ϑ/γ) · min_L min_k min_{I ∈ ℤ⁺} (I a_k + b_k)/g_L(I),

  and the inner min is Theorem 2 for (a_k, b_k, c, d(L)). Cost: for each of the J candidate
  values of L, 2K_L − 1 MILPs where K_L is the number of supported points (typically 1–4), i.e.
  O(J·K) MILPs of the size of the MS step — versus J^N·I_max objective evaluations exhaustively.
"""

from __future__ import annotations

import math
import time
from itertools import product
from typing import Iterator

import numpy as np

from adaptplan.convergence import interval_denominator
from adaptplan.errors import InfeasibleError, InputError
from solvers.interval import best_interval, interval_objective, max_feasible_interval
from solvers.milfp import MSModel
from solvers.problem import PlanningProblem
from solvers.result import SolveResult

_CHUNK = 200_000  # cut vectors evaluated per numpy batch


def solve_exhaustive(problem: PlanningProblem, *, max_vectors: int = 2_000_000, max_interval: int = 10_000) -> SolveResult:
    """Brute force over all cut vectors in ``problem.candidates``^N and all feasible integer I.

    Raises:
        InputError: more than ``max_vectors`` cut vectors.
        InfeasibleError: no (I, x) is feasible.
    """
    start = time.perf_counter()
    cand = problem.candidates
    per_device = [cand[ok].tolist() for ok in problem.admissible_at(cand)]  # cuts that fit each device's memory
    count = math.prod(len(c) for c in per_device)
    if count > max_vectors:
        raise InputError(f"{count} cut vectors exceed max_vectors={max_vectors}; use solve_exact", field="max_vectors")
    conv = problem.convergence
    c, scale = conv.c, problem.scale
    best: tuple[float, int, tuple[int, ...]] = (math.inf, 0, ())
    vectors = product(*per_device)
    while True:
        chunk = np.array(list(_take(vectors, _CHUNK)), dtype=int)
        if chunk.size == 0:
            break
        a, b = problem.latency.stage_latencies(chunk)
        deepest = chunk.max(axis=1)
        for L in np.unique(deepest):
            rows = np.flatnonzero(deepest == L)
            d = conv.d(int(L))
            top = min(max_feasible_interval(c, d), max_interval)
            if top < 1:
                continue
            I = np.arange(1, top + 1, dtype=float)
            values = (a[rows, None] * I[None, :] + b[rows, None]) / interval_denominator(c, d, I)[None, :]
            r, k = np.unravel_index(np.argmin(values), values.shape)
            if values[r, k] * scale < best[0]:
                best = (float(values[r, k] * scale), int(I[k]), tuple(int(v) for v in chunk[rows[r]]))
    if not math.isfinite(best[0]):
        raise InfeasibleError(conv.infeasibility_reason(1, int(cand[0])))
    objective = problem.objective(best[1], best[2])
    return SolveResult(cuts=best[2], interval=best[1], objective=objective,
                       status="optimal", message=f"exhaustive search over {count} cut vectors",
                       method="exhaustive", iterations=count, seconds=time.perf_counter() - start,
                       lower_bound=objective)  # proven optimal: every (I, x) was evaluated


def _take(iterator: Iterator[tuple[int, ...]], n: int) -> Iterator[tuple[int, ...]]:
    for _ in range(n):
        try:
            yield next(iterator)
        except StopIteration:
            return


def solve_exact(problem: PlanningProblem, *, backend: str = "highs", max_interval: int | None = None,
                mip_gap: float = 1e-9, time_limit: float | None = None, node_limit: int | None = None) -> SolveResult:
    """Exact optimum of (28) by deepest-cut enumeration + parametric numerator MILPs (module docstring).

    Args:
        problem: the instance.
        backend: ``"highs"`` or ``"cbc"``.
        max_interval: optional cap on I (only needed when some d(L) = 0).
        mip_gap, time_limit, node_limit: per-MILP options (relative gap, seconds, branch-and-bound
            nodes); a MILP stopped by a time or node limit makes the status ``"limit"``.

    Returns:
        SolveResult with method ``"exact"``; ``history`` lists, per L, the supported points.
    """
    start = time.perf_counter()
    conv = problem.convergence
    c, scale = conv.c, problem.scale
    best: tuple[float, int, tuple[int, ...]] = (math.inf, 0, ())
    solves, proven, history = 0, True, []
    for L in problem.feasible_candidates.tolist():
        d = conv.d(L)
        top = max_feasible_interval(c, d)
        if max_interval is not None:
            top = min(top, max_interval)
        if top < 1:
            continue
        model = MSModel(problem, 1, max_cut=L, fixed_deepest=L, weight_only=True)
        if not model.feasible:  # some device's memory admits no cut ≤ L
            continue

        def numerator(w: float, model: MSModel = model, L: int = L) -> tuple[float, float, tuple[int, ...]]:
            nonlocal solves, proven
            model.set_lambda(0.0, weight=w)
            cuts = model.solve(backend=backend, mip_gap=mip_gap, time_limit=time_limit, node_limit=node_limit)
            solves += 1
            proven = proven and model.last_optimal
            if cuts is None:   # stopped by a limit before any cut vector: the deepest admissible cuts ≤ L
                cuts = problem.start_cuts(L, model.columns)
            a, b = problem.latency.stage_latencies(np.asarray([cuts]), deepest=L)  # (T_split, T_agg with S_n at δ_L)
            return float(a[0]), float(b[0]), cuts

        points = {}
        stack = [(numerator(1.0), numerator(float(top)))]
        for p in stack[0]:
            points[p[2]] = p
        while stack:
            p, q = stack.pop()
            if p[0] - q[0] <= 1e-12 * max(p[0], 1e-300):  # same split latency: nothing in between
                continue
            w = (q[1] - p[1]) / (p[0] - q[0])  # where w·a_p + b_p = w·a_q + b_q
            if not 1.0 < w < top:
                continue
            r = numerator(w)
            if w * r[0] + r[1] < (w * p[0] + p[1]) * (1 - 1e-9) and r[2] not in points:
                points[r[2]] = r
                stack += [(p, r), (r, q)]
        for a_k, b_k, cuts in points.values():
            I = best_interval(a_k, b_k, c, d, max_interval=top)
            value = scale * float(interval_objective(I, a_k, b_k, c, d))
            if value < best[0]:
                best = (value, I, cuts)
        history.append({"deepest_cut": L, "supported_points": [(p[0], p[1]) for p in points.values()]})
    if not math.isfinite(best[0]):
        raise InfeasibleError(conv.infeasibility_reason(1, int(problem.candidates[0])))
    interval, cuts = best[1], best[2]
    return SolveResult(cuts=cuts, interval=interval, objective=problem.objective(interval, cuts),
                       status="optimal" if proven else "limit",
                       message=f"deepest-cut enumeration with {solves} numerator MILP(s)", method="exact",
                       iterations=len(history), milp_solves=solves, seconds=time.perf_counter() - start,
                       backend=backend, history=history,
                       lower_bound=problem.objective(interval, cuts) if proven else math.nan)  # optimal to mip_gap

