"""AdaptSFL with heterogeneous cuts against a hand-computed reference of docs/model.md §2.1 (eqs. 2–7), with the
defaults' SGD momentum 0.9: device i holds w_{c,i} = blocks 1..ℓ_i, the edge server one non-common copy
w_{n,i} = blocks ℓ_i+1..L_c per device and one common w_s = blocks L_c+1..L (L_c = max_i ℓ_i). Each round: eq. (4)
w_s steps once with Σ_i (|𝒟_i|/Σ|𝒟|)·g_{s,i}; eq. (5) each w_{n,i} with its own g_{n,i}; eq. (6) each device with its
cut gradient; eq. (7) every I rounds the forged w_{f,i} = [w_{c,i}; w_{n,i}] are averaged block-wise (|𝒟_i|-weighted)
and loaded back into every device's client part and non-common copy; momentum stays with each optimizer."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tests.engine_builders import flat, make_data, small_model
from tests.reference_optim import HandSGD
from trainers.engine.split_engine import SplitEngine
from trainers.inputs.partition import DeviceSampler
from trainers.roles.optim import OptimizerSpec
from trainers.strategies import AdaptSFL

B, LR, MOMENTUM = 16, 0.05, 0.9


def reference(data, cuts: list[int], rounds: int, interval: int):
    model = small_model()
    L, Lc, N = len(model), max(cuts), len(cuts)
    clients = [copy.deepcopy(nn.Sequential(*model[:c])) for c in cuts]
    noncommon = [copy.deepcopy(nn.Sequential(*model[c:Lc])) for c in cuts]
    common = copy.deepcopy(nn.Sequential(*model[Lc:L]))
    opt = HandSGD(LR, MOMENTUM)
    samplers = [DeviceSampler(data.parts[i], B, [0, i]) for i in range(N)]
    sizes = [float(len(p)) for p in data.parts]
    weights = [s / sum(sizes) for s in sizes]
    for t in range(1, rounds + 1):
        acts, cut_grads = [], []
        common_grads = [torch.zeros_like(p) for p in common.parameters()]
        for i in range(N):                                                      # all devices at w^{t−1}
            idx = torch.from_numpy(samplers[i].next())
            a = clients[i](data.x_train[idx])                                   # eq. (2)
            leaf = a.detach().requires_grad_(True)
            loss = nn.functional.cross_entropy(common(noncommon[i](leaf)), data.y_train[idx])   # eq. (3)
            nc = list(noncommon[i].parameters())
            grads = torch.autograd.grad(loss, [leaf] + nc + list(common.parameters()))
            cut_grads.append(grads[0])
            for p, g in zip(nc, grads[1:1 + len(nc)]):
                p.grad = g
            for k, g in enumerate(grads[1 + len(nc):]):
                common_grads[k] += weights[i] * g
            acts.append(a)
        for i in range(N):
            opt.step(noncommon[i])                                              # eq. (5)
        for p, g in zip(common.parameters(), common_grads):
            p.grad = g
        opt.step(common)                                                        # eq. (4)
        for i in range(N):
            acts[i].backward(cut_grads[i])
            opt.step(clients[i])                                                # eq. (6)
        if t % interval == 0:                                                   # eq. (7)
            forged = [list(clients[i]) + list(noncommon[i]) for i in range(N)]
            for j in range(Lc):
                states = [forged[i][j].state_dict() for i in range(N)]
                avg = {k: sum(w * s[k] for w, s in zip(sizes, states)) / sum(sizes) for k in states[0]}
                for i in range(N):
                    forged[i][j].load_state_dict(avg)
        yield t, clients, noncommon, common


@pytest.mark.parametrize("cuts,interval", [([2, 5, 9], 2), ([9, 3, 3], 3)])
def test_adaptsfl_heterogeneous_cuts_match_the_hand_computed_rounds(cuts: list[int], interval: int) -> None:
    data = make_data(len(cuts), "dirichlet")
    assert len({len(p) for p in data.parts}) > 1                               # unequal |𝒟_i|: weights matter
    engine = SplitEngine(small_model(), cuts, AdaptSFL(), data, OptimizerSpec("sgd", LR, MOMENTUM), batch_size=B,
                         seed=0, interval=interval)
    Lc = max(cuts)
    for t, clients, noncommon, common in reference(data, cuts, 6, interval):
        stats = engine.run_round(t)
        assert stats.aggregated == (t % interval == 0)
        assert torch.allclose(flat(*[engine.edge.instances[(None, j)] for j in range(Lc, 11)]), flat(common),
                              atol=1e-5, rtol=0), f"w_s, round {t}"
        for i, c in enumerate(cuts):
            assert torch.allclose(flat(engine.devices[i].blocks), flat(clients[i]), atol=1e-5, rtol=0), (i, t)
            if c < Lc:
                mine = flat(*[engine.edge.instances[(i, j)] for j in range(c, Lc)])
                assert torch.allclose(mine, flat(noncommon[i]), atol=1e-5, rtol=0), (i, t)
