"""``training_batches`` (trainers.inputs.minibatches, ``adaptplan.training_batches``): real mini-batches of a
built-in data set, read by the run's own loader, for estimating the training constants."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from adaptplan.errors import InputError
from trainers.inputs.datasets import load_dataset
from trainers.inputs.minibatches import training_batches


def test_batches_are_rows_of_the_training_split_as_train_normalises_them() -> None:
    batches = training_batches("cifar10-subset", batch_size=4, num_batches=3, seed=0)
    data = load_dataset("cifar10-subset")
    assert len(batches) == 3
    rows = {row.numpy().tobytes(): int(label) for row, label in zip(data.x_train, data.y_train)}
    for x, y in batches:
        assert x.shape == (4, 3, 32, 32) and x.dtype == torch.float32 and y.shape == (4,) and y.dtype == torch.int64
        assert [rows[row.numpy().tobytes()] for row in x] == y.tolist()    # real samples with their own labels


def test_the_same_seed_gives_the_same_batches_and_no_sample_twice() -> None:
    first, again = (training_batches("synthetic", batch_size=50, num_batches=40, seed=3) for _ in range(2))
    other = training_batches("synthetic", batch_size=50, num_batches=40, seed=4)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(first, again))
    assert not torch.equal(first[0][0], other[0][0])
    seen = {row.numpy().tobytes() for x, _ in first for row in x}
    assert len(seen) == 2000                                # 40 × 50 = the whole split, each sample once


def test_they_feed_estimate_constants() -> None:
    from torch import nn

    from profilers import estimate_constants

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))
    constants = estimate_constants(model, training_batches("synthetic", batch_size=16, num_batches=4), gamma=0.01)
    assert len(constants.sigma2) == 2 and constants.theta > 0 and constants.beta > 0


@pytest.mark.parametrize(("kwargs", "field", "text"), [
    ({"dataset": "cifar-10"}, "dataset", "unknown value 'cifar-10'; valid: cifar10-subset"),
    ({"dataset": "synthetic", "batch_size": 0}, "batch_size", "must be an integer ≥ 1"),
    ({"dataset": "synthetic", "num_batches": 2.5}, "num_batches", "must be an integer ≥ 1"),
    ({"dataset": "synthetic", "seed": -1}, "seed", "must be an integer in 0.."),
    ({"dataset": "synthetic", "batch_size": 300, "num_batches": 8}, "num_batches",
     "8 batches of 300 samples need 2,400 samples but the training split of synthetic has 2,000: ask for at most 6"),
])
def test_bad_arguments_are_one_message_naming_the_argument(kwargs, field, text) -> None:
    with pytest.raises(InputError) as caught:
        training_batches(**kwargs)
    assert caught.value.field == field and text in caught.value.message


def test_adaptplan_exports_it_without_loading_torch_on_import() -> None:
    code = ("import sys, adaptplan; assert 'torch' not in sys.modules; "
            "from trainers.inputs.minibatches import training_batches as f; assert adaptplan.training_batches is f")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
