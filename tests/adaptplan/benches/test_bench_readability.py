"""The benches' figures and tables, readable at any length (issue 65 items 3 and 5): the accuracy figures show
chance (1/M) inside their y-range and keep their legends off the data; `bench papers`' figure is a grid of panels
(at most 3 a row), each with its own axes; and a table cell that reads "-" says why, once, under the table — from
hand-made run results, no training."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from adaptplan.benches import algorithms as bench_algorithms
from adaptplan.benches import papers as bp
from adaptplan.benches import runs as bench_runs
from adaptplan.benches import training as bench_training
from adaptplan.benches.comparison import Setting
from adaptplan.benches.recipes import DEFAULT_NAMES
from adaptplan.benches.runs import RunResult
from adaptplan.report import Empty, empty_notes, format_table
from tests.plot_checks import drawn, spy_figures
from trainers.run.plotting import CHANCE_GID


def result(group, label, curve=(), classes: int | None = 10, **kw) -> RunResult:
    curve = list(curve)
    fields = dict(rounds=10, final_accuracy=curve[-1][1] if curve else None, sim_seconds=curve[-1][0] if curve else 1.0,
                  wall_seconds=1.0, time_to_target_s=None, rounds_to_target=None, converged_round=None,
                  converged_time_s=None, converged_accuracy=None, curve=curve, local_curve=curve,
                  final_local_accuracy=curve[-1][1] if curve else None, num_classes=classes,
                  local_sampled_curve=curve, final_local_sampled_accuracy=curve[-1][1] if curve else None)
    fields.update(kw)
    return RunResult(group, label, **fields)






def chance(ax) -> list[float]:
    return [line.get_ydata()[0] for line in ax.get_lines() if line.get_gid() == CHANCE_GID]


def assert_legends_hide_nothing(fig) -> None:
    """No legend of ``fig`` (a panel's or the figure's) overlaps the data area of any panel, and each lies in the
    figure."""
    renderer = drawn(fig)
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]
    assert legends
    for legend in legends:
        box = legend.get_window_extent(renderer)
        assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1 and fig.bbox.y0 <= box.y0 and box.y1 <= fig.bbox.y1
        for ax in fig.axes:
            assert not box.overlaps(ax.get_window_extent(renderer)), (legend, ax.get_title())


def grid_shape(fig) -> tuple[int, int]:
    """(rows, columns) of the panels of ``fig`` by their positions."""
    lefts = {round(ax.get_position().x0, 3) for ax in fig.axes}
    bottoms = {round(ax.get_position().y0, 3) for ax in fig.axes}
    return len(bottoms), len(lefts)


# ---- bench algorithms / training: the accuracy figure ---------------------------------------------------------------

def test_the_runs_figure_shows_chance_in_every_panel_and_one_legend_below_them(tmp_path, monkeypatch) -> None:
    near = [(1.0, 0.085), (2.0, 0.108), (3.0, 0.115)]       # runs at chance, as the tour's 10 rounds leave them
    results = [result("iid", "sl", near), result("iid", "adaptsfl", [(0.5, 0.1), (1.0, 0.12)]),
               result("shards-2", "sl", [(10.0, 0.3), (40.0, 0.5)]), result("shards-2", "adaptsfl", [(5.0, 0.2)]),
               result("dirichlet-0.1", "adaptsfl", [(2.0, 0.011)], classes=100),
               result("dirichlet-0.1", "sl", [(3.0, 0.02)], classes=100), result("none", "sl", [])]
    figures = spy_figures(monkeypatch)
    bench_runs.plot(results, tmp_path / "a.png")
    (fig,) = figures
    iid, shards, dirichlet, none = fig.axes
    assert grid_shape(fig) == (2, 3)                                  # four panels: rows of at most three
    assert chance(iid) == [pytest.approx(0.1)] and chance(dirichlet) == [pytest.approx(0.01)]
    for ax in (iid, shards, dirichlet, none):
        bottom, top = ax.get_ylim()
        points = [y for line in ax.get_lines() if line.get_gid() != CHANCE_GID for y in line.get_ydata()]
        assert bottom == 0 and all(bottom < c < top for c in chance(ax)) and all(y < top for y in points)
    assert iid.get_ylim()[1] == pytest.approx(0.15) and shards.get_ylim()[1] == pytest.approx(0.55)
    assert "no evaluation" in none.texts[0].get_text() and chance(none) == [pytest.approx(0.1)]
    # every panel its own x-axis: the iid runs' 3 s are not squeezed onto shards' 40 s
    assert iid.get_xlim()[1] < 4 and shards.get_xlim()[1] > 39
    assert all(ax.get_shared_x_axes().get_siblings(ax) == [ax] for ax in fig.axes)
    # one colour per label in every panel, one legend entry per label and per chance level
    colours = {(line.get_label(), line.get_color()) for ax in fig.axes for line in ax.get_lines()
               if line.get_gid() != CHANCE_GID}
    assert len(colours) == 2
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["sl", "adaptsfl", "chance: 1/10 = 10 %",
                                                         "chance: 1/100 = 1 %"]
    assert_legends_hide_nothing(fig)


# ---- bench papers: the full tier's figure -------------------------------------------------------------------------

def paper_results(todo, slow_groups: dict[str, float]) -> list[RunResult]:
    """Curves for every job: each panel's first method fast, the others ``slow_groups[paper]`` times longer."""
    out = []
    for j in todo:
        first = next(k for k in todo if k["group"] == j["group"])["label"] == j["label"]
        paper = j["group"].split("/")[0]
        span = 10.0 * (1.0 if first else slow_groups.get(paper, 1.2)) * (1 + list(bp.PAPERS).index(paper))
        curve = [(span * k / 6, 0.1 + 0.05 * k) for k in range(1, 7)]
        out.append(result(j["group"], j["label"], curve))
    return out


def test_the_papers_figure_is_a_grid_of_readable_panels_each_with_its_own_axes(tmp_path, monkeypatch) -> None:
    """The full tier's figure was one 3,500 × 400 strip of 7 panels, each method squeezed on the slowest one's
    axis. Now: rows of at most 3 panels of readable size, each its own x- and y-range, time on a log axis where
    the methods' lengths differ 5-fold or more, chance and the target drawn, the legends beside the panels."""
    import matplotlib.pyplot as plt

    book = bp.catalogue(DEFAULT_NAMES, "test")
    todo = bp.jobs(book, [0])
    results = paper_results(todo, {"gapsl": 10.0, "adaptsfl": 8.0})
    figures = spy_figures(monkeypatch)
    bp.plot(todo, results, book, tmp_path / "accuracy.png")
    (fig,) = figures
    groups = list(dict.fromkeys(j["group"] for j in todo))
    assert len(fig.axes) == len(groups) == 7 and grid_shape(fig) == (3, 3)
    width, height = fig.get_size_inches()
    assert width <= 20 and height / width > 0.5                     # a grid, not a strip
    renderer = drawn(fig)
    for ax, group in zip(fig.axes, groups):
        box = ax.get_window_extent(renderer)
        assert box.width / fig.dpi >= 3.5 and box.height / fig.dpi >= 2.5  # each panel readable
        assert ax.get_shared_x_axes().get_siblings(ax) == [ax]           # nothing shared
        xs = [x for r, j in zip(results, todo) if j["group"] == group for x, _ in r.curve]
        low, high = ax.get_xlim()
        assert low <= min(xs) and max(xs) <= high <= 1.5 * max(xs)      # its own data's range, not another panel's
        spread = max(r.curve[-1][0] for r, j in zip(results, todo) if j["group"] == group) / min(
            r.curve[-1][0] for r, j in zip(results, todo) if j["group"] == group)
        assert ax.get_xscale() == ("log" if spread >= bp.LOG_TIME_SPAN else "linear")
        assert ("log scale" in ax.get_xlabel()) == (spread >= bp.LOG_TIME_SPAN)
        assert chance(ax) == [pytest.approx(0.1)] and ax.get_ylim()[0] == 0.0 and ax.get_ylim()[1] >= 0.42
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert labels[-1] == "chance: 1/10 = 10 %"
        timed = any(c.metric == "time" for c in book[group.split("/")[0]].claims)
        assert ("target 30%" in labels) == timed
    assert [ax.get_xscale() for ax in fig.axes].count("log") == 3         # gapsl, adaptsfl iid and shards
    assert_legends_hide_nothing(fig)
    image = plt.imread(tmp_path / "accuracy.png")
    assert 1000 <= image.shape[1] <= 2000 and image.shape[0] >= 900


# ---- tables: every dash says why -----------------------------------------------------------------------------------

NOTE = re.compile(r"^\s*- \((.+?)\): (.+)$")


def dashes_and_notes(text: str) -> tuple[int, list[str]]:
    """(cells reading "-" in the table's rows, the note lines under it)."""
    notes = [line for line in text.splitlines() if NOTE.match(line)]
    rows = [line for line in text.splitlines() if line not in notes and not set(line.strip()) <= {"-", " "}]
    cells = sum(len(re.findall(r"(?<=\s)-(?=\s|$|;)", line)) for line in rows)
    return cells, notes


def test_format_table_says_why_a_cell_is_empty_exactly_when_one_is() -> None:
    full = format_table(["run", "s to target"], [["a", "2.5"], ["b", "3"]])
    assert dashes_and_notes(full) == (0, [])
    missed = Empty("target 30% not reached within 10 rounds")
    text = format_table(["run", "s to target", "conv. s"], [["a", missed, Empty("not converged")], ["b", "3", missed]])
    assert text.splitlines() == ["run  s to target  conv. s",
                                 "---  -----------  -------",
                                 "a              -        -",
                                 "b              3        -",
                                 "- (s to target, conv. s): target 30% not reached within 10 rounds",
                                 "- (conv. s): not converged"]
    assert missed == "-" and f"{missed:>3}" == "  -" and missed.why.startswith("target")   # reads as its text
    assert empty_notes(["a"], [["-"]]) == []                 # a plain "-" carries no reason: nothing invented


SETTING = Setting("sgd", 0.01, 0.01, 0.9, 0.0, 0.0, 16, 1.0, 1, 10)


@pytest.mark.parametrize("reached", [True, False])
def test_bench_tables_at_few_rounds_say_why_their_cells_are_empty(reached) -> None:
    """At 10 rounds nothing reaches 30 %: the tables of `bench algorithms` and `bench training` were dashes. A note
    under each says why, and only where a dash is."""
    t = 2.0 if reached else None
    kw = dict(time_to_target_s=t, rounds_to_target=5 if reached else None,
              converged_round=8 if reached else None, converged_time_s=3.0 if reached else None,
              converged_accuracy=0.4 if reached else None)
    results = [result("iid", "adaptsfl", [(1.0, 0.2), (2.0, 0.35), (3.0, 0.4)], **kw),
               result("iid", "sl", [(1.0, 0.2), (2.0, 0.35), (3.0, 0.4)], **kw)]
    for text in (bench_algorithms.table(results, 0.3, SETTING), bench_training.table(results, 0.3, setting=SETTING),
                 bench_training.sweep_table([replace(r, group="noise-cv=0") for r in results],
                                            "noise-cv")):
        cells, notes = dashes_and_notes(text)
        assert bool(cells) == bool(notes) == (not reached), text
        if not reached:
            assert any(n.endswith("target 30% not reached within 10 rounds") or "target not reached" in n
                       for n in notes), text
    text = bench_training.table(results, 0.3, setting=SETTING)
    if not reached:
        assert text.splitlines()[-2:] == [
            "- (rounds→target, s→target, × AdaptSFL): target 30% not reached within 10 rounds",
            "- (conv. round, conv. s, conv. acc): not converged within 10 rounds (gain < 0.02 over 5 evaluations, "
            "counted only above twice chance)"]


def test_the_algorithms_table_says_why_a_run_has_no_accuracy_at_the_budget() -> None:
    late = result("iid", "sl", [(1.77, 0.13)], time_to_target_s=None)
    early = result("iid", "adaptsfl", [(0.46, 0.124)], time_to_target_s=None)
    text = bench_algorithms.table([late, early], 0.3, SETTING)
    assert "- (acc@budget): no evaluation by the equal budget (the run's first came later)" in text.splitlines()
    assert "- (s to target): target 30% not reached within 10 rounds" in text.splitlines()


def test_the_papers_tables_say_why_a_claim_or_a_run_has_no_figure() -> None:
    """At the test tier's 4 rounds no run reaches 30 %: the time claims' measured and spread read "-", and say why
    under their paper's claims; the accuracy claims have figures and no note."""
    book = bp.catalogue(bp.PAPERS, "test")
    todo = bp.jobs(book, [0])
    results = [result(j["group"], j["label"], [(1.0, 0.1), (2.0, 0.12)]) for j in todo]
    found = bp.comparisons(todo, results, book)
    text = bp.table(found, book, todo, results)
    blocks = {block.splitlines()[0].split(" — ")[0]: block for block in text.split("\n\n")[1:6]}
    why = "  - (measured (mean), spread over seeds): no seed where both A and B reached the target"
    for title, block in blocks.items():
        timed = title.startswith(("GAS", "AdaptSFL"))
        cells, notes = dashes_and_notes(block.replace("too few evaluations", ""))
        assert (why in block.splitlines()) == timed and bool(notes) == timed == bool(cells), block
    # a run without a local held-out split: its "-" under local says why
    local_less = [replace(r, final_local_accuracy=None, local_curve=[]) for r in results]
    table = bp.run_table(todo, local_less)
    assert table.splitlines()[-1] == "  - (local): no local held-out samples in the run (--local-test-fraction 0)"
    assert not any(NOTE.match(line) for line in bp.run_table(todo, results).splitlines())
