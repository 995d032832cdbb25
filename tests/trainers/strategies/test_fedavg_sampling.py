"""FedAvg under partial participation (issue 34): in SplitFed V1/V2 and AdaptSFL a device drawn into an
aggregation period starts from the global model of the last aggregation (its client blocks, and its server
copies where the edge server keeps one per device), the participants are drawn once per period of I rounds,
and the evaluated model is that global model, never a mean over devices that hold stale or untrained models.

The reference below is FedAvg with client sampling written out with plain SGD, sharing no code with the
engine: every device i holds the blocks it owns alone (``private``: its client blocks and its per-device server
copies), the server's shared blocks are one model stepped with the |𝒟_i|-weighted mean of the participants'
gradients (eq. 4), and every I rounds the participants' private blocks are averaged (|𝒟_i|-weighted, eq. 7) into
the global model, which a device loads when it is drawn again.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn

from tests.engine_builders import flat, make_data, small_model
from trainers.engine.split_engine import STRATEGY_STREAM, SplitEngine
from trainers.inputs.partition import DeviceSampler
from trainers.strategies import make_strategy

B, LR, N, ROUNDS, RHO = 16, 0.1, 4, 3, 0.5


def draw(rng: np.random.Generator) -> list[int]:
    """⌈ρN⌉ devices uniformly without replacement (the strategy's stream, seeded [seed, 2³²−1])."""
    return sorted(int(d) for d in rng.choice(N, size=math.ceil(RHO * N), replace=False))


def fedavg_with_sampling(data, private_blocks: int, interval: int):
    """Yield (t, participants, models, global_blocks) after each round t: ``models[i]`` is device i's full
    model (its private blocks 0..private_blocks−1 and the shared server blocks, one object for all)."""
    template = small_model()
    shared = nn.Sequential(*copy.deepcopy(list(template)[private_blocks:]))
    private = [nn.Sequential(*copy.deepcopy(list(template)[:private_blocks])) for _ in range(N)]
    global_blocks = copy.deepcopy(private[0])
    sizes = [float(len(p)) for p in data.parts]
    samplers = [DeviceSampler(data.parts[i], B, [0, i]) for i in range(N)]
    rng = np.random.default_rng([0, STRATEGY_STREAM])
    stale: set[int] = set()
    participants: list[int] = []
    for t in range(1, ROUNDS + 1):
        if (t - 1) % interval == 0:                      # a new aggregation period: draw, bring the late up to date
            participants = draw(rng)
            for i in participants:
                if i in stale:
                    private[i].load_state_dict(global_blocks.state_dict())
                    stale.discard(i)
        total = sum(sizes[i] for i in participants)
        shared_grads = [torch.zeros_like(p) for p in shared.parameters()]
        own_grads = {}
        for i in participants:                           # every participant at the same w_s^{t−1}
            idx = torch.from_numpy(samplers[i].next())
            loss = nn.functional.cross_entropy(shared(private[i](data.x_train[idx])), data.y_train[idx])
            grads = torch.autograd.grad(loss, list(private[i].parameters()) + list(shared.parameters()))
            own_grads[i] = grads[:len(list(private[i].parameters()))]
            for k, g in enumerate(grads[len(own_grads[i]):]):
                shared_grads[k] += sizes[i] / total * g                          # eq. (4)
        with torch.no_grad():
            for i in participants:
                for p, g in zip(private[i].parameters(), own_grads[i]):         # eqs. (5), (6)
                    p -= LR * g
            for p, g in zip(shared.parameters(), shared_grads):
                p -= LR * g
        if t % interval == 0:                                                    # eq. (7) over the participants
            states = [private[i].state_dict() for i in participants]
            average = {k: sum(sizes[i] * s[k] for i, s in zip(participants, states)) / total for k in states[0]}
            global_blocks.load_state_dict(average)
            for i in participants:
                private[i].load_state_dict(average)
            stale = set(range(N)) - set(participants)
        yield t, participants, private, shared, global_blocks


@pytest.mark.parametrize("interval", [1, 2])
@pytest.mark.parametrize("algorithm,cut,private_blocks", [("sfl-v1", 4, 11), ("adaptsfl", 4, 4)])
def test_partial_participation_is_fedavg_with_sampling(algorithm: str, cut: int, private_blocks: int,
                                                       interval: int) -> None:
    """4 devices at participation 0.5, 3 rounds: every device's model and the evaluated model equal FedAvg with
    sampling to 1e-6 (SFL-V2's server steps per device, so it is checked by the download accounting below)."""
    data = make_data(N, "dirichlet")
    strategy = make_strategy(algorithm, {"participation": RHO})
    engine = SplitEngine(small_model(), [cut] * N, strategy, data, {"lr": LR}, batch_size=B, seed=0, interval=interval)
    for t, participants, private, shared, global_blocks in fedavg_with_sampling(data, private_blocks, interval):
        stats = engine.run_round(t)
        assert stats.participants == participants, t
        assert stats.aggregated == (t % interval == 0)
        for i in range(N):
            mine = flat(*[engine.block(i, j) for j in range(private_blocks)])
            assert torch.allclose(mine, flat(private[i]), atol=1e-6, rtol=0), (t, i)
        if private_blocks < 11:
            assert torch.allclose(flat(*[engine.block(0, j) for j in range(private_blocks, 11)]), flat(shared),
                                  atol=1e-6, rtol=0), t
        (evaluated,) = engine.strategy.eval_models(engine)
        expected = flat(global_blocks) if t >= interval else flat(*list(small_model())[:private_blocks])
        assert torch.allclose(flat(*list(evaluated)[:private_blocks]), expected, atol=1e-6, rtol=0), t


@pytest.mark.parametrize("algorithm", ["sfl-v1", "sfl-v2", "adaptsfl"])
def test_a_device_drawn_after_missing_averages_downloads_the_global_model_and_pays_for_it(algorithm: str) -> None:
    """A device that sits out is not touched; a participant that missed the last average downloads the global
    client blocks (and the edge server its server copy, SFL-V1) before it trains: the round's bytes count one
    download per late participant on top of the aggregation's one per participant."""
    data = make_data(N)
    engine = SplitEngine(small_model(), [4] * N, make_strategy(algorithm, {"participation": RHO}), data, {"lr": LR},
                         batch_size=B, seed=0, interval=1)
    client_bytes = sum(engine.block_bytes[:4])
    server_bytes = sum(engine.block_bytes[4:]) if algorithm == "sfl-v1" else 0     # per-device server copies
    own = 11 if server_bytes else 4                # the blocks each device holds alone (here or on the edge)
    received: set[int] = set(range(N))           # devices holding the last global model (w⁰ before the first)
    late_rounds = 0
    for t in range(1, 9):
        before = {i: flat(*[engine.block(i, j) for j in range(own)]).clone() for i in range(N)}
        stats = engine.run_round(t)
        late = [i for i in stats.participants if i not in received]
        late_rounds += bool(late)
        if t == 1:     # nobody is late in round 1: the cut gradients' bytes per participant, besides the average
            gradient_bytes = (stats.bytes_down - client_bytes * len(stats.participants)) // len(stats.participants)
        models_down = stats.bytes_down - gradient_bytes * len(stats.participants)
        assert models_down == client_bytes * (len(late) + len(stats.participants)), t
        assert stats.bytes_server == server_bytes * (2 * len(stats.participants) + len(late)), t   # copies up, down
        for i in range(N):
            if i not in stats.participants:
                assert flat(*[engine.block(i, j) for j in range(own)]).equal(before[i]), (t, i)   # not touched
            else:
                held = flat(*[engine.block(i, j) for j in range(own)])
                assert held.equal(flat(*list(engine.global_model())[:own])), (t, i)
        received = set(stats.participants)
        assert engine.stale == set(range(N)) - received
    assert late_rounds >= 2                       # the draws did leave devices behind and bring them back


def test_the_period_and_the_stale_devices_survive_a_checkpoint() -> None:
    """Resuming mid-period keeps the period's participants and who must download the global model first."""
    data = make_data(N)

    def fresh() -> SplitEngine:
        return SplitEngine(small_model(), [4] * N, make_strategy("sfl-v1", {"participation": RHO}), data,
                           {"lr": LR}, batch_size=B, seed=0, interval=2)

    straight, resumed = fresh(), fresh()
    for t in (1, 2, 3):
        straight.run_round(t)
        resumed.run_round(t)
    state = resumed.state_dict()
    assert state["period"] == straight.period and state["stale"] == sorted(straight.stale) and state["stale"]
    again = fresh()
    again.load_state_dict(state)
    for t in (4, 5):
        a, b = straight.run_round(t), again.run_round(t)
        assert a.participants == b.participants and a.loss == b.loss
    for i in range(N):
        assert flat(straight.device_model(i)).equal(flat(again.device_model(i)))


def test_an_old_scala_checkpoint_keeps_its_global_iterations_participants() -> None:
    """Checkpoints written before the runtime kept the period held SCALA's participants in its own state
    (``current``) and had no ``period``/``stale``: they still resume, mid-iteration, with the same draw."""
    data = make_data(N)

    def fresh() -> SplitEngine:
        return SplitEngine(small_model(), [4] * N, make_strategy("scala", {"participation": RHO}), data,
                           {"lr": LR}, batch_size=B, seed=0, interval=3)

    straight = fresh()
    straight.run_round(1)
    state = straight.state_dict()
    old = {k: v for k, v in state.items() if k not in ("period", "stale")}
    old["strategy"] = {"current": list(state["period"])}
    again = fresh()
    again.load_state_dict(old)
    assert again.period == straight.period
    assert again.run_round(2).participants == straight.run_round(2).participants == state["period"]


def test_a_repartition_brings_the_stale_devices_up_to_date_before_moving_layers() -> None:
    """AdaptSFL re-plans at aggregation rounds; devices that sat out still hold an old model. The re-partition
    first loads the global client blocks into them (as their next round would), so that every device's model
    after the move is the global model cut anew, and the stale set is empty."""
    data = make_data(N)
    engine = SplitEngine(small_model(), [4] * N, make_strategy("adaptsfl", {"participation": RHO}), data, {"lr": LR},
                         batch_size=B, seed=0, interval=1)
    engine.run_round(1)
    stale = set(engine.stale)
    assert stale and len(stale) == N - math.ceil(RHO * N)
    global_blocks = flat(*list(engine.global_model())[:4])
    for i in stale:                       # they still hold w⁰, not the average
        assert not flat(*[engine.block(i, j) for j in range(4)]).equal(global_blocks), i
    engine.set_cuts([2, 4, 6, 4], round_index=1)
    assert engine.stale == set()
    for i in range(N):                    # every device's first four blocks are the global model's, wherever they sit
        assert torch.allclose(flat(*[engine.block(i, j) for j in range(4)]), global_blocks, atol=1e-7, rtol=0), i
    assert engine.cuts == [2, 4, 6, 4]


def test_an_aggregation_names_who_downloads_it_from_three_choices() -> None:
    from trainers.api import Aggregation

    for recipients in ("participants", "all", "none"):
        assert Aggregation((0,), recipients=recipients).recipients == recipients
    with pytest.raises(ValueError, match="recipients must be one of participants, all, none, got 'everyone'"):
        Aggregation((0,), recipients="everyone")


def test_an_average_nobody_downloads_sends_no_model_not_even_the_edge_servers_copies() -> None:
    """``recipients="none"`` on SplitFed V1 (client blocks and the edge server's per-device server copies averaged):
    the round's downward and edge-server bytes are the uploads and cut gradients only, and every device is stale."""
    from dataclasses import replace

    def engine_with(recipients: str) -> SplitEngine:
        engine = SplitEngine(small_model(), [4] * N, make_strategy("sfl-v1", {"participation": RHO}), make_data(N),
                             {"lr": LR}, batch_size=B, seed=0, interval=1)
        average = engine.strategy.aggregation
        engine.strategy.aggregation = lambda ctx: replace(average(ctx), recipients=recipients)
        return engine

    sent, kept = engine_with("participants"), engine_with("none")
    a, b = sent.run_round(1), kept.run_round(1)
    client_bytes, server_bytes = sum(sent.block_bytes[:4]), sum(sent.block_bytes[4:])
    assert a.participants == b.participants and len(a.participants) == 2
    assert a.bytes_down - b.bytes_down == client_bytes * len(a.participants)        # the average's downloads
    assert b.bytes_server == server_bytes * len(b.participants)                      # the copies' uploads only
    assert a.bytes_server == 2 * b.bytes_server
    assert kept.stale == set(range(N)) and sent.stale == set(range(N)) - set(a.participants)
