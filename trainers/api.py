"""The strategy API: everything an algorithm may use, and the only module strategies import
(tests/project/test_architecture.py checks it). Flower-style: roles do, a strategy decides.

A round (docs/architecture.md "The runtime"), and the decision points it asks the strategy:

1. ``participants(ctx)`` — who takes part (all by default); ``batch_size(ctx, device)`` — b_i.
2. ``schedule(ctx, participants)`` — groups run one after the other (SL: one device per group).
3. Devices forward and send :class:`Activation` messages; they arrive at the edge server at the
   simulated times of the latency model. ``server_mode`` says how arrivals are handed over:
   ``"barrier"`` (all of a group at once, when the last arrives) or ``"arrival"`` (in arrival order,
   the server busy while it works: one at a time, or those the strategy lets wait, ``AsyncStrategy.defer``).
4. ``serve(edge, ctx, arrivals) -> [CutGradient]`` — what the edge server does with them, through
   its :class:`ServerPasses` only: run them through its blocks (``run``, concatenating devices
   that meet; ``in_passes`` for a computation separable over the devices; ``backward_mean_loss`` for a
   server-internal batch), form any loss, back-propagate fully or only to the cut (:meth:`ServerPass.cut_gradients`), take per-device server gradients
   (``per_device_gradients``), step owners (``step``). It answers any subset of the devices; ``flush(edge, ctx)`` is asked
   for the rest when the group's arrivals are all served. :func:`answer` / :func:`skip` build
   the replies (a skip drops the device's step without an update). ``server_step`` states what the
   server computes, as data: ``"parallel"`` (the default ``serve``, eqs. 3–5, which the runtime may run one
   part of the barrier at a time as the devices forward, :class:`ParallelStep`) or ``"own"`` (a strategy with its own
   ``serve``, given the whole barrier). A strategy whose own replies depend on each device alone gives them part
   by part too: ``barrier_step(edge, ctx, devices)`` returns its :class:`BarrierStep` (GAPSL), else None.
5. ``after_group(ctx, group) -> [Handoff]`` — client models passed between devices (SL).
6. ``aggregation(ctx) -> Aggregation | None`` — client-side model averaging: which blocks,
   weights (|𝒟_i| or equal), whose models, and who receives the average (participants or all).
7. ``eval_models(view)`` — the models whose mean test accuracy is reported (global protocol), and
   ``local_models(view)`` — each device's model for its own held-out samples (local protocol), from the
   :class:`ModelViews` (not the runtime itself).

Layout: ``server_owner(device, block, deepest_cut)`` — which edge-server instance holds a block
(a device index = a per-device copy; ``None`` = one shared instance). Optimizers:
``optimizer(role, spec)`` — per role ("client"/"server"), from the run's spec by default.
Asynchronous strategies (GAS) set ``asynchronous = True`` and implement the event hooks of
:class:`AsyncStrategy`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable, Protocol, Sequence, cast

import numpy as np
import torch
from torch import nn

from adaptplan.errors import InputError
from adaptplan.fileio import is_finite_number, is_int
from trainers.algorithms import PARTICIPATION, REGISTRY
from trainers.roles.messages import Activation, BlockState, CutGradient, ModelUpload, NonFiniteError
from trainers.roles.optim import OptimizerSpec
from trainers.roles.passes import ServerPass

__all__ = ["Activation", "CutGradient", "ModelUpload", "NonFiniteError", "ServerPasses", "ModelViews", "ServerPass",
           "OptimizerSpec", "InputError",
           "RoundContext", "Aggregation", "Handoff", "Strategy", "AsyncStrategy", "answer", "skip", "mean_ce",
           "logit_adjusted_ce", "calibrated_ce", "label_prior", "DeviceLoss", "BarrierStep", "ParallelStep", "parallel_step", "serve_in_passes",
           "every_interval", "sample_devices", "sample_count", "proportional_batch", "concatenated_step", "GradientRowsStep",
           "is_int", "is_finite_number", "BufferedAsyncStrategy", "BlockState"]


class ServerPasses(Protocol):
    """What a strategy may do with the edge server (trainers.roles.passes.EdgePasses implements it; the
    strategy never sees the class): forward passes, gradients, optimizer steps."""

    def run(self, arrivals: Sequence[Activation], concatenate: bool = True) -> ServerPass:
        """Eq. (3): every arrival through its server blocks."""

    def in_passes(self, arrivals: Sequence[Activation],
                  serve: Callable[[Sequence[Activation]], list[CutGradient]]) -> list[CutGradient]:
        """``serve`` — a computation separable over the devices, whose shared gradients accumulate — run on the
        arrivals in passes of the runtime's size (one pass where the memory allows); every pass's replies."""

    def run_features(self, features: torch.Tensor, device: int) -> torch.Tensor:
        """Cut-layer features through the server blocks device ``device`` uses."""

    batch_independent: bool
    """A sample's server outputs never depend on the other samples of its pass (no BatchNorm): a loss summed over
    samples has one gradient however the samples are split into passes."""

    def backward_mean_loss(self, features: torch.Tensor, targets: torch.Tensor, device: int,
                           count: int | None = None) -> None:
        """Back-propagate the mean cross-entropy of ``features`` through device ``device``'s server blocks (the
        runtime keeps each graph within its pass budget); ``count``: a mean over that many rows, ``features`` a
        part of them."""

    def arrival_gradients(self, arrivals: Sequence[Activation],
                          cut_loss: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor],
                          server_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
                          ) -> tuple[dict[int, torch.Tensor], list[torch.Tensor]]:
        """Forwards of arrivals sharing their server blocks, two losses: each device's ∂cut_loss/∂a_i, and
        ∂server_loss/∂w_s summed over the runtime's passes (per parameter of :meth:`parameters`, not accumulated
        into ``.grad``) (GAS)."""

    def per_device_gradients(self, arrivals: Sequence[Activation],
                             loss_of: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor],
                             create_graph: bool = False) -> dict[int, Any]:
        """Each device's own server gradient g_i and cut gradient (GAPSL)."""

    def gradient_rows(self, arrivals: Sequence[Activation],
                      loss_of: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor], answers_all: bool = False
                      ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The devices' server gradients g_i as the rows of one matrix, and their losses (GAPSL);
        ``answers_all``: every arrival will be answered with its cut gradient (:meth:`cut_gradients`)."""

    def cut_gradients(self, arrivals: Sequence[Activation],
                      loss_of: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]) -> dict[int, torch.Tensor]:
        """Each arrival's ∂L_i/∂a_i of ``loss_of``'s L_i at the current server weights (GAPSL: before its step;
        CycleSL: θ_S^{t+1}), in passes of the runtime's size."""

    def pooled_pass(self, arrivals: Sequence[Activation],
                    device_loss: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor],
                    pooled_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
                    ) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
        """One forward at the current weights: each device's ∂L_i/∂a_i of its own loss, and the mean loss over
        the pooled samples back-propagated into the server (SCALA); returns (cut gradients, L_i)."""

    def parameters(self, device: int) -> list[nn.Parameter]:
        """The server parameters device ``device``'s stream passes through."""

    def add_gradients(self, params: Sequence[nn.Parameter], grads: Sequence[torch.Tensor]) -> None:
        """Accumulate ``grads`` into ``params``' gradients."""

    def owners(self, devices: Iterable[int]) -> list[Hashable]:
        """The owners (optimizers) the devices' streams touch."""

    def step(self, owners: Iterable[Hashable], scale: dict[Hashable, float] | float = 1.0) -> None:
        """One optimizer step per owner."""


class ModelViews(Protocol):
    """The models a strategy may ask for to evaluate (trainers.engine.split_engine.SplitEngine implements it)."""

    num_devices: int

    def present(self, devices: Sequence[int] | None = None) -> list[int]:
        """``devices`` (default all) without the absent ones (lost in a real runtime)."""

    def averaged_model(self, devices: Sequence[int] | None = None) -> nn.Sequential:
        """w̄: the block-wise mean of the devices' models."""

    def device_model(self, device: int) -> nn.Sequential:
        """Device i's full model [w_{c,i}; w_{s,i}]."""

    def global_model(self, group: int = 0) -> nn.Sequential:
        """The global model of the last aggregation: the fed server's averaged blocks (the initial ones
        before the first average; group ``group``'s where :class:`Aggregation` groups the devices) with the edge
        server's shared blocks."""


@dataclass
class RoundContext:
    """What a strategy may know at a decision point of round ``round`` (1-based).

    ``num_blocks`` L; ``cuts`` ℓ_i per device; ``data_sizes`` |𝒟_i| in samples; ``batch_size`` the run's b;
    ``interval`` I in rounds and ``rounds_since_aggregation``; ``total_rounds`` R of the run (or
    None); ``rng`` the run's seeded generator for strategy decisions (checkpointed);
    ``num_classes`` M; ``label_counts[i]`` device i's label histogram (shared once by the device,
    as SCALA/GAS assume); ``participants`` the round's participants once drawn (a strategy that averages
    client models keeps one draw for its whole aggregation period); ``metrics`` a dict the strategy may fill
    for the round's record;
    ``absent`` the devices lost for the rest of the run (a real runtime, where the strategy
    ``allows_absence``: docs/mqtt.md "Churn"), never chosen again.
    """

    round: int
    num_devices: int
    num_blocks: int
    cuts: list[int]
    data_sizes: list[int]
    batch_size: int
    interval: int
    rounds_since_aggregation: int
    total_rounds: int | None
    rng: np.random.Generator
    num_classes: int
    label_counts: list[np.ndarray]
    metrics: dict[str, float] = field(default_factory=dict)
    losses: dict[int, torch.Tensor] = field(default_factory=dict)
    server_samples: dict[int, float] = field(default_factory=dict)
    server_flops: float = 0.0
    server_backward: dict[int, float] = field(default_factory=dict)
    absent: frozenset[int] = frozenset()
    participants: list[int] = field(default_factory=list)

    def present(self) -> list[int]:
        """The devices that can still take part (all but ``absent``), in index order."""
        return [d for d in range(self.num_devices) if d not in self.absent]

    def charge_server(self, device: int, samples: float = 0.0, flops: float = 0.0, backward: float = 0.0) -> None:
        """Charge the edge server for work beyond the runtime's one forward+backward of every arrival:
        ``samples`` more forward+backward passes of one sample through device ``device``'s server blocks
        (each costs eqs. (18)+(19) per sample), ``backward`` more backward passes of one sample (eq. (19) per
        sample) and ``flops`` FLOPs outside the model (statistics, Gram matrices; 2 FLOPs per multiply–add, the
        profiles' convention) at the server's FLOP/s. The runtime adds the seconds to the server's busy time
        when the call that charged them returns."""
        self.server_samples[device] = self.server_samples.get(device, 0.0) + float(samples)
        if backward:
            self.server_backward[device] = self.server_backward.get(device, 0.0) + float(backward)
        self.server_flops += float(flops)

    def take_server_charges(self) -> tuple[dict[int, float], float, dict[int, float]]:
        """The charges since the last call (and clear them): forward+backward samples, FLOPs, backward samples."""
        charged = (dict(self.server_samples), self.server_flops, dict(self.server_backward))
        self.server_samples.clear()
        self.server_backward.clear()
        self.server_flops = 0.0
        return charged

    def record_loss(self, device: int, loss: torch.Tensor) -> None:
        """Keep device ``device``'s training loss F_i of this round (the round reports their mean)."""
        self.losses[device] = loss.detach()

    @property
    def deepest_cut(self) -> int:
        """L_c = max_i ℓ_i."""
        return max(self.cuts)

    def aggregation_due(self) -> bool:
        """True when I rounds have passed since the last aggregation (t mod I = 0 for a fixed I)."""
        return self.rounds_since_aggregation >= self.interval


RECIPIENTS = ("participants", "all", "none")
"""Who downloads a client-model average when it is finished (:class:`Aggregation`)."""


@dataclass(frozen=True)
class Aggregation:
    """Client-side model averaging for this round.

    ``blocks``: 0-based chain blocks averaged (wherever they live: device, or the edge server's
    per-device instances); ``weights``: ``"data_size"`` (FedAvg, |𝒟_i|) or ``"equal"``;
    ``devices``: whose models are averaged (None = the round's participants); ``recipients``:
    ``"participants"`` (those averaged), ``"all"`` (every device downloads the average of its
    client blocks: a global client model broadcast) or ``"none"`` (nobody downloads it now: the devices
    drawn next download the global model at the start of their round, as SCALA's B.2 step 2);
    ``groups``: where given, ``groups[i]`` is device i's group (0, 1, ...) and each group's models are averaged
    apart into that group's global model, which only its members download (FedConcat's clusters; client blocks
    only: the blocks averaged must all be on the devices). A recipient whose group had no member among those
    averaged keeps its model and downloads its group's global model when next drawn.
    """

    blocks: tuple[int, ...]
    weights: str = "data_size"
    devices: tuple[int, ...] | None = None
    recipients: str = "participants"
    groups: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.recipients not in RECIPIENTS:
            raise ValueError(f"recipients must be one of {', '.join(RECIPIENTS)}, got {self.recipients!r}")


@dataclass(frozen=True)
class Handoff:
    """Device ``source`` passes its client blocks (and their optimizer state) to ``target`` (SL)."""

    source: int
    target: int


def every_interval(ctx: RoundContext, blocks: Sequence[int], recipients: str = "participants") -> Aggregation | None:
    """FedAvg (|𝒟_i|-weighted) of ``blocks`` when I rounds have passed since the last one (eq. 7), else None."""
    return Aggregation(tuple(blocks), "data_size", None, recipients) if ctx.aggregation_due() else None


def sample_count(ctx: RoundContext, fraction: float, minimum: int = 1) -> int:
    """How many devices :func:`sample_devices` draws: ⌈fraction·N⌉, at least ``minimum``, at most those present."""
    present = len(ctx.present())
    return present if fraction >= 1 else min(present, max(minimum, math.ceil(fraction * ctx.num_devices)))


def sample_devices(ctx: RoundContext, fraction: float, minimum: int = 1) -> list[int]:
    """⌈fraction·N⌉ devices (at least ``minimum``, at most the devices present), uniform without
    replacement from ``ctx.rng`` over the devices not ``absent`` (the same draws as over all N while
    none is); all present ones when fraction = 1."""
    present = ctx.present()
    if fraction >= 1:
        return present
    n = sample_count(ctx, fraction, minimum)
    if len(present) == ctx.num_devices:
        return sorted(int(d) for d in ctx.rng.choice(ctx.num_devices, size=n, replace=False))
    return sorted(int(d) for d in ctx.rng.choice(present, size=n, replace=False)) if n else []


def answer(arrival: Activation, tensor: torch.Tensor) -> CutGradient:
    """The edge server's reply to ``arrival``: its cut gradient (same tags)."""
    return CutGradient(arrival.device, arrival.round, arrival.step, tensor.detach())


def skip(arrival: Activation) -> CutGradient:
    """A reply telling the device to drop this step without an update."""
    return CutGradient(arrival.device, arrival.round, arrival.step, None)


def common_gradient_rows(ctx: RoundContext, arrivals: Sequence[Activation], grads: dict[int, torch.Tensor],
                         fraction: float = 0.5) -> dict[int, torch.Tensor]:
    """SGLR's server-side local gradient averaging (CSL-8): a random ⌊φ·n_t⌋ of the ``arrivals`` (the first in a
    uniformly random order from ``ctx.rng``; φ = ``fraction``, CycleSL's code: half) each receive, in every row,
    the one averaged row ḡ = Σ_{i∈A_t} |𝒟_i| Σ_j G_i[j] / Σ_{i∈A_t} |𝒟_i|·b_i of their cut gradients G_i (whose
    rows already hold the 1/b_i of a mean loss); the others keep their own G_i."""
    order = ctx.rng.permutation(len(arrivals))
    active = [arrivals[int(k)] for k in order[:int(fraction * len(arrivals))]]
    if not active:
        return grads
    sizes = {a.device: float(ctx.data_sizes[a.device]) for a in active}
    total = sum(sizes[a.device] * a.batch_size for a in active)
    row = cast(torch.Tensor, sum(sizes[a.device] * grads[a.device].sum(0) for a in active)) / total
    return {**grads, **{a.device: row.expand_as(grads[a.device]).clone() for a in active}}


DeviceLoss = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]
"""F_i of device ``i`` from its server logits and labels (a scalar)."""


def mean_ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """F_i: mean cross-entropy over the mini-batch (docs/model.md §1)."""
    return nn.functional.cross_entropy(logits, labels)


def label_prior(counts: np.ndarray | torch.Tensor) -> torch.Tensor:
    """A label distribution π (float32) from class counts (a tensor stays on its device)."""
    c = counts.to(torch.float32) if torch.is_tensor(counts) else torch.as_tensor(np.asarray(counts), dtype=torch.float32)
    return c / c.sum().clamp_min(1.0)


def calibrated_ce(logits: torch.Tensor, labels: torch.Tensor, counts: np.ndarray | torch.Tensor, tau: float,
                  floor: float = 1e-8) -> torch.Tensor:
    """FedLC's logit-calibrated cross-entropy (Zhang et al., ICML 2022, docs/algorithms.md FedLC): mean over the
    batch of −log softmax(s − τ·n^(−1/4))_y, n the device's samples per class (a class it lacks counted as
    ``floor``, FL-bench's FedLC client)."""
    n = torch.as_tensor(counts, dtype=logits.dtype, device=logits.device).clamp_min(floor)
    return nn.functional.cross_entropy(logits - tau * n.pow(-0.25), labels)


def logit_adjusted_ce(logits: torch.Tensor, labels: torch.Tensor, prior: torch.Tensor, tau: float = 1.0,
                      eps: float = 1e-12) -> torch.Tensor:
    """Logit-adjusted cross-entropy, docs/algorithms.md SCALA eqs. (12)–(13) / GAS-9:
    mean over the batch of −log softmax(s + τ·log(π + ε))_y. A uniform π gives plain CE."""
    return nn.functional.cross_entropy(logits + tau * torch.log(prior.to(logits.device, logits.dtype) + eps), labels)


class BarrierStep(Protocol):
    """A barrier's server step in parts (:meth:`Strategy.barrier_step`): ``serve_part`` is given consecutive parts
    of the barrier's arrivals (in arrival order, each arrival once) and returns each part's replies, final when
    given (they may depend only on that part's devices and the pre-step server weights); ``finish`` is called once
    every part is served and does the rest of the step."""

    def serve_part(self, part: Sequence[Activation]) -> list[CutGradient]:
        """The replies to ``part``."""

    def finish(self) -> None:
        """The step that needs every part (the shared server weights)."""


class ParallelStep:
    """Eqs. (3)–(5) over the arrivals of one barrier, served a part at a time: every part at the
    same (pre-update) server weights, its devices' losses back-propagated at once, per-device
    instances stepped with their own gradient g_{n,i} (eq. 5) as soon as their part is done, and the
    shared instances with the |𝒟_i|-weighted average of the g_{s,i} (eq. 4; the plain 1/N average
    when the local datasets are equal) once every part is (:meth:`finish`).

    ``devices`` are the barrier's devices (all of them, before any part is served: the weights
    |𝒟_i|/Σ|𝒟| are over the whole barrier). :func:`parallel_step` serves a barrier whose arrivals
    are all there; the runtime feeds it a part of the barrier at a time (for a strategy whose ``server_step``
    is ``"parallel"``: as the devices forward, or in passes of its size, each part's replies delivered at once),
    which gives the same parameters bit for bit."""

    def __init__(self, edge: ServerPasses, ctx: RoundContext, devices: Sequence[int],
                 loss_of: "DeviceLoss | None" = None) -> None:
        self.edge, self.ctx = edge, ctx
        self.loss_of: DeviceLoss = loss_of or (lambda d, z, y: mean_ce(z, y))
        sizes = {int(d): float(ctx.data_sizes[d]) for d in devices}
        total = sum(sizes.values())
        # shared instances receive Σ_i (|D_i|/Σ|D|)·g_{s,i}; per-device instances g_{n,i}: scale each
        # device's loss by its weight on the shared part and undo it for its own instances
        self.weights = {d: sizes[d] / total for d in sizes}

    def serve_part(self, part: Sequence[Activation]) -> list[CutGradient]:
        """Forward ``part`` of the barrier's arrivals (devices meeting at an instance concatenated), back-propagate
        Σ_i w_i F_i into the server's gradients, step the part's per-device instances; its replies ∂F_i/∂a_i
        (final: taken at the pre-update w_s)."""
        edge, weights = self.edge, self.weights
        p = edge.run(part)
        losses = {d: p.loss(d, self.loss_of) for d in p.devices}
        for d, loss in losses.items():
            self.ctx.record_loss(d, loss)
        # each device's ∂F_i/∂a_i (the part's input gradients are released with it)
        total_loss = cast(torch.Tensor, sum(weights[d] * losses[d] for d in p.devices))
        grads = {d: g / weights[d] for d, g in p.backward(total_loss).items()}
        # a per-device instance's gradient is complete once its device's part is done: step it now (eq. 5)
        # and free the gradient, rather than holding every device's until the end
        # per-device owners (a device's own copy, or the slot it fills): each belongs to one device of the barrier
        scale = {o: 1.0 / weights[d] for d in p.devices for o in edge.owners([d]) if o is not None}
        edge.step(list(scale), scale)
        return [answer(a, grads[a.device]) for a in part]

    def finish(self) -> None:
        """Step the shared instances w_s: the average over every part (eq. 4)."""
        self.edge.step([o for o in self.edge.owners(self.weights) if o is None])


class GradientRowsStep:
    """A barrier's server step built on the devices' own server gradients g_i (GAPSL, A.3.4), served in parts: each
    part's g_i written into its rows of the barrier's S × P matrix (the rows in the order the parts come in, as
    one whole-barrier part would have them) with its L_i = ``loss_of``, and its replies, each device's own
    ∂L_i/∂a_i at the pre-step server weights; once every part is in, ``step_on(rows, devices)`` does the server
    step on the whole matrix. How the parts are cut (the runtime's pass budget) changes no number."""

    def __init__(self, edge: ServerPasses, ctx: RoundContext, devices: Sequence[int], loss_of: "DeviceLoss",
                 step_on: Callable[[torch.Tensor, list[int]], None]) -> None:
        self.edge, self.ctx, self.size, self.loss_of, self.step_on = edge, ctx, len(devices), loss_of, step_on
        self.rows: torch.Tensor | None = None       # S × P, allocated with the first part's rows
        self.order: list[int] = []                  # the devices of the rows written so far

    def serve_part(self, part: Sequence[Activation]) -> list[CutGradient]:
        rows, losses = self.edge.gradient_rows(part, self.loss_of, answers_all=True)   # every device answered
        if self.rows is None:
            self.rows = rows.new_zeros(self.size, rows.shape[1])
        self.rows[len(self.order):len(self.order) + len(part)] = rows
        for a, loss in zip(part, losses):
            self.ctx.record_loss(a.device, loss)
            self.order.append(a.device)
        cut = self.edge.cut_gradients(part, self.loss_of)                     # ∂L_i/∂a_i at the pre-step weights
        return [answer(a, cut[a.device]) for a in part]

    def finish(self) -> None:
        if self.rows is not None:
            self.step_on(self.rows[:len(self.order)], list(self.order))


def parallel_step(edge: ServerPasses, ctx: RoundContext, arrivals: Sequence[Activation],
                  loss_of: "DeviceLoss | None" = None) -> list[CutGradient]:
    """All arrivals at the same server weights (eqs. 3–5, :class:`ParallelStep`; F_i = ``loss_of``, mean CE by
    default); reply ∂F_i/∂a_i to every device."""
    if not arrivals:
        return []
    return serve_in_passes(edge, ParallelStep(edge, ctx, [a.device for a in arrivals], loss_of), arrivals)


def proportional_batch(ctx: RoundContext, device: int) -> int:
    """B_k = max(⌊|𝒟_k|·b·|𝒞| / Σ_{𝒞}|𝒟_j|⌋, 1): the participants' mini-batches in proportion to their data, about
    b·|𝒞| samples in all (SCALA's eq. 3; MiniBatch-SFL as GAS's authors run it)."""
    total = sum(ctx.data_sizes[d] for d in ctx.participants)
    return max(int(ctx.data_sizes[device] * ctx.batch_size * len(ctx.participants) / total), 1)


def concatenated_step(edge: ServerPasses, ctx: RoundContext, arrivals: Sequence[Activation], device_loss: "DeviceLoss",
                      pooled_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> list[CutGradient]:
    """One forward of the arrivals at the pre-update server weights gives both losses: each device's cut gradient
    from its own ``device_loss`` and the server's gradient from ``pooled_loss`` over the concatenated batch; then
    one server step (SCALA's eqs. 5–6 and 12–13; MiniBatch-SFL with plain cross-entropy). The second backward (the
    cut gradients) is charged on the clock as eq. (19), its upper bound."""
    grads, losses = edge.pooled_pass(arrivals, device_loss, pooled_loss)
    for d, loss in losses.items():
        ctx.record_loss(d, loss)
    for a in arrivals:
        ctx.charge_server(a.device, backward=a.batch_size)
    edge.step(edge.owners([a.device for a in arrivals]))
    return [answer(a, grads[a.device]) for a in arrivals]


def serve_in_passes(edge: ServerPasses, step: BarrierStep, arrivals: Sequence[Activation]) -> list[CutGradient]:
    """A whole barrier's ``arrivals`` through a step in parts: each of the server's passes a part (the shared
    gradients accumulate over them), then ``finish``; every reply."""
    replies = edge.in_passes(arrivals, step.serve_part)
    step.finish()
    return replies


class Strategy:
    """Default behaviour: all devices every round in parallel (``barrier``), per-device client
    models, one shared server model updated by :func:`parallel_step`, no aggregation, evaluation of
    the global model."""

    name = "base"
    server_mode = "barrier"
    server_step = "parallel"    # what the server computes: "parallel" = eqs. (3)–(5), the default serve; "own" = serve
    asynchronous = False
    participation = 1.0
    min_participants = 1        # a sampled round takes at least this many devices
    averages_clients = False    # True: client models are averaged every I rounds (False: never; SL hands one on)
    reset_client_optimizer = False   # a device that loads a global client model restarts its optimizer state
    uses_total_rounds = False   # the schedule reads t/R (ctx.total_rounds): a resumed run must keep --rounds
    allows_absence = False      # the registry's trait (set from trainers.algorithms for a registered ``name``)
    whole_model = False         # the registry's trait: every device holds all L blocks (no split; the engine checks)
    labels_on_device = False    # the registry's trait: a U-shaped split may keep the labels on the devices
    legacy_period_key: str | None = None   # a key of old checkpoints' strategy state that held the period's participants
    optional_state: frozenset[str] = frozenset()   # keys of state_dict() absent from checkpoints written before them
    model_stage = 0             # which model the strategy trains now (``model_for``); the run rebuilds when it changes

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A registered algorithm's traits come from its registry entry (:mod:`trainers.algorithms`), not the class."""
        super().__init_subclass__(**kwargs)
        if "serve" in cls.__dict__ and cls.server_step == "parallel":
            raise TypeError(f"{cls.__name__} defines its own serve: declare server_step = \"own\" (the runtime may "
                            "otherwise serve its barriers with the default parallel step)")
        entry = REGISTRY.get(cls.__dict__.get("name", ""))
        if entry is not None:
            cls.allows_absence = entry.allows_absence
            cls.whole_model = entry.whole_model
            cls.labels_on_device = entry.labels_on_device

    def __init__(self, participation: float = 1.0) -> None:
        PARTICIPATION.check(participation)        # the other options are checked by make_strategy (their entry's limits)
        self.participation = float(participation)

    # ---- layout and set-up ----------------------------------------------------------------------
    def server_owner(self, device: int, block: int, deepest_cut: int) -> Hashable:
        return None

    def validate(self, ctx: RoundContext) -> None:
        """Raise InputError if the cuts/devices do not suit the algorithm."""

    def optimizer(self, role: str, spec: OptimizerSpec) -> OptimizerSpec:
        """The optimizer of ``role`` ("client" or "server"); the run's spec by default."""
        return spec

    # ---- per round ------------------------------------------------------------------------------
    def participants(self, ctx: RoundContext) -> list[int]:
        """All devices, or ⌈ρN⌉ drawn uniformly without replacement (``participation`` ρ < 1). Asked every
        round, or, where client models are averaged (``averages_clients``), once per aggregation period: the
        runtime keeps the draw until the aggregation (FedAvg's round; SCALA's global iteration), and a device
        drawn after missing an average first downloads the global model."""
        return sample_devices(ctx, self.participation, self.min_participants)

    def batch_size(self, ctx: RoundContext, device: int) -> int:
        return ctx.batch_size

    def schedule(self, ctx: RoundContext, participants: Sequence[int]) -> list[list[int]]:
        return [list(participants)]

    def serve(self, edge: ServerPasses, ctx: RoundContext, arrivals: Sequence[Activation]) -> list[CutGradient]:
        return parallel_step(edge, ctx, arrivals, self.device_loss(ctx))

    def device_loss(self, ctx: RoundContext) -> "DeviceLoss | None":
        """Device i's loss F_i(logits, labels) in the parallel step (eqs. 3–5); None: the mean cross-entropy
        (:func:`mean_ce`). FedLC's calibrated loss, LLA-SFL's logit-adjusted one."""
        return None

    def barrier_step(self, edge: ServerPasses, ctx: RoundContext, devices: Sequence[int]) -> BarrierStep | None:
        """This barrier's server step in parts (``devices``: all of the barrier's, before any part), which the
        runtime may feed a part at a time as the devices forward; None: :meth:`serve` takes the whole barrier.
        The default parallel step (``server_step = "parallel"``) is a :class:`ParallelStep`."""
        return ParallelStep(edge, ctx, devices, self.device_loss(ctx)) if self.server_step == "parallel" else None

    def flush(self, edge: ServerPasses, ctx: RoundContext) -> list[CutGradient]:
        """Replies still owed after the group's arrivals were all served."""
        return []

    def after_group(self, ctx: RoundContext, group: Sequence[int]) -> list[Handoff]:
        return []

    def aggregation(self, ctx: RoundContext) -> Aggregation | None:
        return None

    def eval_models(self, view: ModelViews) -> list[nn.Module]:
        """The global model of the last aggregation (|𝒟_i|-weighted FedAvg; w⁰ before the first), never a
        mean over devices that may hold stale or untrained models."""
        return [view.global_model()]

    def local_models(self, view: ModelViews) -> dict[int, nn.Module]:
        """The local protocol's model of each present device (evaluated on its own held-out samples): the
        global model where client models are averaged (every device downloads it), else the device's own
        [w_{c,i}; w_s]."""
        if self.averages_clients:
            model = view.global_model()
            return {d: model for d in view.present()}
        return {d: view.device_model(d) for d in view.present()}

    # ---- a change of model (FedConcat's second stage) -------------------------------------------------
    def end_of_round(self, ctx: RoundContext, view: ModelViews) -> None:
        """Asked after each round (its aggregation done) where ``model_change_round`` is not None: a strategy moving to another
        model reads what it needs from ``view`` and raises ``model_stage``."""

    def model_change_round(self, interval: int) -> int | None:
        """The round after which the strategy moves to another model at aggregation interval ``interval`` (None:
        never, the default: the run then never asks ``end_of_round``)."""
        return None

    def model_for(self, template: nn.Sequential) -> nn.Sequential:
        """The model trained at ``model_stage``, as blocks: the run's model ``template`` at stage 0. The run builds
        every role anew around a new one (docs/engine.md "A change of model"), the clock going on."""
        return template

    def stage_spec(self) -> dict[str, Any]:
        """What a device rank needs, besides the run's model, to build the architecture of ``model_stage``
        (:meth:`stage_architecture`; JSON-able, sent in its set-up): {} at stage 0, the default."""
        return {}

    def stage_specs(self) -> list[dict[str, Any]]:
        """The :meth:`stage_spec` of every later stage a run of this strategy may reach, at their largest (what bounds
        the messages of a run of processes: trainers/distributed/frame_bound.py); none by default."""
        return []

    @classmethod
    def stage_architecture(cls, template: nn.Sequential, spec: dict[str, Any]) -> nn.Sequential:
        """The architecture that :meth:`stage_spec` ``spec`` describes, built from the run's model ``template`` (its
        weights as built: a device rank then loads rank 0's); ``template`` itself for {}. ValueError for a spec
        this strategy never gives."""
        if spec:
            raise ValueError(f"{cls.__name__} trains one model: it has no model stage {spec}")
        return template

    # ---- checkpoint -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def check_state(self, ctx: RoundContext) -> None:
        """Raise ValueError if the state just loaded does not fit this run (devices, cuts)."""


class AsyncStrategy(Strategy):
    """An asynchronous strategy (GAS): no round barrier. The runtime keeps ``active`` devices
    training; arrivals are served in arrival order, each at once unless ``defer`` lets it wait (then
    ``serve`` gets the waiting arrivals together, still in arrival order); after ``local_steps``
    steps a device uploads its client model (``on_model``) and is replaced (``replace``). A round of
    the history is one global iteration: it ends when ``on_model`` reports an aggregation."""

    asynchronous = True
    server_mode = "arrival"
    averages_clients = True     # the fed server averages the uploaded client models into the global one
    active: int = 10
    local_steps: int = 20

    def active_count(self, ctx: RoundContext) -> int:
        """C: ``active`` capped at the devices, or with 0 half of them, ⌈N/2⌉ (GAS's 10 of 20)."""
        return min(self.active, ctx.num_devices) if self.active else math.ceil(ctx.num_devices / 2)

    def begin(self, ctx: RoundContext, initial: dict[int, dict[str, torch.Tensor]]) -> None:
        """Called once, before the run's first global iteration (not on a resume: the checkpointed state holds
        what it kept), with ``initial`` the blocks' initial states w⁰ every device starts from (copies the
        strategy may keep). Default: nothing."""

    def first_devices(self, ctx: RoundContext) -> list[int]:
        """The initial active set 𝒞 (C devices, uniform without replacement; only present ones)."""
        present = ctx.present()
        pool: Any = ctx.num_devices if len(present) == ctx.num_devices else present
        return sorted(int(d) for d in ctx.rng.choice(pool, size=min(self.active_count(ctx), len(present)),
                                                      replace=False))

    def replace(self, ctx: RoundContext, finished: int, active: Sequence[int]) -> int:
        """The device that takes ``finished``'s slot (uniform over the inactive devices present;
        ``finished`` itself when there is none)."""
        busy = set(active) | {finished}            # a set: a list here cost C per device, N·C per replacement
        idle = [d for d in range(ctx.num_devices) if d not in busy and d not in ctx.absent] or [finished]
        return int(ctx.rng.choice(idle))

    def defer(self, edge: ServerPasses, ctx: RoundContext, waiting: Sequence[Activation]) -> bool:
        """Whether ``waiting`` (arrivals received and not yet served, in arrival order, the last just in) may wait
        to be served together with later arrivals. Only where serving them later, in one call, gives each the
        reply and the server state it would have had at once — nothing a waiting arrival is served with changes
        before the last of them is served — and serving them charges no server work on the clock (the runtime
        times a waiting arrival as it arrives). The runtime serves them anyway before their devices forward
        again or upload, at the end of a global iteration, and when they fill its pass budget. Default: never
        (each arrival served alone, at once)."""
        return False

    def on_model(self, ctx: RoundContext, upload: ModelUpload) -> list[ModelUpload] | None:
        """A device's client model arrived; return the uploads the fed server averages into the
        new global client model (|𝒟_k|-weighted; ends the round), or None to keep buffering."""
        return None


class BufferedAsyncStrategy(AsyncStrategy):
    """Asynchronous federated learning with a buffer (FedBuff's, K = C; GAS-11's): every device's whole model is
    buffered as it finishes, and every C of them the buffer is flushed to the fed server (:meth:`flush_buffer`, ending
    the global iteration). A joining device starts from the global model with fresh optimizer state. The buffer
    is the strategy's checkpointed state."""

    reset_client_optimizer = True

    def __init__(self, active: int = 0, local_steps: int = 20) -> None:
        super().__init__()
        self.active, self.local_steps = active, local_steps
        self.models: list[ModelUpload] = []

    def on_model(self, ctx: RoundContext, upload: ModelUpload) -> list[ModelUpload] | None:
        self.models.append(upload)
        if len(self.models) < self.active_count(ctx):
            return None
        flushed, self.models = self.models, []
        return self.flush_buffer(ctx, flushed)

    def flush_buffer(self, ctx: RoundContext, buffered: list[ModelUpload]) -> list[ModelUpload]:
        """The uploads the fed server averages (|𝒟_k|-weighted) when the buffer is full. Default: the buffer."""
        return buffered

    def state_dict(self) -> dict[str, Any]:
        return {"models": list(self.models)}

    def check_state(self, ctx: RoundContext) -> None:
        """The buffer restored must hold fewer than C model uploads (ValueError otherwise)."""
        if not all(isinstance(m, ModelUpload) for m in self.models) or len(self.models) >= self.active_count(ctx):
            raise ValueError(f"{self.name}'s buffer must hold fewer than C = {self.active_count(ctx)} model uploads")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.models = list(state["models"])
