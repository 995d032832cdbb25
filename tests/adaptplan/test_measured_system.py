"""adaptplan.measured_system: a system fitted to measured stage seconds, against rates worked out by hand (work the
latency model counted / seconds measured, the median over rounds), its edges (nothing simulated, a stage no resource
times, an unknown field, a hostile file) and `adaptplan plan --system-from RUN`."""

from __future__ import annotations

import json

import pytest

from adaptplan.cli import main
from adaptplan.errors import InputError
from adaptplan.measured_system import MeasuredRates, resource_of, run_measured_system, value_of
from adaptplan.system import DeviceSpec, SystemSpec


def system(up: float = 2e6) -> SystemSpec:
    devices = (DeviceSpec(1e9, up, 4e6, 8e6, 8e6), DeviceSpec(2e9, 1e6, 3e6, 6e6, 5e6))
    return SystemSpec(16, 1e10, 1e7, 2e7, devices)


def test_each_stage_of_each_role_is_timed_by_its_field_of_the_system() -> None:
    assert [resource_of("1", s) for s in ("device FP", "device BP", "uplink", "downlink", "model upload",
                                           "model download", "server")] == [
        "devices[1].flops", "devices[1].flops", "devices[1].up_bps", "devices[1].down_bps", "devices[1].fed_up_bps",
        "devices[1].fed_down_bps", None]
    assert [resource_of("edge", s) for s in ("server", "model upload", "model download", "uplink")] == [
        "server_flops", "edge_to_fed_bps", "fed_to_edge_bps", None]
    assert value_of(system(), "devices[1].fed_down_bps") == 5e6 and value_of(system(), "fed_to_edge_bps") == 2e7
    with pytest.raises(InputError, match=r"^measured_system: 'devices\[1\]\.speed' is not a field of a system$") as caught:
        value_of(system(), "devices[1].speed")
    assert caught.value.field == "measured_system"


def test_a_rate_is_the_work_counted_over_the_seconds_measured_and_the_fit_their_median() -> None:
    rates = MeasuredRates()
    # round 1: device 0 sent 0.5 s worth of bits at 2 Mbit/s (1 Mbit) in 0.8 s measured; FP 0.1 s + BP 0.2 s of
    # 1 GFLOP/s work (3e8 FLOPs) took 0.2 + 0.4 s; the edge's server stage 0.05 s at 10 GFLOP/s took 0.25 s
    rates.add_round(system(), {"uplink": {"0": 0.5}, "device FP": {"0": 0.1}, "device BP": {"0": 0.2},
                               "server": {"edge": 0.05}},
                    {"uplink": {"0": 0.8}, "device FP": {"0": 0.2}, "device BP": {"0": 0.4}, "server": {"edge": 0.25}})
    assert rates.rates == {"devices[0].up_bps": [pytest.approx(1e6 / 0.8)], "devices[0].flops": [pytest.approx(5e8)],
                           "server_flops": [pytest.approx(2e9)]}
    # rounds 2 and 3 under a system with another up rate: the work is that round's s_pred × its value
    rates.add_round(system(up=4e6), {"uplink": {"0": 0.25}}, {"uplink": {"0": 0.5}})      # 1 Mbit in 0.5 s
    rates.add_round(system(), {"uplink": {"0": 0.5}}, {"uplink": {"0": 10.0}})            # a round the OS stalled
    assert rates.rates["devices[0].up_bps"] == pytest.approx([1.25e6, 2e6, 1e5])
    fitted = rates.fitted(system())
    assert fitted.devices[0].up_bps == pytest.approx(1.25e6)                              # the median, not the mean
    assert fitted.devices[0].flops == pytest.approx(5e8) and fitted.server_flops == pytest.approx(2e9)
    assert fitted.devices[1] == system().devices[1] and fitted.edge_to_fed_bps == 1e7    # nothing measured: kept
    rows = {r["field"]: r for r in rates.table(system())}
    assert rows["devices[0].up_bps"]["ratio"] == pytest.approx(1.25e6 / 2e6) and rows["devices[0].up_bps"]["rounds"] == 3
    assert [r["field"] for r in rates.table(system())] == ["server_flops", "devices[0].flops", "devices[0].up_bps"]


def test_a_stage_not_simulated_or_not_measured_adds_no_rate() -> None:
    rates = MeasuredRates()
    rates.add_round(system(), {"uplink": {"0": 0.0}, "downlink": {"1": 0.3}},
                    {"uplink": {"0": 0.4}, "downlink": {"1": 0.0}, "server": {"3": 1.0}})
    assert rates.rates == {}


def test_rates_round_trip_and_a_hostile_table_is_one_message_naming_the_field() -> None:
    rates = MeasuredRates({"devices[1].down_bps": [3e6, 2.5e6], "fed_to_edge_bps": [1e7]})
    assert MeasuredRates.from_json(json.loads(json.dumps(rates.to_json()))) == rates
    for bad, field in [([], "measured_rates"), ({"devices[0].memory_bytes": [1.0]}, "measured_rates"),
                       ({"server_flops": [0.0]}, "measured_rates.server_flops"),
                       ({"server_flops": [True]}, "measured_rates.server_flops"),
                       ({"server_flops": [2e9, -1.0]}, "measured_rates.server_flops"),      # one bad value of two
                       ({"server_flops": []}, "measured_rates.server_flops")]:
        with pytest.raises(InputError) as caught:
            MeasuredRates.from_json(bad)
        assert caught.value.field == field
    with pytest.raises(InputError, match="names device 7, but the system has 2 devices"):
        MeasuredRates({"devices[7].flops": [1.0]}).fitted(system())


def write_run(folder, measured: dict | None) -> None:
    folder.mkdir()
    meta = {"config": {}} if measured is None else {"config": {}, "measured_system": measured}
    (folder / "history.json").write_text(json.dumps({"meta": meta, "events": [], "records": []}))


def test_plan_system_from_a_run_plans_on_the_fitted_system(tmp_path, capsys) -> None:
    measured = {"base": system().to_json(), "rates": {"devices[0].up_bps": [1e5, 2e5, 3e5]}}
    write_run(tmp_path / "run", measured)
    fitted, _ = run_measured_system(str(tmp_path / "run"))
    assert fitted.devices[0].up_bps == 2e5 and fitted.devices[1] == system().devices[1]
    assert main(["plan", "--system-from", str(tmp_path / "run"), "--json"]) == 0
    from_run = json.loads(capsys.readouterr().out)
    fitted.save(tmp_path / "fitted.json")
    assert main(["plan", "--system", str(tmp_path / "fitted.json"), "--json"]) == 0
    from_file = json.loads(capsys.readouterr().out)
    for plan in (from_run, from_file):
        plan["solver"].pop("seconds")
    assert from_file == from_run                                                 # the same as the file it fits
    assert main(["plan", "--system-from", str(tmp_path / "run")]) == 0
    assert "the system measured by" in capsys.readouterr().out


@pytest.mark.parametrize(("make", "flags", "text"), [
    (None, [], "holds no history.json"),
    ({}, [], "measured nothing: only a run of processes"),
    ({"base": {"devices": []}, "rates": {}}, [], "meta.measured_system.base is not a system"),
    ({"base": system().to_json(), "rates": {"devices[0].up_bps": [1.0]}}, ["--system", "x.json"], "drop --system"),
])
def test_plan_system_from_a_run_that_measured_nothing_is_one_line(tmp_path, capsys, make, flags, text) -> None:
    if make is not None:
        write_run(tmp_path / "run", make or None)
    assert main(["plan", "--system-from", str(tmp_path / "run"), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and text in err[0], err
