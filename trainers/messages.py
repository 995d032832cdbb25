"""The messages the three roles exchange (docs/architecture.md "Messages").

A role never touches another role's tensors except through one of these. Every message carries
(device, round, step): ``step`` is the device's running mini-batch counter, and a cut gradient
whose tags differ from the activation it answers is a :class:`MessageMismatchError`.

===================  ==========================  ==============================================
message              from → to                   payload
===================  ==========================  ==============================================
:class:`Activation`  device → edge server        cut-layer activations a_i^t (eq. 2) + labels
:class:`CutGradient` edge server → device        ∂loss/∂a_i^t (eq. 6), or ``None`` = no update
:class:`ModelUpload` device/edge → fed server    block states (+ optimizer state) of device i
:class:`ModelDownload` fed server → device/edge  block states to load (aggregation, hand-off,
                                                 re-partition)
===================  ==========================  ==============================================

Sizes (``num_bytes``) are what a real link would carry: tensors at their element size, labels as
int64. The simulator and the torch.distributed runtime deliver the same objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


class MessageMismatchError(RuntimeError):
    """A message arrived for a different (device, round, step) than the one awaited."""


class NonFiniteError(RuntimeError):
    """NaN or inf in a model or a message; the message names round and device."""


def tensor_bytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def check_finite(t: torch.Tensor, what: str, round_index: int, device: int | str) -> None:
    """Raise :class:`NonFiniteError` naming ``what``, the round and the device if ``t`` has NaN/inf."""
    if not bool(torch.isfinite(t).all()):
        raise NonFiniteError(f"NaN or inf in {what} at round {round_index}, device {device}")


@dataclass
class Activation:
    """Device → edge server: a_i^t = φ(x_i^t; w_{c,i}) (eq. 2), detached, and the labels y_i^t."""

    device: int
    round: int
    step: int
    tensor: torch.Tensor
    labels: torch.Tensor

    @property
    def num_bytes(self) -> int:
        return tensor_bytes(self.tensor) + tensor_bytes(self.labels)

    @property
    def batch_size(self) -> int:
        return int(self.tensor.shape[0])


@dataclass
class CutGradient:
    """Edge server → device: the cut-layer gradient for the activation with the same tags.
    ``tensor is None`` tells the device to drop that step without an update (GAPSL's filtered
    devices, docs/algorithms.md GAPSL A.3.2)."""

    device: int
    round: int
    step: int
    tensor: torch.Tensor | None

    @property
    def num_bytes(self) -> int:
        return tensor_bytes(self.tensor)


@dataclass
class BlockState:
    """One chain block of one device's model: parameters/buffers (``state``) and, when the block
    moves between roles, the optimizer state of each parameter in ``parameters()`` order."""

    state: dict[str, torch.Tensor]
    optimizer: list[dict[str, Any]] | None = None

    @property
    def num_bytes(self) -> int:
        return sum(tensor_bytes(t) for t in self.state.values() if torch.is_tensor(t))


@dataclass
class ModelUpload:
    """Device or edge server → fed server: device ``device``'s blocks ``{block index: state}``.
    ``sender`` is ``"device"`` or ``"edge"``; ``weight`` the FedAvg weight (|D_i|)."""

    device: int
    round: int
    sender: str
    blocks: dict[int, BlockState]
    weight: float = 1.0

    @property
    def num_bytes(self) -> int:
        return sum(b.num_bytes for b in self.blocks.values())


@dataclass
class ModelDownload:
    """Fed server → device or edge server: blocks to load for device ``device``. With ``cut`` set,
    the receiver re-partitions to that cut (Algorithm 1): the device then holds exactly blocks
    0..cut−1; ``shared`` marks blocks meant for the edge server's shared instances."""

    device: int
    round: int
    receiver: str
    blocks: dict[int, BlockState]
    cut: int | None = None
    shared: set[int] = field(default_factory=set)

    @property
    def num_bytes(self) -> int:
        return sum(b.num_bytes for b in self.blocks.values())
