"""FedBuff (trainers/strategies/fedbuff.py) — and CA²FL (trainers/strategies/ca2fl.py), the same loop with a
calibrated step — against buffered asynchronous federated averaging written out from the
GAS authors' baseline (baseline/FedBuff.py; docs/algorithms.md "FedBuff"): C devices training the whole model
from the global model they joined with, the device whose step arrives first going next (a heterogeneous clock: the
devices interleave), E local SGD steps, then its model buffered and its slot given to an idle device drawn from the
strategy's stream, which loads the current global model; every C buffered models averaged by |𝒟_k|."""

from __future__ import annotations

import json

import pytest
import torch

from adaptplan.cli import main
from tests.async_fl_reference import reference_buffered
from tests.engine_builders import FixedClock, flat, make_data, random_times, small_model
from tests.reference_optim import HandSGD
from trainers.engine.split_engine import SplitEngine
from trainers.roles.optim import OptimizerSpec
from trainers.strategies import make_strategy

B, LR, L = 16, 0.1, 11            # small_model: 11 blocks


@pytest.mark.parametrize(("algorithm", "N", "momentum"), [("fedbuff", 6, False), ("fedbuff", 6, True),
                                                         ("ca2fl", 6, False), ("ca2fl", 6, True), ("ca2fl", 4, False)])
def test_buffered_algorithms_train_as_their_reference(algorithm: str, N: int, momentum: bool) -> None:
    """Plain SGD, and SGD with momentum 0.9 (weight decay, clipping) that a joining device restarts; FedBuff's
    average of the buffer, CA²FL's step by every device's cached update (tests/async_fl_reference.py). With N = 4 and
    C = 3 a device that uploaded is drawn again before the first average (it starts from its own upload)."""
    C, E = 3, 2
    data = make_data(N, "dirichlet")
    clock = FixedClock(random_times(N, seed=3))
    spec = OptimizerSpec("sgd", LR, 0.9, 5e-4, 1.0) if momentum else OptimizerSpec("sgd", LR, 0.0)
    hand = HandSGD(LR, 0.9, 5e-4, 1.0) if momentum else HandSGD(LR)
    engine = SplitEngine(small_model(), [L] * N, make_strategy(algorithm, {"active": C, "local_steps": E}), data,
                         spec, batch_size=B, seed=0, clock=clock)
    calibrated = algorithm == "ca2fl"
    for t, models, global_model, order in reference_buffered(data, 5, C, E, clock.times, hand, calibrated):
        stats = engine.run_round(t)
        assert stats.aggregated and engine.strategy.models == []
        for k in range(N):
            assert torch.allclose(flat(engine.devices[k].blocks), flat(models[k]), atol=1e-6, rtol=0), (t, k)
        (evaluated,) = engine.strategy.eval_models(engine)
        assert torch.allclose(flat(evaluated), torch.cat([g.reshape(-1) for g in global_model]), atol=1e-6, rtol=0), t
    assert len(set(order[:E])) > 1                              # the clock interleaves the devices' steps
    if calibrated:
        assert len(engine.strategy.cache) == N      # by round 5 every device has uploaded once at least: N caches


def test_the_buffer_holds_c_models_and_a_resumed_buffer_is_checked() -> None:
    """C = ⌈N/2⌉ when ``--active`` is 0; a round ends at the C-th finished model; a restored buffer of C or more, or
    of something other than model uploads, is refused."""
    N = 5
    engine = SplitEngine(small_model(), [L] * N, make_strategy("fedbuff", {"local_steps": 1}), make_data(N),
                         {"lr": LR}, batch_size=B, seed=0)
    stats = engine.run_round(1)
    ctx = engine.context(1)
    assert engine.strategy.active_count(ctx) == 3 and len(stats.participants) == 3
    strategy = engine.strategy
    upload = strategy.on_model(ctx, engine.devices[0].upload(1, range(L), 1.0))
    assert upload is None and len(strategy.models) == 1
    strategy.check_state(ctx)
    strategy.load_state_dict({"models": [strategy.models[0]] * 3})
    with pytest.raises(ValueError, match="fewer than C = 3 model uploads"):
        strategy.check_state(ctx)
    strategy.load_state_dict({"models": ["not an upload"]})
    with pytest.raises(ValueError, match="fewer than C = 3 model uploads"):
        strategy.check_state(ctx)


@pytest.mark.parametrize("algorithm", ["fedbuff", "ca2fl"])
def test_train_resumes_a_buffered_algorithm_to_the_same_rounds(tmp_path, algorithm: str) -> None:
    """A run stopped after round 2 and resumed to 4 trains the rounds a run of 4 trains: the same participants,
    losses, accuracies, bytes and simulated seconds (the buffer and the loop's state in the checkpoint; CA²FL's
    caches, start models and calibrated global model too)."""
    base = ["train", "--algorithm", algorithm, "--devices", "4", "--dataset", "synthetic", "--model", "mlp",
            "--no-progress", "--local-steps", "2", "--active", "2", "--eval-every", "1", "--threads", "1",
            "--checkpoint-every", "1"]
    assert main([*base, "--rounds", "4", "--out", str(tmp_path / "whole")]) == 0
    assert main([*base, "--rounds", "2", "--out", str(tmp_path / "part")]) == 0
    assert main([*base, "--rounds", "4", "--resume", "--out", str(tmp_path / "part")]) == 0
    keys = ("round", "participants", "train_loss", "accuracy", "bytes_up", "bytes_down", "sim_seconds")
    whole, part = ([{k: r[k] for k in keys} for r in json.loads((tmp_path / run / "history.json").read_text())["records"]]
                   for run in ("whole", "part"))
    assert len(whole) == 4 and whole == part
