"""Ordering claims (issue 69 item 3: "orderings as orderings"): a paper's ranking of several methods by final
accuracy, judged per seed by Kendall's τ written out here by hand, "holds" only for the claimed order in every seed."""

from __future__ import annotations

from importlib import resources

import pytest

from adaptplan.benches import papers as bp
from adaptplan.benches.recipes import parse
from adaptplan.benches.runs import RunResult
from adaptplan.errors import InputError

ORDER = ("a", "b", "c")
CLAIM = bp.Claim("x", "a > b > c", "a", "c", "ordering", order=ORDER)


def test_kendall_tau_written_out() -> None:
    assert bp.kendall_tau(ORDER, {"a": 0.9, "b": 0.8, "c": 0.7}) == 1.0
    assert bp.kendall_tau(ORDER, {"a": 0.7, "b": 0.8, "c": 0.9}) == -1.0
    # one adjacent swap of three: pairs (a,b) +1, (a,c) +1, (b,c) −1 → 1/3
    assert bp.kendall_tau(ORDER, {"a": 0.9, "b": 0.7, "c": 0.8}) == pytest.approx(1 / 3)
    # a tie is neither: (a,b) 0, (a,c) +1, (b,c) +1 → 2/3
    assert bp.kendall_tau(ORDER, {"a": 0.8, "b": 0.8, "c": 0.1}) == pytest.approx(2 / 3)
    four = ("w", "x", "y", "z")         # 6 pairs, the last two swapped: 5 − 1 = 4 → 2/3
    assert bp.kendall_tau(four, {"w": 4, "x": 3, "y": 1, "z": 2}) == pytest.approx(4 / 6)


def run(final: float | None) -> RunResult:
    return RunResult("g", "l", 10, final, 1.0, 1.0, None, None, None, None, None, [(1.0, final or 0.0)])


def seeds(*finals: tuple[float, float, float]) -> dict[str, list[RunResult]]:
    return {m: [run(f[i]) for f in finals] for i, m in enumerate(ORDER)}


def test_an_ordering_holds_only_as_the_claimed_order_in_every_seed() -> None:
    c = bp.compare_ordering(CLAIM, seeds((0.9, 0.8, 0.7), (0.6, 0.5, 0.4)), [0, 1])
    assert c.values == [1.0, 1.0] and c.verdict == "holds" and c.signs == [1, 1]
    assert c.measured == "τ +1.00; the claimed order in 2/2 seeds" and c.orders == ["a > b > c", "a > b > c"]
    one_swap = bp.compare_ordering(CLAIM, seeds((0.9, 0.8, 0.7), (0.9, 0.7, 0.8)), [0, 1])
    assert one_swap.values == pytest.approx([1.0, 1 / 3]) and one_swap.verdict == "within noise"
    assert one_swap.spread == "τ +0.33..+1.00; seed 0: a > b > c" and one_swap.orders[1] == "a > c > b"
    reversed_ = bp.compare_ordering(CLAIM, seeds((0.7, 0.8, 0.9), (0.9, 0.7, 0.8)), [0, 1])
    assert reversed_.mean == pytest.approx((-1 + 1 / 3) / 2) and reversed_.verdict == "does not hold at this scale"
    missing = bp.compare_ordering(CLAIM, {"a": [run(None)], "b": [run(0.5)], "c": [run(0.4)]}, [0])
    assert missing.values == [None] and missing.mean is None and missing.measured.startswith("-")
    assert missing.to_json()["per_seed"][0]["measured_order"] == "b > c > a"


def _recipe_text() -> str:
    return resources.files("adaptplan.benches.recipes").joinpath("gas.toml").read_text(encoding="utf-8")


def test_the_recipes_state_the_papers_orderings() -> None:
    gas = parse(_recipe_text(), "gas.toml")
    (claim,) = [c for c in gas.claims if c.metric == "ordering"]
    assert claim.order == ("gas", "ca2fl", "fedbuff", "fedavg") and (claim.a, claim.b) == ("gas", "fedavg")
    scala = parse(resources.files("adaptplan.benches.recipes").joinpath("scala.toml").read_text(encoding="utf-8"),
                  "scala.toml")
    orders = {c.partition: c.order for c in scala.claims if c.metric == "ordering"}
    assert orders == {"quantity α=2": ("scala", "fedlc", "minibatch-sfl", "fedprox", "fedavg", "sfl-v2", "sfl-v1"),
                      "dirichlet β=0.05": ("scala", "minibatch-sfl", "fedlc", "fedprox", "fedavg")}


@pytest.mark.parametrize("edit, message", [
    ('order = ["gas", "ca2fl", "fedbuff", "fedavg"]', "order: an ordering claim lists its methods, best first"),
    ('order = ["gas", "fedbuff"]', "order: must list at least three distinct methods, best first"),
    ('order = ["gas", "gas", "fedavg"]', "order: must list at least three distinct methods, best first"),
    ('order = ["gas", "fedbuff", "fedconcat"]', "order: 'fedconcat' is not a method"),
    ('order = ["gas", "ca2fl", "fedbuff", "fedavg"]\na = "gas"', "an ordering claim's A and B are its order's first and last"),
    ('order = ["gas", "ca2fl", "fedbuff", "fedavg"]\nmargin = 3.0', "margin: an ordering claim states a ranking: it has no figure"),
])
def test_a_malformed_ordering_claim_is_refused_naming_its_key(edit: str, message: str) -> None:
    text = _recipe_text()
    replaced = text.replace('order = ["gas", "ca2fl", "fedbuff", "fedavg"]', "" if "lists its" in message else edit)
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse(replaced, "gas.toml")


def test_an_order_belongs_to_an_ordering_claim_only() -> None:
    text = _recipe_text().replace('metric = "accuracy"', 'metric = "accuracy"\norder = ["gas", "ca2fl", "fedbuff", "fedavg"]', 1)
    with pytest.raises(InputError, match='only an ordering claim'):
        parse(text, "gas.toml")
