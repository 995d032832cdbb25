"""`adaptplan bench algorithms`: the split algorithms side by side on one data set, model, seed,
system and plan, under IID and non-IID partitions.

Every (partition, algorithm) pair is one ``adaptplan train`` run with the same options, run in
worker processes (:mod:`adaptplan.bench_runs`). The table reports, per partition and algorithm:
test accuracy after the same number of rounds, test accuracy at the same simulated-time budget
(the shortest run's simulated seconds, so every algorithm is measured at a time it reached),
simulated seconds to ``target`` accuracy, and the wall seconds per round. The plot draws test
accuracy against simulated seconds, one panel per partition.

Every algorithm trains with its own defaults (its paper's optimizer and rates, docs/algorithms.md
"Defaults") unless ``--lr``/``--momentum`` set them for all. GAS counts a round as one global
iteration (Q_c = C uploaded models of E local steps); the
benchmark uses C = 10 and E = 2 so that a GAS round holds C·E = 20 device steps, as a synchronous
round of 20 devices does.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from adaptplan.bench_runs import RunResult, pct, run_jobs, seconds
from trainers.config import ALGORITHMS

PARTITIONS: dict[str, dict[str, Any]] = {"iid": {"partition": "iid"}, "dirichlet-0.1": {"partition": "dirichlet", "dirichlet_alpha": 0.1},
              "shards-2": {"partition": "shards"}}
BENCH_OPTIONS = {"gas": {"active": 10, "local_steps": 2}}


def run_algorithm_bench(algorithms: Sequence[str] = ALGORITHMS, partitions: Sequence[str] = tuple(PARTITIONS),
                        rounds: int = 100, devices: int = 20, dataset: str = "cifar10-subset", model: str = "cnn",
                        lr: float | None = None, momentum: float | None = None, batch_size: int = 16,
                        eval_every: int = 10,
                        seed: int = 0, target: float = 0.3, workers: int | None = None, cuts: Sequence[int] | None = None,
                        test_samples: int | None = 500,
                        progress: bool = True,
                        device: str = "auto", client_batching: str = "auto") -> list[RunResult]:
    """Run every (partition, algorithm) pair and return their results (module docstring)."""
    jobs = []
    for partition in partitions:
        for algorithm in algorithms:
            config: dict[str, Any] = dict(algorithm=algorithm, dataset=dataset, model=model, devices=devices, rounds=rounds,
                          **optimizer_options(lr, momentum), batch_size=batch_size, eval_every=eval_every, seed=seed,
                          threads=1,
                          progress=False, max_test_samples=test_samples, extra=dict(BENCH_OPTIONS.get(algorithm, {})),
                          device=device, client_batching=client_batching,
                          **PARTITIONS[partition])
            if cuts is not None:
                config["cuts"] = tuple(cuts)
            jobs.append({"group": partition, "label": algorithm, "target": target, "config": config})
    return run_jobs(jobs, workers, "bench algorithms", progress)


def optimizer_options(lr: float | None, momentum: float | None) -> dict[str, float]:
    """The run's --lr/--momentum where given; each algorithm's own defaults otherwise (docs/algorithms.md)."""
    return {k: v for k, v in (("lr", lr), ("momentum", momentum)) if v is not None}


def budget_seconds(results: Sequence[RunResult], partition: str) -> float:
    """The equal simulated-time budget of a partition: the shortest run's simulated seconds."""
    return min(r.sim_seconds for r in results if r.group == partition)


def table(results: Sequence[RunResult], target: float) -> str:
    """The comparison table (one block per partition)."""
    lines = []
    for partition in dict.fromkeys(r.group for r in results):
        budget = budget_seconds(results, partition)
        rows = [r for r in results if r.group == partition]
        lines.append(f"{partition}: accuracy after {rows[0].rounds} rounds, at the equal budget of {budget:.3g} simulated s, "
                     f"simulated s to {target:.0%}")
        lines.append(f"  {'algorithm':<10} {'acc@rounds':>10} {'acc@budget':>10} {'s to target':>11} {'sim s':>9} "
                     f"{'wall s/round':>12}")
        for r in rows:
            note = f"  diverged (NaN/inf) at round {r.diverged_round}" if r.diverged_round else ""
            lines.append(f"  {r.label:<10} {pct(r.final_accuracy):>10} {pct(r.accuracy_at(budget)):>10} "
                         f"{seconds(r.time_to_target_s):>11} {r.sim_seconds:>9.3g} {r.wall_seconds / max(r.rounds, 1):>12.3f}"
                         f"{note}")
    return "\n".join(lines)


def save_json(results: Sequence[RunResult], target: float, path: str | os.PathLike) -> None:
    data = {"target_accuracy": target,
            "budgets_s": {p: budget_seconds(results, p) for p in dict.fromkeys(r.group for r in results)},
            "runs": [{**asdict(r), "partition": r.group, "algorithm": r.label,
                      "accuracy_at_budget": r.accuracy_at(budget_seconds(results, r.group))} for r in results]}
    Path(path).write_text(json.dumps(data, indent=2), encoding="utf-8")
