"""Plots of runs: test accuracy vs **simulated** seconds (matplotlib, Agg backend).

The image format follows the output name's extension (``.png``, ``.pdf``, ``.svg``...; a name without
one gets ``.png`` appended, and the path actually written is returned). The file is written
atomically (:func:`adaptplan.fileio.atomic_write`): a kill leaves the previous image or none, never
a 0-byte or partial one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from adaptplan.errors import InputError
from adaptplan.fileio import atomic_write, output_path, show
from trainers.history import History



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


def plot_histories(histories: Sequence[tuple[str, History]], out: str | os.PathLike,
                   title: str = "Test accuracy vs simulated time") -> Path:
    """Draw one line per (label, history) of accuracy vs simulated seconds; write the image to ``out``
    (see :func:`image_path`) and return the path written. ``title`` is drawn literally."""
    path, fmt = image_path(out)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))  # no-mutate: layout only
    try:
        for label, history in histories:
            ev = history.evaluated
            ax.plot([r.sim_seconds for r in ev], [r.accuracy for r in ev], marker=".", label=label)
        ax.set_xlabel("simulated time (s)")
        ax.set_ylabel("test accuracy")
        ax.set_title(title.replace("$", r"\$"))   # taken literally, never parsed as mathtext
        ax.grid(alpha=0.3)  # no-mutate: layout only
        if histories:
            ax.legend(fontsize="small")  # no-mutate: layout only (the legend is checked by tests)
        fig.tight_layout()  # no-mutate: layout only
        dpi = 120  # no-mutate: resolution only
        atomic_write(path, lambda fh: fig.savefig(fh, format=fmt, dpi=dpi))
    finally:
        plt.close(fig)
    return path
