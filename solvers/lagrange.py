"""A Lagrangian lower bound on the MS numerator min_{x ≤ L} N_L(x) (docs/model.md §4.3, (34)).

Each max of N_L is at least any convex combination of its arguments:
max_i a_i(x_i) ≥ Σ_i λ_i a_i(x_i) (λ ∈ Δ_N), likewise μ for b, and
max(max_i u_i(x_i), σ(x)/r_ef) ≥ Σ_i ν_i u_i(x_i) + ν₀ σ(x)/r_ef ((ν, ν₀) ∈ Δ_{N+1}), ω for v. With
σ(x) = Σ_i (δ_L − δ_{x_i}) the relaxed numerator separates over devices, so for fixed multipliers

    N_L(x) ≥ Σ_i min_{j admissible, j ≤ L} [ I λ_i a_ij + I μ_i b_ij + I s_j + ν_i u_ij + ω_i v_ij
                                             + (ν₀/r_ef + ω₀/r_fe)(δ_L − δ_j) ],

an O(N·J) evaluation valid for *any* multipliers. Its maximum over the multipliers is the LP
relaxation of the epigraph MILP (34) at fixed L; it is approached by mirror ascent
(exponentiated subgradient steps on the simplices) and the best value seen is returned. Units:
seconds.
"""

from __future__ import annotations

import numpy as np

#: Mirror-ascent iterations per bound.
ITERATIONS = 25


def lagrangian_bound(a: np.ndarray, b: np.ndarray, u: np.ndarray, v: np.ndarray, s: np.ndarray, gap_bits: np.ndarray,
                     interval: float, r_ef: float, r_fe: float, *, iterations: int = ITERATIONS,
                     target: float = np.inf) -> float:
    """Best Lagrangian bound on min_x N_L(x) (module docstring) over ``iterations`` mirror-ascent steps;
    stops early once it reaches ``target``. The cost matrix is summed in place, term by term in the order of the
    module docstring's bracket.

    Args:
        a, b, u, v: (N, J) matrices of (16)+(17), (20)+(21), (22), (24) in seconds over the columns ≤ L,
            ``inf`` where a cut does not fit the device.
        s: (J,) server seconds per device (18)+(19); gap_bits: (J,) δ_L − δ_j in bits.
        interval: I; r_ef, r_fe: edge↔fed rates in bit/s.
    """
    N, J = a.shape
    I = float(interval)
    ok = np.isfinite(a)
    A, B = np.where(ok, a, 0.0), np.where(ok, b, 0.0)
    U, V = np.where(ok, u, 0.0), np.where(ok, v, 0.0)
    base = np.where(ok, I * s[None, :], np.inf)
    lam = np.full(N, 1.0 / N)
    mu = np.full(N, 1.0 / N)
    nu = np.full(N + 1, 1.0 / (N + 1))
    om = np.full(N + 1, 1.0 / (N + 1))
    best = -np.inf
    rows = np.arange(N)
    cost, term = np.empty((N, J)), np.empty((N, J))
    for t in range(1, iterations + 1):
        k = nu[-1] / r_ef + om[-1] / r_fe
        np.multiply((I * lam)[:, None], A, out=term)
        np.add(base, term, out=cost)
        cost += np.multiply((I * mu)[:, None], B, out=term)
        cost += np.multiply(nu[:-1, None], U, out=term)
        cost += np.multiply(om[:-1, None], V, out=term)
        cost += (k * gap_bits)[None, :]
        j = np.argmin(cost, axis=1)
        value = float(cost[rows, j].sum())
        best = max(best, value)
        if best >= target:
            break
        sigma = float(gap_bits[j].sum())
        ga, gb = I * A[rows, j], I * B[rows, j]
        gu = np.append(U[rows, j], sigma / r_ef)
        gv = np.append(V[rows, j], sigma / r_fe)
        step = 2.0 / np.sqrt(t)
        lam, mu, nu, om = (_mirror(w, g, step) for w, g in ((lam, ga), (mu, gb), (nu, gu), (om, gv)))
    return best


def _mirror(weights: np.ndarray, grad: np.ndarray, step: float) -> np.ndarray:
    """One exponentiated-gradient ascent step on the simplex (gradient scaled to a unit maximum)."""
    scale = float(np.max(np.abs(grad)))
    if scale <= 0:
        return weights
    logw = np.log(np.maximum(weights, 1e-300)) + step * 2.0 * grad / scale
    logw -= logw.max()
    w = np.exp(logw)
    return w / w.sum()
