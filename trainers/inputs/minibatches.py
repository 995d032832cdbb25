"""Real mini-batches of a built-in data set, for :func:`profilers.estimate_constants` (docs/api.md "Plan for your
own model"): the constants β, σ_j², G_j² and ϑ describe the model *on its training data*, so they must be
measured on that data's samples, not on random tensors.

The data set is read by the run's own loader (:func:`trainers.inputs.datasets.load_dataset`: the same files, the
same per-channel normalisation as ``train`` uses), and the batches are drawn from its training split the way
``adaptplan profile --grad-stats`` draws them (:func:`profilers.gradstats.iterate_batches`: without replacement,
fixed seed).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from adaptplan.errors import InputError
from adaptplan.fileio import int_in_range, positive_int
from adaptplan.limits import MAX_BATCH_SIZE, MAX_SEED
from trainers.algorithms import check_choice
from trainers.config.train_config import DATASETS

if TYPE_CHECKING:  # pragma: no cover
    import torch

MAX_BATCHES = 10_000
"""Most mini-batches one call draws (the estimator uses 8 by default)."""


def training_batches(dataset: str, batch_size: int = 16, num_batches: int = 8, seed: int = 0,
                     data_root: str | os.PathLike | None = None,
                     download: bool = False) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``num_batches`` mini-batches ``(x, y)`` of ``batch_size`` samples from the training split of ``dataset``.

    Args:
        dataset: a built-in data set name (``"cifar10-subset"``, ``"mnist-subset"``, ``"synthetic"``, ...; the
            ``dataset`` option of ``TrainConfig``).
        batch_size: samples per mini-batch (use the b you will train with; default 16).
        num_batches: how many mini-batches (``estimate_constants`` uses the first 8 by default; ≥ 2 for a variance).
        seed: which samples: the same seed gives the same batches; no sample appears in two batches.
        data_root, download: where the data set's files are, and whether torchvision may fetch them (as
            ``TrainConfig``'s ``data_root`` and ``download``).

    Returns:
        A list of ``(x, y)``: ``x`` float32 of shape (batch_size, C, H, W), normalised per channel as training sees
        it; ``y`` int64 class indices of shape (batch_size,).

    Raises:
        InputError: naming ``dataset`` (unknown name, valid ones listed), ``batch_size``, ``num_batches`` or
            ``seed`` (not a positive integer, or more samples asked than the training split holds), or
            ``--data-root`` (missing or damaged files, how to get them).
    """
    check_choice(dataset, DATASETS, "dataset")
    batch_size = positive_int(batch_size, "batch_size", MAX_BATCH_SIZE, "samples")
    num_batches = positive_int(num_batches, "num_batches", MAX_BATCHES, "batches")
    seed = int_in_range(seed, "seed", 0, MAX_SEED)
    from profilers.gradstats import iterate_batches
    from trainers.inputs.datasets import load_dataset

    data = load_dataset(dataset, data_root, download)
    available = len(data.x_train)
    if batch_size * num_batches > available:
        raise InputError(f"{num_batches} batches of {batch_size} samples need {batch_size * num_batches:,} samples but "
                         f"the training split of {dataset} has {available:,}: ask for at most "
                         f"{available // batch_size:,} batches of {batch_size}", field="num_batches")
    return list(iterate_batches(data.x_train, data.y_train, batch_size, num_batches, seed=seed))
