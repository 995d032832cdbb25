"""The examples run as documented."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_replan_example_runs_and_replans():
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "replan_in_loop.py"), "--rounds", "60"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("round 1: cuts")
    assert "simulated seconds" in lines[-1]


def run_example(name: str, *args: str, cwd: Path | None = None) -> list[str]:
    result = subprocess.run([sys.executable, str(ROOT / "examples" / name), *args], capture_output=True, text=True,
                            timeout=300, cwd=cwd)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()


def test_planning_your_own_module_profiles_estimates_plans_and_trains_with_the_plan(tmp_path) -> None:
    lines = run_example("plan_own_model.py", "--devices", "6", "--rounds", "2", cwd=tmp_path)   # model found beside it
    assert lines[0].startswith("3 cut points: conv1")
    assert lines[1].startswith("plan: cuts (") and "interval I = " in lines[1] and "simulated seconds" in lines[1]
    assert lines[2].startswith("trained 2 rounds with the plan: accuracy 0.")


def test_the_own_model_example_estimates_on_real_batches_not_random_tensors() -> None:
    source = (ROOT / "examples" / "plan_own_model.py").read_text(encoding="utf-8")
    assert "training_batches(DATASET" in source and "torch.randn" not in source and "plan=plan" in source


def test_comparing_algorithms_shares_one_setting_and_a_run_folder_reads_back(tmp_path) -> None:
    lines = run_example("compare_algorithms.py", "--algorithms", "psl,sfl-v1", "--rounds", "4", "--out",
                        str(tmp_path / "runs"))
    assert lines[0].startswith("setting: dataset=synthetic") and lines[0].endswith("rounds=4")
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert set(rows) == {"psl", "sfl-v1"} and all(0 <= float(r[1]) <= 1 for r in rows.values())
    from adaptplan import History

    for algorithm, row in rows.items():                     # the table is what the run folders hold
        history = History.load(tmp_path / "runs" / algorithm)
        assert float(row[1]) == round(history.final_accuracy, 3) and history.meta["config"]["lr"] == 0.05
    read = run_example("read_run.py", str(tmp_path / "runs" / "psl"), "--target", "0.0")
    assert read[0] == "psl on synthetic, 4 devices, 4 rounds"
    assert read[-2].startswith("accuracy 0.0 first at round 4") and read[-1].startswith("seconds per stage: ")


def test_the_own_loop_example_estimates_calibrates_plans_and_compares_as_its_page_shows() -> None:
    """examples/plan_in_own_loop.py prints what docs/api.md shows: the fit, the plan with its prediction to 70 %,
    and the run measured beside it, measured/predicted near the page's (floating-point sums may differ by thread)."""
    import re

    lines = run_example("plan_in_own_loop.py")
    page = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    shown = page[page.index("It prints, on 2 CPU cores"):].split("```text\n", 1)[1].split("```", 1)[0].splitlines()
    assert len(lines) == len(shown) == 3
    assert lines[0].startswith("calibrated: ε and the drift share κ = ") and lines[0].endswith("fitted to 2 pilots")
    planned = re.fullmatch(r"plan: cuts \(([\d, ]+)\), I = (\d+); predicted (\d+) rounds, ([\d.]+) simulated s to "
                           r"70\.0% test accuracy", lines[1])
    assert planned and len(planned[1].split(", ")) == 6
    assert lines[2].startswith("measured ") and lines[2].endswith(")") is False
    ratio = float(lines[2].rsplit("measured/predicted ", 1)[1])
    page_ratio = float(shown[2].rsplit("measured/predicted ", 1)[1])
    assert abs(ratio - page_ratio) <= 0.1 and lines[1] == shown[1]
