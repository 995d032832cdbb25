"""`--policy` in the training loop (docs/model.md §6.2): random policies re-draw at every aggregation,
seeded; the others decide once; incompatible options are named."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from adaptplan.errors import InfeasibleError, InputError
from trainers.config.train_config import TrainConfig
from trainers.run.driver import Trainer
from trainers.run.policies import NEVER, REDRAWING

RUN = dict(dataset="synthetic", devices=20, batch_size=8, lr=0.05, rounds=10, eval_every=5, threads=1, model_width=4)


def decisions(policy: str, seed: int = 0) -> list[tuple[int, int, tuple[int, ...]]]:
    history = Trainer(TrainConfig.flat(**RUN, policy=policy, seed=seed)).run()
    return [(e["round"], e["interval"], tuple(e["cuts"])) for e in history.events], history


@pytest.mark.parametrize("policy", REDRAWING)
def test_random_policies_redraw_at_every_aggregation(policy: str) -> None:
    events, history = decisions(policy)
    aggregated = [r.round for r in history.records if r.aggregated]
    assert [e[0] for e in events[1:]] == aggregated            # one decision after each aggregation, no other
    for (start, interval, _), nxt in zip(events, events[1:]):
        assert nxt[0] == start + interval                      # the decided interval is the one trained
        assert 1 <= interval <= 25                              # RMA's U{1..25} (docs/model.md §6.2) and Theorem 2's range
    assert decisions(policy)[0] == events                       # seeded: the same draws again


def test_random_draws_depend_on_the_seed_and_vary_between_aggregations() -> None:
    events, _ = decisions("rma+rms")
    other, _ = decisions("rma+rms", seed=1)
    assert events != other
    assert len({e[1:] for e in events}) > 1                     # re-drawn, not repeated


def test_deterministic_policies_decide_once() -> None:
    for policy in ("sfl", "psl", "adaptsfl"):
        events, history = decisions(policy)
        assert len(events) == 1 and events[0][0] == 0
        if policy == "sfl":
            assert events[0][1] == 1 and all(r.aggregated for r in history.records)
        if policy == "psl":
            assert events[0][1] == NEVER and not any(r.aggregated for r in history.records)
    history = Trainer(TrainConfig.flat(**RUN, policy="fixed-cut", cuts=(2,))).run()
    assert set(history.events[0]["cuts"]) == {2} and history.events[0]["source"] == "policy"


@pytest.mark.parametrize("options, field", [
    (dict(policy="psl", interval=3), "interval"),
    (dict(policy="rma+rms", cuts=(2,)), "cuts"),
    (dict(policy="fixed-cut"), "cuts"),
    (dict(policy="sfl", replan_every=2), "replan_every"),
    (dict(policy="adaptsfl", plan_path="plan.json"), "policy"),
    (dict(policy="random"), "policy"),
])
def test_incompatible_policy_options_are_named(options, field) -> None:
    with pytest.raises(InputError) as info:
        TrainConfig.flat(**RUN, **options)
    assert info.value.field == field


def test_reestimation_feeds_the_runs_own_constants_to_the_planner() -> None:
    from adaptplan.constants import ConvergenceConstants
    from profilers.chain import Chain
    from profilers.gradstats import estimate_constants, iterate_batches

    seen = []

    def planner(request):
        if request.round:
            trainer = holder[0]
            chain = Chain(trainer.engine.averaged_model(), list(trainer.block_names))
            batches = iterate_batches(trainer.dataset.x_train, trainer.dataset.y_train, 8, 8, seed=request.round)
            seen.append((request.constants, estimate_constants(chain, batches, gamma=0.05, epsilon=0.1, seed=request.round)))
        return [2] * 20, 2

    holder = []
    config = TrainConfig.flat(**{**RUN, "rounds": 4}, replan_every=2, reestimate=True)
    holder.append(Trainer(config, planner=planner))
    history = holder[0].run()
    assert len(seen) == 2
    placeholder = ConvergenceConstants.placeholder(holder[0].profile.num_cuts)
    for given, independent in seen:
        assert given == independent                       # the model at that round, its own data, γ = --lr
        assert given.beta != placeholder.beta and given.gamma == 0.05
    assert [e["constants"]["beta"] for e in history.events[1:]] == [c.beta for c, _ in seen]
    with pytest.raises(InputError) as info:
        TrainConfig.flat(**RUN, reestimate=True)
    assert info.value.field == "reestimate"


def test_fixed_cut_puts_every_device_at_the_cut_given() -> None:
    for devices in (1, 3):
        trainer = Trainer(TrainConfig.flat(**{**RUN, "devices": devices, "rounds": 1, "lr": 0.001}, policy="fixed-cut",
                                      cuts=(3,)))     # a small γ: the target ε is reachable with one device
        assert trainer.engine.cuts == trainer.history.events[0]["cuts"] == [3] * devices


def test_never_is_beyond_the_longest_run() -> None:
    from adaptplan.limits import MAX_STEPS

    assert NEVER >= MAX_STEPS         # PSL's interval: no run (at most MAX_STEPS rounds) ever reaches an aggregation


torch.set_num_threads(1)


def test_a_baseline_that_finds_no_plan_is_an_infeasible_error(monkeypatch) -> None:
    from adaptplan.scenarios import default_scenario
    from solvers import baselines
    from trainers.run.driver import ReplanRequest
    from trainers.run.policies import policy_planner

    failed = SimpleNamespace(success=False, message="no cut vector reaches the target", cuts=(1,), interval=1)
    monkeypatch.setattr(baselines, "solve_fixed_cut", lambda problem, cut: failed)
    scenario = default_scenario()
    plan = policy_planner("fixed-cut", scenario.constants, 0.01, seed=0, fixed_cut=2)
    with pytest.raises(InfeasibleError, match="no cut vector reaches the target"):
        plan(ReplanRequest(0, scenario.system, scenario.profile, [], 1))


def test_a_policy_that_never_aggregates_outlasts_any_run() -> None:
    from adaptplan.limits import MAX_STEPS
    from trainers.run.policies import NEVER

    assert NEVER >= MAX_STEPS           # PSL's interval: no run the config accepts reaches an aggregation before it ends
