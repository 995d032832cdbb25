"""Builders the engine tests share: a tiny CNN on the synthetic data set, its partitioned data, an engine of
one algorithm, and the parameters of modules as one vector."""

from __future__ import annotations

import torch
from torch import nn

from trainers.datasets import load_dataset
from trainers.engine import DeviceData, SplitEngine
from trainers.models import cnn
from trainers.partition import partition_indices
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
