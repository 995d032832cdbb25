"""The threshold sweep's bounds and bookkeeping (solvers/threshold.py) against brute force.

The brute-force tests of test_threshold.py check the final optimum only; a pruning bound that is
too weak, switched off, or slightly invalid on instances where it never prunes the optimum goes
unnoticed there. Here, per deepest-cut bound L and per t1 breakpoint (module docstring of
solvers/threshold.py):

* the node's exact value, min over x ≤ L with max_i a_i(x_i) ≤ t1 of
  E(x) = I·t1 + I·max_i b_i(x_i) + I·Σ_i s(x_i) + max(max_i u_i(x_i), σ_L(x)/r_ef) + max(max_i v_i(x_i), σ_L(x)/r_fe)
  with σ_L(x) = Σ_i (δ_L − δ_{x_i}), is enumerated over every cut vector;
* the basic bound LB₀(t1) = I·t1 + I·t2min + I·A + max(Umin, σ_A/r_ef) + max(Vmin, σ_A/r_fe) is written out
  from the deepest-admissible vector x(t1) (A = Σs, σ_A = σ_L of it; t2min/Umin/Vmin = max_i min_{j: a_ij ≤ t1});
* the code's LB(t1) must lie between them, and the Σs/σ couplings must lift it above LB₀ somewhere;
* the cheap per-L bound is the formula of its docstring, and never above min_{x ≤ L} N_L(x);
* the reported sweeps, nodes and per-L history count what was really done, and a sweep budget is honoured.
"""

from __future__ import annotations

import math
from itertools import product

import numpy as np
import pytest

import solvers.threshold as threshold
from adaptplan.benches.solvers import _problem
from solvers.threshold import _cheap_bounds, _Subproblem, applicable, solve_ms_exact
from tests.solver_instances import exhaustive_at_interval, small_problem, stressed


def _terms(problem, cols):
    lat = problem.latency
    j = np.asarray(cols) - 1
    sys = lat.system
    return (lat.fp_up[:, j], lat.down_bp[:, j], lat.model_up[:, j], lat.model_down[:, j], lat.server_per_device[j],
            lat.delta[j], float(sys.edge_to_fed_bps), float(sys.fed_to_edge_bps))


def _enumerate(problem, interval, cols):
    """Over every cut vector x ≤ L (column indices into ``cols``): max_i a_i(x_i), and the rest of N_L(x),
    I·max_i b_i(x_i) + I·Σ_i s(x_i) + max(max_i u_i(x_i), σ_L/r_ef) + max(max_i v_i(x_i), σ_L/r_fe)."""
    a, b, u, v, s, delta, ref, rfe = _terms(problem, cols)
    N, J = a.shape
    rows = np.arange(N)
    X = np.array(list(product(range(J), repeat=N)))
    sigma = (delta[-1] - delta[X]).sum(axis=1)
    rest = (interval * b[rows, X].max(axis=1) + interval * s[X].sum(axis=1)
            + np.maximum(u[rows, X].max(axis=1), sigma / ref) + np.maximum(v[rows, X].max(axis=1), sigma / rfe))
    return a[rows, X].max(axis=1), rest


def _exact_nodes(problem, interval, cols, t1_values):
    """min E(x) = I·t1 + rest(x) over every cut vector x with max_i a_i(x_i) ≤ t1."""
    amax, rest = _enumerate(problem, interval, cols)
    return np.array([interval * t1 + rest[amax <= t1].min() if (amax <= t1).any() else math.inf for t1 in t1_values])


def _exact_numerator(problem, interval, cols):
    """min over every x ≤ L of N_L(x) = I·max a + rest(x)."""
    amax, rest = _enumerate(problem, interval, cols)
    return float((interval * amax + rest).min())


def _basic_bounds(problem, interval, cols, t1_values):
    """LB₀(t1) of the module docstring, from the deepest-admissible vector x(t1)."""
    a, b, u, v, s, delta, ref, rfe = _terms(problem, cols)
    out = []
    for t1 in t1_values:
        ok = a <= t1
        deep = np.array([np.flatnonzero(row).max() for row in ok])
        A, sigma = s[deep].sum(), (delta[-1] - delta[deep]).sum()
        t2min, umin, vmin = (max(m[i, ok[i]].min() for i in range(len(ok))) for m in (b, u, v))
        out.append(interval * t1 + interval * t2min + interval * A + max(umin, sigma / ref) + max(vmin, sigma / rfe))
    return np.array(out)


def _instances():
    for seed in range(12):
        problem = small_problem(seed + 40, num_devices=4, num_cuts=4)
        yield (stressed(problem, seed) if seed % 2 else problem), seed


@pytest.mark.parametrize("problem, seed", list(_instances()), ids=lambda p: str(p) if isinstance(p, int) else "")
def test_every_t1_bound_lies_between_the_basic_bound_and_the_nodes_exact_value(problem, seed) -> None:
    assert applicable(problem)
    cand = problem.feasible_candidates
    for interval in (1, 3):
        for pos in range(cand.size):
            cols = cand[: pos + 1]
            sub = _Subproblem(problem, interval, cols)
            sub.lower_bounds()                          # no cutoff: every node gets every coupling
            t1 = sub.top.t
            exact = _exact_nodes(problem, interval, cols, t1)
            basic = _basic_bounds(problem, interval, cols, t1)
            assert np.all(np.isfinite(exact))           # every breakpoint admits a cut on every device
            assert np.all(sub.lb <= exact * (1 + 1e-9)), (interval, pos)     # valid: never prunes a better node
            assert np.all(sub.lb >= basic * (1 - 1e-9)), (interval, pos)     # at least the basic bound
            assert sub.lower == pytest.approx(sub.lb.min(), rel=0)


def test_the_coupled_bounds_are_stronger_than_the_basic_bound_and_save_sweeps(monkeypatch) -> None:
    lifted, nodes = 0, 0
    for problem, _ in _instances():
        cand = problem.feasible_candidates
        for pos in range(cand.size):
            cols = cand[: pos + 1]
            sub = _Subproblem(problem, 2, cols)
            sub.lower_bounds()
            basic = _basic_bounds(problem, 2, cols, sub.top.t)
            lifted += int(np.sum(sub.lb > basic * (1 + 1e-9)))
            nodes += sub.lb.size
    assert lifted >= nodes // 10, (lifted, nodes)      # the Σs/σ couplings bite on a good share of the nodes

    totals = {}
    for strong in (True, False):
        monkeypatch.setattr(threshold, "_STRONG_BOUNDS", strong)
        runs = [solve_ms_exact(stressed(_problem(n, cuts, seed), seed), interval, max_sweeps=None)
                for n, cuts, seed in ((100, 21, 4), (80, 9, 2)) for interval in (1, 2, 4)]
        totals[strong] = (sum(r.iterations for r in runs), [r.objective for r in runs])
    assert totals[True][1] == pytest.approx(totals[False][1], rel=1e-12)
    assert totals[True][0] < totals[False][0], totals


def test_cheap_bound_is_its_docstring_formula_and_a_valid_bound() -> None:
    for problem, _ in _instances():
        cand = problem.feasible_candidates
        for interval in (1, 2):
            cheap = _cheap_bounds(problem, float(interval), cand)
            for k, L in enumerate(cand):
                a, b, u, v, s, delta, ref, rfe = _terms(problem, cand[: k + 1])
                N = a.shape[0]
                # no memory budgets: every device's deepest admissible cut ≤ L is L itself (σ = 0)
                formula = (interval * a.min(axis=1).max() + interval * b.min(axis=1).max() + interval * N * s[-1]
                           + max(u.min(axis=1).max(), 0.0) + max(v.min(axis=1).max(), 0.0))
                assert cheap[k] == pytest.approx(formula, rel=1e-12)
                assert cheap[k] <= _exact_numerator(problem, interval, cand[: k + 1]) * (1 + 1e-9)


def test_cheap_bound_with_memory_budgets_uses_each_devices_deepest_fitting_cut() -> None:
    from solvers.instances import adversarial_problem

    problem = adversarial_problem(6, 8, seed=5, memory_bytes=(3e6, 3e8))
    assert not problem.admissible.all()                 # some client parts do not fit
    ok_full = problem.admissible
    cand = problem.candidates
    cheap = _cheap_bounds(problem, 2.0, cand)
    lat, sys = problem.latency, problem.latency.system
    for k, L in enumerate(cand):
        j = cand[: k + 1] - 1
        ok = ok_full[:, j]
        if not ok.any(axis=1).all():
            assert cheap[k] == math.inf
            continue

        def max_of_min(m):
            return np.where(ok, m[:, j], np.inf).min(axis=1).max()

        deep = np.array([j[np.flatnonzero(row).max()] for row in ok])
        sum_s = lat.server_per_device[deep].sum()
        sigma = (lat.delta[L - 1] - lat.delta[deep]).sum()
        formula = (2 * max_of_min(lat.fp_up) + 2 * max_of_min(lat.down_bp) + 2 * sum_s
                   + max(max_of_min(lat.model_up), sigma / sys.edge_to_fed_bps)
                   + max(max_of_min(lat.model_down), sigma / sys.fed_to_edge_bps))
        assert cheap[k] == pytest.approx(formula, rel=1e-12), L


def test_reported_sweeps_nodes_and_history_count_what_was_done(monkeypatch) -> None:
    made, visited = [], []
    sweep_init, node = threshold._Sweep.__init__, _Subproblem.node

    def counting_sweep(self, *args, **kwargs):
        made.append(1)
        sweep_init(self, *args, **kwargs)

    def counting_node(self, k, bound):
        visited.append(k)
        return node(self, k, bound)

    monkeypatch.setattr(threshold._Sweep, "__init__", counting_sweep)
    monkeypatch.setattr(_Subproblem, "node", counting_node)
    searched = 0
    for problem in (stressed(small_problem(7), 7), stressed(_problem(40, 9, 2), 2)):
        for interval in (1, 3):
            made.clear(), visited.clear()
            result = solve_ms_exact(problem, interval, max_sweeps=None)
            assert result.iterations == len(made) == sum(h["sweeps"] for h in result.history)
            assert result.nodes == len(visited)
            assert f"({len(visited)} t1 nodes, {len(made)} sweeps over {len(result.history)} deepest-cut bounds)" \
                in result.message
            searched += len(visited)
    assert searched > 0


@pytest.mark.parametrize("budget", [5, 20, 60, 150])
def test_a_sweep_budget_is_honoured_and_its_lower_bound_certified(budget) -> None:

    problem = stressed(_problem(200, 13, 6), 6)
    exact = solve_ms_exact(problem, 4, max_sweeps=None)
    assert exact.status == "converged" and exact.iterations > 150    # the budgets below cut this search short
    result = solve_ms_exact(problem, 4, max_sweeps=budget)
    assert result.iterations <= budget
    assert result.lower_bound <= exact.objective * (1 + 1e-12)
    assert result.objective >= exact.objective * (1 - 1e-12)
    assert result.status == ("converged" if result.objective <= exact.objective * (1 + 1e-12)
                             and result.lower_bound >= exact.objective * (1 - 1e-9) else "budget")


def test_small_brute_force_agrees_with_the_exhaustive_objective() -> None:
    """The enumeration above is the same problem as objective (28): min over L of (min_x E)/D_L equals
    the brute force of tests/solver_instances.py at I = 2."""
    problem = small_problem(44, num_devices=4, num_cuts=4)
    conv, cand = problem.convergence, problem.feasible_candidates
    best = math.inf
    for k, L in enumerate(cand):
        D = 2 * (conv.c - conv.d(int(L)) * 4)
        if D > 0:
            best = min(best, _exact_numerator(problem, 2, cand[: k + 1]) / D)
    assert problem.scale * best == pytest.approx(exhaustive_at_interval(problem, 2), rel=1e-9)


def test_lagrangian_bound_starts_at_uniform_multipliers_only_rises_and_stays_valid() -> None:
    """solvers/lagrange.py: one step is the separable bound at λ = μ = 1/N, ν = ω = 1/(N+1), written out here;
    more mirror-ascent steps never lower it, a reached target stops it, and it never passes min_x N_L(x)."""
    from solvers.lagrange import lagrangian_bound

    for problem, _ in _instances():
        cand = problem.feasible_candidates
        cols = cand
        a, b, u, v, s, delta, ref, rfe = _terms(problem, cols)
        N = a.shape[0]
        gap = delta[-1] - delta
        for interval in (1.0, 3.0):
            uniform = (interval * s[None, :] + interval * a / N + interval * b / N + u / (N + 1) + v / (N + 1)
                       + (1 / (N + 1)) * (1 / ref + 1 / rfe) * gap[None, :]).min(axis=1).sum()
            bounds = [lagrangian_bound(a, b, u, v, s, gap, interval, ref, rfe, iterations=k) for k in (1, 2, 5, 25)]
            assert bounds[0] == pytest.approx(uniform, rel=1e-12)
            assert all(x <= y * (1 + 1e-15) for x, y in zip(bounds, bounds[1:]))
            assert bounds[-1] <= _exact_numerator(problem, interval, cols) * (1 + 1e-9)
            assert lagrangian_bound(a, b, u, v, s, gap, interval, ref, rfe) == bounds[-1]      # 25 steps by default
            assert lagrangian_bound(a, b, u, v, s, gap, interval, ref, rfe, target=bounds[0]) == bounds[0]


def _separable_bound(terms, interval, lam, mu, nu, om):
    """The relaxed numerator at fixed multipliers (solvers/lagrange.py's module docstring), device by device and
    cut by cut: its value and each device's minimising cut."""
    a, b, u, v, s, delta, ref, rfe = terms
    N, J = a.shape
    gap = delta[-1] - delta
    total, cuts = 0.0, []
    for i in range(N):
        row = [interval * s[j] + interval * lam[i] * a[i, j] + interval * mu[i] * b[i, j] + nu[i] * u[i, j]
               + om[i] * v[i, j] + (nu[N] / ref + om[N] / rfe) * gap[j] if np.isfinite(a[i, j]) else np.inf
               for j in range(J)]
        cuts.append(int(np.argmin(row)))
        total += min(row)
    return total, cuts


def _exponentiated_step(w, g, eta):
    """w·exp(2η·g/max|g|), renormalised to sum to 1; w unchanged when g = 0."""
    top = max(abs(x) for x in g)
    if top == 0:
        return w
    w = [wi * math.exp(2 * eta * gi / top) for wi, gi in zip(w, g)]
    return [wi / sum(w) for wi in w]


def test_lagrangian_bounds_second_step_is_one_exponentiated_gradient_step_written_out() -> None:
    """solvers/lagrange.py's mirror ascent: from the uniform multipliers, each multiplier vector w moves to
    w·exp(2η·g/max|g|) renormalised, η = 2/√1, g its term's subgradient at the minimising cuts j_i (λ_i: I·a_ij,
    μ_i: I·b_ij, ν_i: u_ij, ν₀: σ/r_ef, ω_i: v_ij, ω₀: σ/r_fe, σ = Σ_i (δ_L − δ_ji)); two steps give the better of
    the two separable bounds. Written out here with plain loops over devices and cuts."""
    from solvers.lagrange import lagrangian_bound

    moved = 0
    for problem, _ in _instances():
        a, b, u, v, s, delta, ref, rfe = _terms(problem, problem.feasible_candidates)
        rfe *= 2.5                         # the two fed links at different rates, so that ν₀ and ω₀ differ
        terms = a, b, u, v, s, delta, ref, rfe
        N = a.shape[0]
        gap = delta[-1] - delta
        for interval in (1.0, 3.0):
            lam, mu, nu, om = [1 / N] * N, [1 / N] * N, [1 / (N + 1)] * (N + 1), [1 / (N + 1)] * (N + 1)
            first, cuts = _separable_bound(terms, interval, lam, mu, nu, om)
            sigma = sum(gap[j] for j in cuts)
            lam = _exponentiated_step(lam, [interval * a[i, j] for i, j in enumerate(cuts)], 2.0)
            mu = _exponentiated_step(mu, [interval * b[i, j] for i, j in enumerate(cuts)], 2.0)
            nu = _exponentiated_step(nu, [u[i, j] for i, j in enumerate(cuts)] + [sigma / ref], 2.0)
            om = _exponentiated_step(om, [v[i, j] for i, j in enumerate(cuts)] + [sigma / rfe], 2.0)
            second, _ = _separable_bound(terms, interval, lam, mu, nu, om)
            assert lagrangian_bound(a, b, u, v, s, gap, interval, ref, rfe, iterations=2) == pytest.approx(
                max(first, second), rel=1e-12)
            moved += second > first * (1 + 1e-9)
    assert moved >= 4          # the second step raised the bound often enough for the test to see the update

@pytest.mark.parametrize("num_devices, num_cut_points, seed", [(60, 13, 4), (100, 9, 1), (20, 9, 6)])
def test_every_sweep_budget_certifies_only_what_it_proved(num_devices, num_cut_points, seed) -> None:
    """At every budget, including those that run out inside a node's t4 (cap) loop: the lower bound never
    passes the exact optimum, and "converged" (exact) is claimed only with the exact optimum in hand."""

    problem = stressed(_problem(num_devices, num_cut_points, seed), seed)
    for interval in (1, 2):
        exact = solve_ms_exact(problem, interval, max_sweeps=None)
        statuses = set()
        for budget in range(1, exact.iterations + 1):
            result = solve_ms_exact(problem, interval, max_sweeps=budget)
            statuses.add(result.status)
            # a budget is checked before each sweep of a node and before each new deepest-cut bound, whose
            # four unrestricted sweeps come as one block: at most those four past it
            assert result.iterations < budget + 4, budget
            assert result.lower_bound <= exact.objective * (1 + 1e-12), budget
            if result.status == "converged":
                assert result.objective == pytest.approx(exact.objective, rel=1e-12), budget
        assert "budget" in statuses
