"""What `bench solvers` and `bench engine` compute and report, checked against independent solves,
hand-made results and a scripted clock (tiny instances: each test takes a few seconds at most)."""

from __future__ import annotations

import copy
import math
import types
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn

from adaptplan.benches import engine as bench_engine
from trainers.config.train_config import ExecutionConfig
from adaptplan.benches import solvers as bench_solvers
from adaptplan.benches.engine import EngineBenchResult
from solvers.baselines import BASELINES
from solvers.bcd import solve_bcd
from solvers.exact import solve_exact
from solvers.result import SolveResult


# ---- bench solvers: table (1) --------------------------------------------------------------------------------
def _cells(line: str) -> list[str]:
    return line.split()


def test_compare_policies_ratios_and_rows_are_the_solvers_own(capsys) -> None:
    problem = bench_solvers.random_problem(3, 5, 1)
    table, ratios = bench_solvers.compare_policies(problem, "tiny", seeds=3)
    bcd, exact = solve_bcd(problem), solve_exact(problem)
    lines = table.splitlines()
    assert lines[0].startswith(f"tiny: N=3, {problem.candidates.size} candidate cuts; AdaptSFL's certificate: ")
    assert f">= {bcd.lower_bound:.1f} s for every plan, gap {100 * bcd.gap:.3g}%" in lines[0]
    assert _cells(lines[1]) == ["method", "I", "L_c", "rounds", "T", "(26)", "[s]", "obj", "(28)", "[s]", "ratio"]
    rows = {_cells(line)[0]: _cells(line) for line in lines[2:] if line.startswith("  ") and not line.startswith("   ")
            and _cells(line)[0] != "where:"}
    assert list(rows) == ["adaptsfl(bcd)", "exact", *BASELINES]
    assert ratios["adaptsfl(bcd)"] == 1.0
    assert ratios["exact"] == pytest.approx(exact.objective / bcd.objective)

    def check_row(name: str, result: SolveResult, objective: float, draws: int = 1) -> None:
        rounds, _, total = problem.total_latency(result.interval, result.cuts)
        cells = rows[name]
        assert [int(cells[1]), int(cells[2]), int(cells[3])] == [result.interval, max(result.cuts), rounds], name
        assert float(cells[4]) == pytest.approx(total, abs=0.06), name
        assert float(cells[5]) == pytest.approx(objective, abs=0.06), name
        assert float(cells[6]) == pytest.approx(objective / bcd.objective, abs=6e-4), name
        assert (" ".join(cells[7:]) == f"mean of {draws} draws") if draws > 1 else len(cells) == 7, name

    check_row("adaptsfl(bcd)", bcd, bcd.objective)
    check_row("exact", exact, exact.objective)
    for name, policy in BASELINES.items():
        if name == "psl":
            continue
        if name in bench_solvers.RANDOM_POLICIES:
            draws = [policy(problem, s, "highs") for s in range(3)]
            mean = sum(r.objective for r in draws) / 3
            # the row shows the draw nearest the mean (I, L_c, rounds, T) and the mean objective
            nearest = sorted(draws, key=lambda r: abs(r.objective - mean))[0]
            check_row(name, nearest, mean, draws=3)
            assert ratios[name] == pytest.approx(mean / bcd.objective)
        else:
            result = policy(problem, 0, "highs")
            check_row(name, result, result.objective)
            assert ratios[name] == pytest.approx(result.objective / bcd.objective)
    # PSL never aggregates: no row figures, objective inf, its status
    assert rows["psl"] == ["psl", "-", "-", "-", "-", "inf", "-", "unbounded_drift"] and ratios["psl"] == math.inf
    where = lines[lines.index("  where:") + 1:]
    assert [_cells(line)[0] for line in where] == list(ratios)
    assert capsys.readouterr().err.splitlines()[:2] == ["[bench] tiny: AdaptSFL (BCD) ...", "[bench] tiny: exact optimum ..."]

    table, ratios = bench_solvers.compare_policies(problem, "tiny", seeds=1, exact=False)
    assert "exact" not in ratios and not any(line.startswith("  exact ") for line in table.splitlines())
    assert "mean of" not in table                          # one draw is not a mean


# ---- bench solvers: table (2), scaling ------------------------------------------------------------------------
class _Clock:
    """perf_counter advancing by ``step`` seconds at every reading."""

    def __init__(self, step: float = 0.5) -> None:
        self.now, self.step = 0.0, step

    def perf_counter(self) -> float:
        self.now += self.step
        return self.now


def test_time_scaling_runs_the_milp_only_where_affordable(monkeypatch) -> None:
    made, solves = [], []

    def kind(name):
        def make(n, points, seed):
            made.append((name, n, points, seed))
            return types.SimpleNamespace(kind=name, n=n, points=points)
        return make

    def fake_bcd(problem, **kw):
        solves.append((problem.kind, problem.n, problem.points - 1, kw))
        milp = kw["ms_method"] == "milp"
        return SolveResult(cuts=(1,), interval=7 if not milp else 8, objective=100.0 + problem.n + milp,
                           status="converged", nodes=3, lower_bound=100.0 + problem.n)

    monkeypatch.setattr(bench_solvers, "SCALING_KINDS", {"random": kind("random"), "adversarial": kind("adversarial")})
    monkeypatch.setattr(bench_solvers, "solve_bcd", fake_bcd)
    monkeypatch.setattr(bench_solvers, "time", _Clock(0.5))
    text, rows = bench_solvers.time_scaling([100, 2000], (5, 20), seed=3, node_limit=40)
    # devices N at 20 cuts (random, adversarial), then the cut counts at N = 100 (20 already measured)
    assert made == [("random", 100, 21, 3), ("random", 2000, 21, 3), ("adversarial", 100, 21, 3),
                    ("adversarial", 2000, 21, 3), ("random", 100, 6, 3)]
    assert [(k, n, c) for k, n, c, _, _ in rows] == [(k, n, p - 1) for k, n, p, _ in made]
    assert all(t == 0.5 for _, _, _, t, _ in rows)              # one clock step between start and stop
    sweep = dict(multistart=False, ms_method="threshold")          # no MILP, nothing to limit
    milp = dict(node_limit=40, multistart=False, ms_method="milp", certify=False)   # and never a time limit
    # the MILP column only for random instances with N × cuts ≤ 2000 (100 × 20 = 2000 is still affordable)
    assert solves == [("random", 100, 20, sweep), ("random", 100, 20, milp), ("random", 2000, 20, sweep),
                      ("adversarial", 100, 20, sweep), ("adversarial", 2000, 20, sweep),
                      ("random", 100, 5, sweep), ("random", 100, 5, milp)]
    lines = text.splitlines()
    assert "per-MILP node limit 40; no time limit, so every run prints the same objectives" in lines[0]
    assert _cells(lines[2]) == ["random", "100", "20", "0.500", "3", "0", "0.500", "7", "200.00", "201.00", "converged",
                                "(converged)"]
    assert _cells(lines[3]) == ["random", "2000", "20", "0.500", "3", "0", "-", "7", "2100.00", "-", "converged"]
    assert _cells(lines[4])[:3] == ["adversarial", "100", "20"] and _cells(lines[4])[6] == "-"
    assert _cells(lines[6])[:3] == ["random", "100", "5"] and _cells(lines[6])[9] == "201.00"
    assert len(lines) == 7
    text, rows = bench_solvers.time_scaling([10], (20,))
    assert "per-MILP node limit none; no time limit" in text.splitlines()[0]
    assert [(k, n, c) for k, n, c, _, _ in rows] == [("random", 10, 20), ("adversarial", 10, 20), ("random", 100, 20)]


def test_time_scaling_on_real_instances() -> None:
    text, rows = bench_solvers.time_scaling([4], (3,), seed=0)
    for kind, n, k, _, result in rows:
        problem = bench_solvers.SCALING_KINDS[kind](n, k + 1, 0)
        assert problem.num_devices == n and problem.candidates.size == k
        assert result.objective == pytest.approx(solve_bcd(problem, multistart=False, ms_method="threshold").objective)


# ---- bench solvers: table (3), BCD's gap -----------------------------------------------------------------------
def test_bcd_gap_figures(monkeypatch) -> None:
    made = []
    monkeypatch.setattr(bench_solvers, "_problem", lambda n, points, seed: made.append((n, points, seed)) or len(made))
    monkeypatch.setattr(bench_solvers, "solve_exhaustive", lambda problem: types.SimpleNamespace(objective=100.0))
    # instance k: multistart 100, 100.05, 100.2, 100; single start 101, 100, 100.1, 100.1
    multi = {1: 100.0, 2: 100.05, 3: 100.2, 4: 100.0}
    single = {1: 101.0, 2: 100.0, 3: 100.1, 4: 100.1}

    def fake_bcd(problem, multistart=True):
        return types.SimpleNamespace(objective=(multi if multistart else single)[problem])

    monkeypatch.setattr(bench_solvers, "solve_bcd", fake_bcd)
    lines = bench_solvers.bcd_gap(4, seed=2).splitlines()
    assert lines == ["BCD gap to the exhaustive optimum over 4 random small instances:",
                     "  multistart (default): worst 0.2000 %, within 0.1 % on 75.0 %",
                     "  single start (Alg. 3 as printed): worst 1.0000 %, within 0.1 % on 75.0 %"]
    assert [seed for _, _, seed in made] == [20_000, 20_001, 20_002, 20_003]

    made.clear()
    monkeypatch.setattr(bench_solvers, "solve_bcd", lambda problem, multistart=True: types.SimpleNamespace(objective=100.0))
    bench_solvers.bcd_gap(200, seed=0)
    # N ≤ 4 devices and 4..6 cut points (docstring: N ≤ 4, ≤ 5 cuts), every size drawn
    assert {n for n, _, _ in made} == {2, 3, 4} and {p for _, p, _ in made} == {4, 5, 6}


# ---- bench solvers: the whole run ----------------------------------------------------------------------------
def test_run_solver_bench_runs_the_tables_in_order(monkeypatch, capsys, tmp_path) -> None:
    calls = []

    def fake_compare(problem, title, *, seeds, node_limit, exact=True):
        calls.append(("compare", getattr(problem, "tag", problem), title, seeds, node_limit, exact))
        return f"table {title}", {"adaptsfl(bcd)": 1.0, "sfl": 2.0}

    def fake_scaling(sizes, cut_counts, *, seed, node_limit):
        calls.append(("scaling", list(sizes), tuple(cut_counts), seed, node_limit))
        rows = [("random", 100, 20, 1.0, None), ("random", 100, 5, 9.0, None), ("adversarial", 100, 20, 2.0, None),
                ("random", 300, 20, 3.0, None)]
        return "scaling table", rows

    def fake_gap(instances, *, seed):
        calls.append(("gap", instances, seed))
        return "gap table"

    plotted = []
    monkeypatch.setattr(bench_solvers, "compare_policies", fake_compare)
    monkeypatch.setattr(bench_solvers, "time_scaling", fake_scaling)
    monkeypatch.setattr(bench_solvers, "bcd_gap", fake_gap)
    monkeypatch.setattr(bench_solvers, "_plot", lambda *a: plotted.append(a))
    monkeypatch.setattr(bench_solvers, "_problem", lambda n, points, seed: f"generated {n} {points} {seed}")

    def problem(n, candidates):
        return types.SimpleNamespace(num_devices=n, candidates=np.arange(1, candidates + 1), tag=f"mine {n}")

    sizes = (100, 300, 1000)
    text = bench_solvers.run_solver_bench(problem(100, 20), sizes=sizes, seed=4, quick=False)
    nodes = bench_solvers.NODE_LIMIT          # full and quick: one node limit, no wall-clock limit
    assert calls == [("compare", "mine 100", "default scenario", 5, nodes, True),       # 100 × 20 = 2000: exact runs
                     ("compare", "generated 20 13 5", "generated scenario 1 (synthetic 12-cut)", 5, nodes, True),
                     ("compare", "generated 20 13 6", "generated scenario 2 (synthetic 12-cut)", 5, nodes, True),
                     ("compare", "generated 20 13 7", "generated scenario 3 (synthetic 12-cut)", 5, nodes, True),
                     ("scaling", [100, 300, 1000], (5, 10, 20), 4, nodes), ("gap", 100, 4)]
    parts = ["table default scenario"] + [f"table generated scenario {k} (synthetic 12-cut)" for k in (1, 2, 3)] + \
        ["scaling table", "gap table"]
    assert text == "\n\n".join(parts)
    assert capsys.readouterr().out == "".join(p + "\n\n" for p in parts)     # each table printed as it is done
    assert plotted == []

    calls.clear()
    plot = str(tmp_path / "p.png")
    bench_solvers.run_solver_bench(problem(101, 20), sizes=sizes, seed=0, quick=True, plot_path=plot, title="T")
    assert calls == [("compare", "mine 101", "T", 3, nodes, False),                      # 101 × 20 > 2000: no exact
                     ("compare", "generated 20 13 1", "generated scenario 1 (synthetic 12-cut)", 3, nodes, True),
                     ("scaling", [100, 300], (5, 10), 0, nodes), ("gap", 20, 0)]
    # the plot: the default problem's ratios, and solve time vs N at 20 cut points per instance kind
    assert plotted == [({"adaptsfl(bcd)": 1.0, "sfl": 2.0}, {"random": [(100, 1.0), (300, 3.0)],
                                                             "adversarial": [(100, 2.0)]}, plot, "T")]
    assert f"[bench] wrote {plot}" in capsys.readouterr().err

    calls.clear()
    text = bench_solvers.run_solver_bench(problem(5, 4), sizes=sizes, quick=True, generated=False)
    assert [c[0] for c in calls] == ["compare", "scaling"] and text == "table default scenario\n\nscaling table"


def test_solver_plot_bars_and_the_n_log_n_reference(tmp_path, monkeypatch) -> None:
    import matplotlib.pyplot as plt

    figures, close = [], plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: figures.append(fig) or close(fig))
    ratios = {"adaptsfl(bcd)": 1.0, "exact": 1.0 + 1e-12, "sfl": 2.5, "psl": math.inf}
    times = {"random": [(10, 0.1), (100, 2.0)], "adversarial": [(10, 0.3), (1000, 5.0)]}
    bench_solvers._plot(ratios, times, str(tmp_path / "s.png"), "mine")
    left, right = figures[0].axes
    bars = left.patches
    assert [b.get_height() for b in bars] == [1.0, 1.0 + 1e-12, 2.5]           # inf (PSL) is not drawn
    green, gray = (0.17254901960784313, 0.6274509803921569, 0.17254901960784313, 1.0), \
        (0.4980392156862745, 0.4980392156862745, 0.4980392156862745, 1.0)
    assert [b.get_facecolor() for b in bars] == [green, green, gray]           # at most AdaptSFL's: green
    assert left.get_title() == "mine: predicted latency vs AdaptSFL" and left.get_yscale() == "log"
    lines = {line.get_label(): line for line in right.get_lines()}
    assert list(lines) == ["random", "adversarial", "∝ N log N"]
    assert list(lines["adversarial"].get_xdata()) == [10, 1000]
    ref = lines["∝ N log N"]
    xs, ys = ref.get_xdata(), ref.get_ydata()
    # through the largest random point (100, 2.0), from the smallest N of any kind, ∝ N log N
    assert len(xs) == 20 and xs[0] == pytest.approx(10) and xs[-1] == pytest.approx(100) and ys[-1] == pytest.approx(2.0)
    assert ys[0] == pytest.approx(2.0 * 10 * math.log(10) / (100 * math.log(100)))
    assert (right.get_xscale(), right.get_yscale()) == ("log", "log")
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"

    bench_solvers._plot({"sfl": 2.0}, {"random": [], "adversarial": [(10, 0.3), (20, 0.5)]}, str(tmp_path / "t.png"), "t")
    lines = {line.get_label(): line for line in figures[1].axes[1].get_lines()}
    # no random point: the reference goes through the largest point of any kind
    assert list(lines) == ["adversarial", "∝ N log N"] and lines["∝ N log N"].get_ydata()[-1] == pytest.approx(0.5)
    bench_solvers._plot({"sfl": 2.0}, {"random": [], "adversarial": []}, str(tmp_path / "u.png"), "u")
    empty = figures[2].axes[1]
    assert empty.get_lines() == [] and empty.get_legend() is None
    assert [t.get_text() for t in empty.texts] == ["no planning times in this run"]
    assert figures[1].axes[1].get_legend() is not None


# ---- bench engine ---------------------------------------------------------------------------------------------
class _ScriptedClock:
    """perf_counter returning the given readings in order."""

    def __init__(self, readings: list[float]) -> None:
        self.readings = list(readings)

    def perf_counter(self) -> float:
        return self.readings.pop(0)


def _engine_bench(algorithm: str | list[str] = "adaptsfl", threads: int | None = None, client_batching: str = "auto",
                  **workload) -> "bench_engine.EngineBenchResult":
    """run_engine_bench of an EngineWorkload of ``workload`` under train's execution defaults but these."""
    algorithms = (algorithm,) if isinstance(algorithm, str) else tuple(algorithm)
    return bench_engine.run_engine_bench(bench_engine.EngineWorkload(algorithms=algorithms, **workload),
                                         ExecutionConfig(device="cpu", client_batching=client_batching, threads=threads))


def test_engine_bench_keeps_each_sides_best_repeat(monkeypatch) -> None:
    # per repeat: simulated side (start, stop), split by hand, centralized b, centralized N·b (begin, stop each)
    # repeat 1 takes 2, 4, 4, 8 s; repeat 2 takes 1, 2, 8, 2 s → best 1, 2, 4, 2 s for 2 devices × 2 samples × 1 round;
    # the ratios pair the sides of one repeat: × central b = median(2/1, 4/0.5) = 5, not the bests' 4 / 1
    clock = _ScriptedClock([0, 2, 10, 14, 20, 24, 30, 38, 40, 41, 50, 52, 60, 68, 70, 72])
    monkeypatch.setattr(bench_engine, "time", clock)
    r = _engine_bench(devices=2, batch_size=2, rounds=1, warmup=1, repeats=2, model="mlp", width=4,
                                      algorithm="sfl-v2", threads=1, seed=3)
    assert clock.readings == []
    assert r.algorithms == ("sfl-v2",) and (r.model, r.device, r.devices, r.batch_size, r.cut) == ("mlp", "cpu", 2, 2, 1)
    assert (r.rounds, r.repeats, r.threads) == (1, 2, 1)
    assert r.sfl_samples_per_s == {"sfl-v2": 4.0}
    assert (r.central_b_samples_per_s, r.central_nb_samples_per_s) == (1.0, 2.0)
    assert r.repeat_samples_per_s == {"sfl-v2": [2.0, 4.0], "split_b": [1.0, 2.0], "central_b": [1.0, 0.5],
                                      "central_Nb": [0.5, 2.0]}
    assert (r.ratio_b(), r.ratio_nb(), r.ratio_b("sfl-v2")) == (5.0, 3.0, 5.0)
    assert r.split_b_samples_per_s == 2.0 and r.ratio_split() == 2.0 and r.side_ratio("split_b", "central_b") == 2.5
    assert r.client_batching == "off (auto)" and r.per_device_cuts == {}
    assert r.process_peak_rss_bytes is not None and r.process_peak_rss_bytes > 2**20
    # on Linux each side's memory is its own high-water mark above where it started
    assert set(r.peak_memory_bytes) == {"sfl-v2", "split_b", "central_b", "central_Nb"} and r.memory_measure == "rss"
    assert all(0 <= m < r.process_peak_rss_bytes for m in r.peak_memory_bytes.values())
    assert r.process_peak_rss_bytes >= bench_engine._status_kib("VmRSS") * 1024 * 0.5   # the process's, not a side's
    assert r.sfl_seconds_per_round == {"sfl-v2": 1.0}        # the best repeat's 1 s over 1 round
    assert (r.client_recompute, r.server_pass_samples) == ("auto", 128)       # the engine's defaults on a CPU, said


def test_engine_bench_names_the_algorithms_that_ran_per_device() -> None:
    r = _engine_bench(devices=2, batch_size=2, rounds=1, warmup=0, repeats=1, model="mlp", width=4,
                                      algorithm=["sfl-v2", "sl"], threads=1, client_batching="on")
    assert r.algorithms == ("sfl-v2", "sl") and set(r.sfl_samples_per_s) == {"sfl-v2", "sl"}
    assert r.client_batching == "on"
    assert r.per_device_cuts == {"sl": "the algorithm runs one device at a time"}
    assert all(v > 0 for v in r.sfl_samples_per_s.values()) and r.central_b_samples_per_s > 0


def test_engine_bench_counts_flops_per_trained_sample_against_centralized_training() -> None:
    """Issue 38 item 1: `bench engine --flops`. SplitFed computes exactly centralized training's FLOPs per sample
    (the model split in two, each sample once forward and once backward); SCALA adds its second, input-only
    backward through the server blocks (its cut gradients at the pre-update weights), so it counts more; the mlp's
    FLOPs written out: Linear layers 3072→16→16→10 (width 4: hidden 16; forward 2·m·n per sample, backward twice
    that except the first layer's input gradient, which nobody needs)."""
    r = _engine_bench(devices=4, batch_size=4, rounds=1, warmup=0, repeats=1, model="mlp", width=4,
                                      algorithm=["sfl-v1", "scala"], threads=1, count_flops=True)
    forward = 2 * (3072 * 16 + 16 * 16 + 16 * 10)
    assert r.flops_per_sample["central_b"] == pytest.approx(forward + forward + 2 * (16 * 16 + 16 * 10))
    assert r.flops_ratio("sfl-v1") == pytest.approx(1.0)
    assert r.flops_ratio("scala") > 1.0
    report = r.report()
    assert "counted FLOPs per trained sample" in report and "scala" in report.split("counted FLOPs")[1]
    assert r.to_json()["flops_vs_central_b"]["sfl-v1"] == pytest.approx(1.0)


def test_the_hand_written_split_trains_the_whole_model_as_centralized_sgd_does() -> None:
    """bench engine's reference split (HAND_SPLIT): with one device, its steps are centralized SGD on the same model
    (the chain rule through the cut), to float rounding; with two, a step moves the server and that device's client
    blocks and no other device's."""
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(6, 5), nn.ReLU()), nn.Linear(5, 4), nn.Sequential(nn.ReLU(), nn.Linear(4, 3))]
    x, y = torch.randn(3, 8, 6), torch.randint(0, 3, (3, 8))
    for cut in (1, 2):
        split = bench_engine.HandSplit(blocks, cut, devices=1, lr=0.1)
        central = copy.deepcopy(nn.Sequential(*blocks))
        opt = torch.optim.SGD(central.parameters(), lr=0.1)
        for k in range(3):
            split.step(0, x[k], y[k])
            opt.zero_grad()
            nn.functional.cross_entropy(central(x[k]), y[k]).backward()
            opt.step()
        for mine, theirs in zip(split.model(0).parameters(), central.parameters(), strict=True):
            torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-6)
        assert not torch.equal(central[0][0].weight, blocks[0][0].weight)     # it trained, away from the start
    two = bench_engine.HandSplit(blocks, 1, devices=2, lr=0.1)
    before = [copy.deepcopy(two.model(d).state_dict()) for d in (0, 1)]
    two.step(0, x[0], y[0])
    after = [two.model(d).state_dict() for d in (0, 1)]
    moved = {d: {k for k in after[d] if not torch.equal(after[d][k], before[d][k])} for d in (0, 1)}
    assert moved[0] == set(after[0]) and moved[1] == {k for k in after[1] if not k.startswith("0.")}


@pytest.mark.parametrize("clock", ["zero", "system"])
def test_engine_bench_clock_orders_the_arrivals_gas_may_serve_together(clock, monkeypatch) -> None:
    """`bench engine --clock`: under the zero-time clock GAS's first slot wins every tie, so each device runs its local
    steps back to back and every server pass holds one arrival; under the generated system's clock the active
    devices interleave and arrivals between two flushes share a pass (AsyncStrategy.defer)."""
    from trainers.strategies.gas import GAS

    sizes: list[int] = []
    serve = GAS.serve
    monkeypatch.setattr(GAS, "serve", lambda self, edge, ctx, arrivals: sizes.append(len(arrivals))
                        or serve(self, edge, ctx, arrivals))
    r = _engine_bench(devices=8, batch_size=4, rounds=1, warmup=0, repeats=1, model="mlp", width=4,
                                      algorithm="gas", threads=1, clock=clock)
    assert r.clock == clock and bench_engine.CLOCKS[clock] in r.report()
    assert sizes and (max(sizes) > 1) == (clock == "system")


@pytest.mark.parametrize("cut, ok", [(0, False), (1, True), (5, True), (6, False)])
def test_engine_bench_cut_must_be_a_cut_point(cut, ok, monkeypatch) -> None:
    from adaptplan.errors import InputError

    # the CIFAR CNN has 5 cut points (`adaptplan profile cnn --input 3x32x32`)
    if ok:   # the cut is accepted: stop before any measurement
        class Measured(Exception):
            pass

        def stop() -> float:
            raise Measured

        monkeypatch.setattr(bench_engine, "time", types.SimpleNamespace(perf_counter=stop))
        with pytest.raises(Measured):
            _engine_bench(devices=1, batch_size=1, rounds=1, warmup=0, repeats=1, width=4, cut=cut)
        return
    with pytest.raises(InputError) as info:
        _engine_bench(devices=1, batch_size=1, rounds=1, warmup=0, repeats=1, width=4, cut=cut)
    assert info.value.field == "--cut"
    assert info.value.message == f"cnn has 5 cut points; the cut must be in 1..5, got {cut}"


def test_peak_rss_is_the_high_water_mark_in_bytes(monkeypatch) -> None:
    import resource
    import sys

    with open("/proc/self/status") as fh:
        high_water_kib = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))
    assert bench_engine._peak_rss_bytes() == pytest.approx(high_water_kib * 1024, rel=0.05)
    # ru_maxrss is in KiB on Linux, in bytes on macOS
    monkeypatch.setattr(resource, "getrusage", lambda who: types.SimpleNamespace(ru_maxrss=1000))
    assert bench_engine._peak_rss_bytes() == 1_024_000
    monkeypatch.setattr(sys, "platform", "darwin")
    assert bench_engine._peak_rss_bytes() == 1000


def _result(**kw) -> EngineBenchResult:
    fields = dict(algorithms=("psl", "sfl-v2"), model="cnn", device="cpu", client_batching="off (auto)", devices=20,
                  batch_size=16, cut=2, rounds=10, repeats=3, threads=4,
                  sfl_samples_per_s={"psl": 800.0, "sfl-v2": 1200.0}, central_b_samples_per_s=1000.0,
                  central_nb_samples_per_s=1600.0)
    fields.update(kw)
    return EngineBenchResult(**fields)


def test_the_engine_report_says_which_algorithms_train_the_whole_model() -> None:
    """FedAvg's kind has no split: bench engine times it at cut L, and its header says so."""
    header = _result(algorithms=("fedavg", "psl"), sfl_samples_per_s={"fedavg": 900.0, "psl": 800.0}).report()
    assert header.splitlines()[0].startswith("cnn on cpu, 20 devices, b = 16, cut 2 (fedavg: the whole model, cut L), ")


def test_engine_result_json_and_report() -> None:
    r = _result(process_peak_rss_bytes=300 * 2**20, per_device_cuts={"psl": "BatchNorm2d in block 1"},
                sfl_seconds_per_round={"psl": 0.32})
    data = r.to_json()
    assert data["algorithms"] == ["psl", "sfl-v2"]
    assert data["ratio_vs_central_b"] == {"psl": 0.8, "sfl-v2": 1.2}
    assert data["ratio_vs_central_Nb"] == {"psl": 0.5, "sfl-v2": 0.75}
    assert data["sfl_samples_per_s"] == {"psl": 800.0, "sfl-v2": 1200.0} and data["process_peak_rss_bytes"] == 300 * 2**20
    assert (r.ratio_b(), r.ratio_nb()) == (0.8, 0.5)                           # the first algorithm by default
    lines = r.report().splitlines()
    assert lines[0] == ("cnn on cpu, 20 devices, b = 16, cut 2, client batching off (auto), client recompute auto, "
                        "server passes of any size, 10 rounds, best of 3 (ratios: median of each repeat's), 4 threads, "
                        "zero-time clock (every stage 0 s: arrivals in device order)")
    assert _result(server_pass_samples=128, client_recompute="on", clock="system").report().splitlines()[0] == (
        "cnn on cpu, 20 devices, b = 16, cut 2, client batching off (auto), client recompute on, server passes of "
        "≤ 128 samples, 10 rounds, best of 3 (ratios: median of each repeat's), 4 threads, the generated system's "
        "clock (arrivals in the order of its latency model)")
    assert _cells(lines[2]) == ["psl", "(simulated)", "800.0", "0.80", "0.50", "-", "0.320", "-"]
    assert _cells(lines[3]) == ["sfl-v2", "(simulated)", "1200.0", "1.20", "0.75", "-", "-", "-"]
    assert _cells(lines[4]) == ["centralized,", "batch", "b", "1000.0", "-"]
    assert _cells(lines[5]) == ["centralized,", "batch", "N·b", "1600.0", "-"]
    assert lines[6].endswith("not measured per side here; the whole process's peak resident set (ru_maxrss) was 300 MiB")
    assert lines[7] == "  psl: client passes ran per device (BatchNorm2d in block 1)" and len(lines) == 8

    cuda = _result(device="cuda:0", peak_memory_bytes={"psl": 3 * 2**20, "sfl-v2": 2**19, "central_b": 2**21,
                                                        "central_Nb": 10 * 2**20}, memory_measure="cuda")
    lines = cuda.report().splitlines()
    assert [_cells(line)[-4:-2] for line in lines[2:4]] == [["3.0", "MiB"], ["0.5", "MiB"]]
    assert [_cells(line)[-2:] for line in lines[4:6]] == [["2.0", "MiB"], ["10.0", "MiB"]]
    assert lines[6] == ("  peak memory: torch.cuda.max_memory_allocated of each side, above the input data; the whole "
                        "process's peak resident set (ru_maxrss) was unknown")
    assert len(lines) == 7
    assert _result(process_peak_rss_bytes=None).report().splitlines()[-1].endswith("(ru_maxrss) was unknown")
    # a population whose N·b batch is not run: its ratio and row say so
    big = _result(devices=1000, central_nb_samples_per_s=None, memory_measure="rss", peak_memory_bytes={"psl": 2**30},
                  process_peak_rss_bytes=2**31)
    assert big.ratio_nb() is None and big.to_json()["ratio_vs_central_Nb"] == {"psl": None, "sfl-v2": None}
    lines = big.report().splitlines()
    assert _cells(lines[2])[:6] == ["psl", "(simulated)", "800.0", "0.80", "-", "1024.0"]
    # measured beside the hand-written split: each algorithm's share of it, and the split's own row and description
    split = _result(split_b_samples_per_s=1600.0, peak_memory_bytes={"split_b": 2**20}, memory_measure="rss")
    assert split.ratio_split("psl") == 0.5 and split.to_json()["ratio_vs_split_b"] == {"psl": 0.5, "sfl-v2": 0.75}
    split_lines = split.report().splitlines()
    assert _cells(split_lines[2])[-1] == "0.50" and _cells(split_lines[3])[-1] == "0.75"
    assert _cells(split_lines[4]) == ["split", "by", "hand,", "batch", "b", "1600.0", "1.60", "1.0", "MiB"]
    assert split_lines[-1] == f"  split by hand: {bench_engine.HAND_SPLIT}" and len(split_lines) == 9
    assert _result().ratio_split() is None and _result().to_json()["ratio_vs_split_b"] == {"psl": None, "sfl-v2": None}
    # with each repeat kept, a ratio is the median of the repeats' own ratios (odd count: the middle one)
    paired = _result(repeat_samples_per_s={"psl": [800.0, 400.0, 600.0], "sfl-v2": [1200.0, 1200.0, 1200.0],
                                           "central_b": [1000.0, 400.0, 1000.0], "central_Nb": [1600.0] * 3})
    assert (paired.ratio_b("psl"), paired.ratio_b("sfl-v2"), paired.ratio_nb("psl")) == (0.8, 1.2, 0.375)
    assert paired.to_json()["ratio_vs_central_b"] == {"psl": 0.8, "sfl-v2": 1.2}
    assert paired.side_ratio("psl", "sfl-v2") == 0.5 and paired.side_ratio("psl", "split_b") is None
    # and the spread of those repeats' ratios beside it: psl 800/1000, 400/400, 600/1000; sfl-v2 1.2, 3, 1.2
    assert paired.paired_ratios("psl", "central_b") == [0.8, 1.0, 0.6]
    assert (paired.ratio_b_range("psl"), paired.ratio_b_range("sfl-v2")) == ((0.6, 1.0), (1.2, 3.0))
    assert paired.to_json()["ratio_vs_central_b_range"] == {"psl": (0.6, 1.0), "sfl-v2": (1.2, 3.0)}
    paired_lines = paired.report().splitlines()
    assert paired_lines[6] == ("  × central b in each repeat, lowest–highest (the table: their median): psl 0.60–1.00, "
                               "sfl-v2 1.20–3.00")
    assert not any("lowest–highest" in line for line in _result().report().splitlines())   # repeats not kept: no line
    one = _result(repeat_samples_per_s={"psl": [800.0], "central_b": [1000.0]})        # one repeat: no spread
    assert one.ratio_b_range("psl") is None and not any("lowest–highest" in line for line in one.report().splitlines())
    uneven = _result(repeat_samples_per_s={"psl": [1.0], "central_b": [1.0, 2.0]})     # not paired: the bests
    assert uneven.ratio_b("psl") == 0.8
    assert lines[5].endswith("not run: N·b = 16,000 samples > 8,192")
    assert lines[6] == ("  peak memory: the resident set's peak during each side (VmHWM) above the resident set when it "
                        "started; the whole process's peak resident set (ru_maxrss) was 2048 MiB")


def test_side_memory_is_the_high_water_mark_above_the_start() -> None:
    with bench_engine.SideMemory() as small:
        keep = bytearray(8 * 2**20 + 12 * 2**10)     # not a whole number of MiB: the KiB→bytes factor shows
    with bench_engine.SideMemory() as large:
        block = bytearray(64 * 2**20)       # touched pages: resident
        del block
    assert small.peak is not None and large.peak is not None
    assert 0.95 * 8 * 2**20 <= small.peak < 40 * 2**20 and small.peak % 1024 == 0     # KiB of /proc, in bytes
    assert 0.95 * 64 * 2**20 <= large.peak < 100 * 2**20   # freed before the end: the peak still counts it
    assert large.high_water >= large.peak + 8 * 2**20       # the process's mark: the side's peak above what stayed
    del keep


def test_the_sweep_table_and_plot(tmp_path, monkeypatch) -> None:
    made = []

    def fake_bench(workload, execution):
        made.append((workload, execution))
        devices = workload.devices
        return _result(devices=devices, sfl_seconds_per_round={"psl": devices / 100, "sfl-v2": devices / 50},
                       peak_memory_bytes={"psl": devices * 2**20, "central_b": 2**20}, memory_measure="rss")

    monkeypatch.setattr(bench_engine, "run_engine_bench", fake_bench)
    said = []
    workload = bench_engine.EngineWorkload(rounds=2, model="mlp")
    execution = ExecutionConfig(threads=1)
    results = bench_engine.run_engine_sweep([20, 200], workload, execution, plot_path=str(tmp_path / "s.png"),
                                            progress=said.append)
    assert made == [(replace(workload, devices=20), execution), (replace(workload, devices=200), execution)]
    assert said == ["20 devices ...", "200 devices ..."] and [r.devices for r in results] == [20, 200]
    assert (tmp_path / "s.png").stat().st_size > 10_000
    figure = bench_engine.sweep_figure(results)
    left, right = figure.axes
    assert [line.get_label() for line in left.lines] == ["psl", "sfl-v2"]
    assert left.lines[0].get_xydata().tolist() == [[20, 0.2], [200, 2.0]]                  # seconds per round
    assert right.lines[0].get_xydata().tolist() == [[20, 20.0], [200, 200.0]]               # MiB
    assert right.lines[2].get_label() == "centralized, batch b" and list(right.lines[2].get_ydata()) == [1.0, 1.0]
    assert [t.get_text() for t in left.get_xticklabels()] == ["20", "200"] and left.get_xscale() == "log"
    assert (left.get_yscale(), right.get_yscale()) == ("log", "linear")
    assert (left.get_ylabel(), right.get_ylabel()) == ("wall-clock seconds per round", "peak memory [MiB]")
    assert [t.get_text() for t in right.get_legend().get_texts()] == ["psl", "sfl-v2", "centralized, batch b"]
    assert left.get_legend() is not None and figure.get_suptitle() == "bench engine: cnn cut 2, b = 16, cpu"
    lines = bench_engine.sweep_table(results).splitlines()
    assert _cells(lines[0]) == ["N", "algorithm", "s/round", "samples/s", "×", "central", "b", "×", "split", "b",
                                "peak", "MiB"]
    assert _cells(lines[1]) == ["20", "psl", "0.200", "800.0", "0.80", "-", "20.0"]
    assert _cells(lines[2]) == ["20", "sfl-v2", "0.400", "1200.0", "1.20", "-", "-"]
    assert _cells(lines[3])[:3] == ["200", "psl", "2.000"] and len(lines) == 5
    # with counted FLOPs: FLOPs per sample × centralized's, and × central b times that (the throughput per FLOP)
    counted = [replace(results[0], flops_per_sample={"psl": 3.0e6, "central_b": 2.0e6}), results[1]]   # N = 200: none
    lines = bench_engine.sweep_table(counted).splitlines()
    assert _cells(lines[0])[-5:] == ["FLOPs", "×", "central", "per", "FLOP"]
    assert _cells(lines[1]) == ["20", "psl", "0.200", "800.0", "0.80", "-", "20.0", "1.50", "1.20"]
    assert _cells(lines[2]) == ["20", "sfl-v2", "0.400", "1200.0", "1.20", "-", "-", "-", "-"]
    halved = [replace(results[0], split_b_samples_per_s=1600.0)]
    assert _cells(bench_engine.sweep_table(halved).splitlines()[1])[4:6] == ["0.80", "0.50"]   # × central b, × split b
    assert _cells(lines[3])[-2:] == ["-", "-"] and len(lines) == 5          # a size counted without FLOPs: dashes


def test_engine_header_names_what_is_timed() -> None:
    workload = bench_engine.EngineWorkload(20, 16, 10, 2, ("psl", "gas"), "mlp", repeats=3)
    assert bench_engine.header(workload, "cuda") == (
        "bench engine: wall-clock samples/s of 10 rounds of simulated psl, gas split training (20 devices x 16 samples, "
        "mlp cut 2) vs centralized training of the same model on the same samples (batch 16 and 20x16) on cuda; best "
        "of 3 interleaved repeats, each ratio the median of the repeats' side-by-side ratios")


def test_a_run_reaching_the_target_exactly_has_reached_it(monkeypatch) -> None:
    import trainers.run.driver
    from adaptplan.benches import runs as bench_runs
    from trainers.run.history import History, RoundRecord

    def record(t, accuracy, sim):
        return RoundRecord(t, 1.0, accuracy, 0.5, sim, 1.0, 0.5 * t, 0, 0, 0, True, False, [1], 1)

    class Fake:
        def __init__(self, config) -> None:
            self.history = History([record(1, 0.25, 2.0), record(2, 0.5, 4.0), record(3, None, 5.0), record(4, 0.75, 7.0)])

        def run(self):
            return self.history

    monkeypatch.setattr(trainers.run.driver, "Trainer", Fake)
    config = dict(algorithm="psl", dataset="synthetic", devices=2, rounds=4, cuts=(3,), progress=False)
    r = bench_runs.run_one({"group": "g", "label": "l", "target": 0.5, "config": config})
    assert (r.rounds_to_target, r.time_to_target_s) == (2, 4.0)                  # 0.5 ≥ 0.5
    assert (r.rounds, r.final_accuracy, r.sim_seconds, r.wall_seconds, r.diverged_round) == (4, 0.75, 7.0, 2.0, None)
    assert r.curve == [(2.0, 0.25), (4.0, 0.5), (7.0, 0.75)] and r.time_to(0.5) == 4.0 and r.time_to(0.8) is None


def test_accuracy_at_a_budget_tolerates_rounding_of_summed_seconds() -> None:
    from adaptplan.benches.runs import RunResult

    # simulated seconds are sums of per-round seconds: an evaluation up to 1e-12 s past the budget is at the budget
    r = RunResult("g", "l", 3, 0.5, 3.0, 1.0, None, None, None, None, None, [(1.0, 0.25), (2.0 + 1e-12, 0.5)])
    assert r.accuracy_at(2.0) == 0.5
    assert r.accuracy_at(2.0 - 1e-9) == 0.25 and r.accuracy_at(0.5) is None


def test_the_scale_benchmark_exits_1_when_a_run_fails() -> None:
    """Issue 25: benchmarks/scale.py printed "failed" and exited 0. 100,000 devices is beyond the generator's cap."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    out = subprocess.run([sys.executable, str(root / "benchmarks" / "scale.py"), "--sizes", "100000", "--kinds",
                          "random"], capture_output=True, text=True, timeout=300, cwd=root)
    assert out.returncode == 1
    assert "random N=100000 seed=0: failed" in out.stdout and "1 run(s) failed" in out.stderr


def test_compare_policies_limits_nodes_never_seconds(monkeypatch) -> None:
    """Table (1)'s MILPs get the node limit and no time limit, so a loaded machine prints the same table."""
    seen = []

    def record(name):
        def solve(problem, **kw):
            seen.append((name, kw))
            return SolveResult(cuts=(1, 1, 1), interval=2, objective=10.0, status="converged", lower_bound=10.0)
        return solve

    monkeypatch.setattr(bench_solvers, "solve_bcd", record("bcd"))
    monkeypatch.setattr(bench_solvers, "solve_exact", record("exact"))
    monkeypatch.setattr(bench_solvers, "BASELINES", {})
    bench_solvers.compare_policies(bench_solvers.random_problem(3, 5, 1), "tiny", seeds=1, node_limit=7)
    assert seen == [("bcd", {"node_limit": 7}), ("exact", {"node_limit": 7})]
