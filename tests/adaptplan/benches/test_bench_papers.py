"""`adaptplan bench papers`: the figures and verdicts of each claim from known runs, the --quick
command's files, and its flag errors (exit 2, one line naming the flag)."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil

import pytest

from adaptplan.benches import papers as bp
from adaptplan.benches.runs import RunResult
from adaptplan.cli import main
from adaptplan.errors import InputError

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
    # interpolated: fast at 1 + (0.3 − 0.2)/(0.35 − 0.2)·1 = 5/3 s, slow at 3 + (0.1/0.2)·3 = 4.5 s
    assert bp.time_ratio(fast, slow, 0.3) == pytest.approx(4.5 / (5 / 3))
    assert bp.time_ratio(slow, fast, 0.3) == pytest.approx((5 / 3) / 4.5)
    assert bp.time_ratio(fast, never, 0.3) == math.inf and bp.time_ratio(never, fast, 0.3) == 0.0
    assert bp.time_ratio(never, never, 0.3) is None
    # seeds: A 3× faster, only B misses the target, A 1.5× faster: holds; the mean is over both-reached seeds
    mid = run(0.5, [(3.0, 0.31)])
    c = bp.compare(TIME, [fast, fast, fast], [slow, never, mid], [0, 1, 2], 0.3)
    assert c.signs == [1, 1, 1] and c.verdict == "holds"
    # seed 0: 4.5 / (5/3) = 2.7; seed 2: mid's first evaluation already above, 3 s (an upper bound) / (5/3) = 1.8
    assert c.mean == pytest.approx(math.sqrt(2.7 * 1.8)) and (c.low, c.high) == pytest.approx((1.8, 2.7))  # geometric
    assert (c.a_missed, c.b_missed) == (0, 1) and c.spread == "1.80..2.70×; B not reached in 1/3 seeds"
    assert c.measured == "2.20× (≤ in seed 2: a side crossed at its first evaluation)"    # mid's 3 s: a bound
    assert c.budgets == [2.0, 2.0, 2.0] and c.a_at_budget == [0.35] * 3 and c.b_at_budget == [None] * 3
    assert c.equal_time == ("at equal simulated time (the shorter run's, mean 2 s): a 35.0% vs b no evaluation by then "
                            "(mean over seeds)")
    late = run(0.25, [(1.0, 0.1), (9.0, 0.25)])      # evaluated before the budget of 6 s, then after it
    c = bp.compare(TIME, [slow], [late], [0], 0.3)
    assert c.budgets == [6.0] and (c.a_at_budget, c.b_at_budget) == ([0.4], [0.1]) and c.verdict == "holds"
    assert c.equal_time == "at equal simulated time (the shorter run's, mean 6 s): a 40.0% vs b 10.0% (mean over seeds)"
    assert bp.compare(ACC, [slow], [late], [0], 0.3).equal_time == ""
    # A misses the target in one seed: the seeds disagree
    c = bp.compare(TIME, [fast, never, fast], [slow, slow, slow], [0, 1, 2], 0.3)
    assert c.signs == [1, -1, 1] and c.a_missed == 1 and c.verdict == "within noise"
    assert "A not reached in 1/3 seeds" in c.spread
    assert (c.low, c.high) == pytest.approx((2.7, 2.7))      # the missed seed's 0 is no ratio of the spread
    # A slower on average (2.7× slower twice, 2.7× faster once): does not hold; nor when nobody reaches the target
    c = bp.compare(TIME, [slow, slow, fast], [fast, fast, slow], [0, 1, 2], 0.3)
    assert c.mean == pytest.approx(2.7 ** (-1 / 3)) and c.signs == [-1, -1, 1]
    assert c.verdict == "does not hold at this scale"
    c = bp.compare(TIME, [fast, fast, slow], [slow, slow, fast], [0, 1, 2], 0.3)
    assert c.mean == pytest.approx(2.7 ** (1 / 3)) and c.verdict == "within noise"
    c = bp.compare(TIME, [slow, slow], [fast, fast], [0, 1], 0.3)
    assert c.mean == pytest.approx(1 / 2.7) and c.verdict == "does not hold at this scale"
    c = bp.compare(TIME, [never, never], [never, never], [0, 1], 0.3)
    assert c.mean is None and c.verdict == "does not hold at this scale"
    assert c.spread == "-; A and B not reached in 2/2 seeds"
    assert c.measured == "-" and c.measured.why == "no seed where both A and B reached the target"
    none = bp.compare(ACC, [run(None)], [run(None)], [0], 0.3)
    assert none.measured == "-" and none.measured.why == "no final accuracy of A and B in any seed"
    assert none.spread == "-" and none.spread.why == none.measured.why
    only_a = bp.compare(TIME, [fast, fast], [never, never], [0, 1], 0.3)   # no finite ratio, every seed agrees
    assert only_a.mean is None and only_a.verdict == "holds"


def test_a_ratio_the_evaluation_grid_bounds_is_reported_as_a_bound() -> None:
    """Issue 69: a side that already had the target at its first evaluation has an upper bound for its time (2 s
    here), so B/A is a lower bound when it is A (≥) and an upper bound when it is B (≤); both: neither."""
    first, slow = run(0.5, [(2.0, 0.4), (4.0, 0.5)]), run(0.5, [(3.0, 0.2), (6.0, 0.4)])     # slow: 4.5 s
    c = bp.compare(TIME, [first, first], [slow, slow], [0, 1], 0.3)
    assert c.bounds == ["≥", "≥"] and c.measured == "≥ 2.25×" and c.verdict == "holds"
    assert [row["value_bound"] for row in c.to_json()["per_seed"]] == ["lower", "lower"]
    assert bp.compare(TIME, [slow], [first], [0], 0.3).measured == "≤ 0.44×"
    both = bp.compare(TIME, [first], [first], [0], 0.3)
    assert both.measured == "1.00× (? in seed 0: a side crossed at its first evaluation)"
    assert both.to_json()["per_seed"][0]["value_bound"] == "unresolved"
    resolved = bp.compare(TIME, [run(0.5, [(1.0, 0.2), (2.0, 0.35)])], [slow], [0], 0.3)
    assert resolved.bounds == [""] and resolved.measured == "2.70×"
    never = run(0.2, [(9.0, 0.2)])            # seed 0: B never reached it (∞, left out of the mean): no bound to say
    mixed = bp.compare(TIME, [first, run(0.5, [(1.0, 0.2), (2.0, 0.35)])], [never, slow], [0, 1], 0.3)
    assert mixed.bounds == ["≥", ""] and mixed.measured == "2.70×"
    mixed = bp.compare(TIME, [never, run(0.5, [(1.0, 0.2), (2.0, 0.35)])], [first, slow], [0, 1], 0.3)
    assert mixed.bounds == ["≤", ""] and mixed.measured == "2.70×"     # A never reached it: 0, left out too


def test_the_plateau_check_prints_enough_digits_to_agree_with_its_label() -> None:
    """Issue 69: a rise of 1.99 points printed "+2.0 pts: plateaued" under its own "< 2 points" rule."""
    assert [bp.agreeing(v, 2.0) for v in (1.99, 1.94, 2.0, 2.04, 1.9999, -0.3, 2 - 1e-12, 2 - 1e-14)] == \
        ["+1.99", "+1.9", "+2.0", "+2.0", "+1.9999", "-0.3", "+1.999999999999", "+1.99999999999999"]
    flat_b = run(0.5, [(t, a) for t, a in zip(range(1, 7), (0.1, 0.2, 0.3, 0.3, 0.3199, 0.32))])
    c = bp.compare(ACC, [flat_b], [flat_b], [0], 0.3)
    assert c.b_rise == pytest.approx(1.995) and c.b_plateaued
    line = bp.plateau_line([dataclasses.replace(c, claim=dataclasses.replace(ACC, paper="p", group="p/iid"))], "p")
    assert "b (iid, global) +1.995 pts: plateaued" in line
    # exactly at the rule's 2 points: not "< 2", so still rising, in the line as in the flag
    at_two = dataclasses.replace(c, claim=dataclasses.replace(ACC, paper="p", group="p/iid"), b_rise=2.0)
    assert at_two.b_plateaued is False
    assert bp.plateau_line([at_two], "p").endswith("b (iid, global) +2.0 pts: STILL RISING")


def test_every_method_of_a_recipe_trains_with_its_one_setting_and_gas_gets_equal_device_steps() -> None:
    """The jobs of one comparison share every training setting (optimizer, rates, momentum, decay, clipping,
    batch, participation, local rounds); GAS runs ⌈R / E⌉ global iterations of C·E device steps, the device
    steps of the synchronous methods' R rounds of C devices."""
    book = bp.catalogue(bp.PAPERS)
    shared = ("optimizer", "lr", "client_lr", "server_lr", "momentum", "weight_decay", "clip_norm", "batch_size",
              "dataset", "model", "devices", "local_test_fraction", "max_test_samples")
    for key, recipe in book.items():
        configs = [j["config"] for j in bp.jobs({key: recipe}, [0, 1, 2])]
        for name in shared:
            assert len({json.dumps(c[name]) for c in configs}) == 1, (key, name)
        for c in configs:
            participation = c["extra"].get("participation", c["extra"].get("active", 0) / c["devices"])
            assert participation == recipe.setting.participation or c["algorithm"] == "sl", (key, c)
            assert c["eval_every"] >= 1 and c["rounds"] // c["eval_every"] >= 10
    gas = {j["label"]: j["config"] for j in bp.jobs({"gas": book["gas"]}, [0])}
    assert gas["gas"]["extra"] == {"active": 10, "local_steps": 20} and gas["sfl-v1"]["interval"] == 20
    assert gas["gas"]["rounds"] * 10 * 20 == gas["sfl-v1"]["rounds"] * 10          # the same device steps
    cyclesl = {j["label"]: j["config"] for j in bp.jobs({"cyclesl": book["cyclesl"]}, [0])}
    assert {c["extra"]["participation"] for c in cyclesl.values()} == {0.05} and cyclesl["psl"]["devices"] == 100
    assert {c["optimizer"] for c in cyclesl.values()} == {"adam"}
    assert book["cyclesl"].claims[0].protocol == "local-sampled" and book["gapsl"].claims[0].protocol == "global"


def test_every_recipe_value_says_where_it_comes_from() -> None:
    from adaptplan.benches import recipes

    for name in recipes.NAMES:
        recipe = recipes.load(name)
        assert set(recipe.sources) >= set(recipe.run) and all(recipe.sources.values()), name
        assert set(recipe.setting.sources) >= {"optimizer", "client_lr", "server_lr", "batch_size", "rounds"}, name
        assert all(v.startswith(("§", "Table", "Implementation", "GAS", "rule:", "Adam", "none", "SFL", "Fig"))
                   for v in {**recipe.sources, **recipe.setting.sources}.values()), name
        assert set(recipe.paper_sources) == set(recipe.paper_scale), name


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace('client_lr = { value = 0.005, source = "§IV-A4: 0.005 for client-side training" }',
                         "client_lr = { value = 0.005 }"), "setting.client_lr: must be"),
    (lambda t: re.sub(r"\nrounds = \{ value = 1200, [^\n]*", "", t, count=1), "setting.rounds: missing"),
    (lambda t: t.replace('a = "gapsl"\nb = "psl"', 'a = "gapsl"\nb = "nobody"'), "a and b must name methods"),
    (lambda t: t + '\nlearning_rate = 3\n', "learning_rate: unknown key"),
    (lambda t: t.replace('metric = "accuracy"', 'metric = "speed"', 1), "metric must be one of"),
    (lambda t: t.replace("[setting]", "[setting\n"), "not TOML"),
])
def test_a_broken_recipe_is_one_error_naming_the_key(edit, message) -> None:
    from importlib import resources

    from adaptplan.benches import recipes
    from adaptplan.errors import InputError

    text = resources.files("adaptplan.benches.recipes").joinpath("gapsl.toml").read_text(encoding="utf-8")
    recipes.parse(text, "gapsl.toml")                         # the shipped file itself is fine
    with pytest.raises(InputError, match=message):
        recipes.parse(edit(text), "gapsl.toml")


def test_the_paper_scale_changes_only_what_it_names() -> None:
    recipe = bp.catalogue(["gapsl"])["gapsl"]
    paper = bp.catalogue(["gapsl"], data_root="/data")["gapsl"]
    a, b = recipe.jobs([0])[0]["config"], paper.jobs([0])[0]["config"]
    changed = {k for k in set(a) | set(b) if a.get(k) != b.get(k)}
    assert changed == {"dataset", "model", "cuts", "batch_size", "rounds", "eval_every", "data_root"}
    assert (b["dataset"], b["model"], b["cuts"], b["batch_size"], b["data_root"]) == ("cifar10", "vgg16-cifar", (4,), 128,
                                                                                     "/data")
    assert paper.setting.sources["batch_size"].startswith("§IV-A4")


def test_quick_run_writes_the_printed_table_json_and_plot(tmp_path, capsys) -> None:
    out = tmp_path / "papers"
    assert main(["bench", "papers", "--quick", "--paper", "gapsl,cyclesl", "--workers", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    table = (out / "table.txt").read_text(encoding="utf-8")
    assert printed == table + f"wrote {out / 'table.txt'}, {out / 'results.json'}, {out / 'accuracy.png'}\n"
    assert (out / "accuracy.png").read_bytes()[:8] == PNG
    data = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert [(c["paper"], c["a"], c["b"], c["protocol"]) for c in data["claims"]] == [
        ("gapsl", "gapsl", "psl", "global"), ("gapsl", "gapsl", "sl", "global"), ("gapsl", "gapsl", "sfl", "global"),
        ("gapsl", "gapsl", "non-lgi", "global"), ("gapsl", "gapsl", "rand-lgi", "global"),
        ("cyclesl", "cyclepsl", "psl", "local-sampled"), ("cyclesl", "cyclesfl", "sfl-v1", "local-sampled")]
    runs = {(r["paper"], r["label"]): r for r in data["runs"]}
    assert len(runs) == len(data["runs"]) == 10 and data["seeds"] == [0]
    for claim in data["claims"]:                          # each claim's figure is its runs' figure, by its protocol
        a, b = runs[claim["paper"], claim["a"]], runs[claim["paper"], claim["b"]]
        key = {"global": "final_accuracy", "local": "final_local_accuracy",
               "local-sampled": "final_local_sampled_accuracy"}[claim["protocol"]]
        assert claim["verdict"] in bp.VERDICTS and claim["verdict"] in table
        assert claim["measured"] == pytest.approx(100 * (a[key] - b[key]))
        assert f"{claim['measured']:+.1f} pts" in table
        assert f"{100 * a['final_accuracy']:.1f}% / {100 * a['final_local_accuracy']:.1f}%" in table
    assert table.count("setting — every method:") == 2                  # once above each paper's claims
    for block in table.split("\n\n")[1:3]:             # each paper's claims: one column start per header name
        lines = block.splitlines()
        head = next(i for i, line in enumerate(lines) if line.startswith("  claim "))
        plateau = next(i for i, line in enumerate(lines) if line.startswith("  plateau check ("))
        rule, rows = lines[head + 1], lines[head + 2:plateau]          # the claims (not the layout table below)
        starts = [i for i in range(1, len(rule)) if rule[i] == "-" and rule[i - 1] == " "]
        assert len(starts) == len(bp.COLUMNS) and len(rows) >= 2
        for row in rows:                                   # every cell begins where its column does, none too wide
            assert all(row[i - 2:i] == "  " and row[i] != " " for i in starts[1:])
        assert all(line == line.rstrip() for line in lines[head:])    # no padding left at a line's end
    assert table.count("  plateau check (") == 2                          # and each paper's baselines checked
    assert "sl (dirichlet α=0.1, global)" in table and "sfl-v1 (dirichlet-equal α=0.1, local)" in table
    assert "(by the claim's local-sampled figure " in table    # CycleSL's participants' figure: checked on the pooled
    assert all("b_rise_pts" in c and "b_plateaued" in c for c in data["claims"])
    margins = [(c["paper_margin"], c["against_paper"]) for c in data["claims"]]     # the recipes' figures, compared
    assert [m for m, _ in margins] == [16.0, 6.0, 2.6, None, None, 9.1, 13.4]
    assert all((m is None) == (v is None) for m, v in margins) and "no number in the paper" in table
    assert "model cnn, cut 1;" in table and "For context" not in table  # no time claim: no equal-time line
    assert "setting — every method: ADAM, lr 0.0003" in table
    assert runs["gapsl", "psl"]["config"]["dataset"] == "synthetic"
    assert data["papers"]["cyclesl"]["setting"]["sources"]["optimizer"].startswith("§4.1")
    for claim in data["claims"]:
        if claim["verdict"] != "holds":
            assert f": {claim['claim']} — measured" in table     # said plainly below the table
    # every run is a run file in the format of `train --config` (issue 37 item 2), and one trains alone as in the bench
    files = sorted((out / "runs").glob("*/*.toml"))
    assert len(files) == len(data["runs"]) and all(f.name.endswith("-seed0.toml") for f in files)
    for f in files:                  # and each trained in the folder of its name: history, run file, result
        folder = f.parent / f.name.removesuffix(".toml")
        assert {"history.json", "config.toml", "bench-result.json"} <= {p.name for p in folder.iterdir()}
    # the same command again trains nothing: every run is read back from its folder, the figures unchanged
    first = (out / "results.json").read_text(encoding="utf-8")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("trainers.run.driver.Trainer.run", lambda self: pytest.fail("a run that ended was trained again"))
        assert main(["bench", "papers", "--quick", "--paper", "gapsl,cyclesl", "--workers", "1", "--out", str(out)]) == 0
    assert f"of {len(files)} runs in {out / 'runs'}, {len(files)} ended before (read back), 0 continue" in capsys.readouterr().err
    assert json.loads((out / "results.json").read_text(encoding="utf-8")) == json.loads(first)
    psl = next(f for f in files if f.parent.name.startswith("gapsl-") and f.name == "psl-seed0.toml")
    assert main(["train", "--config", str(psl), "--out", str(tmp_path / "alone"), "--no-progress"]) == 0
    alone = json.loads((tmp_path / "alone" / "history.json").read_text())
    curve = [[r["sim_seconds"], r["accuracy"]] for r in alone["records"] if r["accuracy"] is not None]
    assert len(curve) >= 2 and curve == [list(point) for point in runs["gapsl", "psl"]["curve"]]    # bit for bit


def test_the_plateau_check_is_the_rise_of_the_mean_curve_from_the_middle_to_the_last_third() -> None:
    seeds = [run(0.0, [(t, a) for t, a in enumerate(accs)]) for accs in (
        [0.10, 0.20, 0.30, 0.40, 0.44, 0.46], [0.10, 0.22, 0.30, 0.38, 0.40, 0.44])]
    # mean curve 0.10 0.21 0.30 0.39 0.42 0.45; thirds of 6 evaluations: (0.30 + 0.39) / 2 → (0.42 + 0.45) / 2
    assert bp.rise(seeds) == pytest.approx(100 * ((0.42 + 0.45) / 2 - (0.30 + 0.39) / 2))     # +9 pts: rising
    flat = [run(0.0, [(t, a) for t, a in enumerate([0.1, 0.3, 0.50, 0.51, 0.52, 0.50, 0.51])])]
    assert bp.rise(flat) == pytest.approx(100 * ((0.50 + 0.51) / 2 - (0.51 + 0.52) / 2))       # 7 evaluations: 2 each
    assert bp.rise([run(0.5, [(1.0, 0.5), (2.0, 0.6)])]) is None                              # too few evaluations
    c = bp.compare(ACC, flat, seeds[:1], [0], 0.3)
    assert c.b_rise == pytest.approx(bp.rise(seeds[:1])) and c.b_plateaued is False
    assert bp.compare(ACC, seeds[:1], flat, [0], 0.3).b_plateaued is True
    grouped = bp.Claim("x", "A beats B", "a", "b", "accuracy", group="x/dirichlet")
    line = bp.plateau_line([bp.compare(grouped, flat * 2, seeds, [0, 1], 0.3),
                            bp.compare(grouped, seeds, flat * 2, [0, 1], 0.3)], "x")
    assert line.endswith("): b (dirichlet, global) +9.0 pts: STILL RISING")     # the first claim on B speaks for it


def test_a_claim_on_the_participants_figure_is_checked_for_a_plateau_on_the_pooled_figure() -> None:
    """The participants' figure (local-sampled) is a new draw of a few devices at each evaluation: its rise is
    printed beside the check, which reads the pooled figure (local) of the same runs; other protocols unchanged."""
    assert [bp.plateau_protocol(p) for p in ("global", "local", "local-sampled")] == ["global", "local", "local"]
    times = range(1, 7)
    pooled, sampled = (0.10, 0.20, 0.30, 0.31, 0.31, 0.32), (0.10, 0.20, 0.05, 0.25, 0.10, 0.30)
    b = dataclasses.replace(run(0.3, [(t, 0.5) for t in times]), local_curve=list(zip(times, pooled)),
                local_sampled_curve=list(zip(times, sampled)), final_local_accuracy=0.32,
                final_local_sampled_accuracy=0.30)
    claim = bp.Claim("p", "A beats B", "a", "b", "accuracy", protocol="local-sampled", group="p/roles")
    c = bp.compare(claim, [b], [b], [0], 0.3)
    # thirds of 6 evaluations: pooled (0.31 + 0.32) / 2 − (0.30 + 0.31) / 2 = +1 pt; sampled (0.10 + 0.30) / 2 −
    # (0.05 + 0.25) / 2 = +5 pts
    assert c.b_rise == pytest.approx(1.0) and c.b_rise_as_judged == pytest.approx(5.0) and c.b_plateaued
    assert bp.plateau_line([c], "p").endswith("b (roles, local) +1.0 pts: plateaued (by the claim's local-sampled "
                                              "figure +5.0 pts)")
    data = c.to_json()
    assert (data["b_rise_protocol"], data["b_rise_claim_protocol_pts"]) == ("local", pytest.approx(5.0))
    ordering = bp.Claim("p", "order", "a", "b", "ordering", protocol="local-sampled", group="p/roles",
                        order=("a", "b"))
    flat = dataclasses.replace(b, local_curve=[(t, 0.3) for t in times], local_sampled_curve=[(t, 0.3) for t in times])
    o = bp.compare_ordering(ordering, {"a": [flat], "b": [b]}, [0])      # the check watches the order's last, B
    assert (o.b_rise, o.b_rise_as_judged) == (pytest.approx(1.0), pytest.approx(5.0))
    on_global = bp.compare(ACC, [b], [b], [0], 0.3)
    assert on_global.b_rise == pytest.approx(0.0) and on_global.b_rise_as_judged is None
    assert bp.plateau_line([dataclasses.replace(on_global, claim=dataclasses.replace(claim, protocol="global"))],
                           "p").endswith("b (roles, global) +0.0 pts: plateaued")


def test_the_hour_tier_is_the_first_half_of_every_full_run() -> None:
    """Half the rounds at the same evaluation rounds, nothing else changed, for every job of every recipe without
    its own [hour_tier] (the others': the next test); and a run of half the rounds is the exact prefix of the whole run
    (the same losses and accuracies), for every method (at the test tier's size, where every recipe's hour tier is
    the first half: the 4 rounds of the test tier are not SCALA's 14,400)."""
    full, hour = bp.catalogue(bp.PAPERS), bp.catalogue(bp.PAPERS, tier="hour")
    assert sorted(name for name in bp.PAPERS if full[name].hour_tier) == ["cyclesl", "cyclesl-shakespeare", "gapsl",
                                                                         "gas", "gas-fmnist", "scala"]
    for name in bp.PAPERS:
        if full[name].hour_tier:
            continue
        for a, b in zip(full[name].jobs([0, 1]), hour[name].jobs([0, 1])):
            changed = {k for k in a["config"] if a["config"][k] != b["config"][k]}
            assert b["config"]["rounds"] * 2 == a["config"]["rounds"], (name, a["label"])
            assert changed == {"rounds"}, (name, a["label"])
            assert a["config"]["rounds"] % (2 * a["config"]["eval_every"]) == 0     # the half ends on an evaluation
    from adaptplan.benches.runs import run_one
    for recipe in bp.catalogue(bp.PAPERS, tier="test").values():
        pairs = list(zip(recipe.jobs([0]), bp.hour_tier(recipe).jobs([0])))
        for job, half_job in pairs[::len(recipe.partitions)]:
            whole = {**job, "config": {**job["config"], "eval_every": 1}}
            half = {**half_job, "config": {**half_job["config"], "eval_every": 1}}
            a, b = run_one(whole), run_one(half)
            assert b.curve == a.curve[:len(b.curve)] and len(a.curve) == 2 * len(b.curve), job["label"]
            assert b.local_curve == a.local_curve[:len(b.local_curve)], job["label"]


@pytest.mark.parametrize("argv, flag", [
    (["--paper", "nope"], "--paper"),
    (["--paper", " , "], "--paper"),
    (["--seeds", "0"], "--seeds"),
    (["--seeds", "1"], "--seeds"),                       # one seed has no spread: only with --quick
    (["--target-accuracy", "1.5"], "--target-accuracy"),
    (["--data-root", "/no/such/folder"], "--data-root"),
    (["--tier", "day"], "--tier"),
    (["--tier", "hour", "--seeds", "1"], "--seeds"),
])
def test_bad_flags_exit_2_with_one_line_naming_the_flag(argv, flag, tmp_path, capsys) -> None:
    out = tmp_path / "never"
    assert main(["bench", "papers", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0], err
    assert not out.exists()                              # refused before anything ran or was written


def test_a_setting_maps_onto_every_algorithm_and_refuses_what_cannot_apply() -> None:
    from adaptplan.benches.comparison import Setting
    from adaptplan.errors import InputError

    base = Setting("sgd", 0.01, 0.02, 0.9, 0.0, 0.0, 16, 0.25, 3, 10)
    assert base.fields("gas", 10)["extra"] == {"active": 3, "local_steps": 3}        # C = ⌈0.25 · 10⌉
    assert Setting("sgd", 0.01, 0.01, 0.9, 0.0, 0.0, 16, 0.01, 2, 10).fields("gas", 10)["extra"]["active"] == 1
    assert base.fields("psl", 10)["interval"] == 3 and "interval" not in base.fields("adaptsfl", 10, planned=True)
    own = Setting("sgd", 0.01, 0.01, 0.9, 0.0, 0.0, 16, 1.0, None, 10)
    assert "interval" not in own.fields("sfl-v1", 10) and own.fields("sl", 10)["extra"] == {}
    assert "local_steps" not in own.fields("gas", 10)["extra"]
    with pytest.raises(InputError, match="sl trains every device"):
        base.fields("sl", 10)
    for bad in (dict(participation=0.0), dict(participation=1.5), dict(local_steps=0)):
        with pytest.raises(InputError, match="must be"):
            Setting(**{**own.to_json(), "sources": {}, **bad})
    assert Setting(**{**own.to_json(), "sources": {}, "participation": 1.0, "local_steps": 1}).local_steps == 1
    both = own.with_overrides(lr=0.5)
    assert (both.client_lr, both.server_lr) == (0.5, 0.5)
    one = own.with_overrides(lr=0.5, client_lr=0.1)
    assert (one.client_lr, one.server_lr) == (0.1, 0.5) and one.sources["client_lr"] == "given on the command line"


def test_recipe_rounds_evaluations_and_policies_reach_the_jobs() -> None:
    from dataclasses import replace

    from adaptplan.benches import recipes

    gas = recipes.load("gas")
    odd = replace(gas, setting=replace(gas.setting, rounds=610), run={**gas.run, "evaluations": 7})
    jobs = {j["label"]: j["config"] for j in odd.jobs([0])}
    assert jobs["gas"]["rounds"] == 31 and jobs["sfl-v1"]["rounds"] == 610          # ⌈610 / 20⌉ iterations
    assert (jobs["gas"]["eval_every"], jobs["sfl-v1"]["eval_every"]) == (4, 87)      # rounds // evaluations
    short = replace(gas, setting=replace(gas.setting, rounds=5), run={**gas.run, "evaluations": 15})
    assert {j["config"]["eval_every"] for j in short.jobs([0])} == {1}
    adapt = {j["label"]: j["config"] for j in recipes.load("adaptsfl").jobs([0]) if j["group"] == "adaptsfl/iid"}
    assert (adapt["adaptsfl"]["policy"], adapt["adaptsfl"]["replan_every"], adapt["adaptsfl"]["reestimate"]) == (
        "adaptsfl", 1, True)                                             # Algorithm 1: Q = I, constants estimated
    assert "reestimate" not in adapt["sfl"]
    assert adapt["rma+rms"]["policy"] == "rma+rms" and "replan_every" not in adapt["rma+rms"]
    assert all("cuts" not in c and "interval" not in c for c in adapt.values())
    assert {j["target"] for j in recipes.load("gas").jobs([0])} == {0.3}


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace('[setting]\n', '[setting]\nbogus = 3\n'), "setting.bogus: must be"),
    (lambda t: t.replace('"§IV-A4: S = 10 client devices"', '"  "'), "its source or rule must be a sentence"),
    (lambda t: re.sub(r"\nevaluations = [^\n]*", "", t, count=1), "evaluations: missing"),
    (lambda t: t + '\n[hour_tier]\nrounds = { value = 1201, rule = "r" }\n',
     r"hour_tier.rounds: must be at most the full run's 1200 rounds \(a first part of it\), got 1201"),
    (lambda t: t + '\n[hour_tier]\nrounds = { value = 100, source = "§1" }\n', "each needs a rule, not a source"),
    (lambda t: t + '\n[hour_tier]\nrounds = { value = 1.5, rule = "r" }\n', "hour_tier.rounds: must be a whole number"),
    (lambda t: t + '\n[hour_tier]\nrounds = { value = 0, rule = "r" }\n', "hour_tier.rounds: must be a whole number"),
    (lambda t: t + '\n[hour_tier]\nrounds = { value = true, rule = "r" }\n', "hour_tier.rounds: must be a whole number"),
    (lambda t: t + '\n[hour_tier]\nhorizon = { value = 3, rule = "r" }\n', "hour_tier.horizon: unknown key"),
    (lambda t: t + '\n[hour_tier]\nrounds = { value = 100, rule = "r" }\nevaluations = { value = 101, rule = "r" }\n',
     "hour_tier.evaluations: must be at most its rounds"),
    (lambda t: t + '\n[hour_tier]\nevaluations = { value = 601, rule = "r" }\n',
     "hour_tier.evaluations: must be at most its rounds"),      # without rounds: half the full run's 1,200
])
def test_more_broken_recipes(edit, message) -> None:
    from importlib import resources

    from adaptplan.benches import recipes
    from adaptplan.errors import InputError

    text = resources.files("adaptplan.benches.recipes").joinpath("gapsl.toml").read_text(encoding="utf-8")
    text, own = re.subn(r"\n\[hour_tier\]\n(?:[^\[\n][^\n]*\n)*", "\n", text)      # the cases state their own
    assert own == 1
    with pytest.raises(InputError, match=message):
        recipes.parse(edit(text), "gapsl.toml")
    with pytest.raises(InputError, match="unknown paper 'nope'"):
        recipes.load("nope")


def test_a_recipes_own_hour_tier_sets_the_first_rounds_and_their_evaluations_with_its_rules() -> None:
    """[hour_tier] (SCALA at 28,800 rounds, its hour tier the first 1,200 evaluated 15 times): the hour tier's
    jobs differ from the full tier's in rounds and evaluation interval only, and the table's setting names the
    rule; without [hour_tier] it is half the rounds (test_the_hour_tier_is_the_first_half_of_every_full_run)."""
    from adaptplan.benches import recipes

    recipe = recipes.load("scala")
    hour = bp.hour_tier(recipe)
    for a, b in zip(recipe.jobs([0, 1]), hour.jobs([0, 1])):
        assert {k for k in a["config"] if a["config"][k] != b["config"][k]} == {"rounds", "eval_every"}
        assert (a["config"]["rounds"], a["config"]["eval_every"]) == (28800, 480)
        assert (b["config"]["rounds"], b["config"]["eval_every"]) == (1200, 80)
    assert hour.setting.sources["rounds"].startswith("rule: the first 60 global iterations")
    assert hour.sources["evaluations"] == "rule: one every 4 global iterations, as before"
    assert recipe.at_paper_scale("/data").hour_tier == {}       # the paper's scale has its own rounds: half of them
    gapsl = recipes.load("gapsl")                  # 1,200 rounds, its hour tier the first 300 evaluated 15 times
    for a, b in zip(gapsl.jobs([0, 1]), bp.hour_tier(gapsl).jobs([0, 1])):
        changed = {k for k in a["config"] if a["config"][k] != b["config"][k]}
        assert (a["config"]["rounds"], a["config"]["eval_every"], b["config"]["rounds"], b["config"]["eval_every"]) \
            == (1200, 40, 300, 20)
        if a["config"]["algorithm"] == "gapsl":     # eq. 2's schedule stays the full run's
            assert changed == {"rounds", "eval_every", "extra"}
            assert b["config"]["extra"] == {**a["config"]["extra"], "horizon": 1200}
        else:
            assert changed == {"rounds", "eval_every"}, a["label"]
    # CycleSL at 48,000 and GAS at 38,400 rounds: their hour tiers are the first halves of the earlier 3,000 and 1,200
    # (the same rounds, evaluated at the same rounds), so that the table's hour-tier figures stay theirs
    expected = {("cyclesl", label): (48000, 400, 1500, 100) for label in ("cyclepsl", "psl", "cyclesfl", "sfl-v1")}
    expected |= {("gas", label): (1920, 16, 30, 2) for label in ("gas", "fedbuff", "ca2fl")}       # asynchronous
    expected |= {("gas", "ca2fl-e50"): (768, 6, 12, 1)}           # Fig. 4's E = 50: the same device steps
    expected |= {("gas", label): (38400, 320, 600, 40) for label in ("sfl-v1", "fedavg", "minibatch-sfl", "s2fl")}
    for name in ("cyclesl", "gas"):
        full = recipes.load(name)
        for a, b in zip(full.jobs([0, 1]), bp.hour_tier(full).jobs([0, 1])):
            assert {k for k in a["config"] if a["config"][k] != b["config"][k]} == {"rounds", "eval_every"}
            assert (a["config"]["rounds"], a["config"]["eval_every"], b["config"]["rounds"], b["config"]["eval_every"]) \
                == expected[name, a["label"]]


def test_when_a_run_evaluates_changes_none_of_its_training() -> None:
    """What lets a recipe's [hour_tier] evaluate at its own rounds: for the methods of every recipe (test tier),
    evaluating every round or only at the end (3 rounds) gives the same training losses round by round and the
    same final accuracy."""
    from trainers.config.train_config import TrainConfig
    from trainers.run.driver import Trainer

    for recipe in bp.catalogue(bp.PAPERS, tier="test").values():
        for job in recipe.jobs([0])[:len(recipe.methods)]:
            runs = [Trainer(TrainConfig.flat(**{**job["config"], "rounds": 3, "eval_every": every})).run()
                    for every in (1, 3)]
            assert [r.train_loss for r in runs[0].records] == [r.train_loss for r in runs[1].records], job["label"]
            assert runs[0].final_accuracy == runs[1].final_accuracy, job["label"]
            assert sum(r.accuracy is not None for r in runs[0].records) > sum(r.accuracy is not None
                                                                             for r in runs[1].records)


def test_the_bench_says_how_many_runs_it_reads_back_and_how_many_continue(tmp_path, capsys, monkeypatch) -> None:
    """run_paper_bench with runs_dir: each run goes to its folder (run_folder), and a line counts the folders that
    hold an ended run (bench-result.json) and those that hold only a checkpoint."""
    book = bp.catalogue(["gapsl"], tier="test")
    todo = bp.jobs(book, [0])
    assert len({json.dumps(j["config"], sort_keys=True, default=list) for j in todo}) == len(todo)
    for job, name in zip(todo, ("bench-result.json", "checkpoint.pt", "checkpoint.pt", "history.json")):
        bp.run_folder(tmp_path, job).mkdir(parents=True)
        (bp.run_folder(tmp_path, job) / name).write_text("{}")
    seen = []

    def no_training(work, *args):
        seen.extend(work)
        return [run(0.5)] * len(work)

    monkeypatch.setattr(bp, "run_jobs", no_training)
    bp.run_paper_bench(book, [0], workers=1, runs_dir=tmp_path)
    assert f"of {len(todo)} runs in {tmp_path}, 1 ended before (read back), 2 continue from their checkpoints and 0 go " \
        "on from their last round to the recipe's longer length\n" in capsys.readouterr().err
    states = iter(("ended", "again", "longer", "again"))
    monkeypatch.setattr(bp, "run_state", lambda folder, job: next(states, "new"))
    bp.run_paper_bench(book, [0], workers=1, runs_dir=tmp_path)
    assert f"of {len(todo)} runs in {tmp_path}, 1 ended before (read back), 0 continue from their checkpoints and 1 go " \
        "on from their last round to the recipe's longer length; 2 ended shorter without their checkpoints train " \
        "again from the start to it\n" in capsys.readouterr().err
    folders = {(w["group"], w["label"]): w["folder"] for w in seen}
    assert folders == {(j["group"], j["label"]): str(bp.run_folder(tmp_path, j)) for j in todo}


def _gapsl_psl_job(tmp_path, **config):
    job = next(j for j in bp.jobs(bp.catalogue(["gapsl"], tier="test"), [0]) if j["label"] == "psl")
    return {**job, "config": {**job["config"], **config}, "folder": str(tmp_path / "psl-seed0")}


def test_a_stopped_run_of_the_bench_continues_from_its_checkpoint_bit_for_bit(tmp_path) -> None:
    """run_one with a folder: a SIGTERM after round 2 of 4 leaves a checkpoint (written at each evaluation, every 2
    rounds here); the next call continues from it and gives the uninterrupted run's curve and final accuracy."""
    import os
    import signal

    from adaptplan.benches.runs import run_one
    from trainers.run.driver import Trainer
    from trainers.run.folder import Interrupted

    job = _gapsl_psl_job(tmp_path)
    assert job["config"]["rounds"] == 4 and job["config"]["eval_every"] == 2
    straight = run_one({k: v for k, v in job.items() if k != "folder"})
    real_round = Trainer._round

    def stop_after_round_2(self, t, out, wall):
        record = real_round(self, t, out, wall)
        if t == 2:
            os.kill(os.getpid(), signal.SIGTERM)        # the Trainer's handler: stop at the end of this round
        return record

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Trainer, "_round", stop_after_round_2)
        with pytest.raises(Interrupted, match="after round 2"):
            run_one(job)
    folder = tmp_path / "psl-seed0"
    assert (folder / "checkpoint.pt").exists() and not (folder / "bench-result.json").exists()
    assert "checkpoint-every = 2\n" in (folder / "config.toml").read_text()      # one at every evaluation
    rounds_trained = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Trainer, "_round", lambda self, t, out, wall: rounds_trained.append(t) or real_round(self, t, out, wall))
        resumed = run_one(job)
    assert rounds_trained == [3, 4]                      # only what was left
    assert resumed.curve == straight.curve and resumed.final_accuracy == straight.final_accuracy
    assert resumed.rounds == straight.rounds == 4 and resumed.sim_seconds == straight.sim_seconds
    stored = json.loads((folder / "bench-result.json").read_text())
    assert {k: stored[k] for k in ("config", "diverged_round", "rounds")} == {
        "config": json.loads(json.dumps(job["config"], sort_keys=True, default=list)), "diverged_round": None,
        "rounds": 4}


def test_an_ended_run_goes_on_to_a_longer_recipe_from_its_last_checkpoint_bit_for_bit(tmp_path) -> None:
    """A recipe that doubles its rounds (its plateau rule) keeping the evaluations' spacing changes only `rounds`:
    run_one then trains an ended run on from its last checkpoint, only the rounds it adds, and gives the run of the
    longer length trained straight (curve, final accuracy, rounds, simulated seconds, the result file); the bench's
    line counts it. Without its checkpoint (a clean clone keeps only the result file) the run trains again from
    round 1 to the longer length, the run trained straight again. GAPSL's schedule reads the total rounds (eq. 2):
    its ended run is not trained on, the setting is refused naming --out; so is an ended run asked for fewer rounds
    or another evaluation spacing."""
    from adaptplan.benches.runs import run_one
    from adaptplan.errors import InputError
    from trainers.run.driver import Trainer

    job = _gapsl_psl_job(tmp_path)
    longer = {**job, "config": {**job["config"], "rounds": 6}}
    straight = run_one({k: v for k, v in longer.items() if k != "folder"})
    run_one(job)                                                     # 4 rounds, ended
    folder = tmp_path / "psl-seed0"
    assert json.loads((folder / "bench-result.json").read_text())["rounds"] == 4
    book = bp.catalogue(["gapsl"], tier="test")
    assert bp.run_state(folder, longer) == "longer" and bp.run_state(folder, job) == "ended"
    real_round, rounds_trained = Trainer._round, []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Trainer, "_round", lambda self, t, out, wall: rounds_trained.append(t) or real_round(self, t, out, wall))
        extended = run_one(longer)
    assert rounds_trained == [5, 6]
    assert extended.curve == straight.curve and extended.final_accuracy == straight.final_accuracy
    assert extended.rounds == straight.rounds == 6 and extended.sim_seconds == straight.sim_seconds
    assert json.loads((folder / "bench-result.json").read_text())["rounds"] == 6
    assert run_one(longer) == extended                               # read back now
    longest = {**longer, "config": {**longer["config"], "rounds": 8}}
    assert bp.run_state(folder, longest) == "longer"
    stored = json.loads((folder / "bench-result.json").read_text())
    (folder / "bench-result.json").write_text(json.dumps({**stored, "diverged_round": 6}))
    assert bp.run_state(folder, longest) == "ended"                  # a diverged run is not trained on
    (folder / "bench-result.json").write_text(json.dumps(stored))
    for kept in folder.iterdir():                   # a clean clone: the result file alone, nothing to go on from
        if kept.name != "bench-result.json":
            shutil.rmtree(kept) if kept.is_dir() else kept.unlink()
    assert bp.run_state(folder, longest) == "again"                  # so from the start
    straightest = run_one({k: v for k, v in longest.items() if k != "folder"})
    rounds_trained.clear()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Trainer, "_round", lambda self, t, out, wall: rounds_trained.append(t) or real_round(self, t, out, wall))
        again = run_one(longest)
    assert rounds_trained == list(range(1, 9))
    assert (again.curve, again.final_accuracy, again.rounds, again.sim_seconds) \
        == (straightest.curve, straightest.final_accuracy, 8, straightest.sim_seconds)
    assert json.loads((folder / "bench-result.json").read_text())["rounds"] == 8
    assert bp.run_state(folder, longest) == "ended" and run_one(longest) == again
    with pytest.raises(InputError, match="ended with another setting \\(rounds differ\\)") as err:
        run_one(job)                                                 # fewer rounds than it trained
    assert err.value.field == "--out"
    spaced = {**longer, "config": {**longer["config"], "rounds": 12, "eval_every": 4}}
    with pytest.raises(InputError, match="another setting \\(eval_every, rounds differ\\)"):
        run_one(spaced)
    gapsl = next(j for j in bp.jobs(book, [0]) if j["label"] == "gapsl")
    gapsl = {**gapsl, "folder": str(tmp_path / "gapsl-seed0")}
    run_one(gapsl)
    with pytest.raises(InputError, match="another setting \\(rounds differ\\)"):
        run_one({**gapsl, "config": {**gapsl["config"], "rounds": 6}})


def test_an_ended_run_reads_back_from_its_result_file_alone_for_any_target(tmp_path) -> None:
    """bench-result.json keeps the evaluated rounds and the last one (6 rounds, evaluated every 4: rounds 4 and 6
    of 6): with history.json and the checkpoint gone, reading the run back gives the trained run's RunResult, at
    the job's target and at another one (time and rounds to target, convergence, seconds, both protocols)."""
    from adaptplan.benches.runs import run_one
    from adaptplan.errors import InputError

    job = _gapsl_psl_job(tmp_path, rounds=6, eval_every=4)
    trained = run_one(job)
    folder = tmp_path / "psl-seed0"
    stored = json.loads((folder / "bench-result.json").read_text())
    assert [r["round"] for r in stored["history"]["records"]] == [4, 6] and stored["rounds"] == 6
    full = json.loads((folder / "history.json").read_text())
    for name in ("history.json", "history.csv", "checkpoint.pt"):
        (folder / name).unlink()
    assert run_one(job) == trained
    lower = {**job, "target": trained.final_accuracy}
    again = run_one(lower)
    assert again.time_to_target_s == next(r["sim_seconds"] for r in full["records"]
                                          if r["accuracy"] is not None and r["accuracy"] >= trained.final_accuracy)
    assert again.rounds == 6 and again.sim_seconds == full["records"][-1]["sim_seconds"] > 0
    for bad in (1, 0, True, None, "6"):
        (folder / "bench-result.json").write_text(json.dumps({**stored, "rounds": bad}))
        with pytest.raises(InputError, match=f"must be the run's round count, at least its 2 records, got {bad!r}"):
            run_one(job)
    (folder / "bench-result.json").write_text(json.dumps({**stored, "rounds": 2}))    # as many rounds as records
    assert run_one(job).rounds == 2
    (folder / "bench-result.json").write_text(json.dumps({**stored, "history": [1]}))
    with pytest.raises(InputError, match="must be the run's evaluations as a history object") as err:
        run_one(job)
    assert err.value.field.endswith("bench-result.json: history")
    # a run stored before an option existed reads back where the job has the option's old value, and only there
    older = {**stored, "config": {k: v for k, v in stored["config"].items() if k != "head_clip"}}
    (folder / "bench-result.json").write_text(json.dumps(older))
    assert run_one({**job, "config": {**job["config"], "head_clip": 0.0}}) == trained
    with pytest.raises(InputError, match=r"another setting \(head_clip differ\)"):
        run_one({**job, "config": {**job["config"], "head_clip": 1.0}})


def test_what_the_result_file_keeps_of_a_history_summarises_as_the_whole_history() -> None:
    """evaluations_only on a history whose last round is not evaluated (a diverged run's), whose final evaluation
    is in its metadata and whose first evaluations lie below the convergence floor (2/M, M = 4 classes): summarised
    with the whole run's round count it gives the whole history's RunResult, field by field, at three targets."""
    from adaptplan.benches.runs import evaluations_only, summarise
    from trainers.run.history import History, RoundRecord

    accuracy = dict(zip(range(2, 27, 2), (0.30, 0.31, 0.32, 0.33, 0.34, 0.35,           # below the floor
                                          0.55, 0.60, 0.605, 0.61, 0.615, 0.62, 0.625)))
    records = [RoundRecord(t, 1.0 / t, accuracy.get(t), None, 1.5 * t, 1.5, 0.1 * t, 0, 0, 0, True, False, [1], 1)
               for t in range(1, 28)]
    history = History(records, {"num_classes": 4, "final_evaluation": {"accuracy": 0.7}, "other": 1})
    kept = evaluations_only(history)
    assert [r.round for r in kept.records] == [*range(2, 27, 2), 27]
    assert [r.round for r in evaluations_only(History(records[:26])).records] == [*range(2, 27, 2)]  # ends evaluated
    assert kept.meta == {"num_classes": 4, "final_evaluation": {"accuracy": 0.7}}
    assert (history.converged_round(), History(records, {}).converged_round()) == (26, 12)   # the floor matters
    for target in (0.5, 0.61, 0.9):
        job = {"group": "g", "label": "l", "target": target}
        assert summarise(job, kept, 27, rounds=27) == summarise(job, history, 27)
    whole = summarise({"group": "g", "label": "l", "target": 0.5}, history)
    assert (whole.rounds, whole.final_accuracy, whole.sim_seconds, whole.time_to_target_s, whole.converged_round) == \
        (27, 0.7, 40.5, 18 + 0.75 * 3, 26)          # 0.35 at 18 s, 0.55 at 21 s: 0.5 three quarters of the way


def test_a_folder_holding_a_run_of_another_setting_is_refused_not_overwritten(tmp_path) -> None:
    from adaptplan.benches.runs import run_one
    from adaptplan.errors import InputError

    run_one(_gapsl_psl_job(tmp_path))
    history = (tmp_path / "psl-seed0" / "history.json").read_bytes()
    with pytest.raises(InputError, match=r"holds a run that ended with another setting \(rounds differ\)") as err:
        run_one(_gapsl_psl_job(tmp_path, rounds=2))       # fewer rounds (more go on: the test above)
    assert err.value.field == "--out"
    assert (tmp_path / "psl-seed0" / "history.json").read_bytes() == history
    for bad in ('"x"', "0", "true"):
        (tmp_path / "psl-seed0" / "bench-result.json").write_text(f'{{"config": {{}}, "diverged_round": {bad}}}')
        with pytest.raises(InputError, match="must be a round ≥ 1 or null") as err:
            run_one(_gapsl_psl_job(tmp_path))
        assert err.value.field.endswith("bench-result.json: diverged_round")


def test_a_folder_with_a_history_but_neither_result_nor_checkpoint_trains_afresh(tmp_path) -> None:
    """What a run that failed before its first checkpoint leaves (its history only): the next call starts again."""
    from adaptplan.benches.runs import run_one

    first = run_one(_gapsl_psl_job(tmp_path))
    for name in ("bench-result.json", "checkpoint.pt"):
        (tmp_path / "psl-seed0" / name).unlink()
    again = run_one(_gapsl_psl_job(tmp_path))
    assert again.rounds == 4 and again.curve == first.curve
    assert (tmp_path / "psl-seed0" / "bench-result.json").exists()


PSL = 'label = "psl"\nalgorithm = "psl"'
"""gapsl.toml's second method, which the hostile cases below edit."""


@pytest.mark.parametrize(("old", "new", "message"), [
    # issue 67: 333 of 7,969 hostile edits of the five recipes were internal errors (TypeError, ZeroDivisionError,
    # KeyError, OverflowError...) and wrong kinds of value were taken; each is now one error naming the key
    ('devices = { value = 10,', 'devices = { value = "10",', r"setting\.devices: must be a whole"),
    ('momentum = { value = 0.9,', 'momentum = { value = true,', r"setting\.momentum: must be a finite"),
    ('momentum = { value = 0.9,', 'momentum = { value = nan,', r"setting\.momentum: must be a finite"),
    ('batch_size = { value = 16,', 'batch_size = { value = inf,', r"setting\.batch_size: must be a whole"),
    ('evaluations = { value = 30,', 'evaluations = { value = 0,', r"setting\.evaluations: must be a whole number ≥ 1"),
    ('evaluations = { value = 30,', 'evaluations = { value = 5000,', r"setting\.evaluations: must be at most its rounds \(1200\)"),
    ('rounds = { value = 1200,', 'rounds = { value = -1,', r"setting\.rounds: must be a whole number ≥ 1"),
    ('[setting]\n', '[setting]\ntarget_accuracy = { value = 1.5, rule = "r" }\n',
     r"setting\.target_accuracy: must be a fraction in \(0, 1\]"),
    ('dataset = { value = "mnist-subset",', 'dataset = { value = 7,', r"setting\.dataset: must be a text"),
    ('dataset = { value = "mnist-subset",', 'dataset = { value = "nope",',
     r"method 'gapsl' on 'dirichlet α=0\.1': dataset: unknown value 'nope'"),
    ('batch_size = { value = 128,', 'batch_size = { value = 0,',
     r"method 'gapsl' on .*: paper_scale: batch_size"),
    (PSL, PSL + '\npolicy = 3', r"method\[1\]\.policy: must be a text"),
    (PSL, PSL + '\nreplan_every = 1.5', r"method\[1\]\.replan_every: must be a whole number"),
    (PSL, PSL + '\noptions = { leader = 3 }', r"method 'psl' on .*"),
    (PSL, PSL + '\ncolour = 1', r"method\[1\]\.colour: unknown key"),
    (PSL, 'label = 3\nalgorithm = "psl"',
     r"method\[1\]: needs a label and an algorithm"),
    (PSL, 'label = "psl"\nalgorithm = 3',
     r"method\[1\]: needs a label and an algorithm"),
    ('metric = "accuracy"\npaper = "+16.0', 'metric = ["accuracy"]\npaper = "+16.0',
     r"claim\[0\]\.metric: must be a text"),
    ('\npaper = "Table I,', '\npartition = 3\npaper = "Table I,',
     r"partition: must be an array of one or more tables"),
])
def test_a_hostile_recipe_is_one_error_naming_the_key(old, new, message) -> None:
    from importlib import resources

    from adaptplan.benches import recipes
    from adaptplan.errors import InputError

    text = resources.files("adaptplan.benches.recipes").joinpath("gapsl.toml").read_text(encoding="utf-8")
    edited = text.replace(old, new)
    assert edited != text
    with pytest.raises(InputError, match=message):
        recipes.parse(edited, "gapsl.toml")


def test_a_recipe_at_the_edges_of_its_ranges_is_taken() -> None:
    """One evaluation, evaluations equal to the rounds, a target of 1: valid (the hostile cases' edges)."""
    from importlib import resources

    from adaptplan.benches import recipes

    text = resources.files("adaptplan.benches.recipes").joinpath("gapsl.toml").read_text(encoding="utf-8")
    one = recipes.parse(text.replace('evaluations = { value = 30,', 'evaluations = { value = 1,'), "gapsl.toml")
    assert one.jobs([0])[0]["config"]["eval_every"] == 1200
    every = recipes.parse(text.replace('evaluations = { value = 30,', 'evaluations = { value = 1200,')
                          .replace('[setting]\n', '[setting]\ntarget_accuracy = { value = 1, rule = "r" }\n'), "gapsl.toml")
    assert every.jobs([0])[0]["config"]["eval_every"] == 1 and every.target_accuracy == 1.0


def test_the_run_table_keeps_its_columns_for_long_method_labels() -> None:
    """A method label longer than the column's 10 characters (minibatch-sfl) widens the column: every row's seed
    figure starts where the header's does."""
    from adaptplan.benches.papers import run_table

    todo = [{"group": "scala/quantity α=2", "label": label, "seed": 0, "target": 0.3} for label in ("scala", "minibatch-sfl")]
    results = [run(0.4, [(1.0, 0.2), (2.0, 0.4)]), run(0.3, [(1.0, 0.1), (2.0, 0.3)])]
    lines = run_table(todo, results).splitlines()
    header, rows = lines[1], lines[2:4]
    end = header.index("seed 0") + len("seed 0")
    assert [row[:end].split()[-5:] for row in rows] == [["40.0%", "/", "-", "/", "-"], ["30.0%", "/", "-", "/", "-"]], rows


@pytest.mark.parametrize("metric,margin,mean,bound,expected", [
    ("accuracy", 5.0, 6.0, "", "as large"), ("accuracy", 5.0, 5.0, "", "as large"), ("accuracy", 5.0, 4.9, "", "weaker"),
    ("accuracy", 5.0, 0.0, "", "opposite"), ("accuracy", 5.0, -1.0, "", "opposite"), ("accuracy", None, 6.0, "", ""),
    ("time", 2.0, 2.5, "", "as large"), ("time", 2.0, 1.5, "", "weaker"), ("time", 2.0, 1.0, "", "opposite"),
    ("time", 2.0, 0.5, "", "opposite"), ("time", 2.0, 1.5, "≥", "weaker or more (a bound)"),
    ("time", 2.0, 2.5, "≤", "as large or less (a bound)"), ("time", 2.0, None, "", "")])
def test_a_measured_margin_is_set_against_the_papers_figure(metric, margin, mean, bound, expected) -> None:
    """The paper's figure as data (a claim's ``margin``): the measured mean at least as large, weaker in the claimed
    direction, or opposite (no effect or the other way: d ≤ 0, r ≤ 1); a ratio bounded by the evaluation grid says
    it is a bound; nothing without a figure or a mean."""
    claim = bp.Claim("x", "A beats B", "a", "b", metric, margin=margin)
    values = [mean, mean]
    c = bp.Comparison(claim, [0, 1], values, [bp.agreement(v, metric) for v in values], mean, mean, mean, None,
                      bounds=[bound, bound] if metric == "time" else [])
    assert c.against_paper == expected


@pytest.mark.parametrize("metric,margin,message", [
    ("accuracy", 0, "must be percentage points A − B in (0, 100]"), ("accuracy", 100.5, "in (0, 100]"),
    ("time", 1.0, "must be a ratio B/A in (1, 1e+06]"), ("accuracy", "9.9", "got '9.9'"), ("accuracy", True, "got True")])
def test_a_claims_margin_outside_its_units_range_is_refused_naming_it(metric, margin, message) -> None:
    from adaptplan.benches import recipes

    text = (recipes.resources.files("adaptplan.benches.recipes") / "gas.toml").read_text(encoding="utf-8")
    head, _, _ = text.partition("[[claim]]")
    value = f'"{margin}"' if isinstance(margin, str) else str(margin).lower()
    claim = f'[[claim]]\ntext = "x"\na = "gas"\nb = "sfl-v1"\nmetric = "{metric}"\npaper = "y"\nmargin = {value}\n'
    with pytest.raises(InputError) as err:
        recipes.parse(head + claim, "gas.toml")
    assert "gas.toml: claim[0].margin: " in err.value.message and message in err.value.message
    recipes.parse(head + claim.replace(f"margin = {value}", "margin = 100" if metric == "accuracy" else "margin = 1e6"),
                  "gas.toml")                                                             # the top end, inside


def test_every_seeds_runs_train_before_the_next_seeds_the_slowest_of_a_seed_first(monkeypatch) -> None:
    """A full tier over several sittings: a stopped bench has every method of its first seeds, so the training order
    is by seed, then by falling cost (bp.cost) within a seed."""
    book = bp.catalogue(["gas"], tier="test")
    seen = []

    def no_training(work, *args):
        seen.extend(work)
        return [run(0.5)] * len(work)

    monkeypatch.setattr(bp, "run_jobs", no_training)
    todo, _ = bp.run_paper_bench(book, [0, 1], workers=1, progress=False)
    order = [(w["config"]["seed"], -bp.cost(w["config"])) for w in seen]
    assert [s for s, _ in order] == [0] * (len(seen) // 2) + [1] * (len(seen) // 2)
    assert order == sorted(order) and len({c for _, c in order}) > 1


def test_a_runs_cost_counts_the_device_steps_of_its_rounds(monkeypatch) -> None:
    """bp.cost, written out: an asynchronous method's round is a global iteration of C × E device steps (C = active,
    ⌈N/2⌉ with 0; GAS's ×1.5), a synchronous one's a step of ρN devices (PSL's family ×2.5); each work item's
    round_weight (the bar's steps per round) is its cost over its rounds."""
    base = {"rounds": 1000, "devices": 20}
    assert bp.cost({**base, "algorithm": "fedbuff", "extra": {"active": 10, "local_steps": 20}}) == 1000 * 10 * 20
    assert bp.cost({**base, "algorithm": "gas", "extra": {"active": 10, "local_steps": 20}}) == 1.5 * 1000 * 10 * 20
    assert bp.cost({**base, "algorithm": "ca2fl", "extra": {"active": 0, "local_steps": 5}}) == 1000 * 10 * 5
    assert bp.cost({**base, "algorithm": "ca2fl", "extra": {"active": 50, "local_steps": 5}}) == 1000 * 20 * 5
    assert bp.cost({**base, "algorithm": "fedavg", "extra": {"participation": 0.5}}) == 1000 * 20 * 0.5
    assert bp.cost({**base, "algorithm": "psl", "extra": {}}) == 1000 * 20 * bp.PSL_FAMILY_COST
    seen = []

    def no_training(work, *args):
        seen.extend(work)
        return [run(0.5)] * len(work)

    monkeypatch.setattr(bp, "run_jobs", no_training)
    bp.run_paper_bench(bp.catalogue(["gas"], tier="test"), [0], workers=1, progress=False)
    assert seen and all(w["round_weight"] == pytest.approx(bp.cost(w["config"]) / w["config"]["rounds"]) for w in seen)
