#!/usr/bin/env python3
"""Hostile recipe files (issue 67 item 5): every value of each shipped recipe (adaptplan/benches/recipes/*.toml)
replaced by each of 12 hostile values, or deleted; each edited recipe is parsed and used as ``bench papers`` uses
it (its target, every method's rounds, every job's TrainConfig, the paper-scale recipe). Prints the counts:
cases, clean (one InputError), accepted (the edit is a valid recipe), internal (any other exception) with the
kinds of internal error; ``--accepted`` lists which keys took which values.

    python tools/hostile_recipes.py [--accepted]
"""

from __future__ import annotations

import collections
import math
import sys
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hostile_edits import DELETE, edited, paths  # noqa: E402

import adaptplan.benches.recipes as recipes  # noqa: E402
from adaptplan.errors import InputError  # noqa: E402
from trainers.config.train_config import TrainConfig  # noqa: E402

HOSTILE: list[Any] = [DELETE, True, -1, 0, 10 ** 30, "x", [], {}, math.nan, math.inf, 1.5, [1, 2], {"value": {}}]


def use(document: dict) -> None:
    """Parse ``document`` as a recipe (the TOML step given its result) and use it as bench papers does."""
    real = recipes.tomllib.loads
    recipes.tomllib.loads = lambda text: document
    try:
        recipe = recipes.parse("", "hostile.toml")
    finally:
        recipes.tomllib.loads = real
    _ = recipe.target_accuracy
    for method in recipe.methods:
        recipe.method_rounds(method)
    for job in recipe.jobs([0]):
        TrainConfig.flat(**job["config"])
    if recipe.paper_scale:
        recipe.at_paper_scale("/nonexistent").jobs([0])


def main() -> None:
    counts: collections.Counter = collections.Counter()
    internal: collections.Counter = collections.Counter()
    accepted: collections.Counter = collections.Counter()
    for name in recipes.NAMES:
        document = tomllib.loads(resources.files(recipes).joinpath(f"{name}.toml").read_text(encoding="utf-8"))
        for path in sorted(set(paths(document)), key=str):
            for value in HOSTILE:
                counts["cases"] += 1
                try:
                    use(edited(document, path, value))
                    counts["accepted"] += 1
                    key = path[-2] if path[-1] == "value" and len(path) > 1 else path[-1]
                    accepted[(str(key), "delete" if value is DELETE else repr(value)[:16])] += 1
                except InputError:
                    counts["clean"] += 1
                except Exception as exc:  # noqa: BLE001 - what this harness counts
                    counts["internal"] += 1
                    internal[f"{type(exc).__name__}: {str(exc)[:70]}"] += 1
    print(f"cases {counts['cases']}, clean {counts['clean']}, accepted {counts['accepted']}, "
          f"internal {counts['internal']}")
    for kind, n in internal.most_common():
        print(f"  {n:5d}  {kind}")
    if "--accepted" in sys.argv:
        for (key, value), n in sorted(accepted.items()):
            print(f"  accepted {key} = {value} ({n})")


if __name__ == "__main__":
    main()
