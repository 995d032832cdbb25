"""What every run of a training bench trains on besides its method, plan and seed: :class:`Workload`, one object
that ``bench algorithms``, ``bench training`` and ``bench plans`` take instead of loose parameters, and that turns
into the flat keys of ``adaptplan train``'s configuration (:class:`trainers.config.train_config.TrainConfig`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from adaptplan.benches.comparison import Setting
from adaptplan.defence_cost import DefenceSetting


@dataclass(frozen=True)
class Workload:
    """The data (``dataset``, ``partition``, Dirichlet ``alpha`` for the dirichlet partitions), the ``model`` (and its
    ``model_width``, None: its own), ``devices`` N, the evaluation (every ``eval_every`` rounds on ``test_samples``
    test images, None: all), the ``target`` test accuracy (a fraction) a run's time is measured to, where it runs
    (``device``, ``client_batching``: how, never what) and the one training setting of every method
    (:class:`adaptplan.benches.comparison.Setting`), with every device's ``defence`` of its activations (a
    :class:`adaptplan.defence_cost.DefenceSetting` as written, ``clip=C,noise=σ,nopeek=α,labels=ε``; ``none``). The
    defaults are ``adaptplan train``'s."""

    setting: Setting
    dataset: str = "cifar10-subset"
    model: str = "cnn"
    devices: int = 20
    partition: str = "iid"
    alpha: float = 0.5
    eval_every: int = 10
    test_samples: int | None = 500
    model_width: int | None = None
    target: float = 0.4
    device: str = "auto"
    client_batching: str = "auto"
    defence: str = "none"

    @property
    def head(self) -> int:
        """K of a U-shaped ``defence`` (``head=K``; 0 without)."""
        return DefenceSetting.parse(self.defence, "--defence").head if self.defence != "none" else 0

    def config(self, algorithm: str, seed: int, planned: bool = False) -> dict[str, Any]:
        """The TrainConfig flat keys of ``algorithm``'s run with ``seed`` (one torch thread, no progress bar; the
        setting's values for ``algorithm``, ``planned``: a planner decides its interval)."""
        return dict(algorithm=algorithm, dataset=self.dataset, model=self.model, devices=self.devices,
                    partition=self.partition, dirichlet_alpha=self.alpha, eval_every=self.eval_every, seed=seed,
                    threads=1, progress=False, max_test_samples=self.test_samples, device=self.device,
                    client_batching=self.client_batching,
                    **({"model_width": self.model_width} if self.model_width else {}),
                    **(DefenceSetting.parse(self.defence, "--defence").config() if self.defence != "none" else {}),
                    **self.setting.fields(algorithm, self.devices, planned=planned))
