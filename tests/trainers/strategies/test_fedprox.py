"""FedProx (trainers/strategies/fedprox.py) against federated averaging with client sampling written out
(tests/federated_reference.py with ``mu``: each local step's gradient plus μ(w_k − w^t), w^t the global model the
device last loaded), its proximal anchor across a checkpoint, and μ = 0 as FedAvg."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.engine_builders import flat, make_data, small_model
from tests.federated_reference import check_round, federated_reference
from trainers.engine.split_engine import SplitEngine
from trainers.roles.optim import OptimizerSpec, RoleOptimizer
from trainers.strategies import make_strategy

B, LR, N, L = 16, 0.1, 4, 11


def plain_ce(device: int, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits, labels)


def engine(mu: float, rho: float, interval: int, data) -> SplitEngine:
    return SplitEngine(small_model(), [L] * N, make_strategy("fedprox", {"participation": rho, "prox_mu": mu}), data,
                       {"lr": LR}, batch_size=B, seed=0, interval=interval)


@pytest.mark.parametrize("mu,rho,interval", [(1.0, 0.5, 2), (0.3, 1.0, 3)])
def test_fedprox_is_federated_averaging_with_a_proximal_pull(mu: float, rho: float, interval: int) -> None:
    data = make_data(N, "dirichlet")
    run = engine(mu, rho, interval, data)
    for ref in federated_reference(small_model(), data, plain_ce, 6, rho, interval, LR, B, mu=mu):
        check_round(run, ref)


def test_mu_zero_is_fedavg_and_a_positive_mu_is_not() -> None:
    data = make_data(N, "shards")
    made = [SplitEngine(small_model(), [L] * N, make_strategy("fedavg" if k == 0 else "fedprox", options), data,
                        {"lr": LR}, batch_size=B, seed=0, interval=3)
            for k, options in enumerate(({}, {"prox_mu": 0.0}, {"prox_mu": 1.0}))]
    for t in (1, 2, 3):
        for e in made:
            e.run_round(t)
    fedavg, mu0, mu1 = (flat(e.global_model()) for e in made)
    assert torch.equal(fedavg, mu0) and not torch.allclose(fedavg, mu1, atol=1e-6)


def test_the_anchor_is_checkpointed_with_the_device() -> None:
    """Resumed mid-period (round 2 of I = 3), the devices pull towards the period's global model, not towards the
    weights they were saved with: the resumed engine trains as the uninterrupted one, bit for bit."""
    data = make_data(N)
    whole, part = engine(1.0, 1.0, 3, data), engine(1.0, 1.0, 3, data)
    for t in (1, 2):
        whole.run_round(t)
        part.run_round(t)
    state = part.state_dict()
    assert all(len(d["anchor"]) == len(list(small_model().parameters())) for d in state["devices"] if d is not None)
    resumed = engine(1.0, 1.0, 3, data)
    resumed.load_state_dict(state)
    for t in (3, 4):
        whole.run_round(t)
        resumed.run_round(t)
    assert torch.equal(flat(whole.global_model()), flat(resumed.global_model()))


def test_a_checkpointed_anchor_of_the_wrong_shape_is_refused() -> None:
    optimizer = RoleOptimizer(OptimizerSpec(proximal_mu=1.0), nn.Linear(3, 2).parameters())
    for bad in (None, [torch.zeros(2, 3)], [torch.zeros(2, 3), torch.zeros(3)],
                [torch.zeros(2, 3), torch.tensor([0.0, float("nan")])], [torch.zeros(2, 3), torch.zeros(2).long()]):
        with pytest.raises(ValueError, match="device 0's state must hold the proximal anchor"):
            optimizer.load_anchors(bad, "device 0's state")
