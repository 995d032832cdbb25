"""The MA step: Theorem 2 (docs/model.md §4.4, eqs. (32), (33), (46)–(48)).

For fixed cuts, with a = T_split(x) (s), b = T_agg(x) (s), c = ε − (βγ/N)Σσ_j² and
d = 4β²γ²A_{L_c} (dimensionless), the MA subproblem (32) is

    min_I F(I) = (a·I + b) / (I (c − d I²)),   I ∈ ℤ⁺,  c − d I² > 0.

F′(I) = φ(I)/(cI − dI³)² (46) with φ(I) = 2ad I³ + 3bd I² − bc (47). φ is increasing and convex
on (0, ∞), so Newton–Raphson from I = √(c/d) (where φ > 0) decreases monotonically to the unique
root I₀; the integer optimum is the better of ⌊I₀⌋ and ⌈I₀⌉ (33)/(48).

Degenerate cases (documented choices):

* d = 0 (no drift term, e.g. all G_j² = 0 up to L_c): F(I) = (a + b/I)/c is strictly decreasing,
  so the relaxed optimum is I → ∞ (never aggregate). :func:`newton_interval` returns ``inf`` and
  :func:`best_interval` returns ``max_interval`` (default :data:`DEFAULT_MAX_INTERVAL`).
* b = 0 (free aggregation): φ(I) = 2adI³ > 0 on (0, ∞), I₀ = 0 and I* = 1.
"""

from __future__ import annotations

import math

import numpy as np

from adaptplan.convergence import latency_ratio, margin
from adaptplan.errors import InfeasibleError

#: Cap on I used when d = 0 (F strictly decreasing); rounds.
DEFAULT_MAX_INTERVAL = 10_000


def interval_objective(interval: float | np.ndarray, a: float, b: float, c: float, d: float) -> float | np.ndarray:
    """F(I) = (aI + b)/(I(c − dI²)) of eq. (32) (seconds, without the factor 2ϑ/γ); ``inf`` where c − dI² ≤ 0."""
    return latency_ratio(interval, a, b, c, d)


def newton_interval(a: float, b: float, c: float, d: float, *, tol: float = 1e-12, max_iter: int = 200) -> float:
    """Real minimiser I₀ of F (eq. (32)): the root of φ(I) = 2adI³ + 3bdI² − bc (eq. (47)).

    Newton–Raphson I ← I − φ(I)/φ′(I), φ′(I) = 6adI² + 6bdI, from I = √(c/d), stopping when
    |ΔI| < ``tol``. Returns ``inf`` when d = 0 and 0 when b = 0 (see the module docstring).

    Raises:
        InfeasibleError: c ≤ 0 (the target ε is below the noise floor, Corollary 1).
    """
    if c <= 0:
        raise InfeasibleError(f"c = epsilon - beta*gamma*sum(sigma2)/N = {c:g} <= 0: the target accuracy is unreachable")
    if a < 0 or b < 0 or d < 0:
        raise ValueError(f"a, b, d must be non-negative, got a={a}, b={b}, d={d}")
    if d == 0:
        return math.inf
    if b == 0:
        return 0.0
    I = math.sqrt(c / d)
    for _ in range(max_iter):
        phi = (2.0 * a * d * I + 3.0 * b * d) * I * I - b * c
        dphi = 6.0 * d * I * (a * I + b)
        step = phi / dphi
        I -= step
        if abs(step) < tol:
            break
    return I


def best_interval(a: float, b: float, c: float, d: float, *, max_interval: int | None = None) -> int:
    """Integer optimum I* of (32) by the floor/ceil rule (33)/(48) with the guards of §4.4 / §8 A7.

    ⌊I₀⌋ = 0 is replaced by 1; ⌈I₀⌉ is dropped when c − d⌈I₀⌉² ≤ 0; ties go to the smaller I.
    ``max_interval`` (rounds) optionally caps I (used for d = 0, default
    :data:`DEFAULT_MAX_INTERVAL`); with a cap the rule still returns the best I ≤ cap because F
    is unimodal.

    Raises:
        InfeasibleError: no integer I ≥ 1 satisfies c − dI² > 0 (the cuts are too deep for ε).
    """
    I0 = newton_interval(a, b, c, d)
    if math.isinf(I0):
        return int(max_interval if max_interval is not None else DEFAULT_MAX_INTERVAL)
    low, high = max(1, math.floor(I0)), max(1, math.ceil(I0))
    if max_interval is not None:
        low, high = min(low, max_interval), min(high, max_interval)
    options = [I for I in dict.fromkeys((low, high)) if margin(c, d, I) > 0]
    if not options:
        raise InfeasibleError(f"no interval I >= 1 satisfies c - d*I^2 > 0 (c={c:g}, d={d:g}): "
                              f"the deepest cut is too deep for the target epsilon; choose shallower cuts or a larger epsilon")
    return min(options, key=lambda I: (interval_objective(I, a, b, c, d), I))


def max_feasible_interval(c: float, d: float) -> int:
    """Largest integer I with c − dI² > 0 (0 if none), i.e. ⌈√(c/d)⌉ − 1 up to rounding (§4.4)."""
    if d <= 0:
        return DEFAULT_MAX_INTERVAL
    I = int(math.floor(math.sqrt(max(c, 0.0) / d)))
    while I >= 1 and margin(c, d, I) <= 0:
        I -= 1
    while margin(c, d, I + 1) > 0:
        I += 1
    return I
