"""Contracts of the simulation runtime and the strategy API (trainers.engine, trainers.api) that the
reference tests do not pin: a checkpoint restores every strategy's own state (floats, ints, lists,
not only tensors) so a restored engine continues exactly as the uninterrupted one; the base classes'
defaults are the specs' values."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from trainers.api import AsyncStrategy
from trainers.engine import SplitEngine
from trainers.messages import NonFiniteError
from trainers.strategies import make_strategy

from tests.test_engine import flat, make_data, small_model

torch.set_num_threads(1)


def build(algorithm: str, options: dict, cuts, devices: int, interval: int = 1) -> SplitEngine:
    return SplitEngine(small_model(), cuts, make_strategy(algorithm, options), make_data(devices),
                       {"lr": 0.05, "momentum": 0.5}, batch_size=8, seed=3, interval=interval, total_rounds=6)


def everything(engine: SplitEngine) -> torch.Tensor:
    """Every device's client blocks and every edge-server instance, as one vector."""
    return torch.cat([flat(*[d.blocks for d in engine.devices]),
                      flat(*[engine.edge.instances[k] for k in sorted(engine.edge.instances, key=str)])])


@pytest.mark.parametrize("algorithm,options,cuts,interval", [
    ("sl", {}, [3, 3, 3], 1),                                         # holder (an int)
    ("gapsl", {}, [3, 3, 3], 1),                                      # running ν_min, ν_max (floats)
    ("scala", {"participation": 0.5}, [3, 3, 3, 3], 2),               # the iteration's participants (a list)
    ("gas", {"active": 2, "local_steps": 2}, [3, 3, 3], 1),           # version, buffers, counters
])
def test_a_restored_engine_continues_exactly_like_the_uninterrupted_one(algorithm, options, cuts, interval) -> None:
    a = build(algorithm, options, cuts, len(cuts), interval)
    for t in (1, 2, 3):
        a.run_round(t)
    saved = copy.deepcopy(a.state_dict())
    strategy_state = copy.deepcopy(a.strategy.state_dict())
    b = build(algorithm, options, cuts, len(cuts), interval)
    b.load_state_dict(saved)
    # the strategy's own (non-tensor) state comes back as it was saved
    assert b.strategy.state_dict().keys() == strategy_state.keys()
    plain = {k: v for k, v in strategy_state.items() if isinstance(v, (int, float, str))
             or (isinstance(v, (list, dict)) and all(isinstance(x, (int, float)) for x in
                                                     (v.values() if isinstance(v, dict) else v)))}
    assert plain                                 # each of these strategies keeps some plain state
    assert {k: b.strategy.state_dict()[k] for k in plain} == plain
    for t in (4, 5):
        sa, sb = a.run_round(t), b.run_round(t)
        assert sa.participants == sb.participants
        assert sa.loss == sb.loss or (np.isnan(sa.loss) and np.isnan(sb.loss))
        assert torch.equal(everything(a), everything(b)), f"round {t}"
    ea = [m for m in a.strategy.eval_models(a)]
    eb = [m for m in b.strategy.eval_models(b)]
    assert len(ea) == len(eb)
    for ma, mb in zip(ea, eb):
        assert torch.equal(flat(ma), flat(mb))


class MinimalAsync(AsyncStrategy):
    """An asynchronous strategy that keeps the base class's C and E and aggregates every upload
    batch of C models (GAS-12's rule, without GAS's server-side machinery)."""

    name = "minimal-async"

    def __init__(self) -> None:
        super().__init__()
        self.models: list = []
        self.first: list[int] = []

    def first_devices(self, ctx):
        self.first = super().first_devices(ctx)
        return self.first

    def on_model(self, ctx, upload):
        self.models.append(upload)
        if len(self.models) < self.active:
            return None
        flushed, self.models = self.models, []
        return flushed


def test_async_strategy_defaults_are_the_specs_c_and_e() -> None:
    # docs (spec GAS): an active set of C = 10 clients; a client is replaced after E = 20 local iterations
    strategy = MinimalAsync()
    engine = SplitEngine(small_model(), [3] * 12, strategy, make_data(12), {"lr": 0.05}, batch_size=4, seed=0)
    before = [d.step for d in engine.devices]
    stats = engine.run_round(1)
    assert len(strategy.first) == 10 and len(set(strategy.first)) == 10
    # every upload follows E = 20 steps of one device, and the round ends at the C-th upload: 10 × 20 steps
    steps = [d.step - s for d, s in zip(engine.devices, before)]
    assert sum(steps) == 10 * 20
    assert all(n % 20 == 0 for n in steps)
    assert stats.aggregated and set(strategy.first) <= set(range(12))


# the small CNN cut after block 3 (conv 1→4, ReLU, 2×2 pool on 1×8×8 inputs): 4×4×4 activation values per
# sample; a client model of 4·9 + 4 = 40 float32 parameters
B = 16
ACTIVATION_BYTES = B * 4 * 4 * 4 * 4
LABEL_BYTES = B * 8
CLIENT_BYTES = 40 * 4


def test_sl_hand_offs_are_counted_as_model_messages_both_ways() -> None:
    # one SL round over 3 devices: 3 activations (+ labels) up and 3 cut gradients down, and 3 hand-offs
    # (0 → 1, 1 → 2, 2 → 0), each the client model up to the fed server and down to the next device
    engine = SplitEngine(small_model(), [3, 3, 3], make_strategy("sl"), make_data(3), {"lr": 0.05}, batch_size=B)
    stats = engine.run_round(1)
    assert stats.bytes_up == 3 * (ACTIVATION_BYTES + LABEL_BYTES) + 3 * CLIENT_BYTES
    assert stats.bytes_down == 3 * ACTIVATION_BYTES + 3 * CLIENT_BYTES
    assert stats.bytes_server == 0
    # one device holds the model all along: no hand-off, no model message
    alone = SplitEngine(small_model(), [3], make_strategy("sl"), make_data(1), {"lr": 0.05}, batch_size=B)
    stats = alone.run_round(1)
    assert (stats.bytes_up, stats.bytes_down) == (ACTIVATION_BYTES + LABEL_BYTES, ACTIVATION_BYTES)


def test_a_shared_server_block_is_neither_sent_nor_overwritten_at_an_aggregation() -> None:
    # SFL-V2 with cuts (1, 4): the client blocks 0..3 are averaged; device 1 holds blocks 1..3 itself, while
    # device 0's blocks 1..3 are the edge server's SHARED instances — not device-specific, so the edge server
    # neither uploads them nor receives the average back (bytes_server = 0), and they keep their own weights
    engine = SplitEngine(small_model(), [1, 4], make_strategy("sfl-v2"), make_data(2), {"lr": 0.05}, batch_size=B)
    shared = [engine.edge.instances[(None, j)] for j in (1, 2, 3)]
    stats = engine.run_round(1)
    assert stats.aggregated and stats.bytes_server == 0
    # the shared conv block 3 (block index 3: Conv2d(4, 8)) trained on device 0's stream only; device 1's copy
    # on device 1's data: they differ after the round
    assert not torch.equal(flat(shared[2]), flat(engine.devices[1].blocks[3]))
    assert all(engine.edge.instances[(None, j)] is m for j, m in zip((1, 2, 3), shared))


class NaNAtAggregation(AsyncStrategy):
    """An asynchronous strategy whose aggregation leaves a NaN in the uploading device's client model
    (as a diverged local step would): the last event of the round."""

    name = "nan-at-aggregation"
    active, local_steps = 2, 1

    def __init__(self) -> None:
        super().__init__()
        self.models: list = []

    def on_model(self, ctx, upload):
        self.models.append(upload)
        if len(self.models) < self.active:
            return None
        with torch.no_grad():
            upload.blocks[0].state["weight"].view(-1)[0] = float("nan")     # the live tensor of the device's block
        flushed, self.models = self.models, []
        return flushed


def test_a_model_made_non_finite_stops_the_asynchronous_round_that_made_it() -> None:
    engine = SplitEngine(small_model(), [3, 3, 3], NaNAtAggregation(), make_data(3), {"lr": 0.05}, batch_size=B)
    with pytest.raises(NonFiniteError, match=r"NaN or inf in client model block 1 at round 1, device \d$"):
        engine.run_round(1)
