"""The papers' partitions (issue 70 item 5), each against its definition written out, and the skew measures against
their formulas computed by hand (trainers/inputs/partition.py, trainers/inputs/skew.py)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from adaptplan.cli import main
from adaptplan.errors import InputError
from trainers.inputs.partition import partition_indices
from trainers.inputs.skew import PartitionSkew

LABELS = np.repeat(np.arange(10), 100)          # M = 10 labels of 100 samples each


def _covers_once(parts, n: int) -> None:
    joined = np.concatenate(parts)
    assert joined.size == np.unique(joined).size == n


@pytest.mark.parametrize("alpha", [1, 2, 3])
def test_quantity_deals_k_alpha_over_m_equal_portions_per_label(alpha: int) -> None:
    """SCALA §V-A with K = 20, M = 10: each label cut into K·α/M = 2α portions of 100 / (2α) samples (rounded
    within the label), α portions to each device: at most α labels each, and every sample dealt once."""
    parts = partition_indices(LABELS, 20, "quantity", seed=5, labels_per_device=alpha)
    _covers_once(parts, LABELS.size)
    portion = 100 / (20 * alpha / 10)
    for p in parts:
        counts = np.bincount(LABELS[p], minlength=10)
        assert np.count_nonzero(counts) <= alpha
        held = counts[counts > 0]               # a label dealt twice to one device holds two portions
        assert all(math.floor(portion) * round(c / portion) <= c <= math.ceil(portion) * round(c / portion)
                   for c in held)
        assert sum(round(c / portion) for c in held) == alpha
    assert max(np.count_nonzero(np.bincount(LABELS[p], minlength=10)) for p in parts) == alpha or alpha == 1


def test_quantity_when_m_does_not_divide_k_alpha() -> None:
    """K·α = 7·3 = 21 portions over 10 labels: one label, drawn at random, is cut in 3, the others in 2; a device
    still holds at most α = 3 labels and every sample is dealt once; the seed fixes the draw."""
    parts = partition_indices(LABELS, 7, "quantity", seed=1, labels_per_device=3)
    _covers_once(parts, LABELS.size)
    assert all(np.count_nonzero(np.bincount(LABELS[p], minlength=10)) <= 3 for p in parts)
    pieces = sorted({int(c) for p in parts for c in np.bincount(LABELS[p], minlength=10) if c})
    assert set(pieces) <= {33, 34, 50, 66, 67, 83, 84, 100, 116, 117, 133, 134, 150}   # sums of 33/34 and 50 pieces
    again = partition_indices(LABELS, 7, "quantity", seed=1, labels_per_device=3)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))


def test_k_labels_gives_each_device_k_distinct_labels_split_evenly() -> None:
    """NIID-Bench's #C = k: device i holds label i mod M and k − 1 others; each label's samples are split over its
    holders in sizes that differ by one at most."""
    parts = partition_indices(LABELS, 15, "labels", seed=2, labels_per_device=3)
    held = [set(np.unique(LABELS[p]).tolist()) for p in parts]
    assert all(len(h) == 3 and i % 10 in h for i, h in enumerate(held))
    for c in range(10):
        sizes = [int(np.sum(LABELS[p] == c)) for p, h in zip(parts, held) if c in h]
        assert sum(sizes) == 100 and max(sizes) - min(sizes) <= 1
    every = partition_indices(LABELS, 4, "labels", seed=2, labels_per_device=10)      # k = M, the edge: all labels
    assert all(np.array_equal(np.bincount(LABELS[p], minlength=10), np.full(10, 25)) for p in every)
    with pytest.raises(InputError, match="must be in 1..10") as caught:
        partition_indices(LABELS, 4, "labels", seed=0, labels_per_device=11)
    assert caught.value.field == "--labels-per-device"


@pytest.mark.parametrize("gamma", [0.0, 1.0, 2.0])
def test_power_law_sizes_follow_rank_to_the_minus_gamma(gamma: float) -> None:
    """n_i = m + ⌊s_i·(n − N·m)⌋ (+1 for the largest remainders), s_i ∝ r_i^−γ: sorted, the sizes are the
    formula's for ranks 1..N; γ = 0 gives equal sizes; every sample dealt once, labels not grouped."""
    n, N, m = LABELS.size, 8, 16
    parts = partition_indices(LABELS, N, "power-law", seed=4, min_size=m, size_exponent=gamma)
    _covers_once(parts, n)
    shares = np.array([r ** -gamma for r in range(1, N + 1)])
    expected = m + shares / shares.sum() * (n - N * m)
    sizes = sorted((p.size for p in parts), reverse=True)
    assert all(math.floor(e) <= s <= math.ceil(e) for s, e in zip(sizes, expected)) and sum(sizes) == n
    if gamma:
        assert sizes[0] > 2 * sizes[-1]
    largest = max(parts, key=len)
    assert np.count_nonzero(np.bincount(LABELS[largest], minlength=10)) == 10


def _hand_hellinger(p: list[float], q: list[float]) -> float:
    return math.sqrt(1 - sum(math.sqrt(a * b) for a, b in zip(p, q)))


def _hand_js(p: list[float], q: list[float]) -> float:
    m = [(a + b) / 2 for a, b in zip(p, q)]
    kl = (lambda x, y: sum(a * math.log2(a / b) for a, b in zip(x, y) if a > 0))
    return math.sqrt(0.5 * kl(p, m) + 0.5 * kl(q, m))


def test_skew_measures_against_their_formulas() -> None:
    """Two devices [3, 1] and [0, 4] of two labels: q = [3/8, 5/8]; each device's H and JS written out."""
    skew = PartitionSkew.of(np.array([[3, 1], [0, 4]]))
    q = [3 / 8, 5 / 8]
    devices = [[3 / 4, 1 / 4], [0.0, 1.0]]
    assert skew.hellinger_mean == pytest.approx(np.mean([_hand_hellinger(p, q) for p in devices]), abs=1e-12)
    assert skew.jensen_shannon_mean == pytest.approx(np.mean([_hand_js(p, q) for p in devices]), abs=1e-12)
    assert (skew.labels_per_device_mean, skew.size_min, skew.size_max, skew.size_cv) == (1.5, 4, 4, 0.0)
    disjoint = PartitionSkew.of(np.array([[5, 0], [0, 5]]))      # disjoint supports: H = √(1 − 0)... of p vs q
    assert disjoint.hellinger_mean == pytest.approx(_hand_hellinger([1, 0], [0.5, 0.5]), abs=1e-12)
    same = PartitionSkew.of_parts(partition_indices(LABELS, 10, "shards", seed=0), LABELS, 10)
    iid = PartitionSkew.of(np.full((4, 10), 25))
    assert iid.hellinger_mean == iid.jensen_shannon_mean == 0.0 and iid.size_cv == 0.0
    assert same.hellinger_mean > 0.5 and same.labels_per_device_mean <= 2
    sizes = PartitionSkew.of(np.array([[1, 0], [3, 0]]))
    assert sizes.size_cv == pytest.approx(0.5)                   # population std 1 / mean 2


def test_split_data_prints_the_skew_and_train_keeps_it_in_the_history(tmp_path, capsys) -> None:
    """`split-data --partition quantity` prints the measures of the partition it wrote; a run records them in
    history.meta.partition_skew; a labels-per-device of 0 is refused naming the flag (exit 2)."""
    out = tmp_path / "folder"
    assert main(["split-data", "--dataset", "synthetic", "--devices", "4", "--partition", "quantity",
                 "--labels-per-device", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().err
    assert "quantity partition, label skew: Hellinger" in printed and "labels per device" in printed
    labels_each = float(printed.split(" labels per device")[0].rsplit(" ", 1)[1])
    assert labels_each <= 2
    assert main(["train", "--dataset", "synthetic", "--model", "mlp", "--devices", "4", "--rounds", "1",
                 "--partition", "power-law", "--size-exponent", "1.5", "--no-progress", "--threads", "1",
                 "--out", str(tmp_path / "run")]) == 0
    skew = json.loads((tmp_path / "run" / "history.json").read_text())["meta"]["partition_skew"]
    assert skew["size_max"] > skew["size_min"] and skew["size_cv"] > 0
    assert main(["split-data", "--dataset", "synthetic", "--devices", "4", "--partition", "labels",
                 "--labels-per-device", "0", "--out", str(tmp_path / "bad")]) == 2
    assert "--labels-per-device" in capsys.readouterr().err
