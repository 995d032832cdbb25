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
    # The four multiplier vectors as rows of one array, kept as logarithms (mirror ascent's natural
    # coordinates): λ, μ over the N devices (their column N is a padding fixed at weight 0), ν, ω over the N
    # devices and the fed link (column N: ν₀, ω₀). All start uniform.
    log_w = np.zeros((4, N + 1))
    log_w[:2, N] = -np.inf
    w = _normalised(log_w)
    grad = np.zeros((4, N + 1))
    best = -np.inf
    rows = np.arange(N)
    cost, term = np.empty((N, J)), np.empty((N, J))
    for t in range(1, iterations + 1):
        lam, mu, nu, om = w[0, :N], w[1, :N], w[2], w[3]
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
        # the subgradient of each multiplier's term (λ_i: I·a_ij, μ_i: I·b_ij, whose factor I cancels in
        # _mirror's scaling to a unit maximum)
        sigma = float(gap_bits[j].sum())
        grad[0, :N], grad[1, :N] = A[rows, j], B[rows, j]
        grad[2, :N], grad[2, N] = U[rows, j], sigma / r_ef                              # ν_i: u_ij; ν₀: σ/r_ef
        grad[3, :N], grad[3, N] = V[rows, j], sigma / r_fe                              # ω_i: v_ij; ω₀: σ/r_fe
        w = _mirror(log_w, grad, 2.0 / np.sqrt(t))
    return best


def _mirror(log_w: np.ndarray, grad: np.ndarray, step: float) -> np.ndarray:
    """One exponentiated-gradient ascent step on each row's simplex, in place on the rows' logarithms
    ``log_w`` (each row's gradient scaled to a unit maximum; a row with a zero gradient stays); returns the
    new weights."""
    scale = np.abs(grad).max(axis=1)
    scale[scale <= 0] = np.inf
    log_w += grad * (2.0 * step / scale)[:, None]
    return _normalised(log_w)


def _normalised(log_w: np.ndarray) -> np.ndarray:
    """Each row of ``log_w`` shifted to a zero maximum (in place) and exponentiated to weights summing to 1."""
    log_w -= log_w.max(axis=1, keepdims=True)
    w = np.exp(log_w)
    w /= w.sum(axis=1, keepdims=True)
    return w
