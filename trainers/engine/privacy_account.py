"""The (ε, δ) each device's activations have spent under noise (issue 71 item 2; docs/privacy.md "Defences"),
counted where the edge server receives them: device i's releases so far are the step its latest activation carries
(:attr:`trainers.engine.round_data.RoundTimeline.releases`), each a subsampled Gaussian mechanism at the sampling rate
q_i = min(b, |𝒟_i|)/|𝒟_i| of the run's batch size b (:func:`trainers.roles.defences.activation_epsilon`). Under noise on
a U-shaped split's head gradients the same count is theirs: each activation gets one head reply (the algorithms that
run a U-shaped split compute each device's loss once per step, :class:`trainers.api.ParallelStep`)."""

from __future__ import annotations

import math
from typing import Any

from trainers.engine.seams import EngineParts
from trainers.roles.defences import activation_epsilon


def sample_rates(engine: EngineParts) -> list[float]:
    """q_i = min(b, |𝒟_i|)/|𝒟_i| per device (1 for a device without samples: it never sends)."""
    return [min(engine.batch_size, n) / n if n else 1.0 for n in engine.data_sizes()]


def device_epsilons(engine: EngineParts, noise_multiplier: float | None = None) -> list[float]:
    """ε_i at the defence's δ per device, from its releases so far (0 for a device that sent nothing), of the
    activations' noise (or of ``noise_multiplier``: the head gradients' σ_g)."""
    d, releases = engine.defence, engine.timeline.releases
    sigma = d.noise_multiplier if noise_multiplier is None else noise_multiplier
    return [activation_epsilon(sigma, q, releases.get(i, 0), d.delta) for i, q in enumerate(sample_rates(engine))]


def privacy_metrics(engine: EngineParts) -> dict[str, float]:
    """The round's figures for its record: ``epsilon_max``, the largest ε_i so far (only with noise on the
    activations), ``head_epsilon_max`` that of the head gradients (only with noise on them)."""
    d, metrics = engine.defence, {}
    if d.noisy:
        metrics["epsilon_max"] = max(device_epsilons(engine), default=0.0)
    if d.head_noisy:
        metrics["head_epsilon_max"] = max(device_epsilons(engine, d.head_noise), default=0.0)
    return metrics


def privacy_summary(engine: EngineParts) -> dict[str, Any]:
    """``history.meta["privacy"]`` of a run with a defence: its settings and, under noise, each device's releases,
    sampling rate and ε (docs/formats.md "History")."""
    d = engine.defence
    if not d.active:
        return {}
    summary: dict[str, Any] = {"activation_clip": d.clip, "activation_noise": d.noise_multiplier, "nopeek": d.nopeek,
                               "label_epsilon": d.label_epsilon, "clip_per_value": d.clip_per_value, "u_shaped": d.head,
                               "head_clip": d.head_clip, "head_noise": d.head_noise}
    if d.label_epsilon is not None:
        summary["label_keep_probability"] = d.keep_probability()
    if d.noisy or d.head_noisy:
        summary.update(delta=d.delta, accountant="opacus RDP (subsampled Gaussian, zero-out neighbours)",
                       releases=[engine.timeline.releases.get(i, 0) for i in range(engine.num_devices)],
                       sample_rate=sample_rates(engine))
    if d.noisy:
        summary["epsilon"] = [e if math.isfinite(e) else None for e in device_epsilons(engine)]
    if d.head_noisy:
        summary["head_epsilon"] = device_epsilons(engine, d.head_noise)
    return {"privacy": summary}
