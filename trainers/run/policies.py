"""Planning policies in the training loop (``adaptplan train --policy P``, docs/model.md §6.2).

A policy decides the cuts and the aggregation interval at the start of training and again at
aggregation rounds, on the system measured for the next round (:class:`trainers.run.driver.ReplanRequest`):

* ``adaptsfl`` — the built-in planner (BCD, Algorithm 3); re-plans every Q rounds
  (``--replan-every``, Algorithm 1), else plans once;
* ``rma+ms``, ``ma+rms``, ``rma+rms``, ``dama+rms``, ``rma+ams`` — the paper's benchmarks
  (:mod:`solvers.baselines`): random parts are **re-drawn at every aggregation** (§6.2), seeded by
  (run seed, round) so a resumed run draws the same;
* ``sfl`` — MS by Dinkelbach at I = 1; ``psl`` — the same cuts, never aggregating;
* ``fixed-cut`` — every device at ``--cuts``, I by Theorem 2.

The training algorithm stays ``--algorithm`` (default adaptsfl); the policy's interval is used as is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from adaptplan.constants import ConvergenceConstants
from adaptplan.errors import InfeasibleError

if TYPE_CHECKING:  # pragma: no cover
    from trainers.run.planning import ReplanRequest
from trainers.config.train_config import POLICIES
from trainers.config.train_config import REDRAWING_POLICIES as REDRAWING

NEVER = 10 ** 9
"""The interval of a policy that never aggregates (PSL), in rounds."""

assert set(REDRAWING) < set(POLICIES)


def policy_planner(name: str, constants: ConvergenceConstants | None, gamma: float, seed: int,
                   fixed_cut: int | None = None) -> Callable:
    """A :data:`trainers.run.planning.Planner` for policy ``name`` (module docstring)."""
    if name == "adaptsfl":
        from trainers.run.planning import default_planner

        return default_planner(constants, gamma)

    def plan(request: ReplanRequest) -> tuple[list[int], int]:
        from solvers import baselines
        from solvers.problem import PlanningProblem

        consts = request.constants or constants or \
            ConvergenceConstants.training_placeholder(request.profile.num_cuts, gamma, request.system.num_devices)
        problem = PlanningProblem.from_parts(request.profile, request.system, consts)
        draw = seed * 1_000_003 + request.round
        if name == "fixed-cut":
            assert fixed_cut is not None, "TrainConfig requires --cuts J with --policy fixed-cut"
            result = baselines.solve_fixed_cut(problem, int(fixed_cut))
        elif name == "psl":
            result = baselines.solve_psl(problem)
            return list(result.cuts), NEVER
        else:
            result = baselines.BASELINES[name](problem, draw, "highs")
        if not result.success:
            raise InfeasibleError(result.message)
        return list(result.cuts), int(result.interval)

    return plan
