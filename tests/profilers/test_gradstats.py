"""Training constants (profilers.estimate_constants) against closed forms computed with numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from adaptplan.constants import ConvergenceConstants
from adaptplan.errors import InputError
from profilers import build_chain, estimate_constants

N, D, B = 64, 4, 16
RNG = np.random.default_rng(0)
X = RNG.normal(size=(N, D)) * np.array([3.0, 1.0, 0.5, 0.2])  # well separated Hessian eigenvalues
Y = RNG.normal(size=N)


def mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out.squeeze(-1), y)


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.tensor(X[k:k + B], dtype=torch.float64), torch.tensor(Y[k:k + B], dtype=torch.float64))
            for k in range(0, N, B)]


def test_beta_is_the_largest_hessian_eigenvalue_of_a_quadratic_loss() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, 1)).double()
    c = estimate_constants(model, batches(), loss_fn=mse, num_batches=4, beta_batches=4, beta_steps=30)
    Xa = np.hstack([X, np.ones((N, 1))])          # weights and bias
    hessian = 2.0 * Xa.T @ Xa / N                 # f(w) = mean (x·w + b − y)²
    assert c.beta == pytest.approx(np.linalg.eigvalsh(hessian).max(), rel=1e-6)


def test_variances_second_moments_and_theta_match_numpy() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, 3), nn.Identity(), nn.Linear(3, 1)).double()
    W1, b1 = model[0].weight.detach().numpy(), model[0].bias.detach().numpy()
    W2, b2 = model[2].weight.detach().numpy(), model[2].bias.detach().numpy()
    grads1, grads3, losses = [], [], []
    for k in range(0, N, B):  # independent manual backprop of f = mean (W2 (W1 x + b1) + b2 − y)²
        x, y = X[k:k + B], Y[k:k + B]
        h = x @ W1.T + b1
        r = (h @ W2.T + b2).ravel() - y
        losses.append(np.mean(r ** 2))
        dout = 2 * r[:, None] / B
        dh = dout @ W2
        grads1.append(np.concatenate([(dh.T @ x).ravel(), dh.sum(0)]))
        grads3.append(np.concatenate([(dout.T @ h).ravel(), dout.sum(0)]))

    def stats(g: list[np.ndarray]) -> tuple[float, float]:
        g = np.array(g)
        return float(np.mean(np.sum((g - g.mean(0)) ** 2, axis=1))), float(np.mean(np.sum(g ** 2, axis=1)))

    before = [p.detach().clone() for p in model.parameters()]
    chain = build_chain(model, torch.zeros(1, D, dtype=torch.float64), blocks="children")  # Identity = its own block
    c = estimate_constants(chain, batches(), loss_fn=mse, gamma=0.02, epsilon=0.5, num_batches=4)
    (s1, g1), (s3, g3) = stats(grads1), stats(grads3)
    assert c.sigma2 == pytest.approx((s1, 0.0, s3), rel=1e-9, abs=1e-12)
    assert c.G2 == pytest.approx((g1, 0.0, g3), rel=1e-9)
    assert c.theta == pytest.approx(np.mean(losses), rel=1e-12)
    assert (c.gamma, c.epsilon) == (0.02, 0.5)
    assert c.beta > 0
    # the caller's model is untouched
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())
    assert ConvergenceConstants.from_json(c.to_json()) == c


def test_cross_entropy_theta_is_about_ln_classes_for_a_small_cnn() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 10))
    for p in model[3].parameters():
        nn.init.zeros_(p)  # uniform predictions → CE = ln 10 exactly
    data = [(torch.randn(8, 3, 8, 8), torch.randint(0, 10, (8,))) for _ in range(3)]
    c = estimate_constants(model, data, num_batches=3)            # traced: [conv+ReLU+flatten], [linear]
    assert c.theta == pytest.approx(np.log(10), rel=1e-6)
    # the zero head passes no gradient back to the conv block; the head's own gradient is p − y ≠ 0
    assert len(c.sigma2) == 2 and c.G2[0] == 0.0 and c.G2[1] > 0


def test_fewer_than_two_batches_is_an_input_error() -> None:
    with pytest.raises(InputError, match="at least 2"):
        estimate_constants(nn.Sequential(nn.Linear(D, 1)).double(), batches()[:1], loss_fn=mse)
