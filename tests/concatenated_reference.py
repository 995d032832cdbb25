"""SCALA's round written out from B.2's pseudo-code, sharing no code with the engine: the
reference of SCALA (tests/trainers/strategies/test_scala.py) and, with τ = 0, of MiniBatch-SFL as GAS's authors run
it (test_minibatch_sfl.py): participants per global iteration, B_k of eq. (3), cut gradients of each device's own
loss at the pre-update server (eqs. 6, 13), one server step on the concatenated batch (eqs. 5, 12), |𝒟_k|-weighted
FedAvg of the client parts every I rounds (eq. 8), downloaded by the next global iteration's participants at its
start (step 2). On the small CNN of tests/engine_builders.py cut at block 9, N = 6 devices, b = 16, SGD at 0.1."""

from __future__ import annotations

import copy
import math
from typing import Callable

import numpy as np
import torch
from torch import nn

from tests.engine_builders import small_model
from tests.reference_optim import HandSGD
from trainers.engine.split_engine import STRATEGY_STREAM, DeviceData
from trainers.inputs.partition import DeviceSampler

CUT, B, LR, N, M = 9, 16, 0.1, 6, 10


def la_ce(logits: torch.Tensor, y: torch.Tensor, prior: np.ndarray, tau: float = 1.0) -> torch.Tensor:
    """eqs. (12)–(13), written out: mean_b −log softmax(s + τ·log(π + 1e-12))_y."""
    shift = torch.tensor(tau * np.log(prior + 1e-12), dtype=logits.dtype)
    z = logits + shift
    return (torch.logsumexp(z, 1) - z.gather(1, y[:, None])[:, 0]).mean()


def reference_scala(data: DeviceData, rounds: int, interval: int, rho: float, server_prior: str = "batch",
                    opt: HandSGD | None = None, tau: float = 1.0, cut: int = CUT,
                    server_groups: Callable[[list[int]], list[list[int]]] | None = None):
    """B.2 with ``opt`` (plain SGD at LR by default; per-model momentum restarted when a device loads the
    global model, docs/algorithms.md "Optimizer state") and adjustment strength ``tau`` on both sides (0: plain
    cross-entropy, MiniBatch-SFL), every device cut at ``cut``; with ``server_groups`` (S²FL, τ = 0: GAS's authors'
    baseline/S2FL.py) the server steps once on the mean over the groups of the participants of each group's
    gradient of its concatenated batch's mean loss, each clipped at ``opt.clip`` first; yields (round, participants,
    B_k, clients, server, global client model) after every round, and each participant's loss ℓ_k (the round's
    record reports their mean)."""
    opt = opt or HandSGD(LR)
    model = small_model()
    clients = [copy.deepcopy(nn.Sequential(*model[:cut])) for _ in range(N)]
    server = copy.deepcopy(nn.Sequential(*model[cut:]))
    samplers = [DeviceSampler(data.parts[k], B, [0, k]) for k in range(N)]
    sizes = [len(p) for p in data.parts]
    priors = [np.bincount(data.y_train[torch.from_numpy(p)].numpy(), minlength=M) / len(p) for p in data.parts]
    rng = np.random.default_rng([0, STRATEGY_STREAM])
    global_client: list[torch.Tensor] | None = None      # w_c^t: none before the first average (all hold w⁰)
    for t in range(1, rounds + 1):
        if (t - 1) % interval == 0:                                                     # step 0
            n = max(1, math.ceil(rho * N))
            C = list(range(N)) if rho >= 1 else sorted(int(d) for d in rng.choice(N, size=n, replace=False))
            total = sum(sizes[k] for k in C)
            batch = {k: max(int(sizes[k] * B * len(C) / total), 1) for k in C}          # eq. 3, B = b·|C|
            for k in C if global_client is not None else ():                            # step 2: C^t downloads w_c^t
                opt.restart(clients[k])
                with torch.no_grad():
                    for p, a in zip(clients[k].parameters(), global_client):
                        p.copy_(a)
        acts, leaves, labels = {}, {}, {}
        for k in C:                                                                      # step 3a
            idx = torch.from_numpy(samplers[k].next(batch[k]))
            acts[k] = clients[k](data.x_train[idx])
            leaves[k] = acts[k].detach().requires_grad_(True)
            labels[k] = data.y_train[idx]
        G, losses = {}, {}
        for k in C:                                                                      # step 3c, pre-update w_s
            loss = la_ce(server(leaves[k]), labels[k], priors[k], tau)
            G[k] = torch.autograd.grad(loss, leaves[k])[0]
            losses[k] = float(loss)
        A = torch.cat([leaves[k].detach() for k in C])                                   # step 3b
        Y = torch.cat([labels[k] for k in C])
        if server_prior == "batch":
            P_s = np.bincount(Y.numpy(), minlength=M) / len(Y)
        else:
            counts = sum(priors[k] * sizes[k] for k in C)
            P_s = counts / counts.sum()
        if server_groups is None:
            la_ce(server(A), Y, P_s, tau).backward()                                         # step 3d
        else:
            server_step_on_groups(server, server_groups(C), leaves, labels, opt.clip)
        opt.step(server)
        for k in C:                                                                      # step 3e
            acts[k].backward(G[k])
            opt.step(clients[k])
        if t % interval == 0:                                                            # steps 4–5 (eq. 8)
            w = [float(sizes[k]) for k in C]
            global_client = [sum(wk * p.detach() for wk, p in zip(w, ps)) / sum(w)
                             for ps in zip(*[clients[k].parameters() for k in C])]
        yield t, C, batch, clients, server, global_client, losses


def server_step_on_groups(server: nn.Module, groups: list[list[int]], leaves: dict, labels: dict,
                          clip: float | None) -> None:
    """S²FL's server gradient into ``server``'s ``.grad``: (1/G)·Σ_g clip(∇ mean CE of group g's concatenated batch),
    every group at the same weights (for plain SGD the authors' G steps from one w_s, averaged)."""
    params = list(server.parameters())
    total = [torch.zeros_like(p) for p in params]
    for group in groups:
        A = torch.cat([leaves[k].detach() for k in group])
        Y = torch.cat([labels[k] for k in group])
        grads = torch.autograd.grad(nn.functional.cross_entropy(server(A), Y), params)
        norm = float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads)))
        factor = 1.0 if clip is None else min(1.0, clip / (norm + 1e-6))
        total = [t + g * factor / len(groups) for t, g in zip(total, grads)]
    for p, g in zip(params, total):
        p.grad = g
