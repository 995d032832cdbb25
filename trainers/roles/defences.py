"""What a device does to its cut-layer activations before it sends them (issue 71 item 2; docs/privacy.md
"Defences"). Applied by the device role itself (:meth:`trainers.roles.core.Device.send`), so the simulator, a device
rank of torch.distributed and an MQTT device run the same code and the edge server only ever receives the defended
tensor.

* **Clipping and Gaussian noise** (the Gaussian mechanism on each sample's activation): sample k's activation
  a_k (flattened) is scaled to ā_k = a_k · min(1, C / ‖a_k‖₂) and sent as ã_k = ā_k + σ·C·z_k, z_k ~ N(0, I), drawn
  from the device's own noise stream (never the run's: Dropout masks and samplers stay as without the defence).
  Per value (``clip_per_value``), the bound is C = c·√d for the d values a sample sends at the device's cut: an
  RMS of at most c per value, so one c follows the activations' norms as they grow with d, where one C binds hard
  at a wide cut and not at all at a narrow one (noise of s.d. σ·C over a small activation). The guarantee is the
  same (sensitivity C, noise σ·C). Whatever C, a sample whose clip binds is sent with noise of norm ≈ σ·C·√d over
  a signal of norm C: the ratio σ·√d is the mechanism's, and no clip lowers it.
  The device back-propagates the returned gradient through the clipping (the noise is a constant of its graph).
  :func:`activation_epsilon` turns σ, the device's sampling rate and its number of sends into (ε, δ).
* **Randomised response on the labels** (Warner 1965; the RR baseline of Ghazi, Golowich, Kumar, Manurangsi & Zhang
  2021, "Deep learning with label differential privacy"): the device sends, for each of its samples, a label drawn
  once from its own stream — the true one with probability e^ε/(e^ε + M − 1), else one of the M − 1 others
  uniformly — and always the same one for that sample, so everything the server derives from the labels is
  ε-label-DP (post-processing), however often the sample is drawn.
* **Noise on the head's gradient** (a U-shaped split's labels; the Gaussian mechanism on each sample's gradient
  row, as on the activations): the head's per-sample gradient g_k = ∂CE(head(h_k), y_k)/∂h_k (b times its row of
  ∂F_i/∂h_k, F_i the mean over the mini-batch of b) is scaled to ḡ_k = g_k · min(1, C_g/‖g_k‖₂) and sent as
  (ḡ_k + σ_g·C_g·z_k)/b, z_k ~ N(0, I) from the head's own stream: what the edge server back-propagates and what
  Li et al.'s attacks would read (:class:`trainers.roles.head.Head`). The head steps with its exact gradient (it
  never leaves the device). :func:`activation_epsilon` at σ_g gives its (ε, δ) per device, with the row replaced by
  zero as neighbour (sensitivity C_g); a changed label moves a clipped row by up to 2C_g, two such steps.
* **NoPeek** (Vepakomma, Singh, Gupta & Raskar 2020, "NoPeek: information leakage reduction to share activations in
  distributed deep learning"): the device's objective gains α · dCor(X, A) over its mini-batch (inputs X, the
  activations A before clipping and noise), so its step follows ∂F/∂w_c + α ∂dCor/∂w_c; the distance correlation is
  :func:`profilers.leakage.distance_correlation_tensor`, the figure ``profile --leakage`` reports.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch

from adaptplan.defence_cost import with_defence_cost, with_head_on_device
from adaptplan.model_profile import ModelProfile
from profilers.leakage import distance_correlation_tensor

if TYPE_CHECKING:  # pragma: no cover
    from adaptplan.defence_cost import DefenceSetting
    from trainers.config.train_config import PrivacyConfig

NOISE_STREAM = 2 ** 32 - 2
"""Stream word of a device's noise generator, seeded ``[*sampler seed, NOISE_STREAM]``."""
LABEL_STREAM = 2 ** 32 - 3
"""Stream word of a device's randomised labels, drawn once from ``[*sampler seed, LABEL_STREAM]``."""
HEAD_NOISE_STREAM = 2 ** 32 - 4
"""Stream word of a device's head-gradient noise, seeded ``[*sampler seed, HEAD_NOISE_STREAM]``."""


@dataclass(frozen=True)
class ActivationDefence:
    """A device's defence of its activations (module docstring): ``clip`` C (per-sample L2 bound, 0 = none),
    ``noise_multiplier`` σ (noise std σ·C; needs C > 0), ``nopeek`` α (weight of dCor(X, A) in the device's
    objective, 0 = none); ``delta`` the δ of the (ε, δ) the run reports under noise (:func:`activation_epsilon`);
    ``label_epsilon`` ε of the randomised response on the labels (None = the true labels) over ``classes`` M;
    ``clip_per_value``: ``clip`` is c, the bound per value, C = c·√d (module docstring); ``head`` K: a U-shaped
    split, the device keeps the model's last K blocks and its labels (:class:`trainers.roles.head.Head`), whose
    per-sample gradients it clips to ``head_clip`` C_g (0 = none) and noises with σ_g = ``head_noise`` (needs C_g)."""

    clip: float = 0.0
    noise_multiplier: float = 0.0
    nopeek: float = 0.0
    delta: float = 1e-5
    label_epsilon: float | None = None
    classes: int = 0
    clip_per_value: bool = False
    head: int = 0
    head_clip: float = 0.0
    head_noise: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.delta, float) or not 0 < self.delta < 1:
            raise ValueError(f"delta must be a number in (0, 1), got {self.delta!r}")
        for name in ("clip", "noise_multiplier", "nopeek", "head_clip", "head_noise"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number ≥ 0, got {value!r}")
        if self.noise_multiplier > 0 and self.clip <= 0:
            raise ValueError("noise on the activations needs a clip C > 0 (the noise's scale is σ·C)")
        if (self.head_clip > 0 or self.head_noise > 0) and self.head == 0:
            raise ValueError("a clip or noise on the head's gradient needs a U-shaped split (head K > 0)")
        if self.head_noise > 0 and self.head_clip <= 0:
            raise ValueError("noise on the head's gradient needs a clip C_g > 0 (the noise's scale is σ_g·C_g)")
        if self.label_epsilon is not None and not (isinstance(self.label_epsilon, float) and self.label_epsilon >= 0):
            raise ValueError(f"label_epsilon must be a number ≥ 0, got {self.label_epsilon!r}")
        if isinstance(self.head, bool) or not isinstance(self.head, int) or self.head < 0:
            raise ValueError(f"head must be a whole number of blocks ≥ 0, got {self.head!r}")

    @classmethod
    def of(cls, privacy: "PrivacyConfig") -> "ActivationDefence":
        """The defence a run's ``--activation-clip``, ``--activation-noise``, ``--nopeek``, ``--privacy-delta`` and
        ``--label-epsilon`` set (M, the classes, is the engine's to fill in)."""
        labels = None if privacy.label_epsilon is None else float(privacy.label_epsilon)
        return cls(float(privacy.activation_clip), float(privacy.activation_noise), float(privacy.nopeek),
                   float(privacy.privacy_delta), labels, clip_per_value=bool(privacy.clip_per_value),
                   head=int(privacy.u_shaped), head_clip=float(privacy.head_clip),
                   head_noise=float(privacy.head_noise))

    @classmethod
    def of_setting(cls, setting: "DefenceSetting", classes: int) -> "ActivationDefence":
        """The defence a command line's setting (``clip=C,noise=σ,nopeek=α,labels=ε`` or ``clip_rms=c``) names, over
        ``classes`` M, at the default δ."""
        labels = None if setting.labels is None else float(setting.labels)
        return cls(float(setting.clip), float(setting.noise), float(setting.nopeek), label_epsilon=labels,
                   classes=classes, clip_per_value=setting.clip_per_value, head=setting.head,
                   head_clip=float(setting.head_clip), head_noise=float(setting.head_noise))

    def charged(self, profile: ModelProfile, batch_size: int) -> ModelProfile:
        """``profile`` with this defence's FLOPs per sample at each cut (:mod:`adaptplan.defence_cost`) and its head on
        the device (:func:`adaptplan.defence_cost.with_head_on_device`), so the simulated clock and the planner charge
        them."""
        costed = with_defence_cost(profile, self.clip > 0, self.noisy, self.nopeek > 0, batch_size)
        return with_head_on_device(costed, self.head, "u_shaped", self.head_clip > 0, self.head_noisy)

    @property
    def active(self) -> bool:
        """True if the device changes what it sends or how it steps."""
        return self.clip > 0 or self.nopeek > 0 or self.label_epsilon is not None or self.head > 0

    def keep_probability(self) -> float:
        """e^ε/(e^ε + M − 1): the chance a sample's sent label is its own (1 without the response)."""
        if self.label_epsilon is None:
            return 1.0
        if self.classes < 2:
            raise ValueError("randomised labels need the number of classes M ≥ 2")
        return 1.0 / (1.0 + (self.classes - 1) * math.exp(-self.label_epsilon))

    def randomised(self, labels: np.ndarray, seed: Any) -> np.ndarray:
        """The labels a device sends for its samples of true ``labels`` (module docstring), drawn once from its
        stream: kept with :meth:`keep_probability`, else uniform over the other M − 1 classes."""
        if self.label_epsilon is None:
            return labels
        rng = np.random.default_rng(_stream(seed, LABEL_STREAM))
        keep = rng.random(labels.size) < self.keep_probability()
        other = rng.integers(0, self.classes - 1, labels.size)
        other = other + (other >= labels)                       # uniform over the classes but the true one
        return np.where(keep, labels, other).astype(labels.dtype)

    @property
    def noisy(self) -> bool:
        return self.noise_multiplier > 0

    @property
    def head_noisy(self) -> bool:
        return self.head_noise > 0

    def released_gradient(self, rows: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """What leaves the device of its head's per-sample gradients ``rows`` (a batch, module docstring): each
        clipped to C_g, then noised with σ_g·C_g·z from ``generator`` (none: not noised); unchanged without a clip."""
        if self.head_clip <= 0:
            return rows
        clipped = _clipped(rows, self.head_clip)
        if generator is None or not self.head_noisy:
            return clipped
        return clipped + _gaussian(rows, self.head_noise * self.head_clip, generator)

    def bound(self, h: torch.Tensor) -> float:
        """C, the L2 bound of each sample of ``h`` (a batch): ``clip``, or c·√d per value (d = values per sample)."""
        return self.clip * math.sqrt(h[0].numel()) if self.clip_per_value else self.clip

    def clipped(self, h: torch.Tensor) -> torch.Tensor:
        """Each sample's activation scaled to an L2 norm of at most C (differentiable; unchanged without a clip)."""
        return h if self.clip <= 0 else _clipped(h, self.bound(h))

    def noise(self, h: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """σ·C·z, z ~ N(0, I) of ``h``'s shape, drawn from ``generator``."""
        return _gaussian(h, self.noise_multiplier * self.bound(h), generator)

    def released(self, h: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """What leaves the device of activations ``h``: clipped, and noised from ``generator`` (none: not noised)."""
        sent = self.clipped(h)
        return sent + self.noise(sent.detach(), generator) if generator is not None and self.noisy else sent

    def attacker_view(self, labels: torch.Tensor, noise_seed: int, label_seed: Any) -> "AttackerView":
        """What an attacker of this defence measures from (``profile --leakage-defence``, ``bench privacy``): the
        release it applies to activations (clip and noise, the noise from its own generator seeded ``noise_seed``;
        None without a clip), the labels sent for ``labels`` (randomised response drawn from ``label_seed``; None:
        the true ones) and the release of the head's per-sample gradients (None without a clip on them)."""
        generator = torch.Generator().manual_seed(int(noise_seed))
        release = (lambda a: self.released(a, generator)) if self.clip > 0 else None   # noqa: E731
        sent = None if self.label_epsilon is None else torch.from_numpy(self.randomised(labels.numpy(), label_seed))
        head_generator = torch.Generator().manual_seed(int(noise_seed) ^ HEAD_NOISE_STREAM)
        gradient = (lambda g: self.released_gradient(g, head_generator)) if self.head_clip > 0 else None  # noqa: E731
        return AttackerView(release, sent, gradient)

    def penalty(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor | None:
        """α · dCor(X, A) over the batch (None without NoPeek, or with a single sample)."""
        if self.nopeek <= 0 or h.shape[0] < 2:
            return None
        return self.nopeek * distance_correlation_tensor(x.to(h.dtype), h)

    def generator(self, seed: Any, device: torch.device) -> torch.Generator | None:
        """The device's noise stream, seeded from its sampler's seed words (None without noise)."""
        return _generator(seed, NOISE_STREAM, device) if self.noisy else None

    def head_generator(self, seed: Any, device: torch.device) -> torch.Generator | None:
        """The device's head-gradient noise stream, seeded from its sampler's seed words (None without that noise)."""
        return _generator(seed, HEAD_NOISE_STREAM, device) if self.head_noisy else None


@dataclass(frozen=True)
class AttackerView:
    """What an attacker applies to reproduce a defence (:meth:`ActivationDefence.attacker_view`): ``release`` of the
    activations, the ``labels`` sent, the release of the head's per-sample ``gradient`` rows (each None: none)."""

    release: Callable[[torch.Tensor], torch.Tensor] | None
    labels: torch.Tensor | None
    gradient: Callable[[torch.Tensor], torch.Tensor] | None


def _gaussian(like: torch.Tensor, std: float, generator: torch.Generator) -> torch.Tensor:
    """std·z, z ~ N(0, I) of ``like``'s shape, device and dtype, drawn from ``generator``."""
    return std * torch.randn(like.shape, generator=generator, device=like.device, dtype=like.dtype)


def _clipped(h: torch.Tensor, bound: float) -> torch.Tensor:
    """Each sample (row) of ``h`` scaled to an L2 norm of at most ``bound`` (differentiable)."""
    norms = h.reshape(h.shape[0], -1).norm(dim=1)
    factor = torch.clamp(bound / norms.clamp_min(1e-12), max=1.0)
    return h * factor.reshape(-1, *([1] * (h.dim() - 1)))


def _generator(seed: Any, word: int, device: torch.device) -> torch.Generator:
    """A torch generator seeded from a device's seed words and a stream word."""
    state = np.random.SeedSequence(_stream(seed, word)).generate_state(2, dtype=np.uint32)
    g = torch.Generator(device=device)
    g.manual_seed(int(state[0]) << 31 ^ int(state[1]))
    return g


def _stream(seed: Any, word: int) -> list[int]:
    """A device's seed words (its sampler's: an integer or a list of them) with a stream word appended."""
    return [*(int(w) for w in (seed if isinstance(seed, (list, tuple)) else [seed])), word]


@functools.lru_cache(maxsize=4096)
def _rdp_per_step(noise_multiplier: float, sample_rate: float) -> tuple[tuple[float, ...], np.ndarray]:
    """Opacus' default RDP orders and the subsampled Gaussian's RDP of one step at each (composition over steps is
    their multiple: what ``RDPAccountant`` sums over its history)."""
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis.rdp import compute_rdp

    orders = tuple(float(a) for a in RDPAccountant.DEFAULT_ALPHAS)
    return orders, np.asarray(compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=1, orders=list(orders)))


@functools.lru_cache(maxsize=1 << 16)     # every round asks again for the devices that did not send since
def activation_epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> float:
    """ε of (ε, δ)-DP of one device's activations after ``steps`` sends of a ``sample_rate`` q = b_i/|𝒟_i| share of
    its samples, each clipped and noised with σ = ``noise_multiplier`` (module docstring): the subsampled Gaussian
    mechanism's Rényi DP (Mironov 2017; Mironov, Talwar & Zhang 2019, computed by Opacus), composed over the steps
    and converted to (ε, δ) by Opacus' ``get_privacy_spent``; the neighbouring data sets differ in one sample's
    activation replaced by zero (sensitivity C). 0 before the first send, ∞ without noise. docs/privacy.md states
    what this covers and what it does not."""
    if steps <= 0:
        return 0.0
    if noise_multiplier <= 0:
        return math.inf
    from opacus.accountants.analysis.rdp import get_privacy_spent

    orders, per_step = _rdp_per_step(float(noise_multiplier), min(1.0, float(sample_rate)))
    eps, _ = get_privacy_spent(orders=list(orders), rdp=per_step * int(steps), delta=float(delta))
    return float(eps)
