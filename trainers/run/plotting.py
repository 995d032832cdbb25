"""Plots of runs: test accuracy vs **simulated** seconds (matplotlib, Agg backend).

The image format follows the output name's extension (``.png``, ``.pdf``, ``.svg``...; a name without
one gets ``.png`` appended, and the path actually written is returned). The file is written
atomically (:func:`adaptplan.fileio.atomic_write`): a kill leaves the previous image or none, never
a 0-byte or partial one.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

from adaptplan.errors import InputError
from adaptplan.fileio import atomic_write, output_path, show
from adaptplan.limits import MAX_NUM_CLASSES
from trainers.run.history import History


def image_formats() -> list[str]:
    """The file extensions matplotlib's Agg canvas can write (png, pdf, svg, ...)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    return sorted(FigureCanvasAgg.get_supported_filetypes())


def image_path(out: str | os.PathLike) -> tuple[Path, str]:
    """(path to write, matplotlib format) for the output name ``out``: ``.png`` is appended to a name
    without an extension; an extension matplotlib cannot write, or a folder, is an InputError naming ``-o``."""
    path = Path(out)
    if path.is_dir():
        raise InputError(f"{str(out)!r} is a folder; give an image file name such as {str(path / 'plot.png')!r}",
                         field="output")
    if not path.suffix:
        path = path.with_name(path.name + ".png")
    fmt, formats = path.suffix[1:].lower(), image_formats()
    if fmt not in formats:
        raise InputError(f"unknown image format {show(path.suffix)} of {str(out)!r}; use one of "
                         f"{', '.join('.' + f for f in formats)}", field="output")
    output_path(path)   # a folder behind a symbolic link is refused too
    return path, fmt


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", (0, (5, 2)), (0, (1, 1.5)), (0, (6, 2, 1, 2)))
"""Each run's marker and line style, so that runs whose curves coincide stay apart (a marker per point too:
a short run has few)."""


def _config(history: History) -> dict:
    """The run's configuration as its history recorded it ({} where it recorded none)."""
    config = history.meta.get("config")
    return config if isinstance(config, dict) else {}


def run_label(name: str, history: History) -> str:
    """A run's legend entry: its name, and what it trained — the planning policy if one decided, the algorithm,
    the model — from its configuration (``"rma+rms: policy rma+rms, adaptsfl, cnn"``), leaving out what the name
    already says."""
    config = _config(history)
    parts = [f"policy {config['policy']}" if isinstance(config.get("policy"), str) else None,
             config.get("algorithm") if isinstance(config.get("algorithm"), str) else None,
             config.get("model") if isinstance(config.get("model"), str) else None]
    what = ", ".join(p for p in parts if p and p != name)         # a folder named after its algorithm says it once
    return f"{name}: {what}" if what else name


def chance_accuracy(num_classes: Any) -> float | None:
    """1/M: the accuracy of guessing one of M classes uniformly (None where M is unknown: a history that recorded no
    ``meta["num_classes"]``, or one beyond :data:`adaptplan.limits.MAX_NUM_CLASSES`)."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or not 2 <= num_classes <= MAX_NUM_CLASSES:
        return None
    return 1.0 / num_classes


CHANCE_GID = "chance"
"""The ``gid`` of every chance line (a grey dashed horizontal line at 1/M), so that tests and readers can find it."""


def chance_label(num_classes: int) -> str:
    return f"chance: 1/{num_classes} = {100 / num_classes:.3g} %"


def accuracy_top(values: Iterable[float | None], chances: Iterable[float] = ()) -> float:
    """The upper y-limit of an accuracy axis whose lower one is 0: above the highest point and chance line by at least
    0.02, rounded up to a multiple of 0.05, at most 1.05 (every point of a run at 100 % stays whole)."""
    finite = [float(v) for v in [*values, *chances] if v is not None and math.isfinite(float(v))]
    high = max(finite, default=1.0)
    return min(1.05, max(0.05, math.ceil(round((high + 0.02) * 20, 9)) / 20))


def chance_and_range(ax: Any, values: Iterable[float | None], num_classes: Iterable[Any]) -> list[float]:
    """Draw a chance line (:data:`CHANCE_GID`, labelled :func:`chance_label`) at 1/M for each class count M of
    ``num_classes`` (unknown ones skipped), and set the y-range from 0 to above every point (``values``, the
    accuracies drawn) and every chance line (:func:`accuracy_top`), so that a run near chance shows as one: a curve
    on the dashed line, not a zoomed-in wiggle. Returns the chance levels drawn."""
    classes = sorted({int(m) for m in num_classes if chance_accuracy(m) is not None})
    chances = [1.0 / m for m in classes]
    for m, level in zip(classes, chances):
        ax.axhline(level, color="0.35", linestyle=(0, (4, 3)), linewidth=1.0, zorder=1.5, gid=CHANCE_GID,
                   label=chance_label(m))
    ax.set_ylim(0.0, accuracy_top(values, chances))
    return chances


def legend_columns(labels: Sequence[str], width_in: float) -> int:
    """How many legend columns fit ``width_in`` inches of small type (about 0.065 in per character)."""
    longest = max((len(label) for label in labels), default=1)
    return max(1, min(len(labels), int(width_in // (0.065 * longest + 0.6))))


def plot_histories(histories: Sequence[tuple[str, History]], out: str | os.PathLike,
                   title: str = "Test accuracy vs simulated time") -> Path:
    """Draw one line per (label, history) of accuracy vs simulated seconds: global test accuracy solid-coloured
    and, where the run recorded it, the local protocol's accuracy (each device's model on its own held-out
    samples) in the same colour, thinner; every run its own marker and line style (:data:`MARKERS`,
    :data:`LINESTYLES`), so that coinciding curves stay visible; a chance line at 1/M for the runs' M classes, the
    y-range from 0 to above it and every point, and the legend below the axes, where it hides no point. Write the
    image to ``out`` (see :func:`image_path`) and return the path written. ``title`` is drawn literally."""
    path, fmt = image_path(out)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = accuracy_figure(histories, title)
    try:
        atomic_write(path, lambda fh: fig.savefig(fh, format=fmt, dpi=120))
    finally:
        plt.close(fig)
    return path


def accuracy_figure(histories: Sequence[tuple[str, History]], title: str) -> Any:
    """The figure :func:`plot_histories` writes (a matplotlib Figure, constrained layout)."""
    import matplotlib.pyplot as plt

    width = 6.4
    fig, ax = plt.subplots(figsize=(width, 4.2), layout="constrained")
    drawn: list[float | None] = []
    for i, (label, history) in enumerate(histories):
        ev = history.evaluated
        marker, style = MARKERS[i % len(MARKERS)], LINESTYLES[(i // len(MARKERS) + i) % len(LINESTYLES)]
        local = [(r.sim_seconds, r.local_accuracy) for r in ev if r.local_accuracy is not None]
        accuracies = [r.accuracy if r.accuracy is not None else float("nan") for r in ev]
        line, = ax.plot([r.sim_seconds for r in ev], accuracies, marker=marker, markersize=5, linestyle=style,
                        markerfacecolor="none", label=f"{label} (global test set)" if local else label)
        drawn += accuracies
        if local:
            ax.plot(*zip(*local), marker=marker, markersize=3, linestyle=style, linewidth=0.8,
                    color=line.get_color(), label=f"{label} (local held-out samples)")
            drawn += [a for _, a in local]
    chance_and_range(ax, drawn, [history.meta.get("num_classes") for _, history in histories])
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("accuracy")
    ax.set_title(title.replace("$", r"\$"))   # taken literally, never parsed as mathtext
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if labels:   # below the axes: it covers no point however many runs there are
        columns = legend_columns(labels, width)
        fig.set_size_inches(width, 4.2 + 0.2 * -(-len(labels) // columns))
        legend_below(ax, handles, labels, columns)
    return fig


LEGEND_DROP_IN = 0.55
"""Inches between an axes' lower edge and the top of a legend drawn below it (:func:`legend_below`): room for the
tick labels and the x-axis label."""


def legend_below(ax: Any, handles: Sequence[Any], labels: Sequence[str], columns: int = 1, **kwargs: Any) -> Any:
    """The legend of ``ax`` centred :data:`LEGEND_DROP_IN` inches below it, under its x-axis label, whatever the axes'
    height: outside the axes, where it hides no point (the figure's constrained layout makes room for it)."""
    from matplotlib.transforms import ScaledTranslation

    drop = ScaledTranslation(0, -LEGEND_DROP_IN, ax.figure.dpi_scale_trans)
    return ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0),
                     bbox_transform=ax.transAxes + drop, ncols=columns, fontsize=kwargs.pop("fontsize", "small"),
                     borderaxespad=0.0, **kwargs)


def resources_note(history: History) -> str | None:
    """What the predictions rest on, where a reader of measured/predicted must know it: a run without a
    ``--system`` file was predicted for generated placeholder resources, not this machine's."""
    if _config(history).get("system_path"):
        return None
    return ("predicted for generated placeholder resources (docs/model.md §6.1), not this machine's: the ratios say "
            "how far those are from it; give --system with measured resources for a like-for-like comparison")


def ratio_label(ratio: float) -> str:
    """measured/predicted as the bars' label: ``0.85×``, ``1.3×``, ``130×``, ``2,400×`` (never ``1.3e+02×``)."""
    if ratio >= 100:
        return f"{ratio:,.0f}×"
    return f"{ratio:.2g}×" if ratio >= 0.01 else f"{ratio:.1e}×"


def plot_predicted_vs_measured(history: History, out: str | os.PathLike, title: str) -> Path:
    """Two panels for a torch.distributed run: mean seconds per stage, predicted (latency model) next
    to measured, with measured/predicted written above each pair (log scale); and every round's
    predicted vs measured seconds. Written like :func:`plot_histories`."""
    path, fmt = image_path(out)
    rows = history.stage_comparison()
    if not rows:
        raise InputError("the run has no measured seconds: only a torch.distributed run (adaptplan train "
                         "--distributed) records them", field="runs")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bars, rounds) = plt.subplots(1, 2, figsize=(11, 4.2))
    try:
        stages = [r["stage"] for r in rows if r["stage"] != "round"]
        xs = range(len(stages))
        predicted = [next(r for r in rows if r["stage"] == s)["predicted_s"] for s in stages]
        measured = [next(r for r in rows if r["stage"] == s)["measured_s"] for s in stages]
        bars.bar([x - 0.2 for x in xs], predicted, width=0.4, label="predicted (latency model)")
        bars.bar([x + 0.2 for x in xs], measured, width=0.4, label="measured")
        for x, p, m in zip(xs, predicted, measured):
            if p > 0:
                bars.annotate(ratio_label(m / p), (x, max(p, m)), ha="center", va="bottom", fontsize="x-small")
        bars.set_xticks(list(xs), stages, rotation=30, ha="right", fontsize="small")
        bars.set_yscale("log")
        bars.set_ylabel("mean seconds per round")
        bars.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=2)  # below: no bar hidden
        measured_rounds = [r for r in history.records if r.measured_round_seconds is not None]
        rounds.plot([r.round for r in measured_rounds], [r.round_sim_seconds for r in measured_rounds], marker=".",
                    label="predicted (simulated clock)")
        rounds.plot([r.round for r in measured_rounds], [r.measured_round_seconds for r in measured_rounds], marker=".",
                    label="measured (wall)")
        rounds.set_xlabel("round")
        from matplotlib.ticker import MaxNLocator

        rounds.xaxis.set_major_locator(MaxNLocator(integer=True))   # rounds are whole numbers
        rounds.set_ylabel("seconds")
        rounds.legend(fontsize="small")
        for ax in (bars, rounds):
            ax.grid(alpha=0.3)
        fig.suptitle(title.replace("$", r"\$"))
        note = resources_note(history)
        if note:
            fig.text(0.5, 0.005, note, ha="center", va="bottom", fontsize="x-small", style="italic")
        fig.tight_layout(rect=(0, 0.04 if note else 0, 1, 1))
        atomic_write(path, lambda fh: fig.savefig(fh, format=fmt, dpi=120))
    finally:
        plt.close(fig)
    return path
