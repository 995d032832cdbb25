"""A leakage budget inside the training loop (issue 71 item 4; `train --leakage-table FILE --max-leakage M=LIMIT`):
the run's first plan and every re-plan keep each device within its budget, whoever made the plan; a loose budget
changes nothing; what the budget cannot admit is refused, naming its option (exit 2 on the command line)."""

from __future__ import annotations

import json

import pytest
import torch

from adaptplan.cli import main
from adaptplan.calibration import PilotRun
from adaptplan.errors import InfeasibleError, InputError
from adaptplan.leakage_table import LeakageTable
from adaptplan.linear_rounds import LinearRounds
from adaptplan.plan import Plan
from trainers.config.train_config import TrainConfig
from trainers.run.driver import ReplanRequest, Trainer
from trainers.run.planning import linear_planner

torch.set_num_threads(1)

TINY = dict(dataset="synthetic", devices=3, batch_size=4, model_width=4, eval_every=2, threads=1, lr=0.05,
            max_test_samples=40, progress=False, rounds=2)


@pytest.fixture(scope="module")
def profile():
    return Trainer(TrainConfig.flat(**TINY, cuts=(1,))).profile


def write_table(path, profile, dcor, defence="none"):
    """A leakage table of the run's model whose dCor at cut j is dcor[j − 1] (figures chosen, not measured)."""
    assert len(dcor) == profile.num_cuts - 1
    LeakageTable(profile.identity(), "synthetic", 64, {"dcor": list(dcor)}, defence).save(path)
    return str(path)


def dcor_table(tmp_path, profile):
    """dCor falling with depth: 0.9 at cut 1, 0.8 at cut 2, …"""
    return write_table(tmp_path / "leak.json", profile, [0.9 - 0.1 * j for j in range(profile.num_cuts - 1)])


def error(call) -> InputError:
    with pytest.raises(InputError) as info:
        call()
    return info.value


def test_the_planner_sees_the_budget_and_its_plan_keeps_every_device_within_it(tmp_path, profile) -> None:
    """The built-in planner plans within the budget (device 1 held to the deepest cut alone); a budget that admits
    every cut plans as no budget does; the run's line says the budget holds."""
    table = dcor_table(tmp_path, profile)
    L = profile.num_cuts
    free = Trainer(TrainConfig.flat(**TINY)).engine.cuts
    loose = Trainer(TrainConfig.flat(**TINY, leakage_table=table, max_leakage="dcor=0.9")).engine.cuts
    assert loose == free
    deepest = 0.9 - 0.1 * (L - 2)
    trainer = Trainer(TrainConfig.flat(**TINY, leakage_table=table, max_leakage=f"dcor=0.9,{deepest + 1e-9},0.9"))
    assert trainer.engine.cuts[1] == L - 1 and all(1 <= c <= L - 1 for c in trainer.engine.cuts)
    assert trainer.planning.leakage.limits.tolist() == [0.9, deepest + 1e-9, 0.9]
    seen = []

    def planner(request: ReplanRequest):
        seen.append(request.leakage)
        return [L - 1] * 3, 1

    Trainer(TrainConfig.flat(**TINY, leakage_table=table, max_leakage="dcor=0.85"), planner=planner)
    assert seen[0].metric == "dcor" and seen[0].limits.tolist() == [0.85] * 3
    assert seen[0].values.tolist() == pytest.approx([0.9 - 0.1 * j for j in range(L - 1)])


def test_the_rounds_law_planner_plans_within_the_budget(tmp_path, profile) -> None:
    """linear_planner hands the budget to the law's plan: under dcor ≤ the deepest cut's figure every device is there,
    where the unbudgeted law plans shallower."""
    trainer = Trainer(TrainConfig.flat(**TINY, leakage_table=dcor_table(tmp_path, profile), max_leakage="dcor=0.9"))
    pilots = (PilotRun("a", 1, 1, 0.5, 100.0), PilotRun("b", 8, 1, 0.5, 100.0))
    law = LinearRounds(100.0, 0.0, 0.5, pilots, "by hand: κ = 0")
    system = trainer.clock.system(1)
    free = linear_planner(law)(ReplanRequest(0, system, profile, [], 1))
    L = profile.num_cuts
    assert min(free.cuts) < L - 1
    deepest = 0.9 - 0.1 * (L - 2) + 1e-9
    budget = dataclass_replace(trainer.planning.leakage, limits=[deepest] * 3)
    held = linear_planner(law)(ReplanRequest(0, system, profile, [], 1, leakage=budget))
    assert list(held.cuts) == [L - 1] * 3


def dataclass_replace(budget, limits):
    import numpy as np

    from solvers.leakage_budget import LeakageBudget

    return LeakageBudget(budget.metric, budget.values, np.asarray(limits, dtype=float))


def test_cuts_a_plan_file_and_the_fallback_outside_the_budget_are_refused_naming_their_option(tmp_path,
                                                                                               profile) -> None:
    table = dcor_table(tmp_path, profile)
    budget = dict(leakage_table=table, max_leakage="dcor=0.85")
    e = error(lambda: Trainer(TrainConfig.flat(**TINY, **budget, cuts=(2, 1, 2))))
    assert (e.field, e.message) == ("cuts", "device 1 at cut 1 (dcor 0.9) is outside its leakage budget (dcor at most "
                                            "0.85): give cuts within it, or leave the cuts to the planner")
    assert Trainer(TrainConfig.flat(**TINY, **budget, cuts=(2,))).engine.cuts == [2, 2, 2]
    plan = tmp_path / "plan.json"
    Plan(interval=1, cuts=(2, 2, 1), rounds=1, aggregations=1, round_latency_s=1.0, aggregation_latency_s=0.0,
         total_latency_s=1.0, objective_s=1.0, model=profile.identity()).save(plan)
    assert error(lambda: Trainer(TrainConfig.flat(**TINY, **budget, plan_path=str(plan)))).field == "plan_path"

    def infeasible(request: ReplanRequest):
        raise InfeasibleError("no plan")

    fallback = (profile.num_cuts + 1) // 2           # ceil(L/2)
    strict = f"dcor={0.9 - 0.1 * (fallback - 1) - 0.01}"
    e = error(lambda: Trainer(TrainConfig.flat(**TINY, leakage_table=table, max_leakage=strict, allow_fallback=True),
                              planner=infeasible))
    assert e.field == "allow_fallback" and f"at cut {fallback}" in e.message
    e = error(lambda: Trainer(TrainConfig.flat(**TINY, **budget), planner=lambda r: ([2, 1, 1], 1)))
    assert e.field == "max_leakage" and e.message.startswith("device 1 at cut 1 ")     # the first outside


def test_a_replan_outside_the_budget_keeps_the_plan_in_force_and_says_why(tmp_path, profile) -> None:
    def planner(request: ReplanRequest):
        return ([2, 2, 2] if request.round == 0 else [2, 1, 2]), 1

    trainer = Trainer(TrainConfig.flat(**TINY, leakage_table=dcor_table(tmp_path, profile), max_leakage="dcor=0.85",
                                       algorithm="adaptsfl", replan_every=1), planner=planner)
    history = trainer.run()
    assert history.events[1:] == [
        {"round": r, "event": "replan-infeasible", "cuts": [2, 2, 2], "interval": 1,
         "reason": "device 1 at cut 1 (dcor 0.9) is outside its leakage budget (dcor at most 0.85)"} for r in (1, 2)]
    assert trainer.engine.cuts == [2, 2, 2]


def test_a_table_of_another_defence_or_model_and_options_without_their_pair_are_refused(tmp_path, profile) -> None:
    table = write_table(tmp_path / "noisy.json", profile, [0.5] * (profile.num_cuts - 1), "clip=1,noise=1")
    e = error(lambda: Trainer(TrainConfig.flat(**TINY, leakage_table=table, max_leakage="dcor=0.9")))
    assert e.field == "leakage_table" and e.message.endswith("measured under defence 'clip=1,noise=1', the plan is for "
                                                             "'none': measure it under the same setting (profile "
                                                             "--leakage --leakage-defence none)")
    noisy = TrainConfig.flat(**TINY, leakage_table=table, max_leakage="dcor=0.9", activation_clip=1.0,
                             activation_noise=1.0)
    assert Trainer(noisy).planning.leakage.metric == "dcor"
    assert error(lambda: TrainConfig.flat(**TINY, max_leakage="dcor=0.9")).field == "max_leakage"
    assert error(lambda: TrainConfig.flat(**TINY, leakage_table=table)).field == "leakage_table"
    e = error(lambda: TrainConfig.flat(**TINY, leakage_table=table, max_leakage="dcor=0.9", policy="rma+ms"))
    assert e.field == "policy" and "without the leakage budget" in e.message
    assert error(lambda: TrainConfig.flat(**TINY, leakage_table=table, max_leakage="dcor=0.9,0.9")).field == \
        "--max-leakage"
    plain = dcor_table(tmp_path, profile)
    e = error(lambda: Trainer(TrainConfig.flat(**TINY, leakage_table=plain, max_leakage="dcor=0.9", algorithm="fedavg")))
    assert e.field == "--max-leakage" and "no split" in e.message


def test_train_plans_within_the_budget_from_the_command_line(tmp_path, capsys) -> None:
    """`train --leakage-table --max-leakage`: the plan's line names the budget, the run folder records it; a budget
    no cut meets is one line naming the device and the smallest feasible budget, exit 2."""
    table = dcor_table(tmp_path, Trainer(TrainConfig.flat(**{**TINY, "model_width": 32}, cuts=(1,))).profile)
    argv = ["train", "--dataset", "synthetic", "--devices", "3", "--batch-size", "4", "--max-test-samples", "40",
            "--rounds", "1", "--threads", "1", "--no-progress", "--leakage-table", table]
    assert main([*argv, "--max-leakage", "dcor=0.85", "--out", str(tmp_path / "run")]) == 0
    assert "every device within the leakage budget dcor=0.85" in capsys.readouterr().err
    saved = json.loads((tmp_path / "run" / "history.json").read_text())["meta"]["config"]
    assert (saved["leakage_table"], saved["max_leakage"]) == (table, "dcor=0.85")
    assert main([*argv, "--max-leakage", "dcor=0.1"]) == 2
    assert "device 0's budget (dcor at most 0.1) admits no candidate cut" in capsys.readouterr().err
