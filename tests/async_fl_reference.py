"""Buffered asynchronous federated learning written out from the GAS authors' baselines (baseline/FedBuff.py and
baseline/CA2FL.py; docs/algorithms.md "FedBuff" and "CA²FL"), sharing no code with the engine: C devices training
the whole model from the model they held when they joined, the device whose step arrives first going next (the
engine's asynchronous clock), E local SGD steps, then its model buffered and its slot given to an idle device drawn
from the strategy's stream, which loads the current global model once there is one."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from tests.engine_builders import params, small_model
from tests.reference_optim import HandSGD
from trainers.engine.split_engine import STRATEGY_STREAM
from trainers.inputs.partition import DeviceSampler

B = 16


def serve_next(active: list[int], clock: dict[int, float], free: float, T) -> tuple[int, float]:
    """The engine's asynchronous clock, one step (docs/engine.md): device k's step arrives at r_k + T^F_k + T^A_k,
    the earliest goes (ties: the first slot), served T^S_k from max(arrival, server free); k is ready again
    T^D_k + T^B_k after (``clock[k]`` set). Returns (k, when the server is free again)."""
    arrive = {j: clock[j] + T("client_fp", j) + T("upload", j) for j in active}
    k = min(active, key=lambda j: (arrive[j], active.index(j)))
    free = max(arrive[k], free) + T("server", k)
    clock[k] = free + T("download", k) + T("client_bp", k)
    return k, free


def reference_buffered(data, rounds: int, C: int, E: int, times, opt: HandSGD, calibrated: bool = False):
    """Yield (t, every device's model, the global model, the devices in the order they stepped) after each average;
    ``opt`` steps the devices (a joining device that loads the global model restarts its momentum). Every C uploads
    the global model becomes the buffered models' |𝒟_k|-weighted average (FedBuff), or with ``calibrated`` steps by
    every device's cached update (CA²FL: h_k = its model at upload − its model when it joined, w ← w + Σ_i p_i h_i
    over all N devices, p_i = |𝒟_i| / Σ|𝒟|, 0 for a device that never uploaded; w starts as the initial model).
    The clock as the engine's asynchronous loop keeps it (:func:`serve_next`); an upload adds T^mU_k and the
    replacement is ready T^mD after it."""
    T = (lambda name, j: float(getattr(times, name)[j]))
    N = len(data.parts)
    models = [small_model() for _ in range(N)]
    samplers = [DeviceSampler(data.parts[k], B, [0, k]) for k in range(N)]
    sizes = [len(p) for p in data.parts]
    rng = np.random.default_rng([0, STRATEGY_STREAM])
    active = sorted(int(k) for k in rng.choice(N, size=C, replace=False))
    clock, free, steps, order = {k: 0.0 for k in active}, 0.0, {k: 0 for k in active}, []
    buffered, global_model = [], None
    start = {k: params(models[k]) for k in active}
    cache: dict[int, list] = {}
    w = params(models[0])                                   # every device starts from the same w⁰
    for t in range(1, rounds + 1):
        while True:
            k, free = serve_next(active, clock, free, T)
            order.append(k)
            idx = torch.from_numpy(samplers[k].next())
            nn.functional.cross_entropy(models[k](data.x_train[idx]), data.y_train[idx]).backward()
            opt.step(models[k])
            steps[k] += 1
            if steps[k] < E:
                continue
            buffered.append((sizes[k], params(models[k])))                                # its upload
            cache[k] = [end - begin for end, begin in zip(params(models[k]), start.pop(k))]
            finished = clock[k] + T("model_up", k)
            done = len(buffered) == C
            if done and calibrated:                             # every C models: w + Σ_i p_i h_i
                for i in sorted(cache):
                    w = [a + c * (sizes[i] / sum(sizes)) for a, c in zip(w, cache[i])]
                global_model, buffered = w, []
            elif done:                                          # every C models: the |D_k|-weighted average
                total = sum(size for size, _ in buffered)
                global_model = [sum(size * ps[i] for size, ps in buffered) / total for i in range(len(buffered[0][1]))]
                buffered = []
            new = int(rng.choice([j for j in range(N) if j not in active]))
            active[active.index(k)] = new
            del clock[k], steps[k]
            clock[new], steps[new] = finished + T("model_down", new), 0
            if global_model is not None:
                opt.restart(models[new])
                with torch.no_grad():
                    for p, g in zip(models[new].parameters(), global_model):
                        p.copy_(g)
            start[new] = params(models[new])                    # what it holds once joined
            if done:
                break
        yield t, models, global_model, list(order)
