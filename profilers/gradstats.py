"""Estimation of the training constants of Assumptions 1–2 (docs/model.md §3; estimation
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
                       progress: bool = False, device: torch.device | str | None = None) -> ConvergenceConstants:
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
        device: where the statistics are computed (the model copy and the batches are moved there;
            None = where the model is).

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
    if device is None:
        device = next((p.device for p in blocks.parameters()), torch.device("cpu"))
    blocks = blocks.to(device)
    data = [(x.to(device), y.to(device)) for x, y in data]
    groups = [list(block.parameters()) for block in blocks]
    if not any(groups):  # before any backward pass, which would fail with a bare RuntimeError
        raise InputError("the model has no parameters, so there is nothing to train", field="model")
    sums = [[torch.zeros_like(p, dtype=torch.float64) for p in g] for g in groups]
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
            _accumulate(sums[j], group)
            square_sums[j] += _squared_norm(_grads(group))
    n = len(data)
    G2 = tuple(s / n for s in square_sums)
    sigma2 = tuple(max(G2[j] - _squared_norm(sums[j]) / n**2, 0.0) for j in range(len(groups)))
    beta = _smoothness(blocks, data[:max(1, min(beta_batches, n))], loss_fn, beta_steps, beta_radius, seed, progress)
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


def _grads(parameters: list[nn.Parameter]) -> list[torch.Tensor]:
    """Each parameter's gradient (zeros where it got none)."""
    return [p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters]


def _accumulate(totals: list[torch.Tensor], parameters: list[nn.Parameter], scale: float = 1.0) -> None:
    """``totals[k] += scale · grad_k`` in place (float64 totals; no model-sized temporaries)."""
    for total, grad in zip(totals, _grads(parameters)):
        total.add_(grad, alpha=scale)


def _squared_norm(tensors: list[torch.Tensor]) -> float:
    """Σ_k ‖t_k‖², accumulated in float64 one tensor at a time."""
    return sum(float(torch.linalg.vector_norm(t, dtype=torch.float64)) ** 2 for t in tensors)


def _mean_gradient(blocks: nn.Module, data: list[Batch], loss_fn: LossFn, seed: int) -> list[torch.Tensor]:
    """(1/B) Σ_b ∇F(w; batch b), per parameter, float64."""
    params = list(blocks.parameters())
    totals = [torch.zeros_like(p, dtype=torch.float64) for p in params]
    for b, batch in enumerate(data):
        _loss_and_grad(blocks, batch, loss_fn, seed + b)
        _accumulate(totals, params, 1.0 / len(data))
    return totals


def _smoothness(blocks: nn.Module, data: list[Batch], loss_fn: LossFn, steps: int, radius: float, seed: int,
                progress: bool = False) -> float:
    """β̂ by power iteration on gradient differences (module docstring); per-parameter float64 vectors."""
    params = list(blocks.parameters())
    if not params:
        raise InputError("the model has no parameters, so there is nothing to train", field="model")
    w0 = [p.detach().clone() for p in params]
    r = radius * max(math.sqrt(_squared_norm(w0)), 1.0)
    g0 = _mean_gradient(blocks, data, loss_fn, seed)
    generator = torch.Generator().manual_seed(seed)
    delta = [torch.randn(p.shape, generator=generator, dtype=torch.float64).to(p.device) for p in params]
    scale = r / math.sqrt(_squared_norm(delta))
    delta = [d.mul_(scale) for d in delta]
    beta = 0.0
    iterations = range(max(1, steps))
    if progress:
        from tqdm import tqdm

        iterations = tqdm(iterations, desc="smoothness beta (power iteration)", unit="step", leave=False)
    try:
        with torch.no_grad():
            for _ in iterations:
                for p, w, d in zip(params, w0, delta):
                    p.copy_(w.double() + d)
                actual = math.sqrt(sum(float(torch.linalg.vector_norm(p.double() - w.double())) ** 2
                                       for p, w in zip(params, w0)))  # δ after rounding to the parameter dtype
                with torch.enable_grad():
                    diff = [g.sub_(g_ref) for g, g_ref in zip(_mean_gradient(blocks, data, loss_fn, seed), g0)]
                diff_norm = math.sqrt(_squared_norm(diff))
                beta = max(beta, diff_norm / actual)
                if diff_norm == 0.0:
                    break
                delta = [d.mul_(r / diff_norm) for d in diff]
    finally:
        with torch.no_grad():
            for p, w in zip(params, w0):
                p.copy_(w)
        blocks.zero_grad(set_to_none=True)
    return beta
