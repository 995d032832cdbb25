"""The convergence model: Theorem 1 / Corollary 1 and objective (28), docs/model.md §3–§4.

With c = ε − (βγ/N)Σ_{j=1}^{L}σ_j² and d(L_c) = 4β²γ²A_{L_c} (A_ℓ = Σ_{j≤ℓ}G_j², eq. (29)):

* eq. (15): R(I, L_c) = 2ϑ / (γ (c − d I²)), valid only when c − d I² > 0;
* eq. (28): Θ(I, x) = (2ϑ/γ) · (I·T_split + T_agg) / (I (c − d I²)), seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from adaptplan.constants import ConvergenceConstants
from adaptplan.errors import InfeasibleError, InputError


def drift_coefficient(constants: ConvergenceConstants) -> float:
    """4β²γ² (dimensionless), so that d(L_c) = 4β²γ²·A_{L_c} (§3)."""
    return 4.0 * constants.beta**2 * constants.gamma**2


def margin(c: float, d: float, interval: float) -> float:
    """c − d·I², the factor of eq. (15)'s denominator; (I, L_c) is feasible iff it is > 0."""
    I = float(interval)
    return c - d * I * I


def interval_denominator(c: float, d: float | np.ndarray, interval: float | np.ndarray) -> np.ndarray:
    """D = I·(c − d·I²), the denominator of (28) and of the MS subproblem's ratio (34), for arrays of
    intervals or of d (numpy broadcasting)."""
    I = np.asarray(interval, dtype=float)
    return I * (c - d * I * I)


def latency_ratio(interval: float | np.ndarray, a: float, b: float, c: float, d: float) -> float | np.ndarray:
    """(a·I + b) / (I·(c − d·I²)), the part of (28) that depends on the plan, with a = T_split and
    b = T_agg in seconds (so (28) = (2ϑ/γ)·this); ``inf`` where c − d·I² ≤ 0."""
    I = np.asarray(interval, dtype=float)
    m = c - d * I * I
    with np.errstate(divide="ignore", invalid="ignore"):
        value = np.where(m > 0, (a * I + b) / (I * m), np.inf)
    return float(value) if value.ndim == 0 else value


def whole_rounds(rounds: float) -> int:
    """⌈R⌉, the rounds a plan reports (docs/formats.md), at least 1; a relative 1e-12 guard keeps an R that is an
    integer up to rounding from gaining a round."""
    return max(1, math.ceil(rounds * (1 - 1e-12)))


def mu5_bound(c: float, k_drift: float, interval: float, eta: float) -> float:
    """Largest A_{L_c} feasible at interval I: A < c/(4β²γ²I²), shrunk by the relative margin ``eta``
    (the μ₅ constraint of §4.3/§5.1); ``inf`` when 4β²γ² = 0."""
    return c / (k_drift * interval * interval) * (1.0 - eta) if k_drift > 0 else math.inf


@dataclass(frozen=True)
class ConvergenceModel:
    """Corollary 1 for ``num_devices`` devices under ``constants``."""

    constants: ConvergenceConstants
    num_devices: int

    @property
    def c(self) -> float:
        """c = ε − (βγ/N) Σ_{j=1}^{L} σ_j² (§3 shorthand); must be > 0."""
        return self.constants.epsilon - self.constants.noise_floor(self.num_devices)

    @property
    def d_per_cut(self) -> np.ndarray:
        """d(ℓ) = 4β²γ²A_ℓ for ℓ = 1..L (index 0 ↔ ℓ = 1)."""
        return drift_coefficient(self.constants) * self.constants.cumulative_G2

    def d(self, deepest_cut: int) -> float:
        """d = 4β²γ²A_{L_c} for L_c = ``deepest_cut`` (1-based)."""
        return float(self.d_per_cut[deepest_cut - 1])

    def interval_bound(self, deepest_cut: int) -> float:
        """I_max = √(c/d): feasible intervals satisfy 1 ≤ I < I_max (§4.4); ∞ when d = 0."""
        d = self.d(deepest_cut)
        return math.inf if d == 0 else math.sqrt(max(self.c, 0.0) / d)

    def margin(self, interval: int | float, deepest_cut: int) -> float:
        """c − d I², the denominator factor of eq. (15); positive iff (I, L_c) is feasible."""
        return float(margin(self.c, self.d(deepest_cut), float(interval)))

    def rounds(self, interval: int | float, deepest_cut: int) -> float:
        """Real-valued R of eq. (15); raises :class:`InfeasibleError` when c − dI² ≤ 0."""
        margin = self.margin(interval, deepest_cut)
        if margin <= 0:
            raise InfeasibleError(self.infeasibility_reason(interval, deepest_cut))
        k = self.constants
        return 2.0 * k.theta / (k.gamma * margin)

    def integer_rounds(self, interval: int, deepest_cut: int) -> int:
        """:func:`whole_rounds` of eq. (15)'s R. Raises InfeasibleError like ``rounds``."""
        return whole_rounds(self.rounds(interval, deepest_cut))

    def objective(self, interval: int | float, deepest_cut: int, t_split: float, t_agg: float) -> float:
        """Relaxed objective (28) in seconds: (2ϑ/γ)·:func:`latency_ratio`; +∞ when infeasible."""
        k = self.constants
        return (2.0 * k.theta / k.gamma) * float(latency_ratio(interval, t_split, t_agg, self.c, self.d(deepest_cut)))

    def infeasibility_reason(self, interval: int | float, deepest_cut: int) -> str:
        """Say which constraint fails and what would make it feasible (§8 A7)."""
        k = self.constants
        if self.c <= 0:
            floor = k.noise_floor(self.num_devices)
            return (f"target epsilon={k.epsilon:g} is unreachable: the noise floor (beta*gamma/N)*sum(sigma2) = {floor:g} "
                    f"is already >= epsilon (constraint c > 0 of Corollary 1); raise epsilon above {floor:g}, "
                    f"lower gamma, or add devices")
        bound = self.interval_bound(deepest_cut)
        return (f"interval I={interval:g} with deepest cut L_c={deepest_cut} violates c - d*I^2 > 0 "
                f"(Corollary 1): I must be < {bound:.4g}; use a smaller interval, a shallower cut, a larger epsilon or a smaller gamma")

    def check_reachable(self) -> None:
        """Raise :class:`InfeasibleError` when ε cannot be reached by any (I, cut) (c ≤ 0). A γ above 1/β is no
        refusal (:func:`step_note`)."""
        if self.c <= 0:
            raise InfeasibleError(self.infeasibility_reason(1, 1))

    def feasible_cuts(self, candidates: np.ndarray) -> np.ndarray:
        """The candidate cuts (1-based) for which I = 1 is feasible (A_ℓ < c/(4β²γ²), §8 A7)."""
        candidates = np.asarray(candidates, dtype=int)
        return candidates[self.c - self.d_per_cut[candidates - 1] > 0]


def step_note(constants: ConvergenceConstants) -> str | None:
    """The sentence said once where γ > 1/β: Theorem 1 (and so eq. 15 as a bound) assumes 0 < γ ≤ 1/β, which the
    learning rates users train with often exceed. The planner still plans, reading eq. (15) as a model of the
    rounds (docs/model.md §10): calibrated to pilot runs (``--pilots``), or, uncalibrated, with no guarantee. None where
    γ ≤ 1/β."""
    k = constants
    if k.gamma * k.beta <= 1:
        return None
    return (f"gamma = {k.gamma:g} exceeds 1/beta = {1 / k.beta:.3g} (beta = {k.beta:.4g}): Theorem 1 assumes "
            f"gamma <= 1/beta, so its round count is no bound here; the plan reads eq. (15) as a model of the rounds "
            f"(docs/model.md §10), fitted to pilot runs with --pilots, else unchecked")


def check_lengths(num_cuts_profile: int, constants: ConvergenceConstants) -> None:
    """Profile and constants must describe the same L cut points (docs/formats.md)."""
    if constants.num_cuts != num_cuts_profile:
        raise InputError(f"has {constants.num_cuts} entries but the profile has {num_cuts_profile} cut points; "
                         f"they must match (one sigma2/G2 per cut point)", field="constants.sigma2")
