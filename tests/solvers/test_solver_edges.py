"""Edges of the solvers that the random instances of the other solver tests do not reach: a
non-positive budget c, a zero drift coefficient d(L_c) = 0, parameter-free first blocks (δ = 0), the multistart size rule written in
solve_bcd's docstring, the re-run rule for a plan found by the certificate, a cap of I = 0, and the
VGG-16/CIFAR-10 profile's activation sizes worked out by hand."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from adaptplan.errors import InfeasibleError
from solvers import bcd
from solvers.baselines import RANDOM_INTERVAL_RANGE, dama_interval
from solvers.exact import solve_exact
from solvers.interval import max_feasible_interval
from solvers.problem import PlanningProblem
from solvers.synthetic import vgg16_cifar_profile
from solvers.threshold import solve_ms_exact
from tests.solver_instances import exhaustive_at_interval, small_problem


@pytest.mark.parametrize("c", [-1.0, -1e-9, 0.0])
def test_no_interval_is_feasible_without_a_positive_budget(c: float) -> None:
    """Largest I ≥ 1 with c − d·I² > 0: none when c ≤ 0 (the documented 0)."""
    assert max_feasible_interval(c, 2.0) == 0


def test_max_feasible_interval_counts_up_to_the_bound() -> None:
    # c = 50, d = 2: 50 − 2·4² = 18 > 0, 50 − 2·5² = 0 is not > 0 → 4
    assert max_feasible_interval(50.0, 2.0) == 4
    assert max_feasible_interval(50.000001, 2.0) == 5


def test_dama_falls_back_to_the_random_range_top_when_the_drift_term_vanishes() -> None:
    """d(L_c) = 4β²γ²·A_{L_c} = 0 when G_j² = 0 up to the cut: √(κc/d) is undefined, DAMA takes the
    top of the random interval range instead of dividing by zero."""
    base = small_problem(3)
    constants = base.convergence.constants
    zero_first = replace(constants, G2=(0.0,) + tuple(constants.G2[1:]))
    problem = PlanningProblem.from_parts(base.latency.profile, base.latency.system, zero_first)
    assert problem.convergence.d(1) == 0.0
    assert dama_interval(problem, (1,) * problem.num_devices) == RANDOM_INTERVAL_RANGE[1]
    assert dama_interval(problem, (2,) * problem.num_devices) >= 1          # d > 0 there: the formula


def _count_runs(monkeypatch) -> list[float]:
    runs: list[float] = []
    original = bcd._bcd_run

    def spy(*args, **kwargs):
        result = original(*args, **kwargs)
        runs.append(result.objective)
        return result

    monkeypatch.setattr(bcd, "_bcd_run", spy)
    return runs


def test_multistart_is_on_up_to_and_including_the_size_limit(monkeypatch) -> None:
    """Docstring of solve_bcd: ``None`` = on when N·|candidates| ≤ MULTISTART_AUTO_SIZE: one BCD
    run per distinct start (x⁰ and every uniform (ℓ, …, ℓ)), otherwise only from x⁰."""
    problem = small_problem(5, num_devices=2, num_cuts=3)
    size = problem.num_devices * problem.candidates.size
    starts = dict.fromkeys([problem.initial_cuts()] + [problem.start_cuts(int(c)) for c in problem.feasible_candidates])
    assert len(starts) > 1
    runs = _count_runs(monkeypatch)
    monkeypatch.setattr(bcd, "MULTISTART_AUTO_SIZE", size)
    bcd.solve_bcd(problem, certify=False)
    assert len(runs) == len(starts)
    runs.clear()
    monkeypatch.setattr(bcd, "MULTISTART_AUTO_SIZE", size - 1)
    bcd.solve_bcd(problem, certify=False)
    assert len(runs) == 1


@pytest.mark.parametrize("seed", [0, 1, 2, 4])
def test_bcd_is_re_run_only_from_a_strictly_better_certificate_plan(monkeypatch, seed: int) -> None:
    """"A better plan found on the way is kept and BCD is re-run from it": no re-run when the
    certificate's MS steps found nothing better than BCD's own plan."""
    problem = small_problem(seed)
    certs = []
    original_certify = bcd.certify_plan
    runs = _count_runs(monkeypatch)

    def certify_spy(*args, **kwargs):
        cert = original_certify(*args, **kwargs)
        certs.append(cert.objective)
        return cert

    monkeypatch.setattr(bcd, "certify_plan", certify_spy)
    bcd.solve_bcd(problem, multistart=False)
    assert len(certs) == 1
    better = certs[0] < runs[0] * (1 - 1e-9)
    assert len(runs) == 1 + better, (runs, certs)


def test_exact_with_a_cap_below_one_has_no_plan() -> None:
    with pytest.raises(InfeasibleError):
        solve_exact(small_problem(2), max_interval=0)


def test_vgg16_cifar_profile_activation_sizes_by_hand() -> None:
    """13 conv layers (3×3, 'same'), 2×2 max-pool after conv 2, 4, 7, 10, 13; then fc 512, 512, 10.
    The tensor crossing cut j is the layer's output after its pooling, 32 bits per value."""
    expected = [64 * 32 * 32, 64 * 16 * 16, 128 * 16 * 16, 128 * 8 * 8, 256 * 8 * 8, 256 * 8 * 8, 256 * 4 * 4,
                512 * 4 * 4, 512 * 4 * 4, 512 * 2 * 2, 512 * 2 * 2, 512 * 2 * 2, 512 * 1 * 1, 512, 512, 10]
    profile = vgg16_cifar_profile()
    assert profile.num_cuts == 16
    assert [cp.activation_bits for cp in profile.cut_points] == [32.0 * v for v in expected]


def _parameter_free_front(seed: int) -> PlanningProblem:
    """small_problem(seed) whose first two blocks carry no parameters (δ_1 = δ_2 = 0 bits), as a
    model that starts with e.g. a normalisation and a pooling layer."""
    base = small_problem(seed)
    points = list(base.latency.profile.cut_points)
    for k in (0, 1):
        points[k] = replace(points[k], client_param_bits=0.0)
    profile = replace(base.latency.profile, cut_points=tuple(points))
    return PlanningProblem.from_parts(profile, base.latency.system, base.convergence.constants)


@pytest.mark.parametrize("seed", [6, 7, 9])
def test_threshold_sweep_is_exact_when_the_first_blocks_have_no_parameters(seed: int) -> None:
    """Σ(δ_L − δ_{x_i}) is 0 for L = 2 there: the sweep's cheap bound for L = 2 must stay finite,
    or the optimum (some devices at cut 1, some at 2) is never searched. Reference: brute force."""
    problem = _parameter_free_front(seed)
    assert problem.latency.delta[0] == problem.latency.delta[1] == 0.0
    for interval in (1, 2, 3):
        optimum = exhaustive_at_interval(problem, interval)
        result = solve_ms_exact(problem, interval, max_sweeps=None)
        assert result.objective == pytest.approx(optimum, rel=1e-9)


def test_threshold_sweep_reports_the_seconds_it_took() -> None:
    problem = small_problem(1)
    before = time.perf_counter()
    result = solve_ms_exact(problem, 2, max_sweeps=None)
    took = time.perf_counter() - before
    assert 0.0 <= result.seconds <= took


def test_a_node_limit_stops_every_milp_solver_the_same_way_on_every_run() -> None:
    """node_limit (HiGHS mip_max_nodes) instead of a wall-clock limit: a MILP stopped at 0 nodes
    returns the best cut vector found so far (never None, never an error), says so in its status,
    and the same vector on every run; without a limit the same instance is proven optimal."""
    from solvers.dinkelbach import solve_dinkelbach
    from solvers.instances import adversarial_problem

    problem = adversarial_problem(10, 6, 1)
    optimum = solve_exact(problem)
    assert optimum.status == "optimal"
    stopped = [solve_exact(problem, node_limit=0) for _ in range(2)]
    assert [r.status for r in stopped] == ["limit", "limit"]
    assert stopped[0].cuts == stopped[1].cuts and stopped[0].objective == stopped[1].objective
    assert stopped[0].objective > optimum.objective * 1.05        # stopped early: worse than the optimum here
    assert bcd.solve_bcd(problem, ms_method="milp", node_limit=0).status == "limit"
    assert bcd.solve_bcd(problem, ms_method="milp").status == "converged"
    ms = solve_dinkelbach(problem, optimum.interval, node_limit=0)
    assert ms.status == "limit" and problem.fits(ms.cuts)
    assert solve_dinkelbach(problem, optimum.interval).status == "converged"
