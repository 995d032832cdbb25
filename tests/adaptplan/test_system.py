"""The system generator and the per-round process against the literal placeholder values of
docs/model.md §6.1 [P]: f_i ~ U[0.5, 1.5] TFLOPS, f_s = 50 TFLOPS, r^U, r^{fU} ~ U[70, 80] Mbps,
r^D, r^{fD} ~ U[350, 380] Mbps, r_{e→f} = r_{f→e} = 500 Mbps, b = 16; device FLOP/s and device uplink
rates (to the edge server and to the fed server) are re-drawn every round, nothing else."""

from dataclasses import replace

import numpy as np
import pytest

from adaptplan.errors import InputError
from adaptplan.fileio import positive_number
from adaptplan.system import DEVICE_FIELDS, SystemProcess, SystemRanges, SystemSpec, generate_system, with_memory_budgets

SPEC_RANGES = {"flops": (0.5e12, 1.5e12), "up_bps": (70e6, 80e6), "fed_up_bps": (70e6, 80e6),
               "down_bps": (350e6, 380e6), "fed_down_bps": (350e6, 380e6)}
REDRAWN = {"flops", "up_bps", "fed_up_bps"}


def _assert_spans(values, low, high, name):
    """Inside [low, high] and spread over it (200 uniform draws come within 5 % of both ends)."""
    assert values.min() >= low and values.max() <= high, name
    width = high - low
    assert values.min() < low + 0.05 * width and values.max() > high - 0.05 * width, name


def test_default_ranges_are_the_spec_placeholders():
    ranges = SystemRanges()
    assert ranges.device_flops == (0.5e12, 1.5e12)
    assert ranges.up_bps == (70e6, 80e6)
    assert ranges.down_bps == (350e6, 380e6)
    assert ranges.server_flops == 50e12
    assert ranges.edge_fed_bps == 500e6
    assert ranges.batch_size == 16


def test_every_generated_field_is_drawn_from_its_own_range():
    system = generate_system(200, seed=4)
    assert system.num_devices == 200
    for name, (low, high) in SPEC_RANGES.items():
        _assert_spans(system.device_array(name), low, high, name)
    assert system.server_flops == 50e12 and system.batch_size == 16
    assert system.edge_to_fed_bps == 500e6 and system.fed_to_edge_bps == 500e6
    # independent draws: no field copies another one
    assert not np.allclose(system.device_array("up_bps"), system.device_array("fed_up_bps"))
    assert not np.allclose(system.device_array("down_bps"), system.device_array("fed_down_bps"))


def test_custom_ranges_reach_every_field():
    ranges = SystemRanges(device_flops=(1e9, 2e9), up_bps=(1e3, 2e3), down_bps=(1e6, 2e6), server_flops=7e12,
                          edge_fed_bps=3e6, batch_size=5)
    system = generate_system(200, seed=1, ranges=ranges)
    _assert_spans(system.device_array("flops"), 1e9, 2e9, "flops")
    for name in ("up_bps", "fed_up_bps"):
        _assert_spans(system.device_array(name), 1e3, 2e3, name)
    for name in ("down_bps", "fed_down_bps"):
        _assert_spans(system.device_array(name), 1e6, 2e6, name)
    assert (system.server_flops, system.edge_to_fed_bps, system.fed_to_edge_bps, system.batch_size) == (7e12, 3e6, 3e6, 5)


def test_generator_is_seeded():
    assert generate_system(10, seed=3) == generate_system(10, seed=3)
    assert generate_system(10, seed=3) != generate_system(10, seed=4)


@pytest.mark.parametrize("kwargs, field", [({"up_bps": (80e6, 70e6)}, "up_bps"), ({"device_flops": (0, 1)}, "device_flops"),
                                           ({"server_flops": 0}, "server_flops"), ({"edge_fed_bps": -1}, "edge_fed_bps"),
                                           ({"batch_size": 0}, "batch_size"), ({"down_bps": (2.0, 1.0)}, "down_bps")])
def test_ranges_are_validated(kwargs, field):
    with pytest.raises(InputError, match=field):
        SystemRanges(**kwargs)
    for bad in (0, 2.5):
        with pytest.raises(InputError, match="devices: must be an integer ≥ 1"):
            generate_system(bad, seed=0)


def test_per_round_redraw_changes_exactly_flops_and_uplinks():
    base = generate_system(200, seed=0)
    process = SystemProcess(base, seed=7, redraw=True)
    previous = base
    for round_index in (1, 2, 3):
        state = process.state(round_index)
        assert state == process.state(round_index)  # deterministic in (seed, round)
        for name in DEVICE_FIELDS:
            now, before = state.device_array(name), previous.device_array(name)
            if name in REDRAWN:
                assert np.all(now != before), name           # every device re-drawn …
                _assert_spans(now, *SPEC_RANGES[name], name)  # … from its own range
            else:
                assert np.array_equal(now, base.device_array(name)), name
        assert (state.server_flops, state.edge_to_fed_bps, state.fed_to_edge_bps, state.batch_size) == \
            (base.server_flops, base.edge_to_fed_bps, base.fed_to_edge_bps, base.batch_size)
        assert not np.allclose(state.device_array("up_bps"), state.device_array("fed_up_bps"))
        previous = state
    assert SystemProcess(base, seed=7, redraw=False).state(5) == base
    assert SystemProcess(base, seed=8, redraw=True).state(1) != process.state(1)


@pytest.mark.parametrize("seed, round_index", [(0, 1), (7, 2), (7, 40), (123, 9)])
def test_a_rounds_redraw_is_one_scalar_draw_after_the_other(seed, round_index):
    """The reference written out: per device, in device order, flops then up_bps then fed_up_bps, each a scalar
    uniform draw from the round's own stream; every other field (the memory budget too) stays the base's."""
    base = with_memory_budgets(generate_system(37, seed=seed), (1e6, 1e9), seed=seed)
    ranges = SystemRanges(device_flops=(0.2e12, 3e12), up_bps=(10e6, 90e6))
    rng = np.random.default_rng([seed, round_index])
    expected = tuple(replace(d, flops=float(rng.uniform(*ranges.device_flops)), up_bps=float(rng.uniform(*ranges.up_bps)),
                             fed_up_bps=float(rng.uniform(*ranges.up_bps))) for d in base.devices)
    state = SystemProcess(base, seed=seed, redraw=True, ranges=ranges).state(round_index)
    assert state.devices == expected and all(type(d.flops) is float for d in state.devices)
    assert replace(state, devices=base.devices) == base


VALUES = [1e-30, 1e30, 1, 5.0, np.float64(5.0), 2 ** 200, 0.99e-30, 0.0, -0.0, -3.0, float("nan"), float("inf"), True, "5"]


@pytest.mark.parametrize("field, value", [("up_bps", v) for v in VALUES + [None]] + [("memory_bytes", v) for v in VALUES])
def test_a_systems_check_accepts_and_names_exactly_what_the_per_field_check_does(value, field):
    base = with_memory_budgets(generate_system(3, seed=0), (1e6, 1e9), seed=0)
    devices = list(base.devices)
    devices[2] = replace(devices[2], **{field: value})
    unit = "bytes" if field == "memory_bytes" else "bit/s"
    try:
        positive_number(value, f"system.devices[2].{field}", unit)
    except InputError as error:
        with pytest.raises(InputError) as raised:
            SystemSpec(base.batch_size, base.server_flops, base.edge_to_fed_bps, base.fed_to_edge_bps, tuple(devices))
        assert str(raised.value) == str(error)
    else:
        assert SystemSpec(base.batch_size, base.server_flops, base.edge_to_fed_bps, base.fed_to_edge_bps,
                          tuple(devices)).devices[2] == devices[2]


def test_memory_budgets_on_some_devices_only_are_refused_whichever_device_lacks_one():
    base = with_memory_budgets(generate_system(3, seed=0), (1e6, 1e9), seed=0)
    for given, message in (((1, 0, 1), "device 1 lacks it"), ((0, 1, 0), "device 1 has it but device 0 does not")):
        devices = tuple(d if keep else replace(d, memory_bytes=None) for d, keep in zip(base.devices, given))
        with pytest.raises(InputError, match=message):
            replace(base, devices=devices)


def test_measurement_noise_touches_every_rate_but_not_the_truth():
    base = generate_system(400, seed=2)
    process = SystemProcess(base, seed=3, redraw=False, noise_cv=0.1)
    assert SystemProcess(base, seed=3, noise_cv=0.0).measured(4) == base
    seen, truth = process.measured(4), process.state(4)
    assert truth == base and seen == process.measured(4)
    for name in DEVICE_FIELDS:
        ratio = seen.device_array(name) / truth.device_array(name)
        assert abs(ratio.mean() - 1) < 0.03 and 0.07 < ratio.std() < 0.13, name
    for name in ("server_flops", "edge_to_fed_bps", "fed_to_edge_bps"):
        assert getattr(seen, name) != getattr(truth, name) and getattr(seen, name) > 0, name
    assert seen.batch_size == truth.batch_size
    with pytest.raises(InputError, match="noise_cv"):
        SystemProcess(base, noise_cv=-0.1)


def test_a_degenerate_range_is_a_constant():
    ranges = SystemRanges(up_bps=(75e6, 75e6), device_flops=(1e12, 1e12))
    system = generate_system(5, seed=0, ranges=ranges)
    assert set(system.device_array("up_bps")) == {75e6} and set(system.device_array("fed_up_bps")) == {75e6}
    assert set(system.device_array("flops")) == {1e12}


def test_the_default_scenario_is_20_devices_drawn_with_seed_0():
    from adaptplan.scenarios import default_scenario

    scenario = default_scenario()
    assert scenario.system == generate_system(20, 0)
    assert "20 devices (seed 0)" in scenario.name
