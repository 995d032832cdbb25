"""SplitFed V1 with one server copy per slot (``server_copies = "slot"``, the CycleSL authors' SplitFed V1; docs/
algorithms.md "SplitFed V1's server copies") against a reference written out here: C = ⌈ρN⌉ server copies, the k-th
participant of a round training on copy k, each copy's momentum carried from round to round whoever fills it,
client and server copies |𝒟_i|-averaged every round and every copy loading the average."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn

from tests.engine_builders import flat, make_data, small_model
from tests.reference_optim import HandSGD
from trainers.engine.split_engine import STRATEGY_STREAM, SplitEngine
from trainers.inputs.partition import DeviceSampler
from trainers.roles.optim import OptimizerSpec
from trainers.strategies import make_strategy

N, RHO, CUT, B, LR = 6, 0.5, 2, 16, 0.1


def reference_slots(data, rounds: int, momentum: float):
    """Yield (t, participants, each participant's [client; its slot's server copy], the global model) per round."""
    template = small_model()
    clients = [copy.deepcopy(template[:CUT]) for _ in range(N)]
    C = math.ceil(RHO * N)
    servers = [copy.deepcopy(template[CUT:]) for _ in range(C)]
    global_client, global_server = copy.deepcopy(template[:CUT]), copy.deepcopy(template[CUT:])
    opt = HandSGD(LR, momentum)
    samplers = [DeviceSampler(data.parts[i], B, [0, i]) for i in range(N)]
    sizes = [float(len(p)) for p in data.parts]
    rng = np.random.default_rng([0, STRATEGY_STREAM])
    stale: set[int] = set()
    for t in range(1, rounds + 1):
        drawn = sorted(int(d) for d in rng.choice(N, size=C, replace=False))
        for i in drawn:
            if i in stale:                               # missed the last average: loads it (momentum kept)
                clients[i].load_state_dict(global_client.state_dict())
        for k, i in enumerate(drawn):
            idx = torch.from_numpy(samplers[i].next())
            loss = nn.functional.cross_entropy(servers[k](clients[i](data.x_train[idx])), data.y_train[idx])
            loss.backward()
            opt.step(clients[i])
            opt.step(servers[k])                         # slot k's momentum, whoever filled it last round
        total = sum(sizes[i] for i in drawn)
        for target, parts in ((global_client, [clients[i] for i in drawn]), (global_server, servers)):
            states = [m.state_dict() for m in parts]
            target.load_state_dict({key: sum(sizes[i] * s[key] for i, s in zip(drawn, states)) / total
                                    for key in states[0]})
        for i in drawn:
            clients[i].load_state_dict(global_client.state_dict())
        for server in servers:
            server.load_state_dict(global_server.state_dict())
        stale = set(range(N)) - set(drawn)
        yield t, drawn, {i: nn.Sequential(*clients[i], *servers[k]) for k, i in enumerate(drawn)}, \
            nn.Sequential(*global_client, *global_server)


def _engine(server_copies: str, momentum: float) -> SplitEngine:
    strategy = make_strategy("sfl-v1", {"participation": RHO, "server_copies": server_copies})
    return SplitEngine(small_model(), [CUT] * N, strategy, make_data(N, "dirichlet"),
                       OptimizerSpec("sgd", LR, momentum), batch_size=B, seed=0)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_slot_copies_train_as_the_reference(momentum: float) -> None:
    engine = _engine("slot", momentum)
    assert len({engine.edge.key(d, CUT)[0] for d in range(N)}) == 3          # C = 3 copies, not N = 6
    for t, drawn, models, global_model in reference_slots(make_data(N, "dirichlet"), 4, momentum):
        stats = engine.run_round(t)
        assert stats.participants == drawn and stats.aggregated
        assert {engine.edge.key(d, CUT)[0] for d in drawn} == {0, 1, 2}
        for i, model in models.items():
            mine = torch.cat([p.detach().reshape(-1) for j in range(11) for p in engine.block(i, j).parameters()])
            assert torch.allclose(mine, flat(model), atol=1e-6, rtol=0), (t, i)
        (evaluated,) = engine.strategy.eval_models(engine)
        assert torch.allclose(flat(evaluated), flat(global_model), atol=1e-6, rtol=0), t


def test_slots_and_device_copies_differ_only_through_the_optimizer_state() -> None:
    """With plain SGD a drawn device's copy is refreshed from the average either way: the same weights; with
    momentum the per-device copies carry their device's stale momentum and the runs part."""
    for momentum, same in ((0.0, True), (0.9, False)):
        slot, device = _engine("slot", momentum), _engine("device", momentum)
        for t in range(1, 5):
            slot.run_round(t)
            device.run_round(t)
        a, b = (flat(*e.strategy.eval_models(e)) for e in (slot, device))
        assert torch.allclose(a, b, atol=1e-6, rtol=0) == same, momentum


def test_a_restored_slot_map_is_checked() -> None:
    engine = _engine("slot", 0.0)
    engine.run_round(1)
    ctx = engine.context(2)
    strategy = engine.strategy
    strategy.check_state(ctx)
    for bad in ({0: 0, 1: 0}, {9: 0}, {0: 0, 1: 1, 2: 2, 3: 3}):
        strategy.load_state_dict({"slots": bad})
        with pytest.raises(ValueError, match="distinct devices of the run the slots 0..2"):
            strategy.check_state(ctx)
