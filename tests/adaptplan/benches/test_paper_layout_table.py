"""`bench papers` prints each paper's table as the paper lays it out (issue 69 item 2): methods × partitions, each
cell the final accuracy by the recipe's protocol, mean ± sample standard deviation over the seeds."""

from __future__ import annotations

import statistics

from adaptplan.benches import papers as bp
from adaptplan.benches.runs import RunResult


def _result(job, accuracy: float | None, local: float | None = None) -> RunResult:
    return RunResult(job["group"], job["label"], 10, accuracy, 1.0, 1.0, None, None, None, None, None,
                     [] if accuracy is None else [(1.0, accuracy)], final_local_accuracy=local)


def test_cells_are_the_mean_and_sample_deviation_of_the_seeds() -> None:
    book = bp.catalogue(["gas-fmnist"], tier="hour")
    recipe = book["gas-fmnist"]
    todo = bp.jobs(book, [0, 1, 2])
    finals = {("gas", "s=2"): [0.90, 0.88, 0.92]}
    results = []
    for j in todo:
        key = (j["label"], j["group"].split("/", 1)[1])
        value = finals[key][j["seed"]] if key in finals else (None if j["label"] == "fedbuff" else 0.5)
        results.append(_result(j, value))
    lines = bp.layout_table(recipe, todo, results)
    assert "final accuracy (global, %)" in lines[0]
    header, rows = lines[1].split(), {line.split()[0]: line for line in lines[3:]}
    assert header == ["method", "s=2", "dirichlet", "α=0.1"] and list(rows) == ["gas", "ca2fl", "fedbuff", "fedavg"]
    gas = [90.0, 88.0, 92.0]
    assert f"{statistics.fmean(gas):.1f} ± {statistics.stdev(gas):.1f}" == "90.0 ± 2.0"
    assert rows["gas"].split()[1:4] == ["90.0", "±", "2.0"]
    assert rows["fedbuff"].split()[1:] == ["-", "-"]                    # no seed has a final accuracy
    assert rows["ca2fl"].split()[1:] == ["50.0", "±", "0.0", "50.0", "±", "0.0"]
    one_seed = [j for j in todo if j["seed"] == 0]
    single = bp.layout_table(recipe, one_seed, [_result(j, 0.25) for j in one_seed])
    assert single[3].split() == ["gas", "25.0", "25.0"]                 # the mean alone with one seed


def test_the_layout_follows_the_recipes_protocol_and_sits_under_its_claims() -> None:
    book = bp.catalogue(["cyclesl"], tier="test")
    recipe = book["cyclesl"]
    todo = bp.jobs(book, [0, 1])
    results = [_result(j, 0.1, 0.3) for j in todo]
    lines = bp.layout_table(recipe, todo, results)
    assert "local-sampled" in lines[0] and all("-" in line.split()[1:] for line in lines[3:])   # none sampled
    text = bp.table(bp.comparisons(todo, results, book), book, todo, results)
    assert "as the paper lays it out" in text and text.index("as the paper lays it out") < text.index("Final accuracy per run")
