"""Exact MS step (34) at fixed I by a threshold sweep — a fast alternative to Algorithm 2's MILPs
(spec/adaptsfl.md §2.2–§2.4, §4.3, §5.1–§5.2).

**Reduction to a fixed deepest cut.** In (34) the only coupling through the deepest cut L_c is
μ₅ = A_{L_c} (in D) and μ₆ = δ_{L_c} (in S_n, hence in μ₃, μ₄). Fix an upper bound L on all cuts
and set μ₅ = A_L, μ₆ = δ_L. Then D_L = I c − 4β²γ²I³A_L is a constant, and the numerator is

    N_L(x) = I·max_i a_i(x_i) + I·max_i b_i(x_i) + I·Σ_i s(x_i)
             + max(max_i u_i(x_i), σ_L(x)/r_ef) + max(max_i v_i(x_i), σ_L(x)/r_fe),

with a = fp_up (16)+(17), b = down_bp (20)+(21), u = model_up (22), v = model_down (24),
s(j) = server FP + BP per device (18)+(19), σ_L(x) = Σ_i (δ_L − δ_{x_i}) = S_n (23)/(25). For a
vector whose true deepest cut is L_c ≤ L, N_L(x) ≥ N(x) (δ_L ≥ δ_{L_c}) and D_L ≤ D_{L_c}
(A non-decreasing), with equality at L = L_c. Hence

    min_x N(x)/D(x) = min_L [ min_{x ≤ L} N_L(x) ] / D_L,                                  (*)

i.e. the optimum of the MILFP (34) (equivalently, the root λ* of Dinkelbach's F(λ) = 0, (35):
F(λ) = min_L min_x N_L(x) − λ D_L) is found by minimising the numerator exactly for every
admissible L (those with D_L > 0 — the μ₅ bound of (34)) and dividing by the constant D_L. No
Dinkelbach iteration is needed.

**Thresholds.** Let t1 ≥ max a, t2 ≥ max b, t3 ≥ max u, t4 ≥ max v be epigraph values (the μ₁…μ₄
of (30)). Given t, every device independently takes its *deepest admissible* cut
x_i(t) = max{ j ≤ L candidate : a_i(j) ≤ t1, b_i(j) ≤ t2, u_i(j) ≤ t3, v_i(j) ≤ t4 }: when s is
non-increasing and δ non-decreasing in j (checked, see :func:`applicable`), the deepest cut
minimises both Σs and σ_L. So with Φ(t) = I t1 + I t2 + I Σs(x(t)) + max(t3, σ(x(t))/r_ef) +
max(t4, σ(x(t))/r_fe) we have N_L(x(t)) ≤ Φ(t) and, for any x, Φ(thresholds of x) ≤ N_L(x); so
min_x N_L = min_t Φ over the finitely many candidate thresholds (entries of the matrices).

**Search** (per L). (1) One sweep over t1 (all breakpoints, O(NJ log NJ)) gives, for each t1, a
lower bound LB(t1) = I t1 + I t2min(t1) + I Σs(x(t1,∞)) + max(Umin, σ/r_ef) + max(Vmin, σ/r_fe)
where t2min = max_i min_{admissible j} b_i(j) (the smallest feasible t2) and Umin/Vmin likewise,
strengthened by coupling the thresholds through Σs: Σs(x(t)) ≥ max(A(t1), B(t2), C(t3), D(t4)),
each the Σs of the cut vector constrained by that threshold alone (one sweep each), so
LB(t1) ≥ I t1 + min_{M ≥ A(t1)} [I·tb(M) + tu(M) + tv(M) + I M] with tb(M) the smallest t2 with
B(t2) ≤ M etc. The (L, t1) nodes of all L are processed best-first by LB/D_L.
(2) t1 values are processed in increasing LB order until LB ≥ incumbent; for each, one sweep over
t2 gives Φ for all t2 with t3, t4 left free (t3 = max u(x) — uncapped). (3) Only where a capped
bound (Umin, Vmin instead of the uncapped maxima) is below the incumbent, t3 is enumerated and a
sweep over t4 is done. Each sweep sorts the N×J admissible entries by the key and maintains
Σs, σ and the running maxima/minima with cumulative sums — vectorised numpy. Worst case
O(J · (NJ)³ log NJ); measured at N = 1000, J = 20: ~30–40 t1 nodes, ~1300–2000 sweeps, 1.3–1.9 s.
"""

from __future__ import annotations

import math
import time
from typing import Sequence

import numpy as np

from adaptplan.errors import InfeasibleError, InputError
from solvers.milfp import ETA_RELATIVE
from solvers.problem import PlanningProblem
from solvers.result import SolveResult

_REL = 1e-12  # relative slack in the pruning tests (bounds must not prune the optimum by rounding)


def applicable(problem: PlanningProblem) -> bool:
    """Whether the threshold method is exact: over the candidate cuts the per-device server cost
    s(j) = (18)+(19) is non-increasing and δ_j is non-decreasing (true for cumulative ρ, ϖ, δ;
    can fail for a measured ``server_bp_flops``), and A_j is non-decreasing (always, G_j² ≥ 0)."""
    lat = problem.latency
    j = problem.candidates - 1
    s = (lat.server_fp_per_device + lat.server_bp_per_device)[j]
    delta = lat.delta[j]
    A = problem.convergence.constants.cumulative_G2[j]
    return bool(np.all(np.diff(s) <= 0) and np.all(np.diff(delta) >= 0) and np.all(np.diff(A) >= 0))


class _Sweep:
    """Per-threshold statistics of x(t) = deepest admissible cut with key ≤ t (module docstring).

    Given a boolean admissibility mask M (N×J) and a key matrix K (N×J), for every distinct key
    value t at which every device has an admissible entry: Σs(x(t)), σ(x(t)), max_i u_i(x_i(t)),
    max_i v_i(x_i(t)) and the "smallest possible" maxima max_i min_{admissible j} of the matrices
    in ``mins`` (used as lower bounds).
    """

    def __init__(self, key: np.ndarray, mask: np.ndarray, s: np.ndarray, dl: np.ndarray,
                 u: np.ndarray, v: np.ndarray, mins: Sequence[np.ndarray] = ()) -> None:
        N, J = key.shape
        k = np.where(mask, key, np.inf)
        order = np.argsort(k, axis=1, kind="stable")
        ks = np.take_along_axis(k, order, axis=1)
        valid = np.isfinite(ks)
        deep = np.maximum.accumulate(np.where(valid, order, -1), axis=1)  # deepest so far (column)
        dcl = np.maximum(deep, 0)
        rows = np.arange(N)[:, None]
        S, SG = s[dcl], dl[dcl]
        U, V = u[rows, dcl], v[rows, dcl]
        prevS = np.concatenate([np.zeros((N, 1)), S[:, :-1]], axis=1)
        prevSG = np.concatenate([np.zeros((N, 1)), SG[:, :-1]], axis=1)
        first = np.zeros((N, J))
        first[:, 0] = 1.0
        mins_state = []
        for m in mins:  # min over admissible so far of m, per device (non-increasing along the row)
            ms = np.minimum.accumulate(np.where(valid, np.take_along_axis(m, order, axis=1), np.inf), axis=1)
            prev = np.concatenate([np.full((N, 1), np.inf), ms[:, :-1]], axis=1)
            final = float(ms[:, -1].max())
            mins_state.append((prev, final))
        flat = valid.ravel()
        kv = ks.ravel()[flat]
        g = np.argsort(kv, kind="stable")
        kv = kv[g]
        count = np.cumsum(first.ravel()[flat][g])
        sum_s = np.cumsum((S - prevS).ravel()[flat][g])
        sum_sg = np.cumsum((SG - prevSG).ravel()[flat][g])
        max_u = np.maximum.accumulate(U.ravel()[flat][g])
        max_v = np.maximum.accumulate(V.ravel()[flat][g])
        last = np.flatnonzero(np.append(kv[1:] != kv[:-1], True))  # last event of each tie group
        last = last[count[last] == N]  # every device has an admissible cut
        self.t, self.sum_s, self.sigma = kv[last], sum_s[last], sum_sg[last]
        self.max_u, self.max_v = max_u[last], max_v[last]
        self.mins = []
        for prev, final in mins_state:
            p = prev.ravel()[flat][g]
            tail = np.maximum.accumulate(p[::-1])[::-1]  # max over events at or after each position
            tail = np.append(tail, -np.inf)
            self.mins.append(np.maximum(final, tail[last + 1]))


def _deepest(mask: np.ndarray) -> np.ndarray:
    """Deepest admissible column per row (−1 if none)."""
    J = mask.shape[1]
    rev = np.argmax(mask[:, ::-1], axis=1)
    return np.where(mask.any(axis=1), J - 1 - rev, -1)


class _Subproblem:
    """min_x N_L(x) over the candidate columns ≤ L (module docstring), with pruning bound ``bound``."""

    def __init__(self, problem: PlanningProblem, interval: float, cols: np.ndarray) -> None:
        lat = problem.latency
        j = cols - 1
        self.I = float(interval)
        self.a, self.b = lat.fp_up[:, j], lat.down_bp[:, j]
        self.u, self.v = lat.model_up[:, j], lat.model_down[:, j]
        self.s = (lat.server_fp_per_device + lat.server_bp_per_device)[j]
        self.dl = lat.delta[j[-1]] - lat.delta[j]
        sys = lat.system
        self.ref, self.rfe = float(sys.edge_to_fed_bps), float(sys.fed_to_edge_bps)
        self.sweeps = 0

    def value(self, x: np.ndarray) -> float:
        """N_L(x) for column indices x (exact, tight μ)."""
        rows = np.arange(x.size)
        sg = float(self.dl[x].sum())
        return (self.I * (self.a[rows, x].max() + self.b[rows, x].max() + self.s[x].sum())
                + max(self.u[rows, x].max(), sg / self.ref) + max(self.v[rows, x].max(), sg / self.rfe))

    def lower_bounds(self) -> None:
        """One sweep over t1: LB(t1) for every breakpoint (module docstring), and a quick incumbent."""
        I, ref, rfe = self.I, self.ref, self.rfe
        top = _Sweep(self.a, np.ones_like(self.a, dtype=bool), self.s, self.dl, self.u, self.v,
                     mins=(self.b, self.u, self.v))
        self.sweeps += 1
        t2min, umin, vmin = top.mins
        self.top = top
        # Couple t1 and t2 through Σs: Σs(x(t)) ≥ max(A(t1), B(t2)) with A(t1) = Σs(x(t1, ∞)) and
        # B(t2) = Σs(x(∞, t2)) (non-increasing). For breakpoints t2_k ≥ t2min(t1), with k* the first
        # k with B_k ≤ A(t1): min_k t2_k + max(A, B_k) ≥ min(t2_lo + B_{k*−1}, t2_{k*} + A).
        bsw = _Sweep(self.b, np.ones_like(self.b, dtype=bool), self.s, self.dl, self.u, self.v)
        self.sweeps += 1
        tb, B = bsw.t, bsw.sum_s
        K = tb.size
        lo = np.minimum(np.searchsorted(tb, t2min * (1 - _REL), side="left"), K - 1)
        A = top.sum_s
        kstar = np.searchsorted(-B, -A * (1 + _REL), side="left")  # first k with B_k ≤ A (B non-increasing)
        kstar = np.maximum(kstar, lo)
        right = np.where(kstar < K, tb[np.minimum(kstar, K - 1)] + A, np.inf)
        left = np.where(kstar > lo, tb[lo] + B[np.maximum(kstar - 1, 0)], np.inf)
        pair = np.minimum(left, right)
        pair = np.where(np.isfinite(pair), pair, t2min + A)
        pair = np.maximum(pair, t2min + A)
        self.lb = (I * top.t + I * pair + np.maximum(umin, top.sigma / ref)
                   + np.maximum(vmin, top.sigma / rfe))
        # Couple t1, t2 and t3 through one level M ≥ Σs: with C(t3) = Σs(x(∞, ∞, t3, ∞)),
        # Φ ≥ I t1 + min_{M ≥ A(t1)} [I·tb(M) + tu(M) + I M] + max(Vmin, σ/r_fe), where tb(M), tu(M)
        # are the smallest breakpoints with B ≤ M, C ≤ M. M ranges over the values of A, B, C.
        usw = _Sweep(self.u, np.ones_like(self.u, dtype=bool), self.s, self.dl, self.u, self.v)
        self.sweeps += 1
        tu, C = usw.t, usw.sum_s
        if K and tu.size:
            M = np.unique(np.concatenate([A, B, C]))
            kb = np.searchsorted(-B, -M * (1 + _REL), side="left")
            ku = np.searchsorted(-C, -M * (1 + _REL), side="left")
            ok = (kb < K) & (ku < tu.size)
            g = np.where(ok, I * tb[np.minimum(kb, K - 1)] + tu[np.minimum(ku, tu.size - 1)] + I * M, np.inf)
            suffix = np.minimum.accumulate(g[::-1])[::-1]
            at = np.searchsorted(M, A * (1 - _REL), side="left")
            best_g = np.where(at < M.size, suffix[np.minimum(at, M.size - 1)], np.inf)
            coupled = I * top.t + best_g * (1 - 1e-12) + np.maximum(vmin, top.sigma / rfe)
            self.lb = np.maximum(self.lb, coupled)
            # Same with the t4 cap (key v) in the level too: + tv(M) instead of the Vmin term.
            vsw = _Sweep(self.v, np.ones_like(self.v, dtype=bool), self.s, self.dl, self.u, self.v)
            self.sweeps += 1
            tv, Dv = vsw.t, vsw.sum_s
            if tv.size:
                M = np.unique(np.concatenate([M, Dv]))
                kb = np.searchsorted(-B, -M * (1 + _REL), side="left")
                ku = np.searchsorted(-C, -M * (1 + _REL), side="left")
                kv = np.searchsorted(-Dv, -M * (1 + _REL), side="left")
                ok = (kb < K) & (ku < tu.size) & (kv < tv.size)
                g = np.where(ok, I * tb[np.minimum(kb, K - 1)] + tu[np.minimum(ku, tu.size - 1)]
                             + tv[np.minimum(kv, tv.size - 1)] + I * M, np.inf)
                suffix = np.minimum.accumulate(g[::-1])[::-1]
                at = np.searchsorted(M, A * (1 - _REL), side="left")
                best_g = np.where(at < M.size, suffix[np.minimum(at, M.size - 1)], np.inf)
                self.lb = np.maximum(self.lb, I * top.t + best_g * (1 - 1e-12))
        self.lower = float(self.lb.min()) if self.lb.size else math.inf

    def node(self, k: int, bound: float) -> tuple[float, np.ndarray | None]:
        """Best N_L with t1 = the k-th breakpoint: (value, columns) if below ``bound``, else (bound, None)."""
        I, ref, rfe = self.I, self.ref, self.rfe
        best, best_x = bound, None
        if self.lb[k] < best * (1 - _REL):
            t1 = self.top.t[k]
            m1 = self.a <= t1
            # t3 (the cap through u): per t3, Σs/σ with t2, t4 free, and the smallest feasible t2, t4.
            sw3 = _Sweep(self.u, m1, self.s, self.dl, self.u, self.v, mins=(self.b, self.v))
            self.sweeps += 1
            t2min, vmin = sw3.mins
            lb3 = (I * t1 + I * t2min + I * sw3.sum_s + np.maximum(sw3.t, sw3.sigma / ref)
                   + np.maximum(vmin, sw3.sigma / rfe))
            for k3 in np.argsort(lb3, kind="stable"):
                if lb3[k3] >= best * (1 - _REL):
                    break
                t3 = sw3.t[k3]
                m13 = m1 & (self.u <= t3)
                sw = _Sweep(self.b, m13, self.s, self.dl, self.u, self.v, mins=(self.v,))
                self.sweeps += 1
                base = I * t1 + I * sw.t + I * sw.sum_s + np.maximum(t3, sw.sigma / ref)
                phi = base + np.maximum(sw.max_v, sw.sigma / rfe)  # t4 free: t4 = max v(x)
                q = int(np.argmin(phi))
                if phi[q] < best:
                    x = _deepest(m13 & (self.b <= sw.t[q]))
                    val = self.value(x)
                    if val < best:
                        best, best_x = val, x
                capped = base + np.maximum(sw.mins[0], sw.sigma / rfe)
                for q in np.flatnonzero(capped < best * (1 - _REL)):  # a cap through v might pay off
                    best, best_x = self._capped(m13 & (self.b <= sw.t[q]), I * t1 + I * sw.t[q], t3, best, best_x)
        return best, best_x

    def _capped(self, m123: np.ndarray, fixed: float, t3: float, best: float, best_x):
        """Sweep t4 (the cap through v) for the mask of fixed (t1, t2, t3)."""
        I, ref, rfe = self.I, self.ref, self.rfe
        sw = _Sweep(self.v, m123, self.s, self.dl, self.u, self.v)
        self.sweeps += 1
        phi = fixed + I * sw.sum_s + np.maximum(t3, sw.sigma / ref) + np.maximum(sw.t, sw.sigma / rfe)
        q = int(np.argmin(phi))
        if phi[q] < best:
            x = _deepest(m123 & (self.v <= sw.t[q]))
            val = self.value(x)
            if val < best:
                best, best_x = val, x
        return best, best_x


def solve_ms_exact(problem: PlanningProblem, interval: int, *, max_cut: int | None = None,
                   warm_cuts: Sequence[int] | None = None) -> SolveResult:
    """Exact MS step: the optimal cut vector of the MILFP (34) at fixed I by (*) + threshold sweeps.

    Same optimum as :func:`solvers.dinkelbach.solve_dinkelbach` (Algorithm 2 with exact MILPs);
    same candidate columns (candidates ≤ ``max_cut`` with A_j within the μ₅ bound of (34)).
    ``warm_cuts`` (optional, e.g. BCD's current cuts) only seeds the incumbent used for pruning.

    Raises:
        InputError: the method is not exact for this profile (:func:`applicable` is false).
        InfeasibleError: no cut vector satisfies c − d(L_c)I² > 0 at this I.
    """
    start = time.perf_counter()
    if not applicable(problem):
        raise InputError("threshold MS needs s(j) non-increasing and δ_j non-decreasing over the candidates; "
                         "use the MILP (ms_method='milp')", field="ms_method")
    conv = problem.convergence
    I = float(interval)
    k_drift = 4.0 * conv.constants.beta**2 * conv.constants.gamma**2
    A = conv.constants.cumulative_G2
    cand = problem.candidates
    if max_cut is not None:
        cand = cand[cand <= max_cut]
    mu5_bound = conv.c / (k_drift * I * I) * (1.0 - ETA_RELATIVE) if k_drift > 0 else np.inf
    cand = cand[A[cand - 1] <= mu5_bound]
    if cand.size == 0:
        raise InfeasibleError(conv.infeasibility_reason(int(interval), int(problem.candidates[0])))
    best_ratio, best_cuts, sweeps, history = math.inf, None, 0, []
    if warm_cuts is not None and set(int(c) for c in warm_cuts) <= set(cand.tolist()):
        best_cuts = tuple(int(c) for c in warm_cuts)  # incumbent: the warm start's ratio N/D
        best_ratio = problem.objective(int(interval), best_cuts) / problem.scale
    subs = []
    for L_pos in range(cand.size):
        cols = cand[: L_pos + 1]
        L = int(cols[-1])
        den = I * (conv.c - k_drift * A[L - 1] * I * I)  # D_L of (34)
        if den <= 0:
            continue
        sub = _Subproblem(problem, I, cols)
        sub.lower_bounds()
        subs.append((sub.lower / den, L, den, cols, sub))
    for c in cand.tolist():  # uniform vectors (ℓ, …, ℓ): cheap extra incumbents
        value = problem.objective(int(interval), (int(c),) * problem.num_devices) / problem.scale
        if value < best_ratio:
            best_ratio, best_cuts = value, (int(c),) * problem.num_devices
    # Best-first over all (L, t1) nodes by the ratio bound LB_L(t1)/D_L; stop once it reaches the incumbent.
    ratio_lb = np.concatenate([sub.lb / den for _, _, den, _, sub in subs]) if subs else np.zeros(0)
    owner = np.concatenate([np.full(sub.lb.size, n) for n, (*_, sub) in enumerate(subs)]) if subs else np.zeros(0, int)
    position = np.concatenate([np.arange(sub.lb.size) for *_, sub in subs]) if subs else np.zeros(0, int)
    nodes = 0
    for e in np.argsort(ratio_lb, kind="stable"):
        if ratio_lb[e] >= best_ratio * (1 - _REL):
            break
        _, L, den, cols, sub = subs[owner[e]]
        num, x = sub.node(int(position[e]), best_ratio * den if math.isfinite(best_ratio) else math.inf)
        nodes += 1
        if x is not None and num / den < best_ratio:
            best_ratio, best_cuts = num / den, tuple(int(c) for c in cols[x])
    sweeps = sum(sub.sweeps for *_, sub in subs)
    history = [{"deepest_cut": L, "D": den, "sweeps": sub.sweeps} for _, L, den, _, sub in subs]
    if best_cuts is None:
        raise InfeasibleError(conv.infeasibility_reason(int(interval), int(problem.candidates[0])))
    objective = problem.objective(int(interval), best_cuts)
    return SolveResult(cuts=best_cuts, interval=int(interval), objective=objective, success=math.isfinite(objective),
                       status="converged", message=f"threshold sweep: exact MS optimum at I={interval} "
                       f"({nodes} t1 nodes, {sweeps} sweeps over {len(history)} deepest-cut bounds)", method="threshold",
                       iterations=sweeps, milp_solves=0, seconds=time.perf_counter() - start, backend="threshold",
                       history=history)
