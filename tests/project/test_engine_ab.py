"""benchmarks/engine_ab.py: the ratios it prints, written out from the turns' throughputs, and a whole run of two
revisions in lock step (HEAD against the working tree) whose temporary worktree is gone afterwards."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "engine_ab.py"


def load():
    spec = importlib.util.spec_from_file_location("engine_ab", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("engine_ab", module)            # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_the_ratios_are_medians_over_the_pairs_and_each_side_against_its_own_central() -> None:
    ab = load()
    r = ab.PairResult("psl", 20, before=[100.0, 110.0, 90.0], after=[120.0, 99.0, 117.0],
                      central_before=[200.0, 200.0, 150.0], central_after=[100.0, 300.0, 180.0])
    # after / before per pair: 1.2, 0.9, 1.3 → median 1.2; central: 0.5, 1.5, 1.2 → 1.2
    assert r.after_over_before == pytest.approx(1.2)
    assert r.central_after_over_before == pytest.approx(1.2)
    # each side's round throughput over its own centralized throughput of the same pair:
    # before 0.5, 0.55, 0.6 → 0.55; after 1.2, 0.33, 0.65 → 0.65
    assert r.x_central_before == pytest.approx(0.55)
    assert r.x_central_after == pytest.approx(0.65)
    cells = ab.row(r).split()
    assert cells[:2] == ["20", "psl"]
    assert [float(c) for c in cells[2:]] == pytest.approx([1.2, 1.2, 0.55, 0.65, 0.65 / 0.55], abs=5e-4)


def test_head_against_the_working_tree_in_lock_step(tmp_path) -> None:
    root = SCRIPT.parents[1]
    if not (root / ".git").exists():
        pytest.skip("needs the git repository")
    done = subprocess.run([sys.executable, str(SCRIPT), "HEAD", "--devices", "2", "--algorithm", "sl,psl",
                           "--pairs", "3", "--warmup", "1", "--central-samples", "32", "--json"],
                          capture_output=True, text=True, timeout=600, cwd=root)
    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["algorithm"], r["devices"]) for r in results] == [("sl", 2), ("psl", 2)]
    for r in results:
        assert len(r["before"]) == len(r["after"]) == len(r["central_before"]) == len(r["central_after"]) == 3
        assert all(v > 0 for key in ("before", "after", "central_before", "central_after") for v in r[key])
    worktrees = subprocess.run(["git", "-C", str(root), "worktree", "list"], capture_output=True, text=True).stdout
    assert "engine_ab_" not in worktrees                       # the temporary checkout is removed


def test_a_worker_that_would_run_another_trees_code_stops(tmp_path) -> None:
    """The worker checks that ``trainers`` comes from the tree it was started in (an installed copy would
    otherwise measure the wrong revision)."""
    done = subprocess.run([sys.executable, str(SCRIPT), "--worker", "2", "sl", "{}", "32"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, input="stop\n")
    assert done.returncode != 0
    assert f"not the tree in {tmp_path}" in done.stderr
