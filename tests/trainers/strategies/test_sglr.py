"""SGLR (trainers/strategies/sglr.py) against its update rule written out here, sharing no code with the engine:
PSL's server step (every participant at the same w_s, the |𝒟_i|-weighted mean of their server gradients, eq. 4),
each participant's G_i = ∂F_i/∂a_i at the pre-update w_s, and (CSL-8) a random ⌊φ·n_t⌋ of them receiving the one
averaged row ḡ = Σ_{i∈A}|𝒟_i| Σ_j G_i[j] / Σ_{i∈A}|𝒟_i|·b_i; client models never averaged."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn

from adaptplan.errors import InputError
from tests.engine_builders import flat, make_data, small_model
from trainers.engine.split_engine import STRATEGY_STREAM, SplitEngine
from trainers.inputs.partition import DeviceSampler
from trainers.strategies import make_strategy

B, LR, N, CUT = 16, 0.1, 4, 4


def reference_sglr(data, rounds: int, rho: float, fraction: float):
    template = small_model()
    clients = [nn.Sequential(*copy.deepcopy(list(template)[:CUT])) for _ in range(N)]
    server = nn.Sequential(*copy.deepcopy(list(template)[CUT:]))
    sizes = [float(len(p)) for p in data.parts]
    samplers = [DeviceSampler(data.parts[i], B, [0, i]) for i in range(N)]
    rng = np.random.default_rng([0, STRATEGY_STREAM])
    for t in range(1, rounds + 1):
        S = list(range(N)) if rho >= 1 else sorted(
            int(d) for d in rng.choice(N, size=max(2, math.ceil(rho * N)), replace=False))
        total = sum(sizes[i] for i in S)
        a, G, server_grads = {}, {}, [torch.zeros_like(p) for p in server.parameters()]
        for i in S:
            idx = torch.from_numpy(samplers[i].next())
            a[i] = clients[i](data.x_train[idx])
            x = a[i].detach().requires_grad_(True)
            loss = nn.functional.cross_entropy(server(x), data.y_train[idx])            # F_i, its mean CE
            grads = torch.autograd.grad(loss, [x, *server.parameters()])
            G[i] = grads[0]                                                            # at the pre-update w_s
            for k, g in enumerate(grads[1:]):
                server_grads[k] += sizes[i] / total * g                                # eq. (4)
        A = [S[int(k)] for k in rng.permutation(len(S))[:int(fraction * len(S))]]      # CSL-8
        if A:
            g_bar = sum(sizes[i] * G[i].sum(0) for i in A) / sum(sizes[i] * G[i].shape[0] for i in A)
            for i in A:
                G[i] = g_bar.expand_as(G[i])
        with torch.no_grad():
            for p, g in zip(server.parameters(), server_grads):
                p -= LR * g
        for i in S:
            grads = torch.autograd.grad(a[i], list(clients[i].parameters()), grad_outputs=G[i])
            with torch.no_grad():
                for p, g in zip(clients[i].parameters(), grads):
                    p -= LR * g
        yield t, S, A, clients, server


@pytest.mark.parametrize("rho,fraction", [(1.0, 0.5), (0.5, 1.0), (0.75, 0.5)])
def test_sglr_matches_its_update_rule(rho: float, fraction: float) -> None:
    data = make_data(N, "dirichlet")
    strategy = make_strategy("sglr", {"participation": rho, "averaged_fraction": fraction})
    engine = SplitEngine(small_model(), [CUT] * N, strategy, data, {"lr": LR}, batch_size=B, seed=0)
    for t, S, A, clients, server in reference_sglr(data, 3, rho, fraction):
        stats = engine.run_round(t)
        assert stats.participants == S, t
        assert len(A) == int(fraction * len(S))
        assert torch.allclose(flat(*[engine.block(0, j) for j in range(CUT, 11)]), flat(server), atol=1e-6, rtol=0)
        for i in range(N):
            assert torch.allclose(flat(*[engine.block(i, j) for j in range(CUT)]), flat(clients[i]), atol=1e-6,
                                  rtol=0), (t, i)


def test_an_averaged_row_changes_the_clients_but_not_the_server_step() -> None:
    """Against PSL on the same data and seed: the server (stepped before any reply) is PSL's after round 1, the
    averaged devices' client models are not."""
    data = make_data(N)
    runs = {}
    for name, options in (("psl", {"participation": 1.0}), ("sglr", {"participation": 1.0, "averaged_fraction": 1.0})):
        engine = SplitEngine(small_model(), [CUT] * N, make_strategy(name, options), data, {"lr": LR}, batch_size=B,
                             seed=0)
        engine.run_round(1)
        runs[name] = engine
    server = [flat(*[runs[n].block(0, j) for j in range(CUT, 11)]) for n in runs]
    assert torch.equal(server[0], server[1])
    for i in range(N):
        mine = [flat(*[runs[n].block(i, j) for j in range(CUT)]) for n in runs]
        assert not torch.allclose(mine[0], mine[1], atol=1e-6)


def test_sglr_options_and_defaults() -> None:
    s = make_strategy("sglr")
    assert (s.participation, s.averaged_fraction, s.min_participants, s.averages_clients) == (0.05, 0.5, 2, False)
    for bad in (0.0, 1.5):
        with pytest.raises(InputError) as err:
            make_strategy("sglr", {"averaged_fraction": bad})
        assert err.value.field == "--averaged-fraction"
