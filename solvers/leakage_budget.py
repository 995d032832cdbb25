"""Per-device leakage budgets as a constraint on the cut (issue 71 item 4; docs/privacy.md "Plans under a leakage
budget").

A leakage table gives, for each cut j = 1..L−1, one figure of what cut j gives away (``adaptplan profile --leakage
--leakage-out FILE``: dCor, the label-inference AUCs, the inversion attacker's MSE, PSNR, SSIM). A budget names one
figure and a limit per device; cut j is *admissible* for device i when its figure is within the limit: at most the
limit for the figures where less means less leaked (dCor, the AUCs, PSNR, SSIM), at least the limit for MSE (a
larger reconstruction error). Cut L (the whole model on the device) has no figure in the table and is never
admitted under a budget. Every solver restricts device i to its admissible cuts exactly as for memory budgets
(:mod:`solvers.memory`; the problem's ``admissible`` matrix is the conjunction of both), so the MS step's optimum
and the certificate are those of the restricted problem.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from adaptplan.errors import InputError
from adaptplan.leakage_table import AT_LEAST, METRICS, LeakageTable, parse_budget
from adaptplan.model_profile import ModelProfile


@dataclass(frozen=True)
class LeakageBudget:
    """``metric``'s value at cuts 1..L−1 (``values``) and each device's limit (``limits``, shape (N,))."""

    metric: str
    values: np.ndarray
    limits: np.ndarray

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise InputError(f"unknown leakage figure {self.metric!r}; valid: {', '.join(METRICS)}", field="max_leakage")
        values = np.asarray(self.values, dtype=float)
        limits = np.asarray(self.limits, dtype=float)
        if values.ndim != 1 or values.size == 0 or not np.all(np.isfinite(values)):
            raise InputError("must be finite numbers, one per cut 1..L−1", field=f"leakage.{self.metric}")
        if limits.ndim != 1 or limits.size == 0 or not np.all(np.isfinite(limits)):
            raise InputError("must be one finite limit per device", field="max_leakage")
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "limits", limits)

    @classmethod
    def from_table(cls, path: str | os.PathLike, text: str, profile: ModelProfile, num_devices: int, defence: str,
                   defence_field: str) -> tuple["LeakageBudget", LeakageTable]:
        """The budget ``text`` (METRIC=LIMIT or one limit per device, :func:`adaptplan.leakage_table.parse_budget`)
        over the table at ``path``, which must be of the profile's model and measured under the ``defence`` setting the
        plan is for (its name, :attr:`adaptplan.defence_cost.DefenceSetting.name`; InputError naming ``defence_field``
        otherwise); with the table."""
        metric, limits = parse_budget(text, num_devices)
        table = LeakageTable.load(path)
        if table.defence != defence:
            raise InputError(f"{path} was measured under defence {table.defence!r}, the plan is for {defence!r}: "
                             f"measure it under the same setting (profile --leakage --leakage-defence {defence})",
                             field=defence_field)
        per_device = np.broadcast_to(np.asarray(limits, dtype=float), (num_devices,)).copy()  # one limit: every device's
        return cls(metric, np.asarray(table.figure(profile, metric), dtype=float), per_device), table

    @classmethod
    def uniform(cls, metric: str, values: Sequence[float], limit: float, num_devices: int) -> "LeakageBudget":
        """The same limit for every one of ``num_devices`` devices."""
        return cls(metric, np.asarray(values, dtype=float), np.full(num_devices, float(limit)))

    def within(self, value: np.ndarray | float, limit: np.ndarray | float) -> np.ndarray:
        """Whether ``value`` respects ``limit`` (≥ for the figures of ``AT_LEAST``, ≤ for the others)."""
        return np.asarray(value) >= limit if self.metric in AT_LEAST else np.asarray(value) <= limit

    def admissible(self, num_devices: int, num_cuts: int) -> np.ndarray:
        """Boolean (N, L): device i may cut at j iff the table's figure at j is within its limit (cut L never)."""
        if self.values.size != num_cuts - 1:
            raise InputError(f"the leakage table has {self.values.size} cuts but the profile {num_cuts - 1} interior "
                             f"ones: measure it on the same model", field=f"leakage.{self.metric}")
        if self.limits.size != num_devices:
            raise InputError(f"{self.limits.size} limits for {num_devices} devices", field="max_leakage")
        out = np.zeros((num_devices, num_cuts), dtype=bool)
        out[:, :-1] = self.within(self.values[None, :], self.limits[:, None])
        return out

    def least(self, cuts: np.ndarray) -> tuple[float, int]:
        """The least-leaking figure among ``cuts`` (1-based, < L) and its cut: the loosest budget must reach it."""
        figures = self.values[cuts - 1]
        k = int(np.argmax(figures) if self.metric in AT_LEAST else np.argmin(figures))
        return float(figures[k]), int(cuts[k])


def check_every_device_within(budget: LeakageBudget, admissible: np.ndarray, candidates: np.ndarray,
                              memory: np.ndarray | None) -> None:
    """InputError naming the first device whose budget admits none of ``candidates`` (among those its memory admits)
    and the smallest budget that would admit one."""
    fits = admissible[:, candidates - 1].any(axis=1)
    if fits.all():
        return
    i = int(np.flatnonzero(~fits)[0])
    usable = candidates[candidates < admissible.shape[1]]
    if memory is not None:
        usable = usable[memory[i, usable - 1]]
    if usable.size == 0:
        raise InputError(f"device {i}: no candidate cut below the output fits its memory, so no leakage budget can "
                         "be met", field=f"max_leakage[{i}]")
    figure, cut = budget.least(usable)
    bound = "at least" if budget.metric in AT_LEAST else "at most"
    loosest = "at most" if budget.metric in AT_LEAST else "at least"
    raise InputError(f"device {i}'s budget ({budget.metric} {bound} {budget.limits[i]:g}) admits no candidate cut: the "
                     f"least-leaking candidate is cut {cut} with {budget.metric} {figure:g}; a budget of {loosest} "
                     f"{figure:g} is feasible", field=f"max_leakage[{i}]")
