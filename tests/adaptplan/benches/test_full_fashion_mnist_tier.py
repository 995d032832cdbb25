"""`bench papers --full-fashion-mnist` (issue 70 item 6): every recipe on the whole Fashion-MNIST training set over
its devices, nothing else changed — the papers' 500–600 images per device at 100 devices."""

from __future__ import annotations

import numpy as np
import pytest

from adaptplan.benches import papers as bp
from adaptplan.cli import main
from tests.installed_data import needs_fashion_mnist

NAMES = ["gapsl", "scala", "cyclesl"]


def test_each_job_differs_from_the_built_in_scale_only_in_its_data_set() -> None:
    built_in, full = bp.catalogue(NAMES, tier="hour"), bp.catalogue(NAMES, tier="hour", fashion_mnist=True)
    assert list(full) == [f"{n}@fashion-mnist" for n in NAMES]
    for name in NAMES:
        recipe = full[f"{name}@fashion-mnist"]
        assert recipe.sources["dataset"].startswith("rule: the whole Fashion-MNIST training set")
        assert f"here {60000 // int(recipe.run['devices']):,}" in recipe.sources["dataset"]
        a, b = bp.jobs({name: built_in[name]}, [0, 1]), bp.jobs({recipe.key: recipe}, [0, 1])
        assert len(a) == len(b) > 0
        for x, y in zip(a, b):
            assert {k for k in x["config"] if x["config"][k] != y["config"][k]} == {"dataset"}
            assert y["config"]["dataset"] == "fashion-mnist" and y["group"] == x["group"].replace(name, recipe.key, 1)
    assert {c.paper for c in bp.claims(full["scala@fashion-mnist"])} == {"scala@fashion-mnist"}


def test_the_paper_scale_and_the_full_fashion_mnist_are_one_or_the_other(tmp_path, capsys) -> None:
    assert main(["bench", "papers", "--paper", "scala", "--full-fashion-mnist", "--data-root", str(tmp_path),
                 "--tier", "test", "--out", str(tmp_path / "out")]) == 2
    assert "--full-fashion-mnist" in capsys.readouterr().err


@needs_fashion_mnist
def test_at_one_hundred_devices_each_holds_the_papers_600_images() -> None:
    from trainers.inputs.datasets import load_dataset
    from trainers.inputs.partition import partition_indices

    recipe = bp.catalogue(["scala"], fashion_mnist=True)["scala@fashion-mnist"]
    y = load_dataset("fashion-mnist").y_train.numpy()
    for partition in recipe.partitions:
        fields = partition.fields
        parts = partition_indices(y, int(recipe.run["devices"]), fields["partition"], 0,
                                  fields.get("dirichlet_alpha", 0.5), min_size=16)
        sizes = np.array([len(p) for p in parts])
        assert sizes.sum() == 60000 and 590 <= np.median(sizes) <= 610, partition.label
