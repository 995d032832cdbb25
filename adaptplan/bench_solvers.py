"""Solver benchmark (the logic behind ``adaptplan bench``): AdaptSFL's BCD vs the baselines of
spec/adaptsfl.md §6.2 vs the exact optimum, solve time vs scale, and BCD's optimality gap.

Everything is predicted by the world model: eq. (26) total latency with ⌈R⌉ rounds and ⌊⌈R⌉/I⌋
aggregations, and the relaxed objective (28), both in seconds. Scenarios other than the default
use :func:`solvers.synthetic.synthetic_profile` until a measured profile ships as package data.
"""

from __future__ import annotations

import math
import time
from typing import Sequence

import numpy as np

from adaptplan.constants import ConvergenceConstants
from adaptplan.system import generate_system
from solvers.baselines import BASELINES
from solvers.bcd import solve_bcd
from solvers.exact import solve_exact, solve_exhaustive
from solvers.problem import PlanningProblem
from solvers.result import SolveResult
from solvers.synthetic import synthetic_profile

RANDOM_POLICIES = ("rma+ms", "ma+rms", "rma+rms", "dama+rms", "rma+ams")


def _problem(num_devices: int, num_cut_points: int, seed: int) -> PlanningProblem:
    """Synthetic scenario: §6.1 placeholder system and constants, except σ_j² = 0.5·N/L so that the
    noise floor (βγ/N)Σσ_j² = 0.025 < ε = 0.1 for every N and L (placeholder σ_j² = 1 needs N > L/2)."""
    profile = synthetic_profile(num_cut_points, seed=seed)
    k = ConvergenceConstants.placeholder(num_cut_points)
    constants = ConvergenceConstants(beta=k.beta, gamma=k.gamma, theta=k.theta, epsilon=k.epsilon,
                                     sigma2=(0.5 * num_devices / num_cut_points,) * num_cut_points, G2=k.G2)
    return PlanningProblem.from_parts(profile, generate_system(num_devices, seed), constants)


def _row(problem: PlanningProblem, name: str, result: SolveResult, reference: float, draws: int = 1) -> str:
    if not result.success:
        return f"  {name:<14} {'-':>4} {'-':>4} {'-':>8} {'-':>12} {'inf':>12} {'-':>7}  {result.status}"
    rounds, aggregations, total = problem.total_latency(result.interval, result.cuts)
    tag = f"  mean of {draws} draws" if draws > 1 else ""
    return (f"  {name:<14} {result.interval:>4} {max(result.cuts):>4} {rounds:>8} {total:>12.1f} "
            f"{result.objective:>12.1f} {result.objective / reference:>7.3f}{tag}")


def compare_policies(problem: PlanningProblem, title: str, *, seeds: int = 5, exact: bool = True,
                     time_limit: float | None = None) -> str:
    """Table (1): BCD vs every baseline vs the exact optimum on one scenario (ratios to BCD)."""
    bcd = solve_bcd(problem, time_limit=time_limit)
    lines = [f"{title}: N={problem.num_devices}, {problem.candidates.size} candidate cuts",
             f"  {'method':<14} {'I':>4} {'L_c':>4} {'rounds':>8} {'T (26) [s]':>12} {'obj (28) [s]':>12} {'ratio':>7}",
             _row(problem, "adaptsfl(bcd)", bcd, bcd.objective)]
    if exact:
        opt = solve_exact(problem, time_limit=time_limit)
        lines.append(_row(problem, "exact", opt, bcd.objective))
    for name, policy in BASELINES.items():
        if name in RANDOM_POLICIES:
            results = [policy(problem, s, "highs") for s in range(seeds)]
            mean = float(np.mean([r.objective for r in results]))
            rep = min(results, key=lambda r: abs(r.objective - mean))  # representative draw for I, L_c, rounds
            lines.append(_row(problem, name, rep, bcd.objective, draws=seeds).replace(
                f"{rep.objective:>12.1f} {rep.objective / bcd.objective:>7.3f}", f"{mean:>12.1f} {mean / bcd.objective:>7.3f}"))
        else:
            lines.append(_row(problem, name, policy(problem, 0, "highs"), bcd.objective))
    return "\n".join(lines)


#: The MILP column of the scaling table is run only up to this N × (candidate cuts) (HiGHS takes
#: ~20 s per BCD at 100 × 20 and does not finish at 1000 × 20).
MILP_AFFORDABLE_SIZE = 2000


def time_scaling(sizes: Sequence[int], cut_counts: Sequence[int], *, seed: int = 0,
                 time_limit: float | None = None) -> tuple[str, list[tuple[int, int, float, SolveResult]]]:
    """Table (2): BCD solve time vs number of devices (20 cut points) and vs number of cut points,
    with the MS step by the MILP (Algorithm 2, where affordable) and by the exact threshold sweep."""
    rows, lines_data = [], []
    configs = [(n, 20) for n in sizes] + [(100, k) for k in cut_counts if k != 20 or 100 not in sizes]
    for n, k in configs:
        problem = _problem(n, k + 1, seed)  # k candidate cuts 1..L−1
        start = time.perf_counter()
        result = solve_bcd(problem, time_limit=time_limit, multistart=False, ms_method="threshold")
        t_sweep = time.perf_counter() - start
        milp = None
        if n * k <= MILP_AFFORDABLE_SIZE:
            start = time.perf_counter()
            milp = solve_bcd(problem, time_limit=time_limit, multistart=False, ms_method="milp")
            milp = (time.perf_counter() - start, milp)
        rows.append((n, k, t_sweep, result))
        lines_data.append((n, k, t_sweep, result, milp))
    lines = ["BCD solve time (single start), MS step by the exact threshold sweep vs the MILP (HiGHS; per-MILP "
             f"time limit {time_limit if time_limit else 'none'} s)",
             f"  {'N':>5} {'cuts':>5} {'sweep s':>9} {'MILP s':>9} {'iters':>6} {'I':>4} {'obj sweep':>11} "
             f"{'obj MILP':>11}  status (MILP)"]
    for n, k, t, r, milp in lines_data:
        if milp is None:
            tail = f"{'-':>9} {r.iterations:>6} {r.interval:>4} {r.objective:>11.2f} {'-':>11}  {r.status}"
        else:
            tail = (f"{milp[0]:>9.3f} {r.iterations:>6} {r.interval:>4} {r.objective:>11.2f} "
                    f"{milp[1].objective:>11.2f}  {r.status} ({milp[1].status})")
        lines.append(f"  {n:>5} {k:>5} {t:>9.3f} {tail}")
    return "\n".join(lines), rows


def bcd_gap(instances: int, *, seed: int = 0) -> str:
    """Table (3): BCD's gap to the exhaustive optimum over random small instances (N ≤ 4, ≤ 5 cuts)."""
    rng = np.random.default_rng(seed)
    gaps, single = [], []
    for k in range(instances):
        problem = _problem(int(rng.integers(2, 5)), int(rng.integers(4, 7)), seed * 10_000 + k)
        best = solve_exhaustive(problem).objective
        gaps.append(solve_bcd(problem).objective / best - 1)
        single.append(solve_bcd(problem, multistart=False).objective / best - 1)
    gaps_a, single_a = np.array(gaps), np.array(single)
    return (f"BCD gap to the exhaustive optimum over {instances} random small instances:\n"
            f"  multistart (default): worst {100 * gaps_a.max():.4f} %, within 0.1 % on {100 * np.mean(gaps_a <= 1e-3):.1f} %\n"
            f"  single start (Alg. 3 as printed): worst {100 * single_a.max():.4f} %, within 0.1 % on "
            f"{100 * np.mean(single_a <= 1e-3):.1f} %")


def run_solver_bench(default_problem: PlanningProblem, *, sizes: Sequence[int] = (20, 100, 500, 1000), seed: int = 0,
                     plot_path: str | None = None, quick: bool = False) -> str:
    """Run the three benchmark tables, print and return them; optionally plot time vs N to ``plot_path``."""
    time_limit = 2.0 if quick else 10.0
    parts = [compare_policies(default_problem, "default scenario", seeds=3 if quick else 5, time_limit=time_limit)]
    for k in range(1 if quick else 3):
        parts.append(compare_policies(_problem(20, 13, seed + k + 1), f"generated scenario {k + 1} (synthetic 12-cut)",
                                      seeds=3 if quick else 5, time_limit=time_limit))
    table, rows = time_scaling(sizes if not quick else [n for n in sizes if n <= 100],
                               (5, 10) if quick else (5, 10, 20), seed=seed, time_limit=time_limit)
    parts.append(table)
    parts.append(bcd_gap(20 if quick else 100, seed=seed))
    text = "\n\n".join(parts)
    print(text)
    if plot_path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        by_n = [(n, t) for n, k, t, _ in rows if k == 20]
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.plot([n for n, _ in by_n], [t for _, t in by_n], "o-")
        ax.set_xlabel("devices N (20 cut points)")
        ax.set_ylabel("BCD solve time [s]")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        fig.tight_layout()
        fig.savefig(plot_path)
        plt.close(fig)
    return text
