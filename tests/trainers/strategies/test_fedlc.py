"""FedLC (trainers/strategies/fedlc.py) against federated averaging with client sampling written out
(tests/federated_reference.py) whose device loss is FedLC's calibrated cross-entropy, written out here:
−log softmax(s − τ·n_k^(−1/4))_y averaged over the batch, n_k device k's samples per class with a missing class
counted as 10⁻⁸."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.engine_builders import flat, make_data, small_model
from tests.federated_reference import check_round, federated_reference
from trainers.api import calibrated_ce
from trainers.engine.split_engine import SplitEngine
from trainers.strategies import make_strategy

B, LR, N, L = 16, 0.1, 4, 11


def counts_of(data, device: int) -> np.ndarray:
    return np.bincount(data.y_train[torch.from_numpy(data.parts[device])].numpy(), minlength=10)


def calibrated(data, tau: float):
    def loss(device: int, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        n = torch.tensor(np.maximum(counts_of(data, device), 1e-8), dtype=torch.float32)
        shifted = logits - tau * n ** -0.25
        return -(shifted.gather(1, labels[:, None]).squeeze(1) - torch.logsumexp(shifted, 1)).mean()
    return loss


@pytest.mark.parametrize("tau,rho,interval", [(1.0, 0.5, 2), (0.5, 1.0, 1)])
def test_fedlc_is_federated_averaging_of_calibrated_losses(tau: float, rho: float, interval: int) -> None:
    data = make_data(N, "shards")                     # devices that lack classes: their logits pushed down by 100·τ
    assert any((counts_of(data, i) == 0).any() for i in range(N))
    engine = SplitEngine(small_model(), [L] * N, make_strategy("fedlc", {"participation": rho, "lc_tau": tau}), data,
                         {"lr": LR}, batch_size=B, seed=0, interval=interval)
    for ref in federated_reference(small_model(), data, calibrated(data, tau), 4, rho, interval, LR, B):
        check_round(engine, ref)


def test_tau_zero_is_fedavg() -> None:
    data = make_data(N, "shards")
    runs = [SplitEngine(small_model(), [L] * N, make_strategy(name, options), data, {"lr": LR}, batch_size=B, seed=0,
                        interval=2) for name, options in (("fedavg", {}), ("fedlc", {"lc_tau": 0.0}))]
    for t in (1, 2, 3):
        for engine in runs:
            engine.run_round(t)
    assert torch.equal(flat(runs[0].global_model()), flat(runs[1].global_model()))


def test_the_calibrated_loss_by_hand() -> None:
    """Two classes, logits 0 and 0, counts 16 and none: the calibrated logits are −τ/2 and −100τ; for label 0 the
    loss is log(1 + e^(τ/2 − 100τ)), for label 1 log(1 + e^(100τ − τ/2))."""
    tau = 0.1
    logits, counts = torch.zeros(2, 2), np.array([16, 0])
    got = calibrated_ce(logits, torch.tensor([0, 1]), counts, tau)
    expected = (math.log1p(math.exp(tau / 2 - 100 * tau)) + math.log1p(math.exp(100 * tau - tau / 2))) / 2
    assert got.item() == pytest.approx(expected, rel=1e-6)
