"""`adaptplan bench algorithms`: the split algorithms side by side on one data set, model, seed,
system and plan, under IID and non-IID partitions.

Every (partition, algorithm) pair is one ``adaptplan train`` run (:class:`trainers.run.Trainer`)
with the same options; runs go to worker processes (one torch thread each). The table reports,
per partition and algorithm: test accuracy after the same number of rounds, test accuracy at the
same simulated-time budget (the shortest run's simulated seconds, so every algorithm is measured
at a time it reached), simulated seconds to ``target`` accuracy, and the wall seconds per round.
The plot draws test accuracy against simulated seconds, one panel per partition.

GAS counts a round as one global iteration (Q_c = C uploaded models of E local steps); the
benchmark uses C = 10 and E = 2 so that a GAS round holds C·E = 20 device steps, as a synchronous
round of 20 devices does.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from trainers.config import ALGORITHMS

PARTITIONS = {"iid": {"partition": "iid"}, "dirichlet-0.1": {"partition": "dirichlet", "dirichlet_alpha": 0.1},
              "shards-2": {"partition": "shards"}}
BENCH_OPTIONS = {"gas": {"active": 10, "local_steps": 2}}


@dataclass(frozen=True)
class AlgorithmResult:
    """One run's figures: accuracies (fractions), simulated and wall seconds."""

    partition: str
    algorithm: str
    rounds: int
    final_accuracy: float | None
    sim_seconds: float
    wall_seconds: float
    time_to_target_s: float | None
    curve: list[tuple[float, float]]          # (simulated seconds, test accuracy) at each evaluation

    def accuracy_at(self, seconds: float) -> float | None:
        """Test accuracy of the last evaluation at or before ``seconds`` simulated seconds."""
        reached = [acc for t, acc in self.curve if t <= seconds + 1e-12]
        return reached[-1] if reached else None


def _run_one(job: dict[str, Any]) -> AlgorithmResult:
    import torch

    from trainers.config import TrainConfig
    from trainers.run import Trainer

    torch.set_num_threads(1)
    config = TrainConfig(**job["config"])
    history = Trainer(config).run()
    curve = [(r.sim_seconds, r.accuracy) for r in history.evaluated]
    last = history.records[-1]
    return AlgorithmResult(job["partition"], config.algorithm, len(history.records), history.final_accuracy,
                           last.sim_seconds, last.wall_seconds, history.time_to_accuracy(job["target"]), curve)


def run_algorithm_bench(algorithms: Sequence[str] = ALGORITHMS, partitions: Sequence[str] = tuple(PARTITIONS),
                        rounds: int = 200, devices: int = 20, dataset: str = "cifar10-subset", model: str = "cnn",
                        lr: float = 0.05, momentum: float = 0.9, batch_size: int = 16, eval_every: int = 10,
                        seed: int = 0, target: float = 0.3, workers: int | None = None, cuts: Sequence[int] | None = None,
                        progress: bool = True) -> list[AlgorithmResult]:
    """Run every (partition, algorithm) pair and return their results (module docstring)."""
    jobs = []
    for partition in partitions:
        for algorithm in algorithms:
            config = dict(algorithm=algorithm, dataset=dataset, model=model, devices=devices, rounds=rounds, lr=lr,
                          momentum=momentum, batch_size=batch_size, eval_every=eval_every, seed=seed, threads=1,
                          progress=False, extra=dict(BENCH_OPTIONS.get(algorithm, {})), **PARTITIONS[partition])
            if cuts is not None:
                config["cuts"] = tuple(cuts)
            jobs.append({"partition": partition, "target": target, "config": config})
    workers = workers or max(1, os.cpu_count() or 1)
    results: list[AlgorithmResult] = []
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(jobs), unit="run", desc="bench algorithms", dynamic_ncols=True)
    try:
        if workers == 1:
            for job in jobs:
                results.append(_run_one(job))
                if bar is not None:
                    bar.update(1)
        else:
            import multiprocessing

            with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
                for result in pool.map(_run_one, jobs):
                    results.append(result)
                    if bar is not None:
                        bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return results


def budget_seconds(results: Sequence[AlgorithmResult], partition: str) -> float:
    """The equal simulated-time budget of a partition: the shortest run's simulated seconds."""
    return min(r.sim_seconds for r in results if r.partition == partition)


def table(results: Sequence[AlgorithmResult], target: float) -> str:
    """The comparison table (one block per partition)."""
    lines = []
    for partition in dict.fromkeys(r.partition for r in results):
        budget = budget_seconds(results, partition)
        rows = [r for r in results if r.partition == partition]
        lines.append(f"{partition}: accuracy after {rows[0].rounds} rounds, at the equal budget of {budget:.3g} simulated s, "
                     f"simulated s to {target:.0%}")
        lines.append(f"  {'algorithm':<10} {'acc@rounds':>10} {'acc@budget':>10} {'s to target':>11} {'sim s':>9} "
                     f"{'wall s/round':>12}")
        for r in rows:
            at_budget = r.accuracy_at(budget)
            lines.append(f"  {r.algorithm:<10} {_pct(r.final_accuracy):>10} {_pct(at_budget):>10} "
                         f"{'-' if r.time_to_target_s is None else f'{r.time_to_target_s:.3g}':>11} {r.sim_seconds:>9.3g} "
                         f"{r.wall_seconds / max(r.rounds, 1):>12.3f}")
    return "\n".join(lines)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def plot(results: Sequence[AlgorithmResult], path: str | os.PathLike) -> None:
    """Test accuracy against simulated seconds, one panel per partition, one line per algorithm."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    partitions = list(dict.fromkeys(r.partition for r in results))
    fig, axes = plt.subplots(1, len(partitions), figsize=(5 * len(partitions), 4), squeeze=False)
    for ax, partition in zip(axes[0], partitions):
        for r in results:
            if r.partition == partition and r.curve:
                ax.plot([t for t, _ in r.curve], [a for _, a in r.curve], label=r.algorithm)
        ax.set_title(partition)
        ax.set_xlabel("simulated seconds")
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def save_json(results: Sequence[AlgorithmResult], target: float, path: str | os.PathLike) -> None:
    data = {"target_accuracy": target,
            "budgets_s": {p: budget_seconds(results, p) for p in dict.fromkeys(r.partition for r in results)},
            "runs": [{**asdict(r), "accuracy_at_budget": r.accuracy_at(budget_seconds(results, r.partition))}
                     for r in results]}
    Path(path).write_text(json.dumps(data, indent=2), encoding="utf-8")
