"""Baseline planning policies of docs/model.md §6.2 (and §8 A12), each returning a
:class:`SolveResult` scored by objective (28), so they compare directly with
:func:`solvers.bcd.solve_bcd`.

Random draws use ``numpy.random.default_rng(seed)``. The paper's random policies redraw during
training (A12); a *planner* returns one plan, so each random policy here returns **one draw**
for the given ``seed`` (the benchmark averages over seeds to estimate the expectation).
Random cuts are drawn from the feasible candidates (those that admit I = 1, §8 A7) that fit the
device's memory (:mod:`solvers.memory`) and random intervals from {1..25} ∩ {I : c − d(L_c)I² > 0}.

* ``rma+ms``  — I ~ U{1..25}; MS by Dinkelbach (Algorithm 2) at that I.
* ``ma+rms``  — random cuts; I by Theorem 2.
* ``rma+rms`` — both random.
* ``dama+rms`` — random cuts; I by the depth-aware MA rule of AiFed [27] (see :func:`dama_interval`).
* ``rma+ams`` — I ~ U{1..25}; cuts by the CoopFL-style heterogeneity-aware MS [62]
  (see :func:`ams_cuts`).
* ``fixed-cut`` — every device at one cut; I by Theorem 2.
* ``sfl`` — I = 1 (aggregate every round); MS by Dinkelbach at I = 1.
* ``psl`` — parallel split learning, never aggregating (I = ∞). Under Theorem 1 the drift term
  4β²γ²I²A_{L_c} is unbounded, so ε is not guaranteed for any R: PSL is reported as
  ``success=False``, ``status="unbounded_drift"``, ``objective=inf``; its cuts (the SFL/MS
  cuts at I = 1 unless given) and per-round latency are in ``history`` for reference.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Sequence

import numpy as np

from adaptplan.errors import InfeasibleError, InputError
from solvers.bcd import choose_ms_method, ma_step
from solvers.dinkelbach import solve_dinkelbach
from solvers.interval import max_feasible_interval
from solvers.problem import PlanningProblem
from solvers.result import SolveResult
from solvers.threshold import solve_ms_exact

#: Range of the random interval of the RMA baselines (§6.2): I ~ U{1, …, 25}.
RANDOM_INTERVAL_RANGE = (1, 25)
#: Fraction κ of the convergence budget c the DAMA drift term may use (see :func:`dama_interval`).
DAMA_BUDGET = 0.5


def _result(problem: PlanningProblem, method: str, interval: int, cuts: Sequence[int], start: float,
            message: str, **extra) -> SolveResult:
    cuts = tuple(int(c) for c in cuts)
    objective = problem.objective(interval, cuts)
    return SolveResult(cuts=cuts, interval=int(interval), objective=objective, success=math.isfinite(objective),
                       status="policy" if math.isfinite(objective) else "infeasible", message=message,
                       method=method, seconds=time.perf_counter() - start, **extra)


def random_cuts(problem: PlanningProblem, rng: np.random.Generator) -> tuple[int, ...]:
    """Each device's cut ~ U(feasible candidates that fit its memory) (§8 A12)."""
    problem.check_feasible()
    cand = problem.feasible_candidates
    if problem.admissible is None:
        return tuple(int(c) for c in rng.choice(cand, size=problem.num_devices))
    ok = problem.admissible_at(cand)
    # the k-th admissible candidate of each row, k ~ U{0..count−1}: one draw per device, vectorised
    pick = np.floor(rng.random(problem.num_devices) * ok.sum(axis=1)).astype(int)
    column = np.argmax(np.cumsum(ok, axis=1) > pick[:, None], axis=1)
    return tuple(int(c) for c in cand[column])


def random_interval(problem: PlanningProblem, deepest_cut: int, rng: np.random.Generator) -> int:
    """I ~ U({1..25} ∩ feasible for L_c = ``deepest_cut``) (§6.2 RMA)."""
    conv = problem.convergence
    top = min(RANDOM_INTERVAL_RANGE[1], max_feasible_interval(conv.c, conv.d(deepest_cut)))
    if top < RANDOM_INTERVAL_RANGE[0]:
        raise InfeasibleError(conv.infeasibility_reason(1, deepest_cut))
    return int(rng.integers(RANDOM_INTERVAL_RANGE[0], top + 1))


def dama_interval(problem: PlanningProblem, cuts: Sequence[int], *, budget: float = DAMA_BUDGET) -> int:
    """Depth-aware adaptive MA (DAMA, after AiFed's AGMA, You et al., TKDE 2024 [27]).

    Only AiFed's abstract was available: it optimises aggregation *layer-wise*, aggregating deep
    (drift-prone) parts more often than shallow ones. Our documented stand-in keeps that
    principle and is latency-unaware: the interval shrinks with the depth of the client-specific
    model so that the drift term of Theorem 1 uses a fixed share κ = ``budget`` of the budget c:

        4β²γ²A_{L_c}·I² ≤ κ·c   ⇒   I = max(1, ⌊√(κc / d(L_c))⌋)   (strictly feasible).
    """
    conv = problem.convergence
    d = conv.d(int(max(cuts)))
    if d <= 0:
        return RANDOM_INTERVAL_RANGE[1]
    I = max(1, int(math.floor(math.sqrt(budget * conv.c / d))))
    return min(I, max(1, max_feasible_interval(conv.c, d)))


def ams_cuts(problem: PlanningProblem) -> tuple[int, ...]:
    """Resource-heterogeneity-aware MS (AMS, after CoopFL, Wang et al., Comput. Netw. 2023 [62]).

    CoopFL partitions the DNN per device according to its compute and link resources so that weak
    devices offload more layers and no device straggles. Our documented stand-in: each device
    independently picks the feasible candidate cut minimising its own per-round latency,
    client FP + upload + its share of server FP/BP + download + client BP (eqs. (16)–(21) for that
    device alone, server work at full f_s), ignoring the convergence coupling through L_c and the
    aggregation stage — the two things AdaptSFL adds.
    """
    lat = problem.latency
    cand = problem.feasible_candidates
    j = cand - 1
    per_device = (lat.fp_up[:, j] + lat.down_bp[:, j]
                  + lat.server_per_device[j][None, :])
    per_device = np.where(problem.admissible_at(cand), per_device, np.inf)  # only cuts that fit the memory
    return tuple(int(c) for c in cand[np.argmin(per_device, axis=1)])


def optimal_cuts(problem: PlanningProblem, interval: int, backend: str = "highs") -> SolveResult:
    """The MS step at a given I for the baselines: Dinkelbach (Algorithm 2) on small instances, the
    threshold sweep on large ones (:func:`solvers.bcd.choose_ms_method`)."""
    if choose_ms_method(problem) == "threshold":
        return solve_ms_exact(problem, interval)
    return solve_dinkelbach(problem, interval, backend=backend)


def solve_rma_ms(problem: PlanningProblem, *, seed: int = 0, backend: str = "highs") -> SolveResult:
    """RMA+MS: I ~ U{1..25} (feasible for the shallowest cut), MS by Dinkelbach at that I."""
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    interval = random_interval(problem, int(problem.feasible_candidates[0]), rng)
    ms = optimal_cuts(problem, interval, backend)
    return _result(problem, "rma+ms", interval, ms.cuts, start, f"random I={interval}, optimal MS",
                   milp_solves=ms.milp_solves, backend=backend)


def solve_ma_rms(problem: PlanningProblem, *, seed: int = 0) -> SolveResult:
    """MA+RMS: random cuts, I by Theorem 2."""
    start = time.perf_counter()
    cuts = random_cuts(problem, np.random.default_rng(seed))
    return _result(problem, "ma+rms", ma_step(problem, cuts), cuts, start, "random cuts, Theorem-2 interval")


def solve_rma_rms(problem: PlanningProblem, *, seed: int = 0) -> SolveResult:
    """RMA+RMS: random cuts and I ~ U{1..25} (feasible for those cuts)."""
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    cuts = random_cuts(problem, rng)
    return _result(problem, "rma+rms", random_interval(problem, max(cuts), rng), cuts, start, "random cuts and interval")


def solve_dama_rms(problem: PlanningProblem, *, seed: int = 0, budget: float = DAMA_BUDGET) -> SolveResult:
    """DAMA+RMS: random cuts, I by :func:`dama_interval`."""
    start = time.perf_counter()
    cuts = random_cuts(problem, np.random.default_rng(seed))
    return _result(problem, "dama+rms", dama_interval(problem, cuts, budget=budget), cuts, start,
                   f"random cuts, depth-aware interval (budget {budget})")


def solve_rma_ams(problem: PlanningProblem, *, seed: int = 0) -> SolveResult:
    """RMA+AMS: cuts by :func:`ams_cuts`, I ~ U{1..25} (feasible for those cuts)."""
    start = time.perf_counter()
    cuts = ams_cuts(problem)
    interval = random_interval(problem, max(cuts), np.random.default_rng(seed))
    return _result(problem, "rma+ams", interval, cuts, start, "heterogeneity-aware cuts, random interval")


def solve_fixed_cut(problem: PlanningProblem, cut: int) -> SolveResult:
    """Every device at ``cut`` (1-based), I by Theorem 2."""
    start = time.perf_counter()
    if cut not in set(problem.candidates.tolist()):
        raise InputError(f"cut {cut} is not a candidate cut", field="cut")
    cuts = (int(cut),) * problem.num_devices
    if not problem.fits(cuts):
        i = int(np.flatnonzero(~problem.admissible_at(np.array([cut]))[:, 0])[0])
        raise InfeasibleError(f"cut {cut} does not fit device {i}'s memory_bytes")
    if problem.convergence.margin(1, cut) <= 0:
        raise InfeasibleError(problem.convergence.infeasibility_reason(1, cut))
    return _result(problem, f"fixed-cut-{cut}", ma_step(problem, cuts), cuts, start, f"all devices cut at {cut}")


def solve_sfl(problem: PlanningProblem, *, backend: str = "highs") -> SolveResult:
    """SFL with I = 1: MS by Dinkelbach at I = 1 (aggregate every round)."""
    start = time.perf_counter()
    ms = optimal_cuts(problem, 1, backend)
    return _result(problem, "sfl", 1, ms.cuts, start, "I=1, optimal MS", milp_solves=ms.milp_solves, backend=backend)


def solve_psl(problem: PlanningProblem, *, cuts: Sequence[int] | None = None, backend: str = "highs") -> SolveResult:
    """PSL (no client-side MA, I = ∞): not certifiable under Theorem 1 — see the module docstring."""
    start = time.perf_counter()
    if cuts is None:
        cuts = optimal_cuts(problem, 1, backend).cuts
    cuts = tuple(int(c) for c in cuts)
    t_split, _ = problem.stage_latencies(cuts)
    return SolveResult(cuts=cuts, interval=0, objective=math.inf, success=False, status="unbounded_drift",
                       message="PSL never aggregates (I=inf): the drift term 4*beta^2*gamma^2*I^2*A_Lc of Theorem 1 is "
                               "unbounded, so no number of rounds guarantees epsilon; interval=0 encodes 'never'",
                       method="psl", seconds=time.perf_counter() - start, backend=backend,
                       history=[{"round_latency_s": t_split, "aggregation_latency_s": 0.0}])


#: One line per policy name, printed under the benchmark tables.
EXPLANATIONS: dict[str, str] = {
    "adaptsfl(bcd)": "AdaptSFL: Algorithm 3, Theorem-2 interval <-> optimal cuts (MILFP / threshold sweep), with certificate",
    "exact": "the exact optimum of (28) (deepest-cut enumeration + parametric numerator MILPs)",
    "rma+ms": "random interval I ~ U{1..25}, optimal cuts for it (the MS step)",
    "ma+rms": "random cut per device, Theorem-2 interval for those cuts",
    "rma+rms": "random cuts and random interval I ~ U{1..25}",
    "dama+rms": "random cuts, depth-aware interval (AiFed-style: drift uses half the accuracy budget)",
    "rma+ams": "each device's own fastest cut (CoopFL-style, ignores convergence), random interval",
    "sfl": "SplitFed: aggregate every round (I = 1), optimal cuts for I = 1",
    "psl": "parallel split learning, never aggregates: no convergence guarantee (objective inf)",
}

#: name → policy(problem, seed, backend) for the benchmark.
BASELINES: dict[str, Callable[[PlanningProblem, int, str], SolveResult]] = {
    "rma+ms": lambda p, seed, backend: solve_rma_ms(p, seed=seed, backend=backend),
    "ma+rms": lambda p, seed, backend: solve_ma_rms(p, seed=seed),
    "rma+rms": lambda p, seed, backend: solve_rma_rms(p, seed=seed),
    "dama+rms": lambda p, seed, backend: solve_dama_rms(p, seed=seed),
    "rma+ams": lambda p, seed, backend: solve_rma_ams(p, seed=seed),
    "sfl": lambda p, seed, backend: solve_sfl(p, backend=backend),
    "psl": lambda p, seed, backend: solve_psl(p, backend=backend),
}
