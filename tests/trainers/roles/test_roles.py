"""The roles (trainers/roles/core.py): what a device knows about its data."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from trainers.roles.core import Device
from trainers.roles.optim import OptimizerSpec

torch.set_num_threads(1)


def test_a_device_knows_its_data_size_and_label_histogram() -> None:
    x = torch.zeros(8, 2)
    y = torch.tensor([0, 1, 1, 2, 2, 2, 3, 0])
    dev = Device(0, nn.Sequential(nn.Linear(2, 2)), 1, x, y, np.array([1, 2, 5, 6]), 2, 0, OptimizerSpec())
    assert dev.data_size == 4
    assert dev.label_counts(5).tolist() == [0, 2, 1, 1, 0]          # labels 1, 1, 2, 3
