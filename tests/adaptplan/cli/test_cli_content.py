"""What the planner-side commands write, checked by content (not existence): ``adaptplan system`` files carry
every option in the right field, ``adaptplan plan`` output is the planner's plan with eq. (26) numbers, and the
plan table reports the §7 worked example's figures, per-stage totals, shares and who sets each stage."""

import json

import pytest

from adaptplan.cli import main
from adaptplan.plan import Plan
from adaptplan.planner import Planner, build_plan
from adaptplan.report import format_plan, stage_totals
from adaptplan.system import SystemProcess, SystemRanges, SystemSpec, generate_system
from tests import reference_model as ref
from tests.worked_example import CUTS


def test_system_options_land_in_their_fields(tmp_path):
    out = tmp_path / "s.json"
    assert main(["system", "--devices", "50", "--seed", "3", "--flops", "1e9", "2e9", "--up-bps", "1e3", "2e3",
                 "--down-bps", "5e6", "6e6", "--server-flops", "7e12", "--edge-fed-bps", "4e6", "--batch-size", "9",
                 "-o", str(out)]) == 0
    system = SystemSpec.load(out)
    ranges = SystemRanges(device_flops=(1e9, 2e9), up_bps=(1e3, 2e3), down_bps=(5e6, 6e6), server_flops=7e12,
                          edge_fed_bps=4e6, batch_size=9)
    assert system == generate_system(50, 3, ranges)
    assert (system.server_flops, system.edge_to_fed_bps, system.fed_to_edge_bps, system.batch_size) == (7e12, 4e6, 4e6, 9)
    for name, (low, high) in {"flops": (1e9, 2e9), "up_bps": (1e3, 2e3), "fed_up_bps": (1e3, 2e3),
                              "down_bps": (5e6, 6e6), "fed_down_bps": (5e6, 6e6)}.items():
        values = system.device_array(name)
        assert low <= values.min() and values.max() <= high, name


def test_system_redraw_round_and_noise_print_that_rounds_state(capsys):
    assert main(["system", "--devices", "5", "--seed", "2", "--redraw", "--round", "3", "--noise-cv", "0.2"]) == 0
    printed = SystemSpec.from_json(json.loads(capsys.readouterr().out))
    process = SystemProcess(generate_system(5, 2), seed=2, redraw=True, noise_cv=0.2)
    assert printed == process.measured(3)
    assert printed != process.state(3)
    assert main(["system", "--devices", "5", "--seed", "2"]) == 0
    assert SystemSpec.from_json(json.loads(capsys.readouterr().out)) == generate_system(5, 2)
    assert main(["system", "--devices", "5", "--redraw", "--round", "0"]) == 2


def test_plan_json_and_output_file_are_the_planners_plan(toy_plan_files, tmp_path, capsys, toy_profile, toy_system):
    paths, constants = toy_plan_files
    out = tmp_path / "plan.json"
    assert main(["plan", "--profile", str(paths["profile"]), "--system", str(paths["system"]), "--constants",
                 str(paths["constants"]), "--json", "-o", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    saved = Plan.load(out)
    expected = Planner(toy_profile, toy_system, constants).plan()
    assert saved.cuts == expected.cuts and saved.interval == expected.interval
    assert printed["cuts"] == list(expected.cuts) and printed["interval"] == expected.interval
    rounds, aggregations, total = ref.exact_total(toy_profile, toy_system, constants,
                                                  saved.interval, saved.cuts)
    assert (saved.rounds, saved.aggregations) == (rounds, aggregations)
    assert saved.total_latency_s == pytest.approx(total, rel=1e-12)
    assert printed["objective_s"] == pytest.approx(
        ref.objective(toy_profile, toy_system, constants, saved.interval, saved.cuts), rel=1e-12)
    # the optimum over the two candidate cuts (1..L-1) and every feasible I, by the reference brute force
    value, interval, cuts = ref.brute_force(toy_profile, toy_system, constants, [1, 2])
    assert saved.objective_s == pytest.approx(value, rel=1e-9) and (saved.interval, saved.cuts) == (interval, cuts)


def test_plan_table_reports_the_worked_example(example):
    profile, system = example.latency.profile, example.latency.system
    plan = build_plan(example, CUTS, 8, {"method": "given"})
    text = format_plan(plan, profile, system, title="worked example", max_devices=None)
    lines = text.splitlines()
    assert lines[0] == "worked example"
    assert "model vgg16, 20 devices, batch 16, L = 16 cut points" in lines
    assert "interval I = 8 rounds; deepest cut L_c = 5 (conv5)" in lines
    assert "cuts used: 4 (conv4) x10, 5 (conv5) x10" in lines
    assert "rounds R = 8,583 (Corollary 1), aggregations = 1,072" in lines
    assert "per-round latency T_split = 0.1669 s, per-aggregation T_agg = 0.4419 s" in lines
    assert any(line.startswith("total latency (eq. 26) = 1,906.2 s  (= 0.53 h); relaxed objective (28) = 1,906.4 s")
               for line in lines)
    rows = {line.split("  ")[0]: line for line in lines if line.split("  ")[0] in (
        "client FP + upload", "server FP", "server BP", "download + client BP", "model upload", "model download")}
    assert len(rows) == 6
    totals = stage_totals(plan, example.latency.breakdown(CUTS))
    assert totals["client FP + upload"] == pytest.approx(8583 * 0.12497, abs=0.05)
    assert totals["model upload"] == pytest.approx(1072 * 0.25298, abs=0.01)
    assert totals["model download"] == pytest.approx(1072 * 0.18891, abs=0.01)
    assert sum(totals.values()) == pytest.approx(plan.total_latency_s, rel=1e-12)
    assert "1,072" in rows["model upload"] and "8,583" in rows["server FP"]
    assert rows["client FP + upload"].rstrip().endswith("device 19  <- dominates")
    assert rows["model upload"].rstrip().endswith("device 19")       # 0.25298 s > the edge server's 0.18891 s
    assert rows["model download"].rstrip().endswith("edge server")   # 0.18891 s > every device's ≤ 0.05075 s
    assert rows["server FP"].rstrip().endswith("edge server")
    assert f"{100 * totals['client FP + upload'] / plan.total_latency_s:.1f}%" in rows["client FP + upload"]
    device_lines = [line for line in lines if line[:1].isdigit()]
    assert len(device_lines) == 20
    slow = device_lines[19].split()
    assert slow[:3] == ["19", "5", "conv5"] and slow[3] == "0.60"
    assert float(slow[-4]) == pytest.approx(124.97, abs=0.01)  # FP+up ms
    assert float(slow[-3]) == pytest.approx(33.94, abs=0.01)   # down+BP ms
    assert float(slow[-2]) == pytest.approx(253.0, abs=0.1)    # model up ms
    exactly = format_plan(plan, profile, system, max_devices=20).splitlines()
    assert not any("slowest" in line for line in exactly)  # 20 devices, 20 rows: all listed, no note
    assert len([line for line in exactly if line[:1].isdigit()]) == 20
    short = format_plan(plan, profile, system, max_devices=3).splitlines()
    assert "the 3 slowest of 20 devices (--all-devices lists every one):" in short
    assert [line.split()[0] for line in short if line[:1].isdigit()][-1] == "19"


def test_report_number_and_table_formats():
    from adaptplan.report import _seconds, format_table

    assert [_seconds(v) for v in (0.5, 1.0, 99.99, 100.0, 1234.56)] == ["0.5000 s", "1.00 s", "99.99 s", "100.0 s",
                                                                         "1,234.6 s"]
    assert format_table(["a", "n"], [["long", "3"], ["b", "12345"]]).splitlines() == [
        "a         n", "----  -----", "long      3", "b     12345"]
    assert format_table(["name", "x"], []).splitlines() == ["name  x", "----  -"]


def test_device_table_defaults_to_the_20_slowest_after_a_blank_line():
    from tests.solver_instances import vgg16_problem

    problem = vgg16_problem(num_devices=25)
    plan = build_plan(problem, (2,) * 25, 4, {"method": "given"})
    lines = format_plan(plan, problem.latency.profile, problem.latency.system).splitlines()
    note = lines.index("the 20 slowest of 25 devices (--all-devices lists every one):")
    assert lines[note - 1] == "" and lines[note + 1].startswith("device")
    assert len([line for line in lines if line[:1].isdigit()]) == 20
    full = format_plan(plan, problem.latency.profile, problem.latency.system, max_devices=None).splitlines()
    header = next(k for k, line in enumerate(full) if line.startswith("device"))
    assert full[header - 1] == "" and full[header - 2].startswith("model download")
    stage_header = next(k for k, line in enumerate(full) if line.startswith("stage"))
    assert full[stage_header - 1] == "" and full[stage_header - 2].startswith("solver: method given")
