"""Leakage per cut (profilers/leakage.py, issue 71 item 1 b and c) against cases whose answer is known and the
formulas written out: dCor 1 for an isometry of the input, near 0 for independent noise; a label-free gradient
gives AUC 0.5, a gradient that is the label gives 1."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from torch import nn

from adaptplan.cli import main
from profilers.leakage import auc, distance_correlation, label_inference_auc, leakage_per_cut


def _hand_dcor(x: list[list[float]], y: list[list[float]]) -> float:
    """Székely's V-statistic with loops: double-centred distance matrices, then dCov² and dCor."""
    n = len(x)

    def centred(v):
        d = [[math.dist(v[k], v[l]) for l in range(n)] for k in range(n)]
        row = [sum(r) / n for r in d]
        col = [sum(d[k][l] for k in range(n)) / n for l in range(n)]
        grand = sum(row) / n
        return [[d[k][l] - row[k] - col[l] + grand for l in range(n)] for k in range(n)]

    a, b = centred(x), centred(y)
    dcov = (lambda p, q: sum(p[k][l] * q[k][l] for k in range(n) for l in range(n)) / n ** 2)
    return math.sqrt(dcov(a, b) / math.sqrt(dcov(a, a) * dcov(b, b)))


def test_distance_correlation_is_the_v_statistic_written_out() -> None:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(12, 3, generator=g), torch.randn(12, 5, generator=g)
    y = y + x.sum(dim=1, keepdim=True) ** 2                      # dependent, not linearly
    assert distance_correlation(x, y) == pytest.approx(_hand_dcor(x.tolist(), y.tolist()), abs=1e-12)


def test_an_isometry_of_the_input_has_dcor_one_and_independent_noise_near_zero() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(300, 2, 4, 4, generator=g)
    rotation, _ = torch.linalg.qr(torch.randn(32, 32, generator=g, dtype=torch.float64))
    assert distance_correlation(x, x) == pytest.approx(1.0, abs=1e-9)
    assert distance_correlation(x, 3.0 * x.reshape(300, -1).double() @ rotation + 1.0) == pytest.approx(1.0, abs=1e-9)
    small, large = (distance_correlation(torch.randn(n, 8, generator=g), torch.randn(n, 8, generator=g))
                    for n in (50, 800))
    assert large < 0.4 * small and large < 0.25                 # the V-statistic's bias, ~1/√n: 16× n, ~¼
    assert distance_correlation(x, torch.zeros(300, 3)) == 0.0
    with pytest.raises(ValueError, match="≥ 2 paired samples"):
        distance_correlation(x[:1], x[:1])


def test_auc_is_the_share_of_correctly_ordered_pairs() -> None:
    rng = np.random.default_rng(2)
    scores, positive = rng.integers(0, 4, 30).astype(float), rng.random(30) < 0.4
    pairs = list(itertools.product(scores[positive], scores[~positive]))
    expected = sum(1.0 if p > q else 0.5 if p == q else 0.0 for p, q in pairs) / len(pairs)
    assert auc(scores, positive) == pytest.approx(expected, abs=1e-12)
    assert auc(np.arange(6.0), np.arange(6) >= 3) == 1.0 and auc(np.ones(6), np.arange(6) >= 3) == 0.5
    assert auc(np.arange(4.0), np.zeros(4, bool)) == 0.5


def test_a_gradient_that_carries_no_label_gives_half_and_the_label_itself_gives_one() -> None:
    labels = torch.arange(40) % 4
    same = torch.ones(40, 6)                                    # every sample's gradient the same: no label in it
    assert label_inference_auc(same, labels) == (0.5, 0.5)
    onehot = nn.functional.one_hot(labels, 6).double() * (1.0 + labels[:, None])   # direction and norm = label
    norm_auc, direction_auc = label_inference_auc(onehot, labels)
    assert direction_auc == 1.0
    ranks = np.arange(4)                                        # norm = c + 1: class c vs rest, then the mean
    expected = np.mean([(np.sum(ranks < c) + 0.0 * np.sum(ranks > c)) / 3 for c in range(4)])
    assert norm_auc == pytest.approx(expected, abs=1e-12)


def test_leakage_per_cut_of_an_identity_cut_and_of_the_logits() -> None:
    """Cut 1 after an identity block: the server sees the input (dCor 1); the gradient at the logits of a linear
    head is softmax − one-hot, whose direction names the label (AUC 1 at any weights)."""
    torch.manual_seed(3)
    blocks = nn.Sequential(nn.Identity(), nn.Flatten(), nn.Linear(16, 5))
    x, y = torch.randn(60, 1, 4, 4), torch.arange(60) % 5
    rows = leakage_per_cut(blocks, x, y)
    assert [r.cut for r in rows] == [1, 2] and rows[0].dcor == pytest.approx(1.0, abs=1e-9)
    head = nn.Sequential(nn.Flatten(), nn.Linear(16, 5), nn.Identity())
    assert leakage_per_cut(head, x, y)[-1].direction_auc == 1.0
    assert blocks.training                                      # the blocks' mode is restored


def test_profile_prints_the_leakage_table_and_needs_a_data_set(capsys) -> None:
    assert main(["profile", "mlp", "--input", "1x8x8", "--leakage", "--dataset", "synthetic",
                 "--leakage-samples", "64"]) == 0
    out = capsys.readouterr().out
    assert "leakage per cut (64 samples of synthetic" in out
    rows = [line.split() for line in out.splitlines()[out.splitlines().index(next(
        line for line in out.splitlines() if line.strip().startswith("j") and "dCor" in line)) + 1:]]
    assert rows and all(0.0 <= float(v) <= 1.0 for row in rows for v in row[1:])
    assert main(["profile", "mlp", "--input", "1x8x8", "--leakage"]) == 2
    assert "--leakage needs --dataset" in capsys.readouterr().err
    # without --input the data set's samples give the shape: the same profile and table
    assert main(["profile", "mlp", "--leakage", "--dataset", "synthetic", "--leakage-samples", "64"]) == 0
    assert capsys.readouterr().out == out
    assert main(["profile", "mlp", "--input", "1x8x9", "--leakage", "--dataset", "synthetic"]) == 2
    assert "synthetic samples are 1x8x8 but --input is 1x8x9" in capsys.readouterr().err


def test_the_direction_attack_scores_every_sample_but_its_known_one() -> None:
    """Per class c: cos(g_k, g_r) with r the first sample of class c, over the samples k ≠ r, pairs written out."""
    g = torch.Generator().manual_seed(4)
    grads, labels = torch.randn(14, 3, generator=g), torch.arange(14) % 2
    expected = []
    for c in (0, 1):
        r = int((labels == c).nonzero()[0])
        cos = {k: float(torch.nn.functional.cosine_similarity(grads[k], grads[r], dim=0)) for k in range(14) if k != r}
        pos = [v for k, v in cos.items() if labels[k] == c]
        neg = [v for k, v in cos.items() if labels[k] != c]
        expected.append(sum(1.0 if p > q else 0.5 if p == q else 0.0 for p in pos for q in neg) / (len(pos) * len(neg)))
    assert label_inference_auc(grads, labels)[1] == pytest.approx(float(np.mean(expected)), abs=1e-12)
