"""Plots of runs: test accuracy vs **simulated** seconds (matplotlib, Agg backend)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from trainers.history import History


def plot_histories(histories: Sequence[tuple[str, History]], out: str | os.PathLike,
                   title: str = "Test accuracy vs simulated time") -> Path:
    """Draw one line per (label, history) of accuracy vs simulated seconds; write a PNG to ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, history in histories:
        ev = history.evaluated
        ax.plot([r.sim_seconds for r in ev], [r.accuracy for r in ev], marker=".", label=label)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("test accuracy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if histories:
        ax.legend(fontsize="small")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
