"""`SolveResult`: the one result type of every solver and baseline policy (like scipy's OptimizeResult)."""

from __future__ import annotations

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
        status: short machine-readable status ("optimal", "converged", "max_iterations", "infeasible", ...).
        message: one human-readable sentence.
        method: solver or policy name ("bcd", "dinkelbach", "exhaustive", "rma+rms", ...).
        iterations: outer iterations (BCD rounds, Dinkelbach steps, ...).
        milp_solves: number of MILP solves.
        seconds: wall-clock solve time.
        backend: MILP backend ("highs", "cbc") or "" when none was used.
        history: per-iteration records (dicts) for inspection.
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

    @property
    def x(self) -> tuple[int, ...]:
        """Alias of ``cuts`` (scipy-style)."""
        return self.cuts

    def solver_stats(self) -> dict[str, Any]:
        """The ``solver`` block of a Plan (formats.md)."""
        return {"method": self.method, "iterations": self.iterations, "milp_solves": self.milp_solves,
                "seconds": round(self.seconds, 6), "backend": self.backend, "status": self.status}
