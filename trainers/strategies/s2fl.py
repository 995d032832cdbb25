"""S²FL (Yan et al. 2023, "Have your cake and eat it too: toward efficient and accurate split federated learning"),
GAS's synchronous SFL baseline, as GAS's authors run it (their ``baseline/S2FL.py``, github.com/eejiarong/GAS),
written against docs/algorithms.md "S²FL". Only the authors' code was reachable (the paper's own text was not), so
this is their rule, not a reading of the paper.

MiniBatch-SFL (docs/algorithms.md "MiniBatch-SFL") with its server step split by **activation groups**:

* a global iteration is I rounds (``--interval``, the code's E = 20) of ⌈ρN⌉ participants (``--participation``,
  the code's 10 of 20) who download the global client model at its start; device k's mini-batch B_k is
  MiniBatch-SFL's (``proportional_batch``), and its cut gradient is ∂/∂A_k of the mean cross-entropy of its own
  logits through the server at the **pre-update** weights w_s;
* the participants are split into G groups (``--groups``, the code's 2) of ⌊n/G⌋ consecutive participants, then
  improved by :func:`balanced_groups`' swap search until each group's pooled label histogram is nearest uniform;
* each round, every group g gives the server gradient g_g = ∇ mean CE over its concatenated activations at the
  same w_s, clipped at the server's ``--clip-norm`` as the code clips before each group's step; the server steps
  once on (1/G)·Σ_g g_g. For SGD without momentum that is the code's rule exactly (each group steps from w_s and
  the G results are averaged with equal weights); with momentum the code's one optimizer advances its momentum
  buffer once per group within a round, an artefact of reusing one torch optimizer that is not reproduced here
  (one momentum update per round, as every other method of the comparison);
* every I rounds the participants' client models are averaged by |𝒟_k| (as MiniBatch-SFL).

Not reproduced: S²FL's "adaptive model splitting" exists in the authors' file only in its simulated clock (each
client's time taken at the candidate cut nearest the median), never in the training; here every device trains at
its run's cut and the clock charges that cut. With n not divisible by G the last group takes the remainder (the
code, run only at n = 10 and G = 2, would leave the remainder out of every group).
"""

from __future__ import annotations

from typing import Callable, Hashable, Sequence

import numpy as np
import torch

from trainers.api import (
    Activation,
    Aggregation,
    CutGradient,
    OptimizerSpec,
    RoundContext,
    ServerPasses,
    Strategy,
    answer,
    every_interval,
    mean_ce,
    proportional_batch,
)


def group_distance(label_counts: Sequence[np.ndarray], groups: Sequence[Sequence[int]], num_classes: int) -> float:
    """The code's ``calculate_average_distance``: the mean over groups of ‖p_g − 1/M‖₂, p_g the label fractions of
    the group's pooled histogram (zero where the group holds no sample)."""
    total = 0.0
    for group in groups:
        counts = np.sum([label_counts[d] for d in group], axis=0).astype(float)
        fractions = counts / counts.sum() if counts.sum() > 0 else np.zeros(num_classes)
        total += float(np.sqrt(np.sum((fractions - 1.0 / num_classes) ** 2)))
    return total / len(groups)


def balanced_groups(order: Sequence[int], label_counts: Sequence[np.ndarray], num_groups: int, num_classes: int,
                    passes: int = 100) -> list[list[int]]:
    """The code's ``group_data``: ``order`` cut into ``num_groups`` runs of ⌊n/G⌋ (the last one takes the rest), then
    up to ``passes`` passes of a swap search. A pass visits each group's members as the pass found them; for a member
    still in its group it tries swapping it with every member of every other group and keeps the swap that lowers
    :func:`group_distance` most (the first of equals), then moves on to the next group. A pass with no swap ends the
    search (the next would repeat it)."""
    size = len(order) // num_groups
    groups = [list(order[g * size:(g + 1) * size]) for g in range(num_groups - 1)]
    groups.append(list(order[(num_groups - 1) * size:]))
    for _ in range(passes):
        start = [list(g) for g in groups]
        for g, members in enumerate(start):
            for device in members:
                if device not in groups[g]:
                    continue
                best, best_distance = groups, group_distance(label_counts, groups, num_classes)
                for h, other in enumerate(groups):
                    for partner in other if h != g else ():
                        trial = [list(x) for x in groups]
                        trial[g].remove(device)
                        trial[h].remove(partner)
                        trial[g].append(partner)          # the code's order within a group: later ties follow it
                        trial[h].append(device)
                        distance = group_distance(label_counts, trial, num_classes)
                        if distance < best_distance:
                            best, best_distance = trial, distance
                if best is not groups:
                    groups = best
                    break
        if groups == start:
            break
    return groups


class S2FL(Strategy):
    name = "s2fl"
    server_step = "own"              # the grouped step below
    averages_clients = True
    reset_client_optimizer = True    # a global iteration's participants start from the global model, fresh state

    def __init__(self, participation: float = 0.5, groups: int = 2) -> None:   # the code's 10 of 20, 2 groups
        super().__init__(participation)
        self.num_groups = int(groups)
        self.min_participants = max(2, self.num_groups)    # one device per group at least
        self.clip_norm: float | None = None
        self._grouping: tuple[tuple[int, ...], list[list[int]]] | None = None

    def optimizer(self, role: str, spec: OptimizerSpec) -> OptimizerSpec:
        """The run's spec; the server's clipping is also applied to each group's gradient (the code's clip)."""
        if role == "server":
            self.clip_norm = spec.clip_norm
        return spec

    def batch_size(self, ctx: RoundContext, device: int) -> int:
        return proportional_batch(ctx, device)

    def groups(self, ctx: RoundContext, devices: Sequence[int]) -> list[list[int]]:
        """:func:`balanced_groups` of ``devices`` (in index order) by their label counts, kept for the period."""
        key = tuple(devices)
        if self._grouping is None or self._grouping[0] != key:
            self._grouping = key, balanced_groups(key, ctx.label_counts, min(self.num_groups, len(key)),
                                                  ctx.num_classes)
        return self._grouping[1]

    def serve(self, edge: ServerPasses, ctx: RoundContext, arrivals: Sequence[Activation]) -> list[CutGradient]:
        by_device = {a.device: a for a in arrivals}

        def own_loss(device: int, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            loss = mean_ce(logits, labels)
            ctx.record_loss(device, loss)
            return loss

        cut: dict[int, torch.Tensor] = {}
        group_grads = []
        for group in self.groups(ctx, sorted(by_device)):
            part = [by_device[d] for d in group]
            grads, server = edge.arrival_gradients(part, own_loss, self._group_mean(sum(a.batch_size for a in part)))
            cut.update(grads)
            group_grads.append(self._clipped(server))
        edge.add_gradients(edge.parameters(arrivals[0].device),
                           [torch.stack(g).mean(0) for g in zip(*group_grads)])
        for a in arrivals:
            ctx.charge_server(a.device, backward=a.batch_size)     # the cut gradients' second backward, eq. (19)
        owners: list[Hashable] = edge.owners(by_device)
        edge.step(owners)
        return [answer(a, cut[a.device]) for a in arrivals]

    @staticmethod
    def _group_mean(rows: int) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """The group's mean cross-entropy as a sum over the runtime's passes: each pass's mean × its share."""
        return lambda logits, labels: mean_ce(logits, labels) * (len(labels) / rows)

    def _clipped(self, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        """``grads`` scaled as torch's ``clip_grad_norm_`` scales a gradient at ``clip_norm`` (none: unchanged)."""
        if self.clip_norm is None or not grads:
            return grads
        norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
        scale = min(1.0, self.clip_norm / (norm + 1e-6))
        return [g * scale for g in grads] if scale < 1.0 else grads

    def aggregation(self, ctx: RoundContext) -> Aggregation | None:
        return every_interval(ctx, range(ctx.deepest_cut), recipients="none")    # downloaded at the next start
