"""Estimation of the training constants of Assumptions 1–2 (spec/adaptsfl.md §3; estimation
procedure of §5.4 "Parameter estimation", after Wang et al. [29]).

Given B mini-batches ξ_1..ξ_B and the initial weights w⁰ (the model as given), with the chain's
blocks j = 1..L (a copy; the caller's model, its buffers and gradients are not touched):

* g_{j,b} = ∇_{w_j} F(w⁰; ξ_b), the mini-batch gradient of block j's parameters (training mode;
  the random state is re-seeded per batch so dropout masks are reproducible).
* σ_j² = (1/B) Σ_b ‖g_{j,b} − ḡ_j‖² with ḡ_j = (1/B) Σ_b g_{j,b} (trace of the empirical
  covariance, biased 1/B form); G_j² = (1/B) Σ_b ‖g_{j,b}‖². Blocks without parameters: 0.
* ϑ = f(w⁰) = (1/B) Σ_b F(w⁰; ξ_b): an upper bound on f(w⁰) − f* when f* ≥ 0 (cross-entropy).
* β: power iteration on gradient differences of f_β(w) = mean loss over the first
  ``beta_batches`` batches (same seeds at every evaluation, so f_β is one deterministic
  function): δ⁰ random with ‖δ⁰‖ = r = ``beta_radius``·max(‖w⁰‖, 1); for k = 0..K−1
  (K = ``beta_steps``): d^k = ∇f_β(w⁰ + δ^k) − ∇f_β(w⁰), ratio_k = ‖d^k‖ / ‖δ^k‖,
  δ^{k+1} = r·d^k/‖d^k‖. β̂ = max_k ratio_k. For a quadratic f_β this is the power method on the
  Hessian, so β̂ → its largest |eigenvalue| (the exact smoothness constant); for a network it is a
  finite-difference estimate of the local curvature along the steepest direction.
"""

from __future__ import annotations

import copy
import itertools
import math
from typing import Callable, Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from adaptplan.constants import ConvergenceConstants
from adaptplan.errors import InputError
from profilers.chain import Chain, build_chain

Batch = tuple[torch.Tensor, torch.Tensor]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def iterate_batches(x: torch.Tensor, y: torch.Tensor, batch_size: int, num_batches: int, seed: int = 0) -> Iterator[Batch]:
    """``num_batches`` mini-batches of ``batch_size`` samples drawn without replacement (fixed seed)."""
    if batch_size < 1 or num_batches < 1:
        raise InputError(f"batch size and number of batches must be ≥ 1, got {batch_size} and {num_batches}", field="--batch-size/--batches")
    if batch_size * num_batches > len(x):
        raise InputError(f"{num_batches} batches of {batch_size} need {batch_size * num_batches} samples but the data has {len(x)}; "
                         "use fewer or smaller batches", field="--batches")
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    for b in range(num_batches):
        index = order[b * batch_size:(b + 1) * batch_size]
        yield x[index], y[index]


def estimate_constants(chain_or_model: Chain | nn.Module, batches: Iterable[Batch], loss_fn: LossFn = F.cross_entropy,
                       gamma: float = 0.01, epsilon: float = 0.1, num_batches: int = 8, beta_steps: int = 5,
                       beta_batches: int = 2, beta_radius: float = 1e-3, seed: int = 0,
                       progress: bool = False) -> ConvergenceConstants:
    """Estimate (β, σ_j², G_j², ϑ) per the module docstring; γ and ε are passed through.

    Args:
        chain_or_model: a :class:`Chain` (constants per its blocks) or a model (chained with
            :func:`build_chain` on the first batch).
        batches: iterable of (inputs, targets); the first ``num_batches`` are used (≥ 2).
        loss_fn: ``loss_fn(outputs, targets)`` → scalar mean loss (default cross-entropy).
        gamma: learning rate γ (dimensionless, must be ≤ 1/β for Theorem 1; not checked here).
        epsilon: target average squared gradient norm ε.
        beta_steps, beta_batches, beta_radius: the β power iteration (K, batches, relative r).
        progress: tqdm progress bar.

    Returns:
        ConvergenceConstants with one σ_j², G_j² per block (cut point).
    """
    for value, name in ((gamma, "gamma"), (epsilon, "epsilon"), (beta_radius, "beta_radius")):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise InputError(f"must be a finite number > 0, got {value!r}", field=name)
    data = list(itertools.islice(batches, num_batches))
    if len(data) < 2:
        raise InputError(f"need at least 2 mini-batches to estimate a variance, got {len(data)}", field="batches")
    chain = chain_or_model if isinstance(chain_or_model, Chain) else build_chain(chain_or_model, data[0][0][:1])
    blocks = copy.deepcopy(chain.blocks).train()
    groups = [list(block.parameters()) for block in blocks]
    sums = [torch.zeros(sum(p.numel() for p in g), dtype=torch.float64) for g in groups]
    square_sums = [0.0 for _ in groups]
    losses = []
    steps = range(len(data))
    if progress:
        from tqdm import tqdm

        steps = tqdm(steps, desc="gradient statistics", unit="batch", leave=False)
    for b in steps:
        loss = _loss_and_grad(blocks, data[b], loss_fn, seed + b)
        losses.append(loss)
        for j, group in enumerate(groups):
            g = _flat_grad(group)
            sums[j] += g
            square_sums[j] += float(g.square().sum())
    n = len(data)
    G2 = tuple(s / n for s in square_sums)
    sigma2 = tuple(max(G2[j] - float((sums[j] / n).square().sum()), 0.0) for j in range(len(groups)))
    beta = _smoothness(blocks, data[:max(1, min(beta_batches, n))], loss_fn, beta_steps, beta_radius, seed)
    return ConvergenceConstants(beta=beta, gamma=float(gamma), theta=sum(losses) / n, epsilon=float(epsilon),
                                sigma2=sigma2, G2=G2)


def _loss_and_grad(blocks: nn.Module, batch: Batch, loss_fn: LossFn, seed: int) -> float:
    """Zero the gradients, then backpropagate ``loss_fn`` on ``batch`` with a fixed random state."""
    blocks.zero_grad(set_to_none=True)
    x, y = batch
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        loss = loss_fn(blocks(x), y)
    if loss.dim() != 0 or not torch.isfinite(loss):
        raise InputError(f"the loss must be a finite scalar, got {loss.detach()!r}", field="loss_fn")
    loss.backward()
    return float(loss.detach())


def _flat_grad(parameters: list[nn.Parameter]) -> torch.Tensor:
    """Concatenated gradients (zeros where a parameter got none), float64."""
    if not parameters:
        return torch.zeros(0, dtype=torch.float64)
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).double() for p in parameters])


def _mean_gradient(blocks: nn.Module, data: list[Batch], loss_fn: LossFn, seed: int) -> torch.Tensor:
    params = list(blocks.parameters())
    total = torch.zeros(sum(p.numel() for p in params), dtype=torch.float64)
    for b, batch in enumerate(data):
        _loss_and_grad(blocks, batch, loss_fn, seed + b)
        total += _flat_grad(params)
    return total / len(data)


def _smoothness(blocks: nn.Module, data: list[Batch], loss_fn: LossFn, steps: int, radius: float, seed: int) -> float:
    """β̂ by power iteration on gradient differences (module docstring)."""
    params = list(blocks.parameters())
    if not params:
        raise InputError("the model has no parameters, so there is nothing to train", field="model")
    w0 = nn.utils.parameters_to_vector(params).detach().clone()
    r = radius * max(float(w0.norm()), 1.0)
    g0 = _mean_gradient(blocks, data, loss_fn, seed)
    delta = torch.randn(w0.numel(), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    delta *= r / float(delta.norm())
    beta = 0.0
    try:
        for _ in range(max(1, steps)):
            nn.utils.vector_to_parameters((w0.double() + delta).to(w0.dtype), params)
            actual = nn.utils.parameters_to_vector(params).detach().double() - w0.double()  # δ after rounding
            diff = _mean_gradient(blocks, data, loss_fn, seed) - g0
            beta = max(beta, float(diff.norm()) / float(actual.norm()))
            if float(diff.norm()) == 0.0:
                break
            delta = diff * (r / float(diff.norm()))
    finally:
        nn.utils.vector_to_parameters(w0, params)
        blocks.zero_grad(set_to_none=True)
    return beta
