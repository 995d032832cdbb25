"""The leakage per cut of a model as a table and a file (docs/privacy.md "Leakage per cut"): ``adaptplan profile
MODEL --leakage`` at the model's initial weights, ``adaptplan train … --leakage-out FILE`` at the weights the run
trained, both under a defence of the activations as the attacker sees it (it knows the mechanism and draws its own
noise)."""

from __future__ import annotations

import os
import sys
from typing import Any

MAX_LEAKAGE_SAMPLES = 4096
"""The most samples ``--leakage-samples`` attacks (profile, train)."""


def leakage_report(blocks: Any, data: Any, samples: int, dataset: str, defence: Any, defence_name: str,
                   figure: str | None = None, weights: str = "the model's initial weights"
                   ) -> tuple[str, dict[str, list[float]]]:
    """Per cut of ``blocks`` (a chain of the model's blocks): dCor(inputs, activations) and the label-inference AUCs
    (profilers/leakage.py), on the first ``samples`` training samples of ``data``; for images (C×H×W of at least
    11×11) also the model-inversion attacker's reconstructions (profilers/inversion.py), its decoder fitted on as
    many test samples, and with ``figure`` their PNG; the activations as ``defence``
    (:class:`trainers.roles.defences.ActivationDefence`, named ``defence_name``) releases them. Returns the table's
    text and its figures per cut (for the leakage table file)."""
    from profilers.inversion import SSIM_WINDOW, invert_per_cut, mean_image_figures, save_figure, to_pixels
    from profilers.leakage import leakage_per_cut

    n = min(samples, int(data.x_train.shape[0]))
    view = defence.attacker_view(data.y_train[:n], 0, [0])
    release = view.release
    head = (len(blocks) - defence.head, view.gradient) if view.gradient is not None else None
    rows = leakage_per_cut(blocks, data.x_train[:n], data.y_train[:n], release, sent_labels=view.labels, head=head)
    shape = tuple(data.x_train.shape[1:])
    images = len(shape) == 3 and min(shape[1:]) >= SSIM_WINDOW
    inverted = invert_per_cut(blocks, data.x_test[:n], data.x_train[:n], data.mean, data.std,
                              release=release) if images else None
    shown = f", the activations as {defence_name} releases them" if defence_name != "none" else ""
    lines = [f"leakage per cut ({n} samples of {dataset}, {weights}{shown}; docs/privacy.md): "
             "dCor = distance correlation of inputs and activations (1: an isometry of the input); AUC of "
             "inferring labels from the returned gradients, one-vs-rest (0.5: nothing learnt)"
             + (f"; inversion: a decoder fitted on {min(n, int(data.x_test.shape[0]))} test samples reconstructs "
                "the inputs from the activations (MSE and PSNR in [0, 1] pixels, SSIM; 1: exact; the auxiliary mean "
                "image, an attacker who learnt nothing, scores PSNR {0.psnr:.2f} dB, SSIM {0.ssim:.3f})".format(
                    mean_image_figures(data.x_test[:n], data.x_train[:n], data.mean, data.std))
                if images else "; inversion: images only"),
             f"{'j':>3}  {'dCor':>6}  {'norm AUC':>8}  {'direction AUC':>13}" + ("  {:>8}  {:>7}  {:>6}".format(
                 "MSE", "PSNR dB", "SSIM") if images else "")]
    for k, r in enumerate(rows):
        line = f"{r.cut:>3}  {r.dcor:>6.3f}  {r.norm_auc:>8.3f}  {r.direction_auc:>13.3f}"
        if inverted is not None:
            rec = inverted[0][k]
            line += f"  {rec.mse:>8.5f}  {rec.psnr:>7.2f}  {rec.ssim:>6.3f}"
        lines.append(line)
    if figure and inverted is not None:
        save_figure(figure, to_pixels(data.x_train[:n], data.mean, data.std), inverted[1])
        lines.append(f"wrote {figure}: originals above their reconstructions at cuts 1..{len(rows)}")
    elif figure:
        lines.append(f"no figure: {dataset}'s samples are not images")
    figures = {"dcor": [r.dcor for r in rows], "norm_auc": [r.norm_auc for r in rows],
               "direction_auc": [r.direction_auc for r in rows]}
    if inverted is not None:
        figures |= {name: [min(getattr(rec, name), 999.0) for rec in inverted[0]] for name in ("mse", "psnr", "ssim")}
        # an exact reconstruction's PSNR (∞) is kept as 999 dB, so that the file holds finite numbers
    return "\n".join(lines), figures


def write_leakage_table(path: str | os.PathLike, profile: Any, dataset: str, samples: int, data: Any,
                        figures: dict[str, list[float]], defence_name: str, weights: str = "initial") -> None:
    """Save ``figures`` as a leakage table of ``profile``'s model (docs/formats.md "Leakage table") and say so."""
    from adaptplan.leakage_table import LeakageTable

    LeakageTable(profile.identity(), dataset, min(samples, int(data.x_train.shape[0])), figures, defence_name,
                 weights).save(path)
    print(f"wrote {path} (leakage per cut: {', '.join(figures)}; {weights} weights)", file=sys.stderr)
