"""`adaptplan bench algorithms`: the split algorithms side by side on one data set, model, seed,
system and plan, under IID and non-IID partitions.

Every (partition, algorithm) pair is one ``adaptplan train`` run, run in worker processes
(:mod:`adaptplan.benches.runs`), and **every algorithm trains with one setting**
(:class:`adaptplan.benches.comparison.Setting`: optimizer, rates, momentum, weight decay, clipping, batch,
participation, local rounds between averages, rounds), by default GAPSL's paper's (§IV-A4, the one paper
that trains SL, SFL and PSL beside its method with one stated setting), printed above the table; flags
replace single values for every algorithm at once. The table reports, per partition and algorithm: test
accuracy after the same number of rounds, at the same simulated-time budget (the shortest run's simulated
seconds, so every algorithm is measured at a time it reached), the local protocol's accuracy (each device's
model on its own held-out samples), simulated seconds to ``target`` accuracy, and the wall seconds per
round. The plot draws test accuracy against simulated seconds, one panel per partition.

A GAS round is one global iteration of C·E device steps; with participation ρ = 1 and one local round
between averages (the default setting) C = N and E = 1, the device steps of one synchronous round.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from adaptplan.benches.comparison import GAPSL_SETTING, Setting
from adaptplan.benches.runs import RunResult, no_evaluation, no_local, not_reached, pct, run_jobs, seconds
from adaptplan.benches.workload import Workload
from adaptplan.report import empty_notes
from trainers.algorithms import algorithm as registry_entry
from trainers.config.train_config import ALGORITHMS

PARTITIONS: dict[str, dict[str, Any]] = {"iid": {"partition": "iid"}, "dirichlet-0.1": {"partition": "dirichlet", "dirichlet_alpha": 0.1},
              "shards-2": {"partition": "shards"}}


WORKLOAD = Workload(GAPSL_SETTING, target=0.3)
"""``bench algorithms``' workload: the command's defaults, GAPSL's setting (module docstring)."""


def run_algorithm_bench(algorithms: Sequence[str] = ALGORITHMS, partitions: Sequence[str] = tuple(PARTITIONS),
                        workload: Workload = WORKLOAD, seed: int = 0, cuts: Sequence[int] | None = None,
                        workers: int | None = None,
                        progress: bool = True) -> list[RunResult]:
    """Run every (partition, algorithm) pair of ``workload`` with ``seed`` (its partition replaced by each of
    ``partitions``, keys of :data:`PARTITIONS`), every device at ``cuts`` when given (a whole-model algorithm's cut
    is L), in ``workers`` processes, and return their results (module docstring)."""
    jobs = []
    for partition in partitions:
        for algorithm in algorithms:
            config = {**workload.config(algorithm, seed), **PARTITIONS[partition]}
            if cuts is not None and not registry_entry(algorithm).whole_model:     # FedAvg's kind: its cut is L
                config["cuts"] = tuple(cuts)
            jobs.append({"group": partition, "label": algorithm, "target": workload.target, "config": config})
    return run_jobs(jobs, workers, "bench algorithms", progress)


def budget_seconds(results: Sequence[RunResult], partition: str) -> float:
    """The equal simulated-time budget of a partition: the shortest run's simulated seconds."""
    return min(r.sim_seconds for r in results if r.group == partition)


COLUMNS = ("algorithm", "acc@rounds", "acc@budget", "local acc", "s to target", "sim s", "wall s/round")


def table(results: Sequence[RunResult], target: float, setting: Setting) -> str:
    """The comparison table (one block per partition), the one training setting above each; under it, why a cell is
    empty (``-``: :func:`adaptplan.report.empty_notes`)."""
    lines, cells = [], []
    for partition in dict.fromkeys(r.group for r in results):
        budget = budget_seconds(results, partition)
        rows = [r for r in results if r.group == partition]
        lines.append(f"{partition}: accuracy after {rows[0].rounds} rounds, at the equal budget of {budget:.3g} simulated s, "
                     f"simulated s to {target:.0%}")
        lines.append(f"  setting — {setting.describe()}")
        lines.append(f"  {'algorithm':<10} {'acc@rounds':>10} {'acc@budget':>10} {'local acc':>9} {'s to target':>11} "
                     f"{'sim s':>9} {'wall s/round':>12}")
        for r in rows:
            note = f"  diverged (NaN/inf) at round {r.diverged_round}" if r.diverged_round else ""
            at_budget = (no_evaluation(r) if not r.curve
                         else "no evaluation by the equal budget (the run's first came later)")
            row = [r.label, pct(r.final_accuracy, no_evaluation(r)), pct(r.accuracy_at(budget), at_budget),
                   pct(r.final_local_accuracy, no_local(r)), seconds(r.time_to_target_s, not_reached(r, target))]
            cells.append(row)
            lines.append(f"  {row[0]:<10} {row[1]:>10} {row[2]:>10} {row[3]:>9} {row[4]:>11} {r.sim_seconds:>9.3g} "
                         f"{r.wall_seconds / max(r.rounds, 1):>12.3f}{note}")
    return "\n".join(lines + empty_notes(COLUMNS, cells))


def save_json(results: Sequence[RunResult], target: float, path: str | os.PathLike, setting: Setting) -> None:
    data = {"target_accuracy": target, "setting": setting.to_json(),
            "budgets_s": {p: budget_seconds(results, p) for p in dict.fromkeys(r.group for r in results)},
            "runs": [{**asdict(r), "partition": r.group, "algorithm": r.label,
                      "accuracy_at_budget": r.accuracy_at(budget_seconds(results, r.group))} for r in results]}
    Path(path).write_text(json.dumps(data, indent=2), encoding="utf-8")
