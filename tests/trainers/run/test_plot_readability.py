"""Plots a newcomer can read (issue 65 item 3): every accuracy plot shows chance, 1/M for the run's M classes, as a
dashed line inside its y-range, so that runs near chance read as runs that learnt nothing; the legend sits outside
the axes, where it covers no point; and `plot --predicted-vs-measured` prints in the terminal the caveat its plot
carries. Checked on the figures, by drawing them (matplotlib's renderer extents), and on the images written."""

from __future__ import annotations

import numpy as np
import pytest

from tests.plot_checks import drawn
from trainers.run.history import History, RoundRecord
from trainers.run.plotting import CHANCE_GID, accuracy_top, chance_accuracy


def history(accuracies, classes: int | None = 10, local=None, config=None, measured: bool = False) -> History:
    local = local or [None] * len(accuracies)
    records = [RoundRecord(t, 1.0, a, 0.5, 0.1 * t, 0.1, 0.2 * t, 10, 10, 0, True, False, [2, 2], 1,
                           local_accuracy=la, stage_seconds={"server": 0.05, "uplink": 0.05},
                           measured_stage_seconds={"server": 500.0, "uplink": 0.2} if measured else {},
                           measured_round_seconds=0.7 if measured else None)
               for t, (a, la) in enumerate(zip(accuracies, local), start=1)]
    meta = {"config": config or {"algorithm": "adaptsfl", "model": "cnn"}}
    if classes is not None:
        meta["num_classes"] = classes
    return History(records=records, meta=meta)


def chance_lines(ax) -> list:
    return [line for line in ax.get_lines() if line.get_gid() == CHANCE_GID]


def data_lines(ax) -> list:
    return [line for line in ax.get_lines() if line.get_gid() != CHANCE_GID]


# the tour's runs: every one at chance, several on exactly 0.10816 (one class predicted), each with a local accuracy
NEAR_CHANCE = [(name, history(acc, 10, local)) for name, acc, local in [
    ("rma+rms", [0.1092], [0.1438]), ("scala", [0.10816125860373647], [0.081]),
    ("squeezenet", [0.1033], [0.0984]), ("v1", [0.10816125860373647], [0.1142]),
    ("run", [0.085, 0.10816125860373647, 0.115], [0.09, 0.1, 0.12]), ("psl", [0.15, 0.1], [0.11, 0.1])]]


def test_a_run_near_chance_is_drawn_on_its_chance_line_inside_the_y_range() -> None:
    import matplotlib.pyplot as plt

    from trainers.run.plotting import accuracy_figure

    fig = accuracy_figure(NEAR_CHANCE, "t")
    try:
        (ax,) = fig.axes
        (chance,) = chance_lines(ax)                                  # one line for the runs' one class count
        assert list(chance.get_ydata()) == [pytest.approx(1 / 10)] * 2 and chance.get_label() == "chance: 1/10 = 10 %"
        bottom, top = ax.get_ylim()
        points = [y for line in data_lines(ax) for y in line.get_ydata()]
        assert bottom == 0.0 and bottom < 1 / 10 < top                 # the chance level inside the range, from 0 up
        assert top >= max(points) + 0.02 and top == 0.2               # above every point, not a zoom to 0.08–0.115
        assert "chance: 1/10 = 10 %" in [t.get_text() for t in ax.get_legend().get_texts()]
    finally:
        plt.close(fig)


def test_runs_of_several_class_counts_get_one_chance_line_each_and_unknown_counts_none() -> None:
    import matplotlib.pyplot as plt

    from trainers.run.plotting import accuracy_figure

    runs = [("c10", history([0.4, 0.6], 10)), ("c100", history([0.02, 0.05], 100)), ("old", history([0.3], None))]
    fig = accuracy_figure(runs, "t")
    try:
        (ax,) = fig.axes
        assert sorted(line.get_ydata()[0] for line in chance_lines(ax)) == pytest.approx([0.01, 0.1])
        assert ax.get_ylim() == (0.0, pytest.approx(0.65))
    finally:
        plt.close(fig)
    fig = accuracy_figure([("old", history([0.3, 0.97], None))], "t")  # a history without num_classes: no line
    try:
        assert not chance_lines(fig.axes[0]) and fig.axes[0].get_ylim() == (0.0, pytest.approx(1.0))
    finally:
        plt.close(fig)


def test_chance_and_the_y_range_rules() -> None:
    assert chance_accuracy(10) == 0.1 and chance_accuracy(100) == 0.01
    assert [chance_accuracy(m) for m in (None, 1, 0, True, 2.5, "10")] == [None] * 6
    assert accuracy_top([0.085, 0.115], [0.1]) == pytest.approx(0.15)             # 0.135 rounded up to 0.05
    assert accuracy_top([0.5], [0.1]) == pytest.approx(0.55)
    assert accuracy_top([1.0]) == pytest.approx(1.05)                               # a point at 100 % stays whole
    assert accuracy_top([None, float("nan")], [0.01]) == pytest.approx(0.05)
    assert accuracy_top([]) == pytest.approx(1.05)                                 # nothing drawn: the whole range


def test_the_legend_covers_no_point_however_many_runs(tmp_path) -> None:
    """The tour's `adaptplan plot runs/* -o accuracy.png` had its legend over the points: now it lies below the axes
    and their x-axis label, inside the figure, for one run and for twelve."""
    import matplotlib.pyplot as plt

    from trainers.run.plotting import accuracy_figure, plot_histories

    for runs in (NEAR_CHANCE[:1], NEAR_CHANCE, NEAR_CHANCE * 2):
        fig = accuracy_figure(runs, "t")
        try:
            renderer = drawn(fig)
            (ax,) = fig.axes
            legend = ax.get_legend().get_window_extent(renderer)
            assert not legend.overlaps(ax.get_window_extent(renderer))           # not over the data area
            assert not legend.overlaps(ax.xaxis.label.get_window_extent(renderer))
            assert not legend.overlaps(ax.xaxis.get_tightbbox(renderer))        # nor the tick labels
            assert fig.bbox.x0 <= legend.x0 and legend.x1 <= fig.bbox.x1 and fig.bbox.y0 <= legend.y0
            for line in data_lines(ax):                                         # every point plainly outside it
                for x, y in ax.transData.transform(np.column_stack([line.get_xdata(), line.get_ydata()])):
                    assert not legend.contains(x, y)
        finally:
            plt.close(fig)
    written = plot_histories(NEAR_CHANCE, tmp_path / "accuracy.png")
    image = plt.imread(written)
    assert image.shape[0] > 600 and image.shape[1] >= 760                # grown to hold the legend below


def test_each_runs_own_accuracy_png_shows_chance_too(tmp_path, monkeypatch) -> None:
    """The plot a run writes into its folder (trainers/run/driver.py) is the same figure: chance line included."""
    import matplotlib.figure

    from trainers.run.plotting import plot_histories

    saved = []
    save = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **kw: saved.append(fig) or save(fig, *a, **kw))
    plot_histories([("run", history([0.2, 0.35], 10))], tmp_path / "accuracy.png")
    (ax,) = saved[0].axes
    assert [line.get_ydata()[0] for line in chance_lines(ax)] == [pytest.approx(0.1)] and ax.get_ylim()[0] == 0.0


@pytest.mark.parametrize("system_path, said", [(None, True), ("system.json", False)])
def test_predicted_vs_measured_prints_the_plots_caveat_in_the_terminal(tmp_path, capsys, system_path, said) -> None:
    """`plot --predicted-vs-measured` printed "server 10,000×" with no word that the predictions are for placeholder
    resources; the plot said it. The terminal now says it too (stderr: stdout stays the table and the path)."""
    from adaptplan.cli import main
    from trainers.run.plotting import resources_note

    run = history([0.1, 0.2], config={"algorithm": "psl", "system_path": system_path}, measured=True)
    run.save(tmp_path)
    assert main(["plot", "--predicted-vs-measured", str(tmp_path), "-o", str(tmp_path / "pvm.png")]) == 0
    out, err = capsys.readouterr()
    assert "10,000×" in out and out.splitlines()[-1] == str(tmp_path / "pvm.png")
    note = resources_note(run)
    if said:
        assert note is not None and err == f"note: the ratios are {note}\n"
        assert "placeholder resources" in err and "--system" in err
    else:
        assert note is None and err == ""
