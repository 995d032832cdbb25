"""Model inversion per cut (profilers/inversion.py, issue 71 item 1a) against cases whose answer is known: SSIM
against scipy's Gaussian filter written into Wang et al.'s formula, PSNR's formula, an identity cut reconstructed
exactly, an activation independent of the input reconstructed no better than the auxiliary mean."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.ndimage import gaussian_filter
from torch import nn

from profilers.inversion import invert_per_cut, mean_image_figures, psnr, save_figure, ssim, to_pixels


def reference_ssim(x: np.ndarray, y: np.ndarray) -> float:
    """Wang et al. 2004 per channel with scipy's Gaussian filter (σ = 1.5, truncated at radius 5: 11 taps), the
    filtered maps kept where the window lies inside the image, averaged."""
    c1, c2, r = 0.01 ** 2, 0.03 ** 2, 5
    values = []
    for a, b in zip(x.reshape(-1, *x.shape[-2:]), y.reshape(-1, *y.shape[-2:])):
        def f(t):
            return gaussian_filter(t, 1.5, truncate=3.5, mode="constant")[r:-r, r:-r]
        ma, mb = f(a), f(b)
        va, vb, cab = f(a * a) - ma ** 2, f(b * b) - mb ** 2, f(a * b) - ma * mb
        values.append((((2 * ma * mb + c1) * (2 * cab + c2)) / ((ma ** 2 + mb ** 2 + c1) * (va + vb + c2))).mean())
    return float(np.mean(values))


def test_ssim_is_wang_et_al_and_one_for_equal_images() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(3, 2, 16, 13, generator=g, dtype=torch.float64)
    y = (x + 0.1 * torch.randn(3, 2, 16, 13, generator=g, dtype=torch.float64)).clamp(0, 1)
    assert ssim(x, x) == pytest.approx(1.0, abs=1e-12)
    assert ssim(x, y) == pytest.approx(reference_ssim(x.numpy(), y.numpy()), rel=1e-10)
    assert ssim(x, y) == pytest.approx(ssim(y, x), rel=1e-12) and ssim(x, y) < 0.95
    with pytest.raises(ValueError):
        ssim(x[..., :10, :10], y[..., :10, :10])                               # smaller than the window


def test_psnr_and_pixels() -> None:
    assert psnr(0.01) == pytest.approx(20.0) and psnr(1e-4, data_range=2.0) == pytest.approx(10 * math.log10(4e4))
    assert psnr(0.0) == math.inf
    x = torch.tensor([[[[0.5]], [[-1.0]]]])                                    # two channels, normalised
    assert to_pixels(x, (0.2, 0.9), (0.4, 0.1)).flatten().tolist() == pytest.approx([0.4, 0.8])


class Head(nn.Module):
    def __init__(self, features: int) -> None:
        super().__init__()
        self.fc = nn.Linear(features, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


class Noise(nn.Module):
    """An activation independent of the input: fresh Gaussian noise of the input's shape."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.randn(x.shape, generator=torch.Generator().manual_seed(x.shape[0]))


def images(n: int, seed: int) -> torch.Tensor:
    """Smooth random images 1 × 11 × 11 in [0, 1] (a blurred field, so SSIM has structure to find)."""
    g = torch.Generator().manual_seed(seed)
    field = torch.rand(n, 1, 15, 15, generator=g)
    return nn.functional.avg_pool2d(field, 5, stride=1)


def test_an_identity_cut_is_inverted_exactly_and_a_noise_cut_not_at_all() -> None:
    """121 pixels, 200 auxiliary samples: the linear decoder recovers an identity cut (PSNR > 40 dB, SSIM > 0.99);
    for noise the reconstruction is the auxiliary mean's (its PSNR and SSIM within 0.05 dB and 0.02: ridge's
    leave-one-out λ and the MLP's early stop keep the attacker from fitting the noise)."""
    auxiliary, targets = images(200, 1), images(40, 2)
    exact, rebuilt = invert_per_cut(nn.Sequential(nn.Identity(), Head(121)), auxiliary, targets, steps=20)
    assert len(exact) == 1 and exact[0].cut == 1
    assert exact[0].psnr > 40 and exact[0].ssim > 0.99
    assert rebuilt[0].shape == targets.shape
    blind, _ = invert_per_cut(nn.Sequential(Noise(), Head(121)), auxiliary, targets, steps=20)
    mean_image = auxiliary.mean(0, keepdim=True).expand_as(targets)
    assert blind[0].psnr == pytest.approx(psnr(float(((mean_image - targets) ** 2).mean())), abs=0.05)
    assert blind[0].ssim == pytest.approx(ssim(mean_image, targets), abs=0.02)
    nothing = mean_image_figures(auxiliary, targets)
    assert (nothing.psnr, nothing.ssim) == pytest.approx((psnr(float(((mean_image - targets) ** 2).mean())),
                                                          ssim(mean_image, targets)), rel=1e-6)
    assert exact[0].psnr > blind[0].psnr + 15


def test_the_figure_has_a_row_per_cut(tmp_path) -> None:
    import matplotlib.image

    x = images(4, 3)
    path = tmp_path / "inversion.png"
    save_figure(str(path), x, [x, x.flip(-1)], columns=3)
    height, width = matplotlib.image.imread(path).shape[:2]
    assert height == 3 * 125 and width == 3 * 120                    # 3 rows (original, 2 cuts) × 3 columns


def test_profile_prints_the_inversion_columns_and_draws_them(tmp_path, capsys) -> None:
    """On images (MNIST, 28 × 28) the leakage table gains MSE, PSNR and SSIM per cut and the mean-image baseline; the
    figure is written; --leakage-figure without --leakage is refused naming the flag."""
    from adaptplan.cli import main

    figure = tmp_path / "inv.png"
    assert main(["profile", "mlp", "--input", "1x28x28", "--leakage", "--dataset", "mnist-subset",
                 "--leakage-samples", "24", "--leakage-figure", str(figure)]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.strip().startswith("j") and "SSIM" in line)
    rows = [line.split() for line in out.splitlines()[out.splitlines().index(header) + 1:] if line[:3].strip().isdigit()]
    assert len(rows) == 2 and all(len(row) == 7 and 0 < float(row[4]) < 1 and float(row[6]) <= 1 for row in rows)
    assert "the auxiliary mean image, an attacker who learnt nothing, scores PSNR" in out
    assert figure.is_file() and f"wrote {figure}" in out
    assert main(["profile", "mlp", "--input", "1x28x28", "--leakage-figure", str(figure)]) == 2
    assert "--leakage-figure records the leakage measurement: add --leakage" in capsys.readouterr().err
