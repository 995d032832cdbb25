"""`adaptplan bench plans`: time to target interpolated between evaluations, the grid of plans and its jobs, the
latency-best cuts, the planner's rank and ratio, and one small end-to-end run whose table, JSON and heat-map agree."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace

import numpy as np
import pytest

from adaptplan.benches import plans as bench
from adaptplan.benches.runs import RunResult
from adaptplan.benches.training import ADAPTSFL_SETTING
from adaptplan.cli import main
from adaptplan.defence_cost import DefenceSetting
from adaptplan.latency import LatencyModel
from adaptplan.scenarios import default_profile
from adaptplan.system import generate_system

CURVE = [(1.0, 0.2), (2.0, 0.4), (3.0, 0.6)]     # (simulated s, test accuracy) per evaluation


def test_time_to_target_is_interpolated_between_the_evaluations_around_the_crossing() -> None:
    for curve, target, seconds in [(CURVE, 0.5, 2.5),                      # 2 + (0.5-0.4)/(0.6-0.4)·(3-2)
                                   (CURVE, 0.3, 1.5),                      # 1 + (0.3-0.2)/(0.4-0.2)·(2-1)
                                   ([(0.0, 0.1), (4.0, 0.5)], 0.2, 1.0)]:  # 0 + (0.2-0.1)/(0.5-0.1)·4
        found = bench.time_to_target(curve, target)
        assert found is not None and found.seconds == pytest.approx(seconds, rel=1e-12) and not found.upper_bound
    # the first crossing counts, even after a dip below the target
    dip = bench.time_to_target([(1.0, 0.3), (2.0, 0.2), (3.0, 0.5)], 0.4)
    assert dip is not None and dip.seconds == pytest.approx(2 + 2 / 3) and not dip.upper_bound


def test_a_crossing_exactly_at_an_evaluation_is_that_evaluations_time() -> None:
    assert bench.time_to_target(CURVE, 0.4) == bench.Crossing(2.0)
    assert bench.time_to_target(CURVE, 0.6) == bench.Crossing(3.0)


def test_never_reached_is_none_and_reached_at_the_first_evaluation_is_its_time_as_an_upper_bound() -> None:
    assert bench.time_to_target(CURVE, 0.61) is None
    assert bench.time_to_target([], 0.1) is None
    assert bench.time_to_target(CURVE, 0.2) == bench.Crossing(1.0, upper_bound=True)
    assert bench.time_to_target(CURVE, 0.05) == bench.Crossing(1.0, upper_bound=True)


def _setting(devices: int = 3) -> bench.BenchSetting:
    return bench.BenchSetting(ADAPTSFL_SETTING, dataset="synthetic", model="mlp", devices=devices, eval_every=2)


def test_the_grid_has_every_cut_and_the_latency_best_cuts_for_every_interval_and_the_planner_per_seed(tmp_path) -> None:
    seeds, intervals, cuts = [0, 1], [1, 2, 4], 3
    best = {seed: {1: [1, 2, 3], 2: [1, 1, 3], 4: [1, 1, 1]} for seed in seeds}
    jobs = bench.grid_jobs(_setting(), seeds, range(1, cuts + 1), best, intervals, tmp_path)
    assert len(jobs) == len(seeds) * (cuts * len(intervals) + len(intervals) + 1)
    for seed in seeds:
        mine = [j for j in jobs if j["seed"] == seed]
        planner = [j for j in mine if j["plan"].kind == "planner"]
        assert len(planner) == 1 and "cuts" not in planner[0]["config"] and "interval" not in planner[0]["config"]
        uniform = {(j["config"]["cuts"][0], j["config"]["interval"]) for j in mine if j["plan"].kind == "uniform"}
        assert uniform == {(c, i) for c in range(1, cuts + 1) for i in intervals}
        assert all(j["config"]["cuts"] == [j["plan"].cut] * 3 for j in mine if j["plan"].kind == "uniform")
        latency = {j["config"]["interval"]: j["config"]["cuts"] for j in mine if j["plan"].kind == "latency-best"}
        assert latency == best[seed]
        assert all(j["config"]["seed"] == seed and j["config"]["algorithm"] == "adaptsfl" for j in mine)
        assert len({j["label"] for j in mine}) == len(mine)
    assert len({j["folder"] for j in jobs}) == len(jobs)
    # one training setting for every plan: the configs differ only in cuts, interval and seed
    plain = [{k: v for k, v in j["config"].items() if k not in ("cuts", "interval", "seed")} for j in jobs]
    assert all(p == plain[0] for p in plain)


def test_under_a_defence_every_plan_trains_it_and_the_planners_see_its_cost(tmp_path) -> None:
    """--defence: every job's configuration carries the setting (and none of it without one), and the probe the
    planners plan on charges its FLOPs per sample at every interior cut (eqs. 16, 21)."""
    defended = replace(_setting(), defence="nopeek=0.5")
    best = {0: {1: [1, 1, 1]}}
    plain_jobs = bench.grid_jobs(_setting(), [0], [1, 2, 3], best, [1], tmp_path)
    jobs = bench.grid_jobs(defended, [0], [1, 2, 3], best, [1], tmp_path)
    assert all(j["config"]["nopeek"] == 0.5 and j["config"]["activation_clip"] == 0.0 for j in jobs)
    assert all("nopeek" not in j["config"] for j in plain_jobs)
    assert [{k: v for k, v in j["config"].items() if k not in DefenceSetting().config()} for j in jobs] == \
        [j["config"] for j in plain_jobs]
    charged, plain = bench.probe(defended, 0, [1]).profile, bench.probe(_setting(), 0, [1]).profile
    assert all(c.defence_fp_flops > 0 for c in charged.cut_points[:-1])
    assert all(c.defence_fp_flops is None for c in plain.cut_points)
    assert "every device defending its activations: nopeek=0.5" in defended.describe([0])[0]
    assert main(["bench", "plans", "--defence", "noise=1", "--out", str(tmp_path / "never")]) == 2
    assert not (tmp_path / "never").exists()                    # refused before anything is written


def test_under_a_u_shaped_split_the_grid_pilots_and_latency_best_cuts_keep_a_block_before_the_head(tmp_path) -> None:
    """--defence head=K: the grid trains cuts 1..L − K − 1 only (a deeper one is refused by every run), the calibrated
    planner's pilots sit at the deepest of them, and each device's latency-best cut is the brute-force argmin among
    them; the probe's profile charges the head (adaptplan.defence_cost.with_head_on_device)."""
    shaped = replace(_setting(), defence="head=1")
    assert shaped.head == 1 and _setting().head == 0
    profile, system = default_profile(), generate_system(6, 1)
    L = profile.num_cuts
    assert shaped.allowed_cuts(profile) == list(range(1, L - 1)) and _setting().allowed_cuts(profile) == \
        list(range(1, L + 1))
    jobs = bench.grid_jobs(shaped, [0], bench.grid_cuts(4, 1), {0: {1: [1, 2, 1], 2: [1, 1, 1]}}, [1, 2], tmp_path)
    assert sorted({j["config"]["cuts"][0] for j in jobs if j["plan"].kind == "uniform"}) == [1, 2]
    assert all(j["config"]["u_shaped"] == 1 for j in jobs)
    assert [p.cut for p in bench.pilot_plans([1, 2], 4, [2, 1], 3)] == [2, 2] and \
        [p.cut for p in bench.pilot_plans([1, 2, 3, 4], 4, [1], 3)] == [3]
    model = LatencyModel(profile, system)
    for interval in (1, 8):
        found = bench.latency_best_cuts(model, interval, [1, 2])
        for i, device in enumerate(system.devices):
            alone = LatencyModel(profile, replace(system, devices=(device,)))
            per_round = [alone.t_split([j]) + alone.t_agg([j]) / interval for j in (1, 2)]
            assert found[i] == 1 + min(range(2), key=per_round.__getitem__)
    probed = bench.probe(shaped, 0, [1, 8])
    assert probed.profile.cut_points[0].fp_flops > bench.probe(_setting(), 0, [1]).profile.cut_points[0].fp_flops
    # the mlp's 3 blocks leave cut 1; at I = 8 the charged profile's cut 3 (the whole model on the device) would be
    # each device's latency-best among every cut
    assert probed.latency_best == {1: [1, 1, 1], 8: [1, 1, 1]}
    assert bench.latency_best_cuts(LatencyModel(probed.profile, probed.system), 8) == [3, 3, 3]


def _hand_per_round(profile, device, server_flops, batch, cut, interval) -> float:
    """One device's T_split + T_agg / I at cut ``cut`` (1-based), written out from docs/model.md eqs. (16)–(25)."""
    j = cut - 1
    b, f = batch, device.flops
    split = (b * profile.rho[j] / f + b * profile.psi[j] / device.up_bps + b * (profile.rho[-1] - profile.rho[j])
             / server_flops + b * profile.server_bp[j] / server_flops + b * profile.chi[j] / device.down_bps
             + b * profile.varpi[j] / f)
    return split + (profile.delta[j] / device.fed_up_bps + profile.delta[j] / device.fed_down_bps) / interval


@pytest.mark.parametrize("seed", [0, 3])
def test_the_latency_best_cut_is_the_brute_force_argmin_of_each_devices_latency(seed) -> None:
    profile, system = default_profile(), generate_system(6, seed)
    model = LatencyModel(profile, system)
    seen = set()
    for interval in (1, 2, 8, 1000):
        found = bench.latency_best_cuts(model, interval)
        seen.add(tuple(found))
        for i, device in enumerate(system.devices):
            alone = LatencyModel(profile, replace(system, devices=(device,)))
            per_round = [alone.t_split([j]) + alone.t_agg([j]) / interval for j in range(1, profile.num_cuts + 1)]
            by_hand = [_hand_per_round(profile, device, system.server_flops, system.batch_size, j, interval)
                       for j in range(1, profile.num_cuts + 1)]
            assert np.allclose(per_round, by_hand, rtol=1e-12)
            assert found[i] == 1 + min(range(len(per_round)), key=per_round.__getitem__)
    assert len(seen) > 1       # the aggregation's share moves the best cut as I grows


def _run(label: str, times: list[float] | None, rounds: int = 10) -> RunResult:
    """A run whose accuracy crosses 0.5 exactly at ``times[0]`` (None: stays at 0.1)."""
    curve = [(0.5 * times[0], 0.25), (times[0], 0.5)] if times else [(1.0, 0.1), (2.0, 0.1)]
    reached = times[0] if times else None
    return RunResult("plans", label, rounds, curve[-1][1], curve[-1][0], 1.0, reached, 4 if times else None,
                     None, None, None, curve)


def _result(plan: bench.PlanSpec, seconds: list[float | None]) -> bench.PlanResult:
    return bench.PlanResult(plan, {seed: _run(plan.label, None if s is None else [s])
                                   for seed, s in enumerate(seconds)}, 0.5)


def test_rank_and_ratio_against_a_hand_made_set_of_results() -> None:
    planner = bench.PlanSpec("planner")
    a, b = bench.PlanSpec("uniform", 1, 1, (1, 1)), bench.PlanSpec("uniform", 2, 2, (2, 2))
    c, d = bench.PlanSpec("latency-best", 1, None, (1, 2)), bench.PlanSpec("latency-best", 2, None, (1, 1))
    results = [_result(planner, [2.0, 4.0]), _result(a, [1.0, 1.0]), _result(b, [3.0, 3.0]),
               _result(c, [0.5, None]), _result(d, [5.0, 6.0])]
    results[0].predictions = {0: bench.Prediction([1, 2], 4, 100, 7.5), 1: bench.Prediction([1, 2], 4, 100, 7.5)}
    mine = bench.standing(results[0], results)
    assert mine == bench.Standing(rank=2, of=5, ratio=3.0, best="cut 1, I=1")       # means 3 vs 1 (and 3 ties 3)
    assert bench.standing(results[1], results) == bench.Standing(1, 5, 1.0, "cut 1, I=1")
    assert bench.standing(results[4], results).rank == 4
    assert bench.standing(results[3], results).rank is None        # missed seed 1: no mean, no rank
    text = bench.table(results, _setting(2), [0, 1])
    row = next(line for line in text.splitlines() if line.startswith("planner "))
    assert "2 of 5" in row and "3.00" in row and "1,2" in row and "7.5" in row and "100" in row
    assert "2–4" in row                                                    # the spread, min–max
    assert "not reached in seed 1: target 50% not reached within 10 rounds" in text
    assert text.splitlines()[-1].startswith("planner: rank 2 of 5, 3.00× the best fixed plan (cut 1, I=1: 1 s)")
    assert "linearly interpolated" in text and "every method: SGD" in text
    data = bench.to_json(results, _setting(2), [0, 1], [1, 2])
    assert data["planner"] == {"rank": 2, "of": 5, "ratio_to_best_fixed": 3.0, "best_fixed": "cut 1, I=1"}
    assert data["plans"][0]["predictions"]["0"] == {"cuts": [1, 2], "interval": 4, "rounds": 100, "latency_s": 7.5,
                                                    "calibrated": False, "constants": None}


def test_an_upper_bound_is_marked_and_no_fixed_plan_reaching_leaves_the_ratio_empty() -> None:
    planner = bench.PlanSpec("planner")
    a = bench.PlanSpec("uniform", 1, 1, (1, 1))
    first = bench.PlanResult(planner, {0: replace(_run("planner", [1.0]), curve=[(1.0, 0.9)])}, 0.5)
    results = [first, _result(a, [None])]
    assert first.upper_bound and first.mean_s == 1.0
    assert bench.standing(first, results) == bench.Standing(1, 2, None, None)
    row = next(line for line in bench.table(results, _setting(2), [0]).splitlines() if line.startswith("planner "))
    assert "≤1" in row


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory) -> tuple:
    """One end-to-end `bench plans` (mlp, 2 devices, I = 1, 2, seed 0): its folder and what it printed."""
    import contextlib
    import io

    out = tmp_path_factory.mktemp("bench-plans") / "bench"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["bench", "plans", "--dataset", "synthetic", "--model", "mlp", "--devices", "2", "--intervals",
                     "1,2", "--seeds", "0", "--rounds", "4", "--eval-every", "2", "--test-samples", "200",
                     "--target-accuracy", "0.3", "--workers", "1", "--out", str(out)]) == 0
    return out, printed.getvalue()


def _alone() -> tuple:
    """The bench's probe of seed 0 and each (I, cut vector)'s seconds per round on its system."""
    alone = bench.probe(bench.BenchSetting(ADAPTSFL_SETTING, dataset="synthetic", model="mlp", devices=2,
                                           test_samples=200), 0, [1, 2])
    model = bench.LatencyModel(alone.profile, alone.system)
    per_round = {(I, cuts): model.t_split(cuts) + model.t_agg(cuts) / I
                 for I in (1, 2) for cuts in itertools.product((1, 2, 3), repeat=2)}
    return alone, model, per_round


def test_bench_plans_end_to_end_table_json_and_heat_map_agree(bench_run) -> None:
    out, text = bench_run
    assert (out / "table.txt").read_text() == text
    assert (out / "heatmap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((out / "results.json").read_text())
    labels = [p["label"] for p in data["plans"]]
    assert labels == ["planner", "cut 1, I=1", "cut 1, I=2", "cut 2, I=1", "cut 2, I=2", "cut 3, I=1", "cut 3, I=2",
                      "latency-best, I=1", "latency-best, I=2", "calibrated planner",
                      "calibrated, linear in I", "calibrated, linear per cut"]   # mlp: 3 cut points
    rows = {line.split("  ")[0].strip(): line for line in text.splitlines() if line.split("  ")[0].strip() in labels}
    assert set(rows) == set(labels)
    history = json.loads((out / "runs" / "seed0" / "planner" / "history.json").read_text())
    event = history["events"][0]
    planner = data["plans"][0]
    assert planner["predictions"]["0"] == {"cuts": event["cuts"], "interval": event["interval"],
                                           "rounds": event["plan"]["rounds"],
                                           "latency_s": event["plan"]["total_latency_s"], "calibrated": False,
                                           "constants": None}
    assert f"{event['plan']['total_latency_s']:.3g}" in rows["planner"] and str(event["plan"]["rounds"]) in rows["planner"]
    evaluated = [(r["sim_seconds"], r["accuracy"]) for r in history["records"] if r["accuracy"] is not None]
    run = planner["runs"][0]
    assert run["curve"] == [list(p) for p in evaluated]
    crossing = bench.time_to_target(evaluated, 0.3)
    assert run["time_to_target_s"] == (crossing.seconds if crossing else None)
    for plan in data["plans"]:
        mean = plan["mean_time_to_target_s"]
        row = rows[plan["label"]]
        assert (f"{mean:.3g}" in row) if mean is not None else plan["not_reached"]
        assert plan["rank"] is None or f"{plan['rank']} of 12" in row
    assert data["planner"]["rank"] == planner["rank"] and data["setting"]["rounds"] == 4
    # the calibrated planner: fitted to the grid's runs at cut L - 1 = 2 with the smallest and the largest I
    calibrated = json.loads((out / "runs" / "seed0" / "calibrated" / "history.json").read_text())
    pilots = calibrated["meta"]["calibration"]["pilots"]
    assert [(p["source"], p["deepest_cut"], p["interval"]) for p in pilots] == \
        [(str(out / "runs" / "seed0" / "cut2-I1"), 2, 1), (str(out / "runs" / "seed0" / "cut2-I2"), 2, 2)]
    fit = bench.ConvergenceConstants.from_json(calibrated["meta"]["calibration"]["constants"])
    first = next(p for p in data["plans"] if p["label"] == "cut 1, I=1")
    alone = bench.probe(bench.BenchSetting(ADAPTSFL_SETTING, dataset="synthetic", model="mlp", devices=2,
                                           test_samples=200), 0, [1, 2])
    assert first["fit_by_seed"]["0"] == list(alone.predict(fit, [1, 1], 1))        # the fit scores each fixed plan
    assert first["predicted_over_measured"] == pytest.approx(first["fit_by_seed"]["0"][1] / first["mean_time_to_target_s"])
    event = calibrated["events"][0]["plan"]
    assert data["plans"][-3]["predictions"]["0"]["latency_s"] == event["total_latency_s"]
    assert data["calibrated"]["rank"] == data["plans"][-3]["rank"]
    # the planner linear in I: R(I) = R1 (1 + κ (I − 1)) through the same two pilots, read back and written out here
    from trainers.run.pilots import read_pilot
    measured = [read_pilot(out / "runs" / "seed0" / name, 0.3).rounds for name in ("cut2-I1", "cut2-I2")]
    slope = max(measured[1] - measured[0], 0.0)
    law = lambda interval: measured[0] + slope * (interval - 1) if slope > 0 else sum(measured) / 2  # noqa: E731
    per_round = {(I, cuts): alone_model.t_split(cuts) + alone_model.t_agg(cuts) / I
                 for alone_model in [bench.LatencyModel(alone.profile, alone.system)]
                 for I in (1, 2) for cuts in itertools.product((1, 2), repeat=2)}
    best = min(per_round, key=lambda key: (law(key[0]) * per_round[key], key[0]))
    linear = data["plans"][-2]
    assert (linear["interval_by_seed"]["0"], tuple(linear["cuts_by_seed"]["0"])) == (best[0], best[1]) or \
        law(linear["interval_by_seed"]["0"]) * per_round[(linear["interval_by_seed"]["0"],
                                                           tuple(linear["cuts_by_seed"]["0"]))] == \
        pytest.approx(law(best[0]) * per_round[best])                               # a tie between cut vectors
    trained = json.loads((out / "runs" / "seed0" / "linear" / "history.json").read_text())["meta"]["config"]
    assert trained["interval"] == linear["interval_by_seed"]["0"] and trained["cuts"] == linear["cuts_by_seed"]["0"]
    rounds = math.ceil(law(1))
    model = bench.LatencyModel(alone.profile, alone.system)
    assert first["linear_fit_by_seed"]["0"] == [rounds, pytest.approx(rounds * model.t_split([1, 1])
                                                                      + rounds * model.t_agg([1, 1]))]
    assert data["linear"]["rank"] == linear["rank"] and "(to ε)" not in rows["calibrated, linear in I"]
    assert "(to ε)" in rows["planner"] and "(to ε)" not in rows["calibrated planner"]
    said = {line.split(":")[0]: line for line in text.splitlines() if ": rank " in line}
    assert said["calibrated planner"].endswith(
        f"it predicted {event['rounds']} rounds, {event['total_latency_s']:.3g} s to the target (mean over seeds, "
        "calibrated)")
    assert "not to the target" in said["planner"]


def test_bench_plans_planner_per_cut_end_to_end(bench_run) -> None:
    """The planner per cut of the same bench: every cut's run at I = 1, the fastest of them at I = 2 too (its own
    line), written out here; its plan trained and scored, every fixed plan its pilots cover scored by its law."""
    from trainers.run.pilots import read_pilot

    out, _ = bench_run
    data = json.loads((out / "results.json").read_text())
    alone, model, per_round = _alone()
    first = next(p for p in data["plans"] if p["label"] == "cut 1, I=1")
    by_label = {p["label"]: p for p in data["plans"]}
    at_one = {j: read_pilot(out / "runs" / "seed0" / f"cut{j}-I1", 0.3).rounds for j in (1, 2, 3)
              if by_label[f"cut {j}, I=1"]["runs"][0]["time_to_target_s"] is not None}
    fastest = min(at_one, key=lambda j: by_label[f"cut {j}, I=1"]["runs"][0]["time_to_target_s"])
    at_two = read_pilot(out / "runs" / "seed0" / f"cut{fastest}-I2", 0.3).rounds
    own = {1: at_one, 2: {fastest: at_two if at_two > at_one[fastest] else (at_two + at_one[fastest]) / 2}}
    if at_two <= at_one[fastest]:
        own[1] = {**at_one, fastest: own[2][fastest]}          # no cost of I = 2: the mean at both
    per_cut = data["plans"][-1]
    cuts, interval = tuple(per_cut["cuts_by_seed"]["0"]), per_cut["interval_by_seed"]["0"]
    value = max(own[interval][c] for c in cuts) * per_round[(interval, cuts)]
    assert set(cuts) <= set(own[interval]) and value == pytest.approx(min(
        max(own[key[0]][c] for c in key[1]) * per_round[key] for key in per_round if set(key[1]) <= set(own[key[0]])))
    mine = out / "runs" / "seed0" / "per_cut"        # the same plan as the linear planner's trains once, in its folder
    trained = json.loads(((mine if mine.exists() else out / "runs" / "seed0" / "linear") / "history.json").read_text())
    assert (trained["meta"]["config"]["interval"], tuple(trained["meta"]["config"]["cuts"])) == (interval, cuts)
    rounds = math.ceil(own[1][1] * (1 - 1e-12)) if 1 in own[1] else None
    assert first["per_cut_fit_by_seed"].get("0") == (None if rounds is None else [rounds, pytest.approx(
        rounds * model.t_split([1, 1]) + rounds * model.t_agg([1, 1]))])
    assert data["per_cut"]["rank"] == per_cut["rank"]




@pytest.mark.parametrize("flags, flag", [
    (["--intervals", "0,2"], "--intervals"), (["--intervals", "a"], "--intervals"),
    (["--intervals", "2,2"], "--intervals"), (["--rounds", "4", "--intervals", "8"], "--intervals"),
    (["--seeds", "x"], "--seeds"), (["--seeds", ""], "--seeds"), (["--local-steps", "2"], "--local-steps"),
    (["--partition", "noniid"], "--partition"), (["--dataset", "nope"], "--dataset"),
    (["--plot", "heat.xyz"], "--plot"), (["--workers", "0"], "--workers"), (["--defence", "noise=1"], "--defence"),
    (["--defence", "clip=x"], "--defence"), (["--max-leakage", "dcor=0.9"], "--max-leakage"),
    (["--leakage-table", "leak.json"], "--leakage-table"),
])
def test_bad_flags_are_one_line_naming_the_flag_and_exit_2(flags, flag, capsys) -> None:
    assert main(["bench", "plans", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert flag in err and len(err.splitlines()) == 1


def test_the_heat_map_grid_has_a_row_per_cut_and_the_latency_best_row_and_marks_the_planners_cell() -> None:
    planner = bench.PlanSpec("planner")
    fixed = bench.plan_grid([1, 2], [1, 2], {1: [1, 2], 2: [2, 2]})[1:]
    results = [_result(planner, [2.0])] + [_result(p, [float(k + 1)]) for k, p in enumerate(fixed)]
    names, grid = bench.heat_grid(results, [1, 2])
    assert names == ["cut 1", "cut 2", "latency-best"]
    assert grid.tolist() == [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
    results[0].predictions = {0: bench.Prediction([2, 2], 2, 10, 1.0)}
    assert bench.planner_cell(results, [1, 2]) == (1, 1)                # cut 2, I = 2 (the first row that matches)
    results[0].predictions = {0: bench.Prediction([1, 2], 1, 10, 1.0)}
    assert bench.planner_cell(results, [1, 2]) == (2, 0)                # the latency-best cuts of I = 1
    results[0].predictions = {0: bench.Prediction([1, 2], 4, 10, 1.0)}
    assert bench.planner_cell(results, [1, 2]) is None                  # I = 4: not on the grid


def test_the_heat_map_outlines_the_planners_cell_in_red_and_the_calibrated_planners_in_dashed_orange() -> None:
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb

    fixed = bench.plan_grid([1, 2], [1, 2], {1: [1, 2], 2: [2, 2]})[1:]
    results = [_result(bench.PlanSpec("planner"), [2.0]), _result(bench.PlanSpec("calibrated"), [1.5])] + \
        [_result(p, [float(k + 1)]) for k, p in enumerate(fixed)]
    results[0].predictions = {0: bench.Prediction([2, 2], 2, 10, 1.0)}              # cut 2, I = 2
    results[1].predictions = {0: bench.Prediction([1, 1], 1, 10, 1.0, calibrated=True)}   # cut 1, I = 1
    fig = bench.heat_map(results, [1, 2])
    try:
        ax = fig.axes[0]
        boxes = {(p.get_edgecolor()[:3], p.get_linestyle()): (p.get_x() + p.get_width() / 2, p.get_y() + p.get_height() / 2)
                 for p in ax.patches}
        # centres at (column: I = 2 → 1, I = 1 → 0; row: cut 2 → 1, cut 1 → 0)
        assert boxes == {(to_rgb("red"), "solid"): (1.0, 1.0), (to_rgb("orange"), "dashed"): (0.0, 0.0)}
        assert ax.get_title().splitlines() == ["planner (cuts all 2, I = 2; red box): 2 s",
                                               "calibrated planner (cuts all 1, I = 1; orange box): 1.5 s"]
        assert [t.get_text() for t in ax.get_yticklabels()] == ["cut 1", "cut 2", "latency-best"]
    finally:
        plt.close(fig)
    results[1].runs[1] = results[1].runs[0]                                      # a second seed, at I = 9
    results[1].predictions[1] = bench.Prediction([1, 1], 9, 10, 1.0, calibrated=True)
    fig = bench.heat_map(results, [1, 2])
    try:
        ax = fig.axes[0]
        assert ax.get_title().splitlines()[1] == "calibrated planner (cuts all 1, I = 1, 9 by seed; not on the grid): 1.5 s"
        assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2"]
        assert ax.get_xlabel().startswith("aggregation interval I (rounds)") and ax.get_ylabel() == "cut of every device"
    finally:
        plt.close(fig)


def test_the_table_names_the_width_says_why_a_planner_has_no_row_and_a_missing_prediction() -> None:
    planner = bench.PlanSpec("planner")
    a = bench.PlanSpec("uniform", 1, 1, (1, 1))
    results = [_result(planner, [2.0, 4.0]), _result(a, [1.0, 1.0])]
    results[0].predictions = {0: bench.Prediction([1, 2], 4, 100, 7.5), 1: None}     # seed 1: the fallback plan
    wide = replace(_setting(2), model_width=16)
    text = bench.table(results, wide, [0, 1], ["calibrated planner: no run in seed 1: its pilot cut 2, I=2 did not "
                                               "reach 50%"])
    assert text.splitlines()[0].startswith("bench plans: mlp (width 16) on synthetic, 2 devices")
    assert bench.table(results, _setting(2), [0, 1]).splitlines()[0].startswith("bench plans: mlp on synthetic")
    assert text.splitlines()[-1] == "calibrated planner: no run in seed 1: its pilot cut 2, I=2 did not reach 50%"
    assert text.splitlines()[-2] == ("planner: rank 2 of 2, 3.00× the best fixed plan (cut 1, I=1: 1 s); measured 3 s, "
                                     "4 rounds to target; its prediction is missing in a seed")


def test_the_calibrated_planners_pilots_are_cut_l_minus_1_at_the_smallest_and_the_largest_interval_that_reached(
        tmp_path) -> None:
    seeds, intervals, cuts = [0, 1, 2], [1, 2, 4], 3
    best = {seed: {1: [1, 2, 3], 2: [1, 1, 3], 4: [1, 1, 1]} for seed in seeds}
    grid = bench.grid_jobs(_setting(), seeds, range(1, cuts + 1), best, intervals, tmp_path)
    # seed 0: every run reaches the target; seed 1: cut 2 at I = 4 never does; seed 2: only cut 2 at I = 1 does
    missed = {(1, "cut 2, I=4"), (2, "cut 2, I=2"), (2, "cut 2, I=4")}
    results = [_run(j["label"], None if (j["seed"], j["label"]) in missed else [1.0]) for j in grid]
    pairs, missing = bench.pilot_pairs(_setting(), seeds, grid, results, range(1, cuts + 1), cuts, intervals)
    assert missing == ["calibrated planners: no run in seed 2: their pilots cut 2, I=2, cut 2, I=4 did not reach 40%"]
    jobs = bench.calibrated_jobs(_setting(), pairs, tmp_path)
    assert [j["seed"] for j in jobs] == [0, 1]
    assert [j["config"]["pilots"] for j in jobs] == [f"{tmp_path / 'seed0' / 'cut2-I1'},{tmp_path / 'seed0' / 'cut2-I4'}",
                                                     f"{tmp_path / 'seed1' / 'cut2-I1'},{tmp_path / 'seed1' / 'cut2-I2'}"]
    job = jobs[0]
    assert job["label"] == "calibrated planner" and job["plan"].kind == "calibrated"
    assert job["config"]["target_accuracy"] == 0.4 and "cuts" not in job["config"] and "interval" not in job["config"]
    assert job["folder"] == str(tmp_path / "seed0" / "calibrated")
    # the smallest interval's pilot missing: no calibration in that seed
    results = [_run(j["label"], None if j["label"] == "cut 2, I=1" else [1.0]) for j in grid]
    pairs, missing = bench.pilot_pairs(_setting(), [0], grid, results, range(1, cuts + 1), cuts, intervals)
    assert pairs == {} and missing == ["calibrated planners: no run in seed 0: their pilot cut 2, I=1 did not reach 40%"]
    assert [p.label for p in bench.pilot_plans([1], 1, [8, 1], 2)] == ["cut 1, I=1", "cut 1, I=8"]    # L = 1: cut 1


def test_the_planner_per_cuts_pilots_are_every_cut_at_i_1_and_the_fastest_at_the_longest_interval_that_reached(
        tmp_path) -> None:
    seeds, intervals, cuts = [0, 1, 2], [1, 2, 4], 3
    best = {seed: {1: [1, 2, 3], 2: [1, 1, 3], 4: [1, 1, 1]} for seed in seeds}
    grid = bench.grid_jobs(_setting(), seeds, range(1, cuts + 1), best, intervals, tmp_path)
    seconds = {(0, "cut 1, I=1"): 3.0, (0, "cut 2, I=1"): 1.0, (0, "cut 3, I=1"): None,    # seed 0: cut 2 fastest
               (1, "cut 2, I=2"): None, (1, "cut 2, I=4"): None, (1, "cut 1, I=1"): 5.0,   # seed 1: cut 2 stops at I = 1
               **{(2, f"cut {j}, I=1"): None for j in (1, 2, 3)}}                           # seed 2: nothing at I = 1
    results = [_run(j["label"], [s] if (s := seconds.get((j["seed"], j["label"]), 2.0)) is not None else None)
               for j in grid]
    pilots, missing = bench.per_cut_pilots(_setting(), seeds, grid, results, range(1, cuts + 1), intervals)
    folder = lambda seed, slug: str(tmp_path / f"seed{seed}" / slug)   # noqa: E731
    assert pilots == {0: [folder(0, "cut1-I1"), folder(0, "cut2-I1"), folder(0, "cut2-I4")]}
    assert missing == ["calibrated planner per cut: no run in seed 1: cut 2, the fastest at I = 1, reached 40% at no "
                       "longer interval", "calibrated planner per cut: no run in seed 2: no cut reached 40% at I = 1"]


def test_the_planner_linear_in_i_keeps_a_block_before_the_head() -> None:
    """Under --defence head=K the linear planner's cuts come from 1..L − K − 1: with a head that leaves cuts 1..3 of the
    VGG-16 profile it plans there, where without it it plans at cut 4."""
    from adaptplan.calibration import PilotRun
    from adaptplan.linear_rounds import LinearRounds

    profile, system = default_profile(), generate_system(3, 1)
    law = LinearRounds(50.0, 0.1, 0.3, (PilotRun("a", 1, 1, 0.3, 50.0), PilotRun("b", 4, 1, 0.3, 65.0)), "")
    probes = {0: bench.Probe(profile, system, {}, _setting().allowed_cuts(profile))}
    free = bench.linear_jobs(_setting(), {0: law}, probes, "runs")[0]["config"]["cuts"]
    setting = replace(_setting(), defence=f"head={profile.num_cuts - 4}")
    probes = {0: bench.Probe(profile, system, {}, setting.allowed_cuts(profile))}
    shaped = bench.linear_jobs(setting, {0: law}, probes, "runs")[0]["config"]["cuts"]
    assert max(free) == 4 > 3 >= max(shaped)


def test_under_a_leakage_budget_the_grid_pilots_latency_best_cuts_and_planners_keep_within_it(tmp_path, capsys) -> None:
    """--leakage-table/--max-leakage: the plans may use only the cuts within the budget (mlp: dCor 0.9 at cut 1, 0.8
    at cut 2, no figure at cut L = 3), so the grid, the pilots and each device's latency-best cut sit at cut 2; the
    planners' runs plan within it (train --max-leakage) and the fixed plans carry no budget; a budget of one limit per
    device or one no cut meets is refused naming --max-leakage, before any run."""
    from adaptplan.leakage_table import LeakageTable

    profile = bench.probe(_setting(2), 0, [1]).profile
    table = tmp_path / "leak.json"
    LeakageTable(profile.identity(), "synthetic", 64, {"dcor": [0.9, 0.8]}).save(table)
    budget = replace(_setting(2), leakage_table=str(table), max_leakage="dcor=0.85")
    assert budget.allowed_cuts(profile) == [2] and replace(budget, max_leakage="dcor=0.9").allowed_cuts(profile) == [1, 2]
    noisy = tmp_path / "noisy.json"            # a table of the defence the bench's devices run, however it is written
    LeakageTable(profile.identity(), "synthetic", 64, {"dcor": [0.9, 0.8]}, "clip=1,noise=1").save(noisy)
    assert replace(budget, leakage_table=str(noisy), defence="noise=1,clip=1").allowed_cuts(profile) == [2]
    with pytest.raises(bench.InputError, match="measured under defence 'clip=1,noise=1', the plan is for 'none'"):
        replace(budget, leakage_table=str(noisy)).allowed_cuts(profile)
    for limits, message in [("dcor=0.5", "device 0's budget (dcor at most 0.5) admits no candidate cut: the "
                                         "least-leaking candidate is cut 2 with dcor 0.8; a budget of at least 0.8 is "
                                         "feasible"),
                            ("dcor=0.9,0.75", "device 1's budget (dcor at most 0.75) admits no candidate cut")]:
        with pytest.raises(bench.InputError) as info:
            replace(budget, max_leakage=limits).allowed_cuts(profile)
        assert info.value.field == "--max-leakage" and message in info.value.message
    # one limit per device: the grid's one-cut plans at the cuts every device may use, each device's latency-best cut
    # among its own
    mixed = replace(budget, max_leakage="dcor=0.9,0.85")
    assert mixed.device_cuts(profile, mixed.budget(profile)) == [[1, 2], [2]] and mixed.allowed_cuts(profile) == [2]
    found = bench.probe(mixed, 0, [1, 2])
    assert found.cuts == [2] and all(best[1] == 2 for best in found.latency_best.values())
    assert found.leakage is not None and found.leakage.limits.tolist() == [0.9, 0.85]
    model = bench.LatencyModel(found.profile, found.system)
    assert [best[0] for best in found.latency_best.values()] == [bench.latency_best_cuts(model, i, [1, 2])[0]
                                                                 for i in (1, 2)]
    from adaptplan.calibration import PilotRun
    from adaptplan.linear_rounds import LinearRounds

    law = LinearRounds(50.0, 0.1, 0.3, (PilotRun("a", 1, 1, 0.3, 50.0), PilotRun("b", 4, 1, 0.3, 65.0)), "")
    free = bench.linear_jobs(_setting(2), {0: law}, {0: bench.probe(_setting(2), 0, [1])}, "runs")[0]["config"]["cuts"]
    assert free == [1, 1] and bench.linear_jobs(mixed, {0: law}, {0: found}, "runs")[0]["config"]["cuts"] == [1, 2]
    assert [p.cut for p in bench.pilot_plans([2], 3, [2, 1], 2)] == [2, 2]
    assert budget.run_config(0, bench.PlanSpec("calibrated"))["max_leakage"] == "dcor=0.85"
    assert "max_leakage" not in budget.run_config(0, bench.PlanSpec("uniform", 1, 2, (2, 2)))
    out = tmp_path / "bench"
    assert main(["bench", "plans", "--dataset", "synthetic", "--model", "mlp", "--devices", "2", "--intervals", "1,2",
                 "--seeds", "0", "--rounds", "4", "--eval-every", "2", "--test-samples", "200", "--target-accuracy",
                 "0.3", "--workers", "1", "--leakage-table", str(table), "--max-leakage", "dcor=0.85", "--out",
                 str(out)]) == 0
    assert "every plan within the leakage budget dcor=0.85" in capsys.readouterr().out
    data = json.loads((out / "results.json").read_text())
    assert [p["label"] for p in data["plans"]][:5] == ["planner", "cut 2, I=1", "cut 2, I=2", "latency-best, I=1",
                                                       "latency-best, I=2"]
    for plan in data["plans"]:
        assert all(set(cuts) == {2} for cuts in plan["cuts_by_seed"].values() if cuts), plan["label"]
    planner = json.loads((out / "runs" / "seed0" / "planner" / "history.json").read_text())
    assert planner["meta"]["config"]["max_leakage"] == "dcor=0.85" and planner["events"][0]["cuts"] == [2, 2]
    assert main(["bench", "plans", "--dataset", "synthetic", "--model", "mlp", "--devices", "2", "--leakage-table",
                 str(table), "--max-leakage", "dcor=0.5", "--out", str(tmp_path / "never")]) == 2
    assert "--max-leakage" in capsys.readouterr().err and not (tmp_path / "never").exists()
