"""The benchmarks' progress bar, counted in training rounds across their worker processes.

A bench of long runs (`bench papers`' full tier: 24 runs of 19,200 rounds) moved its bar once a run, so a user saw
nothing for half an hour and a bar that had read back eight ended runs in a fraction of a second still showed the
first (tqdm draws at most every ``mininterval``; the last updates waited for the next run's). Here the bar's unit is
the round: each run's Trainer carries a :class:`RoundCount` observer that adds every round it trains to one count
shared by the bench's processes (a ``multiprocessing.Value``), a thread of the bench's process draws that count
twice a second when it moved, and the runs ended so far stand beside it. A resumed run's first round adds the rounds it trained
before; a run read back, stopped by divergence or trained by work that carries no observer adds what it did not
count when it ends, so the bar ends at the jobs' total rounds.

Rounds trained before the bench started (those a resumed run's first round brings, a run read back) are *carried*:
they move the bar but not its rate, which counts only the rounds trained since the bench started (tqdm's
``initial``), so that the time left it shows holds from the first minute of a resumed bench (seen 2026-12-06: a
bench resuming 3,400 of 4,800 rounds showed 27 rounds/s and under a minute left for about an hour and a half of
work). A run's first logged round is trained, any gap before it carried; what ``counted`` adds at a job's end (a
run read back, the rounds a diverged run did not train) is carried.

Where a bench's runs differ in the work of a round (`bench papers`: a round of GAS is a global iteration of C·E
device steps, one of FedAvg a step of each active device), a job's ``round_weight`` (its relative cost of one
round) weighs each of its rounds, and the bar counts that weighted work (unit ``step``), so that its rate and the
time it predicts hold across the runs.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

REFRESH_S = 0.5
"""Seconds between two draws of the bar while runs train."""

_count: Any = None       # in a process of a bench: the shared [work done, of it carried] (a multiprocessing Array)
_counted = 0             # the rounds the job in hand has added to it so far
_weight = 1.0            # the work of one of its rounds


def job_rounds(job: dict[str, Any]) -> int | None:
    """The rounds ``job`` trains (its configuration's ``rounds``), None where it names no whole number of rounds."""
    rounds = job.get("config", {}).get("rounds") if isinstance(job.get("config"), dict) else None
    return rounds if isinstance(rounds, int) and not isinstance(rounds, bool) and rounds >= 0 else None


def job_weight(job: dict[str, Any]) -> float:
    """The work of one of ``job``'s rounds: its ``round_weight`` where it gives a positive finite one, else 1."""
    weight = job.get("round_weight", 1.0)
    ok = isinstance(weight, (int, float)) and not isinstance(weight, bool) and 0 < weight < float("inf")
    return float(weight) if ok else 1.0


def share_count(count: Any) -> None:
    """Make ``count`` (a ``multiprocessing.Array`` of two doubles: the work done and the part of it carried; or
    None: nothing counted) this process's count."""
    global _count
    _count = count


def _add(rounds: int, carried: bool = False) -> None:
    """Add ``rounds`` of the job in hand to the count (to its carried part too where ``carried``)."""
    global _counted
    if rounds > 0 and _count is not None:
        with _count.get_lock():
            _count[0] += rounds * _weight
            if carried:
                _count[1] += rounds * _weight
        _counted += rounds


def work_done() -> tuple[float, float]:
    """The count this process shares: (work done, of it carried), both 0 where it counts nothing."""
    return (0.0, 0.0) if _count is None else (float(_count[0]), float(_count[1]))


class RoundCount:
    """A round observer (:class:`trainers.run.tracking.RoundObserver`) adding each round its run trains to the
    bench's count: round t of a run brings the job's count to t (a resumed run's first round adds those before,
    carried)."""

    def log(self, record: Any) -> None:
        gap = int(record.round) - _counted
        _add(gap - 1, carried=True)
        _add(min(gap, 1))

    def close(self, status: str, final: dict[str, Any] | None) -> None:
        pass


def count_rounds(trainer: Any) -> None:
    """Let ``trainer`` (a :class:`trainers.run.driver.Trainer`) count its rounds on the bench's bar, where one
    counts them (nothing otherwise)."""
    if _count is not None:
        trainer.observers.append(RoundCount())


def counted(work: Callable[[dict[str, Any]], Any], job: dict[str, Any]) -> Any:
    """``work(job)``, then the job's rounds it did not count added (a run read back, diverged, or without
    :class:`RoundCount`), so that each job adds exactly its rounds."""
    global _counted, _weight
    _counted, _weight = 0, job_weight(job)
    result = work(job)
    _add((job_rounds(job) or 0) - _counted, carried=True)
    return result


class Bar:
    """The bench's bar (``desc``) over ``jobs``: in rounds where every job names its rounds (in steps where their
    ``round_weight``s differ from 1), else in runs."""

    def __init__(self, jobs: Sequence[dict[str, Any]], desc: str, context: Any) -> None:
        from tqdm import tqdm

        rounds = [job_rounds(job) for job in jobs]
        weights = [job_weight(job) for job in jobs]
        self.runs, self.ended = len(jobs), 0
        self.count = context.Array("d", 2) if all(r is not None for r in rounds) else None
        total = round(sum((r or 0) * w for r, w in zip(rounds, weights))) if self.count is not None else len(jobs)
        unit = "run" if self.count is None else "round" if all(w == 1.0 for w in weights) else "step"
        self.bar = tqdm(total=total, unit=unit, desc=desc, dynamic_ncols=True)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._draw_until_done, daemon=True) if self.count is not None else None

    def run_ended(self) -> None:
        self.ended += 1
        if self.count is None:
            self.bar.update(1)
        else:
            self.draw()

    def draw(self) -> None:
        if self.count is not None:
            self.bar.n, self.bar.initial = round(self.count[0]), round(self.count[1])   # the rate: n − initial
            self.bar.set_postfix_str(f"runs {self.ended}/{self.runs}", refresh=False)
        self.bar.refresh()

    def _draw_until_done(self) -> None:
        """Draw the count each :data:`REFRESH_S` it moved (a log file gets a line per change, not per tick)."""
        while not self._done.wait(REFRESH_S):
            if self.count is not None and round(self.count[0]) != self.bar.n:
                self.draw()

    @contextmanager
    def drawing(self) -> Iterator["Bar"]:
        """Draw the count while the block runs (this process counts on it too), the last figures at its end."""
        share_count(self.count)
        if self._thread is not None:
            self._thread.start()
        try:
            yield self
        finally:
            self._done.set()
            if self._thread is not None:
                self._thread.join()
            self.bar.close()
            share_count(None)
