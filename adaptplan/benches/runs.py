"""Benchmarks made of training runs (``bench algorithms``, ``bench training``): the runs go to
worker processes (one torch thread each) with progress, and come back as :class:`RunResult`s
with the figures both benchmarks report; one plot function draws accuracy against simulated time.
"""

from __future__ import annotations

import functools
import json
import os
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, TypeGuard

from adaptplan.benches.progress import Bar, count_rounds, counted, share_count
from adaptplan.crossing import first_crossing
from adaptplan.errors import InputError
from trainers.run.history import chance_floor, first_converged


@dataclass(frozen=True)
class RunResult:
    """One run's figures: accuracies are fractions, times simulated seconds (``wall_seconds``: wall clock)."""

    group: str                                 # e.g. the partition
    label: str                                 # e.g. the algorithm or policy
    rounds: int
    final_accuracy: float | None
    sim_seconds: float
    wall_seconds: float
    time_to_target_s: float | None
    rounds_to_target: float | None           # interpolated, as time_to_target_s
    converged_round: int | None
    converged_time_s: float | None
    converged_accuracy: float | None
    curve: list[tuple[float, float]]          # (simulated seconds, test accuracy) at each evaluation
    diverged_round: int | None = None          # the round whose NaN/inf stopped the run, if any
    final_local_accuracy: float | None = None  # the local protocol's (each device's model on its held-out samples)
    local_curve: list[tuple[float, float]] = field(default_factory=list)   # (simulated s, local accuracy)
    num_classes: int | None = None             # the data set's M (the history's meta): the plots' chance line 1/M
    final_local_sampled_accuracy: float | None = None   # the local protocol over each round's participants only
    local_sampled_curve: list[tuple[float, float]] = field(default_factory=list)

    def final(self, protocol: str = "global") -> float | None:
        """The final accuracy by ``protocol``: ``global`` (the test set), ``local`` (every device's held-out samples,
        pooled) or ``local-sampled`` (the round's participants' only, the CycleSL authors' protocol)."""
        return {"global": self.final_accuracy, "local": self.final_local_accuracy,
                "local-sampled": self.final_local_sampled_accuracy}[protocol]

    def points(self, protocol: str = "global") -> list[tuple[float, float]]:
        return {"global": self.curve, "local": self.local_curve, "local-sampled": self.local_sampled_curve}[protocol]

    def time_to(self, target: float, protocol: str = "global") -> float | None:
        """Simulated seconds at which the accuracy first reached ``target``, interpolated between the evaluations
        around the crossing (:func:`adaptplan.crossing.first_crossing`; the first evaluation's seconds where it
        already had it); None if never."""
        found = first_crossing([(acc, t) for t, acc in self.points(protocol)], target)
        return None if found is None else found.at[0]

    def time_is_a_bound(self, target: float, protocol: str = "global") -> bool:
        """True when :meth:`time_to` is its first evaluation's seconds (it already had the target there): the time
        is an upper bound, the crossing unresolved by the evaluation grid."""
        found = first_crossing([(acc, t) for t, acc in self.points(protocol)], target)
        return found is not None and found.upper_bound

    def converged(self, protocol: str = "global") -> bool | None:
        """Whether the run converged by the paper's criterion (:func:`trainers.run.history.first_converged`: the
        accuracy by ``protocol`` gaining less than 2 points from one evaluation to the next for 5 evaluations in a row,
        counted only above twice chance) and did not diverge; None without evaluations."""
        accuracies = [acc for _, acc in self.points(protocol)]
        if not accuracies and self.diverged_round is None:
            return None
        return self.diverged_round is None and first_converged(accuracies, chance_floor(self.num_classes)) is not None

    def accuracy_at(self, seconds: float, protocol: str = "global") -> float | None:
        """Accuracy of the last evaluation at or before ``seconds`` simulated seconds."""
        reached = [acc for t, acc in self.points(protocol) if t <= seconds + 1e-12]
        return reached[-1] if reached else None


#: In a run's folder (``job["folder"]``): written once the run has ended (finished or diverged), with the setting
#: it trained and what the benchmark reads of its history (:func:`evaluations_only`), so that the same benchmark
#: run again reads the run back instead of training it — from this file alone, whose size the evaluations set, not
#: the rounds (75 kB for 30 evaluations of 100 devices).
RESULT_FILE = "bench-result.json"


def run_one(job: dict[str, Any]) -> RunResult:
    """Train ``job["config"]`` (TrainConfig fields) and summarise it against ``job["target"]``.

    With ``job["folder"]`` the run lives in that folder (``adaptplan train --out``: history, checkpoints every
    evaluation, the run file) and nothing of it is lost to a stop: a run that ended there before (its
    :data:`RESULT_FILE` names the same setting) is read back instead of trained, a run that was stopped continues
    from its checkpoint (bit for bit, as ``adaptplan train --resume``), one that ended shorter goes on to the job's
    rounds (:func:`run_state`), anything else starts afresh."""
    from trainers.config.host import use_cpu
    from trainers.config.train_config import TrainConfig
    from trainers.run.driver import Trainer

    use_cpu(1)
    folder = Path(job["folder"]) if job.get("folder") is not None else None
    config = dict(job["config"])
    if folder is not None:
        state = run_state(folder, job)
        if state == "ended":
            return _ended_run(folder, job)
        if state == "again":                  # its run is the job's first rounds: the longer run holds it
            (folder / RESULT_FILE).unlink()
        in_folder(config, folder, resume=state in ("stopped", "longer"))   # "longer": on to the job's length
    trainer = Trainer(TrainConfig.flat(**config))
    count_rounds(trainer)
    diverged = None
    try:
        history = trainer.run()
    except InputError as exc:                 # NaN/inf: the run's records up to the last good round stay
        if "diverged" not in exc.message:
            raise
        history, diverged = trainer.history, len(trainer.history.records) + 1
    if folder is not None:
        from adaptplan.fileio import save_json

        save_json({"config": _plain(job["config"]), "diverged_round": diverged, "rounds": len(history.records),
                   "history": evaluations_only(history).to_json()}, folder / RESULT_FILE)
    return summarise(job, history, diverged)


def in_folder(config: dict[str, Any], folder: Path, resume: bool) -> None:
    """Make ``config`` a bench run in ``folder``: continued from its checkpoint (``resume``) or replacing what is
    there, with a checkpoint at every evaluation (its own ``checkpoint_every`` where it has one), so that a stopped
    bench loses at most an evaluation's rounds."""
    config.update(out=str(folder), resume=resume, overwrite=not resume,
                  checkpoint_every=config.get("checkpoint_every") or config.get("eval_every")
                  or max(1, int(config["rounds"]) // 30))


def evaluations_only(history: Any) -> Any:
    """What :func:`summarise` reads of ``history``: its evaluated rounds and its last round (the run's simulated and
    wall seconds), with the metadata the final accuracy and the convergence floor come from. Summarised with the
    full history's round count, it gives the full history's :class:`RunResult` for any target."""
    from trainers.run.history import History

    kept = [r for r in history.records[:-1] if r.accuracy is not None] + history.records[-1:]
    meta = {k: history.meta[k] for k in ("num_classes", "final_evaluation") if k in history.meta}
    return History(kept, meta)


def _plain(config: Any) -> Any:
    """``config`` as JSON reads it back (tuples as lists), to compare a stored setting with a job's."""
    return json.loads(json.dumps(config, sort_keys=True, default=list))


def folder_state(folder: Path) -> str:
    """What a run's folder holds for :func:`run_one`: ``"ended"`` (its :data:`RESULT_FILE`), ``"stopped"`` (a
    checkpoint to continue from) or ``"new"`` (neither)."""
    from trainers.run.checkpoint import CHECKPOINT_NAME

    if (folder / RESULT_FILE).exists():
        return "ended"
    return "stopped" if (folder / CHECKPOINT_NAME).exists() else "new"


def run_state(folder: Path, job: dict[str, Any]) -> str:
    """:func:`folder_state`, where a run ended there whose rounds are ``job``'s first (:func:`_extends`) is
    ``"longer"`` when the folder keeps its last round's checkpoint (it trains on from there, only the rounds the
    job adds) and ``"again"`` when it does not (a clean clone keeps only the result file: it trains from the start
    to the job's length: run_one removes the shorter result as it starts, the longer one is written at its end)."""
    from trainers.run.checkpoint import CHECKPOINT_NAME

    state = folder_state(folder)
    if state != "ended" or not _extends(folder, job):
        return state
    return "longer" if (folder / CHECKPOINT_NAME).exists() else "again"


def _extends(folder: Path, job: dict[str, Any]) -> bool:
    """``job`` is the run that ended in ``folder`` trained longer: its stored setting is the job's but for fewer
    ``rounds``, it did not diverge, and the algorithm's schedule does not read the total rounds (GAPSL's eq. 2
    does). Its run is then the job's first rounds: continued from its last checkpoint it is bit for bit the run
    of the longer length (``adaptplan train --resume --rounds``), so a recipe that doubles its rounds by its plateau
    rule trains only the rounds it adds. (A recipe that keeps its evaluations' spacing changes ``rounds`` alone.)"""
    from adaptplan.fileio import load_mapping
    from trainers.strategies import STRATEGIES

    try:
        stored = load_mapping(folder / RESULT_FILE, "bench result")
    except InputError:
        return False                              # _ended_run says what is wrong with it
    now = _plain(job["config"])
    saved = _as_saved_now(stored.get("config"), now)
    if not isinstance(saved, dict):
        return False
    strategy = STRATEGIES.get(str(now.get("algorithm")))
    return (strategy is not None and not strategy.uses_total_rounds and stored.get("diverged_round") is None
            and _whole(saved.get("rounds")) and _whole(now.get("rounds")) and saved["rounds"] < now["rounds"]
            and {k: v for k, v in saved.items() if k != "rounds"} == {k: v for k, v in now.items() if k != "rounds"})


def _ended_run(folder: Path, job: dict[str, Any]) -> RunResult:
    """The run that ended in ``folder`` (:data:`RESULT_FILE`), summarised against ``job``. One that trained another
    setting is an InputError naming --out: it is not overwritten."""
    from adaptplan.fileio import load_mapping
    from trainers.run.history import History

    where = folder / RESULT_FILE
    stored = load_mapping(where, "bench result")
    now, diverged = _plain(job["config"]), stored.get("diverged_round")
    saved = _as_saved_now(stored.get("config"), now)
    saved = saved if isinstance(saved, dict) else {}
    if diverged is not None and not _whole(diverged):
        raise InputError(f"must be a round ≥ 1 or null, got {diverged!r}", field=f"{where}: diverged_round")
    if saved != now:
        differing = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k))
        raise InputError(f"{str(folder)!r} holds a run that ended with another setting ({', '.join(differing[:4])} "
                         "differ); give the bench another --out, or remove that folder to train the run again",
                         field="--out")
    if not isinstance(stored.get("history"), dict):
        raise InputError(f"must be the run's evaluations as a history object, got {stored.get('history')!r:.60}",
                         field=f"{where}: history")
    history = History.from_json(stored["history"])
    rounds = stored.get("rounds")
    if not _whole(rounds) or rounds < len(history.records):
        raise InputError(f"must be the run's round count, at least its {len(history.records)} records, got "
                         f"{rounds!r}", field=f"{where}: rounds")
    return summarise(job, history, diverged, rounds)


def _as_saved_now(saved: Any, now: dict[str, Any]) -> Any:
    """A stored run's setting with the options it was saved before (``SAVED_BEFORE``: a key ``now`` has and it
    lacks) at the value runs of before had, so a run finished before an option existed reads back as the same setting."""
    from trainers.config.train_config import SAVED_BEFORE

    if not isinstance(saved, dict):
        return saved
    return {**{k: v for k, v in SAVED_BEFORE.items() if k in now and k not in saved}, **saved}


def _whole(value: Any) -> TypeGuard[int]:
    """``value`` is a whole number ≥ 1 (a bool is not)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def summarise(job: dict[str, Any], history: Any, diverged: int | None = None, rounds: int | None = None) -> RunResult:
    """A run's :class:`RunResult` from its :class:`~trainers.run.history.History` (``diverged``: the round whose
    NaN/inf stopped it), against ``job["target"]`` accuracy; ``rounds``: the run's round count where ``history``
    holds only its evaluations (:func:`evaluations_only`)."""
    target = job["target"]
    curve = [(r.sim_seconds, r.accuracy) for r in history.evaluated if r.accuracy is not None]   # all evaluated
    local_curve, sampled_curve = ([(r.sim_seconds, getattr(r, name)) for r in history.evaluated
                                   if getattr(r, name) is not None] for name in ("local_accuracy", "local_sampled_accuracy"))
    reached = history.to_target(target)          # interpolated between evaluations (adaptplan.crossing)
    conv = history.converged_round()
    conv_record = next((r for r in history.records if r.round == conv), None)
    last_sim = history.records[-1].sim_seconds if history.records else 0.0
    last_wall = history.records[-1].wall_seconds if history.records else 0.0
    count = len(history.records) if rounds is None else rounds
    return RunResult(job["group"], job["label"], count, history.final_accuracy, last_sim, last_wall,
                     reached["seconds"], reached["rounds"],
                     conv, conv_record.sim_seconds if conv_record else None,
                     conv_record.accuracy if conv_record else None, curve, diverged,
                     history.final_local_accuracy, local_curve, _classes(history.meta.get("num_classes")),
                     history.final_local_sampled_accuracy, sampled_curve)


def _classes(value: Any) -> int | None:
    """A history's ``meta["num_classes"]`` where it is a class count (None where it recorded none)."""
    return value if _whole(value) else None


def run_jobs(jobs: Sequence[dict[str, Any]], workers: int | None = None, desc: str = "runs",
             progress: bool = True,
             work: Callable[[dict[str, Any]], Any] | None = None) -> list[RunResult]:
    """Run every job (``{"group", "label", "target", "config"}``) through ``work`` (default :func:`run_one`), in
    ``workers`` processes (default: all cores), with a bar counted in rounds (:mod:`adaptplan.benches.progress`).
    Stopped (Ctrl-C, SIGTERM) or failed, it ends its worker processes before it returns: none is left training for a
    benchmark that is gone."""
    import multiprocessing

    work = functools.partial(counted, work or run_one)
    workers = workers or max(1, os.cpu_count() or 1)
    context = multiprocessing.get_context("spawn")
    results: list[RunResult] = []
    with Bar(jobs, desc, context).drawing() if progress else nullcontext() as bar:
        if workers == 1:
            for result in map(work, jobs):
                results.append(result)
                if bar is not None:
                    bar.run_ended()
        else:
            stopping = context.Event()
            with _terminating_on_sigterm(), \
                    ProcessPoolExecutor(workers, mp_context=context, initializer=_share_stop,
                                        initargs=(stopping, None if bar is None else bar.count)) as pool:
                try:
                    for result in pool.map(functools.partial(_unless_stopped, work), jobs):
                        results.append(result)
                        if bar is not None:
                            bar.run_ended()
                except BaseException:
                    stopping.set()                                       # a job already queued to a worker: skipped
                    pool.shutdown(wait=False, cancel_futures=True)
                    _end_workers(multiprocessing.active_children())      # the pool's workers, mid-run
                    raise
    return results


STOP_GRACE_S = 60.0
"""Seconds a stopped benchmark's worker has, after its SIGTERM, to end its round and write its checkpoint before
it is killed (a round of the recipes takes well under a second on the CPU; one of 1,000 devices a few)."""


def _end_workers(children: Sequence[Any]) -> None:
    """SIGTERM to each worker process (a run ends its round and checkpoints), then SIGKILL to any still alive
    :data:`STOP_GRACE_S` later: a worker still busy after its run stopped kept a stopped `bench papers` waiting on
    it for minutes (seen 2026-11-29)."""
    import time

    for child in children:
        child.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for child in children:
        child.join(max(0.0, deadline - time.monotonic()))
        if child.is_alive():
            child.kill()
            child.join(5.0)


_stop: Any = None     # in a worker process of run_jobs: the event set when the benchmark stops


def _share_stop(event: Any, count: Any = None) -> None:
    """A worker's start: the event set when the benchmark stops, and the bar's count of rounds (None: none)."""
    global _stop
    _stop = event
    share_count(count)


def _unless_stopped(work: Callable[[dict[str, Any]], Any], job: dict[str, Any]) -> Any:
    """``work(job)`` in a worker of :func:`run_jobs`, unless the benchmark has stopped: a worker whose run stops
    gracefully on SIGTERM (the Trainer ends its round and checkpoints) would otherwise take the next job queued to
    it and train it to its end while the benchmark waits to exit."""
    if _stop is not None and _stop.is_set():
        raise RuntimeError("the benchmark stopped before this run started")
    return work(job)


class BenchStopped(SystemExit):
    """:func:`run_jobs` stopped on a signal (``signum``): a SystemExit with code 128 + signum, so that a script
    calling it exits as killed by that signal, and that the CLI turns into one line saying what was kept."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(128 + signum)


@contextmanager
def _terminating_on_sigterm() -> Iterator[None]:
    """SIGTERM raises :class:`BenchStopped` (a SystemExit) in the main thread (so that :func:`run_jobs` ends its workers) while the jobs run;
    the previous handler is restored after. Outside the main thread nothing changes."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise BenchStopped(signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


PANEL_COLUMNS = 3
"""At most this many panels side by side in a bench's accuracy figure; more groups wrap into further rows."""


def panel_grid(count: int, panel: tuple[float, float] = (5.0, 3.6), columns: int = PANEL_COLUMNS,
               legend_height: float = 0.0) -> tuple[Any, list[Any]]:
    """A figure of ``count`` panels in rows of at most ``columns`` (constrained layout), each ``panel`` inches
    (width, height), every panel its own x- and y-axis (nothing shared); the grid's unused cells removed.
    ``legend_height``: inches added below for a figure legend. Returns (figure, the panels in order)."""
    import matplotlib.pyplot as plt

    count = max(1, count)
    cols = min(columns, count)
    rows = -(-count // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(panel[0] * cols, panel[1] * rows + legend_height),
                             squeeze=False, sharex=False, sharey=False, layout="constrained")
    flat = [ax for row in axes for ax in row]
    for ax in flat[count:]:
        ax.remove()
    return fig, flat[:count]


def plot(results: Sequence[RunResult], path: str | os.PathLike) -> None:
    """Test accuracy against simulated seconds, one panel per group (rows of at most :data:`PANEL_COLUMNS`, each
    panel its own axes), one line per label in the same colour in every panel, every evaluation a marker (a run with
    a single evaluation is a visible point); a chance line at 1/M and a y-range from 0 over it and every point
    (:func:`trainers.run.plotting.chance_and_range`); one legend below the panels, where it hides no point; a panel
    without evaluations says so."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from trainers.run.plotting import chance_and_range, legend_columns

    groups = list(dict.fromkeys(r.group for r in results))
    colours = {label: f"C{i % 10}" for i, label in enumerate(dict.fromkeys(r.label for r in results))}
    fig, axes = panel_grid(len(groups))
    legend: dict[str, Any] = {}
    for ax, group in zip(axes, groups):
        runs = [r for r in results if r.group == group]
        for r in runs:
            if r.curve:
                ax.plot([t for t, _ in r.curve], [a for _, a in r.curve], marker="o", markersize=4, label=r.label,
                        color=colours[r.label])
        if not any(r.curve for r in runs):
            ax.text(0.5, 0.5, "no evaluation in these runs\n(lower --eval-every)", ha="center", va="center",
                    transform=ax.transAxes)
        chance_and_range(ax, [a for r in runs for _, a in r.curve], [r.num_classes for r in runs])
        ax.set_title(group)
        ax.set_xlabel("simulated seconds")
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
        legend.update((label, handle) for handle, label in zip(*ax.get_legend_handles_labels())
                      if label not in legend)
    if legend:
        width = fig.get_size_inches()[0]
        columns = legend_columns(list(legend), width)
        fig.set_size_inches(width, fig.get_size_inches()[1] + 0.25 * -(-len(legend) // columns))
        fig.legend(list(legend.values()), list(legend), loc="outside lower center", ncols=columns, fontsize=8)
    fig.savefig(path)
    plt.close(fig)


def pct(value: float | None, why: str = "") -> str:
    """``value`` as a percentage; None is ``-``, an :class:`adaptplan.report.Empty` cell saying ``why`` where given."""
    return _empty(why) if value is None else f"{100 * value:.1f}%"


def seconds(value: float | None, why: str = "") -> str:
    """``value`` in seconds, 3 significant digits; None as :func:`pct`'s."""
    return _empty(why) if value is None else f"{value:.3g}"


def _empty(why: str) -> str:
    from adaptplan.report import Empty

    return Empty(why) if why else "-"


# Why a bench table's cell is empty (adaptplan.report.Empty): written once under the table.

def no_evaluation(r: RunResult) -> str:
    """Why run ``r`` has no accuracy at all."""
    if r.diverged_round:
        return f"diverged (NaN/inf) at round {r.diverged_round}, before its first evaluation"
    return "no evaluation in the run (lower --eval-every)"


def not_reached(r: RunResult, target: float) -> str:
    """Why run ``r`` has no time to ``target`` accuracy."""
    if r.diverged_round:
        return f"diverged (NaN/inf) at round {r.diverged_round}, before reaching {target:.0%}"
    return f"target {target:.0%} not reached within {r.rounds} rounds"


def not_converged(r: RunResult) -> str:
    """Why run ``r`` has no converged round."""
    return (f"not converged within {r.rounds} rounds (gain < 0.02 over 5 evaluations, counted only above twice "
            "chance)")


def no_local(r: RunResult) -> str:
    """Why run ``r`` has no local-protocol accuracy."""
    if r.final_accuracy is None:
        return no_evaluation(r)
    return "no local held-out samples in the run (--local-test-fraction 0)"
