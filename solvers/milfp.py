"""The MS subproblem (34) as a PuLP MILP, and its Dinkelbach form (35) (docs/model.md §4.3, §5.1).

For a fixed interval I (rounds), with binary x_{i,j} (device i cuts at candidate j) and the six
epigraph variables of §4.3,

    N(x, μ) = I(μ₁ + μ₂) + μ₃ + μ₄ + I Σ_i Σ_j x_{i,j} (s^F_j + s^B_j)       (seconds)
    D(x, μ) = I c − 4β²γ² I³ μ₅                                               (dimensionless)

with s^F_j = b(ρ_L − ρ_j)/f_s (18) and s^B_j = b(ϖ_L − ϖ_j)/f_s or the profile's server BP (19),
and the rows of §5.1 (per device i):

    Σ_j x_{i,j} b(ρ_j/f_i + ψ_j/r_i^U)  ≤ μ₁      (16)+(17)
    Σ_j x_{i,j} b(χ_j/r_i^D + ϖ_j/f_i)  ≤ μ₂      (20)+(21)
    Σ_j x_{i,j} δ_j/r_i^{fU}            ≤ μ₃      (22)
    Σ_j x_{i,j} δ_j/r_i^{fD}            ≤ μ₄      (24)
    Σ_j x_{i,j} A_j                     ≤ μ₅      (29)
    Σ_j x_{i,j} δ_j                     ≤ μ₆      (δ_{L_c}, in Mbit for conditioning)
    Σ_j x_{i,j} = 1                               (C2)
    Σ_{j: cut j does not fit device i} x_{i,j} = 0 (memory budget, only with ``memory_bytes``)

plus the two global rows (Nμ₆ − ΣΣ x_{i,j}δ_j)/r_{e→f} ≤ μ₃ (23) and …/r_{f→e} ≤ μ₄ (25), and
μ₅ ≤ c/(4β²γ²I²) − η. Columns whose A_j violates that bound are not created at all.

:class:`MSModel` builds this once per I; Dinkelbach (35) only changes the cost of μ₅ (the
objective is N − λD = const + … + λ·4β²γ²I³·μ₅), so :meth:`MSModel.solve` just resets the
objective and re-solves. Backends: ``"highs"`` (highspy through :class:`pulp.HiGHS`, with a
faster vectorised model transfer and MIP start; the default, always installed) and ``"cbc"``
(:class:`pulp.PULP_CBC_CMD`, with ``warmStart``; optional — :func:`check_backend` says when this
PuLP has no CBC). PuLP 2.8–3.x is supported (``pulp<4`` in pyproject.toml): PuLP 4 replaced the
model classes this module builds on (``LpVariable(cat=...)``, ``LpProblem._constraints``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pulp

from adaptplan.convergence import drift_coefficient, mu5_bound
from adaptplan.errors import InputError
from solvers.problem import PlanningProblem

#: Strictness margin η of the μ₅ bound in (34), relative to c/(4β²γ²I²).
ETA_RELATIVE = 1e-12
_MBIT = 1e6
BACKENDS = ("highs", "cbc")


def check_backend(backend: str) -> str:
    """``backend`` if it names a MILP backend that this installation can run, else an InputError.

    ``"highs"`` needs highspy (a dependency); ``"cbc"`` needs a CBC binary, which PuLP 2.x/3.x
    bundle (``PULP_CBC_CMD``) and which may also be on the PATH (``COIN_CMD``).
    """
    if backend not in BACKENDS:
        raise InputError(f"must be one of {', '.join(BACKENDS)}, got {backend!r}", field="backend")
    if backend == "cbc" and _cbc_solver_class() is None:
        raise InputError("CBC is not available in this installation (no CBC bundled with PuLP "
                         f"{getattr(pulp, '__version__', '?')} and no cbc on the PATH). Fix: use the default "
                         "backend highs, or install CBC (e.g. apt-get install coinor-cbc)", field="backend")
    return backend


def _cbc_solver_class() -> type | None:
    """The first available PuLP CBC interface (bundled ``PULP_CBC_CMD``, then ``COIN_CMD``), or None."""
    for name in ("PULP_CBC_CMD", "COIN_CMD"):
        solver_class = getattr(pulp, name, None)
        try:
            if solver_class is not None and solver_class(msg=False).available():
                return solver_class
        except Exception:  # a PuLP whose CBC interface cannot even be constructed
            continue
    return None


def _constraints(lp: pulp.LpProblem) -> list:
    """The problem's constraints in insertion order, on every supported PuLP: ``constraints`` is
    a dict before 3.3 and a callable (the 4.0 API, dict access deprecated) from 3.3 on."""
    constraints = lp.constraints
    return list(constraints()) if callable(constraints) else list(constraints.values())


class _HiGHS(pulp.HiGHS):  # type: ignore[misc, valid-type]
    """pulp.HiGHS with a vectorised model transfer (addCols/addRows) and an optional MIP start.

    ``start`` maps variable names to values; it is passed to ``Highs.setSolution`` before ``run``.
    """

    def __init__(self, *, start: dict[str, float] | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.start = start

    def findSolutionValues(self, lp: pulp.LpProblem) -> tuple[int, int]:  # noqa: N802 (pulp's name)
        """PuLP's reading of the solution, plus the status HiGHS gives when ``mip_max_nodes`` stops
        it (``kSolutionLimit``), which PuLP 3.3 has no entry for: the best cut vector found (values
        already assigned by PuLP), not proven optimal — as PuLP treats a time limit."""
        import highspy

        try:
            return super().findSolutionValues(lp)
        except KeyError:
            if lp.solverModel.getModelStatus() != highspy.HighsModelStatus.kSolutionLimit:
                raise
            if lp.solverModel.getInfo().primal_solution_status != highspy.SolutionStatus.kSolutionStatusFeasible:
                return pulp.LpStatusNotSolved, pulp.LpSolutionNoSolutionFound
            return pulp.LpStatusOptimal, pulp.LpSolutionIntegerFeasible

    def buildSolverModel(self, lp: pulp.LpProblem) -> None:  # noqa: N802 (pulp's name)
        import highspy

        inf = highspy.kHighsInf
        variables = lp.variables()
        for k, var in enumerate(variables):
            var.index = k
        cost = np.array([lp.objective.get(v, 0.0) for v in variables], dtype=float)
        lower = np.array([-inf if v.lowBound is None else v.lowBound for v in variables], dtype=float)
        upper = np.array([inf if v.upBound is None else v.upBound for v in variables], dtype=float)
        model = lp.solverModel
        model.addCols(len(variables), cost, lower, upper, 0, np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0))
        integer = np.array([k for k, v in enumerate(variables) if v.cat == pulp.LpInteger], dtype=np.int32)
        if integer.size and self.mip:
            model.changeColsIntegrality(integer.size, integer,
                                        np.full(integer.size, highspy.HighsVarType.kInteger))
        starts, index, value, row_lo, row_hi = [0], [], [], [], []
        for k, constraint in enumerate(_constraints(lp)):
            constraint.index = k
            for var, coef in constraint.items():
                index.append(var.index)
                value.append(coef)
            starts.append(len(index))
            lb, ub = constraint.getLb(), constraint.getUb()
            row_lo.append(-inf if lb is None else lb)
            row_hi.append(inf if ub is None else ub)
        model.addRows(len(row_lo), np.array(row_lo), np.array(row_hi), len(index),
                      np.array(starts[:-1], dtype=np.int32), np.array(index, dtype=np.int32), np.array(value, dtype=float))
        if self.start:
            solution = highspy.HighsSolution()
            solution.col_value = [float(self.start.get(v.name, 0.0)) for v in variables]
            solution.value_valid = True
            model.setSolution(solution)


class MSModel:
    """MILP of (34)/(35) for one fixed interval I (rounds) — built once, re-solved per λ.

    Args:
        problem: the instance.
        interval: I ≥ 1.
        max_cut: optional L (1-based); only candidates ≤ L get columns (used by the exact method).
        fixed_deepest: optional L; fixes μ₆ = δ_L (S_n = Σ_i(δ_L − δ_{ℓ_i})), and drops μ₅ when
            ``weight_only`` is set (the exact method minimises the numerator only).
        weight_only: minimise N only (λ = 0, no μ₅ row/bound) — the numerator MILP of
            :func:`solvers.exact.solve_exact`.
    """

    def __init__(self, problem: PlanningProblem, interval: float, *, max_cut: int | None = None,
                 fixed_deepest: int | None = None, weight_only: bool = False) -> None:
        self.problem, self.interval = problem, float(interval)
        lat, conv = problem.latency, problem.convergence
        N = problem.num_devices
        I = self.interval
        self.k_drift = drift_coefficient(conv.constants)  # 4β²γ², so d = k_drift·A_{L_c}
        A = conv.constants.cumulative_G2
        cand = problem.candidates
        if max_cut is not None:
            cand = cand[cand <= max_cut]
        if not weight_only:
            self.mu5_bound = mu5_bound(conv.c, self.k_drift, I, ETA_RELATIVE)
            cand = cand[A[cand - 1] <= self.mu5_bound]
        self.columns = cand  # 1-based cut of each column
        self.last_optimal = False  # whether the last solve proved optimality (False on time limit)
        self.feasible = cand.size > 0
        if not self.feasible:
            return
        j = cand - 1
        J = len(cand)
        prob = pulp.LpProblem("ms_milfp", pulp.LpMinimize)
        x = [[pulp.LpVariable(f"x_{i}_{k}", cat=pulp.LpBinary) for k in range(J)] for i in range(N)]
        mu = [pulp.LpVariable(f"mu{m}", lowBound=0) for m in range(1, 7)]
        self.x, self.mu = x, mu
        s = lat.server_per_device[j]  # (18)+(19) per device, seconds
        delta_mbit = lat.delta[j] / _MBIT
        sys = lat.system
        per_device = (
            (lat.fp_up[:, j], 0),       # (16)+(17) ≤ μ₁
            (lat.down_bp[:, j], 1),     # (20)+(21) ≤ μ₂
            (lat.model_up[:, j], 2),    # (22) ≤ μ₃
            (lat.model_down[:, j], 3),  # (24) ≤ μ₄
        )
        for i in range(N):
            xi = x[i]
            for coef, m in per_device:
                prob += pulp.LpAffineExpression(list(zip(xi, coef[i])) + [(mu[m], -1.0)]) <= 0, f"mu{m + 1}_{i}"
            if not weight_only:
                prob += pulp.LpAffineExpression(list(zip(xi, A[j])) + [(mu[4], -1.0)]) <= 0, f"mu5_{i}"
            if fixed_deepest is None:
                prob += pulp.LpAffineExpression(list(zip(xi, delta_mbit)) + [(mu[5], -1.0)]) <= 0, f"mu6_{i}"
            prob += pulp.LpAffineExpression([(v, 1.0) for v in xi]) == 1, f"one_cut_{i}"
        if problem.admissible is not None:  # memory budgets (solvers.memory): Σ_{j inadmissible} x_{i,j} = 0
            banned = ~problem.admissible[:, j]
            for i in map(int, np.flatnonzero(banned.any(axis=1))):
                prob += pulp.LpAffineExpression([(x[i][k], 1.0) for k in np.flatnonzero(banned[i])]) == 0, f"memory_{i}"
            self.feasible = bool((~banned).any(axis=1).all())
        flat = [v for row in x for v in row]
        sum_delta = list(zip(flat, np.tile(-delta_mbit, N)))  # −ΣΣ x δ (Mbit)
        for m, rate, name in ((2, sys.edge_to_fed_bps, "edge_up"), (3, sys.fed_to_edge_bps, "edge_down")):
            scale = _MBIT / rate  # seconds per Mbit
            prob += pulp.LpAffineExpression([(v, c * scale) for v, c in sum_delta]
                                            + [(mu[5], N * scale), (mu[m], -1.0)]) <= 0, f"{name}_{m + 1}"
        if fixed_deepest is not None:
            mu[5].lowBound = mu[5].upBound = float(lat.delta[fixed_deepest - 1] / _MBIT)
        if weight_only:
            mu[4].upBound = 0.0
        else:
            mu[4].upBound = float(self.mu5_bound)
        self.server_cost = s
        self.prob = prob
        self.set_lambda(0.0)

    def set_lambda(self, lam: float, weight: float | None = None) -> None:
        """Set the objective N − λD of (35) (constant −λIc omitted); ``weight`` replaces I in the
        split-stage part of N (the exact method's parametric numerator w·T_split + T_agg)."""
        w = self.interval if weight is None else float(weight)
        terms = [(self.mu[0], w), (self.mu[1], w), (self.mu[2], 1.0), (self.mu[3], 1.0)]
        terms += [(v, w * c) for row in self.x for v, c in zip(row, self.server_cost)]
        if lam:
            terms.append((self.mu[4], lam * self.k_drift * self.interval**3))
        self.prob.setObjective(pulp.LpAffineExpression(terms))

    def solve(self, *, backend: str = "highs", warm_cuts: Sequence[int] | None = None,
              mip_gap: float = 1e-9, time_limit: float | None = None, threads: int | None = None,
              node_limit: int | None = None) -> tuple[int, ...] | None:
        """Solve the current MILP; return the 1-based cut vector, or ``None`` if no solution.

        ``time_limit`` (seconds) and ``node_limit`` (branch-and-bound nodes: HiGHS ``mip_max_nodes``,
        CBC ``maxNodes``) stop the search early with the best cut vector found; a node limit gives
        the same answer on every run and machine, a time limit depends on the load."""
        check_backend(backend)
        start = self._start(warm_cuts) if warm_cuts is not None else None
        if backend == "highs":
            options = {} if node_limit is None else {"mip_max_nodes": int(node_limit)}
            solver = _HiGHS(msg=False, gapRel=mip_gap, gapAbs=1e-12, timeLimit=time_limit, threads=threads, start=start,
                            **options)
        elif backend == "cbc":
            if start:
                for v in self.prob.variables():
                    v.setInitialValue(start.get(v.name, 0.0))
            cbc = _cbc_solver_class()
            assert cbc is not None, "backend 'cbc' is offered only when PuLP has a CBC interface"
            solver = cbc(msg=False, gapRel=mip_gap, gapAbs=1e-12, timeLimit=time_limit,
                                         threads=threads, warmStart=bool(start), maxNodes=node_limit)
        self.prob.solve(solver)
        self.last_optimal = self.prob.status == pulp.LpStatusOptimal and self.prob.sol_status == pulp.LpSolutionOptimal
        if self.prob.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
            return None
        values = np.array([[v.varValue or 0.0 for v in row] for row in self.x])
        return tuple(int(c) for c in self.columns[np.argmax(values, axis=1)])

    def _start(self, cuts: Sequence[int]) -> dict[str, float] | None:
        """MIP start (variable name → value) for the cut vector ``cuts``; ``None`` if not representable."""
        position = {int(c): k for k, c in enumerate(self.columns)}
        if any(int(c) not in position for c in cuts):
            return None
        lat = self.problem.latency
        j = np.asarray(cuts, dtype=int) - 1
        rows = np.arange(len(j))
        A = self.problem.convergence.constants.cumulative_G2
        start = {f"x_{i}_{position[int(c)]}": 1.0 for i, c in enumerate(cuts)}
        mu6 = float(self.mu[5].lowBound) if self.mu[5].upBound is not None and self.mu[5].lowBound == self.mu[5].upBound \
            else float(lat.delta[j].max() / _MBIT)
        s_n = (self.problem.num_devices * mu6 * _MBIT - lat.delta[j].sum())
        sys = lat.system
        start.update({
            "mu1": float(lat.fp_up[rows, j].max()), "mu2": float(lat.down_bp[rows, j].max()),
            "mu3": float(max(lat.model_up[rows, j].max(), s_n / sys.edge_to_fed_bps)),
            "mu4": float(max(lat.model_down[rows, j].max(), s_n / sys.fed_to_edge_bps)),
            "mu5": 0.0 if self.mu[4].upBound == 0.0 else float(A[j].max()), "mu6": mu6,
        })
        return start
