"""`ConvergenceConstants`: the training constants of Assumptions 1–2 (docs/model.md §3,
docs/formats.md "Training constants").

β (smoothness), γ (learning rate, must satisfy γ ≤ 1/β for Theorem 1), ϑ = f(w⁰) − f*,
ε (target average squared gradient norm), and per cut point j = 1..L the bounds σ_j² (gradient
variance of block j) and G_j² (second moment of block j's gradient). All are dimensionless.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any, Mapping

import numpy as np

from adaptplan.errors import InputError
from adaptplan.fileio import check_keys, load_file, non_empty_list, non_negative_number, positive_number, save_json
from adaptplan.limits import MAX_CUT_POINTS


@dataclass(frozen=True)
class ConvergenceConstants:
    beta: float
    gamma: float
    theta: float
    epsilon: float
    sigma2: tuple[float, ...]
    G2: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.sigma2) != len(self.G2):
            raise InputError(f"sigma2 has {len(self.sigma2)} entries but G2 has {len(self.G2)}; both need one per cut point", field="constants.G2")
        if not self.sigma2:
            raise InputError("must have one entry per cut point", field="constants.sigma2")

    @property
    def num_cuts(self) -> int:
        return len(self.sigma2)

    @property
    def cumulative_G2(self) -> np.ndarray:
        """A_ℓ = Σ_{j≤ℓ} G_j², eq. (29); index 0 ↔ ℓ = 1."""
        return np.cumsum(np.asarray(self.G2, dtype=float))

    def to_json(self) -> dict[str, Any]:
        return {"beta": self.beta, "gamma": self.gamma, "theta": self.theta, "epsilon": self.epsilon,
                "sigma2": list(self.sigma2), "G2": list(self.G2)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ConvergenceConstants":
        keys = ("beta", "gamma", "theta", "epsilon", "sigma2", "G2")
        check_keys(data, keys, (), "constants")
        lists: dict[str, Any] = {}
        for key in ("sigma2", "G2"):
            values = non_empty_list(data[key], f"constants.{key}", "a non-empty list with one entry per cut point",
                                    MAX_CUT_POINTS)
            lists[key] = tuple(non_negative_number(v, f"constants.{key}[{k}]") for k, v in enumerate(values))
        scalars: dict[str, Any] = {key: positive_number(data[key], f"constants.{key}") for key in keys[:4]}
        return cls(**scalars, **lists)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "ConvergenceConstants":
        return load_file(path, "constants", cls.from_json)

    def save(self, path: str | os.PathLike) -> None:
        save_json(self.to_json(), path)

    @classmethod
    def training_placeholder(cls, num_cuts: int, gamma: float, num_devices: int) -> "ConvergenceConstants":
        """The placeholders with γ = the training learning rate, for planning a run without measured
        constants. Their ε = 0.1 is a placeholder too: where it is unreachable, at or below the noise
        floor β·γ·Σσ_j²/N (Corollary 1's c > 0; e.g. 4 devices at γ = 0.05: 0.3125), ε becomes twice
        that floor, so that a run without constants always has a plan (measured constants keep their ε)."""
        return replace(cls.placeholder(num_cuts), gamma=gamma).reachable(num_devices)

    def noise_floor(self, num_devices: int) -> float:
        """β·γ·Σ_jσ_j²/N, the ε no (I, cut) reaches (Corollary 1's c > 0)."""
        return self.beta * self.gamma * float(np.sum(self.sigma2)) / num_devices

    def reachable(self, num_devices: int) -> "ConvergenceConstants":
        """These constants, with ε = twice the noise floor where their ε is at or below it (unreachable)."""
        floor = self.noise_floor(num_devices)
        return self if self.epsilon > floor else replace(self, epsilon=2 * floor)

    @classmethod
    def placeholder(cls, num_cuts: int) -> "ConvergenceConstants":
        """The placeholder constants of docs/model.md §6.1 [P] — **not** the paper's values:
        β = 5, γ = 0.01, ϑ = 2.3, ε = 0.1, σ_j² = 1, G_j² = 2·10⁻³."""
        return cls(beta=5.0, gamma=0.01, theta=2.3, epsilon=0.1, sigma2=(1.0,) * num_cuts, G2=(2e-3,) * num_cuts)
