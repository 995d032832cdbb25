"""What a defence of the activations costs a device, in FLOPs per sample at each cut (issue 71 item 2; the defences:
trainers/roles/defences.py, docs/privacy.md "Defences"), for the latency model's eqs. (16) and (21) (the profile's
``defence_fp_flops`` / ``defence_bp_flops``). Counted by hand at 2 FLOPs per multiply–add, with d_j the values of
the activation at cut j, n the input's values and b the batch size:

* clipping: the norm ‖a_k‖ (d multiply–adds) and the scaling (d): 3d forward; back through the scaling and the
  norm (the dot product ⟨g_k, a_k⟩ and two scalings): 4d backward;
* Gaussian noise: one addition per value, d forward (drawing the normals is not counted as FLOPs); nothing backward;
* NoPeek: the two b × b distance matrices (a subtraction, a square and an addition per pair and value: 3b(n + d)
  per sample), their double centring and the three products (about 10b per sample) forward; backward only through
  the activations' matrix, twice its forward: 6bd + 20b.

No defence here changes what is sent: the bytes of eqs. (17) and (20) stay as they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from adaptplan.errors import InputError
from adaptplan.model_profile import ModelProfile


def defence_flops(clip: bool, noise: bool, nopeek: bool, batch_size: int, input_values: float,
                  activation_values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) FLOPs per sample at each cut (module docstring); ``activation_values`` d_j per cut."""
    d = np.asarray(activation_values, dtype=float)
    b, n = float(batch_size), float(input_values)
    fp = (3.0 * d if clip else 0.0) + (d if noise else 0.0) + ((3.0 * b * (n + d) + 10.0 * b) if nopeek else 0.0)
    bp = (4.0 * d if clip else 0.0) + ((6.0 * b * d + 20.0 * b) if nopeek else 0.0)
    return np.broadcast_to(fp, d.shape).astype(float), np.broadcast_to(bp, d.shape).astype(float)


def with_defence_cost(profile: ModelProfile, clip: bool, noise: bool, nopeek: bool, batch_size: int) -> ModelProfile:
    """``profile`` with the defence's FLOPs per sample at each cut but the last (the model's output is never sent),
    or ``profile`` itself without a defence."""
    if not (clip or noise or nopeek):
        return profile
    values = profile.psi / profile.bits_per_value
    fp, bp = defence_flops(clip, noise, nopeek, batch_size, float(np.prod(profile.input_shape)), values)
    last = profile.num_cuts - 1
    cuts = tuple(replace(c, defence_fp_flops=float(fp[k]) if k < last else None,
                         defence_bp_flops=float(bp[k]) if k < last else None) for k, c in enumerate(profile.cut_points))
    return replace(profile, cut_points=cuts)


@dataclass(frozen=True)
class DefenceSetting:
    """One defence setting as the command line writes it (``bench privacy --defences``, ``plan --defence``,
    ``profile --leakage-defence``): ``clip`` C, ``noise`` σ, ``nopeek`` α (0: off), ``labels`` ε of the randomised
    response (None: off), written ``clip=C,noise=σ,nopeek=α,labels=ε`` (any of them; ``none`` for no defence);
    ``clip_rms=c`` in place of ``clip=C`` bounds each sample by c·√d, c per value (``clip_per_value``)."""

    clip: float = 0.0
    noise: float = 0.0
    nopeek: float = 0.0
    labels: float | None = None
    clip_per_value: bool = False

    @classmethod
    def parse(cls, text: str, field: str = "--defences") -> "DefenceSetting":
        text = text.strip()
        if text == "none":
            return cls()
        values: dict[str, float] = {}
        for item in text.split(","):
            key, _, value = item.partition("=")
            if key.strip() not in ("clip", "clip_rms", "noise", "nopeek", "labels") or not value:
                raise InputError(f"{item.strip()!r} is not clip=C, clip_rms=c, noise=σ, nopeek=α or labels=ε (or none)",
                                 field=field)
            try:
                number = float(value)
            except ValueError:
                raise InputError(f"{key.strip()} must be a number, got {value!r}", field=field) from None
            if not math.isfinite(number) or number < 0:
                raise InputError(f"{key.strip()} must be a finite number ≥ 0, got {value}", field=field)
            values[key.strip()] = number
        if "clip" in values and "clip_rms" in values:
            raise InputError(f"{text!r}: clip=C or clip_rms=c, not both", field=field)
        per_value = "clip_rms" in values
        values["clip"] = values.pop("clip_rms", values.get("clip", 0.0))
        setting = cls(**values, clip_per_value=per_value)
        if setting.noise > 0 and setting.clip <= 0:
            raise InputError(f"{text!r}: noise needs a clip (its scale is σ·C)", field=field)
        return setting

    @classmethod
    def of_run(cls, privacy: Any) -> "DefenceSetting":
        """The setting a run's defence options hold (``PrivacyConfig``: the inverse of :meth:`config`)."""
        return cls(privacy.activation_clip, privacy.activation_noise, privacy.nopeek, privacy.label_epsilon,
                   privacy.clip_per_value)

    @property
    def name(self) -> str:
        clip = "clip_rms" if self.clip_per_value else "clip"
        parts = [f"{k}={v:g}" for k, v in ((clip, self.clip), ("noise", self.noise), ("nopeek", self.nopeek)) if v]
        parts += [f"labels={self.labels:g}"] if self.labels is not None else []
        return ",".join(parts) or "none"

    def charged(self, profile: ModelProfile, batch_size: int) -> ModelProfile:
        """``profile`` with this setting's FLOPs per sample at each cut (:func:`with_defence_cost`)."""
        return with_defence_cost(profile, self.clip > 0, self.noise > 0, self.nopeek > 0, batch_size)

    def config(self) -> dict[str, float | None]:
        """The run's flat keys (trainers/config/train_config.py ``PrivacyConfig``)."""
        return {"activation_clip": self.clip, "activation_noise": self.noise, "nopeek": self.nopeek,
                "label_epsilon": self.labels, "clip_per_value": self.clip_per_value}


def parse_defences(text: str) -> list[DefenceSetting]:
    """``--defences``: settings separated by ``;`` (InputError naming the flag)."""
    settings = [DefenceSetting.parse(part) for part in text.split(";") if part.strip()]
    if not settings:
        raise InputError("give at least one setting, e.g. 'none;clip=4,noise=1;nopeek=0.5'", field="--defences")
    return settings
