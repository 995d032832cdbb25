"""Test-session settings: one torch thread (small models on 2 shared cores run fastest that way)."""

import os

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")


def pytest_configure(config):
    try:
        import torch
    except ImportError:  # the planner's tests do not need torch
        return
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def example():
    """docs/model.md §7's worked example as a PlanningProblem (tests/worked_example.py)."""
    from tests.worked_example import worked_example_problem

    return worked_example_problem()
