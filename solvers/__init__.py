"""Planners for AdaptSFL (docs/model.md §4–§6): numpy/scipy/PuLP only (never torch).

Every solver has the scipy-style signature ``solve_xxx(problem, *, options) -> SolveResult``.
"""

from solvers.baselines import (
                               BASELINES,
                               ams_cuts,
                               dama_interval,
                               solve_dama_rms,
                               solve_fixed_cut,
                               solve_ma_rms,
                               solve_psl,
                               solve_rma_ams,
                               solve_rma_ms,
                               solve_rma_rms,
                               solve_sfl,
)
from solvers.bcd import ma_step, solve_bcd
from solvers.dinkelbach import solve_dinkelbach
from solvers.exact import solve_exact, solve_exhaustive
from solvers.interval import best_interval, interval_objective, max_feasible_interval, newton_interval
from solvers.milfp import MSModel
from solvers.problem import PlanningProblem
from solvers.result import SolveResult
from solvers.synthetic import synthetic_profile, vgg16_cifar_profile

__all__ = [
    "BASELINES", "MSModel", "PlanningProblem", "SolveResult", "ams_cuts", "best_interval", "dama_interval",
    "interval_objective", "ma_step", "max_feasible_interval", "newton_interval", "solve_bcd", "solve_dama_rms",
    "solve_dinkelbach", "solve_exact", "solve_exhaustive", "solve_fixed_cut", "solve_ma_rms", "solve_psl",
    "solve_rma_ams", "solve_rma_ms", "solve_rma_rms", "solve_sfl", "synthetic_profile", "vgg16_cifar_profile",
]
