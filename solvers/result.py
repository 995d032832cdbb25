"""`SolveResult`: the one result type of every solver and baseline policy (like scipy's OptimizeResult)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class SolveResult:
    """Outcome of one solve.

    Attributes:
        cuts: 1-based cut index per device (ℓ_i), length N.
        interval: aggregation interval I (rounds).
        objective: value of the relaxed objective (28) at (interval, cuts), seconds (∞ if infeasible).
        success: whether a feasible answer was found.
        status: short machine-readable status ("optimal", "converged", "max_iterations", "infeasible",
            "limit" (a MILP stopped by its time or node limit), ...).
        message: one human-readable sentence.
        method: solver or policy name ("bcd", "dinkelbach", "exhaustive", "rma+rms", ...).
        iterations: outer iterations (BCD rounds, Dinkelbach steps, ...).
        milp_solves: number of MILP solves.
        seconds: wall-clock solve time.
        backend: MILP backend ("highs", "cbc") or "" when none was used.
        history: per-iteration records (dicts) for inspection.
        lower_bound: a certified lower bound (seconds) on the optimum of the problem solved (objective
            (28) over (I, x) for joint solvers; over x at the fixed I for an MS step); ``nan`` when
            the method gives none (the random baselines).
        nodes: branch-and-bound nodes visited (threshold method), 0 otherwise.
    """

    cuts: tuple[int, ...]
    interval: int
    objective: float
    success: bool = True
    status: str = "optimal"
    message: str = ""
    method: str = ""
    iterations: int = 0
    milp_solves: int = 0
    seconds: float = 0.0
    backend: str = ""
    history: list[dict[str, Any]] = field(default_factory=list)
    lower_bound: float = math.nan
    nodes: int = 0

    @property
    def gap(self) -> float:
        """(objective − lower_bound) / objective, ≥ 0; 0 when proven optimal, ``nan`` without a bound."""
        if math.isnan(self.lower_bound) or not math.isfinite(self.objective):
            return math.nan
        return max(0.0, (self.objective - self.lower_bound) / self.objective)

    @property
    def x(self) -> tuple[int, ...]:
        """Alias of ``cuts`` (scipy-style)."""
        return self.cuts

    def solver_stats(self) -> dict[str, Any]:
        """The ``solver`` block of a Plan (docs/formats.md)."""
        return {"method": self.method, "iterations": self.iterations, "milp_solves": self.milp_solves,
                "seconds": round(self.seconds, 6), "backend": self.backend, "status": self.status, "nodes": self.nodes}
