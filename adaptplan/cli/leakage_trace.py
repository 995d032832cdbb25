"""``adaptplan train … --leakage-out FILE --leakage-every N`` (docs/privacy.md "Leakage over the run"): the leakage per
cut of the model the run evaluates, measured before its first round, every N rounds and at its last, each measurement
kept in history.json's ``meta.leakage_over_rounds`` and drawn beside the table (``FILE``'s stem + ``-over-rounds.png``:
dCor, the direction AUC and, for images, the inversion PSNR against the round, one line per cut); the table written at
the end holds, per cut and figure, the value that leaks most over them — what a budget needs if it must hold for
every round the devices send from, where the last round's table (``--leakage-out`` alone) holds for the trained model
only. Where each device evaluates with its own client model (PSL, GAPSL, SGLR, CyclePSL: the strategy's
``eval_models``), every distinct one is attacked and each figure is the worst over them: the devices' bodies differ,
and the one that leaks most bounds what the server sees (the cost grows with the distinct models; equal ones, as
before the first round, are attacked once).

A measurement leaves the run as it was: it attacks a copy of the evaluated model with torch's, numpy's and Python's
global random generators restored afterwards (tested: a run measured every round trains the same losses and
accuracies as one not measured). Each costs what ``profile --leakage`` does (the inversion attacker's decoders
dominate: about 40 s for the width-16 CNN's four cuts on one core).
"""

from __future__ import annotations

import copy
import random
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from adaptplan.errors import InputError
from adaptplan.leakage_table import AT_LEAST

KEY = "leakage_over_rounds"
"""history.json's ``meta`` entry: ``[{"round": t, "samples": n, "models": k, "figures": {figure: [one value per cut]}},
…]`` (``models``: the distinct evaluated models the figures are the worst over)."""


def worst_figures(points: Sequence[Mapping[str, Sequence[float]]]) -> dict[str, list[float]]:
    """Per figure and cut, the value over ``points`` (each a leakage table's ``figures``) that leaks most: the
    largest where a smaller value leaks less (dCor, the AUCs, PSNR, SSIM), the smallest reconstruction error (MSE)."""
    worst: dict[str, list[float]] = {}
    for name, first in points[0].items():
        pick = min if name in AT_LEAST else max
        worst[name] = [float(pick(point[name][cut] for point in points)) for cut in range(len(first))]
    return worst


def distinct_models(models: Sequence[Any]) -> list[Any]:
    """``models`` (``nn.Module``s) with each one equal to an earlier one left out: the same entries holding the same
    values."""
    import torch

    kept: list[tuple[Any, dict[str, Any]]] = []
    for model in models:
        state = model.state_dict()
        if not any(state.keys() == seen.keys() and all(torch.equal(state[k], seen[k]) for k in state)
                   for _, seen in kept):
            kept.append((model, state))
    return [model for model, _ in kept]


def dcor_text(figures: Mapping[str, Sequence[float]]) -> str:
    """``dCor per cut 0.965, 0.902`` — the line's figure."""
    return "dCor per cut " + ", ".join(f"{v:.3f}" for v in figures["dcor"])


def rounds_text(rounds: Sequence[int]) -> str:
    """``0, 25, 50`` — or, past six rounds, the first three, an ellipsis and the last."""
    shown = [str(r) for r in rounds] if len(rounds) <= 6 else [*map(str, rounds[:3]), "…", str(rounds[-1])]
    return ", ".join(shown)


@contextmanager
def untouched_randomness() -> Iterator[None]:
    """Run the block with every global random generator the run draws from restored after it."""
    import numpy as np
    import torch

    numpy_state, python_state = np.random.get_state(), random.getstate()
    with torch.random.fork_rng(devices=[]):
        yield
    np.random.set_state(numpy_state)
    random.setstate(python_state)


FIGURE_PANELS = (("dcor", "dCor (inputs, activations)"), ("direction_auc", "direction AUC (labels)"),
                 ("psnr", "inversion PSNR (dB)"))
"""The figures drawn against the round, those the series holds, each in its own panel."""


def figure_path(table: str | Path) -> Path:
    """``worst.json`` → ``worst-over-rounds.png``, beside the table."""
    path = Path(table)
    return path.with_name(path.stem + "-over-rounds.png")


def plot_over_rounds(series: Sequence[Mapping[str, Any]], out: str | Path, title: str) -> None:
    """Each of :data:`FIGURE_PANELS` the series holds against the round, one line per cut, written to ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(name, label) for name, label in FIGURE_PANELS if name in series[0]["figures"]]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), layout="constrained", squeeze=False)
    rounds = [point["round"] for point in series]
    for ax, (name, label) in zip(axes[0], panels):
        for cut in range(len(series[0]["figures"][name])):
            ax.plot(rounds, [point["figures"][name][cut] for point in series], marker="o", markersize=3,
                    label=f"cut {cut + 1}")
        ax.set_xlabel("round")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize="small")
    fig.suptitle(title.replace("$", r"\$"))
    fig.savefig(out, format="png")
    plt.close(fig)


class LeakageTrace:
    """The observer (:class:`trainers.run.tracking.RoundObserver`) that measures ``trainer``'s evaluated model every
    ``every`` rounds (module docstring) and writes the worst table to ``path`` when the run finishes."""

    def __init__(self, trainer: Any, path: str, samples: int, every: int) -> None:
        from adaptplan.defence_cost import DefenceSetting

        self.trainer, self.path, self.every = trainer, path, every
        self.samples = min(samples, int(trainer.dataset.x_train.shape[0]))
        self.defence = DefenceSetting.of_run(trainer.config.privacy).name
        self.pending = [] if trainer.config.run.resume else [self.measure(0)]   # a resumed run has its own in meta

    def measure(self, round_: int) -> dict[str, Any]:
        """The figures of the model the run evaluates now, on a copy of it, one line printed."""
        from adaptplan.cli.leakage_report import leakage_report

        t = self.trainer
        points = []
        for model in distinct_models(t.engine.eval_models()):
            with untouched_randomness():
                _, figures = leakage_report(copy.deepcopy(model), t.dataset, self.samples, t.config.data.dataset,
                                            t.engine.defence, self.defence)
            points.append(figures)
        worst = worst_figures(points)
        over = f" (the worst of {len(points)} device models)" if len(points) > 1 else ""
        print(f"leakage at round {round_}: {dcor_text(worst)}{over}", file=sys.stderr)
        return {"round": round_, "samples": self.samples, "models": len(points), "figures": worst}

    def log(self, record: Any) -> None:
        series = self.trainer.history.meta.setdefault(KEY, [])
        if series and series[0]["samples"] != self.samples:
            raise InputError(f"the run measured its leakage on {series[0]['samples']} samples; resume it with "
                             f"--leakage-samples {series[0]['samples']}", field="--leakage-samples")
        series.extend(self.pending)
        self.pending = []
        if record.round % self.every == 0 or record.round == self.trainer.config.run.rounds:
            series.append(self.measure(record.round))

    def close(self, status: str, final: dict[str, Any] | None) -> None:
        """A finished run: the table of the worst figures over every measurement, printed and written."""
        if status != "FINISHED":
            return
        from adaptplan.cli.leakage_report import write_leakage_table

        series = [*self.trainer.history.meta.get(KEY, []), *self.pending]
        if not series:          # a resumed run with no round left to train, never measured before
            print(f"warning: no leakage was measured in this run: {self.path} not written", file=sys.stderr)
            return
        rounds = [point["round"] for point in series]
        worst = worst_figures([point["figures"] for point in series])
        print(f"leakage per cut, the worst of {len(series)} measurements (rounds {rounds_text(rounds)}): "
              f"{dcor_text(worst)}", file=sys.stderr)
        t = self.trainer
        write_leakage_table(self.path, t.profile, t.config.data.dataset, self.samples, t.dataset, worst, self.defence,
                            f"worst of rounds {rounds_text(rounds)}")
        figure = figure_path(self.path)
        plot_over_rounds(series, figure, f"leakage per cut over the run: {t.config.algorithm}, "
                                         f"{t.config.data.dataset}, {self.samples} samples, defence {self.defence}")
        print(f"wrote {figure} (the figures against the round, one line per cut)", file=sys.stderr)
