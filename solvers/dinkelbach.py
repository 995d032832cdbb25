"""The MS step: Dinkelbach's method (35) for the MILFP (34) — Algorithm 2 (docs/model.md §5.2).

For fixed I, minimise N(x,μ)/D(x,μ) by solving the MILP F(λ) = min N − λD (35) for a sequence
λ⁽ᵏ⁺¹⁾ = N(x⁽ᵏ⁾)/D(x⁽ᵏ⁾), starting from the ratio at the warm-start cut vector (§8 A9, so that
F(λ⁽⁰⁾) ≤ 0), until |F⁽ᵏ⁾| < ϵ_D. N and D are evaluated at the tight μ of the returned cuts,
i.e. N = I·T_split(x) + T_agg(x) (s) and D = I(c − d(L_c)I²), so λ·(2ϑ/γ) is objective (28).
"""

from __future__ import annotations

import math
import time
from typing import Sequence

from adaptplan.errors import InfeasibleError
from solvers.milfp import MSModel
from solvers.problem import PlanningProblem
from solvers.result import SolveResult


def ratio(problem: PlanningProblem, interval: int, cuts: Sequence[int]) -> tuple[float, float]:
    """(N, D) of (34) at tight μ: N = I·T_split + T_agg (seconds), D = I(c − d(L_c)I²)."""
    t_split, t_agg = problem.stage_latencies(cuts)
    return interval * t_split + t_agg, interval * problem.convergence.margin(interval, int(max(cuts)))


def solve_dinkelbach(problem: PlanningProblem, interval: int, *, backend: str = "highs",
                     warm_cuts: Sequence[int] | None = None, tol: float = 1e-9, max_iterations: int = 30,
                     mip_gap: float = 1e-9, time_limit: float | None = None, node_limit: int | None = None,
                     model: MSModel | None = None) -> SolveResult:
    """Algorithm 2: optimal cut vector for the fixed interval ``interval`` (rounds).

    Args:
        problem: the instance.
        interval: I ≥ 1.
        backend: ``"highs"`` (default) or ``"cbc"``.
        warm_cuts: feasible cut vector giving λ⁽⁰⁾ and the MIP start; default: the shallowest
            feasible candidate for every device.
        tol: ϵ_D, relative: stop when |F⁽ᵏ⁾| ≤ tol·N(x⁽ᵏ⁾).
        max_iterations: cap on MILP solves.
        mip_gap: relative MIP gap passed to the backend.
        time_limit: per-MILP time limit (seconds), ``None`` for none.
        node_limit: per-MILP branch-and-bound node limit, ``None`` for none (deterministic,
            unlike ``time_limit``). A MILP stopped by either makes the status ``"limit"``.
        model: a prebuilt :class:`MSModel` for this ``interval`` (reused across calls).

    Returns:
        SolveResult with method ``"dinkelbach"``; ``objective`` is (28) at (interval, cuts).

    Raises:
        InfeasibleError: no cut vector satisfies c − d(L_c)I² > 0 at this I.
    """
    start = time.perf_counter()
    ms = model if model is not None else MSModel(problem, interval)
    if not ms.feasible:
        raise InfeasibleError(problem.convergence.infeasibility_reason(interval, int(problem.candidates[0])))
    shallowest = problem.start_cuts(int(ms.columns[0]), ms.columns)  # admissible (memory) start
    cuts = tuple(warm_cuts) if warm_cuts is not None else shallowest
    num, den = ratio(problem, interval, cuts)
    if den <= 0:  # warm start infeasible at this I: restart from the shallowest admissible cut
        cuts = shallowest
        num, den = ratio(problem, interval, cuts)
    lam = num / den
    history = [{"iteration": 0, "lambda": lam, "cuts": cuts}]
    status, solves, proven = "max_iterations", 0, True
    for k in range(1, max_iterations + 1):
        ms.set_lambda(lam)
        new = ms.solve(backend=backend, warm_cuts=cuts, mip_gap=mip_gap, time_limit=time_limit, node_limit=node_limit)
        solves += 1
        proven = proven and ms.last_optimal
        if new is None:
            status = "solver_failure"
            break
        num_k, den_k = ratio(problem, interval, new)
        F = num_k - lam * den_k
        history.append({"iteration": k, "lambda": lam, "F": F, "cuts": new})
        if den_k > 0 and num_k / den_k < lam:
            cuts, lam = new, num_k / den_k
        if abs(F) <= tol * max(num_k, 1e-300) or F >= 0:
            status = "converged"
            break
    if status == "converged" and not proven:
        status = "limit"  # some MILP stopped on its time or node limit: best found, optimality not proven
    objective = problem.objective(interval, cuts)
    return SolveResult(cuts=cuts, interval=int(interval), objective=objective, success=math.isfinite(objective),
                       status=status, message=f"Dinkelbach {status} after {solves} MILP solve(s) at I={interval}",
                       method="dinkelbach", iterations=solves, milp_solves=solves,
                       seconds=time.perf_counter() - start, backend=backend, history=history,
                       lower_bound=objective if status == "converged" else math.nan)  # optimal to mip_gap
