"""What a cut gives away to an honest-but-curious edge server (issue 71 item 1, parts b and c), per valid cut of a
chain, measured on samples of a stated data set at the model's given weights (docs/privacy.md):

* **distance correlation** dCor(X, A_j) between the inputs X and the cut-layer activations A_j the server receives
  (Székely, Rizzo & Bakirov 2007; the quantity NoPeek penalises, Vepakomma et al. 2020): with a_{kl} = ‖x_k − x_l‖
  and b_{kl} = ‖a_k − a_l‖ (Euclidean, each sample flattened), double-centred A_{kl} = a_{kl} − ā_{k·} − ā_{·l} + ā_{··}
  (likewise B), dCov²(X, Y) = (1/n²) Σ_{kl} A_{kl} B_{kl} and dCor² = dCov²(X, Y) / √(dCov²(X, X) · dCov²(Y, Y))
  (the V-statistic; 1 for Y an isometry of X, 0 in the limit for independent X and Y, biased upwards at small n);
* **label inference from the returned gradients** (Li et al., "Label leakage and protection in two-party split
  learning", ICLR 2022), for algorithms whose server returns ∂F/∂a_j per sample: the *norm* attack scores sample k
  by ‖g_k‖, the *direction* attack by cos(g_k, g_r) with g_r the gradient of one sample of the class the attacker
  knows; each as the AUC of separating class c from the rest, averaged over the classes (one-vs-rest; Li et al.
  state the binary case). 0.5 = no leakage, 1 = every label read off.

The AUC is the Mann–Whitney statistic: P(score of a positive > score of a negative) + ½ P(tie).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
from scipy.stats import rankdata
from torch import nn


def _double_centred(x: torch.Tensor) -> torch.Tensor:
    d = torch.cdist(x, x)
    return d - d.mean(dim=0, keepdim=True) - d.mean(dim=1, keepdim=True) + d.mean()


def distance_correlation_tensor(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """dCor(X, Y) ∈ [0, 1] of n paired samples (module docstring), each flattened, as a 0-d tensor in the inputs'
    dtype that autograd differentiates (NoPeek's penalty, trainers/roles/defences.py); 0 when either sample is
    constant (no dependence can be measured), still on the inputs' graph with a zero gradient (a device whose
    activations NoPeek has made constant steps on). The square root is taken of max(dCor², 10⁻¹²), so its
    gradient stays finite at independence."""
    if x.shape[0] != y.shape[0] or x.shape[0] < 2:
        raise ValueError(f"distance correlation needs ≥ 2 paired samples, got {x.shape[0]} and {y.shape[0]}")
    a, b = (_double_centred(t.reshape(t.shape[0], -1)) for t in (x, y))
    dcov_xy, dcov_xx, dcov_yy = (a * b).mean(), (a * a).mean(), (b * b).mean()
    if dcov_xx <= 0 or dcov_yy <= 0:
        return dcov_xy * 0.0
    return torch.sqrt(torch.clamp(dcov_xy / torch.sqrt(dcov_xx * dcov_yy), min=1e-12))


def distance_correlation(x: torch.Tensor, y: torch.Tensor) -> float:
    """dCor(X, Y) ∈ [0, 1] of n paired samples (module docstring), each flattened, in float64."""
    value = distance_correlation_tensor(x.detach().double(), y.detach().double())
    return 0.0 if float(value) <= 1e-6 else float(value)


def auc(scores: np.ndarray, positive: np.ndarray) -> float:
    """The AUC of ``scores`` separating ``positive`` (booleans) from the rest (module docstring); 0.5 when either
    side is empty."""
    positive = np.asarray(positive, dtype=bool)
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        return 0.5
    ranks = rankdata(np.asarray(scores, dtype=np.float64))          # ties get their mean rank
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def label_inference_auc(gradients: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
    """(norm attack AUC, direction attack AUC) over the per-sample gradients ``gradients`` (n × …), one-vs-rest
    averaged over the classes present; the direction attack's reference for class c is its first sample."""
    g = gradients.reshape(gradients.shape[0], -1).double()
    y = labels.cpu().numpy()
    norms = g.norm(dim=1).cpu().numpy()
    unit = g / g.norm(dim=1, keepdim=True).clamp_min(1e-300)
    norm_aucs, direction_aucs = [], []
    for c in np.unique(y):
        positive = y == c
        norm_aucs.append(auc(norms, positive))
        reference = int(np.flatnonzero(positive)[0])
        others = np.arange(len(y)) != reference                   # the known sample itself is not scored
        cosine = (unit @ unit[reference]).cpu().numpy()
        direction_aucs.append(auc(cosine[others], positive[others]))
    return float(np.mean(norm_aucs)), float(np.mean(direction_aucs))


@dataclass(frozen=True)
class CutLeakage:
    """One cut's figures: ``cut`` j (1-based), ``dcor`` dCor(X, A_j), the label-inference AUCs from ∂F/∂A_j."""

    cut: int
    dcor: float
    norm_auc: float
    direction_auc: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


Release = Callable[[torch.Tensor], torch.Tensor]
"""What a device does to its cut activation before the server sees it (a defence, trainers/roles/defences.py)."""


def _cut_gradient(blocks: nn.Sequential, j: int, a: torch.Tensor, labels: torch.Tensor,
                  head: tuple[int, Release] | None) -> torch.Tensor:
    """Each sample's ∂CE/∂a at cut j (the summed loss's gradient), through a U-shaped head's release if ``head``
    (:func:`leakage_per_cut`)."""
    if head is None or j > head[0]:
        return torch.autograd.grad(nn.functional.cross_entropy(blocks[j:](a), labels, reduction="sum"), a)[0]
    k, release = head
    h = blocks[j:k](a)
    top = h.detach().requires_grad_(True)
    released = release(torch.autograd.grad(nn.functional.cross_entropy(blocks[k:](top), labels, reduction="sum"),
                                           top)[0])
    return released if j == k else torch.autograd.grad(h, a, grad_outputs=released)[0]


def leakage_per_cut(blocks: nn.Sequential, x: torch.Tensor, y: torch.Tensor, release: Release | None = None,
                    cuts: Sequence[int] | None = None, sent_labels: torch.Tensor | None = None,
                    head: tuple[int, Release] | None = None) -> list[CutLeakage]:
    """The figures of every cut j = 1..L−1 of ``blocks`` (a chain; ``cuts``: those only) on samples ``x`` with
    labels ``y``, at the blocks' current weights in eval mode (no dropout, BatchNorm's running statistics: samples
    stay independent), of the activations as ``release`` turns them out (default: as computed). The gradient is
    that of the mean cross-entropy over the n samples, times n (each sample's own ∂F_k/∂a_k), at the released
    activation, on the labels the devices sent (``sent_labels``, under randomised response; default ``y``); the
    attacks are scored against the true ``y``. ``head`` = (k, release) for a U-shaped split whose head (blocks k..)
    sends its per-sample gradients at cut k as ``release`` turns them out: the gradient at cut j ≤ k is then the
    released one back-propagated through blocks j..k−1, as the edge server computes it."""
    was_training = blocks.training
    blocks.eval()
    out = []
    try:
        h = x
        with torch.no_grad():
            activations = []
            for block in blocks[:-1]:
                h = block(h)
                activations.append(h)
        for j, a in enumerate(activations, start=1):
            if cuts is not None and j not in cuts:
                continue
            with torch.no_grad():
                a = a if release is None else release(a)
            a = a.detach().requires_grad_(True)
            grad = _cut_gradient(blocks, j, a, y if sent_labels is None else sent_labels, head)
            norm_auc, direction_auc = label_inference_auc(grad, y)
            out.append(CutLeakage(j, distance_correlation(x, a.detach()), norm_auc, direction_auc))
    finally:
        blocks.train(was_training)
    return out
