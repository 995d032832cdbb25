"""``adaptplan bench privacy`` (issue 71 item 3; docs/privacy.md "The attack bench"): per cut and defence setting,
training's test accuracy and simulated time beside what an honest-but-curious edge server learns from the trained
model's released activations, over seeds, and the trade-off drawn.

Each run trains the setting (every device at cut j, the defence on every device: trainers/roles/defences.py) and
then attacks the model it evaluates (the global model, the devices' client blocks its average) at cut j, as
``profile --leakage`` does at initial weights (profilers/leakage.py, profilers/inversion.py) but on the activations
as the defence releases them: clipped and noised (the attacker knows the mechanism and draws its own noise for its
auxiliary data), so the figures are the defended channel's. NoPeek changes the weights, not the release; under
randomised labels the gradients attacked are computed on labels drawn by the same response (the attack scored
against the true ones). The
attacked samples are the first ``leakage_samples`` training samples (the devices' data), the attacker's auxiliary
data as many test samples (disjoint).

A run with a folder writes a checkpoint at every evaluation; one stopped there (Ctrl-C, SIGTERM: a checkpoint and no
figures) continues from it on the next call, as ``train --resume`` does, and is attacked when it ends — a stopped
ResNet-18 bench loses at most an evaluation's rounds, not its run.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from adaptplan.benches.progress import count_rounds
from adaptplan.defence_cost import DefenceSetting, head_cuts, parse_defences  # noqa: F401  (the bench's settings)

RESULT_FILE = "privacy_result.json"
"""What a finished run of the bench leaves in its folder: its configuration and figures (read back on a rerun)."""
FIGURES = ("accuracy", "sim_seconds", "epsilon", "dcor", "norm_auc", "direction_auc", "mse", "psnr", "ssim",
           "head_epsilon", "head_direction_auc")


def privacy_jobs(base: dict[str, Any], cuts: Sequence[int], defences: Sequence[DefenceSetting], seeds: Sequence[int],
                 leakage_samples: int, out: Path | None, num_blocks: int | None = None) -> list[dict[str, Any]]:
    """One job per seed × cut × defence: the run's configuration (``base`` with the cut, the defence, the seed) and
    its folder (``out/runs/seed<S>/cut<j>/<defence>``). A U-shaped setting (``head=K``) runs only at the cuts it
    leaves the edge server a block at (:func:`adaptplan.defence_cost.head_cuts` of the model's ``num_blocks``)."""
    jobs = []
    for seed in seeds:
        for cut in cuts:
            for defence in defences:
                if defence.head and num_blocks is not None and cut not in head_cuts(num_blocks, defence.head):
                    continue
                config = {**base, "cuts": (int(cut),), "seed": int(seed), **defence.config()}
                folder = None if out is None else out / "runs" / f"seed{seed}" / f"cut{cut}" / defence.name
                jobs.append({"config": config, "cut": int(cut), "defence": defence.name, "seed": int(seed),
                             "leakage_samples": int(leakage_samples), "folder": None if folder is None else str(folder)})
    return jobs


def privacy_run(job: dict[str, Any]) -> dict[str, Any]:
    """Train ``job``'s run and attack its model at its cut (module docstring); its figures (:data:`FIGURES`). A run
    whose folder holds the figures of the same configuration is read back instead (a key it was saved without read
    at the value runs of before had, ``SAVED_BEFORE``)."""
    from trainers.config.train_config import SAVED_BEFORE, TrainConfig

    folder = Path(job["folder"]) if job.get("folder") else None
    if folder is not None and (folder / RESULT_FILE).is_file():
        saved = json.loads((folder / RESULT_FILE).read_text(encoding="utf-8"))
        config = _plain(job["config"])
        if {k: v for k, v in SAVED_BEFORE.items() if k in config} | saved.get("config", {}) == config:
            return saved["figures"]

    from trainers.config.host import use_cpu
    from trainers.run.driver import Trainer

    use_cpu(1)
    config = dict(job["config"], progress=False)
    if folder is not None:
        from adaptplan.benches.runs import in_folder
        from trainers.run.checkpoint import CHECKPOINT_NAME

        in_folder(config, folder, resume=(folder / CHECKPOINT_NAME).exists() and not (folder / RESULT_FILE).exists())
    trainer = Trainer(TrainConfig.flat(**config))
    count_rounds(trainer)
    history = trainer.run()
    figures = {"accuracy": history.final_accuracy, "sim_seconds": trainer.clock.seconds,
               "epsilon": history.records[-1].metrics.get("epsilon_max") if history.records else None,
               "head_epsilon": history.records[-1].metrics.get("head_epsilon_max") if history.records else None,
               **attack(trainer, job["cut"], job["leakage_samples"])}
    if folder is not None:
        from adaptplan.fileio import save_json

        save_json({"config": _plain(job["config"]), "figures": figures}, folder / RESULT_FILE)
    return figures


def attack(trainer: Any, cut: int, samples: int) -> dict[str, float]:
    """The leakage figures of ``trainer``'s evaluated model at ``cut`` on the released activations (module
    docstring), under a U-shaped split also the direction AUC at the head's input from the gradients it releases;
    the inversion's only for image data of at least the SSIM window. Where each device evaluates with its own client
    model (PSL, GAPSL, SGLR, CyclePSL) every distinct one is attacked and each figure is the worst over them
    (:func:`adaptplan.cli.leakage_trace.worst_figures`): the server sees every device's activations."""
    from adaptplan.cli.leakage_trace import distinct_models, worst_figures

    points = [attack_model(trainer, model, cut, samples) for model in distinct_models(trainer.engine.eval_models())]
    return {name: values[0] for name, values in worst_figures([{k: [v] for k, v in p.items()} for p in points]).items()}


def attack_model(trainer: Any, model: Any, cut: int, samples: int) -> dict[str, float]:
    """:func:`attack` on one of ``trainer``'s evaluated models."""
    from profilers.inversion import SSIM_WINDOW, invert_per_cut
    from profilers.leakage import leakage_per_cut

    data = trainer.dataset
    n = min(samples, int(data.x_train.shape[0]), int(data.x_test.shape[0]))
    x, y = data.x_train[:n], data.y_train[:n]
    seed = int(trainer.config.run.seed)
    defence = trainer.engine.defence
    view = defence.attacker_view(y, 2 ** 31 - 1 - seed, [seed, 2 ** 31 - 1])
    release, start = view.release, len(model) - defence.head
    head = (start, view.gradient) if view.gradient is not None else None
    row, *at_head = leakage_per_cut(model, x, y, release, cuts=[cut, start] if defence.head else [cut],
                                    sent_labels=view.labels, head=head)
    out = {"dcor": row.dcor, "norm_auc": row.norm_auc, "direction_auc": row.direction_auc}
    if at_head:           # a U-shaped split: the gradient its head sends up, at its input (cut L − K)
        out["head_direction_auc"] = at_head[0].direction_auc
    shape = tuple(x.shape[1:])
    if len(shape) == 3 and min(shape[1:]) >= SSIM_WINDOW:
        (rec,), _ = invert_per_cut(model, data.x_test[:n], x, data.mean, data.std, release=release, cuts=[cut])
        out |= {"mse": rec.mse, "psnr": min(rec.psnr, 999.0), "ssim": rec.ssim}
    return out


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=list))


@dataclass(frozen=True)
class PrivacyRow:
    """One cut × defence of the table: each figure's mean and standard deviation over the seeds (None where no seed
    has it)."""

    cut: int
    defence: str
    seeds: int
    mean: dict[str, float | None]
    std: dict[str, float | None]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def summarise(jobs: Sequence[dict[str, Any]], figures: Sequence[dict[str, Any]]) -> list[PrivacyRow]:
    """The table's rows, in the jobs' order of cut and defence."""
    groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for job, fig in zip(jobs, figures):
        groups.setdefault((job["cut"], job["defence"]), []).append(fig)
    rows = []
    for (cut, defence), runs in sorted(groups.items(), key=lambda kv: (kv[0][0], list(groups).index(kv[0]))):
        mean, std = {}, {}
        for name in FIGURES:
            values = [float(r[name]) for r in runs if r.get(name) is not None and math.isfinite(float(r[name]))]
            mean[name] = float(np.mean(values)) if values else None
            std[name] = float(np.std(values, ddof=1)) if len(values) > 1 else (0.0 if values else None)
        rows.append(PrivacyRow(cut, defence, len(runs), mean, std))
    return rows


def _cell(row: PrivacyRow, name: str, fmt: str, scale: float = 1.0) -> str:
    m, s = row.mean[name], row.std[name]
    if m is None:
        return "-"
    if row.seeds == 1:
        return format(m * scale, fmt)
    spread = (s or 0.0) * scale
    return f"{format(m * scale, fmt)} ± {format(spread, fmt) if spread >= 1e-9 * abs(m * scale) else '0'}"


def table(rows: Sequence[PrivacyRow], header: str) -> str:
    """The table's text: per cut and defence, accuracy and simulated time beside the leakage figures."""
    columns = [("cut", lambda r: str(r.cut)), ("defence", lambda r: r.defence),
               ("test acc. %", lambda r: _cell(r, "accuracy", ".1f", 100)),
               ("sim. s", lambda r: _cell(r, "sim_seconds", ".4g")), ("ε (δ = 1e-5)", lambda r: _cell(r, "epsilon", ".3g")),
               ("dCor", lambda r: _cell(r, "dcor", ".3f")), ("norm AUC", lambda r: _cell(r, "norm_auc", ".3f")),
               ("direction AUC", lambda r: _cell(r, "direction_auc", ".3f")),
               ("PSNR dB", lambda r: _cell(r, "psnr", ".2f")), ("SSIM", lambda r: _cell(r, "ssim", ".3f"))]
    if any(r.mean["head_direction_auc"] is not None for r in rows):      # U-shaped settings: the head's channel
        columns += [("head ε", lambda r: _cell(r, "head_epsilon", ".3g")),
                    ("head-input dir. AUC", lambda r: _cell(r, "head_direction_auc", ".3f"))]
    cells = [[name for name, _ in columns]] + [[get(r) for _, get in columns] for r in rows]
    widths = [max(len(line[k]) for line in cells) for k in range(len(columns))]
    lines = [header, ""] + ["  ".join(c.rjust(w) if k != 1 else c.ljust(w) for k, (c, w) in enumerate(zip(line, widths)))
                            for line in cells]
    lines.insert(3, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def plot(rows: Sequence[PrivacyRow], path: str | Path) -> None:
    """The trade-off: test accuracy against each leakage figure (inversion PSNR, dCor, direction AUC), one colour per
    defence, one marker per cut, s.d. over the seeds as error bars; marker size grows with the simulated time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(name, label) for name, label in (("psnr", "inversion PSNR (dB, higher: more leaked)"),
                                                ("dcor", "dCor(inputs, released activations)"),
                                                ("direction_auc", "label inference AUC (direction)"))
              if any(r.mean[name] is not None for r in rows)]
    defences = list(dict.fromkeys(r.defence for r in rows))
    cuts = sorted({r.cut for r in rows})
    markers = "osD^vP*X"
    times = [r.mean["sim_seconds"] or 0.0 for r in rows]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
    for ax, (name, label) in zip(axes[0], panels):
        for r, t in zip(rows, times):
            if r.mean[name] is None or r.mean["accuracy"] is None:
                continue
            colour = plt.get_cmap("tab10")(defences.index(r.defence) % 10)
            ax.errorbar(r.mean[name], 100 * r.mean["accuracy"], xerr=r.std[name] or 0.0,
                        yerr=100 * (r.std["accuracy"] or 0.0), fmt=markers[cuts.index(r.cut) % len(markers)],
                        color=colour, markersize=5 + 7 * t / max(max(times), 1e-12), capsize=2)
        ax.set_xlabel(label)
        ax.set_ylabel("test accuracy (%)")
        ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], color=plt.get_cmap("tab10")(k % 10), marker="o", linestyle="", label=d)
               for k, d in enumerate(defences)]
    handles += [plt.Line2D([], [], color="grey", marker=markers[k % len(markers)], linestyle="", label=f"cut {c}")
                for k, c in enumerate(cuts)]
    axes[0][-1].legend(handles=handles, fontsize=8, loc="best")
    fig.suptitle("accuracy vs leakage per cut and defence (marker size: simulated time)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
