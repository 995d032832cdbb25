"""Federated averaging with client sampling and a per-device loss, written out with plain SGD and sharing no code
with the engine: the reference of the algorithms whose every block is the device's own — FedAvg and FedLC (the
whole model on the device) and SplitFed V1 and LLA-SFL (client blocks and a per-device server copy). Each period of
I rounds draws ⌈ρN⌉ devices (the strategy's stream, seeded [seed, 2³²−1]); a drawn device that missed the last
average first loads the global model; each round every participant takes one step w_k ← w_k − η∇F_k(w_k) on a
mini-batch of b samples, F_k = ``loss_of(k, logits, labels)`` (with ``mu``, FedProx's step: the gradient plus
μ(w_k − w^t), w^t the model the device last loaded, or started from); every I rounds the participants' models are
|𝒟_k|-averaged into the global model, which they load — with ``groups`` (device → group, FedConcat's clusters)
each group's participants into that group's own global model, which its participants (``recipients="all"``: all its
members) load, a late device loading its group's (none before its group's first average). Each round also yields
every participant's F_k (the round's record reports their mean). :func:`check_round` compares an engine's round with
the reference's."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np
import pytest
import torch
from torch import nn

from trainers.engine.split_engine import STRATEGY_STREAM
from trainers.inputs.partition import DeviceSampler

Loss = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class ReferenceRound:
    """The reference after round ``t``: its participants, every device's model, the global model, each
    participant's loss F_k, and whether the round ended a period of I rounds (an average)."""

    t: int
    participants: list[int]
    models: list[nn.Sequential]
    global_model: nn.Sequential
    losses: dict[int, float]
    aggregated: bool
    group_models: dict[int, nn.Sequential]


def check_round(engine, ref: ReferenceRound) -> None:
    """Run the engine's round ``ref.t`` and check it against the reference: the participants, whether it averaged,
    the recorded loss (the participants' mean F_k) and every device's parameters, all its blocks wherever they live
    (on the device or in its server copy), to 10⁻⁶."""
    stats = engine.run_round(ref.t)
    assert stats.participants == ref.participants and stats.aggregated == ref.aggregated, ref.t
    assert stats.loss == pytest.approx(sum(ref.losses.values()) / len(ref.losses), rel=1e-5), ref.t
    for i, model in enumerate(ref.models):
        mine = torch.cat([p.detach().reshape(-1) for j in range(len(model)) for p in engine.block(i, j).parameters()])
        theirs = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        assert torch.allclose(mine, theirs, atol=1e-6, rtol=0), (ref.t, i)


def federated_reference(template: nn.Sequential, data, loss_of: Loss, rounds: int, rho: float, interval: int,
                        lr: float, batch: int, mu: float = 0.0, groups: Sequence[int] | None = None,
                        recipients: str = "participants") -> Iterator[ReferenceRound]:
    """Yield the :class:`ReferenceRound` after each round t."""
    n = len(data.parts)
    group = list(groups) if groups is not None else [0] * n
    models = [copy.deepcopy(template) for _ in range(n)]
    global_model = copy.deepcopy(template)
    group_models = {} if groups is not None else {0: global_model}
    sizes = [float(len(p)) for p in data.parts]
    samplers = [DeviceSampler(data.parts[i], batch, [0, i]) for i in range(n)]
    rng = np.random.default_rng([0, STRATEGY_STREAM])
    stale: set[int] = set()
    participants: list[int] = []
    anchors = [[p.detach().clone() for p in m.parameters()] for m in models]
    for t in range(1, rounds + 1):
        if (t - 1) % interval == 0:
            participants = list(range(n)) if rho >= 1 else sorted(
                int(d) for d in rng.choice(n, size=math.ceil(rho * n), replace=False))
            for i in [i for i in participants if i in stale]:
                if group[i] in group_models:
                    models[i].load_state_dict(group_models[group[i]].state_dict())
                    anchors[i] = [p.detach().clone() for p in models[i].parameters()]
                stale.discard(i)
        losses: dict[int, float] = {}
        for i in participants:
            idx = torch.from_numpy(samplers[i].next())
            loss = loss_of(i, models[i](data.x_train[idx]), data.y_train[idx])
            losses[i] = loss.item()
            grads = torch.autograd.grad(loss, list(models[i].parameters()))
            with torch.no_grad():
                for p, g, anchor in zip(models[i].parameters(), grads, anchors[i]):
                    p -= lr * (g + mu * (p - anchor))
        if t % interval == 0:
            received: set[int] = set()
            for g in sorted({group[i] for i in participants}):
                members = [i for i in participants if group[i] == g]
                total = sum(sizes[i] for i in members)
                states = [models[i].state_dict() for i in members]
                average = {k: sum(sizes[i] * s[k] for i, s in zip(members, states)) / total for k in states[0]}
                group_models.setdefault(g, copy.deepcopy(template)).load_state_dict(average)
                takers = members if recipients == "participants" else [i for i in range(n) if group[i] == g]
                for i in takers:
                    models[i].load_state_dict(average)
                    anchors[i] = [p.detach().clone() for p in models[i].parameters()]
                received |= set(takers)
            stale = set(range(n)) - received
        yield ReferenceRound(t, participants, models, global_model, losses, t % interval == 0, group_models)
