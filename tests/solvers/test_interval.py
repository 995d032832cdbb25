"""Theorem 2 (docs/model.md §4.4): Newton–Raphson root of (47) and the floor/ceil rule (33)/(48)."""

import math

import numpy as np
import pytest
from scipy.optimize import brentq

from adaptplan.errors import InfeasibleError
from solvers.interval import DEFAULT_MAX_INTERVAL, best_interval, interval_objective, max_feasible_interval, newton_interval

A, B, C, D = 0.16690, 0.44189, 0.06, 1e-4  # docs/model.md §7.2–§7.3


def test_worked_example_root_and_integer_optimum():
    I0 = newton_interval(A, B, C, D)
    root = brentq(lambda I: 2 * A * D * I**3 + 3 * B * D * I**2 - B * C, 1e-9, math.sqrt(C / D), xtol=1e-14)
    assert I0 == pytest.approx(root, abs=1e-9)
    # §7.4 quotes I0 = 8.108701 from unrounded a, b; with the rounded a, b of §7.2 the root is 8.108730.
    assert I0 == pytest.approx(8.108701, abs=1e-4)
    assert abs(2 * A * D * I0**3 + 3 * B * D * I0**2 - B * C) < 1e-15
    assert best_interval(A, B, C, D) == 8
    assert interval_objective(8, A, B, C, D) == pytest.approx(4.14435, abs=5e-5)
    assert interval_objective(9, A, B, C, D) == pytest.approx(4.16184, abs=5e-5)
    assert max_feasible_interval(C, D) == 24


def test_objective_table_of_section_7_5():
    scale = 2 * 2.3 / 0.01
    expected = {6: 1961.9, 7: 1920.4, 8: 1906.4, 9: 1914.4, 10: 1942.0}
    for I, value in expected.items():
        assert scale * interval_objective(I, A, B, C, D) == pytest.approx(value, abs=0.15)


def test_theorem2_equals_brute_force_on_10000_random_instances():
    rng = np.random.default_rng(12345)
    n = 10_000
    a = rng.uniform(0.01, 2.0, n)
    b = rng.uniform(0.01, 5.0, n) * 10 ** rng.uniform(-2, 1, n)
    c = rng.uniform(0.01, 1.0, n)
    bound = 10 ** rng.uniform(math.log10(2), math.log10(5000), n)  # √(c/d) ∈ [2, 5000], §7.6
    d = c / bound**2
    mismatches = 0
    for k in range(n):
        rule = best_interval(a[k], b[k], c[k], d[k])
        I = np.arange(1, max_feasible_interval(c[k], d[k]) + 1, dtype=float)
        values = (a[k] * I + b[k]) / (I * (c[k] - d[k] * I * I))
        brute = values.min()
        mismatches += not (interval_objective(rule, a[k], b[k], c[k], d[k]) <= brute * (1 + 1e-12))
    assert mismatches == 0


def test_guards():
    # ⌊I0⌋ = 0 → 1 (tiny aggregation cost)
    assert newton_interval(1.0, 1e-6, 1.0, 1e-2) < 1
    assert best_interval(1.0, 1e-6, 1.0, 1e-2) == 1
    # ⌈I0⌉ infeasible → ⌊I0⌋: huge b pushes I0 towards √(c/d) = 2
    assert best_interval(1e-6, 1e6, 1.0, 0.25) == 1
    assert best_interval(0.0, 1.0, 1.0, 0.0) == DEFAULT_MAX_INTERVAL  # d = 0: F decreasing, capped
    assert best_interval(0.0, 1.0, 1.0, 0.0, max_interval=40) == 40
    assert best_interval(1.0, 0.0, 1.0, 1e-3) == 1  # b = 0: I0 = 0
    with pytest.raises(InfeasibleError, match="unreachable"):
        newton_interval(1.0, 1.0, -0.1, 1e-3)
    with pytest.raises(InfeasibleError, match="c - d"):
        best_interval(1.0, 1.0, 1.0, 1.0)  # I = 1 already violates c − dI² > 0
