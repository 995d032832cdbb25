"""A U-shaped split in the simulation runtime (issue 71 item 2; docs/privacy.md "A U-shaped split"): the device
keeps the model's last K = ``engine.defence.head`` blocks (its head, :mod:`trainers.roles.head`) and its labels, the
edge server runs the blocks between the two parts. Where blocks live — a device's model is its client blocks
0..ℓ_i−1 and its head k..L−1, k = L − K — is answered here for the engine's parts (model messages, evaluation
views, hand-offs); the exchange with the heads inside a server pass is :func:`head_exchange`. A strategy sees
none of it: its passes compute the device's loss through :meth:`trainers.roles.passes.ServerPass.loss`.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from adaptplan.defence_cost import head_cuts
from adaptplan.errors import InputError
from trainers.algorithms import REGISTRY
from trainers.engine.seams import EngineParts
from trainers.roles.core import has_batch_coupling
from trainers.roles.messages import Activation, HeadForward, HeadGradient, MessageMismatchError, check_finite
from trainers.roles.passes import HeadLoss


def head_start(engine: EngineParts) -> int:
    """k = L − K, the first block of the devices' heads (L without a U-shaped split)."""
    return engine.num_blocks - engine.defence.head


def server_chain(engine: EngineParts) -> nn.Sequential:
    """The blocks the edge server may hold: all of the engine's chain, or under a U-shaped split the ones before the
    head."""
    return engine.template[:head_start(engine)] if engine.defence.head else engine.template


def on_device(engine: EngineParts, device: int, block: int) -> bool:
    """True if ``device`` holds block ``block`` (0-based): below its cut, or in its head."""
    return block < engine.cuts[device] or block >= head_start(engine)


def device_blocks(engine: EngineParts, device: int, blocks: Sequence[int]) -> list[int]:
    """The entries of ``blocks`` that ``device`` holds, in their order."""
    return [j for j in blocks if on_device(engine, device, j)]


def with_head(engine: EngineParts, blocks: Sequence[int]) -> list[int]:
    """``blocks`` and the heads' blocks (a device model's average or hand-off moves the head with the client blocks)."""
    return list(dict.fromkeys([*blocks, *range(head_start(engine), engine.num_blocks)]))


def position(engine: EngineParts, device: int, block: int) -> int:
    """Where block ``block`` of ``device`` sits in :meth:`trainers.engine.network.Network.device_blocks`' list (the
    client blocks, then the head's)."""
    start = head_start(engine)
    return block if block < start else engine.cuts[device] + block - start


def check_u_shaped(engine: EngineParts, cuts: Sequence[int]) -> None:
    """InputError naming ``u_shaped`` unless the algorithm runs a U-shaped split and each of ``cuts`` leaves the edge
    server a block before the head (:func:`adaptplan.defence_cost.head_cuts`). The algorithms that run one carry the
    registry's trait ``labels_on_device``: their server step is eqs. (3)–(5) on each device's mean cross-entropy
    (:class:`trainers.api.ParallelStep`), which the device can compute alone. The others' servers use the labels
    themselves (SCALA's and LLA-SFL's adjusted logits, GAS's and CycleSL's feature resampling, GAPSL's and SGLR's
    gradient arithmetic over the devices, FedLC's calibration) or train no split (FedAvg...). A clip on the head's
    gradients (``head_clip``) needs a head without BatchNorm: each sample's row is its own gradient only where no
    layer of the head mixes the samples of a batch."""
    head = engine.defence.head
    if not head:
        return
    if not engine.strategy.labels_on_device:
        runs = ", ".join(a.name for a in REGISTRY.values() if a.labels_on_device)
        raise InputError(f"{engine.strategy.name} cannot keep its labels on the devices: its server uses them (a "
                         f"U-shaped split runs {runs})", field="u_shaped")
    allowed = head_cuts(engine.num_blocks, head)
    if not allowed:
        raise InputError(f"a head of {_blocks(head)} leaves the edge server nothing of the {engine.num_blocks} blocks",
                         field="u_shaped")
    if max(cuts) > allowed[-1]:
        raise InputError(f"a head of {_blocks(head)} needs every cut in 1..{allowed[-1]} (the edge server holds a "
                         f"block before it), got {max(cuts)}", field="u_shaped")
    if engine.defence.head_clip > 0 and has_batch_coupling(engine.template[head_start(engine):]):
        raise InputError(f"the head (the model's last {_blocks(head)}) holds BatchNorm, which mixes a batch's samples: "
                         "its gradient has no row per sample to clip (keep a head without it, or drop --head-clip)",
                         field="head_clip")


def _blocks(count: int) -> str:
    return f"{count} block{'s' if count != 1 else ''}"


def head_exchange(engine: EngineParts) -> HeadLoss:
    """The edge server's exchange with a device's head in a pass: it sends h_k (:class:`HeadForward`) and takes
    (F_i, ∂F_i/∂h_k) back (:class:`HeadGradient`, checked: its tags, a finite scalar loss, a gradient of h_k's shape);
    both messages are counted in the round's bytes (their seconds are the clock's, eqs. (17), (20) as
    :func:`adaptplan.defence_cost.with_head_on_device` charges them)."""

    def exchange(arrival: Activation, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        sent = HeadForward(arrival.device, arrival.round, arrival.step, features.detach())
        engine.net.send(arrival.device, sent)
        (reply,) = engine.net.receive([arrival.device])
        if not isinstance(reply, HeadGradient) or (reply.device, reply.round, reply.step) != \
                (arrival.device, arrival.round, arrival.step):
            raise MessageMismatchError(f"device {arrival.device} answered its features (round {arrival.round}, step "
                                       f"{arrival.step}) with a {type(reply).__name__}")
        if reply.loss.dim() != 0 or reply.tensor.shape != features.shape:
            raise MessageMismatchError(f"device {arrival.device}'s head answered a loss of shape "
                                       f"{tuple(reply.loss.shape)} and a gradient of {tuple(reply.tensor.shape)} for "
                                       f"features of {tuple(features.shape)}")
        check_finite(reply.tensor, "head gradient message", arrival.round, arrival.device)
        check_finite(reply.loss, "head loss message", arrival.round, arrival.device)
        engine.timeline.tally.down += sent.num_bytes
        engine.timeline.tally.up += reply.num_bytes
        return reply.loss, reply.tensor

    return exchange
