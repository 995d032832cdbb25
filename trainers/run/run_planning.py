"""The plan of a run, from its first plan to its re-plans (docs/model.md §5.4, Algorithm 1): :class:`RunPlanning`
holds the run's planner (the built-in AdaptSFL planner, a planning policy's, or the plan under the rounds law linear
in I), chooses the plan in force from round 1 (``--cuts``, ``--plan``, the planner, or the documented fallback), says
in one line where it comes from, and re-plans at aggregation rounds every Q rounds on the measured system, with
constants estimated from the run where ``--reestimate`` asks. The trainer (:mod:`trainers.run.driver`) calls it; it
owns no training state but ``last_replan``."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import torch

from adaptplan.calibration import Calibration
from adaptplan.constants import ConvergenceConstants
from adaptplan.convergence import step_note
from adaptplan.defence_cost import DefenceSetting, head_cuts
from adaptplan.errors import InfeasibleError, InputError
from adaptplan.leakage_table import AT_LEAST
from adaptplan.linear_rounds import ROUNDS_LAW_TYPES
from adaptplan.measured_system import MeasuredRates
from adaptplan.model_profile import ModelProfile
from adaptplan.plan import Plan
from solvers.leakage_budget import LeakageBudget
from trainers.config.train_config import TrainConfig
from trainers.run.estimation import RunData, pilot_calibration, run_constants
from trainers.run.planning import Planner, ReplanRequest, default_planner, linear_planner

if TYPE_CHECKING:  # pragma: no cover
    from trainers.algorithms import Algorithm
    from trainers.api import Strategy
    from trainers.engine.clock import SimClock
    from trainers.engine.split_engine import SplitEngine


def decision(result: "tuple[list[int], int] | Plan") -> tuple[list[int], int, dict[str, Any]]:
    """(cuts, interval, event fields) of a planner's answer: ``{"plan": Plan JSON}`` for a Plan,
    nothing more for a bare (cuts, interval)."""
    if isinstance(result, Plan):
        return list(result.cuts), int(result.interval), {"plan": result.to_json()}
    cuts, interval = result
    return [int(c) for c in cuts], int(interval), {}


def checked_constants(config: TrainConfig, profile: ModelProfile,
                      constants: ConvergenceConstants | None) -> ConvergenceConstants | None:
    """The convergence constants given or read from ``--constants``, checked against the model's cut points
    and the learning rate (Corollary 1 plans with the rate that trains)."""
    c = config
    if constants is None and c.plan.constants_path:
        constants = ConvergenceConstants.load(c.plan.constants_path)
    if constants is not None and len(constants.sigma2) != profile.num_cuts:
        raise InputError(f"the constants have {len(constants.sigma2)} cut points but {c.model.name} has "
                         f"{profile.num_cuts}; estimate them for this model (adaptplan profile --grad-stats)",
                         field="constants_path")
    if constants is not None and not math.isclose(constants.gamma, float(c.optim.lr or 0), rel_tol=1e-9):
        raise InputError(f"the constants' gamma = {constants.gamma:g} is not the learning rate --lr {c.optim.lr:g}; "
                         f"the plan (Corollary 1) must use the learning rate that trains", field="constants_path")
    return constants


class RunPlanning:
    """The plan of one run (module docstring). ``planner`` replaces the configured one (tests, the Python API);
    ``constants`` the ones given (else ``--constants``', checked by :func:`checked_constants`). ``calibration`` is
    the fit to ``--pilots`` (eq. 15's constants or the rounds law linear in I), whose constants replace the given."""

    def __init__(self, config: TrainConfig, profile: ModelProfile, blocks: torch.nn.Sequential, run_data: RunData,
                 algorithm: "Algorithm", strategy: "Strategy", constants: ConvergenceConstants | None = None,
                 planner: Planner | None = None) -> None:
        assert config.optim.lr is not None, "TrainConfig resolves the learning rate"
        self.config, self.profile, self.blocks, self.run_data = config, profile, blocks, run_data
        self.algorithm, self.strategy = algorithm, strategy
        self.lr: float = config.optim.lr
        self.constants = checked_constants(config, profile, constants)
        self.calibration = pilot_calibration(run_data, blocks) if config.plan.pilots else None
        if isinstance(self.calibration, Calibration):
            self.constants = self.calibration.constants
        self.planner, self.replan_every = self._planner(planner)
        self.last_replan = 0
        head = config.privacy.u_shaped
        self.candidates = head_cuts(len(blocks), head) if head else None
        """The cuts a plan may use: a U-shaped split's (the edge server keeps a block before the head), else all."""
        self.leakage = self._leakage_budget()
        """Each device's leakage budget (``--max-leakage`` over ``--leakage-table``; None: none): every plan keeps it."""
        if head and config.plan.policy not in (None, "adaptsfl"):
            raise InputError(f"the {config.plan.policy} policy draws cuts over the whole model; a U-shaped split plans "
                             "with the AdaptSFL planner (leave --policy out) or takes --cuts", field="--policy")

    def _check_no_split(self) -> None:
        """An algorithm of the whole model (the registry's ``whole_model``) has no cut to plan: cut L on every
        device; a planning option is refused, naming it."""
        c, L = self.config, len(self.blocks)
        given = [(flag, value) for flag, value in (("--plan", c.plan.path), ("--policy", c.plan.policy),
                                                   ("--pilots", c.plan.pilots), ("--replan-every", c.plan.replan_every),
                                                   ("--max-leakage", c.plan.max_leakage))
                 if value is not None] + ([("--reestimate", True)] if c.plan.reestimate else [])
        if given:
            raise InputError(f"{c.algorithm} trains the whole model on every device (no split): there is no cut to "
                             "plan; leave it out", field=given[0][0])
        if c.plan.cuts is not None and set(c.plan.cuts) != {L}:
            raise InputError(f"{c.algorithm} trains the whole model on every device (no split): its cut is {L} of "
                             f"{L}; leave --cuts out", field="--cuts")

    def notes(self, interval: int, event: dict[str, Any]) -> list[str]:
        """What the run says once about its first plan: an interval it never reaches, γ > 1/β."""
        return [note for note in [self._interval_note(interval), self._step_note(event)] if note]

    def _planner(self, planner: Planner | None) -> tuple[Planner, int | None]:
        """(the planner, re-plan every Q rounds): a planning policy's, or the AdaptSFL planner."""
        c = self.config
        if isinstance(self.calibration, ROUNDS_LAW_TYPES):
            return planner or linear_planner(self.calibration), c.plan.replan_every
        if c.plan.policy is None:
            return planner or default_planner(self.constants, gamma=self.lr), c.plan.replan_every
        from trainers.run.policies import REDRAWING, policy_planner

        fixed = c.plan.cuts[0] if c.plan.cuts else None
        chosen = planner or policy_planner(c.plan.policy, self.constants, self.lr, c.run.seed, fixed)
        return chosen, 1 if c.plan.policy in REDRAWING else (c.plan.replan_every if c.plan.policy == "adaptsfl" else None)

    def _leakage_budget(self) -> LeakageBudget | None:
        """``--max-leakage`` over ``--leakage-table``, which must be of this model and measured under this run's
        defence setting (None without)."""
        c = self.config
        if c.plan.max_leakage is None or c.plan.leakage_table is None:
            return None
        return LeakageBudget.from_table(c.plan.leakage_table, c.plan.max_leakage, self.profile, c.data.devices,
                                        DefenceSetting.of_run(c.privacy).name, "leakage_table")[0]

    def over_budget(self, cuts: list[int]) -> str | None:
        """One line naming the first device whose cut its leakage budget does not admit (None: every device within,
        or no budget); cut L has no figure and is never admitted (:class:`solvers.leakage_budget.LeakageBudget`)."""
        budget, L = self.leakage, len(self.blocks)
        if budget is None:
            return None
        admissible = budget.admissible(len(cuts), L)
        outside = [i for i, cut in enumerate(cuts) if not admissible[i, cut - 1]]
        if not outside:
            return None
        i = outside[0]
        figure = f"{budget.metric} {budget.values[cuts[i] - 1]:g}" if cuts[i] < L else "the whole model, no figure"
        bound = "at least" if budget.metric in AT_LEAST else "at most"
        return (f"device {i} at cut {cuts[i]} ({figure}) is outside its leakage budget ({budget.metric} {bound} "
                f"{budget.limits[i]:g})")

    def initial_plan(self, clock: SimClock) -> tuple[list[int], int, dict[str, Any]]:
        """(cuts, interval, event fields) of the plan in force from round 1 (module docstring), within the leakage
        budget: a plan given (``--cuts``, ``--plan``) or the fallback outside it is refused, naming its option."""
        cuts, interval, event = self._first_plan(clock)
        outside = self.over_budget(cuts)
        if outside is not None:
            given = "cuts" if self.config.plan.policy == "fixed-cut" else "max_leakage"
            field = {"cuts": "cuts", "plan": "plan_path", "default": "allow_fallback"}.get(event["source"], given)
            raise InputError(f"{outside}: give cuts within it, or leave the cuts to the planner", field=field)
        return cuts, interval, event

    def _first_plan(self, clock: SimClock) -> tuple[list[int], int, dict[str, Any]]:
        """The plan in force from round 1, before the leakage budget's check."""
        c, L = self.config, len(self.blocks)
        if self.algorithm.whole_model:
            self._check_no_split()
            return [L] * c.data.devices, c.plan.interval or 1, {"source": "whole-model"}
        if c.plan.cuts is not None and c.plan.policy is None:
            return list(c.plan.cuts), c.plan.interval or 1, {"source": "cuts"}   # c.plan.interval: --interval or the algorithm's
        if c.plan.path is not None:
            plan = Plan.load(c.plan.path)
            if len(plan.cuts) != c.data.devices:
                raise InputError(f"plan has {len(plan.cuts)} cuts but devices = {c.data.devices}", field="plan.cuts")
            outside = [cut for cut in plan.cuts if not 1 <= cut <= L]
            if outside:
                raise InputError(f"cut {outside[0]} is outside 1..{L}, the cut points of {c.model.name}", field="plan.cuts")
            self._check_plan_model(plan)
            return list(plan.cuts), c.plan.interval or plan.interval, {"source": "plan", "plan": plan.to_json()}
        estimated = self.planning_constants(0, self.blocks) if c.plan.reestimate else None
        try:
            cuts, interval, details = decision(self.planner(ReplanRequest(0, clock.system(1), self.profile, [], 1,
                                                                           estimated, self.candidates, self.leakage)))
        except InfeasibleError as exc:
            if not c.plan.allow_fallback:
                raise InfeasibleError(f"the planner found no plan: {exc.message}. Give the plan yourself (--cuts, --plan), "
                                      f"change the target (--constants), or pass --allow-fallback to train every device "
                                      f"at cut {math.ceil(L / 2)} of {L} with I = 1", field=exc.field) from None
            return [math.ceil(L / 2)] * c.data.devices, c.plan.interval or 1, {"source": "default", "reason": str(exc)}
        source = {"source": "planner"} if c.plan.policy is None else {"source": "policy", "policy": c.plan.policy}
        if estimated is not None:
            details = {**details, "constants": estimated.to_json()}
        return self._one_client_model(cuts), c.plan.interval or self._planned_interval(interval), {**source, **details}

    def _step_note(self, event: dict[str, Any]) -> str | None:
        """:func:`adaptplan.convergence.step_note` for the constants the planner planned with (γ > 1/β)."""
        if event["source"] not in ("planner", "policy"):
            return None
        if "constants" in event:
            return step_note(ConvergenceConstants.from_json(event["constants"]))
        return step_note(self.constants) if self.constants is not None else None

    def _interval_note(self, interval: int) -> str | None:
        """One line where the algorithm averages the devices' models every I rounds and I exceeds the run's
        rounds: the run would end without ever averaging them (SCALA's default I = 20 in a 10-round run)."""
        rounds = self.config.run.rounds
        if not self.strategy.averages_clients or interval <= rounds:
            return None
        return (f"{self.config.algorithm} averages the devices' models every I = {interval} rounds, more than the run's "
                f"{rounds} (--rounds): this run never averages them; give --interval {rounds} or less to see it do so")

    def _check_plan_model(self, plan: Plan) -> None:
        """The plan must record its model (``plan.model``, written by every plan the planner makes) and
        have been made for this model's structure; a hand-written plan is given as ``--cuts`` and
        ``--interval`` instead, which the message spells out."""
        if plan.model is None:
            raise InputError(f"the plan does not say which model it was made for, so it cannot be checked against "
                             f"--model {self.config.model.name}: make it with adaptplan plan --profile (which records the "
                             f"model), or give it as --cuts {','.join(map(str, plan.cuts))} --interval {plan.interval}",
                             field="plan.model")
        mine = self.profile.identity()
        if plan.model["num_cuts"] != mine["num_cuts"] or plan.model["structure_sha256"] != mine["structure_sha256"]:
            raise InputError(f"the plan was made for model {plan.model['name']!r} ({plan.model['num_cuts']} cut points, "
                             f"structure {plan.model['structure_sha256'][:12]}…) but --model {self.config.model.name} on "
                             f"{self.config.data.dataset} has {mine['num_cuts']} cut points (structure "
                             f"{mine['structure_sha256'][:12]}…); plan for this model (adaptplan profile + adaptplan plan)",
                             field="plan_path")

    def describe(self, event: dict[str, Any]) -> str:
        """One line saying which plan the run starts with (its plan ``event``)."""
        cuts = event["cuts"]
        counts = {c: cuts.count(c) for c in sorted(set(cuts))}
        spread = ", ".join(f"{n}× cut {c}" for c, n in counts.items())
        source = {"cuts": "--cuts", "plan": f"plan file {self.config.plan.path}", "planner": "the built-in planner",
                  "default": "the fallback (no feasible plan)", "policy": f"policy {self.config.plan.policy}",
                  "whole-model": f"{self.config.algorithm} (no split: the whole model on every device)"}[event["source"]]
        extra = ""
        if "plan" in event and self.calibration is not None:
            calibration = self.calibration
            extra = (f"; predicted {event['plan']['rounds']} rounds, {event['plan']['total_latency_s']:.4g} simulated s "
                     f"to {self.config.run.target_accuracy:.1%} test accuracy (eq. 26, calibrated on "
                     f"{len(calibration.pilots)} pilot{'s' if len(calibration.pilots) > 1 else ''}: {calibration.message})")
        elif "plan" in event:
            extra = (f"; predicted {event['plan']['rounds']} rounds, {event['plan']['total_latency_s']:.4g} s (eq. 26, "
                     f"to an ε-stationary point of {self._constants_origin(event)}; --pilots and --target-accuracy predict "
                     "to an accuracy)")
        budget = f", every device within the leakage budget {self.config.plan.max_leakage}" if self.leakage else ""
        return (f"plan from {source}: {spread} of {len(self.blocks)} cut points{budget}, "
                f"{self._describe_interval(event)}{extra}")

    def _constants_origin(self, event: dict[str, Any]) -> str:
        """Where the constants of an uncalibrated plan come from, said in the plan's line (issue 66 item 2: never
        silently the placeholders)."""
        if "constants" in event:
            return "the constants estimated from this run's initial model and data (--reestimate, Algorithm 1)"
        if self.constants is None:
            return ("docs/model.md §6.1's placeholder constants, not this run's (--reestimate estimates them from this "
                    "run; --pilots N fits them to this run)")
        return f"the constants of {self.config.value('constants_path')}" if self.config.value("constants_path") \
            else "the constants given"

    def _describe_interval(self, event: dict[str, Any]) -> str:
        """What the interval means for this algorithm: none for those that never average client models, GAS's
        own buffer, and where AdaptSFL's I = 1 comes from when --cuts replaced the plan."""
        if self.strategy.asynchronous:
            return "asynchronous: a round is one global iteration (its model buffer decides the averaging)"
        if not self.strategy.averages_clients:
            return "client models never averaged"
        text = f"interval I = {event['interval']}"
        if event["source"] == "cuts" and self.config.plan.interval is None and self.algorithm.planned_interval:
            text += " (--cuts without --interval: give --interval I, or leave out --cuts for the planner's I)"
        return text

    def _planned_interval(self, interval: int) -> int:
        """The planner's I is the decision of an algorithm that takes it (AdaptSFL, the registry's
        ``planned_interval``); SplitFed and the others aggregate every round (I = 1) unless ``--interval`` says
        otherwise — only the cuts are taken from the plan. A ``--policy`` decides the interval for every algorithm."""
        return interval if self.algorithm.planned_interval or self.config.plan.policy is not None else 1

    def _one_client_model(self, cuts: list[int]) -> list[int]:
        """An algorithm of one client model (vanilla SL) hands it from device to device: all devices at the
        deepest planned cut."""
        return [max(cuts)] * len(cuts) if self.algorithm.one_client_model else list(cuts)

    def maybe_replan(self, t: int, aggregated: bool, engine: SplitEngine, clock: SimClock, measured_rates: MeasuredRates,
                     events: list[dict[str, Any]]) -> bool:
        """Algorithm 1: at an aggregation round, if Q rounds passed since the last
        re-plan, call the planner with the measured system of the next round and re-partition without
        losing state. ``config.plan.interval``, if set, overrides the planner's I here too. An infeasible
        re-plan keeps the plan in force and records a ``replan-infeasible`` event with the reason."""
        Q = self.replan_every
        if not Q or not aggregated or t - self.last_replan < Q:
            return False
        system = dataclasses.replace(clock.process.measured(t + 1), batch_size=self.config.data.batch_size)
        if measured_rates.rates:              # a runtime of processes: the rates it measured so far
            system = measured_rates.fitted(system)
        old = (list(engine.cuts), engine.interval)
        self.last_replan = t
        estimated = self.planning_constants(t, engine.global_model()) if self.config.plan.reestimate else None
        try:
            cuts, interval, details = decision(self.planner(ReplanRequest(t, system, self.profile, *old, estimated,
                                                                          self.candidates, self.leakage)))
            cuts = self._one_client_model(cuts)
            outside = self.over_budget(cuts)
            if outside is not None:
                raise InfeasibleError(outside)
        except InfeasibleError as exc:             # keep the plan in force, say why
            events.append({"round": t, "event": "replan-infeasible", "reason": str(exc),
                                        "cuts": old[0], "interval": old[1]})
            return False
        interval = self.config.plan.interval or self._planned_interval(interval)
        engine.set_cuts(cuts, t)
        engine.interval = interval
        if estimated is not None:
            details = {**details, "constants": estimated.to_json()}
        if measured_rates.rates:
            details = {**details, "system_from": "measured"}
        events.append({"round": t, "event": "replan", "old_cuts": old[0], "old_interval": old[1],
                                    "cuts": cuts, "interval": interval, **details})
        return True

    def planning_constants(self, t: int, model: torch.nn.Sequential) -> ConvergenceConstants:
        """Algorithm 1 (docs/model.md §5.4) with ``--reestimate``: β, σ_j², G_j² and ϑ estimated from the run's own
        ``model`` — its initial blocks before round 1 (the algorithm's first line), the global model of the
        aggregation round at a re-plan — on 8 mini-batches of its training data (seed t), with γ = --lr and the
        target ε in force (the constants file's, else the placeholder's); then the calibration's fit (--pilots),
        else an unreachable ε raised to twice the noise floor (as for placeholders)."""
        epsilon = (self.constants.epsilon if self.constants is not None
                   else ConvergenceConstants.placeholder(self.profile.num_cuts).epsilon)
        estimated = run_constants(self.run_data, model, t, epsilon)
        devices = self.config.data.devices
        return self.calibration.apply(estimated, devices) if isinstance(self.calibration, Calibration) \
            else estimated.reachable(devices)
