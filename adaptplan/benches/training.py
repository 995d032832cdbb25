"""`adaptplan bench training`: the paper's headline experiment (AdaptSFL Fig. 5–6) from one
command — planning policies in the training loop, compared by time to accuracy.

Each policy (:mod:`trainers.run.policies`) trains the same model on the same data, seed and per-round
system trace (the generated system re-drawn every round from the same seed), with the same
training algorithm (AdaptSFL's engine) and one training setting (:data:`ADAPTSFL_SETTING`, printed above
the table); the policy decides cuts and interval at the start and at aggregations. Runs go to worker
processes (:mod:`adaptplan.benches.runs`). Reported
per partition and policy: rounds and simulated seconds to ``target`` accuracy, converged accuracy
and time by the paper's criterion (gain < 0.02 over 5 evaluations, not while near chance), and the
time to target as a multiple of AdaptSFL's.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from adaptplan.benches.comparison import Setting
from adaptplan.benches.runs import RunResult, no_evaluation, not_converged, not_reached, pct, run_jobs, seconds
from adaptplan.benches.workload import Workload
from adaptplan.report import Empty, empty_notes

DEFAULT_POLICIES = ("adaptsfl", "rma+ms", "ma+rms", "rma+rms", "dama+rms", "rma+ams", "sfl", "psl")
PARTITIONS = ("iid", "shards")
SWEEPS = {"device-flops": "flops_scale", "bandwidth": "bandwidth_scale", "noise-cv": "noise_cv"}
"""--sweep NAME → the TrainConfig field it sets (device FLOP/s and link-rate ranges scaled; measurement noise CV)."""


ADAPTSFL_SETTING = Setting(
    "sgd", 0.05, 0.05, 0.9, 0.0, 0.0, 16, 1.0, None, 600,
    sources={"optimizer": "AdaptSFL's paper: SGD (§III-B)", "client_lr": "AdaptSFL's rate is lost from the text: "
             "0.05, the project's tested value (trainers.config.train_config.ALGORITHM_DEFAULTS)", "server_lr": "as client_lr",
             "momentum": "the project's tested value (the paper states none)", "weight_decay": "none stated",
             "clip_norm": "none stated", "batch_size": "AdaptSFL §VII-A: 16",
             "participation": "AdaptSFL §VII-A: every device, every round", "local_steps": "each policy's own",
             "rounds": "the command's --rounds"})
"""``bench training``'s setting: every policy trains AdaptSFL's algorithm with it."""


WORKLOAD = Workload(ADAPTSFL_SETTING, target=0.4)
"""``bench training``'s workload: the command's defaults, AdaptSFL's setting."""


@dataclass(frozen=True)
class Planning:
    """What ``bench training`` varies besides the policy: AdaptSFL re-plans every ``replan_every`` rounds
    (Algorithm 1), the planners measure with Gaussian noise of coefficient of variation ``noise_cv``, and a
    ``sweep`` (NAME, values) repeats the comparison on the first partition for each value of a key of
    :data:`SWEEPS`."""

    replan_every: int = 50
    noise_cv: float = 0.0
    sweep: tuple[str, Sequence[float]] | None = None


def run_training_bench(policies: Sequence[str] = DEFAULT_POLICIES, partitions: Sequence[str] = PARTITIONS,
                       workload: Workload = WORKLOAD, planning: Planning = Planning(), seed: int = 0,
                       workers: int | None = None,
                       progress: bool = True) -> list[RunResult]:
    """Run every (partition, policy) pair of ``workload`` with ``seed``, or with ``planning.sweep = (NAME, values)``
    every (value, policy) pair on the first partition (the run's group is then ``NAME=value``)."""
    jobs = []
    settings: list[tuple[str, str, dict[str, float]]] = [(p, p, {}) for p in partitions]
    if planning.sweep is not None:
        name, values = planning.sweep
        settings = [(f"{name}={v:g}", partitions[0], {SWEEPS[name]: float(v)}) for v in values]
    for group, partition, override in settings:
        for policy in policies:
            config: dict[str, Any] = {**workload.config("adaptsfl", seed, planned=True), "policy": policy,
                                      "partition": partition, "noise_cv": planning.noise_cv, **override}
            if policy == "adaptsfl":
                config["replan_every"] = planning.replan_every
            jobs.append({"group": group, "label": policy, "target": workload.target, "config": config})
    return run_jobs(jobs, workers, "bench training", progress)


def figures(r: RunResult, more_targets: Sequence[float] = ()) -> dict[str, Any]:
    """The per-policy figures of the JSON output; with ``more_targets`` also the simulated seconds to
    each (``time_to_accuracy_s``, keyed by the fraction)."""
    out: dict[str, Any] = {"time_to_target_s": r.time_to_target_s, "rounds_to_target": r.rounds_to_target,
           "final_accuracy": r.final_accuracy, "converged_round": r.converged_round,
           "converged_time_s": r.converged_time_s, "converged_accuracy": r.converged_accuracy}
    if more_targets:
        out["time_to_accuracy_s"] = {f"{t:g}": r.time_to(t) for t in more_targets}
    return out


def table(results: Sequence[RunResult], target: float, more_targets: Sequence[float] = (),
          setting: Setting = ADAPTSFL_SETTING) -> str:
    """One block per partition, the setting above each; under it, why a cell is empty (``-``:
    :func:`adaptplan.report.empty_notes`)."""
    lines, cells = [], []
    headers = ["policy", "rounds→target", "s→target", "× AdaptSFL", *(f"s→{t:.0%}" for t in more_targets), "final",
               "conv. round", "conv. s", "conv. acc"]
    for partition in dict.fromkeys(r.group for r in results):
        rows = [r for r in results if r.group == partition]
        adaptsfl = next((r for r in rows if r.label == "adaptsfl"), None)
        base = adaptsfl.time_to_target_s if adaptsfl is not None else None
        lines.append(f"{partition}: target {target:.0%}, {rows[0].rounds} rounds")
        lines.append(f"  setting — {setting.describe()}")
        extra = "".join(f" {'s→' + format(t, '.0%'):>8}" for t in more_targets)
        lines.append(f"  {'policy':<9} {'rounds→target':>13} {'s→target':>9} {'× AdaptSFL':>10}{extra} {'final':>7} "
                     f"{'conv. round':>11} {'conv. s':>8} {'conv. acc':>9}")
        for r in rows:
            missed, unconverged = not_reached(r, target), not_converged(r)
            if r.time_to_target_s is None:
                ratio: str = Empty(missed)
            elif base is None:
                ratio = Empty("AdaptSFL did not reach the target" if adaptsfl is not None
                              else "no AdaptSFL run in this partition")
            else:
                ratio = f"{r.time_to_target_s / base:.2f}"
            row = [r.label, Empty(missed) if r.rounds_to_target is None else f"{r.rounds_to_target:.1f}",
                   seconds(r.time_to_target_s, missed), ratio,
                   *(seconds(r.time_to(t), not_reached(r, t)) for t in more_targets),
                   pct(r.final_accuracy, no_evaluation(r)),
                   Empty(unconverged) if r.converged_round is None else str(r.converged_round),
                   seconds(r.converged_time_s, unconverged), pct(r.converged_accuracy, unconverged)]
            cells.append(row)
            extra = "".join(f" {cell:>8}" for cell in row[4:-4])
            lines.append(f"  {row[0]:<9} {row[1]:>13} {row[2]:>9} {row[3]:>10}{extra} {row[-4]:>7} {row[-3]:>11} "
                         f"{row[-2]:>8} {row[-1]:>9}")
    return "\n".join(lines + empty_notes(headers, cells))


def save_json(results: Sequence[RunResult], target: float, path: str | os.PathLike,
              more_targets: Sequence[float] = (), setting: Setting = ADAPTSFL_SETTING) -> None:
    """``{"target_accuracy", "policies": {NAME: figures}}`` for the first partition, every
    partition's under ``"partitions": {PARTITION: {NAME: figures}}``, and every run's accuracy curve
    (``[simulated s, accuracy]`` per evaluation) under ``"curves": {PARTITION: {NAME: [...]}}``."""
    by_partition: dict[str, dict[str, Any]] = {}
    curves: dict[str, dict[str, Any]] = {}
    for r in results:
        by_partition.setdefault(r.group, {})[r.label] = figures(r, more_targets)
        curves.setdefault(r.group, {})[r.label] = [list(point) for point in r.curve]
    first = next(iter(by_partition.values()), {})
    data = {"target_accuracy": target, "setting": setting.to_json(), "policies": first, "partitions": by_partition,
            "curves": curves}
    Path(path).write_text(json.dumps(data, indent=2), encoding="utf-8")


def sweep_table(results: Sequence[RunResult], name: str) -> str:
    """Simulated seconds to target (and converged) per policy against the swept value; under it, why a cell is
    empty (``-``)."""
    groups = list(dict.fromkeys(r.group for r in results))
    policies = list(dict.fromkeys(r.label for r in results))
    cell = {(r.group, r.label): r for r in results}
    lines = [f"sweep {name}: simulated s to target / converged s",
             f"  {'policy':<9} " + " ".join(f"{g.split('=')[1]:>17}" for g in groups)]
    cells = []
    for policy in policies:
        row = [[seconds(cell[g, policy].time_to_target_s, "target not reached within the run's "
                        f"{cell[g, policy].rounds} rounds"),
                seconds(cell[g, policy].converged_time_s, not_converged(cell[g, policy]))] for g in groups]
        cells.append([policy, *(c for pair in row for c in pair)])
        lines.append(f"  {policy:<9} " + " ".join(f"{to:>8} / {conv:>6}" for to, conv in row))
    headers = ["policy", *(h for _ in groups for h in ("s to target", "converged s"))]
    return "\n".join(lines + empty_notes(headers, cells))


def sweep_plot(results: Sequence[RunResult], name: str, path: str | os.PathLike) -> None:
    """Simulated seconds to target against the swept value, one line per policy (AdaptSFL Figs. 7–8), the legend
    beside the axes."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
    for policy in dict.fromkeys(r.label for r in results):
        points = [(float(r.group.split("=")[1]), r.time_to_target_s) for r in results if r.label == policy]
        points = [(x, y) for x, y in points if y is not None]
        if points:
            ax.plot(*zip(*points), marker="o", label=policy)
    ax.set_xlabel(name)
    ax.set_ylabel("simulated seconds to target")
    ax.grid(alpha=0.3)
    if ax.lines:   # beside the axes: it hides no point
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    else:
        ax.text(0.5, 0.5, "no policy reached the target", ha="center", transform=ax.transAxes)
    fig.savefig(path)
    plt.close(fig)
