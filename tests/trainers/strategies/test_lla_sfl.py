"""LLA-SFL (trainers/strategies/lla_sfl.py) against SplitFed V1 written out (tests/federated_reference.py: every
block the device's own, its client blocks and its server copy) whose device loss is SCALA's eq. (13) with the
device's own label distribution: mean CE(z + τ·log(P_k + 10⁻¹²), y), P_k = device k's samples per class / |𝒟_k|."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from tests.engine_builders import flat, make_data, small_model
from tests.federated_reference import check_round, federated_reference
from trainers.engine.split_engine import SplitEngine
from trainers.strategies import make_strategy

B, LR, N, CUT = 16, 0.1, 4, 4


def adjusted(data, tau: float):
    def loss(device: int, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        counts = np.bincount(data.y_train[torch.from_numpy(data.parts[device])].numpy(), minlength=10)
        prior = torch.tensor(counts / counts.sum(), dtype=torch.float32)
        return nn.functional.cross_entropy(logits + tau * torch.log(prior + 1e-12), labels)
    return loss


@pytest.mark.parametrize("tau,rho,interval", [(1.0, 0.5, 2), (0.5, 1.0, 1)])
def test_lla_sfl_is_splitfed_v1_with_locally_adjusted_losses(tau: float, rho: float, interval: int) -> None:
    data = make_data(N, "shards")
    engine = SplitEngine(small_model(), [CUT] * N, make_strategy("lla-sfl", {"participation": rho, "la_tau": tau}),
                         data, {"lr": LR}, batch_size=B, seed=0, interval=interval)
    for ref in federated_reference(small_model(), data, adjusted(data, tau), 4, rho, interval, LR, B):
        check_round(engine, ref)      # every block: the client's on the device, the others in the edge's copy of i's
        (evaluated,) = engine.strategy.eval_models(engine)
        if ref.t >= interval:
            assert torch.allclose(flat(evaluated), flat(ref.global_model), atol=1e-6, rtol=0), ref.t


def test_tau_zero_is_splitfed_v1() -> None:
    data = make_data(N, "shards")
    runs = [SplitEngine(small_model(), [CUT] * N, make_strategy(name, options), data, {"lr": LR}, batch_size=B,
                        seed=0, interval=2)
            for name, options in (("sfl-v1", {"participation": 0.5}), ("lla-sfl", {"participation": 0.5,
                                                                                   "la_tau": 0.0}))]
    for t in (1, 2, 3):
        for engine in runs:
            engine.run_round(t)
    assert torch.equal(flat(runs[0].global_model()), flat(runs[1].global_model()))
