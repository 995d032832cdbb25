"""Claims that a baseline does not converge (issue 69 item 3), judged by the paper's convergence criterion written
out: the first evaluation after which the accuracy gained less than 2 points for 5 evaluations in a row, evaluations
below twice chance not counting (trainers.run.history.first_converged), per seed +1 / −1 / 0 and the verdict rule."""

from __future__ import annotations

import dataclasses

import pytest

from adaptplan.benches import papers as bp
from adaptplan.benches.recipes import parse
from adaptplan.benches.runs import RunResult
from adaptplan.errors import InputError
from trainers.run.history import chance_floor, first_converged

CONV = bp.Claim("x", "B does not converge where A does", "a", "b", "convergence")
FLAT = [0.10, 0.30, 0.31, 0.32, 0.33, 0.335, 0.34]              # gains 1, 1, 1, 0.5, 0.5 points from index 2
RISING = [0.10 + 0.03 * k for k in range(12)]                     # +3 points at every evaluation
CHANCE = [0.10, 0.11, 0.10, 0.105, 0.10, 0.11, 0.10, 0.10]        # flat, but at chance (M = 10: floor 0.2)


def test_first_converged_written_out() -> None:
    assert first_converged(FLAT, 0.2) == 6                            # five small gains: indices 2..6
    assert first_converged(FLAT[:6], 0.2) is None                     # only four
    assert first_converged(RISING, 0.2) is None
    assert first_converged(CHANCE, chance_floor(10)) is None and first_converged(CHANCE, 0.0) == 5
    assert chance_floor(10) == 0.2 and chance_floor(None) == 0.0
    # a fall is a gain below 2 points; a +2-point step (not below) restarts the streak
    assert first_converged([0.5, 0.4, 0.3, 0.3, 0.3, 0.3], 0.2) == 5
    assert first_converged([0.3, 0.31, 0.32, 0.34, 0.35, 0.36, 0.37, 0.38, 0.39], 0.2) == 8


def run(accuracies: list[float], diverged: int | None = None, classes: int | None = 10) -> RunResult:
    curve = [(float(k + 1), a) for k, a in enumerate(accuracies)]
    return RunResult("g", "l", len(curve), accuracies[-1] if accuracies else None, float(len(curve)), 1.0, None,
                     None, None, None, None, curve, diverged, num_classes=classes)


def test_a_run_converges_by_the_criterion_unless_it_diverged() -> None:
    assert run(FLAT).converged() is True and run(RISING).converged() is False and run(CHANCE).converged() is False
    assert run(CHANCE, classes=None).converged() is True          # no class count: no chance floor
    assert run(FLAT, diverged=8).converged() is False
    assert run([]).converged() is None
    local = dataclasses.replace(run(RISING), local_curve=[(float(k + 1), a) for k, a in enumerate(FLAT)])
    assert local.converged("local") is True and local.converged("global") is False


def test_a_convergence_claim_holds_only_when_b_fails_in_every_seed_and_a_converges() -> None:
    c = bp.compare(CONV, [run(FLAT)] * 3, [run(RISING), run(CHANCE), run(FLAT, diverged=4)], [0, 1, 2], 0.3)
    assert c.values == [1.0, 1.0, 1.0] and c.verdict == "holds"
    assert c.measured == "b did not converge in 3/3 seeds, a converged in 3/3"
    assert c.spread == "b final 10.0..43.0 %"
    mixed = bp.compare(CONV, [run(FLAT)] * 3, [run(RISING), run(RISING), run(FLAT)], [0, 1, 2], 0.3)
    assert mixed.values == [1.0, 1.0, -1.0] and mixed.verdict == "within noise"
    assert mixed.measured == "b did not converge in 2/3 seeds, a converged in 3/3"
    neither = bp.compare(CONV, [run(RISING)] * 2, [run(RISING)] * 2, [0, 1], 0.3)
    assert neither.values == [0.0, 0.0] and neither.verdict == "does not hold at this scale"
    converged = bp.compare(CONV, [run(FLAT)] * 2, [run(FLAT)] * 2, [0, 1], 0.3)
    assert converged.values == [-1.0, -1.0] and converged.verdict == "does not hold at this scale"
    row = converged.to_json()
    assert row["units"].startswith("per seed +1 (A converged, B did not)") and row["against_paper"] is None
    assert bp.metric_name(converged, 0.3) == "convergence (global): A yes, B no"


def test_a_recipe_takes_a_convergence_claim_without_a_figure() -> None:
    from importlib import resources

    text = resources.files("adaptplan.benches.recipes").joinpath("scala.toml").read_text(encoding="utf-8")
    recipe = parse(text, "scala.toml")
    found = [c for c in recipe.claims if c.metric == "convergence"]
    assert {(c.a, c.b, c.partition) for c in found} == {("scala", "sfl-v1", "dirichlet β=0.05"),
                                                        ("scala", "sfl-v2", "dirichlet β=0.05")}
    assert all(c.margin is None for c in found)
    broken = text.replace('metric = "convergence"', 'metric = "convergence"\nmargin = 20.0', 1)
    with pytest.raises(InputError, match="a convergence claim states that B does not converge: it has no figure"):
        parse(broken, "scala.toml")
