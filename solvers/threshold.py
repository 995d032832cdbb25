"""Exact MS step (34) at fixed I by a threshold sweep — a fast alternative to Algorithm 2's MILPs
(docs/model.md §2.2–§2.4, §4.3, §5.1–§5.2).

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
t3 gives lb3(t3), and t3 values are processed in lb3 order; for each, one sweep over t2 gives Φ
for all t2 with t4 left free (t4 = max v(x)). (3) Only where a capped bound (Vmin instead of the
free maximum) is below the incumbent is a sweep over t4 done, in bound order.

**Bounds** (all rest on monotonicity: a threshold set admits fewer cuts than any one of its
thresholds alone, so x(t) ≤ x(t1,∞,∞,∞), x(∞,∞,t3,∞), … componentwise, hence Σs(x(t)) and σ(x(t))
are at least the Σs and σ of each single-key sweep). Besides the Σs-levels above:
LB(t1) also couples t3 and t4 with σ (:meth:`_Subproblem._sigma_coupled`: min over the u-only and
v-only breakpoints, split by where they fall below A(t1), σ_A(t1), evaluated for all t1 at once
with range-minimum tables); lb3(t3) couples t2 with Σs through the b-only sweep
(:meth:`_Subproblem._t2_coupled`); each t4 sweep is bounded by the v-only sweep's Σs and σ
(:meth:`_Subproblem._capped_bounds`). Every piece drops one argument of some max(·, ·), so the
bounds stay valid however rounding splits the ranges, and get a 1e-12 relative slack.

**Cost.** Each sweep reuses, per L and key, the row orders and the global event order
(:class:`_Keyed`, computed once; only the admissibility mask changes), so a sweep is a handful of
gathers and cumulative sums over the N×J entries, no sort. The interval-independent part of
each L (matrices, orders, the four unrestricted sweeps) can be shared between MS steps at
different I through ``cache`` (BCD does; only up to N·J = :data:`CACHE_SIZE`). Before any sweep,
every L is bounded by :func:`_cheap_bounds` and by the Lagrangian (LP-relaxation) bound of
:mod:`solvers.lagrange`; the L are searched one at a time in bound order and dropped afterwards.
The worst case of the search is O(J · (NJ)³), so it runs under a sweep budget
(``max_sweeps``): past it the best plan found is returned with a certified lower bound (the
smallest bound of what was not searched) and status ``"budget"``.

**Memory budgets.** Cuts that do not fit a device (:mod:`solvers.memory`) get infinite keys, so
no threshold ever admits them; the bounds and sweeps need no other change.
"""

from __future__ import annotations

import math
import time
from typing import Sequence

import numpy as np

from adaptplan.convergence import drift_coefficient, interval_denominator, mu5_bound
from adaptplan.errors import InfeasibleError, InputError
from solvers.lagrange import lagrangian_bound
from solvers.milfp import ETA_RELATIVE
from solvers.problem import PlanningProblem
from solvers.result import SolveResult

_REL = 1e-12  # relative slack in the pruning tests (bounds must not prune the optimum by rounding)
_STRONG_BOUNDS = True  # the Σs/σ-coupled bounds (tests switch them off to check they never prune the optimum)
_CAPPED_BOUND_ROWS = 256  # the t4 bound of _capped_bounds loops in Python: above this many t2 rows the plain bound
#: Sweeps one MS step may spend (each O(N·J)); past it the step returns its incumbent and a certified lower bound.
#: ``max_sweeps="auto"``: SWEEP_ENTRIES / (N·J) sweeps, clipped to [SWEEP_MIN, SWEEP_BUDGET] (a fixed amount of work
#: per MS step beyond the O(N·J log(N·J)) sorts, so large instances stay fast and report their gap).
SWEEP_BUDGET = 120
SWEEP_MIN = 20
SWEEP_ENTRIES = 1.6e6
#: ``solve_ms_exact(cache=...)`` keeps structures between MS steps only up to this N·J (memory).
CACHE_SIZE = 400_000


def applicable(problem: PlanningProblem) -> bool:
    """Whether the threshold method is exact: over the candidate cuts the per-device server cost
    s(j) = (18)+(19) is non-increasing and δ_j is non-decreasing (true for cumulative ρ, ϖ, δ;
    can fail for a measured ``server_bp_flops``), and A_j is non-decreasing (always, G_j² ≥ 0)."""
    lat = problem.latency
    j = problem.candidates - 1
    s = lat.server_per_device[j]
    delta = lat.delta[j]
    A = problem.convergence.constants.cumulative_G2[j]
    return bool(np.all(np.diff(s) <= 0) and np.all(np.diff(delta) >= 0) and np.all(np.diff(A) >= 0))


def _along_rows(ufunc: np.ufunc, m: np.ndarray) -> np.ndarray:
    """``ufunc.accumulate(m, axis=1)`` for an N×J matrix with few columns (the candidates), one strided
    whole-column step per column: numpy's accumulate along a short last axis runs its inner loop once per row,
    3–4× slower at 10,000 × 21. Exact for maximum and minimum (each entry is one of the inputs)."""
    out = np.array(m, copy=True)
    for j in range(1, out.shape[1]):
        ufunc(out[:, j - 1], out[:, j], out=out[:, j])
    return out


class _Keyed:
    """Sort structures of one key matrix K (N×J) over the columns ≤ L, computed once per L and
    shared by every sweep with that key (only the admissibility mask changes between sweeps).

    ``order`` is each row's column order by key; the *events* are all (row, rank) positions in
    global key order (``g``); ``kv`` their keys, ``row`` their rows. Ties within one key value do
    not matter: the sweep statistics are read at the last event of each tie group.
    """

    def __init__(self, key: np.ndarray) -> None:
        N, J = key.shape
        self.N, self.J = N, J
        self.order = np.argsort(key, axis=1, kind="stable")
        self.rowflat = (np.arange(N)[:, None] * J + self.order).ravel()  # flat (i, j) of each (row, rank)
        ks = key.ravel()[self.rowflat]
        self.g = np.argsort(ks, kind="stable")
        self.kv = ks[self.g]
        self.row = self.g // J
        self._sorted: dict[int, np.ndarray] = {}

    def prefix(self, L: int) -> "_Keyed":
        """The sort structures of the key's first ``L`` columns, read off these (no sort): within a row and
        globally, the stable orders of a column prefix are the full orders with the other columns left out,
        since keeping a subset keeps the relative (row, column) positions that break ties."""
        if L == self.J:
            return self
        out = _Keyed.__new__(_Keyed)
        out.N, out.J, out._sorted = self.N, L, {}
        keep = self.order < L                                   # (row, rank) positions of the first L columns
        out.order = self.order[keep].reshape(self.N, L)
        out.rowflat = (np.arange(self.N)[:, None] * L + out.order).ravel()
        new_position = np.cumsum(keep.ravel()) - 1              # each kept (row, rank) in the N×L layout
        kept = keep.ravel()[self.g]
        out.g = new_position[self.g[kept]]
        out.kv, out.row = self.kv[kept], self.row[kept]
        return out

    def sorted_rows(self, m: np.ndarray) -> np.ndarray:
        """``m`` (N×J) in each row's key order (cached per matrix)."""
        out = self._sorted.get(id(m))
        if out is None:
            out = self._sorted[id(m)] = m.ravel()[self.rowflat].reshape(self.N, self.J)
        return out


class _Sweep:
    """Per-threshold statistics of x(t) = deepest admissible cut with key ≤ t (module docstring).

    Given the key's sort structures ``kd`` (:class:`_Keyed`) and a boolean admissibility mask M
    (N×J, ``None`` = all admissible), for every distinct key value t at which every device has an
    admissible entry: Σs(x(t)), σ(x(t)), max_i u_i(x_i(t)), max_i v_i(x_i(t)) and the "smallest
    possible" maxima max_i min_{admissible j} of the matrices in ``mins`` (used as lower bounds).
    """

    def __init__(self, kd: _Keyed, mask: np.ndarray | None, s: np.ndarray, dl: np.ndarray,
                 u: np.ndarray, v: np.ndarray, mins: Sequence[np.ndarray] = ()) -> None:
        N, J = kd.N, kd.J
        if mask is None:
            msort = None
            deep = _along_rows(np.maximum, kd.order)
        else:
            msort = mask.ravel()[kd.rowflat].reshape(N, J)
            deep = _along_rows(np.maximum, np.where(msort, kd.order, -1))  # deepest so far (column)
        prev = np.empty_like(deep)
        prev[:, 0] = -1
        prev[:, 1:] = deep[:, :-1]
        d = deep.ravel()[kd.g]
        pd = prev.ravel()[kd.g]
        kv, row = kd.kv, kd.row
        if msort is not None:
            sel = np.flatnonzero(msort.ravel()[kd.g])
            d, pd, kv, row = d[sel], pd[sel], kv[sel], row[sel]
        s0 = np.append(s, 0.0)  # index −1 → 0 (no admissible cut yet)
        dl0 = np.append(dl, 0.0)
        count = np.cumsum(pd < 0)
        sum_s = np.cumsum(s0[d] - s0[pd])
        sum_sg = np.cumsum(dl0[d] - dl0[pd])
        fl = row * J + d
        max_u = np.maximum.accumulate(u.ravel()[fl])
        max_v = np.maximum.accumulate(v.ravel()[fl])
        last = np.flatnonzero(np.append(kv[1:] != kv[:-1], True))  # last event of each tie group
        last = last[(count[last] == N) & np.isfinite(kv[last])]  # every device has an admissible cut
        self.t, self.sum_s, self.sigma = kv[last], sum_s[last], sum_sg[last]
        self.max_u, self.max_v = max_u[last], max_v[last]
        self.mins = []
        for m in mins:  # min over admissible so far of m, per device (non-increasing along the row)
            msr = kd.sorted_rows(m)
            ms = _along_rows(np.minimum, msr if msort is None else np.where(msort, msr, np.inf))
            final = float(ms[:, -1].max())
            pm = np.empty_like(ms)
            pm[:, 0] = np.inf
            pm[:, 1:] = ms[:, :-1]
            p = pm.ravel()[kd.g]
            if msort is not None:
                p = p[sel]
            tail = np.maximum.accumulate(p[::-1])[::-1]  # max over events at or after each position
            tail = np.append(tail, -np.inf)
            self.mins.append(np.maximum(final, tail[last + 1]))


class _RangeMin:
    """Vectorised min of ``values[lo:hi]`` (inf for an empty range), from blocks of :attr:`BLOCK` entries:
    each entry's minimum from its block's start (``prefix``) and to its block's end (``suffix``), and a
    sparse table over the blocks' minima. A range over several blocks is the minimum of its first block's
    suffix, its last block's prefix and the table's answer for the whole blocks between; a range inside one
    block is reduced directly (at most :attr:`BLOCK` entries). Three passes over the values to build,
    instead of log₂ n for a sparse table over all of them. Up to :attr:`SMALL` values the blocks hold one
    entry each (a sparse table over all values: cheap to build at that size, and its queries take fewer steps)."""

    BLOCK = 64
    SMALL = 1 << 16   # up to this many values, blocks of one: a plain sparse table, whose queries are cheaper

    def __init__(self, values: np.ndarray) -> None:
        values = np.asarray(values, dtype=float)
        self.n = n = values.size
        self.block = B = 1 if n <= self.SMALL else self.BLOCK
        blocks = np.full((-(-n // B), B), np.inf)
        blocks.ravel()[:n] = values
        self.values = blocks.ravel()
        self.prefix = np.minimum.accumulate(blocks, axis=1).ravel()
        self.suffix = np.minimum.accumulate(blocks[:, ::-1], axis=1)[:, ::-1].ravel()
        minima = self.suffix[::B]
        m = minima.size
        self.table = table = np.empty((max(m.bit_length(), 1), m))    # row r: min over windows of 2^r blocks
        table[0] = minima
        for r in range(1, table.shape[0]):
            step = 1 << (r - 1)
            np.minimum(table[r - 1, :-step], table[r - 1, step:], out=table[r, :m - step])
            table[r, m - step:] = np.inf

    def _blocks(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Min over the whole blocks lo..hi−1 (inf where hi ≤ lo)."""
        length = hi - lo
        ok = length > 0
        j = np.where(ok, np.frexp(np.maximum(length, 1))[1] - 1, 0)  # floor(log2(length))
        a = np.where(ok, lo, 0)
        b = np.where(ok, hi - (1 << j), 0)
        return np.where(ok, np.minimum(self.table[j, a], self.table[j, b]), np.inf)

    def query(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        lo, hi = np.broadcast_arrays(np.clip(lo, 0, self.n), np.clip(hi, 0, self.n))
        ok = hi > lo
        if not ok.any():
            return np.full(lo.shape, np.inf)
        B = self.block
        first, last = np.where(ok, lo, 0), np.where(ok, hi - 1, 0)
        block_first, block_last = first // B, last // B
        out = np.minimum(np.minimum(self.suffix[first], self.prefix[last]), self._blocks(block_first + 1, block_last))
        inside = np.flatnonzero(ok & (block_first == block_last))
        if inside.size:
            offsets = np.arange(B)
            take = np.minimum(first.ravel()[inside, None] + offsets, self.values.size - 1)
            within = offsets < (last.ravel()[inside] - first.ravel()[inside] + 1)[:, None]
            out.ravel()[inside] = np.where(within, self.values[take], np.inf).min(axis=1)
        return np.where(ok, out, np.inf)


def _deepest(mask: np.ndarray) -> np.ndarray:
    """Deepest admissible column per row (−1 if none)."""
    J = mask.shape[1]
    rev = np.argmax(mask[:, ::-1], axis=1)
    return np.where(mask.any(axis=1), J - 1 - rev, -1)


def _sorted_union(*arrays: np.ndarray) -> np.ndarray:
    """The distinct values of ``arrays`` in increasing order (``np.unique`` of their concatenation) for arrays
    that are each monotone, either way (the sweeps' Σs): a stable sort merges their ascending runs in linear
    time, several times faster than ``np.unique``'s sort at 10⁵ values."""
    runs = [a[::-1] if a.size > 1 and a[0] > a[-1] else a for a in arrays]
    merged = np.sort(np.concatenate(runs), kind="stable")
    return merged[np.append(True, merged[1:] != merged[:-1])] if merged.size else merged


def _key_matrices(problem: PlanningProblem, cols: np.ndarray) -> tuple[np.ndarray, ...]:
    """The four sweep keys a, b, u, v of (*) (seconds, N × len(cols)): forward+uplink, downlink+backward,
    model upload and download at each cut of ``cols``; ∞ where a cut does not fit the device's memory, so
    that it never enters a sweep."""
    lat = problem.latency
    j = cols - 1
    keys = lat.fp_up[:, j], lat.down_bp[:, j], lat.model_up[:, j], lat.model_down[:, j]
    if problem.admissible is None:
        return keys
    ok = problem.admissible_at(cols)
    return tuple(np.where(ok, m, np.inf) for m in keys)


def _full_keys(problem: PlanningProblem, store: dict) -> list[_Keyed]:
    """The four keys' sort structures over all of the problem's candidates, built once per ``store``: every
    deepest-cut bound's columns are a prefix of them (:meth:`_Keyed.prefix`)."""
    keyed = store.get("threshold-keys")
    if keyed is None:
        keyed = store["threshold-keys"] = [_Keyed(m) for m in _key_matrices(problem, problem.candidates)]
    return keyed


class _Static:
    """The interval-independent part of a deepest-cut bound L (columns ``cols``): the matrices, the
    key sort structures and the four unrestricted sweeps (keys a, b, u, v). Shared by every MS step
    of one BCD run through ``solve_ms_exact(cache=...)``."""

    def __init__(self, problem: PlanningProblem, cols: np.ndarray, keyed: Sequence[_Keyed] | None = None) -> None:
        """``keyed``: optional sort structures of the four keys over a longer column list of which ``cols`` is
        a prefix (:func:`_full_keys`); the ones over ``cols`` are read off them instead of sorted again."""
        lat = problem.latency
        j = cols - 1
        self.a, self.b, self.u, self.v = _key_matrices(problem, cols)
        self.s = lat.server_per_device[j]
        self.dl = lat.delta[j[-1]] - lat.delta[j]
        sys = lat.system
        self.ref, self.rfe = float(sys.edge_to_fed_bps), float(sys.fed_to_edge_bps)
        if keyed is None:
            keyed = [_Keyed(m) for m in (self.a, self.b, self.u, self.v)]
        self.key_a, self.key_b, self.key_u, self.key_v = (k.prefix(cols.size) for k in keyed)
        args = (self.s, self.dl, self.u, self.v)
        self.top = _Sweep(self.key_a, None, *args, mins=(self.b, self.u, self.v))
        self.bsw = _Sweep(self.key_b, None, *args)
        self.usw = _Sweep(self.key_u, None, *args)
        self.vsw = _Sweep(self.key_v, None, *args)
        self.b_rmq = _RangeMin(self.bsw.t + self.bsw.sum_s)
        self.w_rmq = _RangeMin(np.maximum(self.usw.t, self.usw.sigma / self.ref))
        self.y_rmq = _RangeMin(np.maximum(self.vsw.t, self.vsw.sigma / self.rfe))
        self.fresh = True
        self._levels: _Levels | None = None

    def levels(self) -> "_Levels":
        """The level grids of :meth:`_Subproblem.lower_bounds` (built on first use, then kept)."""
        if self._levels is None:
            self._levels = _Levels(self)
        return self._levels


class _Levels:
    """The interval-independent part of the level couplings of :meth:`_Subproblem.lower_bounds`: the level
    grid M (every value of A = Σs of the top sweep, of B and C; then also of D), and for each M the first
    breakpoint of the b-, u- (and v-) only sweeps with Σs ≤ M, and each t1's first level M ≥ A(t1). Taking the
    grid over every t1's A (not only the t1 still alive) changes no minimum: between grid points the level's
    cost only rises, and every point is a level the bound may take. Given ``A`` (the alive t1's only), the grid
    is that call's own: cheaper where few t1 are alive than the kept grid of them all."""

    def __init__(self, static: _Static, A: np.ndarray | None = None) -> None:
        A = static.top.sum_s if A is None else A
        tb, B = static.bsw.t, static.bsw.sum_s
        tu, C = static.usw.t, static.usw.sum_s
        tv, Dv = static.vsw.t, static.vsw.sum_s
        K = tb.size
        self.usable = bool(K and tu.size)
        if not self.usable:
            return
        self.M = M = _sorted_union(A, B, C)
        kb = np.searchsorted(-B, -M * (1 + _REL), side="left")
        ku = np.searchsorted(-C, -M * (1 + _REL), side="left")
        self.ok = (kb < K) & (ku < tu.size)
        self.tb_at, self.tu_at = tb[np.minimum(kb, K - 1)], tu[np.minimum(ku, tu.size - 1)]
        self.at = np.searchsorted(M, A * (1 - _REL), side="left")
        self.with_v = bool(tv.size)
        if not self.with_v:
            return
        self.M2 = M2 = _sorted_union(M, Dv)
        kb = np.searchsorted(-B, -M2 * (1 + _REL), side="left")
        ku = np.searchsorted(-C, -M2 * (1 + _REL), side="left")
        kv = np.searchsorted(-Dv, -M2 * (1 + _REL), side="left")
        self.ok2 = (kb < K) & (ku < tu.size) & (kv < tv.size)
        self.tb_at2, self.tu_at2 = tb[np.minimum(kb, K - 1)], tu[np.minimum(ku, tu.size - 1)]
        self.tv_at2 = tv[np.minimum(kv, tv.size - 1)]
        self.at2 = np.searchsorted(M2, A * (1 - _REL), side="left")


class _Subproblem:
    """min_x N_L(x) over the candidate columns ≤ L (module docstring), with pruning bound ``bound``."""

    def __init__(self, problem: PlanningProblem, interval: float, cols: np.ndarray,
                 cache: dict | None = None) -> None:
        self.I = float(interval)
        key = ("threshold-static", tuple(int(c) for c in cols))
        static = cache.get(key) if cache is not None else None
        if static is None:
            prefix = np.array_equal(problem.candidates[:cols.size], cols)
            static = _Static(problem, cols, _full_keys(problem, cache) if cache is not None and prefix else None)
            if cache is not None:
                cache[key] = static
        self.a, self.b, self.u, self.v = static.a, static.b, static.u, static.v
        self.s, self.dl, self.ref, self.rfe = static.s, static.dl, static.ref, static.rfe
        self.key_a, self.key_b, self.key_u, self.key_v = static.key_a, static.key_b, static.key_u, static.key_v
        self.static, self.bsw, self.vsw, self.b_rmq = static, static.bsw, static.vsw, static.b_rmq
        self.sweeps = 0
        if static.fresh:  # the four unrestricted sweeps are counted once per cache
            self.sweeps, static.fresh = 4, False
        self.limit = math.inf  # sweep budget of this subproblem (set by the caller)
        self.unfinished = False  # whether the last node stopped on the budget

    def value(self, x: np.ndarray) -> float:
        """N_L(x) for column indices x (exact, tight μ)."""
        rows = np.arange(x.size)
        sg = float(self.dl[x].sum())
        return (self.I * (self.a[rows, x].max() + self.b[rows, x].max() + self.s[x].sum())
                + max(self.u[rows, x].max(), sg / self.ref) + max(self.v[rows, x].max(), sg / self.rfe))

    def lower_bounds(self, cutoff: float = math.inf) -> None:
        """LB(t1) for every t1 breakpoint (module docstring). The costlier couplings are computed only
        for the t1 whose basic bound is below ``cutoff`` (the incumbent N_L; the others are never
        searched, their weaker bound is still valid)."""
        I, ref, rfe = self.I, self.ref, self.rfe
        top = self.static.top
        t2min, umin, vmin = top.mins
        self.top = top
        # Couple t1 and t2 through Σs: Σs(x(t)) ≥ max(A(t1), B(t2)) with A(t1) = Σs(x(t1, ∞)) and
        # B(t2) = Σs(x(∞, t2)) (non-increasing). For breakpoints t2_k ≥ t2min(t1), with k* the first
        # k with B_k ≤ A(t1): min_k t2_k + max(A, B_k) ≥ min(t2_lo + B_{k*−1}, t2_{k*} + A).
        bsw = self.bsw = self.static.bsw
        self.b_rmq = self.static.b_rmq
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
        alive = np.flatnonzero(self.lb < cutoff * (1 - _REL))
        if alive.size == 0:
            self.lower = float(self.lb.min()) if self.lb.size else math.inf
            return
        # Only the alive t1: M ranges over A(alive), B, C (the level's cost changes only at B, C values).
        t1v, A, sA = top.t[alive], A[alive], top.sigma[alive]
        t2min, umin, vmin = t2min[alive], umin[alive], vmin[alive]
        lb = self.lb[alive]
        # Couple t1, t2 and t3 through one level M ≥ Σs: with C(t3) = Σs(x(∞, ∞, t3, ∞)),
        # Φ ≥ I t1 + min_{M ≥ A(t1)} [I·tb(M) + tu(M) + I M] + max(Vmin, σ/r_fe), where tb(M), tu(M)
        # are the smallest breakpoints with B ≤ M, C ≤ M. M ranges over the values of A, B, C.
        usw = self.static.usw
        few = 4 * alive.size < top.t.size       # few t1 alive: a grid of theirs, else the kept grid of all
        levels = _Levels(self.static, A) if few else self.static.levels()
        if levels.usable:
            M = levels.M
            g = np.where(levels.ok, I * levels.tb_at + levels.tu_at + I * M, np.inf)
            suffix = np.minimum.accumulate(g[::-1])[::-1]
            at = levels.at if few else levels.at[alive]
            best_g = np.where(at < M.size, suffix[np.minimum(at, M.size - 1)], np.inf)
            coupled = I * t1v + best_g * (1 - 1e-12) + np.maximum(vmin, sA / rfe)
            lb = np.maximum(lb, coupled)
            # Same with the t4 cap (key v) in the level too: + tv(M) instead of the Vmin term.
            vsw = self.vsw = self.static.vsw
            if levels.with_v:
                M = levels.M2
                g = np.where(levels.ok2, I * levels.tb_at2 + levels.tu_at2 + levels.tv_at2 + I * M, np.inf)
                suffix = np.minimum.accumulate(g[::-1])[::-1]
                at = levels.at2 if few else levels.at2[alive]
                best_g = np.where(at < M.size, suffix[np.minimum(at, M.size - 1)], np.inf)
                lb = np.maximum(lb, I * t1v + best_g * (1 - 1e-12))
            if levels.with_v and _STRONG_BOUNDS:
                lb = np.maximum(lb, self._sigma_coupled(t1v, A, sA, t2min, umin, vmin, usw, vsw) * (1 - 1e-12))
        self.lb[alive] = lb
        self.lower = float(self.lb.min()) if self.lb.size else math.inf

    def _sigma_coupled(self, t1: np.ndarray, A: np.ndarray, sA: np.ndarray, t2min: np.ndarray, umin: np.ndarray,
                       vmin: np.ndarray, usw: _Sweep, vsw: _Sweep) -> np.ndarray:
        """LB(t1) coupling the t3 and t4 caps with Σs *and* σ (vectorised over all t1 breakpoints).

        x(t) ≤ x(t1, ∞, ∞, ∞) and ≤ x(∞, ∞, t3, ∞) and ≤ x(∞, ∞, ∞, t4) componentwise, so with
        (A, σ_A) the Σs/σ of the t1 sweep and (C_k, σ_C,k), (D_k, σ_D,k) those of the u-only and
        v-only sweeps at their breakpoints tu_k ≤ t3, tv_k ≤ t4:

            Φ ≥ I t1 + I t2min + min_{k ≥ k0} [I max(A, C_k) + max(tu_k, max(σ_A, σ_C,k)/r_ef)]
                               + min_{k ≥ k0'} max(tv_k, max(σ_A, σ_D,k)/r_fe),

        k0 (k0') the breakpoint at Umin (Vmin). Each min is split by where C_k ≤ A and σ_C,k ≤ σ_A
        (both non-increasing in k): in every piece some max(·, ·) is replaced by one argument, which
        keeps a lower bound whatever the split, and the pieces are t1-independent range minima
        (sparse tables) or a single breakpoint.
        """
        I, ref, rfe = self.I, self.ref, self.rfe
        tu, C, sC = usw.t, usw.sum_s, usw.sigma
        K3 = tu.size
        k0 = np.clip(np.searchsorted(tu, umin, side="right") - 1, 0, K3)
        kc = np.searchsorted(-C, -A, side="left")   # C_k ≤ A from here
        ks = np.searchsorted(-sC, -sA, side="left")  # σ_C,k ≤ σ_A from here
        t3 = np.full(A.size, np.inf)
        k = np.maximum(np.maximum(k0, kc), ks)  # both at their floor: I A + max(tu_k, σ_A/r_ef), increasing
        ok = k < K3
        kk = np.minimum(k, K3 - 1)
        t3 = np.where(ok, I * A + np.maximum(tu[kk], sA / ref), t3)
        t3 = np.minimum(t3, I * A + self.static.w_rmq.query(np.maximum(k0, kc), ks))  # C ≤ A, σ_C > σ_A
        p = _RangeMin(I * C + tu)
        lo, hi = np.maximum(k0, ks), kc  # σ_C ≤ σ_A, C > A: max(I C + tu, I C_{hi−1} + σ_A/r_ef)
        t3 = np.minimum(t3, np.maximum(p.query(lo, hi), I * C[np.clip(hi - 1, 0, K3 - 1)] + sA / ref))
        z = _RangeMin(I * C + np.maximum(tu, sC / ref))
        t3 = np.minimum(t3, z.query(k0, np.minimum(kc, ks)))  # neither at its floor
        tv, sD = vsw.t, vsw.sigma
        K4 = tv.size
        k0v = np.clip(np.searchsorted(tv, vmin, side="right") - 1, 0, K4)
        kd = np.maximum(k0v, np.searchsorted(-sD, -sA, side="left"))
        kdd = np.minimum(kd, K4 - 1)
        t4 = np.where(kd < K4, np.maximum(tv[kdd], sA / rfe), np.inf)
        t4 = np.minimum(t4, self.static.y_rmq.query(k0v, kd))
        return I * t1 + I * t2min + t3 + t4

    def node(self, k: int, bound: float) -> tuple[float, np.ndarray | None]:
        """Best N_L with t1 = the k-th breakpoint: (value, columns) if below ``bound``, else (bound, None)."""
        I, ref, rfe = self.I, self.ref, self.rfe
        best, best_x = bound, None
        if self.lb[k] < best * (1 - _REL):
            t1 = self.top.t[k]
            m1 = self.a <= t1
            # t3 (the cap through u): per t3, Σs/σ with t2, t4 free, and the smallest feasible t2, t4.
            sw3 = _Sweep(self.key_u, m1, self.s, self.dl, self.u, self.v, mins=(self.b, self.v))
            self.sweeps += 1
            t2min, vmin = sw3.mins
            t2_level = self._t2_coupled(t2min, sw3.sum_s) if _STRONG_BOUNDS else t2min + sw3.sum_s
            lb3 = (I * t1 + I * t2_level + np.maximum(sw3.t, sw3.sigma / ref)
                   + np.maximum(vmin, sw3.sigma / rfe))
            for k3 in np.argsort(lb3, kind="stable"):
                if lb3[k3] >= best * (1 - _REL):
                    break
                if self.sweeps >= self.limit:
                    self.unfinished = True
                    break
                t3 = sw3.t[k3]
                m13 = m1 & (self.u <= t3)
                sw = _Sweep(self.key_b, m13, self.s, self.dl, self.u, self.v, mins=(self.v,))
                self.sweeps += 1
                base = I * t1 + I * sw.t + I * sw.sum_s + np.maximum(t3, sw.sigma / ref)
                phi = base + np.maximum(sw.max_v, sw.sigma / rfe)  # t4 free: t4 = max v(x)
                q = int(np.argmin(phi))
                if phi[q] < best:
                    best, best_x = self._improve(m13 & (self.b <= sw.t[q]), best, best_x)
                capped = base + np.maximum(sw.mins[0], sw.sigma / rfe)
                cand = np.flatnonzero(capped < best * (1 - _REL))  # a cap through v might pay off
                if cand.size:
                    strong = _STRONG_BOUNDS and cand.size <= _CAPPED_BOUND_ROWS
                    lbq = (self._capped_bounds(I * t1 + I * sw.t[cand], t3, sw.sum_s[cand], sw.sigma[cand],
                                               sw.mins[0][cand]) if strong else capped[cand])
                    for e in np.argsort(lbq, kind="stable"):
                        if lbq[e] >= best * (1 - _REL):
                            break
                        if self.sweeps >= self.limit:
                            self.unfinished = True
                            break
                        q = cand[e]
                        best, best_x = self._capped(m13 & (self.b <= sw.t[q]), I * t1 + I * sw.t[q], t3, best, best_x)
        return best, best_x

    def _t2_coupled(self, t2min: np.ndarray, S: np.ndarray) -> np.ndarray:
        """Lower bound on min_{t2 ≥ t2min} t2 + Σs(x(t)) given Σs(x(t)) ≥ S (vectorised): also
        Σs(x(t)) ≥ B(t2), the Σs of the b-only sweep at its breakpoint tb_k ≤ t2 (non-increasing),
        so the min is ≥ min(tb_k' + S at the first k' ≥ k0 with B ≤ S, min_{k0 ≤ k < k'} tb_k + B_k),
        k0 the breakpoint at t2min. Never below t2min + S."""
        bsw = self.bsw
        tb, B = bsw.t, bsw.sum_s
        K = tb.size
        if K == 0:
            return t2min + S
        k0 = np.clip(np.searchsorted(tb, t2min, side="right") - 1, 0, K - 1)
        kB = np.maximum(k0, np.searchsorted(-B, -S, side="left"))
        out = np.where(kB < K, tb[np.minimum(kB, K - 1)] + S, np.inf)
        out = np.minimum(out, self.b_rmq.query(k0, kB))
        return np.maximum(out * (1 - 1e-12), t2min + S)

    def _capped_bounds(self, fixed: np.ndarray, t3: float, S: np.ndarray, sg: np.ndarray,
                       vmin: np.ndarray) -> np.ndarray:
        """Lower bounds on the t4 sweep of :meth:`_capped` for fixed (t1, t2, t3) (vectorised over t2).

        For every t4 ≥ vmin, x(t) ≤ x(∞, ∞, ∞, t4) componentwise, so Σs(x(t)) ≥ max(S, D(t4)) and
        σ(x(t)) ≥ max(σ, σ_D(t4)), where S, σ are the uncapped (t4 free) values and D, σ_D those of
        the v-only sweep (non-increasing in t4). Hence Φ ≥ fixed + min_{k ≥ k0} [I max(S, D_k)
        + max(t3, max(σ, σ_D,k)/r_ef) + max(max(tv_k, vmin), max(σ, σ_D,k)/r_fe)], with k0 the
        v-only breakpoint at vmin. Past k1 (D_k ≤ S and σ_D,k ≤ σ) the bracket is non-decreasing in
        k, so only k ∈ [k0, max(k0, k1)] is scanned.
        """
        I, ref, rfe = self.I, self.ref, self.rfe
        vsw = self.vsw
        tv, Dv, Gv = vsw.t, vsw.sum_s, vsw.sigma
        K = tv.size
        out = np.empty(S.size)
        k0 = np.maximum(np.searchsorted(tv, vmin, side="right") - 1, 0)
        k1 = np.maximum(np.searchsorted(-Dv, -S, side="left"), np.searchsorted(-Gv, -sg, side="left"))
        k1 = np.minimum(np.maximum(k0, k1), K - 1)
        for n in range(S.size):
            sl = slice(k0[n], k1[n] + 1)
            ss = np.maximum(S[n], Dv[sl])
            gg = np.maximum(sg[n], Gv[sl])
            f = I * ss + np.maximum(t3, gg / ref) + np.maximum(np.maximum(tv[sl], vmin[n]), gg / rfe)
            out[n] = fixed[n] + f.min()
        return out * (1 - 1e-12)

    def _capped(self, m123: np.ndarray, fixed: float, t3: float, best: float,
                best_x: np.ndarray | None) -> tuple[float, np.ndarray | None]:
        """Sweep t4 (the cap through v) for the mask of fixed (t1, t2, t3)."""
        I, ref, rfe = self.I, self.ref, self.rfe
        sw = _Sweep(self.key_v, m123, self.s, self.dl, self.u, self.v)
        self.sweeps += 1
        phi = fixed + I * sw.sum_s + np.maximum(t3, sw.sigma / ref) + np.maximum(sw.t, sw.sigma / rfe)
        q = int(np.argmin(phi))
        if phi[q] < best:
            best, best_x = self._improve(m123 & (self.v <= sw.t[q]), best, best_x)
        return best, best_x

    def _improve(self, mask: np.ndarray, best: float, best_x: np.ndarray | None) -> tuple[float, np.ndarray | None]:
        """The incumbent after trying the deepest-admissible cut vector of ``mask``."""
        x = _deepest(mask)
        value = self.value(x)
        return (value, x) if value < best else (best, best_x)


def _cheap_bounds(problem: PlanningProblem, interval: float, cand: np.ndarray) -> np.ndarray:
    """For every deepest-cut bound L = cand[k]: a lower bound on min_{x ≤ L} N_L(x) (seconds), ∞ when
    some device has no admissible cut ≤ L. Each max term is bounded by the largest per-device minimum
    over the admissible cuts ≤ L, and Σs, σ by every device at its deepest admissible cut (s
    non-increasing, δ non-decreasing); O(N·J), vectorised over L."""
    lat, I = problem.latency, float(interval)
    j = cand - 1
    ok = problem.admissible_at(cand)
    N, J = ok.shape

    def max_of_min(m: np.ndarray) -> np.ndarray:
        return _along_rows(np.minimum, m).max(axis=0)

    a, b, u, v = _key_matrices(problem, cand)         # ∞ where a cut does not fit
    deep = _along_rows(np.maximum, np.where(ok, np.arange(J)[None, :], -1))  # deepest admissible ≤ L
    covered = (deep >= 0).all(axis=0)
    deep = np.maximum(deep, 0)
    sum_s = lat.server_per_device[j][deep].sum(axis=0)
    delta = lat.delta[j]
    sigma = N * delta - delta[deep].sum(axis=0)
    sys = lat.system
    with np.errstate(invalid="ignore"):  # 0·∞ where some device has no admissible cut ≤ L (masked below)
        num = (I * max_of_min(a) + I * max_of_min(b) + I * sum_s
               + np.maximum(max_of_min(u), sigma / sys.edge_to_fed_bps)
               + np.maximum(max_of_min(v), sigma / sys.fed_to_edge_bps))
    return np.where(covered, num, np.inf)


def _lagrangian(problem: PlanningProblem, interval: float, cols: np.ndarray, target: float) -> float:
    """:func:`solvers.lagrange.lagrangian_bound` on min_{x ≤ L} N_L(x) for L = cols[-1] (seconds). Its matrices are
    built at every call: keeping them per L between MS steps measured slower at 10,000 devices (128 MB more
    resident, fresh pages) than building them again."""
    lat = problem.latency
    j = cols - 1
    a, b, u, v = _key_matrices(problem, cols)
    sys = lat.system
    return lagrangian_bound(a, b, u, v, lat.server_per_device[j], lat.delta[j[-1]] - lat.delta[j], interval,
                            float(sys.edge_to_fed_bps), float(sys.fed_to_edge_bps), target=target)


def _admissible(problem: PlanningProblem, interval: int, max_cut: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(the candidate cuts the sweep considers at ``interval``: up to ``max_cut``, with A_j within the μ₅ bound
    of (34); D_L of (34) for every L among them). InfeasibleError where none is left."""
    conv = problem.convergence
    A, k_drift = conv.constants.cumulative_G2, drift_coefficient(conv.constants)
    cand = problem.candidates
    if max_cut is not None:
        cand = cand[cand <= max_cut]
    cand = cand[A[cand - 1] <= mu5_bound(conv.c, k_drift, float(interval), ETA_RELATIVE)]
    if cand.size == 0:
        raise InfeasibleError(conv.infeasibility_reason(int(interval), int(problem.candidates[0])))
    return cand, interval_denominator(conv.c, k_drift * A[cand - 1], float(interval))


def _incumbent(problem: PlanningProblem, interval: int, cand: np.ndarray,
               warm_cuts: Sequence[int] | None) -> tuple[float, tuple[int, ...] | None]:
    """(ratio N/D, cuts) of the best starting point for pruning: the warm start where its cuts are candidates,
    and every uniform vector (ℓ, …, ℓ) made admissible (cheap extra incumbents)."""
    best_ratio, best_cuts = math.inf, None
    if warm_cuts is not None and set(int(c) for c in warm_cuts) <= set(cand.tolist()):
        best_cuts = tuple(int(c) for c in warm_cuts)
        best_ratio = problem.objective(int(interval), best_cuts) / problem.scale
    for c in cand.tolist():
        x = problem.start_cuts(int(c), cand)
        value = problem.objective(int(interval), x) / problem.scale
        if value < best_ratio:
            best_ratio, best_cuts = value, x
    return best_ratio, best_cuts


def solve_ms_exact(problem: PlanningProblem, interval: int, *, max_cut: int | None = None,
                   warm_cuts: Sequence[int] | None = None, cache: dict | None = None,
                   max_sweeps: int | str | None = "auto") -> SolveResult:
    """MS step by (*) + threshold sweeps: the optimal cut vector of the MILFP (34) at fixed I, or,
    when ``max_sweeps`` runs out first, the best found and a certified lower bound.

    Same optimum as :func:`solvers.dinkelbach.solve_dinkelbach` (Algorithm 2 with exact MILPs);
    same candidate columns (candidates ≤ ``max_cut`` with A_j within the μ₅ bound of (34)), and only
    the cuts that fit each device's memory. The deepest-cut bounds L are taken in the order of a
    cheap O(N·J) bound (:func:`_cheap_bounds`), each one built, searched best-first and dropped, so
    memory stays O(N·J) whatever the number of L.

    Args:
        warm_cuts: optional, e.g. BCD's current cuts; only seeds the incumbent used for pruning.
        cache: optional dict owned by the caller (e.g. one per BCD run on an unchanged ``problem``)
            that keeps the interval-independent structures of each L between calls; it must not
            outlive changes to ``problem``. Used only while N·J ≤ :data:`CACHE_SIZE` (memory).
        max_sweeps: budget of O(N·J) sweeps (``None`` = no budget, always exact; ``"auto"`` = see
            :data:`SWEEP_ENTRIES`). Past it the search stops: ``status`` is ``"budget"`` instead of
            ``"converged"``.

    Returns:
        SolveResult with method ``"threshold"``; ``lower_bound`` (seconds) ≤ the optimum of (34)
        at this I times 2ϑ/γ, equal to ``objective`` when the search finished (up to 1e-12).

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
    cand, den = _admissible(problem, interval, max_cut)       # den: D_L of (34) for every L = cand[k]
    if max_sweeps == "auto":
        max_sweeps = int(np.clip(SWEEP_ENTRIES / (problem.num_devices * cand.size), SWEEP_MIN, SWEEP_BUDGET))
    budget: float = math.inf if max_sweeps is None else float(max_sweeps)
    if cache is not None and problem.num_devices * cand.size > CACHE_SIZE:
        cache = None
    best_ratio, best_cuts = _incumbent(problem, interval, cand, warm_cuts)
    cheap = np.where(den > 0, _cheap_bounds(problem, I, cand) / np.where(den > 0, den, 1.0), np.inf)
    open_bound, nodes, sweeps, history = math.inf, 0, 0, []  # open_bound: min bound of what was not searched
    for pos in np.argsort(cheap, kind="stable"):
        if cheap[pos] >= best_ratio * (1 - _REL):
            break
        cols, L, D = cand[: pos + 1], int(cand[pos]), float(den[pos])
        level = max(float(cheap[pos]), _lagrangian(problem, I, cols, best_ratio * D) / D)
        if level >= best_ratio * (1 - _REL):  # the LP-strength bound prunes this L without a sweep
            history.append({"deepest_cut": L, "D": D, "sweeps": 0})
            continue
        if sweeps >= budget:
            open_bound = min(open_bound, level)
            continue
        sub = _Subproblem(problem, I, cols, cache)
        sub.lower_bounds(best_ratio * D)
        sweeps_before = sweeps
        for k in np.argsort(sub.lb, kind="stable"):
            bound = float(sub.lb[k]) / D
            if bound >= best_ratio * (1 - _REL):
                break
            if sweeps_before + sub.sweeps >= budget:
                open_bound = min(open_bound, max(bound, level))
                break
            sub.limit = budget - sweeps_before
            num, chosen = sub.node(int(k), best_ratio * D if math.isfinite(best_ratio) else math.inf)
            nodes += 1
            if chosen is not None and num / D < best_ratio:
                best_ratio, best_cuts = num / D, tuple(int(c) for c in cols[chosen])
            if sub.unfinished:
                open_bound = min(open_bound, max(bound, level))
                break
        sweeps += sub.sweeps
        history.append({"deepest_cut": L, "D": D, "sweeps": sub.sweeps})
    if best_cuts is None:
        raise InfeasibleError(conv.infeasibility_reason(int(interval), int(problem.candidates[0])))
    return _sweep_result(problem, interval, best_cuts, best_ratio, open_bound, nodes, history,
                         time.perf_counter() - start)


def _sweep_result(problem: PlanningProblem, interval: int, cuts: tuple[int, ...], ratio: float, open_bound: float,
                  nodes: int, history: list[dict], seconds: float) -> SolveResult:
    """The sweep's SolveResult: exact ("converged") where no unsearched bound is below the incumbent's ratio, else
    the best found ("budget") with the lower bound min(ratio, open bound) (seconds, like the objective)."""
    objective = problem.objective(int(interval), cuts)
    lower = problem.scale * min(ratio, open_bound) * (1 - 1e-12)
    finished = open_bound >= ratio * (1 - _REL)
    sweeps = sum(entry["sweeps"] for entry in history)
    return SolveResult(cuts=cuts, interval=int(interval), objective=objective, success=math.isfinite(objective),
                       status="converged" if finished else "budget", message=f"threshold sweep at I={interval}: "
                       f"{'exact MS optimum' if finished else 'sweep budget reached, best found'} "
                       f"({nodes} t1 nodes, {sweeps} sweeps over {len(history)} deepest-cut bounds)", method="threshold",
                       iterations=sweeps, milp_solves=0, seconds=seconds, backend="threshold",
                       history=history, lower_bound=min(lower, objective), nodes=nodes)
