"""Partitioners: IID, shards (2 per device), Dirichlet(α); determinism."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from adaptplan.errors import InputError
from trainers.inputs.partition import DeviceSampler, PartitionSummary, partition_indices

LABELS = np.repeat(np.arange(10), 100)


@pytest.mark.parametrize("method", ["iid", "shards", "dirichlet"])
def test_disjoint_and_deterministic(method: str) -> None:
    parts = partition_indices(LABELS, 20, method, seed=3, alpha=0.5)
    again = partition_indices(LABELS, 20, method, seed=3, alpha=0.5)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    joined = np.concatenate(parts)
    assert joined.size == np.unique(joined).size == LABELS.size
    assert all(p.size > 0 for p in parts)


def test_iid_sizes_equal() -> None:
    sizes = [p.size for p in partition_indices(LABELS, 20, "iid", seed=0)]
    assert sizes == [50] * 20


def test_shards_two_per_device() -> None:
    parts = partition_indices(LABELS, 20, "shards", seed=0)
    assert all(p.size == 50 for p in parts)
    assert max(np.unique(LABELS[p]).size for p in parts) <= 2     # each shard of 25 is one class here


def test_dirichlet_small_alpha_is_skewed() -> None:
    parts = partition_indices(LABELS, 10, "dirichlet", seed=0, alpha=0.05)
    dominant = np.mean([np.bincount(LABELS[p], minlength=10).max() / p.size for p in parts])
    assert dominant > 0.6


def test_unknown_partition() -> None:
    with pytest.raises(InputError, match="iid, shards, dirichlet"):
        partition_indices(LABELS, 4, "random", seed=0)


def test_sampler_state_roundtrip() -> None:
    a = DeviceSampler(np.arange(40), 16, [0, 1])
    for _ in range(3):
        a.next()
    b = DeviceSampler(np.arange(40), 16, [9, 9])
    b.load_state(a.state())
    assert all(np.array_equal(a.next(), b.next()) for _ in range(5))


def test_dirichlet_redraws_until_every_device_holds_a_minibatch() -> None:
    import pytest

    from adaptplan.errors import InputError

    labels = np.repeat(np.arange(10), 200)
    parts = partition_indices(labels, 20, "dirichlet", seed=0, alpha=0.1, min_size=16)
    assert min(p.size for p in parts) >= 16 and sum(p.size for p in parts) == labels.size
    with pytest.raises(InputError, match="fewer than 150 samples"):
        partition_indices(labels, 20, "dirichlet", seed=0, alpha=0.1, min_size=150)


torch.set_num_threads(1)


def test_a_partition_needs_a_sample_per_device_and_summarises_by_hand() -> None:
    with pytest.raises(InputError, match="3 samples cannot be split over 4 devices") as info:
        partition_indices(np.array([0, 1, 0]), 4, "iid", seed=0)
    assert info.value.field == "devices"
    labels = np.array([0, 0, 1, 2, 2, 2])
    summary = PartitionSummary.of([np.array([0, 1]), np.array([2, 3, 4, 5])], labels)
    assert summary == PartitionSummary((2, 4), (1, 2))


def test_dirichlet_equal_gives_every_device_the_same_count_and_a_skewed_mix() -> None:
    """Hsu et al. 2019: ⌊n/N⌋ samples per device (the first n mod N one more), disjoint, every sample used, the
    label mix concentrated at α = 0.1 (a device's largest label holds most of its samples) and spread at α = 100."""
    import numpy as np

    from trainers.inputs.partition import partition_indices

    labels = np.repeat(np.arange(10), 103)                      # 1,030 samples, 10 classes
    parts = partition_indices(labels, 100, "dirichlet-equal", seed=3, alpha=0.1)
    assert sorted(len(p) for p in parts) == [10] * 70 + [11] * 30 and [len(p) for p in parts[:30]] == [11] * 30
    joined = np.concatenate(parts)
    assert np.unique(joined).size == joined.size == labels.size
    top = [np.bincount(labels[p], minlength=10).max() / len(p) for p in parts]
    assert np.mean(top) > 0.6
    spread = partition_indices(labels, 20, "dirichlet-equal", seed=3, alpha=100.0)
    assert np.mean([np.bincount(labels[p], minlength=10).max() / len(p) for p in spread]) < 0.3
    assert [p.tolist() for p in parts] == [p.tolist() for p in partition_indices(labels, 100, "dirichlet-equal", 3, 0.1)]


def test_the_local_test_split_holds_out_floor_of_the_fraction_of_each_device_reproducibly() -> None:
    """CycleSL §4.1's sample-wise split: ⌊f·|D_i|⌋ of each device's samples held out (19 of 199 at f = 0.1, none of
    9), the rest kept for training, together exactly the device's samples; drawn from the generator seeded
    [seed, 2³²−2] (not the partition's nor the strategy's stream), so the same seed gives the same split."""
    import numpy as np

    from trainers.inputs.partition import LOCAL_TEST_STREAM, local_test_split, samples_before_split

    parts = [np.arange(0, 199), np.arange(199, 208), np.arange(208, 308)]
    train, test = local_test_split(parts, 0.1, seed=4)
    assert [len(t) for t in test] == [19, 0, 10] and [len(t) for t in train] == [180, 9, 90]
    for part, tr, te in zip(parts, train, test):
        assert sorted(np.concatenate([tr, te]).tolist()) == part.tolist() and not set(tr) & set(te)
        assert tr.tolist() == sorted(tr.tolist()) and te.tolist() == sorted(te.tolist())
    assert LOCAL_TEST_STREAM == 2 ** 32 - 2
    rng = np.random.default_rng([4, LOCAL_TEST_STREAM])
    assert test[0].tolist() == sorted(parts[0][rng.permutation(199)[:19]].tolist())
    again, other = local_test_split(parts, 0.1, seed=4)[1], local_test_split(parts, 0.1, seed=5)[1]
    assert [t.tolist() for t in again] == [t.tolist() for t in test] and other[0].tolist() != test[0].tolist()
    assert [len(t) for t in local_test_split(parts, 0.0, seed=4)[1]] == [0, 0, 0]
    assert (samples_before_split(16, 0.1), samples_before_split(16, 0.0), samples_before_split(18, 0.1)) == (18, 16, 20)


def test_the_held_out_count_is_the_floor_of_the_exact_product() -> None:
    """⌊f·|D_i|⌋ on the decimal product, not the float one: 0.29 × 100 is 28.999… in floating point and holds out
    29; 0.1 × 30 holds out 3; a device of 9 samples at f = 0.1 (0.9) holds none out and trains on all 9."""
    from trainers.inputs.partition import local_test_split

    parts = [np.arange(100), np.arange(100, 130), np.arange(130, 139)]
    assert 0.29 * 100 < 29                                          # the float product, below the whole number
    train, test = local_test_split(parts, 0.29, seed=0)
    assert [len(t) for t in test] == [29, 8, 2]                      # ⌊29⌋, ⌊8.7⌋, ⌊2.61⌋
    train, test = local_test_split(parts, 0.1, seed=0)
    assert [len(t) for t in test] == [10, 3, 0] and len(train[2]) == 9 and train[2].tolist() == list(range(130, 139))


def test_the_samples_a_device_needs_before_its_split() -> None:
    """⌈b / (1 − f)⌉: b = 21 at f = 0.3 needs exactly 30 (21 / 0.7 = 30.000…04 in floating point); b = 16 at
    f = 0.1 needs 18."""
    from trainers.inputs.partition import local_test_split, samples_before_split

    assert 21 / (1 - 0.3) > 30
    assert samples_before_split(21, 0.3) == 30 and samples_before_split(16, 0.1) == 18
    assert samples_before_split(16, 0.0) == 16 and samples_before_split(1, 0.5) == 2
    train, _ = local_test_split([np.arange(30)], 0.3, seed=3)
    assert len(train[0]) == 21                                       # 30 samples leave exactly b = 21 to train on
