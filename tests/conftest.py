"""Test-session settings: one torch thread (small models on 2 shared cores run fastest that way)."""

import os

os.environ.setdefault("MPLBACKEND", "Agg")


def pytest_configure(config):
    try:
        import torch
    except ImportError:  # the planner's tests do not need torch
        return
    torch.set_num_threads(1)
