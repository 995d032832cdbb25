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

A **U-shaped split** (:func:`with_head_on_device`) does: the last K blocks (the head) and the labels stay on the
device, so each step sends the head's input features h down and their gradient ∂F/∂h up besides the cut layer's;
clipping and noising that gradient per sample costs the device 3d_k + d_k FLOPs per sample (as on the activations,
d_k the head input's values), charged with its backward.
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


def head_cuts(num_cuts: int, head: int) -> list[int]:
    """The cuts a U-shaped split with a ``head`` of K blocks allows: 1..L−K−1 (the edge server holds at least one
    block between the device's two parts); every cut 1..L−1 without a head."""
    return list(range(1, num_cuts - head if head else num_cuts))


def with_head_on_device(profile: ModelProfile, head: int, field: str = "head", gradient_clip: bool = False,
                        gradient_noise: bool = False) -> ModelProfile:
    """``profile`` as a U-shaped split charges it: the last ``head`` = K blocks and the labels on the device (module
    docstring), or ``profile`` itself for K = 0. With L the cut points and k = L − K the head's input, each cut j of
    :func:`head_cuts` gains

    * ρ_j += ρ_L − ρ_k and ϖ_j += ϖ_L − ϖ_k (the head's forward and backward, its input gradient included, on the
      device: eqs. (16), (21)), ϖ_j also the clip (``gradient_clip``) and noise (``gradient_noise``) of that gradient
      (:func:`defence_flops` at d_k); measured seconds (``fp_seconds``, ``bp_seconds``) the same way;
    * ψ_j += χ_k (the head's input gradient goes up beside the activation, eq. (17)) and χ_j += ψ_k (the features
      come down beside the cut gradient, eq. (20));
    * δ_j += δ_L − δ_k (the head is the device's model too: uploaded and downloaded with it, eqs. (22), (24));
    * ``server_bp_flops`` −= the head's (the server's backward ends at k, eq. (19)); the server's forward
      b(ρ_L − ρ_j)/f_s of eq. (18) loses the head through ρ_j; ``client_memory_bytes`` += M_L − M_k (an estimate:
      the memory of training the whole model less that of its first k blocks).

    A cut from k on would leave the edge server nothing: it stands for the whole model on the device (cut L's
    compute and parameters, so the profile stays cumulative; a U-shaped run and its plans refuse it). The
    latency model adds the head's round trip into each device's own stage sums: the server's forward of the other
    devices overlaps it, which eq. (26)'s barriers do not show (exact for one device or equal devices). A head
    that leaves no cut is an InputError naming ``field``."""
    if head == 0:
        return profile
    num = profile.num_cuts
    if not 1 <= head <= num - 2:
        raise InputError(f"a U-shaped split keeps 1..{num - 2} blocks on the device (the edge server needs one and "
                         f"the device its first), got {head}", field=field)
    c = profile.cut_points
    last, k = c[-1], c[num - head - 1]
    released, _ = defence_flops(gradient_clip, gradient_noise, False, 1, 0.0,
                                np.array([k.activation_bits / profile.bits_per_value]))

    def plus(value: float | None, top: float | None, at_k: float | None) -> float | None:
        return None if value is None or top is None or at_k is None else value + top - at_k

    cuts = tuple(replace(
        p, fp_flops=p.fp_flops + last.fp_flops - k.fp_flops,
        bp_flops=p.bp_flops + last.bp_flops - k.bp_flops + float(released[0]),
        activation_bits=p.activation_bits + k.gradient_bits, gradient_bits=p.gradient_bits + k.activation_bits,
        client_param_bits=p.client_param_bits + last.client_param_bits - k.client_param_bits,
        server_bp_flops=plus(p.server_bp_flops, 0.0, k.server_bp_flops),
        fp_seconds=plus(p.fp_seconds, last.fp_seconds, k.fp_seconds),
        bp_seconds=plus(p.bp_seconds, last.bp_seconds, k.bp_seconds),
        client_memory_bytes=plus(p.client_memory_bytes, last.client_memory_bytes, k.client_memory_bytes))
        if n < num - head - 1 else
        replace(p, fp_flops=last.fp_flops, bp_flops=last.bp_flops, client_param_bits=last.client_param_bits,
                server_bp_flops=last.server_bp_flops if p.server_bp_flops is not None else None,
                fp_seconds=last.fp_seconds if p.fp_seconds is not None else None,
                bp_seconds=last.bp_seconds if p.bp_seconds is not None else None,
                client_memory_bytes=last.client_memory_bytes if p.client_memory_bytes is not None else None)
        for n, p in enumerate(c))
    return replace(profile, cut_points=cuts)


KEYS = ("clip", "clip_rms", "noise", "nopeek", "labels", "head", "head_clip", "head_noise")
"""The keys of a defence setting (:class:`DefenceSetting`)."""


@dataclass(frozen=True)
class DefenceSetting:
    """One defence setting as the command line writes it (``bench privacy --defences``, ``plan --defence``,
    ``profile --leakage-defence``): ``clip`` C, ``noise`` σ, ``nopeek`` α (0: off), ``labels`` ε of the randomised
    response (None: off), written ``clip=C,noise=σ,nopeek=α,labels=ε`` (any of them; ``none`` for no defence);
    ``clip_rms=c`` in place of ``clip=C`` bounds each sample by c·√d, c per value (``clip_per_value``); ``head=K``
    a U-shaped split, the last K blocks and the labels on the device (:func:`with_head_on_device`; 0: off), with
    ``head_clip=C_g`` and ``head_noise=σ_g`` on the per-sample gradients its head sends."""

    clip: float = 0.0
    noise: float = 0.0
    nopeek: float = 0.0
    labels: float | None = None
    clip_per_value: bool = False
    head: int = 0
    head_clip: float = 0.0
    head_noise: float = 0.0

    @classmethod
    def parse(cls, text: str, field: str = "--defences") -> "DefenceSetting":
        text = text.strip()
        if text == "none":
            return cls()
        values: dict[str, float] = {}
        for item in text.split(","):
            key, _, value = item.partition("=")
            if key.strip() not in KEYS or not value:
                raise InputError(f"{item.strip()!r} is not clip=C, clip_rms=c, noise=σ, nopeek=α, labels=ε, head=K, "
                                 "head_clip=C_g or head_noise=σ_g (or none)", field=field)
            try:
                number = float(value)
            except ValueError:
                raise InputError(f"{key.strip()} must be a number, got {value!r}", field=field) from None
            if not math.isfinite(number) or number < 0:
                raise InputError(f"{key.strip()} must be a finite number ≥ 0, got {value}", field=field)
            if key.strip() == "head" and number != int(number):
                raise InputError(f"head must be a whole number of blocks, got {value}", field=field)
            values[key.strip()] = number
        head = int(values.pop("head", 0))
        if "clip" in values and "clip_rms" in values:
            raise InputError(f"{text!r}: clip=C or clip_rms=c, not both", field=field)
        per_value = "clip_rms" in values
        values["clip"] = values.pop("clip_rms", values.get("clip", 0.0))
        setting = cls(**values, clip_per_value=per_value, head=head)
        if setting.noise > 0 and setting.clip <= 0:
            raise InputError(f"{text!r}: noise needs a clip (its scale is σ·C)", field=field)
        if (setting.head_clip > 0 or setting.head_noise > 0) and not setting.head:
            raise InputError(f"{text!r}: head_clip and head_noise need a U-shaped split (head=K)", field=field)
        if setting.head_noise > 0 and setting.head_clip <= 0:
            raise InputError(f"{text!r}: head_noise needs head_clip (its scale is σ_g·C_g)", field=field)
        return setting

    @classmethod
    def of_run(cls, privacy: Any) -> "DefenceSetting":
        """The setting a run's defence options hold (``PrivacyConfig``: the inverse of :meth:`config`)."""
        return cls(privacy.activation_clip, privacy.activation_noise, privacy.nopeek, privacy.label_epsilon,
                   privacy.clip_per_value, privacy.u_shaped, privacy.head_clip, privacy.head_noise)

    @property
    def name(self) -> str:
        clip = "clip_rms" if self.clip_per_value else "clip"
        parts = [f"{k}={v:g}" for k, v in ((clip, self.clip), ("noise", self.noise), ("nopeek", self.nopeek)) if v]
        parts += [f"labels={self.labels:g}"] if self.labels is not None else []
        parts += [f"head={self.head}"] if self.head else []
        parts += [f"{k}={v:g}" for k, v in (("head_clip", self.head_clip), ("head_noise", self.head_noise)) if v]
        return ",".join(parts) or "none"

    def charged(self, profile: ModelProfile, batch_size: int, field: str = "--defence") -> ModelProfile:
        """``profile`` with this setting's FLOPs per sample at each cut (:func:`with_defence_cost`) and its head on the
        device (:func:`with_head_on_device`; a head too long for the model is an InputError naming ``field``)."""
        costed = with_defence_cost(profile, self.clip > 0, self.noise > 0, self.nopeek > 0, batch_size)
        return with_head_on_device(costed, self.head, field, self.head_clip > 0, self.head_noise > 0)

    def config(self) -> dict[str, float | None]:
        """The run's flat keys (trainers/config/train_config.py ``PrivacyConfig``)."""
        return {"activation_clip": self.clip, "activation_noise": self.noise, "nopeek": self.nopeek,
                "label_epsilon": self.labels, "clip_per_value": self.clip_per_value, "u_shaped": self.head,
                "head_clip": self.head_clip, "head_noise": self.head_noise}


def parse_defences(text: str) -> list[DefenceSetting]:
    """``--defences``: settings separated by ``;`` (InputError naming the flag)."""
    settings = [DefenceSetting.parse(part) for part in text.split(";") if part.strip()]
    if not settings:
        raise InputError("give at least one setting, e.g. 'none;clip=4,noise=1;nopeek=0.5'", field="--defences")
    return settings
