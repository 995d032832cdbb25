"""The training run (trainers.run.driver, trainers.config.train_config, the run folder, checkpoints, histories): what a run
accepts, refuses, records and says, on tiny synthetic runs (a few seconds each)."""

from __future__ import annotations

import dataclasses
import math
import os

import pytest
import torch

from adaptplan.constants import ConvergenceConstants
from adaptplan.convergence import step_note
from adaptplan.errors import InfeasibleError, InputError
from profilers.chain import Chain
from profilers.gradstats import estimate_constants, iterate_batches
from trainers.config.train_config import TrainConfig
from trainers.run.driver import ReplanRequest, Trainer

torch.set_num_threads(1)

TINY = dict(dataset="synthetic", devices=2, batch_size=4, model_width=4, eval_every=2, threads=1, lr=0.05,
            max_test_samples=40, progress=False)


def error(call) -> InputError:
    with pytest.raises(InputError) as info:
        call()
    return info.value


# ---- config -------------------------------------------------------------------------------------------------------
def test_ranks_are_at_most_every_device_plus_the_two_servers() -> None:
    # 10,000 devices (README input limits) on their own ranks, plus the edge server and the fed server
    assert TrainConfig.flat(**TINY, distributed=True, ranks=10_002).runtime.ranks == 10_002
    e = error(lambda: TrainConfig.flat(**TINY, distributed=True, ranks=10_003))
    assert (e.field, e.message) == ("ranks", "must be at most 10,002 ranks, got 10003")
    assert TrainConfig.flat(**TINY, distributed=True, ranks=3).runtime.ranks == 3
    e = error(lambda: TrainConfig.flat(**TINY, distributed=True, ranks=2))
    assert e.field == "ranks" and e.message.startswith("a distributed run needs at least 3 ranks")


def test_fixed_cut_policy_needs_one_cut_for_every_device() -> None:
    assert TrainConfig.flat(**TINY, policy="fixed-cut", cuts=(2,)).plan.cuts == (2, 2)
    assert TrainConfig.flat(**TINY, policy="fixed-cut", cuts=(3, 3)).plan.cuts == (3, 3)
    for cuts in (None, (1, 2)):
        e = error(lambda: TrainConfig.flat(**TINY, policy="fixed-cut", cuts=cuts))
        assert (e.field, e.message) == ("cuts", "--policy fixed-cut needs one cut for every device: --cuts J")


# ---- constants given to a run ----------------------------------------------------------------------------------
def test_constants_must_fit_the_model_and_the_learning_rate() -> None:
    L = Trainer(TrainConfig.flat(**TINY, rounds=1, cuts=(1,))).profile.num_cuts
    good = ConvergenceConstants.training_placeholder(L, 0.05, 2)
    trainer = Trainer(TrainConfig.flat(**TINY, rounds=1, cuts=(1,)), constants=good)
    assert trainer.constants is good
    # γ within a relative 1e-9 of --lr is the same learning rate
    close = dataclasses.replace(good, gamma=0.05 * (1 + 1e-12))
    assert Trainer(TrainConfig.flat(**TINY, rounds=1, cuts=(1,)), constants=close).constants is close
    e = error(lambda: Trainer(TrainConfig.flat(**TINY, rounds=1, cuts=(1,)), constants=dataclasses.replace(good, gamma=0.01)))
    assert (e.field, e.message) == ("constants_path", "the constants' gamma = 0.01 is not the learning rate --lr 0.05; "
                                                      "the plan (Corollary 1) must use the learning rate that trains")
    short = ConvergenceConstants.training_placeholder(L - 1, 0.05, 2)
    e = error(lambda: Trainer(TrainConfig.flat(**TINY, rounds=1, cuts=(1,)), constants=short))
    assert e.field == "constants_path"
    assert e.message.startswith(f"the constants have {L - 1} cut points but cnn has {L}; estimate them for this model")


# ---- plans ------------------------------------------------------------------------------------------------------
def test_describe_plan_names_the_source_the_spread_and_the_prediction() -> None:
    trainer = Trainer(TrainConfig.flat(**{**TINY, "devices": 3}, rounds=1, cuts=(2, 1, 2), interval=3))
    L = trainer.profile.num_cuts
    assert trainer.describe_plan() == f"plan from --cuts: 1× cut 1, 2× cut 2 of {L} cut points, interval I = 3"
    planned = Trainer(TrainConfig.flat(**{**TINY, "lr": 0.01}, rounds=1))
    event = planned.history.events[0]
    assert event["source"] == "planner"
    text = planned.describe_plan()
    assert text.startswith("plan from the built-in planner: ")
    assert text.endswith(f"interval I = {event['interval']}; predicted {event['plan']['rounds']} rounds, "
                         f"{event['plan']['total_latency_s']:.4g} s (eq. 26, to an ε-stationary point of docs/model.md "
                         "§6.1's placeholder constants, not this run's (--reestimate estimates them from this run; "
                         "--pilots N fits them to this run); --pilots and "
                         "--target-accuracy predict to an accuracy)")                     # issue 66: never silently
    assert "placeholder constants, not this run's (--reestimate estimates them from this run; --pilots N" in text
    again = Trainer(TrainConfig.flat(**{**TINY, "lr": 0.01}, rounds=1, reestimate=True, replan_every=1)).describe_plan()
    assert ("to an ε-stationary point of the constants estimated from this run's initial model and data "
            "(--reestimate, Algorithm 1); --pilots") in again and "placeholder" not in again
    given = Trainer(TrainConfig.flat(**{**TINY, "lr": 0.01}, rounds=1),
                    constants=ConvergenceConstants.training_placeholder(L, 0.01, 2)).describe_plan()
    assert "to an ε-stationary point of the constants given;" in given


def test_the_step_note_is_for_the_constants_the_first_plan_used() -> None:
    """γ > 1/β is said once (docs/model.md §10 item 5) for the constants the plan was made with: the ones given, or
    with --reestimate the ones estimated from the initial model (recorded in the plan event)."""
    L = Trainer(TrainConfig.flat(**TINY, rounds=1, cuts=(1,))).profile.num_cuts
    given = ConvergenceConstants.training_placeholder(L, 0.5, 2)             # β = 5: 1/β = 0.2 < γ = 0.5
    notes = Trainer(TrainConfig.flat(**{**TINY, "lr": 0.5}, rounds=1), constants=given).notes
    assert [n for n in notes if "1/beta" in n] == [step_note(given)] and "1/beta = 0.2 (beta = 5)" in step_note(given)
    estimated = Trainer(TrainConfig.flat(**{**TINY, "lr": 0.5}, rounds=1, reestimate=True, replan_every=1))
    constants = ConvergenceConstants.from_json(estimated.history.events[0]["constants"])
    assert constants.beta != 5 and 1 / constants.beta < 0.5
    assert [n for n in estimated.notes if "1/beta" in n] == [step_note(constants)]
    # a plan not made with the constants (--cuts) gets no note about them
    cut = Trainer(TrainConfig.flat(**{**TINY, "lr": 0.5}, rounds=1, cuts=(1,)), constants=given)
    assert cut.history.events[0]["source"] == "cuts" and not any("1/beta" in n for n in cut.notes)


def test_a_planner_answer_is_taken_per_algorithm() -> None:
    def planner(request):
        return [1, 3], 4

    adapt = Trainer(TrainConfig.flat(**TINY, rounds=1, algorithm="adaptsfl"), planner=planner)
    assert (adapt.engine.cuts, adapt.engine.interval) == ([1, 3], 4)
    # SplitFed takes the planner's cuts but aggregates every round; --interval overrides both
    sfl = Trainer(TrainConfig.flat(**TINY, rounds=1, algorithm="sfl-v2"), planner=planner)
    assert (sfl.engine.cuts, sfl.engine.interval) == ([1, 3], 1)
    assert Trainer(TrainConfig.flat(**TINY, rounds=1, algorithm="sfl-v2", interval=5), planner=planner).engine.interval == 5
    # vanilla SL: one client model, every device at the deepest planned cut
    assert Trainer(TrainConfig.flat(**TINY, rounds=1, algorithm="sl"), planner=planner).engine.cuts == [3, 3]
    assert Trainer(TrainConfig.flat(**TINY, rounds=1, algorithm="adaptsfl"), planner=planner).history.events[0] == {
        "round": 0, "event": "plan", "source": "planner", "cuts": [1, 3], "interval": 4}


def test_an_infeasible_replan_keeps_the_plan_in_force() -> None:
    calls = []

    def planner(request: ReplanRequest):
        calls.append(request.round)
        if request.round == 0:
            return [2, 2], 2
        raise InfeasibleError("no luck this time", field="constants")

    trainer = Trainer(TrainConfig.flat(**TINY, rounds=4, replan_every=2), planner=planner)
    history = trainer.run()
    assert calls == [0, 2, 4]
    assert history.events[1:] == [
        {"round": 2, "event": "replan-infeasible", "reason": "constants: no luck this time", "cuts": [2, 2], "interval": 2},
        {"round": 4, "event": "replan-infeasible", "reason": "constants: no luck this time", "cuts": [2, 2], "interval": 2}]
    assert not any(r.replanned for r in history.records) and trainer.engine.cuts == [2, 2]


def test_a_replan_uses_the_rates_the_run_measured_so_far_not_the_generated_system() -> None:
    """Issue 66 item 5: once a runtime of processes measured rates (Trainer.measured_rates), a re-plan is given the
    system fitted to them (each measured field the median of its rates, the rest as generated) and says so."""
    from adaptplan.measured_system import MeasuredRates

    systems = []

    def planner(request: ReplanRequest):
        systems.append(request.system)
        return [2, 2], 2

    trainer = Trainer(TrainConfig.flat(**TINY, rounds=2, replan_every=2), planner=planner)
    trainer.measured_rates = MeasuredRates({"devices[1].up_bps": [3e5, 1e5, 2e5], "server_flops": [4e8]})
    history = trainer.run()
    generated = dataclasses.replace(trainer.clock.process.measured(3), batch_size=trainer.config.data.batch_size)
    assert len(systems) == 2 and systems[0] == trainer.clock.system(1)            # the first plan: nothing measured yet
    assert systems[1].devices[1].up_bps == 2e5 and systems[1].server_flops == 4e8
    assert systems[1] == dataclasses.replace(generated, server_flops=4e8, devices=(
        generated.devices[0], dataclasses.replace(generated.devices[1], up_bps=2e5)))
    assert history.events[1]["system_from"] == "measured"


def test_after_a_replan_moves_a_block_back_to_the_server_the_global_model_takes_the_trained_one() -> None:
    """Found measuring the AdaptSFL recipe under Algorithm 1 (issue 66 item 6): block 2 went to the devices at a
    re-plan (averaged there by the fed server) and back to the server at the next; the global model kept the fed
    server's stale average of it instead of the server's block trained since, so the test accuracy stalled at
    ~30 % while the training loss fell as with fixed cuts."""
    plans = {0: [1, 1], 1: [2, 2], 2: [1, 1], 3: [1, 1]}

    def planner(request: ReplanRequest):
        return plans[request.round], 1

    trainer = Trainer(TrainConfig.flat(**TINY, algorithm="adaptsfl", rounds=3, replan_every=1), planner=planner)
    history = trainer.run()
    assert [e["cuts"] for e in history.events] == [[1, 1], [2, 2], [1, 1], [1, 1]]
    engine = trainer.engine
    assert 1 in engine.global_sizes                                  # the fed server still holds an average of it
    shared = engine.edge.instances[(None, 1)]
    assert engine.global_model()[1] is shared


def test_an_infinite_training_loss_of_finite_models_stops_the_round_naming_the_device() -> None:
    """Issue 67 E7: finite activations of 3·10³⁸ gave every later round an infinite loss and the run exited 0; the
    round's loss is checked as the models are (a divergence: the driver stops the run with one line)."""
    from trainers.roles.messages import NonFiniteError

    engine = Trainer(TrainConfig.flat(**TINY, rounds=1, cuts=(2,))).engine
    ctx = engine.context(1)
    ctx.losses = {0: torch.tensor(1.0), 1: torch.tensor(float("inf"))}
    with pytest.raises(NonFiniteError, match=r"^training loss inf at round 1, device 1$"):
        engine.round_stats(ctx, False, [0, 1], 0.0)
    ctx.losses = {0: torch.tensor(1.0), 1: torch.tensor(3.0)}
    assert engine.round_stats(ctx, False, [0, 1], 0.0).loss == 2.0
    ctx.losses = {}                                                  # nobody reported a loss: NaN, not a divergence
    assert math.isnan(engine.round_stats(ctx, False, [0, 1], 0.0).loss)


def test_no_plan_without_fallback_says_what_the_fallback_would_be() -> None:
    def planner(request):
        raise InfeasibleError("target out of reach", field="constants.epsilon")

    with pytest.raises(InfeasibleError) as info:
        Trainer(TrainConfig.flat(**TINY, rounds=1), planner=planner)
    L = Trainer(TrainConfig.flat(**TINY, rounds=1, cuts=(1,))).profile.num_cuts
    assert info.value.field == "constants.epsilon"
    assert info.value.message == (
        "the planner found no plan: target out of reach. Give the plan yourself (--cuts, --plan), change the target "
        f"(--constants), or pass --allow-fallback to train every device at cut {math.ceil(L / 2)} of {L} with I = 1")
    fallback = Trainer(TrainConfig.flat(**TINY, rounds=1, allow_fallback=True, interval=3), planner=planner)
    assert fallback.engine.cuts == [math.ceil(L / 2)] * 2 and fallback.engine.interval == 3     # --interval still holds
    assert fallback.history.events[0]["reason"] == "constants.epsilon: target out of reach"


# ---- evaluation ---------------------------------------------------------------------------------------------------
def test_a_run_not_ending_on_an_eval_round_gets_a_final_evaluation() -> None:
    trainer = Trainer(TrainConfig.flat(**TINY, rounds=3, cuts=(2,)))
    history = trainer.run()
    assert [r.round for r in history.evaluated] == [2]
    final = history.meta["final_evaluation"]
    acc, loss, local, sampled = trainer.evaluate(history.records[-1].participants)   # leaves the models untouched
    assert final == {"round": 3, "accuracy": acc, "test_loss": loss, "local_accuracy": local,
                     "local_sampled_accuracy": sampled, "sim_seconds": history.records[-1].sim_seconds}
    assert history.final_local_sampled_accuracy == sampled is not None
    assert history.final_local_accuracy == local and 0.0 <= local <= 1.0
    assert history.final_accuracy == acc and 0.0 <= acc <= 1.0
    # a run ending on an evaluation round has none (and drops a stale one)
    ends = Trainer(TrainConfig.flat(**TINY, rounds=4, cuts=(2,)))
    ends.history.meta["final_evaluation"] = {"round": 0, "accuracy": 0.5, "test_loss": 1.0, "sim_seconds": 0.0}
    history = ends.run()
    assert "final_evaluation" not in history.meta and [r.round for r in history.evaluated] == [2, 4]
    assert history.final_accuracy == history.records[-1].accuracy


def test_max_test_samples_evaluates_on_the_first_k_test_samples() -> None:
    trainer = Trainer(TrainConfig.flat(**TINY, rounds=1, cuts=(2,)))
    assert torch.equal(trainer.engine.data.x_test, trainer.dataset.x_test[:40])
    assert torch.equal(trainer.engine.data.y_test, trainer.dataset.y_test[:40])
    every = Trainer(TrainConfig.flat(**{**TINY, "max_test_samples": None}, rounds=1, cuts=(2,)))
    assert every.engine.data.x_test.shape[0] == 400                  # the synthetic test split


# ---- data files ---------------------------------------------------------------------------------------------------
class _Payload:
    def __init__(self, marker) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickled_object_in_a_data_file_is_refused_and_never_runs(tmp_path) -> None:
    import numpy as np

    from trainers.inputs.datasets import load_dataset

    marker = tmp_path / "pwned"
    labels = np.empty(10, dtype=object)
    labels[:] = [_Payload(marker)] * 10
    np.savez(tmp_path / "mnist_test.npz", x=np.zeros((10, 1, 28, 28), np.uint8), y=labels)
    e = error(lambda: load_dataset("mnist-subset", root=tmp_path))
    assert e.field == "--data-root"
    assert e.message.startswith(f"{str(tmp_path / 'mnist_test.npz')!r} is not a readable .npz file (ValueError: ")
    assert "allow_pickle=False" in e.message
    assert not marker.exists()


# ---- histories ------------------------------------------------------------------------------------------------------
def _record_json(**kw) -> dict:
    from dataclasses import asdict

    from trainers.run.history import RoundRecord

    return {**asdict(RoundRecord(1, 1.0, 0.5, 0.5, 1.0, 1.0, 0.1, 10, 10, 0, True, False, [1], 1)), **kw}


def test_a_rounds_traffic_fits_a_signed_64_bit_count() -> None:
    from trainers.run.history import History

    most = 2**63 - 1
    h = History.from_json({"records": [_record_json(bytes_up=most, bytes_down=0, bytes_server=most)]})
    assert (h.records[0].bytes_up, h.records[0].bytes_server) == (most, most)
    for name in ("bytes_up", "bytes_down", "bytes_server"):
        e = error(lambda: History.from_json({"records": [_record_json(**{name: 2**63})]}))
        assert e.field == f"history.records[0].{name}"
        assert e.message == f"must be an integer in 0..9,223,372,036,854,775,807 bytes, got {2**63}"


def test_a_gain_of_exactly_min_gain_is_not_small() -> None:
    from trainers.run.history import History, RoundRecord

    def run(accuracies):
        return History([RoundRecord(t, 1.0, a, 1.0, float(t), 1.0, 0.0, 0, 0, 0, True, False, [1], 1)
                        for t, a in enumerate(accuracies, start=1)])

    # gains 0.25, 0.25 (not below 0.25), then 0.125, 0.0 (below): the streak of 2 ends at round 5
    h = run([0.25, 0.5, 0.75, 0.875, 0.875])
    assert h.converged_round(min_gain=0.25, patience=2, floor=0.0) == 5
    assert h.converged_round(min_gain=0.25, patience=3, floor=0.0) is None
    assert h.converged_round(min_gain=0.2500001, patience=3, floor=0.0) == 4
    # an evaluation exactly at the floor counts
    assert run([0.5, 0.5]).converged_round(min_gain=0.1, patience=1, floor=0.5) == 2


# ---- run folders ---------------------------------------------------------------------------------------------------
def test_a_run_folder_is_made_with_its_parents_and_locked_with_this_process_id(tmp_path) -> None:
    from trainers.run.folder import LOCK_NAME, RunFolder

    nested = tmp_path / "a" / "b" / "run"
    with RunFolder(nested):
        assert nested.is_dir() and not (nested / ".adaptplan-write-test").exists()
        assert (nested / LOCK_NAME).read_text() == str(os.getpid())
        e = error(lambda: RunFolder(nested).__enter__())
        assert (e.field, e.message) == ("--out", f"{str(nested)!r} is in use by another adaptplan run (process "
                                                 f"{os.getpid()}); wait for it or choose another --out")
    # a lock file left with a longer process id is rewritten, not overwritten in place
    (nested / LOCK_NAME).write_text("98765432109876")
    with RunFolder(nested):
        assert (nested / LOCK_NAME).read_text() == str(os.getpid())
    with RunFolder(nested):                   # an existing folder without a run is used as it is
        pass
    assert not (nested / LOCK_NAME).exists()  # a run that ended leaves no lock file behind (issue 65)


def test_a_lock_taken_on_a_file_its_owner_removed_is_taken_again_on_the_file_now_there(tmp_path, monkeypatch) -> None:
    """The race that removing the lock file opens: run B opens the lock file, run A removes it and lets it go, B
    locks the removed file while run C creates and locks a new one. B must see that its file is not the one at
    the name any more, and lock the file now there (here it is free: A created none)."""
    import fcntl

    from trainers.run import folder
    from trainers.run.folder import LOCK_NAME, RunFolder

    run = tmp_path / "run"
    run.mkdir()
    real_flock, removed = fcntl.flock, []

    def flock(fd: int, op: int) -> None:   # the owner removes the file between B's open and B's lock
        if not removed:
            removed.append(True)
            (run / LOCK_NAME).unlink()
        real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    with RunFolder(run) as held:
        assert removed and folder._same_file(held._fd, run / LOCK_NAME)      # holds the file at the name
        assert (run / LOCK_NAME).read_text() == str(os.getpid())
    assert not (run / LOCK_NAME).exists()


def test_mnist_subset_has_the_ten_digit_classes() -> None:
    from trainers.inputs.datasets import load_dataset

    for name in ("mnist-subset", "mnist"):             # mnist without --data-root falls back to the shipped subset
        d = load_dataset(name)
        assert (d.num_classes, d.input_shape, d.name) == (10, (1, 28, 28), "mnist-subset")
        assert set(d.y_train.tolist()) == set(range(10))


# ---- re-estimation at re-planning points ----------------------------------------------------------------------------
@pytest.mark.parametrize("given_epsilon", [None, 0.5, 1e-12])
def test_reestimated_constants_reach_the_planner_with_the_runs_lr_and_target(given_epsilon) -> None:
    seen = []

    def planner(request: ReplanRequest):
        seen.append(request.constants)
        if not request.round:            # before training: no plan in force (ReplanRequest's docstring)
            assert (request.cuts, request.interval) == ([], 1)
        return [2, 2], 2

    L = Trainer(TrainConfig.flat(**TINY, rounds=1, cuts=(1,))).profile.num_cuts
    constants = None
    if given_epsilon is not None:
        constants = dataclasses.replace(ConvergenceConstants.training_placeholder(L, 0.05, 2), epsilon=given_epsilon)
    trainer = Trainer(TrainConfig.flat(**TINY, rounds=2, replan_every=2, reestimate=True), planner=planner,
                      constants=constants)
    # Algorithm 1's first line: the first plan, before training, on constants of the initial model (seed 0)
    chain = Chain(trainer.blocks, list(trainer.block_names))
    batches = iterate_batches(trainer.dataset.x_train, trainer.dataset.y_train, TINY["batch_size"], 8, seed=0)
    initial = estimate_constants(chain, batches, gamma=0.05, epsilon=given_epsilon or 0.1, seed=0)
    assert seen[0] == initial.reachable(2) and seen[0].beta != ConvergenceConstants.placeholder(L).beta
    assert trainer.history.events[0]["constants"] == seen[0].to_json()
    history = trainer.run()
    (estimated,) = seen[1:]
    assert isinstance(estimated, ConvergenceConstants) and len(estimated.sigma2) == L
    # γ = --lr; ε = the constants' target, else the placeholder's (docs/model.md §6.1: 0.1); one at or below the
    # re-estimated noise floor βγΣσ_j²/N (unreachable) becomes twice that floor, as for the placeholders
    # (here the floor is 0.15: the placeholder's 0.1 is raised too, a given 0.5 kept)
    floor = estimated.beta * 0.05 * sum(estimated.sigma2) / 2
    assert 0.1 < floor < 0.5
    assert estimated.gamma == 0.05
    assert estimated.epsilon == (0.5 if given_epsilon == 0.5 else pytest.approx(2 * floor, rel=1e-12))
    assert estimated.beta > 0 and all(s >= 0 for s in estimated.sigma2)
    (replan,) = [e for e in history.events if e["event"] == "replan"]
    assert replan["round"] == 2 and replan["constants"] == estimated.to_json()


def test_a_placeholder_target_exactly_at_the_noise_floor_is_replaced() -> None:
    """β·γ·Σσ_j²/N = 5·0.01·2/1 = 0.1 = ε: c = 0, no plan exists, so ε becomes twice the floor."""
    at_floor = ConvergenceConstants.training_placeholder(2, 0.01, 1)
    assert at_floor.epsilon == pytest.approx(0.2, rel=1e-15)
    assert ConvergenceConstants.training_placeholder(2, 0.01, 2).epsilon == 0.1     # floor 0.05 < ε: kept


def test_constants_need_one_sigma2_and_g2_per_cut_and_only_known_keys() -> None:
    with pytest.raises(InputError, match="sigma2 has 1 entries but G2 has 2; both need one per cut point") as info:
        ConvergenceConstants(beta=5.0, gamma=0.01, theta=2.3, epsilon=0.1, sigma2=(1.0,), G2=(1e-3, 1e-3))
    assert info.value.field == "constants.G2"
    with pytest.raises(InputError, match="must have one entry per cut point") as info:
        ConvergenceConstants(beta=5.0, gamma=0.01, theta=2.3, epsilon=0.1, sigma2=(), G2=())
    assert info.value.field == "constants.sigma2"
    data = ConvergenceConstants.placeholder(3).to_json()
    assert ConvergenceConstants.from_json(data) == ConvergenceConstants.placeholder(3)
    with pytest.raises(InputError, match="delta"):
        ConvergenceConstants.from_json({**data, "delta": 1.0})


@pytest.mark.parametrize("algorithm,options,says", [
    ("psl", {}, "client models never averaged"), ("gapsl", {}, "client models never averaged"),
    ("sl", {}, "client models never averaged"), ("cyclesl", {"cycle_base": "sglr"}, "client models never averaged"),
    ("cyclesl", {"cycle_base": "sfl"}, "interval I = 1"), ("sfl-v1", {}, "interval I = 1"),
    ("gas", {"local_steps": 1}, "asynchronous: a round is one global iteration"),
    ("adaptsfl", {}, "interval I = 1 (--cuts without --interval: give --interval I"),
])
def test_the_plan_line_says_what_the_interval_means_for_the_algorithm(algorithm, options, says) -> None:
    trainer = Trainer(TrainConfig.flat(**{**TINY, "devices": 2}, algorithm=algorithm, rounds=1, cuts=(1,), extra=options))
    line = trainer.describe_plan()
    assert line.endswith(says) or f"{says}" in line
    assert ("interval I" in line) == says.startswith("interval I")
