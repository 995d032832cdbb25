"""What a planner sees and returns inside the training loop (Algorithm 1's planning points):
:class:`ReplanRequest`, the :data:`Planner` signature, and :func:`default_planner`, the AdaptSFL
planner (BCD, Algorithm 3) that :mod:`trainers.run.driver` and :mod:`trainers.run.policies` use, and
:func:`linear_planner`, the plan under the rounds law linear in I (docs/model.md §12)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from adaptplan.constants import ConvergenceConstants
from adaptplan.linear_rounds import RoundsLaw, as_plan
from adaptplan.model_profile import ModelProfile
from adaptplan.plan import Plan
from adaptplan.system import SystemSpec
from solvers.leakage_budget import LeakageBudget


@dataclass
class ReplanRequest:
    """What a planner sees at a planning point (Algorithm 1): the round just finished (0 = before
    training), the system for the next round, the profile, and the plan in force (``cuts`` empty
    before training); ``candidates`` the cuts a plan may use (None: 1..L−1; a U-shaped split's,
    :func:`adaptplan.defence_cost.head_cuts`); ``leakage`` each device's leakage budget (``--max-leakage``; None:
    none), which a plan keeps."""

    round: int
    system: SystemSpec
    profile: ModelProfile
    cuts: list[int]
    interval: int
    constants: ConvergenceConstants | None = None     # re-estimated from the run (--reestimate), else None
    candidates: list[int] | None = None
    leakage: LeakageBudget | None = None


Planner = Callable[[ReplanRequest], "tuple[list[int], int] | Plan"]
"""A planner: returns (cuts, interval) or a full :class:`~adaptplan.plan.Plan` (then recorded in the
history's events); raises :class:`~adaptplan.errors.InfeasibleError` when no plan reaches the target."""


def default_planner(constants: ConvergenceConstants | None = None, gamma: float = 0.01) -> Planner:
    """A :data:`Planner` backed by ``adaptplan.planner.Planner`` (BCD, Algorithm 3).

    Each call solves problem (28) for ``request.system``, warm-started from the cuts in force —
    what ``Planner.replan(system=..., warm_start=...)`` does — but statelessly, so a resumed run
    re-plans exactly as the uninterrupted one. Constants: the request's re-estimated ones, else
    ``constants``, else the placeholders of docs/model.md §6.1 (``ConvergenceConstants.placeholder(L)``)
    with γ = ``gamma``, the learning rate actually used.
    """

    def plan(request: ReplanRequest) -> Plan:
        from adaptplan.planner import Planner as _Planner

        consts = request.constants or constants or \
            ConvergenceConstants.training_placeholder(request.profile.num_cuts, gamma, request.system.num_devices)
        return _Planner(request.profile, request.system, consts, candidates=request.candidates,
                        leakage=request.leakage).plan(
            initial_cuts=request.cuts or None)

    return plan


def linear_planner(law: RoundsLaw) -> Planner:
    """A :data:`Planner` under the rounds law ``law`` (docs/model.md §12): at each call the latency-best cuts at each
    I up to the pilots' longest on ``request.system``, the I that minimises R(I)·(T_split + T_agg/I); the law is the
    pilots' and stays (``request.constants`` are never set with it: TrainConfig refuses --reestimate)."""

    def plan(request: ReplanRequest) -> Plan:
        chosen = law.plan(request.profile, request.system, candidates=request.candidates, leakage=request.leakage)
        return as_plan(chosen, law, request.profile, request.system)

    return plan
