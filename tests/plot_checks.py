"""What the plot tests share: catching the figures a plot function closes, and drawing one again as it was saved."""

from __future__ import annotations

from typing import Any


def spy_figures(monkeypatch: Any) -> list:
    """The figures ``plt.close`` is given from now on (a plot function closes the figure it saved)."""
    import matplotlib.pyplot as plt

    figures, close = [], plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: figures.append(fig) or close(fig))
    return figures


def drawn(fig: Any) -> Any:
    """The renderer of ``fig`` drawn again as it was saved (layout included), after plt.close took its canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()
