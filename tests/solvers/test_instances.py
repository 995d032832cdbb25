"""The generated planning instances of the solver benchmark and the scaling tests
(solvers/instances.py) have the properties their docstrings promise: the placeholder constants with
σ_j² = 0.5·N/L (noise floor 0.025), activation sizes far from monotone in [10³, 10⁶] bits, near-tied
device twins, fixed server and edge↔fed rates, and memory budgets inside the asked range."""

from __future__ import annotations

import numpy as np
import pytest

from adaptplan.system import generate_system
from solvers.instances import adversarial_problem, adversarial_profile, adversarial_system, random_problem
from solvers.synthetic import synthetic_profile


@pytest.mark.parametrize("num_devices, num_cut_points, seed", [(7, 5, 0), (40, 12, 3)])
def test_random_problem_is_the_synthetic_profile_the_placeholder_system_and_a_quarter_noise_floor(
        num_devices, num_cut_points, seed) -> None:
    problem = random_problem(num_devices, num_cut_points, seed)
    assert problem.latency.profile == synthetic_profile(num_cut_points, seed=seed)
    assert problem.latency.system == generate_system(num_devices, seed)
    k = problem.convergence.constants
    assert (k.beta, k.gamma, k.theta, k.epsilon) == (5.0, 0.01, 2.3, 0.1)          # §6.1 placeholders
    assert k.sigma2 == pytest.approx((0.5 * num_devices / num_cut_points,) * num_cut_points, rel=1e-15)
    assert k.G2 == pytest.approx((2e-3,) * num_cut_points, rel=1e-15)
    # c = ε − (βγ/N)·Σσ_j² = 0.1 − (5·0.01/N)·(L·0.5·N/L) = 0.1 − 0.025
    assert problem.convergence.c == pytest.approx(0.075, rel=1e-12)
    assert list(problem.candidates) == list(range(1, num_cut_points))


def test_adversarial_profile_jumps_over_three_orders_of_magnitude_with_cumulative_work() -> None:
    L = 60
    profile = adversarial_profile(L, seed=4)
    cuts = profile.cut_points
    act = np.array([c.activation_bits for c in cuts])
    assert np.all((act >= 1e3) & (act <= 1e6))
    assert act.min() < 1e4 and act.max() > 1e5                        # log-uniform: both ends are reached
    assert np.any(np.diff(act) > 0) and np.any(np.diff(act) < 0)      # far from monotone
    assert [c.gradient_bits for c in cuts] == [c.activation_bits for c in cuts]
    fp = np.array([c.fp_flops for c in cuts])
    bp = np.array([c.bp_flops for c in cuts])
    delta = np.array([c.client_param_bits for c in cuts])
    assert np.all(np.diff(fp) > 0) and np.all(np.diff(delta) > 0)   # cumulative sums of positive blocks
    ratio = bp / fp
    assert np.allclose(ratio, ratio[0], rtol=1e-12) and 1.5 <= ratio[0] <= 2.5    # one BP/FP ratio per profile
    # client memory = 4 × parameter bytes + 16 samples × 4 activation bytes
    memory = np.array([c.client_memory_bytes for c in cuts])
    assert memory == pytest.approx(4 * delta / 8 + 16 * 4 * act / 8, rel=1e-12)
    assert [c.index for c in cuts] == list(range(1, L + 1))
    assert profile.bits_per_value == 32 and profile.input_shape == (3, 32, 32)
    assert profile.memory == {"batch_size": 16, "optimizer": "adam"}


@pytest.mark.parametrize("num_devices", [9, 10])
def test_adversarial_system_pairs_near_tied_twins_with_fixed_server_links(num_devices) -> None:
    system = adversarial_system(num_devices, seed=2, batch_size=8)
    assert (system.batch_size, system.server_flops) == (8, 5e12)
    assert (system.edge_to_fed_bps, system.fed_to_edge_bps) == (5e8, 5e8)
    assert len(system.devices) == num_devices
    fields = ("flops", "up_bps", "down_bps", "fed_up_bps", "fed_down_bps")
    values = np.array([[getattr(d, f) for f in fields] for d in system.devices])
    half = (num_devices + 1) // 2
    twins = values[half:] / values[:num_devices - half] - 1.0
    assert np.all(np.abs(twins) < 1e-8) and np.any(twins != 0)        # relative 10⁻⁹ apart, not equal
    # log-uniform over [low, 100·low] times a Pareto factor in [1, 10]
    lows = np.array([1e10, 1e6, 1e7, 1e6, 1e7])
    assert np.all(values >= lows * (1 - 1e-7)) and np.all(values <= 1000 * lows * (1 + 1e-7))
    assert all(d.memory_bytes is None for d in system.devices)


def test_adversarial_memory_budgets_lie_in_the_asked_range_and_reach_the_problem() -> None:
    system = adversarial_system(30, seed=5, memory_bytes=(3e6, 3e8))
    budgets = np.array([d.memory_bytes for d in system.devices])
    assert np.all((budgets >= 3e6) & (budgets <= 3e8)) and budgets.min() < 3e7 < budgets.max()
    problem = adversarial_problem(30, 8, seed=5, memory_bytes=(3e6, 3e8))
    assert problem.latency.system == system
    assert problem.latency.profile == adversarial_profile(8, seed=5)
    need = np.array([c.client_memory_bytes for c in problem.latency.profile.cut_points])
    assert np.array_equal(problem.admissible, need[None, :] <= budgets[:, None])   # the budgets bite on some cuts
    assert problem.admissible.any() and not problem.admissible.all()
    assert list(problem.candidates) == list(range(1, 8))
    assert problem.convergence.constants.sigma2 == pytest.approx((0.5 * 30 / 8,) * 8)
    assert adversarial_problem(30, 8, seed=5).admissible is None


def test_adversarial_profile_block_sizes_are_lognormal_around_their_scales_and_one_ratio_per_profile() -> None:
    """ρ and δ grow by log-normal(0, 1) blocks of median 2·10⁷ FLOPs and 10⁶ bits; ϖ/ρ ~ U[1.5, 2.5]."""
    profile = adversarial_profile(400, seed=9)
    for values, scale in (([c.fp_flops for c in profile.cut_points], 2e7),
                          ([c.client_param_bits for c in profile.cut_points], 1e6)):
        blocks = np.diff(np.concatenate([[0.0], values]))
        logs = np.log(blocks / scale)
        assert abs(np.median(logs)) < 0.25 and 0.8 < logs.std() < 1.2      # log-normal(0, 1) around the scale
    ratios = [adversarial_profile(3, seed).cut_points[0].bp_flops / adversarial_profile(3, seed).cut_points[0].fp_flops
              for seed in range(40)]
    assert all(1.5 <= r <= 2.5 for r in ratios) and min(ratios) < 1.6 and max(ratios) > 2.4


def test_adversarial_resources_are_log_uniform_over_two_decades_with_a_capped_pareto_tail() -> None:
    """value/low = U(1, 100) log-uniform × min(1 + Pareto(1.2), 10): some values stay below 10·low,
    none pass 1000·low, and P(value > 100·low) = 0.17 (0.10 for a Pareto exponent of 2.2)."""
    system = adversarial_system(4000, seed=1)
    fields = ("flops", "up_bps", "down_bps", "fed_up_bps", "fed_down_bps")
    lows = np.array([1e10, 1e6, 1e7, 1e6, 1e7])
    ratio = np.array([[getattr(d, f) for f in fields] for d in system.devices])[:2000] / lows   # the base half
    assert np.all(ratio >= 1.0) and np.all(ratio <= 1000.0)
    assert np.all((ratio < 10).mean(axis=0) > 0.2)
    assert 0.14 < (ratio > 100).mean() < 0.20
