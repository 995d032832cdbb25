"""Convergence constants fitted to pilot runs, so that the planner predicts rounds and seconds to a test accuracy
(docs/model.md §10 "Calibration from pilot runs").

Corollary 1 (eq. 15) counts R(I, L_c) = 2ϑ / (γ (c − d(L_c) I²)) rounds to an ε-stationary point, with
c = ε − βγΣ_jσ_j²/N and d(ℓ) = 4β²γ²A_ℓ (A_ℓ = Σ_{j≤ℓ} G_j², eq. 29): a target no user states. A pilot run k trained
one plan (interval I_k, deepest cut L_k) and first reached the user's target test accuracy at R_k rounds
(interpolated between evaluations, :mod:`adaptplan.crossing`; a run folder is read as a pilot by
:func:`trainers.run.pilots.read_pilot`). With β, σ_j², G_j², ϑ estimated from the run's own
model and data (Algorithm 1; :func:`profilers.estimate_constants`) and γ the learning rate, calibration reads
eq. (15) as the rounds to that accuracy:

    m_k := 2ϑ / (γ R_k) = c − κ·x_k,        x_k = 4β²γ²·A_{L_k}·I_k²,

two unknowns: c (so ε = c + βγΣσ_j²/N) and κ ≥ 0, the share of the drift bound 4γ²I²A_{L_c} that the pilots saw
(every G_j² becomes κ·G_j²).

* One pilot: κ = 1 (the bound as estimated) and c = m_1 + x_1, so the model's R at the pilot's plan is R_1.
* Pilots at two or more distinct x_k: (c, κ) by least squares; where that κ is < 0 (the pilots show no cost of a
  longer interval), κ = 0 and c = the mean m_k.

The fitted model is a model of the observed rounds, not Theorem 1's bound: it needs no γ ≤ 1/β (the learning rates
users train with often exceed 1/β, where the theorem says nothing). Units: rounds, and the constants' own
(dimensionless) units.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from adaptplan.constants import ConvergenceConstants
from adaptplan.convergence import ConvergenceModel
from adaptplan.errors import InfeasibleError, InputError

ROUNDS_LAWS = ("eq15", "linear", "per-cut")
"""What pilots are fitted to (``--rounds-law``): eq. (15)'s constants (this module), the rounds law linear in I
(:mod:`adaptplan.linear_rounds`, docs/model.md §12) or that law with R₁ measured per cut (§12 "Per cut")."""


@dataclass(frozen=True)
class PilotRun:
    """What calibration takes from a pilot: its plan (every round's ``interval`` I and deepest cut ``deepest_cut``
    L_c), the ``target_accuracy`` and the ``rounds`` R (interpolated) at which it first reached it, from ``source``."""

    source: str
    interval: int
    deepest_cut: int
    target_accuracy: float
    rounds: float


@dataclass(frozen=True)
class Calibration:
    """The fit (module docstring): ``c`` and ``kappa`` κ, and per pilot the rounds measured and the rounds the fitted
    model gives at its plan; ``constants`` are the estimated ones with ε = c + βγΣσ²/N and κ·G_j²."""

    constants: ConvergenceConstants
    c: float
    kappa: float
    pilots: tuple[PilotRun, ...]
    fitted_rounds: tuple[float, ...]
    message: str

    def apply(self, estimated: ConvergenceConstants, num_devices: int) -> ConvergenceConstants:
        """``estimated`` (e.g. re-estimated later in the run, Algorithm 1) with this fit's c and κ."""
        return calibrated(estimated, self.c, self.kappa, num_devices)

    def to_json(self) -> dict[str, Any]:
        return {"target_accuracy": self.pilots[0].target_accuracy, "c": self.c, "kappa": self.kappa,
                "epsilon": self.constants.epsilon, "message": self.message, "constants": self.constants.to_json(),
                "pilots": [{"source": p.source, "interval": p.interval, "deepest_cut": p.deepest_cut,
                            "measured_rounds": p.rounds, "fitted_rounds": fitted}
                           for p, fitted in zip(self.pilots, self.fitted_rounds)]}


def calibrated(estimated: ConvergenceConstants, c: float, kappa: float, num_devices: int) -> ConvergenceConstants:
    """``estimated`` with ε = c + βγΣσ_j²/N (so that Corollary 1's c is ``c``) and every G_j² scaled by κ."""
    return replace(estimated, epsilon=c + estimated.noise_floor(num_devices), G2=tuple(kappa * g for g in estimated.G2))


def drift_load(constants: ConvergenceConstants, interval: int, deepest_cut: int) -> float:
    """x = 4β²γ²·A_{L_c}·I² (dimensionless): the drift term d·I² of eq. (15)'s denominator at κ = 1."""
    return ConvergenceModel(constants, 1).d(deepest_cut) * interval * interval


def calibrate(estimated: ConvergenceConstants, pilots: Sequence[PilotRun], num_devices: int) -> Calibration:
    """Fit c and κ to ``pilots`` (module docstring) for ``estimated`` constants of a run of ``num_devices``."""
    if not pilots:
        raise InputError("calibration needs at least one pilot run", field="--pilots")
    if len({p.target_accuracy for p in pilots}) != 1:
        raise InputError("the pilots must be read for one target accuracy", field="--pilots")
    for p in pilots:
        if not 1 <= p.deepest_cut <= estimated.num_cuts:
            raise InputError(f"{p.source!r} trained cut {p.deepest_cut}, but the model has cuts 1..{estimated.num_cuts}",
                             field="--pilots")
    m = np.array([2.0 * estimated.theta / (estimated.gamma * p.rounds) for p in pilots])
    x = np.array([drift_load(estimated, p.interval, p.deepest_cut) for p in pilots])
    if len(set(x.tolist())) < 2:
        kappa = 1.0
        c = float(np.mean(m + x))
        message = (f"{len(pilots)} pilot{'s' if len(pilots) > 1 else ''} at one drift load: ε fitted, the drift bound "
                   "kept as estimated (κ = 1); pilots at two intervals or cuts would measure it")
    else:
        slope, intercept = np.polyfit(x, m, 1)             # m = intercept + slope·x, κ = −slope
        kappa, c = float(-slope), float(intercept)
        message = f"ε and the drift share κ = {kappa:.3g} fitted to {len(pilots)} pilots"
        if kappa <= 0:
            kappa, c = 0.0, float(np.mean(m))
            message = (f"the {len(pilots)} pilots show no cost of a longer interval or deeper cut, so κ = 0: the "
                       "model sees no drift and the planner's interval is its cap")
    # c > 0 always: every m_k > 0, and with κ ≥ 0 the intercept c = mean(m) + κ·mean(x) of the fit
    constants = calibrated(estimated, c, kappa, num_devices)
    return Calibration(constants, c, kappa, tuple(pilots), tuple(_rounds(constants, num_devices, p) for p in pilots),
                       message)


def _rounds(constants: ConvergenceConstants, num_devices: int, pilot: PilotRun) -> float:
    """Eq. (15)'s R under ``constants`` at ``pilot``'s plan; ∞ where that plan cannot reach ε (c − dI² ≤ 0)."""
    try:
        return ConvergenceModel(constants, num_devices).rounds(pilot.interval, pilot.deepest_cut)
    except InfeasibleError:
        return math.inf
