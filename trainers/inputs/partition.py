"""Partitioning a training set over N devices, and per-device mini-batch samplers.

* ``iid``: shuffle, split evenly (docs/model.md §6.1).
* ``shards``: sort by label (stable), cut into 2N shards, give each device 2 random shards
  (docs/model.md §6.1: 40 shards, 2 per device for N = 20).
* ``dirichlet``: for every class, split its samples over devices with proportions ~ Dir(α).
* ``dirichlet-equal``: every device the same number of samples, its label mix q_i ~ Dir(α) over the
  classes (Hsu et al. 2019, the partition CycleSL's CIFAR-100 runs cite; SCALA's distribution-based skew
  draws each client's mix the same way). Unlike ``dirichlet`` it never leaves a device without a
  mini-batch, so many devices fit a small data set (100 devices at α = 0.1 on 5,085 images).
* ``quantity``: SCALA's quantity-based label skew (SCALA §V-A, after NIID-Bench): the samples of each label cut
  into K·α/M equal portions (K devices, M labels, α = ``labels_per_device``), the K·α portions shuffled and α of
  them given to each device, so that a device holds at most α labels. Where M does not divide K·α, the
  K·α mod M labels that get one portion more are drawn at random (SCALA assumes it divides).
* ``labels``: the pathological k-label split (NIID-Bench's #C = k): device i holds label i mod M and k − 1 other
  distinct labels drawn uniformly (k = ``labels_per_device``); each label's samples are split evenly over the
  devices that hold it (a label nobody holds is left out).
* ``power-law``: size skew with IID labels: device sizes ∝ r_i^(−γ) (γ = ``size_exponent``, r a random
  permutation of the ranks 1..N), each at least ``min_size``; the shuffled samples cut at those sizes.

All randomness comes from a ``numpy.random.Generator`` seeded by the caller, so a fixed seed gives
the same partition.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from adaptplan.errors import InputError
from trainers.config.train_config import PARTITIONS, check_choice


def partition_indices(labels: np.ndarray, num_devices: int, method: str, seed: int, alpha: float = 0.5,
                      min_size: int = 1, labels_per_device: int = 2, size_exponent: float = 1.0,
                      groups: np.ndarray | None = None) -> list[np.ndarray]:
    """Return one sorted int64 index array per device (disjoint, covering ≤ all samples). ``groups``: a natural
    owner per sample, which ``roles`` needs (:func:`natural_groups`)."""
    check_choice(method, PARTITIONS, "partition")
    if method == "roles":
        return natural_groups(groups, num_devices, seed)
    labels = np.asarray(labels)
    n = labels.shape[0]
    if n < num_devices:
        raise InputError(f"{n} samples cannot be split over {num_devices} devices", field="devices")
    rng = np.random.default_rng(seed)
    if method == "iid":
        parts = np.array_split(rng.permutation(n), num_devices)
    elif method == "shards":
        order = np.argsort(labels, kind="stable")
        shards = np.array_split(order, 2 * num_devices)
        shard_ids = rng.permutation(2 * num_devices)
        parts = [np.concatenate([shards[shard_ids[2 * i]], shards[shard_ids[2 * i + 1]]]) for i in range(num_devices)]
    elif method == "dirichlet-equal":
        parts = _dirichlet_equal(labels, num_devices, alpha, rng)
    elif method == "quantity":
        parts = _quantity(labels, num_devices, labels_per_device, rng)
    elif method == "labels":
        parts = _k_labels(labels, num_devices, labels_per_device, rng)
    elif method == "power-law":
        parts = _power_law(n, num_devices, size_exponent, min_size, rng)
    else:
        parts = _dirichlet(labels, num_devices, alpha, rng, min_size=min_size)
    return [np.sort(p).astype(np.int64) for p in parts]


def natural_groups(groups: np.ndarray | None, num_devices: int, seed: int) -> list[np.ndarray]:
    """The ``roles`` partition (LEAF's natural one): device i holds every sample of the i-th of ``num_devices``
    owners drawn without replacement, uniformly from the data set's owners by ``seed``. InputError naming the field
    for a data set without owners, or fewer owners than devices."""
    if groups is None:
        raise InputError("the roles partition needs a data set with natural owners (shakespeare: one speaking role "
                         "per device)", field="partition")
    owners = np.unique(groups)
    if len(owners) < num_devices:
        raise InputError(f"the data set has {len(owners)} owners (roles), fewer than {num_devices} devices",
                         field="devices")
    chosen = np.random.default_rng(seed).choice(owners, size=num_devices, replace=False)
    return [np.flatnonzero(groups == owner).astype(np.int64) for owner in chosen]


def _dirichlet_equal(labels: np.ndarray, num_devices: int, alpha: float, rng: np.random.Generator) -> list[np.ndarray]:
    """⌊n/N⌋ samples per device (the first n mod N devices one more), device i's label mix q_i ~ Dir(α·1_M): its
    samples are drawn one at a time, each label with probability ∝ q_i over the labels not yet used up, without
    replacement within the label (Hsu et al. 2019, "each client the same number of samples")."""
    classes = np.unique(labels)
    pools = [list(rng.permutation(np.flatnonzero(labels == c))) for c in classes]
    sizes = np.full(num_devices, labels.size // num_devices)
    sizes[: labels.size % num_devices] += 1
    parts = []
    for size in sizes:
        mix = rng.dirichlet(np.full(classes.size, alpha))
        taken = []
        for _ in range(int(size)):
            left = np.array([len(pool) > 0 for pool in pools])
            weights = mix * left
            weights = weights / weights.sum() if weights.sum() > 0 else left / left.sum()
            taken.append(pools[int(rng.choice(classes.size, p=weights))].pop())
        parts.append(np.asarray(taken, dtype=np.int64))
    return parts


def _quantity(labels: np.ndarray, num_devices: int, alpha: int, rng: np.random.Generator) -> list[np.ndarray]:
    """SCALA's quantity-based skew (module docstring): K·α portions, label c cut into P_c of them (P_c = ⌊K·α/M⌋,
    one more for K·α mod M labels drawn at random), sizes within a label differing by one at most; the portions
    shuffled and dealt α to each device in turn."""
    classes = np.unique(labels)
    total = num_devices * alpha
    counts = np.full(classes.size, total // classes.size)
    counts[rng.permutation(classes.size)[: total % classes.size]] += 1
    portions = [piece for c, count in zip(classes, counts) if count
                for piece in np.array_split(rng.permutation(np.flatnonzero(labels == c)), int(count))]
    dealt = rng.permutation(total)
    return [np.concatenate([portions[j] for j in dealt[i * alpha:(i + 1) * alpha]]) for i in range(num_devices)]


def _k_labels(labels: np.ndarray, num_devices: int, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """NIID-Bench's #C = k (module docstring): device i's labels are classes[i mod M] and k − 1 others drawn
    without replacement; each label's shuffled samples split evenly over its holders in device order."""
    classes = np.unique(labels)
    if not 1 <= k <= classes.size:
        raise InputError(f"must be in 1..{classes.size} (the data set's labels) for --partition labels, got {k}",
                         field="--labels-per-device")
    held = []
    for i in range(num_devices):
        first = i % classes.size
        others = rng.choice([c for c in range(classes.size) if c != first], size=k - 1, replace=False)
        held.append({first, *(int(c) for c in others)})
    buckets: list[list[np.ndarray]] = [[] for _ in range(num_devices)]
    for c in range(classes.size):
        holders = [i for i in range(num_devices) if c in held[i]]
        if holders:
            pieces = np.array_split(rng.permutation(np.flatnonzero(labels == classes[c])), len(holders))
            for i, piece in zip(holders, pieces):
                buckets[i].append(piece)
    return [np.concatenate(b) for b in buckets]


def _power_law(n: int, num_devices: int, gamma: float, min_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Size skew (module docstring): n_i = m + ⌊s_i·(n − N·m)⌋ with s_i = r_i^(−γ) / Σ_j r_j^(−γ), m =
    ``min_size``, and the samples left by the floors given one each to the largest remainders; IID labels."""
    spare = n - num_devices * max(min_size, 1)
    if spare < 0:
        raise InputError(f"{n} samples cannot give {num_devices} devices {min_size} each", field="devices")
    ranks = rng.permutation(num_devices) + 1.0
    shares = ranks ** -gamma / np.sum(ranks ** -gamma)
    exact = shares * spare
    sizes = np.floor(exact).astype(np.int64)
    sizes[np.argsort(-(exact - sizes), kind="stable")[: spare - int(sizes.sum())]] += 1
    sizes += max(min_size, 1)
    return np.split(rng.permutation(n), np.cumsum(sizes)[:-1])


def _dirichlet(labels: np.ndarray, num_devices: int, alpha: float, rng: np.random.Generator,
               attempts: int = 1000, min_size: int = 1) -> list[np.ndarray]:
    """Per-class Dir(α) proportions; redrawn (up to ``attempts`` times) until every device has at
    least ``min_size`` samples (as NIID-Bench redraws; docs/algorithms.md, SCALA)."""
    classes = np.unique(labels)
    for _ in range(attempts):
        buckets: list[list[np.ndarray]] = [[] for _ in range(num_devices)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            proportions = rng.dirichlet(np.full(num_devices, alpha))
            bounds = (np.cumsum(proportions)[:-1] * idx.size).astype(int)
            for device, piece in enumerate(np.split(idx, bounds)):
                buckets[device].append(piece)
        parts = [np.concatenate(b) for b in buckets]
        if min(p.size for p in parts) >= max(min_size, 1):
            return parts
    raise InputError(f"Dirichlet(α={alpha}) left a device with fewer than {max(min_size, 1)} samples (one mini-batch) in "
                     f"{attempts} draws; raise α, lower the batch size or use fewer devices", field="dirichlet_alpha")


class DeviceSampler:
    """Draws device i's mini-batches: epochs of a seeded permutation, ``batch_size`` samples per draw
    (drop-last; a device with fewer than ``batch_size`` samples yields all of them every draw).
    Its full state is ``state()``/``load_state()`` (numpy bit-generator state + position) for checkpoints."""

    def __init__(self, indices: np.ndarray, batch_size: int, seed: int | list[int]) -> None:
        self.indices = np.asarray(indices, dtype=np.int64)
        self.batch_size = min(batch_size, self.indices.size)
        self.rng = np.random.default_rng(seed)
        self.order = self.rng.permutation(self.indices.size)
        self.position = 0

    def next(self, batch_size: int | None = None) -> np.ndarray:
        """The next ``batch_size`` (default: the sampler's b) sample indices; a new permutation
        starts when the current epoch has fewer left."""
        n = self.batch_size if batch_size is None else min(int(batch_size), self.indices.size)
        if self.position + n > self.order.size:
            self.order = self.rng.permutation(self.indices.size)
            self.position = 0
        chosen = self.order[self.position:self.position + n]
        self.position += n
        return self.indices[chosen]

    def state(self) -> dict[str, Any]:
        return {"rng": self.rng.bit_generator.state, "order": self.order.copy(), "position": self.position}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state`; ValueError unless ``order`` is a permutation of this device's 0..n−1 and
        ``position`` an integer in 0..n (a checkpoint's sampler, checked before it draws a batch)."""
        order, position = state["order"], state["position"]
        order = order.numpy() if hasattr(order, "numpy") else order
        n = self.indices.size
        if not (isinstance(order, np.ndarray) and order.ndim == 1 and order.dtype.kind in "iu" and order.size == n
                and np.array_equal(np.sort(order), np.arange(n))):
            raise ValueError(f"a device's sampler order must be a permutation of its {n} samples' positions")
        if not isinstance(position, (int, np.integer)) or isinstance(position, bool) or not 0 <= int(position) <= n:
            raise ValueError(f"a device's sampler position must be an integer in 0..{n}, got {str(position)[:40]}")
        self.rng.bit_generator.state = state["rng"]
        self.order = np.asarray(order)
        self.position = int(position)


@dataclass(frozen=True)
class PartitionSummary:
    """Sizes and label histograms of a partition (for logs and tests)."""

    sizes: tuple[int, ...]
    classes_per_device: tuple[int, ...]

    @classmethod
    def of(cls, parts: list[np.ndarray], labels: np.ndarray) -> "PartitionSummary":
        return cls(tuple(int(p.size) for p in parts), tuple(int(np.unique(labels[p]).size) for p in parts))


LOCAL_TEST_STREAM = 2 ** 32 - 2
"""Stream word of the local test split's generator, seeded ``[seed, LOCAL_TEST_STREAM]`` (the strategy's stream
is 2³²−1; device samplers use words below MAX_DEVICES)."""


def local_test_split(parts: list[np.ndarray], fraction: float, seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Hold out ⌊fraction·|𝒟_i|⌋ of each device's samples, drawn uniformly without replacement: the sample-wise
    split of CycleSL §4.1 (each device keeps a share of its own data for testing, evaluated with the model it
    would use; 10 % there). Returns (training parts, held-out parts), each sorted; ``fraction`` 0 holds out none.
    The draws come from one generator seeded ``[seed, LOCAL_TEST_STREAM]``, device after device."""
    rng = np.random.default_rng([seed, LOCAL_TEST_STREAM])
    train, test = [], []
    for part in parts:
        part = np.asarray(part, dtype=np.int64)
        held = int(math.floor(fraction * part.size + 1e-9))
        order = rng.permutation(part.size)
        test.append(np.sort(part[order[:held]]))
        train.append(np.sort(part[order[held:]]))
    return train, test


def samples_before_split(batch_size: int, fraction: float) -> int:
    """The fewest samples a device needs so that ``batch_size`` remain for training after the held-out share."""
    return max(1, math.ceil(batch_size / (1.0 - fraction) - 1e-9)) if fraction > 0 else batch_size
