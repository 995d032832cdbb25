"""A certified lower bound on the optimum of (28) over (I, x) (issue 16), from MS-step bounds.

Write Θ* = (2ϑ/γ)·min_L min_{I ∈ ℤ⁺} h_L(I) / g_L(I) with g_L(I) = I(c − d(L)I²) and
h_L(I) = min_{x ≤ L} (I·T_split(x) + T_agg,L(x)) (S_n at δ_L, docs/model.md §4.3; the decomposition of
:mod:`solvers.threshold` and :mod:`solvers.exact`). An MS step at interval I_k (exact or
budgeted) gives a lower bound ℓ_k on min_L h_L(I_k)/g_L(I_k), hence h_L(I_k) ≥ ℓ_k·g_L(I_k) for
every L feasible at I_k. Since h_L is a minimum of functions affine in I it is **concave**, so

* between two evaluated intervals it lies above the chord of those lower bounds;
* right of the last one, h_L(I) ≥ h_L(I_k) + (I − I_k)·α_L, and left of the first,
  h_L(I) ≥ (I/I_k)·h_L(I_k) + (1 − I/I_k)·β_L;
* everywhere h_L(I) ≥ I·α_L + β_L,

with α_L ≤ min T_split and β_L ≤ min T_agg over x ≤ L the separable bounds of
:func:`solvers.threshold._cheap_bounds` (each max term at its per-device minimum). The bound is the
minimum of these over L and over every integer I ≤ I_max(L) (vectorised). Where it is below the
incumbent, the MS step is run at the interval where the bound is lowest (which also may improve
the incumbent), until the gap closes, ``max_calls`` is spent or an MS step runs out of its own
budget (then more of them would not close the gap either).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from adaptplan.convergence import interval_denominator
from solvers.interval import DEFAULT_MAX_INTERVAL, max_feasible_interval
from solvers.problem import PlanningProblem
from solvers.result import SolveResult
from solvers.threshold import _cheap_bounds

#: Relative gap below which a plan counts as proven optimal (reported gap 0).
GAP_TOLERANCE = 1e-8
#: MS steps the certificate may add to those the solver already made.
CERTIFICATE_CALLS = 12


@dataclass
class Certificate:
    """Result of :func:`certify`: ``lower_bound`` (seconds, objective (28)), the best plan seen
    (``interval``, ``cuts``, ``objective`` in seconds) and the MS steps it added (``calls``)."""

    lower_bound: float
    interval: int
    cuts: tuple[int, ...]
    objective: float
    calls: int = 0
    evaluated: list[int] = field(default_factory=list)

    @property
    def gap(self) -> float:
        return max(0.0, (self.objective - self.lower_bound) / self.objective)


def interval_bounds(problem: PlanningProblem, known: dict[int, float], *,
                    max_interval: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(I, bound): for every integer I in 1..max_L I_max(L), a lower bound on min_x N(x)/D(x) at I
    (the ratio of (34), objective (28) divided by 2ϑ/γ), from the MS lower bounds ``known``
    {I_k: ℓ_k} (module docstring); ∞ where no cut is feasible."""
    conv = problem.convergence
    cand = problem.candidates
    feasible = conv.c - conv.d_per_cut[cand - 1] > 0
    cap = max_interval if max_interval is not None else DEFAULT_MAX_INTERVAL
    tops = np.array([min(max_feasible_interval(conv.c, conv.d(int(L))), cap) for L in cand])
    top = int(tops[feasible].max()) if feasible.any() else 0
    I = np.arange(1, top + 1, dtype=float)
    beta = _cheap_bounds(problem, 0.0, cand)
    with np.errstate(invalid="ignore"):  # ∞ − ∞ for an L some device cannot use (skipped below)
        alpha = _cheap_bounds(problem, 1.0, cand) - beta
    points = np.array(sorted(known), dtype=float)
    lows = np.array([known[int(k)] for k in points])
    bound = np.full(I.size, np.inf)
    for pos, L in enumerate(cand.tolist()):
        if not feasible[pos] or not np.isfinite(beta[pos]):
            continue
        d = conv.d(L)
        g = interval_denominator(conv.c, d, I)
        ok = (I <= tops[pos]) & (g > 0)
        h = I * alpha[pos] + beta[pos]
        gk = interval_denominator(conv.c, d, points)
        valid = gk > 0
        if valid.any():
            xs, ys = points[valid], lows[valid] * gk[valid]
            chord = np.interp(I, xs, ys)
            chord = np.where(I > xs[-1], ys[-1] + (I - xs[-1]) * alpha[pos], chord)
            chord = np.where(I < xs[0], (I / xs[0]) * ys[0] + (1 - I / xs[0]) * beta[pos], chord)
            h = np.maximum(h, chord)
        bound = np.where(ok, np.minimum(bound, h / np.where(ok, g, 1.0)), bound)
    return I.astype(int), bound


def certify(problem: PlanningProblem, best: SolveResult, known: dict[int, SolveResult],
            ms_step: Callable[[int, tuple[int, ...]], SolveResult], *, max_calls: int = CERTIFICATE_CALLS,
            max_interval: int | None = None, tol: float = GAP_TOLERANCE) -> Certificate:
    """Lower-bound the optimum of (28) given the MS steps ``known`` {I: MS result with ``lower_bound``}
    already made and an MS-step oracle ``ms_step(I, warm_cuts)``; ``best`` is the incumbent plan.

    The bound is valid whatever the MS steps are (exact or budgeted), as long as each one's
    ``lower_bound`` is; it equals the incumbent (gap 0) when that is proven optimal to ``tol``.
    """
    scale = problem.scale
    cert = Certificate(lower_bound=0.0, interval=best.interval, cuts=tuple(best.cuts), objective=best.objective)
    lows = {I: (r.lower_bound / scale if math.isfinite(r.lower_bound) else 0.0) for I, r in known.items()}
    for I, r in known.items():
        if r.objective < cert.objective:
            cert.interval, cert.cuts, cert.objective = I, tuple(r.cuts), r.objective
    budgeted = False  # an MS step that ran out of budget: more of them will not close the gap, stop
    while True:
        intervals, bound = interval_bounds(problem, lows, max_interval=max_interval)
        k = int(np.argmin(bound)) if bound.size else 0
        lower = scale * float(bound[k]) if bound.size else math.inf
        cert.lower_bound = min(lower, cert.objective)
        if lower >= cert.objective * (1 - tol) or cert.calls >= max_calls or int(intervals[k]) in lows or budgeted:
            break
        I = int(intervals[k])
        result = ms_step(I, cert.cuts)
        cert.calls += 1
        cert.evaluated.append(I)
        lows[I] = result.lower_bound / scale if math.isfinite(result.lower_bound) else 0.0
        budgeted = result.status == "budget"
        if result.objective < cert.objective:
            cert.interval, cert.cuts, cert.objective = I, tuple(result.cuts), result.objective
    if cert.lower_bound >= cert.objective * (1 - tol):
        cert.lower_bound = cert.objective  # proven optimal within the tolerance: gap 0
    return cert
