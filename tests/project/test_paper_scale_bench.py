"""benchmarks/paper_scale.py's stand-in data: the subset tiled to the paper's size, labels spread over its classes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "paper_scale.py"
spec = importlib.util.spec_from_file_location("paper_scale", SCRIPT)
paper_scale = importlib.util.module_from_spec(spec)
spec.loader.exec_module(paper_scale)


def test_tiling_repeats_the_samples_and_shifts_each_copys_labels_by_ten() -> None:
    x = torch.arange(3 * 2 * 2, dtype=torch.float32).reshape(3, 1, 2, 2)
    y = torch.tensor([0, 4, 9])
    xt, yt = paper_scale.tile(x, y, 8, 100)
    assert xt.shape == (8, 1, 2, 2)
    for i in range(8):
        assert torch.equal(xt[i], x[i % 3])
    # copy k (of 3 samples) has labels y + 10k
    assert yt.tolist() == [0, 4, 9, 10, 14, 19, 20, 24]


def test_ten_copies_of_ten_classes_fill_a_hundred_and_wrap_modulo_the_classes() -> None:
    y = torch.arange(10)
    _, yt = paper_scale.tile(torch.zeros(10, 1), y, 100, 100)
    assert sorted(yt.tolist()) == list(range(100))
    _, yt = paper_scale.tile(torch.zeros(10, 1), y, 30, 10)        # CIFAR-10: the labels stay the subset's
    assert yt.tolist() == list(range(10)) * 3
