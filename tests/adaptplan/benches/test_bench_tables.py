"""What `bench algorithms` and `bench training` report, from hand-made run results (no training): the
tables' figures, the JSON, the plots' points, and the jobs each benchmark hands to the workers."""

from __future__ import annotations

import json
from typing import Any

import pytest

from adaptplan.benches import algorithms as bench_algorithms
from adaptplan.benches import runs as bench_runs
from adaptplan.benches import training as bench_training
from adaptplan.benches.comparison import Setting
from adaptplan.benches.runs import RunResult
from adaptplan.benches.workload import Workload
from tests.plot_checks import drawn, spy_figures
from trainers.config.train_config import ExecutionConfig


def result(group, label, **kw) -> RunResult:
    fields = dict(rounds=30, final_accuracy=0.5, sim_seconds=3.0, wall_seconds=1.5, time_to_target_s=None,
                  rounds_to_target=None, converged_round=None, converged_time_s=None, converged_accuracy=None,
                  curve=[])
    fields.update(kw)
    return RunResult(group, label, **fields)


ALGORITHM_RUNS = [
    result("iid", "psl", final_accuracy=0.4, sim_seconds=3.0, wall_seconds=1.5, time_to_target_s=2.0,
           curve=[(1.0, 0.2), (2.0, 0.3), (3.0, 0.4)], final_local_accuracy=0.7),
    result("iid", "gas", final_accuracy=0.5, sim_seconds=1.5, wall_seconds=6.0, curve=[(1.5, 0.5)], diverged_round=31),
    result("shards-2", "psl", rounds=10, final_accuracy=None, sim_seconds=40.0, wall_seconds=0.0, curve=[]),
]


def test_accuracy_at_a_budget() -> None:
    r = ALGORITHM_RUNS[0]
    assert [r.accuracy_at(t) for t in (0.5, 1.0, 1.9999999999999, 2.0, 10.0)] == [None, 0.2, 0.3, 0.3, 0.4]
    assert bench_algorithms.budget_seconds(ALGORITHM_RUNS, "iid") == 1.5          # the shorter of 3 and 1.5
    assert bench_algorithms.budget_seconds(ALGORITHM_RUNS, "shards-2") == 40.0


def test_algorithms_table_and_json(tmp_path) -> None:
    # iid: budget 1.5 s → psl's last evaluation by then is 0.2 (at 1 s), gas's 0.5; wall per round 1.5/30, 6/30
    setting = Setting("adam", 1e-3, 1e-3, 0.0, 5e-4, 10.0, 8, 0.5, 2, 30)
    line = ("  setting — every method: ADAM, lr 0.001, weight decay 0.0005, clipping 10, batch 8, participation 0.5, "
            "local rounds between averages 2, 30 rounds, a device's optimizer state kept when it loads the global model")
    assert bench_algorithms.table(ALGORITHM_RUNS, 0.3, setting).splitlines() == [
        "iid: accuracy after 30 rounds, at the equal budget of 1.5 simulated s, simulated s to 30%", line,
        "  algorithm  acc@rounds acc@budget local acc s to target     sim s wall s/round",
        "  psl             40.0%      20.0%     70.0%           2         3        0.050",
        "  gas             50.0%      50.0%         -           -       1.5        0.200  diverged (NaN/inf) at round 31",
        "shards-2: accuracy after 10 rounds, at the equal budget of 40 simulated s, simulated s to 30%", line,
        "  algorithm  acc@rounds acc@budget local acc s to target     sim s wall s/round",
        "  psl                 -          -         -           -        40        0.000",
        # every dash says why, once under the table (issue 65)
        "- (local acc): no local held-out samples in the run (--local-test-fraction 0)",
        "- (s to target): diverged (NaN/inf) at round 31, before reaching 30%",
        "- (acc@rounds, acc@budget, local acc): no evaluation in the run (lower --eval-every)",
        "- (s to target): target 30% not reached within 10 rounds",
    ]
    bench_algorithms.save_json(ALGORITHM_RUNS, 0.3, tmp_path / "r.json", setting)
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["target_accuracy"] == 0.3 and data["budgets_s"] == {"iid": 1.5, "shards-2": 40.0}
    assert data["setting"] == {**setting.to_json(), "optimizer": "adam", "participation": 0.5, "sources": {}}
    assert [(r["partition"], r["algorithm"], r["accuracy_at_budget"], r["diverged_round"]) for r in data["runs"]] == [
        ("iid", "psl", 0.2, None), ("iid", "gas", 0.5, 31), ("shards-2", "psl", None, None)]
    assert data["runs"][0]["curve"] == [[1.0, 0.2], [2.0, 0.3], [3.0, 0.4]]


POLICY_RUNS = [
    result("iid", "adaptsfl", final_accuracy=0.6, time_to_target_s=10.0, rounds_to_target=5, converged_round=8,
           converged_time_s=16.0, converged_accuracy=0.55),
    result("iid", "sfl", time_to_target_s=25.0, rounds_to_target=12),
    result("iid", "psl", final_accuracy=0.125),
    result("shards", "sfl", rounds=30, final_accuracy=0.3, time_to_target_s=7.5, rounds_to_target=3),
]


def test_training_table_and_json(tmp_path) -> None:
    # × AdaptSFL: time to target over AdaptSFL's of the same partition (none in "shards": "-")
    setting_line = ("  setting — every method: SGD, lr 0.05, momentum 0.9, weight decay 0, clipping off, batch 16, "
                    "participation 1, local rounds between averages each algorithm's own, 600 rounds, a device's "
                    "optimizer state kept when it loads the global model")
    assert bench_training.table(POLICY_RUNS, 0.4).splitlines() == [
        "iid: target 40%, 30 rounds", setting_line,
        "  policy    rounds→target  s→target × AdaptSFL   final conv. round  conv. s conv. acc",
        "  adaptsfl            5.0        10       1.00   60.0%           8       16     55.0%",     # interpolated rounds
        "  sfl                12.0        25       2.50   50.0%           -        -         -",
        "  psl                   -         -          -   12.5%           -        -         -",
        "shards: target 40%, 30 rounds", setting_line,
        "  policy    rounds→target  s→target × AdaptSFL   final conv. round  conv. s conv. acc",
        "  sfl                 3.0       7.5          -   30.0%           -        -         -",
        "- (conv. round, conv. s, conv. acc): not converged within 30 rounds (gain < 0.02 over 5 evaluations, counted "
        "only above twice chance)",
        "- (rounds→target, s→target, × AdaptSFL): target 40% not reached within 30 rounds",
        "- (× AdaptSFL): no AdaptSFL run in this partition",
    ]
    bench_training.save_json(POLICY_RUNS, 0.4, tmp_path / "t.json")
    data = json.loads((tmp_path / "t.json").read_text())
    adapt = {"time_to_target_s": 10.0, "rounds_to_target": 5, "final_accuracy": 0.6, "converged_round": 8,
             "converged_time_s": 16.0, "converged_accuracy": 0.55}
    assert data["target_accuracy"] == 0.4 and data["policies"]["adaptsfl"] == adapt
    assert list(data["policies"]) == ["adaptsfl", "sfl", "psl"] and list(data["partitions"]) == ["iid", "shards"]
    assert data["partitions"]["shards"]["sfl"]["time_to_target_s"] == 7.5


SWEEP_RUNS = [
    result("bandwidth=0.5", "sfl", time_to_target_s=30.0, converged_time_s=45.0),
    result("bandwidth=0.5", "psl", time_to_target_s=None),
    result("bandwidth=2", "sfl", time_to_target_s=12.0),
    result("bandwidth=2", "psl", time_to_target_s=20.0, converged_time_s=1234.5),
]






def test_sweep_table_and_plot(tmp_path, monkeypatch) -> None:
    assert bench_training.sweep_table(SWEEP_RUNS, "bandwidth").splitlines() == [
        "sweep bandwidth: simulated s to target / converged s",
        "  policy                  0.5                 2",
        "  sfl             30 /     45       12 /      -",
        "  psl              - /      -       20 / 1.23e+03",
        "- (converged s): not converged within 30 rounds (gain < 0.02 over 5 evaluations, counted only above twice "
        "chance)",
        "- (s to target): target not reached within the run's 30 rounds",
    ]
    figures = spy_figures(monkeypatch)
    bench_training.sweep_plot(SWEEP_RUNS, "bandwidth", tmp_path / "s.png")
    (ax,) = figures[0].axes
    assert [(l.get_label(), list(l.get_xdata()), list(l.get_ydata())) for l in ax.get_lines()] == [
        ("sfl", [0.5, 2.0], [30.0, 12.0]), ("psl", [2.0], [20.0])]            # runs that never reached it: no point
    assert ax.get_xlabel() == "bandwidth" and ax.get_ylabel() == "simulated seconds to target" and not ax.texts
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["sfl", "psl"]
    renderer = drawn(figures[0])                                           # beside the axes: it hides no point
    assert not ax.get_legend().get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))
    bench_training.sweep_plot([result("noise-cv=0", "sfl")], "noise-cv", tmp_path / "n.png")
    assert not figures[1].axes[0].get_lines() and figures[1].axes[0].texts[0].get_text() == "no policy reached the target"
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"


def test_accuracy_plot_has_one_panel_per_group(tmp_path, monkeypatch) -> None:
    figures = spy_figures(monkeypatch)
    bench_runs.plot(ALGORITHM_RUNS, tmp_path / "a.png")
    iid, shards = figures[0].axes
    assert (iid.get_title(), shards.get_title()) == ("iid", "shards-2")
    assert [(l.get_label(), list(l.get_xdata()), list(l.get_ydata())) for l in iid.get_lines()] == [
        ("psl", [1.0, 2.0, 3.0], [0.2, 0.3, 0.4]), ("gas", [1.5], [0.5])]   # no class count: no chance line
    assert not shards.get_lines()                                          # a run without evaluations draws nothing
    (legend,) = figures[0].legends                                         # one, below the panels
    assert [t.get_text() for t in legend.get_texts()] == ["psl", "gas"]
    assert iid.get_xlabel() == "simulated seconds" and iid.get_ylabel() == "test accuracy"
    assert (tmp_path / "a.png").read_bytes()[:4] == b"\x89PNG"


def test_jobs_of_the_benchmarks(monkeypatch) -> None:
    seen = {}

    def fake_run_jobs(jobs, workers, desc, progress):
        seen.update(jobs=jobs, workers=workers, desc=desc, progress=progress)
        return []

    monkeypatch.setattr(bench_algorithms, "run_jobs", fake_run_jobs)
    setting = Setting("sgd", 0.01, 0.02, 0.5, 0.0, 0.0, 8, 0.4, 3, 7)
    workload = Workload(setting, dataset="synthetic", devices=5, eval_every=2, test_samples=50, target=0.25)
    bench_algorithms.run_algorithm_bench(["psl", "gas"], ["iid", "dirichlet-0.1"], workload, seed=3, cuts=[2] * 5,
                                         workers=2, progress=False)
    common = dict(dataset="synthetic", model="cnn", devices=5, rounds=7, client_state="keep", optimizer="sgd", lr=0.02,
                  client_lr=0.01,
                  server_lr=0.02, momentum=0.5, weight_decay=0.0, clip_norm=0.0, batch_size=8,
                  eval_every=2, seed=3, threads=1, progress=False, max_test_samples=50, cuts=(2, 2, 2, 2, 2),
                  device="auto", client_batching="auto", dirichlet_alpha=0.5)
    assert seen["jobs"] == [
        {"group": "iid", "label": "psl", "target": 0.25,
         "config": dict(common, algorithm="psl", extra={"participation": 0.4}, interval=3, partition="iid")},
        {"group": "iid", "label": "gas", "target": 0.25,
         "config": dict(common, algorithm="gas", extra={"active": 2, "local_steps": 3}, partition="iid")},
        {"group": "dirichlet-0.1", "label": "psl", "target": 0.25,
         "config": dict(common, algorithm="psl", extra={"participation": 0.4}, interval=3, partition="dirichlet",
                        dirichlet_alpha=0.1)},
        {"group": "dirichlet-0.1", "label": "gas", "target": 0.25,
         "config": dict(common, algorithm="gas", extra={"active": 2, "local_steps": 3}, partition="dirichlet",
                        dirichlet_alpha=0.1)},
    ]
    assert (seen["workers"], seen["progress"]) == (2, False)

    monkeypatch.setattr(bench_training, "run_jobs", fake_run_jobs)
    nine = bench_training.ADAPTSFL_SETTING.with_overrides(rounds=9)
    four = Workload(nine, dataset="synthetic", devices=4, eval_every=3, test_samples=40, target=0.3)
    bench_training.run_training_bench(["adaptsfl", "sfl"], ["iid", "shards"], four,
                                      bench_training.Planning(6, 0.1, ("device-flops", [0.5, 2.0])), seed=1,
                                      workers=1, progress=False)
    base = dict(algorithm="adaptsfl", dataset="synthetic", model="cnn", devices=4, partition="iid", rounds=9,
                client_state="keep",
                optimizer="sgd", lr=0.05, client_lr=0.05, server_lr=0.05, momentum=0.9, weight_decay=0.0, clip_norm=0.0,
                extra={"participation": 1.0}, batch_size=16, eval_every=3, seed=1, threads=1, progress=False,
                max_test_samples=40, noise_cv=0.1, device="auto", client_batching="auto", dirichlet_alpha=0.5)
    # a sweep runs on the first partition only, one group per value
    assert seen["jobs"] == [
        {"group": "device-flops=0.5", "label": "adaptsfl", "target": 0.3,
         "config": dict(base, policy="adaptsfl", flops_scale=0.5, replan_every=6)},
        {"group": "device-flops=0.5", "label": "sfl", "target": 0.3, "config": dict(base, policy="sfl", flops_scale=0.5)},
        {"group": "device-flops=2", "label": "adaptsfl", "target": 0.3,
         "config": dict(base, policy="adaptsfl", flops_scale=2.0, replan_every=6)},
        {"group": "device-flops=2", "label": "sfl", "target": 0.3, "config": dict(base, policy="sfl", flops_scale=2.0)},
    ]
    bench_training.run_training_bench(["psl"], ["iid", "shards"], four, workers=1, progress=False)
    assert [(j["group"], j["config"]["partition"], j["config"].get("replan_every")) for j in seen["jobs"]] == [
        ("iid", "iid", None), ("shards", "shards", None)]


def test_a_diverged_run_keeps_its_records() -> None:
    config = dict(algorithm="psl", dataset="synthetic", devices=2, rounds=30, cuts=(3,), lr=1e5, momentum=0.0,
                  batch_size=8, eval_every=1, threads=1, progress=False, max_test_samples=50)
    (r,) = bench_runs.run_jobs([{"group": "iid", "label": "psl", "target": 0.99, "config": config}], workers=1,
                               progress=False)
    assert r.diverged_round is not None and r.diverged_round == r.rounds + 1 <= 30
    assert len(r.curve) == r.rounds and r.time_to_target_s is None and r.rounds_to_target is None
    with pytest.raises(Exception, match="unknown value 'nope'"):
        bench_runs.run_one({"group": "iid", "label": "x", "target": 0.5, "config": {**config, "algorithm": "nope"}})


def test_a_run_diverging_in_its_first_round_reports_zero_seconds(monkeypatch) -> None:
    import trainers.run.driver
    from adaptplan.errors import InputError
    from trainers.run.history import History

    class DivergesAtOnce:
        def __init__(self, config) -> None:
            self.history = History()

        def run(self):
            raise InputError("training diverged at round 1: NaN or inf in client activation", field="lr")

    monkeypatch.setattr(trainers.run.driver, "Trainer", DivergesAtOnce)
    config = dict(algorithm="psl", dataset="synthetic", devices=2, rounds=5, cuts=(3,), progress=False)
    r = bench_runs.run_one({"group": "iid", "label": "psl", "target": 0.5, "config": config})
    assert (r.rounds, r.sim_seconds, r.wall_seconds, r.final_accuracy, r.curve, r.diverged_round) == (0, 0.0, 0.0, None,
                                                                                                     [], 1)


@pytest.mark.parametrize("bench, function", [("algorithms", bench_algorithms.run_algorithm_bench),
                                             ("training", bench_training.run_training_bench)])
def test_python_defaults_are_the_commands(bench, function) -> None:
    """run_algorithm_bench()/run_training_bench() with no arguments run what `adaptplan bench algorithms|training`
    runs with no flags."""
    import inspect

    from adaptplan.cli import build_parser

    parsed = build_parser().parse_args(["bench", bench])
    args = vars(parsed)
    parameters = inspect.signature(function).parameters
    from adaptplan.cli.commands.bench import setting_from, workload_from

    default = parameters["workload"].default
    setting = default.setting                  # the setting flags' absence leaves the default's values
    assert setting_from(parsed, setting) == setting
    # every field of the workload the command has a flag of, at the flag's default (none left to the class's)
    assert workload_from(parsed, setting, Workload) == default
    assert parameters["seed"].default == args["seed"] == 0
    assert default.target == args["target_accuracy"] and default.devices == args["devices"] == 20
    if bench == "training":
        planning = parameters["planning"].default
        assert (planning.replan_every, planning.noise_cv, planning.sweep) == (args["replan_every"], args["noise_cv"],
                                                                              args["sweep"])
    if bench == "algorithms":
        assert list(parameters["algorithms"].default) == args["algorithms"].split(",")
        assert list(parameters["partitions"].default) == args["partitions"].split(",")
    else:
        assert list(parameters["policies"].default) == args["policies"].split(",")


@pytest.mark.parametrize("bench", ["algorithms", "training"])
def test_training_flags_accept_their_ranges(bench) -> None:
    """--lr in (0, 10⁶], --momentum in [0, 1), --target-accuracy in (0, 1], counts ≥ 1 (README input limits)."""
    from adaptplan.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["bench", bench, "--lr", "1e6", "--momentum", "0", "--target-accuracy", "1", "--rounds", "1",
                              "--devices", "1", "--eval-every", "1", "--test-samples", "1", "--workers", "1", "--seed",
                              "0"])
    assert (args.lr, args.momentum, args.target_accuracy, args.rounds, args.devices) == (1e6, 0.0, 1.0, 1, 1)
    args = parser.parse_args(["bench", bench, "--lr", "1e-9", "--momentum", "0.999"])
    assert (args.lr, args.momentum) == (1e-9, 0.999)
    for flag, value in (("--lr", "0"), ("--lr", "1000000.5"), ("--momentum", "1"), ("--momentum", "-0.1"),
                        ("--target-accuracy", "0"), ("--target-accuracy", "1.01"), ("--rounds", "0"), ("--seed", "-1"),
                        ("--devices", "0"), ("--eval-every", "0"), ("--test-samples", "0"), ("--workers", "0")):
        with pytest.raises(SystemExit):
            parser.parse_args(["bench", bench, flag, value])


def test_bench_solvers_and_engine_hand_their_options_on(tmp_path, monkeypatch, capsys) -> None:
    """`bench solvers`: the full sizes are the benchmark function's defaults, --quick keeps 100 and 300; a profile,
    system or constants file makes it "your instance" without the generated scenarios. `bench engine`: its flags
    reach the benchmark, and --json prints the result's JSON."""
    import inspect

    from adaptplan.benches import engine as bench_engine
    from adaptplan.benches import solvers as bench_solvers
    from adaptplan.cli import main
    from adaptplan.constants import ConvergenceConstants
    from adaptplan.scenarios import default_profile
    from adaptplan.system import generate_system

    calls = []
    full = inspect.signature(bench_solvers.run_solver_bench).parameters["sizes"].default
    monkeypatch.setattr(bench_solvers, "run_solver_bench", lambda problem, **kw: calls.append((problem, kw)) or "")
    assert main(["bench", "solvers", "--devices", "12"]) == 0          # seed 0 by default
    problem, kw = calls[-1]
    assert kw == {"sizes": full, "seed": 0, "plot_path": None, "quick": False, "title": "default scenario",
                  "generated": True} and full == (100, 300, 1000, 3000, 10000)
    assert problem.num_devices == 12
    assert main(["bench", "solvers", "--quick", "--seed", "0", "--devices", "12"]) == 0       # 0 is a valid seed
    assert calls[-1][1]["seed"] == 0
    assert main(["bench", "solvers", "--quick", "--seed", "7", "--plot", str(tmp_path / "s.png")]) == 0
    assert calls[-1][1] == {"sizes": (100, 300), "seed": 7, "plot_path": str(tmp_path / "s.png"), "quick": True,
                            "title": "default scenario", "generated": True}
    profile = default_profile()
    paths = {"--profile": tmp_path / "p.json", "--system": tmp_path / "s.json", "--constants": tmp_path / "c.json"}
    profile.save(paths["--profile"])
    generate_system(10, 1).save(paths["--system"])
    ConvergenceConstants.placeholder(profile.num_cuts).save(paths["--constants"])
    for flag, path in paths.items():
        assert main(["bench", "solvers", "--quick", flag, str(path)]) == 0
        assert (calls[-1][1]["title"], calls[-1][1]["generated"]) == ("your instance", False), flag
    assert calls[-2][0].num_devices == 10                    # the --system file's devices

    class Result:
        def to_json(self):
            return {"samples_per_s": 12.5}

        def report(self):
            return "report text"

    seen = {}

    def fake(workload, execution):
        seen.update(workload=workload, execution=execution)
        return Result()

    monkeypatch.setattr(bench_engine, "run_engine_bench", fake)
    capsys.readouterr()
    assert main(["bench", "engine", "--devices", "3", "--rounds", "2", "--batch-size", "4", "--algorithm", "psl",
                 "--threads", "1", "--repeats", "5", "--json"]) == 0
    assert seen["workload"] == bench_engine.EngineWorkload(devices=3, batch_size=4, rounds=2, cut=1,
                                                           algorithms=("psl",), model="cnn", repeats=5)
    assert seen["execution"] == ExecutionConfig(device="auto", threads=1)       # "auto": resolved in the bench
    out, err = capsys.readouterr()
    assert json.loads(out) == {"samples_per_s": 12.5}
    assert err == bench_engine.header(seen["workload"], "cpu") + "\n"
    assert main(["bench", "engine"]) == 0
    assert capsys.readouterr().out == "report text\n"
    assert seen["workload"] == bench_engine.EngineWorkload() and seen["execution"] == ExecutionConfig()
    assert main(["bench", "engine", "--client-recompute", "on", "--server-pass-samples", "64", "--flops",
                 "--clock", "system"]) == 0
    assert (seen["execution"].client_recompute, seen["execution"].server_pass_samples, seen["workload"].count_flops,
            seen["workload"].clock) == ("on", 64, True, "system")
    capsys.readouterr()
    # a sweep: several --devices; a plot needs one, and an unwritable image name fails before any work
    assert main(["bench", "engine", "--plot", "x.png"]) == 2
    assert "--plot: a plot needs a sweep: give several --devices" in capsys.readouterr().err
    assert main(["bench", "engine", "--devices", "3,5", "--plot", "x.nosuchformat"]) == 2
    assert "unknown image format '.nosuchformat'" in capsys.readouterr().err
    assert main(["bench", "engine", "--devices", "3,0"]) == 2
    assert "--devices" in capsys.readouterr().err
    assert main(["bench", "engine", "--clock", "wall"]) == 2
    assert "--clock: unknown value 'wall'; valid: zero, system" in capsys.readouterr().err
    assert seen["workload"].clock == "system"       # nothing ran since the --clock system run


def test_bench_commands_write_their_files_into_new_or_used_folders(tmp_path, monkeypatch, capsys) -> None:
    from adaptplan.cli import main

    monkeypatch.setattr(bench_algorithms, "run_algorithm_bench", lambda *a, **kw: ALGORITHM_RUNS)
    out = tmp_path / "new" / "folder"
    for _ in range(2):                                         # made with its parents, then reused
        assert main(["bench", "algorithms", "--algorithms", "psl,gas", "--partitions", "iid,shards-2", "--out",
                     str(out), "--target-accuracy", "0.3"]) == 0
    assert (out / "table.txt").read_text() == bench_algorithms.table(ALGORITHM_RUNS, 0.3, bench_algorithms.GAPSL_SETTING) + "\n"
    assert json.loads((out / "results.json").read_text())["budgets_s"] == {"iid": 1.5, "shards-2": 40.0}
    assert (out / "accuracy.png").read_bytes()[:4] == b"\x89PNG"

    monkeypatch.setattr(bench_training, "run_training_bench", lambda *a, **kw: POLICY_RUNS)
    out, report = tmp_path / "t" / "u", tmp_path / "figures.json"
    capsys.readouterr()
    for _ in range(2):
        assert main(["bench", "training", "--policies", "adaptsfl,sfl,psl", "--out", str(out), "--json", str(report),
                     "--target-accuracy", "0.4"]) == 0
    text = bench_training.table(POLICY_RUNS, 0.4)
    assert (out / "table.txt").read_text() == text + "\n"
    assert capsys.readouterr().out == 2 * (text + "\n" + f"wrote {out / 'table.txt'} and {out / 'accuracy.png'}\n")
    assert json.loads(report.read_text())["policies"]["adaptsfl"]["rounds_to_target"] == 5
    monkeypatch.setattr(bench_training, "run_training_bench", lambda *a, **kw: SWEEP_RUNS)
    assert main(["bench", "training", "--policies", "sfl,psl", "--sweep", "bandwidth=0.5,2", "--out", str(out)]) == 0
    assert (out / "table.txt").read_text().endswith(bench_training.sweep_table(SWEEP_RUNS, "bandwidth") + "\n")
    assert (out / "sweep-bandwidth.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_needs_a_benchmark_name(capsys) -> None:
    from adaptplan.cli import main

    assert main(["bench"]) == 2
    assert "the following arguments are required: BENCH" in capsys.readouterr().err


def test_the_accuracy_plot_marks_every_evaluation_and_says_when_there_is_none(tmp_path, monkeypatch) -> None:
    """Issue 25, first-hour item 1: the README's short runs evaluate once; a one-point line without markers is
    invisible. Every evaluation is a marker, and a panel with no evaluation at all says so."""
    import matplotlib.pyplot as plt

    from adaptplan.benches.runs import RunResult, plot

    def result(group, curve):
        return RunResult(group, "psl", 10, 0.5, 1.0, 1.0, None, None, None, None, None, curve)

    figures = []
    monkeypatch.setattr(plt.Figure, "savefig", lambda self, path, **kw: figures.append(self))
    plot([result("iid", [(1.0, 0.5)]), result("shards", [])], tmp_path / "a.png")
    (fig,) = figures
    one, empty = fig.axes
    (line,) = one.get_lines()
    assert line.get_marker() == "o" and list(line.get_xdata()) == [1.0]
    assert not empty.get_lines() and "no evaluation" in empty.texts[0].get_text()


def test_bench_engine_sweeps_device_counts_into_a_table_and_plot(tmp_path, capsys) -> None:
    from adaptplan.cli import main

    plot = tmp_path / "sweep"
    assert main(["bench", "engine", "--devices", "2,3", "--rounds", "1", "--repeats", "1", "--batch-size", "2",
                 "--model", "mlp", "--algorithm", "psl,gas", "--threads", "1", "--plot", str(plot)]) == 0
    out, err = capsys.readouterr()
    table = out.split("sweep:\n")[1].splitlines()
    assert [line.split()[:2] for line in table[1:]] == [["2", "psl"], ["2", "gas"], ["3", "psl"], ["3", "gas"]]
    assert "[bench] 2 devices ..." in err and f"[bench] wrote {plot}.png" in err
    assert (tmp_path / "sweep.png").stat().st_size > 10_000



def _bench_in_a_process(tmp_path, work: str, jobs: int) -> tuple[Any, Any]:
    """A benchmark of ``jobs`` runs of the function ``work`` (source text; it marks each run it starts in the folder
    ``sys.argv[1]``) over 2 worker processes, started in its own process; returned once two runs have started,
    with the folder of marks."""
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    script = tmp_path / "bench.py"
    script.write_text("import os, signal, sys, time\n"
                      "from adaptplan.benches.runs import run_jobs\n" + work +
                      "if __name__ == '__main__':\n"
                      f"    run_jobs([{{'n': i}} for i in range({jobs})], workers=2, progress=False, work=work)\n")
    marks = tmp_path / "marks"
    marks.mkdir()
    root = Path(__file__).resolve().parents[3]
    proc = subprocess.Popen([sys.executable, str(script), str(marks)], cwd=root,
                            env={**os.environ, "PYTHONPATH": str(root)})
    deadline = time.monotonic() + 60
    while len(list(marks.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(list(marks.iterdir())) == 2, "the first two runs did not start"
    return proc, marks


def test_a_stopped_bench_starts_no_queued_run_when_its_runs_stop_gracefully(tmp_path) -> None:
    """A run that turns SIGTERM into a stop at the end of its round (as the Trainer does: checkpoint, then an
    exception) must not leave its worker free to start the runs queued behind it: before, a stopped `bench papers`
    waited for the worker to train the next queued run to its end (an hour), instead of exiting."""
    import contextlib
    import os
    import signal
    import time

    proc, marks = _bench_in_a_process(tmp_path, (
        "def work(job):\n"
        "    stop = []\n"
        "    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))\n"
        "    with open(os.path.join(sys.argv[1], f'job{job[\"n\"]}'), 'w') as mark:\n"
        "        mark.write(str(os.getpid()))\n"
        "    for _ in range(1200):\n"
        "        if stop:\n"
        "            raise RuntimeError('stopped at the end of a round')\n"
        "        time.sleep(0.1)\n"), jobs=6)
    assert sorted(p.name for p in marks.iterdir()) == ["job0", "job1"]
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        proc.kill()
        for mark in marks.iterdir():             # a worker left behind by a failure: not left blocked forever
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(mark.read_text()), signal.SIGKILL)
    time.sleep(1)
    assert sorted(p.name for p in marks.iterdir()) == ["job0", "job1"]      # no queued run started


def test_a_stopped_bench_ends_its_worker_processes(tmp_path) -> None:
    """SIGTERM to a benchmark whose runs are in worker processes: it exits and its workers do not go on training
    (they did before: a killed `bench papers` left its workers running for minutes)."""
    import signal
    import time
    from pathlib import Path

    proc, marks = _bench_in_a_process(tmp_path, (
        "def work(job):\n"
        "    open(os.path.join(sys.argv[1], str(os.getpid())), 'w').close()\n"
        "    time.sleep(120)\n"), jobs=4)
    workers = [int(p.name) for p in marks.iterdir()]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM

    def alive(pid: int) -> bool:
        try:
            state = Path(f"/proc/{pid}/status").read_text()
        except FileNotFoundError:
            return False
        return "\nState:\tZ" not in state

    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in workers)


def test_a_stopped_bench_kills_a_worker_that_does_not_end_within_the_grace(tmp_path) -> None:
    """A worker that does not exit after the benchmark's SIGTERM (here it ignores the signal; seen 2026-11-29: a
    worker left idle after its run stopped) is killed once the grace (`STOP_GRACE_S`, 2 s here) has passed, and
    the benchmark exits instead of waiting on it."""
    import os
    import signal
    import time
    from pathlib import Path

    proc, marks = _bench_in_a_process(tmp_path, (
        "import adaptplan.benches.runs as _runs\n"
        "_runs.STOP_GRACE_S = 2.0\n"
        "def work(job):\n"
        "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "    open(os.path.join(sys.argv[1], str(os.getpid())), 'w').close()\n"
        "    time.sleep(600)\n"), jobs=4)
    workers = [int(p.name) for p in marks.iterdir()]

    def alive(pid: int) -> bool:
        status = Path(f"/proc/{pid}/status")
        return status.exists() and "\nState:\tZ" not in status.read_text()

    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=40)
        waited = time.monotonic() - started
        left = [pid for pid in workers if alive(pid)]
    finally:
        proc.kill()
        for pid in workers:                      # a worker left behind by a failure: not left running 10 minutes
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    assert code == 128 + signal.SIGTERM
    assert waited >= 2.0                         # the grace was given before the kill
    assert left == []
