"""FedConcat (Diao, Li & He, AAAI 2024), one of SCALA's FL baselines: federated learning with no split that
concatenates the encoders of clustered models instead of averaging them, written against docs/algorithms.md
"FedConcat" — its update rule as its authors' code has it (github.com/sjtudyq/FedConcat, ``experiments.py``,
``--alg fedconcat``; the paper's equations were not readable here).

**Clusters.** The devices' label distributions p_i (label counts / |𝒟_i|) are clustered by K-means into K clusters
(``--clusters``, the code's ``n_clusters`` = 5; sklearn 0.22's KMeans: k-means++ seeding, the best of 10 runs by
inertia, here scipy's ``kmeans2`` from the run's strategy generator). An empty cluster is dropped.

**Stage 1, the encoders** (``--encoder-rounds`` global rounds, the code's ``encoder_round`` = 50). A global round is I
local steps (``--interval``) of the ⌈ρN⌉ devices drawn at its start (``--participation`` ρ); then each cluster c
averages the participants among its members, |𝒟_i|-weighted, into its own model w_c (FedAvg within the cluster:
:class:`~trainers.api.Aggregation`'s ``groups``); a member drawn later downloads its cluster's w_c first. The whole
model trains (encoder and classifier). Evaluated: the mean test accuracy of the K cluster models.

**Stage 2, the classifier** (the rest of ``--rounds``). Each w_c is cut into its encoder (every block but the last,
which must be one ``nn.Linear``: the code's ``SimpleClassifier``) and its classifier. The model becomes the K encoders,
frozen, side by side — their outputs concatenated — under a new linear classifier of K·F inputs (freshly initialised,
as the code does for CIFAR-10/SVHN; it starts from the K classifiers only for CIFAR-100 and Tiny-ImageNet). Each global
round, the drawn devices take I local steps on the classifier and the fed server averages it with **equal** weights
(the code: "we move 3 steps for all clients, so this average should be unweighted"). The clock charges the frozen
encoders' forward only (no gradient flows into them) and the classifier's upload and download.
"""

from __future__ import annotations

import copy
from typing import Any, Sequence, cast

import numpy as np
import torch
from scipy.cluster.vq import kmeans2
from torch import nn

from trainers.api import Aggregation, ModelViews, RoundContext, Strategy

KMEANS_RUNS = 10          # sklearn 0.22's KMeans n_init (the authors' requirements.txt)
KMEANS_ITERATIONS = 300   # its max_iter


def cluster_devices(label_counts: list[np.ndarray], k: int, rng: np.random.Generator) -> tuple[int, ...]:
    """Each device's cluster (0, 1, ...; consecutive, empty clusters dropped): K-means of the label distributions
    p_i = counts_i / |𝒟_i| (k-means++ seeding, the least inertia of :data:`KMEANS_RUNS` runs)."""
    p = np.stack([c / max(c.sum(), 1) for c in label_counts]).astype(float)
    k = min(k, len(p))
    best: tuple[float, np.ndarray] | None = None
    for _ in range(KMEANS_RUNS):
        centres, labels = kmeans2(p, k, iter=KMEANS_ITERATIONS, minit="++", rng=rng)
        inertia = float(((p - centres[labels]) ** 2).sum())
        if best is None or inertia < best[0]:
            best = (inertia, labels)
    assert best is not None
    _, consecutive = np.unique(best[1], return_inverse=True)
    return tuple(int(g) for g in consecutive)


class ConcatenatedEncoders(nn.Module):
    """The K frozen encoders side by side: their outputs (flattened) concatenated along the features."""

    def __init__(self, encoders: Sequence[nn.Module]) -> None:
        super().__init__()
        self.encoders = nn.ModuleList(encoders)
        self.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([e(x).flatten(1) for e in self.encoders], dim=1)


class FedConcat(Strategy):
    name = "fedconcat"
    averages_clients = True

    def __init__(self, participation: float = 0.1, clusters: int = 5, encoder_rounds: int = 50) -> None:
        super().__init__(participation)
        self.k, self.encoder_rounds = int(clusters), int(encoder_rounds)
        self.groups: tuple[int, ...] | None = None
        self.aggregations = 0
        self.encoders: list[list[dict[str, torch.Tensor]]] = []     # per cluster, its encoder's block states
        self.classifier: dict[str, torch.Tensor] = {}                 # stage 2's classifier at its start

    def aggregation(self, ctx: RoundContext) -> Aggregation | None:
        if not ctx.aggregation_due():
            return None
        self.aggregations += 1
        if self.model_stage == 0:
            if self.groups is None:
                self.groups = cluster_devices(ctx.label_counts, self.k, ctx.rng)
            return Aggregation(tuple(range(ctx.num_blocks)), "data_size", None, "participants", self.groups)
        return Aggregation((ctx.num_blocks - 1,), "equal")              # the classifier, unweighted

    def model_change_round(self, interval: int) -> int | None:
        """Stage 1 ends after ``encoder_rounds`` global rounds of ``interval`` rounds each."""
        return self.encoder_rounds * interval

    def end_of_round(self, ctx: RoundContext, view: ModelViews) -> None:
        """After the last encoder round: keep each cluster's encoder (its model but the last block), and move on."""
        if self.model_stage == 0 and self.aggregations == self.encoder_rounds and self.groups is not None:
            self.encoders = [[{k: v.detach().clone() for k, v in block.state_dict().items()}
                              for block in list(view.global_model(g))[:-1]] for g in range(max(self.groups) + 1)]
            self.model_stage = 1

    def model_for(self, template: nn.Sequential) -> nn.Sequential:
        """Stage 1: the run's model; stage 2: the clusters' frozen encoders concatenated under a linear classifier
        (:meth:`stage_architecture`, the encoders' weights and the classifier's w⁰ loaded)."""
        model = self.stage_architecture(template, self.stage_spec())
        if self.model_stage == 0:
            return model
        concatenated, classifier = model
        for encoder, states in zip(cast(ConcatenatedEncoders, concatenated).encoders, self.encoders):
            for block, state in zip(cast(nn.Sequential, encoder), states):
                block.load_state_dict(state)
        if self.classifier:
            classifier.load_state_dict(self.classifier)
        self.classifier = {k: v.detach().clone() for k, v in classifier.state_dict().items()}
        return model

    def stage_spec(self) -> dict[str, Any]:
        """Stage 2: how many encoders sit side by side (one per cluster)."""
        return {"encoders": len(self.encoders)} if self.model_stage == 1 else {}

    def stage_specs(self) -> list[dict[str, Any]]:
        return [{"encoders": self.k}]

    @classmethod
    def stage_architecture(cls, template: nn.Sequential, spec: dict[str, Any]) -> nn.Sequential:
        """Stage 2's architecture for ``spec["encoders"]`` = K clusters: K copies of ``template``'s encoder (every
        block but the last, frozen) side by side under a new ``nn.Linear`` of K·F inputs, F the last layer's."""
        if not spec:
            return template
        k = spec.get("encoders") if set(spec) == {"encoders"} else None
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"FedConcat's second stage is {{'encoders': K ≥ 1}}, not {spec}")
        layers = [m for m in template[len(template) - 1].modules() if any(True for _ in m.parameters(recurse=False))]
        if len(layers) != 1 or not isinstance(layers[0], nn.Linear):
            raise ValueError("FedConcat concatenates encoders under a new linear classifier: the model's last block "
                             f"must hold one nn.Linear layer, not {[type(m).__name__ for m in layers]}")
        encoders = [copy.deepcopy(nn.Sequential(*list(template)[:-1])) for _ in range(k)]
        classifier = nn.Linear(k * layers[0].in_features, layers[0].out_features)
        return nn.Sequential(ConcatenatedEncoders(encoders), classifier)

    def eval_models(self, view: ModelViews) -> list[nn.Module]:
        """Stage 1: each cluster's model (their mean accuracy is reported); stage 2: the concatenated model."""
        if self.model_stage == 0 and self.groups is not None:
            return [view.global_model(g) for g in range(max(self.groups) + 1)]
        return [view.global_model()]

    def local_models(self, view: ModelViews) -> dict[int, nn.Module]:
        """Each device's cluster model in stage 1 (the one it downloads), the concatenated model in stage 2."""
        if self.model_stage == 0 and self.groups is not None:
            models = self.eval_models(view)
            return {d: models[self.groups[d]] for d in view.present()}
        return super().local_models(view)

    def state_dict(self) -> dict[str, Any]:
        return {"groups": None if self.groups is None else list(self.groups), "aggregations": self.aggregations,
                "model_stage": self.model_stage, "encoders": self.encoders, "classifier": self.classifier}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.groups = None if state["groups"] is None else tuple(int(g) for g in state["groups"])
        self.aggregations, self.model_stage = int(state["aggregations"]), int(state["model_stage"])
        self.encoders = cast(list, state["encoders"])
        self.classifier = dict(state["classifier"])

    def check_state(self, ctx: RoundContext) -> None:
        if self.groups is not None and len(self.groups) != ctx.num_devices:
            raise ValueError(f"FedConcat's clusters name {len(self.groups)} devices, the run has {ctx.num_devices}")
        if self.model_stage not in (0, 1) or (self.model_stage == 1 and (self.groups is None or
                                                                         len(self.encoders) != max(self.groups) + 1)):
            raise ValueError("FedConcat's state must be stage 0, or stage 1 with one encoder per cluster")
