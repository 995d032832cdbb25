"""`adaptplan bench papers`: the figures and verdicts of each claim from known runs, the --quick
command's files, and its flag errors (exit 2, one line naming the flag)."""

from __future__ import annotations

import json
import math

import pytest

from adaptplan import bench_papers as bp
from adaptplan.bench_runs import RunResult
from adaptplan.cli import main

PNG = b"\x89PNG\r\n\x1a\n"
ACC = bp.Claim("x", "A beats B", "a", "b", "accuracy")
TIME = bp.Claim("x", "A reaches the target sooner than B", "a", "b", "time")


def run(final: float | None, curve: list[tuple[float, float]] = ()) -> RunResult:
    curve = list(curve) or [(1.0, final or 0.0)]
    return RunResult("g", "l", 10, final, curve[-1][0], 1.0, None, None, None, None, None, curve)


def by_final(*finals: float) -> list[RunResult]:
    return [run(f) for f in finals]


def test_accuracy_claim_holds_only_when_every_seed_agrees() -> None:
    c = bp.compare(ACC, by_final(0.50, 0.40, 0.45), by_final(0.40, 0.35, 0.44), [0, 1, 2], 0.3)
    assert c.values == pytest.approx([10.0, 5.0, 1.0])
    assert c.mean == pytest.approx(16 / 3) and (c.low, c.high) == pytest.approx((1.0, 10.0))
    assert c.std == pytest.approx(math.sqrt(((10 - 16 / 3) ** 2 + (5 - 16 / 3) ** 2 + (1 - 16 / 3) ** 2) / 2))
    assert c.signs == [1, 1, 1] and c.verdict == "holds"
    assert c.measured == "+5.3 pts" and c.spread == f"+1.0..+10.0 (±{c.std:.1f})"


def test_accuracy_claim_with_disagreeing_seeds_is_within_noise() -> None:
    c = bp.compare(ACC, by_final(0.50, 0.40, 0.45), by_final(0.40, 0.42, 0.44), [0, 1, 2], 0.3)
    assert c.values == pytest.approx([10.0, -2.0, 1.0]) and c.signs == [1, -1, 1]
    assert c.mean == pytest.approx(3.0) and c.verdict == "within noise"


def test_accuracy_claim_with_the_wrong_mean_does_not_hold() -> None:
    c = bp.compare(ACC, by_final(0.30, 0.40, 0.45), by_final(0.40, 0.38, 0.46), [0, 1, 2], 0.3)
    assert c.mean == pytest.approx((-10 + 2 - 1) / 3) and c.verdict == "does not hold at this scale"
    every = bp.compare(ACC, by_final(0.3, 0.3), by_final(0.4, 0.5), [0, 1], 0.3)
    assert every.signs == [-1, -1] and every.verdict == "does not hold at this scale"
    tie = bp.compare(ACC, by_final(0.4), by_final(0.4), [0], 0.3)      # no advantage is no support
    assert tie.mean == 0 and tie.verdict == "does not hold at this scale"


def test_time_ratio_counts_runs_that_never_reach_the_target() -> None:
    fast, slow, never = run(0.5, [(1.0, 0.2), (2.0, 0.35)]), run(0.5, [(3.0, 0.2), (6.0, 0.4)]), run(0.2, [(9.0, 0.2)])
    assert bp.time_ratio(fast, slow, 0.3) == pytest.approx(3.0)           # 6 s / 2 s
    assert bp.time_ratio(slow, fast, 0.3) == pytest.approx(1 / 3)
    assert bp.time_ratio(fast, never, 0.3) == math.inf and bp.time_ratio(never, fast, 0.3) == 0.0
    assert bp.time_ratio(never, never, 0.3) is None
    # seeds: A 3× faster, only B misses the target, A 1.5× faster: holds; the mean is over both-reached seeds
    mid = run(0.5, [(3.0, 0.31)])
    c = bp.compare(TIME, [fast, fast, fast], [slow, never, mid], [0, 1, 2], 0.3)
    assert c.signs == [1, 1, 1] and c.verdict == "holds"
    assert c.mean == pytest.approx(math.sqrt(4.5)) and (c.low, c.high) == pytest.approx((1.5, 3.0))   # geometric
    assert (c.a_missed, c.b_missed) == (0, 1) and c.spread == "1.50..3.00×; B not reached in 1/3 seeds"
    assert c.measured == "2.12×"
    assert c.budgets == [2.0, 2.0, 2.0] and c.a_at_budget == [0.35] * 3 and c.b_at_budget == [None] * 3
    assert c.equal_time == "at equal simulated time (the shorter run's, mean 2 s): a 35.0% vs b - (mean over seeds)"
    late = run(0.25, [(1.0, 0.1), (9.0, 0.25)])      # evaluated before the budget of 6 s, then after it
    c = bp.compare(TIME, [slow], [late], [0], 0.3)
    assert c.budgets == [6.0] and (c.a_at_budget, c.b_at_budget) == ([0.4], [0.1]) and c.verdict == "holds"
    assert c.equal_time == "at equal simulated time (the shorter run's, mean 6 s): a 40.0% vs b 10.0% (mean over seeds)"
    assert bp.compare(ACC, [slow], [late], [0], 0.3).equal_time == ""
    # A misses the target in one seed: the seeds disagree
    c = bp.compare(TIME, [fast, never, fast], [slow, slow, slow], [0, 1, 2], 0.3)
    assert c.signs == [1, -1, 1] and c.a_missed == 1 and c.verdict == "within noise"
    assert "A not reached in 1/3 seeds" in c.spread
    # A slower on average (3× slower twice, 3× faster once): does not hold; nor when nobody reaches the target
    c = bp.compare(TIME, [slow, slow, fast], [fast, fast, slow], [0, 1, 2], 0.3)
    assert c.mean == pytest.approx(3 ** (-1 / 3)) and c.signs == [-1, -1, 1]
    assert c.verdict == "does not hold at this scale"
    c = bp.compare(TIME, [fast, fast, slow], [slow, slow, fast], [0, 1, 2], 0.3)
    assert c.mean == pytest.approx(3 ** (1 / 3)) and c.verdict == "within noise"
    c = bp.compare(TIME, [slow, slow], [fast, fast], [0, 1], 0.3)
    assert c.mean == pytest.approx(1 / 3) and c.verdict == "does not hold at this scale"
    c = bp.compare(TIME, [never, never], [never, never], [0, 1], 0.3)
    assert c.mean is None and c.verdict == "does not hold at this scale"
    assert c.spread == "-; A and B not reached in 2/2 seeds"
    only_a = bp.compare(TIME, [fast, fast], [never, never], [0, 1], 0.3)   # no finite ratio, every seed agrees
    assert only_a.mean is None and only_a.verdict == "holds"


def test_the_catalogue_passes_no_training_settings_and_gas_gets_equal_device_steps() -> None:
    for job in bp.jobs(bp.PAPERS, [0, 1, 2]):
        config = job["config"]
        assert not set(config) & {"lr", "momentum", "weight_decay", "optimizer", "clip_norm", "interval"}, config
        assert config["eval_every"] >= 1 and config["rounds"] // config["eval_every"] >= 10
    active, local = bp.gas_steps(10)
    gas = next(j for j in bp.jobs(["gas"], [0]) if j["label"] == "gas")["config"]
    assert gas["rounds"] == math.ceil(150 * 10 / (active * local))
    scala = [j["config"] for j in bp.jobs(["scala"], [0])]
    assert all(c["devices"] == 20 and c["extra"] == {"participation": 0.2} for c in scala)


def test_quick_run_writes_the_printed_table_json_and_plot(tmp_path, capsys) -> None:
    out = tmp_path / "papers"
    assert main(["bench", "papers", "--quick", "--workers", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    table = (out / "table.txt").read_text(encoding="utf-8")
    assert printed == table + f"wrote {out / 'table.txt'}, {out / 'results.json'}, {out / 'accuracy.png'}\n"
    assert (out / "accuracy.png").read_bytes()[:8] == PNG
    data = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert [(c["paper"], c["a"], c["b"]) for c in data["claims"]] == [
        ("gapsl", "gapsl", "psl"), ("scala", "scala", "sfl-v1"), ("scala", "scala", "sfl-v2"),
        ("cyclesl", "cyclepsl", "psl"), ("cyclesl", "cyclesfl", "sfl-v1"), ("gas", "gas", "sfl-v1"),
        ("adaptsfl", "adaptsfl", "rma+rms"), ("adaptsfl", "adaptsfl", "sfl")]
    runs = {(r["paper"], r["label"]): r for r in data["runs"]}
    assert len(runs) == len(data["runs"]) == 14 and data["seeds"] == [0]
    for claim in data["claims"]:                          # each claim's figure is its runs' figure
        a, b = runs[claim["paper"], claim["a"]], runs[claim["paper"], claim["b"]]
        assert claim["verdict"] in bp.VERDICTS and claim["verdict"] in table
        if claim["metric"] == "accuracy":
            assert claim["measured"] == pytest.approx(100 * (a["final_accuracy"] - b["final_accuracy"]))
            assert f"{claim['measured']:+.1f} pts" in table
        assert f"{100 * a['final_accuracy']:.1f}%" in table
    # a run two papers share is trained once: the same curve in both
    assert runs["gapsl", "psl"]["curve"] == runs["cyclesl", "psl"]["curve"]
    assert runs["gapsl", "psl"]["config"]["dataset"] == "synthetic"
    for claim in data["claims"]:
        if claim["verdict"] != "holds":
            assert f": {claim['claim']} — measured" in table     # said plainly below the table


def test_only_the_named_papers_run(tmp_path, capsys) -> None:
    out = tmp_path / "one"
    assert main(["bench", "papers", "--quick", "--papers", "gas", "--workers", "1", "--out", str(out)]) == 0
    data = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert {r["paper"] for r in data["runs"]} == {"gas"} and [c["paper"] for c in data["claims"]] == ["gas"]
    assert "gapsl" not in capsys.readouterr().out


@pytest.mark.parametrize("argv, flag", [
    (["--papers", "nope"], "--papers"),
    (["--papers", " , "], "--papers"),
    (["--seeds", "0"], "--seeds"),
    (["--seeds", "1"], "--seeds"),                       # one seed has no spread: only with --quick
    (["--rounds", "0"], "--rounds"),
    (["--target-accuracy", "1.5"], "--target-accuracy"),
])
def test_bad_flags_exit_2_with_one_line_naming_the_flag(argv, flag, tmp_path, capsys) -> None:
    out = tmp_path / "never"
    assert main(["bench", "papers", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0], err
    assert not out.exists()                              # refused before anything ran or was written
