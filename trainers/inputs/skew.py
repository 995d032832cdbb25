"""How skewed a partition is: each device's label distribution against the global one, and the spread of the device
sizes (issue 70; reported by ``adaptplan split-data`` and in a run's ``history.meta["partition_skew"]``).

For device i with label counts c_i (over the M classes) p_i = c_i / |𝒟_i|; the global distribution q is that of
all partitioned samples together, q = Σ_i c_i / Σ_i |𝒟_i|. Per device:

* Hellinger distance H(p, q) = √(1 − Σ_c √(p_c q_c)) ∈ [0, 1] (0: the same distribution, 1: disjoint supports);
* Jensen–Shannon distance JS(p, q) = √(½ KL(p ‖ m) + ½ KL(q ‖ m)), m = (p + q) / 2, logarithms base 2, ∈ [0, 1]
  (scipy.spatial.distance.jensenshannon);

and the partition's figures are their means over the devices with samples, the labels per device, and the sizes'
minimum, maximum and coefficient of variation (population standard deviation / mean; 0 for equal sizes).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np
from scipy.spatial.distance import jensenshannon


@dataclass(frozen=True)
class PartitionSkew:
    """The module's figures of one partition (distances in [0, 1], sizes in samples)."""

    hellinger_mean: float
    jensen_shannon_mean: float
    labels_per_device_mean: float
    size_min: int
    size_max: int
    size_cv: float

    @classmethod
    def of(cls, counts: np.ndarray) -> "PartitionSkew":
        """The figures of a partition given each device's label counts (an N × M array)."""
        counts = np.asarray(counts, dtype=np.float64)
        sizes = counts.sum(axis=1)
        used = counts[sizes > 0]
        p = used / used.sum(axis=1, keepdims=True)
        q = counts.sum(axis=0) / counts.sum()
        hellinger = np.sqrt(np.clip(1.0 - np.sqrt(p * q).sum(axis=1), 0.0, 1.0))
        js = np.array([jensenshannon(row, q, base=2) for row in p])
        return cls(float(hellinger.mean()), float(js.mean()), float((used > 0).sum(axis=1).mean()),
                   int(sizes.min()), int(sizes.max()), float(sizes.std() / sizes.mean()))

    @classmethod
    def of_parts(cls, parts: Sequence[np.ndarray], labels: np.ndarray, num_classes: int) -> "PartitionSkew":
        """The figures of index arrays ``parts`` into ``labels`` (class indices 0..M−1)."""
        labels = np.asarray(labels)
        return cls.of(np.stack([np.bincount(labels[np.asarray(p, dtype=np.int64)], minlength=num_classes)
                                for p in parts]))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        """One line for a person: the distances, the labels per device and the sizes."""
        return (f"label skew: Hellinger {self.hellinger_mean:.3f}, Jensen–Shannon {self.jensen_shannon_mean:.3f} "
                f"(means over the devices; 0 = the global mix), {self.labels_per_device_mean:.1f} labels per device; "
                f"sizes {self.size_min}–{self.size_max} samples (CV {self.size_cv:.2f})")
