"""`PlanningProblem`: one instance of the joint MA/MS problem (28) (docs/model.md §4.2).

It bundles the latency model (eqs. (16)–(26), :class:`adaptplan.latency.LatencyModel`), the
convergence model (Corollary 1 / eq. (15), :class:`adaptplan.convergence.ConvergenceModel`) and
the set of allowed cut indices (1-based, §8 A10). Every solver in :mod:`solvers` takes a
``PlanningProblem`` first (scipy style: ``solve_xxx(problem, *, options) -> SolveResult``).

Units: times in seconds, the objective (28) in seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from adaptplan.constants import ConvergenceConstants
from adaptplan.convergence import ConvergenceModel, check_lengths
from adaptplan.errors import InfeasibleError, InputError
from adaptplan.latency import LatencyModel, total_latency
from adaptplan.model_profile import ModelProfile
from adaptplan.system import SystemSpec
from solvers.leakage_budget import LeakageBudget, check_every_device_within
from solvers.memory import admissible_cuts, check_every_device_fits


@dataclass(frozen=True)
class PlanningProblem:
    """Instance of problem (28).

    Attributes:
        latency: eqs. (16)–(26) for the (profile, system) pair.
        convergence: Corollary 1 for the constants and N devices.
        candidates: sorted 1-based cut indices a device may use (default 1..L−1, §8 A10).
        leakage: a per-device leakage budget (:mod:`solvers.leakage_budget`), or None.
        admissible: derived, boolean (N, L): device i may cut at j iff its client part fits its
            memory (:func:`solvers.memory.admissible_cuts`) and cut j is within its leakage budget;
            ``None`` when there are no budgets.
    """

    latency: LatencyModel
    convergence: ConvergenceModel
    candidates: np.ndarray = field(default=None)  # type: ignore[arg-type]  # None: every cut point (__post_init__)
    leakage: LeakageBudget | None = None
    admissible: np.ndarray | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        L = self.latency.num_cuts
        if self.candidates is None:
            cand = np.arange(1, L) if L > 1 else np.array([1])
        else:
            cand = np.unique(np.asarray(self.candidates, dtype=int))
        if cand.size == 0:
            raise InputError("must list at least one cut index", field="candidates")
        bad = cand[(cand < 1) | (cand > L)]
        if bad.size:
            raise InputError(f"cut index {int(bad[0])} is outside 1..{L}", field="candidates")
        object.__setattr__(self, "candidates", cand)
        admissible = admissible_cuts(self.latency.profile, self.latency.system)
        if admissible is not None:
            check_every_device_fits(admissible, self.latency.profile, self.latency.system, cand)
        if self.leakage is not None:
            within = self.leakage.admissible(self.latency.num_devices, L)
            combined = within if admissible is None else within & admissible
            check_every_device_within(self.leakage, combined, cand, admissible)
            admissible = combined
        object.__setattr__(self, "admissible", admissible)

    # ---- construction --------------------------------------------------------------------------
    @classmethod
    def from_parts(cls, profile: ModelProfile, system: SystemSpec, constants: ConvergenceConstants,
                   candidates: Sequence[int] | None = None, leakage: LeakageBudget | None = None) -> "PlanningProblem":
        """Validate and bundle one instance.

        Raises:
            InputError: candidate cut outside 1..L, or constants/profile length mismatch.
            InfeasibleError: ε is unreachable (c ≤ 0), or no candidate cut admits I = 1
                (A_ℓ ≥ c/(4β²γ²) for every candidate, §8 A7); the message says what to change.
        """
        check_lengths(profile.num_cuts, constants)
        chosen = None if candidates is None else np.asarray(candidates, dtype=int)
        problem = cls(LatencyModel(profile, system), ConvergenceModel(constants, system.num_devices), chosen,  # type: ignore[arg-type]
                      leakage)
        problem.check_feasible()
        return problem

    def check_feasible(self) -> None:
        """Raise :class:`InfeasibleError` unless some candidate cut admits I = 1 (§8 A7)."""
        self.convergence.check_reachable()
        if self.feasible_candidates.size == 0:
            shallowest = int(self.candidates[0])
            raise InfeasibleError(self.convergence.infeasibility_reason(1, shallowest)
                                  + f" (even the shallowest candidate cut {shallowest} with I=1 is infeasible)")
        if self.admissible is not None:
            feasible = self.feasible_candidates
            fits = self.admissible[:, feasible - 1].any(axis=1)
            if not fits.all():
                i = int(np.flatnonzero(~fits)[0])
                raise InfeasibleError(f"device {i}'s memory or leakage budget admits only cuts too deep for the target "
                                      f"epsilon (feasible cuts with I=1: {feasible.tolist()}); give it more memory, a "
                                      "looser budget, or raise epsilon")

    # ---- sizes and derived sets ----------------------------------------------------------------
    @property
    def num_devices(self) -> int:
        """N."""
        return self.latency.num_devices

    @property
    def num_cuts(self) -> int:
        """L (cut points of the profile, the last is the model output)."""
        return self.latency.num_cuts

    @property
    def feasible_candidates(self) -> np.ndarray:
        """Candidate cuts ℓ with c − d(ℓ) > 0, i.e. those usable with I = 1 (μ₅ bound of (34))."""
        return self.convergence.feasible_cuts(self.candidates)

    @property
    def scale(self) -> float:
        """The constant factor 2ϑ/γ of eq. (28) (dimensionless)."""
        k = self.convergence.constants
        return 2.0 * k.theta / k.gamma

    # ---- evaluation ----------------------------------------------------------------------------
    def stage_latencies(self, cuts: Sequence[int]) -> tuple[float, float]:
        """(T_split(x), T_agg(x)) of §2.4, seconds."""
        return self.latency.t_split(cuts), self.latency.t_agg(cuts)

    def fits(self, cuts: Sequence[int]) -> bool:
        """Whether every device's cut is admissible (fits its memory; always true without budgets)."""
        if self.admissible is None:
            return True
        j = np.asarray(cuts, dtype=int) - 1
        return bool(self.admissible[np.arange(j.size), j].all())

    def admissible_at(self, columns: np.ndarray) -> np.ndarray:
        """Boolean (N, len(columns)): device i may use the 1-based cut ``columns[k]``."""
        columns = np.asarray(columns, dtype=int)
        if self.admissible is None:
            return np.ones((self.num_devices, columns.size), dtype=bool)
        return self.admissible[:, columns - 1]

    def start_cuts(self, cut: int, columns: np.ndarray | None = None) -> tuple[int, ...]:
        """The uniform vector (``cut``, …, ``cut``) made admissible: each device takes its deepest
        admissible cut among ``columns`` (default: the feasible candidates) that is ≤ ``cut``, or its
        shallowest admissible one when none is."""
        columns = self.feasible_candidates if columns is None else np.asarray(columns, dtype=int)
        ok = self.admissible_at(columns)
        below = ok & (columns[None, :] <= cut)
        deepest = np.where(below.any(axis=1), below.shape[1] - 1 - np.argmax(below[:, ::-1], axis=1),
                           np.argmax(ok, axis=1))
        return tuple(columns[deepest].tolist())

    def objective(self, interval: int | float, cuts: Sequence[int]) -> float:
        """Relaxed objective (28) at (I, x), seconds; ``inf`` when c − d(L_c)I² ≤ 0 or some cut does
        not fit its device's memory."""
        if not self.fits(cuts):
            return math.inf
        t_split, t_agg = self.stage_latencies(cuts)
        return self.convergence.objective(interval, int(max(cuts)), t_split, t_agg)

    def total_latency(self, interval: int, cuts: Sequence[int]) -> tuple[int, int, float]:
        """Eq. (26) with integer rounds: (⌈R⌉, ⌊⌈R⌉/I⌋, T) with T in seconds; raises if infeasible."""
        t_split, t_agg = self.stage_latencies(cuts)
        rounds = self.convergence.integer_rounds(interval, int(max(cuts)))
        return rounds, rounds // interval, total_latency(rounds, interval, t_split, t_agg)

    def initial_cuts(self) -> tuple[int, ...]:
        """Shallowest feasible candidate cut for every device (Algorithm 3 step 2), among the cuts
        that fit its memory."""
        self.check_feasible()
        return self.start_cuts(int(self.feasible_candidates[0]))
