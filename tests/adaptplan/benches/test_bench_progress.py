"""The benchmarks' bar counts training rounds across processes (adaptplan/benches/progress.py): each job adds exactly
its rounds, a resumed run's first round the rounds before it, a run read back or without the observer what it did
not count, and the bar ends at the jobs' total with the runs ended beside it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from adaptplan.benches import progress
from adaptplan.benches import runs as bench_runs


def _last_bar(err: str) -> str:
    """The last state tqdm drew (its lines are separated by carriage returns)."""
    return [s for s in re.split(r"[\r\n]", err) if s.strip()][-1]


def _count(bar: str) -> str:
    """The bar's own "n/total" (not the runs beside it)."""
    return re.search(r"\| *(\d+/\d+) \[", bar).group(1)


def _logging(job: dict) -> int:
    """A run that logs rounds ``job["from"]`` + 1 … its rounds through a RoundCount, as a resumed Trainer does, and
    returns the count it saw at its end (before :func:`progress.counted` adds what it did not count)."""
    observer = progress.RoundCount()
    for t in range(job["from"] + 1, job["config"]["rounds"] + 1):
        observer.log(SimpleNamespace(round=t))
    observer.close("FINISHED", None)
    return int(progress.work_done()[0])


def test_each_job_adds_its_rounds_a_resumed_one_those_before_too(capsys) -> None:
    jobs = [{"config": {"rounds": 3}, "from": 0}, {"config": {"rounds": 6}, "from": 4}, {"config": {"rounds": 5}}]
    seen = bench_runs.run_jobs(jobs, workers=1, desc="bench t",
                               work=lambda job: _logging(job) if "from" in job else -1)
    # the first job counted its 3 rounds; the second, resumed after round 4, took the count to 3 + 6 at its first
    # round; the third logged nothing and is counted whole when it ends
    assert seen == [3, 9, -1]
    err = capsys.readouterr().err
    assert err.endswith("\n")                         # the bar was closed: its line ends
    bar = _last_bar(err)
    assert "bench t" in bar and _count(bar) == "14/14" and "runs 3/3" in bar and "round" in bar
    assert progress._count is None                     # the process counts nothing once the bench is over


def test_rounds_trained_before_the_bench_move_the_bar_not_its_rate(capsys) -> None:
    """A run resumed after round 4 of 6 carries 4 rounds and trains 2, one read back (logging nothing) carries its 5,
    a fresh one trains its 3: the bar shows 14 rounds of which 9 carried, tqdm's ``initial``, so that its rate
    ((n − initial) / elapsed) and the time left count the 5 trained here."""
    import multiprocessing

    jobs = [{"config": {"rounds": 6}, "from": 4}, {"config": {"rounds": 5}}, {"config": {"rounds": 3}, "from": 0}]
    bar = progress.Bar(jobs, "bench r", multiprocessing.get_context("spawn"))
    with bar.drawing():
        seen = [progress.counted(lambda job: (_logging(job) if "from" in job else 0, progress.work_done()), job)
                for job in jobs]
        bar.draw()
        state = bar.bar.format_dict
    assert [s[1] for s in seen] == [(6.0, 4.0), (6.0, 4.0), (14.0, 9.0)]
    assert state["n"] == 14 and state["initial"] == 9 and state["total"] == 14
    assert progress.work_done() == (0.0, 0.0)            # nothing counted once the bench is over


def test_without_rounds_the_bar_counts_runs(capsys) -> None:
    bench_runs.run_jobs([{"config": {}}, {"n": 1}], workers=1, desc="bench u", work=lambda job: 0)
    bar = _last_bar(capsys.readouterr().err)
    assert _count(bar) == "2/2" and "run" in bar and "runs 2/2" not in bar
    bench_runs.run_jobs([{"config": {"rounds": 5}}, {"n": 1}, {"config": {"rounds": 4}}], workers=1, desc="bench m",
                        work=lambda job: 0)            # one job without rounds: the bar counts runs
    bar = _last_bar(capsys.readouterr().err)
    assert _count(bar) == "3/3" and "round" not in bar


def test_a_job_of_no_rounds_adds_none(capsys) -> None:
    bench_runs.run_jobs([{"config": {"rounds": 0}}, {"config": {"rounds": 2}}], workers=1, desc="bench z",
                        work=lambda job: 0)
    bar = _last_bar(capsys.readouterr().err)
    assert _count(bar) == "2/2" and "runs 2/2" in bar


def test_no_progress_counts_nothing() -> None:
    assert bench_runs.run_jobs([{"config": {"rounds": 4}, "from": 0}], workers=1, progress=False,
                               work=lambda job: progress._count) == [None]


@pytest.mark.parametrize("rounds, expected", [(7, 7), (0, 0), (True, None), (2.0, None), (-1, None), ("3", None)])
def test_job_rounds_reads_whole_rounds_only(rounds, expected) -> None:
    assert progress.job_rounds({"config": {"rounds": rounds}}) == expected
    assert progress.job_rounds({"config": None}) is None and progress.job_rounds({}) is None


def test_a_trainer_counts_every_round_it_trains(tmp_path) -> None:
    """run_one gives its Trainer the observer: at the run's end the count is its rounds before anything is added;
    the same run read back from its folder adds them all when it ends."""
    config = dict(algorithm="psl", dataset="synthetic", devices=2, rounds=4, cuts=(3,), batch_size=8, eval_every=2,
                  threads=1, progress=False, max_test_samples=20)
    job = {"group": "g", "label": "psl", "target": 0.5, "config": config, "folder": str(tmp_path / "run")}

    def run_and_read(job: dict) -> tuple[int, int]:
        before = int(progress.work_done()[0])
        bench_runs.run_one(job)
        return before, int(progress.work_done()[0])

    assert bench_runs.run_jobs([job, job], workers=1, work=run_and_read) == [(0, 4), (4, 4)]


def test_worker_processes_share_the_count(tmp_path) -> None:
    """Over 2 spawned workers, every job's rounds reach the bench's bar."""
    script = tmp_path / "bench.py"
    script.write_text("from types import SimpleNamespace\n"
                      "from adaptplan.benches import progress\n"
                      "from adaptplan.benches.runs import run_jobs\n"
                      "def work(job):\n"
                      "    observer = progress.RoundCount()\n"
                      "    for t in range(1, job['config']['rounds'] + 1):\n"
                      "        observer.log(SimpleNamespace(round=t))\n"
                      "    return job['config']['rounds']\n"
                      "if __name__ == '__main__':\n"
                      "    print(run_jobs([{'config': {'rounds': r}} for r in (2, 3, 5, 7)], workers=2, desc='bench w',"
                      " work=work))\n")
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, str(script)], cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[2, 3, 5, 7]"
    bar = _last_bar(done.stderr)
    assert "bench w" in bar and _count(bar) == "17/17" and "runs 4/4" in bar


def test_the_bar_is_drawn_when_its_count_moves_not_every_tick(capsys) -> None:
    """A run that trains no round for several ticks leaves the log one line (tqdm's first), not one per tick."""
    import time

    def still(job: dict) -> None:
        time.sleep(4 * progress.REFRESH_S)
        progress.RoundCount().log(SimpleNamespace(round=1))
        time.sleep(4 * progress.REFRESH_S)

    bench_runs.run_jobs([{"config": {"rounds": 2}}], workers=1, desc="bench s", work=still)
    drawn = [s for s in re.split(r"[\r\n]", capsys.readouterr().err) if s.strip()]
    # tqdm's first draw (0/2), the thread's at round 1, the run's end (2/2), tqdm's close: four, where a draw per
    # tick would be about ten
    assert [re.search(r"\d/2", s).group(0) for s in drawn] == ["0/2", "1/2", "2/2", "2/2"]


def test_weighted_rounds_count_steps(capsys) -> None:
    """Jobs whose rounds weigh 10 and 0.5 steps (a resumed one too): the bar counts steps, 3·10 + 6·0.5 = 33."""
    jobs = [{"config": {"rounds": 3}, "from": 0, "round_weight": 10.0},
            {"config": {"rounds": 6}, "from": 4, "round_weight": 0.5}]
    seen = bench_runs.run_jobs(jobs, workers=1, desc="bench v",
                               work=lambda job: (_logging(job), progress.work_done()[1]))
    assert seen == [(30, 0.0), (33, 2.0)]              # the resumed job's 4 rounds before carried: 4·0.5 steps
    bar = _last_bar(capsys.readouterr().err)
    assert _count(bar) == "33/33" and "step" in bar and "runs 2/2" in bar
    bench_runs.run_jobs([{"config": {"rounds": 2}}, {"config": {"rounds": 2}, "round_weight": 2.0}], workers=1,
                        desc="bench x", work=lambda job: 0)     # one weighted job makes the unit a step
    bar = _last_bar(capsys.readouterr().err)
    assert _count(bar) == "6/6" and "step" in bar


@pytest.mark.parametrize("weight, expected", [(2.5, 2.5), (3, 3.0), (0, 1.0), (-1.0, 1.0), (float("inf"), 1.0),
                                              (float("nan"), 1.0), (True, 1.0), ("2", 1.0)])
def test_job_weight_is_a_positive_finite_number_else_one(weight, expected) -> None:
    assert progress.job_weight({"round_weight": weight}) == expected and progress.job_weight({}) == 1.0
