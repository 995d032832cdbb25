"""The edge server's passes (trainers/roles/passes.py) at their documented edges: a pass budget met exactly and
passed by one sample, an activation that is not finite, two activations of one device in a pass."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainers.roles.core import EdgeServer
from trainers.roles.messages import Activation, MessageMismatchError, NonFiniteError
from trainers.roles.optim import OptimizerSpec
from trainers.roles.passes import EdgePasses


def passes(budget: int | None) -> EdgePasses:
    """Blocks 1 and 2 of a 3-block chain on the edge, one shared copy, at most ``budget`` samples a pass."""
    chain = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    return EdgePasses(EdgeServer(chain, [1, 1], lambda d, j, lc: None, OptimizerSpec("sgd", 0.1)), pass_samples=budget)


def test_a_pass_budget_met_exactly_is_one_pass_and_one_sample_more_is_two() -> None:
    edge = passes(8)
    assert edge.spans(8) == [slice(0, 8)]                                   # the documented limit, inside
    assert edge.spans(9) == [slice(0, 8), slice(8, 9)]                      # just outside
    arrivals = [Activation(d, 1, 0, torch.zeros(4, 4), torch.zeros(4, dtype=torch.long)) for d in (0, 1)]
    assert [[a.device for a in c] for c in edge.chunks(arrivals)] == [[0, 1]]           # 4 + 4 = 8: one pass
    wider = [Activation(0, 1, 0, torch.zeros(5, 4), torch.zeros(5, dtype=torch.long)), arrivals[1]]
    assert [[a.device for a in c] for c in edge.chunks(wider)] == [[0], [1]]          # 5 + 4 = 9: two


def test_an_activation_that_is_not_finite_is_refused_naming_its_round_and_device() -> None:
    bad = torch.zeros(2, 4)
    bad[1, 2] = float("nan")
    with pytest.raises(NonFiniteError, match=r"activation message.*round 3.*device 1"):
        passes(None).run([Activation(1, 3, 0, bad, torch.zeros(2, dtype=torch.long))])


def test_two_activations_of_one_device_in_a_pass_are_refused() -> None:
    a = Activation(0, 2, 0, torch.zeros(2, 4), torch.zeros(2, dtype=torch.long))
    with pytest.raises(MessageMismatchError, match=r"two activations from device 0 in one server pass \(round 2\)"):
        passes(None).run([a, a])
