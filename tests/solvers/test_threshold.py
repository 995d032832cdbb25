"""The exact threshold-sweep MS step (solvers/threshold.py) against brute force and the MILP."""

from __future__ import annotations

import numpy as np
import pytest

import solvers.threshold as threshold
from adaptplan.benches.solvers import _problem
from solvers.bcd import choose_ms_method, solve_bcd
from solvers.dinkelbach import solve_dinkelbach
from solvers.interval import max_feasible_interval
from solvers.threshold import _Keyed, _RangeMin, applicable, solve_ms_exact
from tests.solver_instances import exhaustive_at_interval, small_problem, stressed


def _intervals(problem):
    top = max_feasible_interval(problem.convergence.c, problem.convergence.d(int(problem.feasible_candidates[0])))
    return sorted({i for i in (1, 2, 3, max(1, top // 2), top) if 1 <= i <= top})


@pytest.mark.parametrize("seed", range(40))
def test_matches_brute_force_small(seed):
    problem = small_problem(seed)
    assert applicable(problem)
    for interval in _intervals(problem):
        reference = exhaustive_at_interval(problem, interval)
        if not np.isfinite(reference):
            continue
        result = solve_ms_exact(problem, interval)
        assert result.objective == pytest.approx(reference, rel=1e-9)
        assert result.method == "threshold" and result.milp_solves == 0




@pytest.mark.parametrize("seed", range(40))
def test_matches_brute_force_stressed(seed):
    """Rescaled matrices so that the model-exchange terms (t3, t4 caps) and server costs matter."""
    problem = stressed(small_problem(seed + 500), seed)
    for interval in _intervals(problem):
        reference = exhaustive_at_interval(problem, interval)
        if np.isfinite(reference):
            assert solve_ms_exact(problem, interval).objective == pytest.approx(reference, rel=1e-9)


@pytest.mark.parametrize("num_devices,seed", [(30, 0), (45, 1), (60, 2)])
def test_matches_milp_medium(num_devices, seed):
    problem = _problem(num_devices, 9, seed)  # 8 candidate cuts
    for interval in (2, 6):
        milp = solve_dinkelbach(problem, interval)
        assert milp.status == "converged"
        assert solve_ms_exact(problem, interval).objective == pytest.approx(milp.objective, rel=1e-9)


def test_bcd_ms_methods_agree_and_report():
    problem = small_problem(3)
    milp = solve_bcd(problem, ms_method="milp")
    sweep = solve_bcd(problem, ms_method="threshold")
    assert sweep.objective == pytest.approx(milp.objective, rel=1e-9)
    assert sweep.backend == "threshold" and sweep.history[0]["ms_method"] == "threshold"
    assert milp.backend == "highs" and milp.history[0]["ms_method"] == "milp"
    assert choose_ms_method(problem) == "milp"  # small: the spec's Algorithm 2
    assert choose_ms_method(_problem(100, 21, 0)) == "threshold"


@pytest.mark.parametrize("small", [1 << 16, 0])      # one-entry blocks (a sparse table), blocks of 64
def test_range_min(small, monkeypatch):
    monkeypatch.setattr(_RangeMin, "SMALL", small)
    rng = np.random.default_rng(0)
    for n in (0, 1, 2, 3, 7, 16, 33, 63, 64, 65, 128, 200, 1000):   # inside one block of 64, across blocks
        values = rng.normal(size=n)
        lo, hi = rng.integers(-2, n + 3, 300), rng.integers(-2, n + 3, 300)
        expected = [values[max(a, 0):min(b, n)].min() if min(b, n) > max(a, 0) else np.inf for a, b in zip(lo, hi)]
        assert np.array_equal(_RangeMin(values).query(lo, hi), np.array(expected))


def test_keyed_prefix_is_the_sort_of_the_prefix():
    """The sort structures read off the full key for its first L columns equal those sorted from those
    columns alone, ties (repeated keys, inf for cuts that do not fit) and their order included."""
    rng = np.random.default_rng(1)
    key = rng.integers(0, 6, size=(40, 9)).astype(float)     # many ties
    key[rng.random(key.shape) < 0.2] = np.inf
    full = _Keyed(key)
    for L in range(1, 10):
        direct, derived = _Keyed(key[:, :L]), full.prefix(L)
        assert (derived.N, derived.J) == (40, L)
        for name in ("order", "rowflat", "g", "kv", "row"):
            assert np.array_equal(getattr(derived, name), getattr(direct, name)), (L, name)


def test_one_bcd_run_sorts_each_key_once_and_finds_what_the_uncached_search_finds(monkeypatch):
    """Within one BCD run (its cache) the four keys are sorted once, over all candidates, and every deepest-cut
    bound reads its columns off them (_Keyed.prefix); without the cache each bound sorts its own. Same plan."""
    from solvers.instances import random_problem

    problem = random_problem(2000, 21, 1)
    shapes: list[tuple[int, int]] = []
    real = threshold._Keyed.__init__

    def spy(self, key):
        shapes.append(key.shape)
        real(self, key)

    monkeypatch.setattr(threshold._Keyed, "__init__", spy)
    cached = solve_bcd(problem, ms_method="threshold")
    assert shapes == [(2000, problem.candidates.size)] * 4
    shapes.clear()
    monkeypatch.setattr(threshold, "CACHE_SIZE", 0)
    uncached = solve_bcd(problem, ms_method="threshold")
    assert len(shapes) > 4                      # several deepest-cut bounds searched, each sorting its keys
    assert (uncached.cuts, uncached.interval, uncached.objective) == (cached.cuts, cached.interval, cached.objective)


@pytest.mark.parametrize("num_devices,num_cut_points,seed,stress",
                         [(50, 21, 0, False), (120, 21, 1, False), (200, 21, 2, False), (60, 13, 3, True),
                          (100, 21, 4, True), (150, 9, 5, True), (200, 13, 6, True)])
def test_strong_bounds_keep_the_optimum_medium(num_devices, num_cut_points, seed, stress, monkeypatch):
    """The Σs/σ-coupled bounds (and the t4-cap bounds) only prune: same optimum as with the basic
    bounds of the t1/t3 sweeps alone, to 1e-12 relative, with and without a warm start."""
    problem = _problem(num_devices, num_cut_points, seed)
    if stress:
        problem = stressed(problem, seed)
    assert applicable(problem)
    for interval in _intervals(problem):
        warm = problem.initial_cuts()
        fast = [solve_ms_exact(problem, interval), solve_ms_exact(problem, interval, warm_cuts=warm)]
        monkeypatch.setattr(threshold, "_STRONG_BOUNDS", False)
        reference = solve_ms_exact(problem, interval)
        monkeypatch.setattr(threshold, "_STRONG_BOUNDS", True)
        for result in fast:
            assert result.objective == pytest.approx(reference.objective, rel=1e-12)


@pytest.mark.parametrize("num_devices,seed", [(50, 7), (70, 8)])
def test_matches_milp_medium_stressed(num_devices, seed):
    problem = stressed(_problem(num_devices, 9, seed), seed)
    for interval in (2, 6):
        milp = solve_dinkelbach(problem, interval)
        assert milp.status == "converged"
        assert solve_ms_exact(problem, interval).objective == pytest.approx(milp.objective, rel=1e-9)


def test_shared_cache_same_result():
    """BCD's cache of the interval-independent structures does not change any MS step."""
    problem = _problem(150, 21, 3)
    cache: dict = {}
    for interval in _intervals(problem):
        cached = solve_ms_exact(problem, interval, cache=cache)
        fresh = solve_ms_exact(problem, interval)
        assert cached.objective == fresh.objective and cached.cuts == fresh.cuts
    assert cache


@pytest.mark.parametrize("shape", [(7, 1), (5, 21), (300, 4)])
def test_running_extreme_along_rows_equals_numpy_accumulate(shape):
    """The sweeps' column-by-column running max/min is numpy's accumulate along each row, entry for entry,
    with ∞ entries (inadmissible cuts) and ties; the input is left as it was."""
    rng = np.random.default_rng(shape[1])
    floats = rng.integers(0, 5, shape).astype(float)
    floats[rng.random(shape) < 0.2] = np.inf
    ints = rng.integers(-1, 9, shape)
    for ufunc in (np.maximum, np.minimum):
        for m in (floats, ints):
            before = m.copy()
            got = threshold._along_rows(ufunc, m)
            np.testing.assert_array_equal(got, ufunc.accumulate(m, axis=1))
            assert got.dtype == m.dtype
            np.testing.assert_array_equal(m, before)
    assert threshold._along_rows(np.maximum, np.array([[3, 1, 2, 5, 4]])).tolist() == [[3, 3, 3, 5, 5]]
