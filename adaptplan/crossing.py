"""When a run first reached a target accuracy, resolved finer than its evaluation grid.

Given evaluations k = 0..K−1 in order, each an accuracy a_k and coordinates x_k (its round, its simulated
seconds, ...), the crossing of target A is at the first k with a_k ≥ A, linearly interpolated from the evaluation
before it: x = x_{k−1} + s·(x_k − x_{k−1}) with s = (A − a_{k−1}) / (a_k − a_{k−1}). Where the first evaluation is
already at or above A there is nothing to interpolate from: its coordinates are returned, marked as an upper bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Crossing:
    """The interpolated coordinates where the accuracy first reached the target (same order as given), and
    ``upper_bound`` where the first evaluation already had it."""

    at: tuple[float, ...]
    upper_bound: bool = False


def first_crossing(points: Sequence[Sequence[float]], target: float) -> Crossing | None:
    """The :class:`Crossing` of ``target`` by ``points`` ((accuracy, x1, x2, ...) per evaluation, in order), per the
    module docstring; None when no evaluation reaches ``target``."""
    for k, (accuracy, *coords) in enumerate(points):
        if accuracy >= target:
            if k == 0:
                return Crossing(tuple(float(x) for x in coords), upper_bound=True)
            before, *before_coords = points[k - 1]               # before < target <= accuracy
            share = (target - before) / (accuracy - before)
            return Crossing(tuple(float(b + share * (x - b)) for b, x in zip(before_coords, coords)))
    return None
