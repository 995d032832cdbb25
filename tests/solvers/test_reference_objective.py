"""Every solver against an independent brute force: tests/reference_model.py evaluates objective (28) from
the spec with plain loops (no LatencyModel, no numpy), over every cut vector and every feasible I, on
instances with asymmetric, slow edge↔fed links and heterogeneous devices (tests/binding_instances.py)."""

import math

import pytest

from adaptplan.constants import ConvergenceConstants
from adaptplan.model_profile import CutPoint, ModelProfile
from solvers.bcd import solve_bcd
from solvers.dinkelbach import solve_dinkelbach
from solvers.exact import solve_exact, solve_exhaustive
from solvers.problem import PlanningProblem
from solvers.threshold import applicable, solve_ms_exact
from tests import reference_model as ref
from tests.binding_instances import asymmetric_problem, parts


def _reference(problem, intervals=None):
    profile, system, constants = parts(problem)
    return ref.brute_force(profile, system, constants, problem.candidates.tolist(), intervals)


@pytest.mark.parametrize("seed", range(10))
def test_joint_solvers_equal_the_reference_brute_force(seed):
    problem = asymmetric_problem(seed, num_devices=2 + seed % 3, num_cuts=4 + seed % 2)
    value, interval, cuts = _reference(problem)
    exhaustive = solve_exhaustive(problem)
    assert exhaustive.objective == pytest.approx(value, rel=1e-9)
    assert exhaustive.interval == interval
    assert solve_exact(problem).objective == pytest.approx(value, rel=1e-9)
    bcd = solve_bcd(problem)
    assert value * (1 - 1e-9) <= bcd.objective <= value * (1 + 1e-3)


#: seeds of asymmetric_problem(seed, 3, 5) whose optimum at one of the tested I has heterogeneous cuts with the
#: edge server's upload (110, 111) or download (115, 122, 129) deciding T_agg, plus a few homogeneous ones.
MS_SEEDS = (100, 101, 106, 107, 110, 111, 115, 122, 129, 130, 135)


def _ms_intervals(problem):
    profile, system, constants = parts(problem)
    top = ref.max_interval(constants, system.num_devices, int(problem.feasible_candidates[0]))
    return sorted({1, max(1, top // 3), max(1, top // 2)})


@pytest.mark.parametrize("seed", MS_SEEDS)
def test_ms_step_equals_the_reference_at_fixed_interval(seed):
    """Dinkelbach (MILP (35)) and the threshold sweep at fixed I = the reference minimum over x; Dinkelbach's
    last λ times 2ϑ/γ is objective (28) at its cuts, with D evaluated at the deepest cut L_c."""
    problem = asymmetric_problem(seed, num_devices=3, num_cuts=5)
    for interval in _ms_intervals(problem):
        value, _, cuts = _reference(problem, [interval])
        if not math.isfinite(value):
            continue
        dink = solve_dinkelbach(problem, interval)
        assert dink.status == "converged"
        assert dink.objective == pytest.approx(value, rel=1e-7)
        assert problem.scale * dink.history[-1]["lambda"] == pytest.approx(dink.objective, rel=1e-9)
        if applicable(problem):
            assert solve_ms_exact(problem, interval).objective == pytest.approx(value, rel=1e-9)


def test_the_ms_instances_make_the_edge_server_payload_bind_in_both_directions():
    """Guard for the test above: among its optima, the edge server's S_n decides T_agg's upload max on some and
    its download max on others, and many optimal cut vectors are heterogeneous (so L_c ≠ the shallowest cut)."""
    up = down = hetero = 0
    for seed in MS_SEEDS:
        problem = asymmetric_problem(seed, num_devices=3, num_cuts=5)
        profile, system, constants = parts(problem)
        for interval in _ms_intervals(problem):
            value, _, cuts = _reference(problem, [interval])
            if not math.isfinite(value):
                continue
            terms = ref.stage_terms(profile, system, cuts)
            up += terms["edge_model_up"] > max(terms["model_up"])
            down += terms["edge_model_down"] > max(terms["model_down"])
            hetero += len(set(cuts)) > 1
    assert up >= 2 and down >= 2 and hetero >= 8, (up, down, hetero)


def test_exhaustive_search_uses_the_largest_feasible_interval():
    """Large G_j²: for every candidate cut only I = 1 satisfies c − dI² > 0 (I_max = 1 = the largest feasible
    interval), so a brute force that skipped I_max would find nothing."""
    base = asymmetric_problem(3, num_devices=2, num_cuts=4)
    profile, system, constants = parts(base)
    c = ref.c_value(constants, 2)
    k = 4 * constants.beta ** 2 * constants.gamma ** 2
    G2 = (c / (3 * k),) + (c / (3 * k) * 0.01,) * 3  # c/d(ℓ) ∈ (1, 4) for ℓ = 1..3
    constants = ConvergenceConstants(**{**constants.__dict__, "G2": G2})
    problem = PlanningProblem.from_parts(profile, system, constants)
    assert all(ref.max_interval(constants, 2, cut) == 1 for cut in (1, 2, 3))
    value, interval, cuts = ref.brute_force(profile, system, constants, [1, 2, 3])
    best = solve_exhaustive(problem)
    assert (best.interval, interval) == (1, 1)
    assert best.objective == pytest.approx(value, rel=1e-9)
    assert solve_exact(problem).objective == pytest.approx(value, rel=1e-9)
    assert solve_bcd(problem).objective == pytest.approx(value, rel=1e-9)


def test_dinkelbach_restarts_from_the_shallowest_cut_when_the_warm_start_is_infeasible():
    """A warm start whose deepest cut admits no such I (c − d(L_c)I² ≤ 0) must not stop the MS step."""
    problem = asymmetric_problem(110, num_devices=3, num_cuts=5)
    profile, system, constants = parts(problem)
    deep = int(problem.candidates[-1])
    interval = ref.max_interval(constants, 3, deep) + 1  # infeasible for the deepest cut …
    assert ref.max_interval(constants, 3, 1) >= interval  # … feasible for the shallowest
    value, _, cuts = _reference(problem, [interval])
    result = solve_dinkelbach(problem, interval, warm_cuts=(deep,) * 3)
    assert result.history[0]["cuts"] == (int(problem.candidates[0]),) * 3
    assert result.objective == pytest.approx(value, rel=1e-7)


@pytest.mark.parametrize("seed", [10, 30, 40])
def test_exact_method_finds_inner_supported_points(seed):
    """Instances whose optimum is neither numerator minimiser at the ends of the weight range (w = 1, w = I_max):
    only the dichotomic search between them finds it (endpoint-only search is 2–7 % worse here)."""
    problem = asymmetric_problem(seed, num_devices=3, num_cuts=5)
    value, interval, cuts = _reference(problem)
    exact = solve_exact(problem)
    assert exact.objective == pytest.approx(value, rel=1e-9)
    best_L = max(exact.cuts)
    supported = next(h["supported_points"] for h in exact.history if h["deepest_cut"] == best_L)
    assert len(supported) >= 3


def test_threshold_method_applies_to_profiles_with_parameter_free_blocks():
    """Equal consecutive δ_j (ReLU/pooling cut points) keep δ non-decreasing: the exact sweep applies and
    equals the reference."""
    base = asymmetric_problem(107, num_devices=3, num_cuts=5)
    profile, system, constants = parts(base)
    points = list(profile.cut_points)
    points[2] = CutPoint(**{**points[2].__dict__, "client_param_bits": points[1].client_param_bits})  # δ_3 = δ_2
    flat = ModelProfile(model="flat", input_shape=profile.input_shape, bits_per_value=32, cut_points=tuple(points))
    problem = PlanningProblem.from_parts(flat, system, constants)
    assert applicable(problem)
    for interval in _ms_intervals(problem):
        value, _, _ = ref.brute_force(flat, system, constants, problem.candidates.tolist(), [interval])
        assert solve_ms_exact(problem, interval).objective == pytest.approx(value, rel=1e-9)


@pytest.mark.parametrize("seed", [202, 212, 224])
def test_multistart_bcd_keeps_the_best_run(seed):
    """Instances where Algorithm 3 from the shallowest cut stops at a blockwise optimum 6–19 % above the
    optimum: the multistart default must return the best of its runs, i.e. the reference optimum."""
    problem = asymmetric_problem(seed, num_devices=3, num_cuts=5)
    value, _, _ = _reference(problem)
    assert solve_bcd(problem, multistart=False, certify=False).objective > value * 1.05  # bare Algorithm 3
    best = solve_bcd(problem, certify=False)
    assert best.objective == pytest.approx(value, rel=1e-9)
    assert "best of" in best.message
    assert solve_bcd(problem).objective == pytest.approx(value, rel=1e-9)  # with the certificate too


def test_bcd_iteration_cap_and_milp_accounting():
    problem = asymmetric_problem(202, num_devices=3, num_cuts=5)
    capped = solve_bcd(problem, multistart=False, max_iterations=1, ms_method="milp", certify=False)
    assert capped.iterations == 1 and len(capped.history) == 1
    assert capped.status == "max_iterations" and math.isfinite(capped.objective)
    run = solve_bcd(problem, multistart=False, ms_method="milp", certify=False)
    assert run.status == "converged" and 2 <= run.iterations <= 10
    assert run.milp_solves == sum(h["milp_solves"] for h in run.history) >= 1
    assert all(h["ms_method"] == "milp" for h in run.history)


def test_dinkelbach_iteration_cap():
    problem = asymmetric_problem(110, num_devices=3, num_cuts=5)
    capped = solve_dinkelbach(problem, 3, max_iterations=1)
    assert capped.milp_solves == 1 and len(capped.history) == 2  # λ⁰ and one MILP


def test_newton_iterates_of_the_spec_and_its_guards():
    """§7.4: from I = √(c/d) = 24.495 the Newton iterates are 16.330, 11.361, … (a = 0.16690, b = 0.44189)."""
    from adaptplan.errors import InfeasibleError
    from solvers.interval import best_interval, newton_interval

    a, b, c, d = 0.16690, 0.44189, 0.06, 1e-4
    assert newton_interval(a, b, c, d, max_iter=1) == pytest.approx(16.330, abs=5e-4)
    assert newton_interval(a, b, c, d, max_iter=2) == pytest.approx(11.361, abs=5e-4)
    assert newton_interval(a, b, c, d, max_iter=3) == pytest.approx(8.880, abs=5e-4)
    for bad_c in (0.0, -0.01):
        with pytest.raises(InfeasibleError, match="target accuracy is unreachable"):
            newton_interval(a, b, bad_c, d)
        with pytest.raises(InfeasibleError):
            best_interval(a, b, bad_c, d)
    for args in ((-a, b, c, d), (a, -b, c, d), (a, b, c, -d)):
        with pytest.raises(ValueError, match="must be non-negative"):
            newton_interval(*args)
