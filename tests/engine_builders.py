"""Builders the engine tests share: a tiny CNN on the synthetic data set, its partitioned data, an engine of
one algorithm, and the parameters of modules as one vector."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from trainers.engine.clock import StageTimes
from trainers.engine.split_engine import DeviceData, SplitEngine
from trainers.inputs.datasets import load_dataset
from trainers.inputs.models import cnn
from trainers.inputs.partition import partition_indices
from trainers.strategies import make_strategy


def small_model(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return cnn(1, 8, 10, width=4)        # passed as is: its 11 children are the blocks; input (1, 8, 8)


def make_data(devices: int, partition: str = "iid") -> DeviceData:
    d = load_dataset("synthetic")
    parts = partition_indices(d.y_train.numpy(), devices, partition, seed=0)
    return DeviceData(d.x_train, d.y_train, d.x_test, d.y_test, parts)


def make_engine(algorithm: str, cuts, devices: int, interval: int = 1, lr: float = 0.1, momentum: float = 0.0,
                batch_devices: bool = True, model: nn.Sequential | None = None) -> SplitEngine:
    return SplitEngine(model or small_model(), cuts, make_strategy(algorithm), make_data(devices),
                       {"lr": lr, "momentum": momentum}, batch_size=16, seed=0, interval=interval,
                       batch_devices=batch_devices)


def flat(*modules: nn.Module) -> torch.Tensor:
    """All parameters of ``modules`` as one detached vector."""
    return torch.cat([p.detach().reshape(-1) for m in modules for p in m.parameters()])


def params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


# A clock with fixed, distinct per-device stage seconds (tests/trainers/engine/test_engine_timing.py writes its rounds out).
B = 16
#                     device 0   device 1   device 2
FP = np.array([3.0, 1.0, 2.0])       # T^F, per b samples
UP = np.array([2.0, 0.5, 0.25])      # T^A   → arrivals at the edge server (k = 1): 5, 1.5, 2.25
SERVER = np.array([0.5, 0.25, 0.125])
DOWN = np.array([0.5, 0.25, 1.0])
BP = np.array([1.0, 2.0, 0.5])
MODEL_UP = np.array([4.0, 8.0, 2.0])
MODEL_DOWN = np.array([1.0, 3.0, 5.0])
# the edge server's non-common part in the AdaptSFL case below: block 3 of the small CNN, Conv2d(4, 8, 3×3):
# 8·4·9 weights + 8 biases = 296 float32 = 9,472 bits; its links take 20 s up and 16 s down for them
EDGE_BITS = 8 * 4 * (8 * 4 * 3 * 3 + 8)
E2F, F2E = EDGE_BITS / 20.0, EDGE_BITS / 16.0


class FixedClock:
    """The same stage seconds every round, whatever the cuts."""

    def __init__(self, times: StageTimes | None = None) -> None:
        self.times = times or StageTimes(FP, UP, SERVER, DOWN, BP, MODEL_UP, MODEL_DOWN, E2F, F2E, B)
        self.rounds: list[int] = []

    def stage_times(self, round_index, cuts):
        self.rounds.append(round_index)
        return self.times


def random_times(n: int, seed: int = 0) -> StageTimes:
    """Chosen per-device stage seconds for ``n`` devices (what a SimClock would give a heterogeneous network), drawn
    once from ``seed``: devices interleave on the asynchronous loop (GAS, FedBuff) with no ties."""
    r = np.random.default_rng(seed)
    return StageTimes(client_fp=r.uniform(0.1, 3.0, n), upload=r.uniform(0.1, 3.0, n), server=r.uniform(0.01, 0.3, n),
                      download=r.uniform(0.1, 1.0, n), client_bp=r.uniform(0.1, 2.0, n),
                      model_up=r.uniform(0.5, 2.0, n), model_down=r.uniform(0.5, 2.0, n), edge_to_fed_bps=1e9,
                      fed_to_edge_bps=1e9, batch_size=B)


def cuts_for(algorithm: str, cuts: list[int], num_blocks: int) -> list[int]:
    """``cuts`` for a split algorithm; cut L on every device for one of the whole model (the registry's
    ``whole_model``: FedAvg, FedLC), so that registry-driven tests give every algorithm a cut it takes."""
    from trainers.algorithms import REGISTRY

    return [REGISTRY[algorithm].cut_for(cut, num_blocks) for cut in cuts]
