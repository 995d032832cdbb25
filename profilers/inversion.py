"""Model inversion per cut (issue 71 item 1a; docs/privacy.md): how well an honest-but-curious edge server that
holds auxiliary data of the same distribution reconstructs a device's inputs from the cut-layer activations it
receives.

**The attacker.** For cut j it fits a decoder D_j: A_j → X on auxiliary pairs (x, f_{1..j}(x)) — samples disjoint
from the devices' (the test split; the attacker is assumed to know the client blocks' weights, the white-box
setting of He, Zhang & Lee 2019, "Model inversion attacks against collaborative inference") — and applies it to the
activations of the devices' samples. D_j(a) = ridge(a) + MLP(a): ``ridge`` the regularised least-squares linear
decoder in closed form (kernel form over the auxiliary samples, λ chosen by its leave-one-out error), the MLP
(flatten → 512 → ReLU → x's size) starting at zero output and trained with Adam (10⁻³, full batch, up to
:data:`DECODER_STEPS` steps) on the mean-squared error, stopped at its best step on a fifth of the auxiliary
samples held out. A cut that passes the input unchanged is inverted exactly by the linear part; an
activation independent of x leaves the decoder the auxiliary mean.

**The figures** on the devices' samples, in pixel space ([0, 1]: the data set's per-channel normalisation undone):
MSE, PSNR = 10·log₁₀(1 / MSE) dB, and SSIM (Wang, Bovik, Sheikh & Simoncelli 2004: an 11 × 11 Gaussian window of
σ = 1.5 over the valid region, K₁ = 0.01, K₂ = 0.03, dynamic range 1; the mean over positions, channels and
samples).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import nn

DECODER_STEPS = 300
"""Adam steps of the decoder's nonlinear part (full batch of the auxiliary samples)."""
SSIM_WINDOW, SSIM_SIGMA, SSIM_K1, SSIM_K2 = 11, 1.5, 0.01, 0.03


def psnr(mse: float, data_range: float = 1.0) -> float:
    """10·log₁₀(R² / MSE) in dB (∞ for a perfect reconstruction)."""
    return math.inf if mse <= 0 else 10.0 * math.log10(data_range ** 2 / mse)


def _gaussian_window(channels: int) -> torch.Tensor:
    r = torch.arange(SSIM_WINDOW, dtype=torch.float64) - (SSIM_WINDOW - 1) / 2
    g = torch.exp(-r ** 2 / (2 * SSIM_SIGMA ** 2))
    g = g / g.sum()
    return (g[:, None] * g[None, :]).expand(channels, 1, SSIM_WINDOW, SSIM_WINDOW).contiguous()


def ssim(x: torch.Tensor, y: torch.Tensor, data_range: float = 1.0) -> float:
    """Mean SSIM of two image batches (N, C, H, W) with H, W ≥ 11 (module docstring), in float64."""
    x, y = x.double(), y.double()
    if x.shape != y.shape or x.dim() != 4 or min(x.shape[-2:]) < SSIM_WINDOW:
        raise ValueError(f"SSIM needs two equal (N, C, H, W) batches of at least {SSIM_WINDOW} x {SSIM_WINDOW} "
                         f"pixels, got {tuple(x.shape)} and {tuple(y.shape)}")
    w = _gaussian_window(x.shape[1])

    def blur(t: torch.Tensor) -> torch.Tensor:
        return nn.functional.conv2d(t, w, groups=x.shape[1])

    mx, my = blur(x), blur(y)
    vx, vy, cxy = blur(x * x) - mx ** 2, blur(y * y) - my ** 2, blur(x * y) - mx * my
    c1, c2 = (SSIM_K1 * data_range) ** 2, (SSIM_K2 * data_range) ** 2
    s = ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx ** 2 + my ** 2 + c1) * (vx + vy + c2))
    return float(s.mean())


class Decoder(nn.Module):
    """D(a) = ridge(a) + MLP(a) (module docstring). The ridge part in its kernel form, ((a − ā)·Aᵀ)·α + x̄ with A the
    centred auxiliary activations and α = (AAᵀ + λI)⁻¹(X − x̄), so that no features × pixels matrix is formed; the
    MLP's output layer starts at zero."""

    def __init__(self, support: torch.Tensor, alpha: torch.Tensor, a_mean: torch.Tensor, x_mean: torch.Tensor,
                 hidden: int = 512) -> None:
        super().__init__()
        self.support: torch.Tensor
        self.alpha: torch.Tensor
        self.a_mean: torch.Tensor
        self.x_mean: torch.Tensor
        for name, value in (("support", support), ("alpha", alpha), ("a_mean", a_mean), ("x_mean", x_mean)):
            self.register_buffer(name, value.float())
        last = nn.Linear(hidden, alpha.shape[1])
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)
        self.mlp = nn.Sequential(nn.Linear(support.shape[1], hidden), nn.ReLU(), last)

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return ((a - self.a_mean) @ self.support.T) @ self.alpha + self.x_mean + self.mlp(a)


RIDGE_GRID = tuple(10.0 ** k for k in range(-6, 4))
"""λ / (tr(AAᵀ)/n) tried by the ridge part; the one of least leave-one-out error is kept."""
VALIDATION_SHARE = 0.2
"""The share of the auxiliary samples that decides when the MLP stops (the best validation step, 0 included)."""


def ridge_fit(a: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Kernel ridge's α = (K + λI)⁻¹(x − x̄) over centred activations ``a`` (K = aaᵀ), λ from :data:`RIDGE_GRID` by
    the closed-form leave-one-out error: residual r = (I − H)(x − x̄), H = K(K + λI)⁻¹, error_i = r_i / (1 − H_ii)."""
    gram, xc = a @ a.T, x - x.mean(0)
    scale = float(torch.trace(gram)) / len(a) + 1e-12
    eye = torch.eye(len(a), dtype=a.dtype)
    best: tuple[float, torch.Tensor, float] | None = None
    for factor in RIDGE_GRID:
        inverse = torch.linalg.inv(gram + factor * scale * eye)
        hat = gram @ inverse
        loo = ((xc - hat @ xc) / (1 - torch.diagonal(hat)).clamp_min(1e-12)[:, None]).pow(2).mean()
        if best is None or float(loo) < best[0]:
            best = (float(loo), inverse @ xc, factor * scale)
    assert best is not None
    return best[1], best[2]


def fit_decoder(activations: torch.Tensor, inputs: torch.Tensor, steps: int = DECODER_STEPS, seed: int = 0) -> Decoder:
    """The attacker's decoder from auxiliary pairs (n × features activations, n × outputs inputs, both flat): the
    ridge part and the MLP fitted on the first 80 % (:data:`VALIDATION_SHARE`), the MLP's state of least error on
    the rest kept (its start, the ridge alone, included)."""
    cut = max(1, int(round(len(activations) * (1 - VALIDATION_SHARE))))
    a, x = activations[:cut].double(), inputs[:cut].double()
    a_mean, x_mean = a.mean(0), x.mean(0)
    alpha, _ = ridge_fit(a - a_mean, x)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        decoder = Decoder(a - a_mean, alpha, a_mean, x_mean)
    optimizer = torch.optim.Adam(decoder.mlp.parameters(), lr=1e-3)
    train_a, train_x = activations[:cut].float(), inputs[:cut].float()
    held_a, held_x = (activations[cut:].float(), inputs[cut:].float()) if cut < len(activations) else (train_a, train_x)

    def held_error() -> float:
        with torch.no_grad():
            return float(nn.functional.mse_loss(decoder(held_a), held_x))

    best_error, best_state = held_error(), {k: v.clone() for k, v in decoder.mlp.state_dict().items()}
    for _ in range(steps):
        optimizer.zero_grad()
        nn.functional.mse_loss(decoder(train_a), train_x).backward()
        optimizer.step()
        error = held_error()
        if error < best_error:
            best_error, best_state = error, {k: v.clone() for k, v in decoder.mlp.state_dict().items()}
    decoder.mlp.load_state_dict(best_state)
    return decoder


@dataclass(frozen=True)
class Reconstruction:
    """One cut's inversion figures on the devices' samples (module docstring), in pixel space."""

    cut: int
    mse: float
    psnr: float
    ssim: float


def to_pixels(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """Normalised (N, C, H, W) inputs back to [0, 1] pixels (the data set's per-channel mean and std; none: as is),
    clamped to the range."""
    if mean and std:
        shape = (1, -1) + (1,) * (x.dim() - 2)
        x = x * torch.tensor(std, dtype=x.dtype).reshape(shape) + torch.tensor(mean, dtype=x.dtype).reshape(shape)
    return x.clamp(0.0, 1.0)


def invert_per_cut(blocks: nn.Sequential, auxiliary: torch.Tensor, targets: torch.Tensor,
                   mean: Sequence[float] = (), std: Sequence[float] = (), steps: int = DECODER_STEPS,
                   release: Callable[[torch.Tensor], torch.Tensor] | None = None, cuts: Sequence[int] | None = None
                   ) -> tuple[list[Reconstruction], list[torch.Tensor]]:
    """For every cut j = 1..L−1 of ``blocks`` (``cuts``: those only; at their weights, eval mode): the decoder fitted
    on ``auxiliary`` inputs and applied to the activations of ``targets``, both as ``release`` turns them out (a
    defence: the attacker knows it and draws its own noise for the auxiliary data); the figures and each cut's
    reconstructions in pixels."""
    was_training = blocks.training
    blocks.eval()
    figures, images = [], []
    try:
        with torch.no_grad():
            h_aux, h_target = auxiliary, targets
            pairs = []
            for j, block in enumerate(blocks[:-1], start=1):
                h_aux, h_target = block(h_aux), block(h_target)
                if cuts is None or j in cuts:
                    shown = (h_aux, h_target) if release is None else (release(h_aux), release(h_target))
                    pairs.append((j, shown[0].flatten(1), shown[1].flatten(1)))
        original = to_pixels(targets, mean, std)
        for j, a_aux, a_target in pairs:
            decoder = fit_decoder(a_aux, auxiliary.flatten(1), steps, seed=j)
            with torch.no_grad():
                rebuilt = to_pixels(decoder(a_target.float()).reshape(targets.shape), mean, std)
            mse = float(((rebuilt.double() - original.double()) ** 2).mean())
            figures.append(Reconstruction(j, mse, psnr(mse), ssim(rebuilt, original)))
            images.append(rebuilt)
    finally:
        blocks.train(was_training)
    return figures, images


def mean_image_figures(auxiliary: torch.Tensor, targets: torch.Tensor, mean: Sequence[float] = (),
                       std: Sequence[float] = ()) -> Reconstruction:
    """The figures of an attacker who learnt nothing: every reconstruction the auxiliary mean image (cut 0)."""
    original = to_pixels(targets, mean, std)
    guess = to_pixels(auxiliary.mean(0, keepdim=True), mean, std).expand_as(original)
    mse = float(((guess.double() - original.double()) ** 2).mean())
    return Reconstruction(0, mse, psnr(mse), ssim(guess, original))


def save_figure(path: str, original: torch.Tensor, rebuilt: Sequence[torch.Tensor], columns: int = 8) -> None:
    """A PNG grid: the first row the originals, then one row of reconstructions per cut (pixels in [0, 1])."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = min(columns, original.shape[0])
    rows = [original] + list(rebuilt)
    fig, axes = plt.subplots(len(rows), n, figsize=(1.2 * n, 1.25 * len(rows)), squeeze=False)
    for r, batch in enumerate(rows):
        for c in range(n):
            image = batch[c].permute(1, 2, 0).numpy()
            ax = axes[r][c]
            ax.imshow(image[..., 0] if image.shape[-1] == 1 else image, cmap="gray" if image.shape[-1] == 1 else None,
                      vmin=0.0, vmax=1.0)
            ax.set_xticks([])
            ax.set_yticks([])
        axes[r][0].set_ylabel("original" if r == 0 else f"cut {r}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
