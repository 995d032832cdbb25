"""Constants from the run itself (Algorithm 1, docs/model.md §5.4) and their calibration to pilot runs (§10).

:func:`run_constants` estimates β, σ_j², G_j² and ϑ (:func:`profilers.estimate_constants`) from a model of the run on
8 mini-batches of its own training data, with γ = the run's learning rate; :func:`pilot_calibration` fits them to the
pilots of ``--pilots`` (:func:`adaptplan.calibration.calibrate`) for the run's ``--target-accuracy``, or, with
``--rounds-law linear``, fits the rounds law of §12 to the pilots alone (:func:`adaptplan.linear_rounds.fit_linear_rounds`;
nothing estimated).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from adaptplan.calibration import Calibration, calibrate
from adaptplan.constants import ConvergenceConstants
from adaptplan.linear_rounds import RoundsLaw, fit_rounds_law
from trainers.config.train_config import TrainConfig
from trainers.run.pilots import read_pilot

ESTIMATE_BATCHES = 8
"""Mini-batches (of the run's batch size) the constants are estimated on."""


@dataclass(frozen=True)
class RunData:
    """What estimation reads of a run: its configuration, training samples ``x``, labels ``y``, the names of its
    blocks (one per cut point) and the torch device it computes on."""

    config: TrainConfig
    x: torch.Tensor
    y: torch.Tensor
    block_names: list[str]
    device: torch.device


def run_constants(run: RunData, model: nn.Sequential, seed: int, epsilon: float) -> ConvergenceConstants:
    """β, σ_j², G_j², ϑ of ``model`` (the run's blocks) on :data:`ESTIMATE_BATCHES` mini-batches of the run's
    training data drawn with ``seed``; γ = ``--lr``, ε = ``epsilon``."""
    from profilers.chain import Chain
    from profilers.gradstats import estimate_constants, iterate_batches

    lr = run.config.optim.lr
    assert lr is not None, "TrainConfig resolves the learning rate"
    batches = iterate_batches(run.x, run.y, run.config.data.batch_size, ESTIMATE_BATCHES, seed=seed)
    return estimate_constants(Chain(model, list(run.block_names)), batches, gamma=lr, epsilon=epsilon,
                              num_batches=ESTIMATE_BATCHES, seed=seed, device=run.device)


def pilot_calibration(run: RunData, model: nn.Sequential) -> Calibration | RoundsLaw:
    """The fit to the pilots of ``--pilots`` (run folders that trained the same setting) at the run's
    ``--target-accuracy``: of the run's constants, estimated from ``model`` (its initial blocks), or, with
    ``--rounds-law linear`` or ``per-cut``, of that rounds law."""
    config = run.config
    target = config.run.target_accuracy
    assert target is not None, "TrainConfig requires --target-accuracy with --pilots"
    setting = config.to_json()
    pilots = [read_pilot(folder, target, setting) for folder in config.plan.pilot_folders]
    if config.plan.rounds_law != "eq15":
        return fit_rounds_law(pilots, config.plan.rounds_law)
    estimated = run_constants(run, model, config.run.seed, epsilon=1.0)      # ε is what the fit sets
    return calibrate(estimated, pilots, config.data.devices)
