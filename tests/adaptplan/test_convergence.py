"""Corollary 1 / objective (28) (adaptplan/convergence.py) against the spec's formulas written out in
tests/reference_model.py, at the feasibility boundary c − dI² = 0 exactly, and its messages' numbers."""

import math

import numpy as np
import pytest

from adaptplan.constants import ConvergenceConstants
from adaptplan.convergence import ConvergenceModel, check_lengths, step_note
from adaptplan.errors import InfeasibleError, InputError
from solvers.baselines import solve_fixed_cut
from solvers.exact import solve_exact, solve_exhaustive
from solvers.interval import max_feasible_interval
from solvers.problem import PlanningProblem
from tests import reference_model as ref
from tests.binding_instances import asymmetric_problem, parts


def test_c_d_rounds_and_objective_equal_the_reference():
    rng = np.random.default_rng(3)
    for _ in range(30):
        L, N = int(rng.integers(2, 8)), int(rng.integers(1, 30))
        beta, gamma, sigma2 = float(rng.uniform(1, 10)), float(rng.uniform(0.001, 0.05)), tuple(rng.uniform(0, 1, L))
        noise_floor = beta * gamma * sum(sigma2) / N
        constants = ConvergenceConstants(beta=beta, gamma=gamma, theta=float(rng.uniform(0.5, 3)),
                                         epsilon=noise_floor + float(rng.uniform(0.05, 0.5)), sigma2=sigma2,
                                         G2=tuple(rng.uniform(1e-4, 1e-2, L)))
        model = ConvergenceModel(constants, N)
        c = ref.c_value(constants, N)
        assert model.c == pytest.approx(c, rel=1e-12)
        for cut in range(1, L + 1):
            d = ref.d_value(constants, cut)
            assert model.d(cut) == pytest.approx(d, rel=1e-12)
            assert model.interval_bound(cut) == pytest.approx(math.sqrt(c / d), rel=1e-12)
            top = ref.max_interval(constants, N, cut)
            assert max_feasible_interval(model.c, model.d(cut)) == top
            for I in (1, max(1, top // 2), top, top + 1):
                a, b = float(rng.uniform(0.1, 2)), float(rng.uniform(0.1, 5))
                expected = ref.rounds(constants, N, I, cut)
                if math.isinf(expected):
                    with pytest.raises(InfeasibleError, match="I must be <"):
                        model.rounds(I, cut)
                    assert math.isinf(model.objective(I, cut, a, b))
                    continue
                assert model.rounds(I, cut) == pytest.approx(expected, rel=1e-12)
                assert model.integer_rounds(I, cut) == math.ceil(expected)
                scale = 2 * constants.theta / constants.gamma
                assert model.objective(I, cut, a, b) == pytest.approx(scale * (I * a + b) / (I * (c - d * I * I)), rel=1e-12)


def _boundary_constants(num_cuts=3):
    """4β²γ² = 1 and c = ε = 0.25 exactly; A_1 = 0.0625 (I_max = 1 since c − d·2² = 0), A_2 = 0.25 = c."""
    return ConvergenceConstants(beta=0.5, gamma=1.0, theta=1.0, epsilon=0.25, sigma2=(0.0,) * num_cuts,
                                G2=(0.0625, 0.1875, 1.0)[:num_cuts])


def test_margin_exactly_zero_is_infeasible():
    model = ConvergenceModel(_boundary_constants(), num_devices=2)
    assert model.c == 0.25 and model.d(1) == 0.0625 and model.d(2) == 0.25
    assert model.margin(2, 1) == 0.0 and model.margin(1, 2) == 0.0
    assert model.rounds(1, 1) == pytest.approx(2 / (1.0 * (0.25 - 0.0625)))
    for interval, cut in ((2, 1), (1, 2)):
        with pytest.raises(InfeasibleError):
            model.rounds(interval, cut)
        assert math.isinf(model.objective(interval, cut, 1.0, 1.0))
    assert model.feasible_cuts(np.array([1, 2, 3])).tolist() == [1]
    assert max_feasible_interval(model.c, model.d(1)) == 1 and max_feasible_interval(model.c, model.d(2)) == 0
    problem = PlanningProblem.from_parts(asymmetric_problem(1, num_devices=2, num_cuts=3).latency.profile,
                                         parts(asymmetric_problem(1, num_devices=2, num_cuts=3))[1],
                                         _boundary_constants(), candidates=[1, 2, 3])
    assert problem.feasible_candidates.tolist() == [1]
    with pytest.raises(InfeasibleError, match="I must be < 1"):
        solve_fixed_cut(problem, 2)  # c − d(2)·1² = 0: no interval (Corollary 1's message, not a later failure)
    assert solve_fixed_cut(problem, 1).interval == 1
    # the exact references skip the deepest cuts that admit no interval instead of failing on them
    for result in (solve_exhaustive(problem), solve_exact(problem)):
        assert (result.interval, result.cuts) == (1, (1, 1))
        assert result.objective == pytest.approx(ref.objective(*parts(problem), 1, (1, 1)), rel=1e-12)


def test_integer_rounds_is_the_ceiling_without_float_noise():
    """ϑ = 0.9, γ = 0.01, ε = 0.03, no noise/drift: R = 6000 exactly, but 1.8/(0.01·0.03) = 6000.000000000001."""
    constants = ConvergenceConstants(beta=1.0, gamma=0.01, theta=0.9, epsilon=0.03, sigma2=(0.0,), G2=(0.0,))
    model = ConvergenceModel(constants, num_devices=4)
    assert model.rounds(7, 1) > 6000
    assert model.integer_rounds(7, 1) == 6000
    assert math.isinf(model.interval_bound(1))
    slightly_more = ConvergenceConstants(beta=1.0, gamma=0.01, theta=0.9001, epsilon=0.03, sigma2=(0.0,), G2=(0.0,))
    assert ConvergenceModel(slightly_more, 4).integer_rounds(7, 1) == 6001
    tiny = ConvergenceConstants(beta=1.0, gamma=1.0, theta=1e-6, epsilon=10.0, sigma2=(0.0,), G2=(0.0,))
    assert ConvergenceModel(tiny, 1).integer_rounds(1, 1) == 1  # R ≪ 1 still reports one round


def test_step_size_condition_boundary_and_noise_floor_message():
    ok = ConvergenceConstants(beta=5.0, gamma=0.2, theta=1.0, epsilon=10.0, sigma2=(1.0,), G2=(1e-3,))
    ConvergenceModel(ok, 4).check_reachable()  # γ = 1/β exactly is allowed (γ ≤ 1/β)
    assert step_note(ok) is None
    too_big = ConvergenceConstants(beta=5.0, gamma=0.21, theta=1.0, epsilon=10.0, sigma2=(1.0,), G2=(1e-3,))
    ConvergenceModel(too_big, 4).check_reachable()          # γ > 1/β is said, not refused (docs/model.md §10)
    assert step_note(too_big) == ("gamma = 0.21 exceeds 1/beta = 0.2 (beta = 5): Theorem 1 assumes gamma <= 1/beta, "
                                  "so its round count is no bound here; the plan reads eq. (15) as a model of the "
                                  "rounds (docs/model.md §10), fitted to pilot runs with --pilots, else unchecked")
    floor = ConvergenceConstants(beta=5.0, gamma=0.01, theta=1.0, epsilon=0.1, sigma2=(20.0, 20.0), G2=(1e-3, 1e-3))
    with pytest.raises(InfeasibleError, match=r"noise floor \(beta\*gamma/N\)\*sum\(sigma2\) = 0.25 .*raise epsilon above 0.25"):
        ConvergenceModel(floor, 8).check_reachable()
    exact = ConvergenceConstants(beta=5.0, gamma=0.01, theta=1.0, epsilon=0.25, sigma2=(20.0, 20.0), G2=(1e-3, 1e-3))
    with pytest.raises(InfeasibleError, match="unreachable"):
        ConvergenceModel(exact, 8).check_reachable()  # c = 0 exactly is unreachable too
    model = ConvergenceModel(ConvergenceConstants.placeholder(16), 20)
    assert "I must be < 24.49" in model.infeasibility_reason(30, 5)
    with pytest.raises(InputError, match="has 16 entries but the profile has 15 cut points"):
        check_lengths(15, ConvergenceConstants.placeholder(16))
    check_lengths(16, ConvergenceConstants.placeholder(16))


def test_the_shared_equation_helpers_equal_their_formulas_written_out():
    """drift_coefficient, margin, interval_denominator, latency_ratio and mu5_bound: each the one
    implementation the convergence model and every solver call (docs/architecture.md, the
    equation table), checked against the formulas written out here."""
    from adaptplan.convergence import drift_coefficient, interval_denominator, latency_ratio, margin, mu5_bound

    k = ConvergenceConstants(beta=3.0, gamma=0.02, theta=1.5, epsilon=0.4, sigma2=(0.1, 0.2), G2=(0.01, 0.03))
    assert drift_coefficient(k) == pytest.approx(4 * 3.0**2 * 0.02**2)
    assert margin(0.4, 0.05, 2) == pytest.approx(0.4 - 0.05 * 4)
    I = np.array([1.0, 2.0, 3.0])
    assert np.allclose(interval_denominator(0.4, 0.05, I), I * (0.4 - 0.05 * I**2))
    d = np.array([0.01, 0.02])
    assert np.allclose(interval_denominator(0.4, d, 2.0), 2.0 * (0.4 - d * 4.0))    # one I, several d
    ratio = latency_ratio(I, 5.0, 7.0, 0.4, 0.05)
    assert np.allclose(ratio[:2], (5.0 * I[:2] + 7.0) / (I[:2] * (0.4 - 0.05 * I[:2] ** 2)))
    assert ratio[2] == math.inf                                            # 0.4 − 0.05·9 < 0: infeasible
    assert latency_ratio(2.0, 5.0, 7.0, 0.4, 0.1) == math.inf              # margin exactly 0
    assert mu5_bound(0.4, 0.0144, 2.0, 1e-12) == pytest.approx(0.4 / (0.0144 * 4) * (1 - 1e-12))
    assert mu5_bound(0.4, 0.0, 2.0, 1e-12) == math.inf
    assert mu5_bound(0.4, 0.0144, 2.0, 0.5) == pytest.approx(0.4 / (0.0144 * 4) * 0.5)    # the margin shrinks it
    model = ConvergenceModel(k, 10)
    c, dL = model.c, model.d(2)
    assert model.objective(2, 2, 5.0, 7.0) == pytest.approx(2 * 1.5 / 0.02 * (2 * 5.0 + 7.0) / (2 * (c - dL * 4)))
