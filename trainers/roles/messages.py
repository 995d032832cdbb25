"""The messages the three roles exchange (docs/architecture.md "Messages").

A role never touches another role's tensors except through one of these. Every message carries
(device, round, step): ``step`` is the device's running mini-batch counter, and a cut gradient
whose tags differ from the activation it answers is a :class:`MessageMismatchError`.

===================  ==========================  ==============================================
message              from → to                   payload
===================  ==========================  ==============================================
:class:`Activation`  device → edge server        cut-layer activations a_i^t (eq. 2) + labels
:class:`CutGradient` edge server → device        ∂loss/∂a_i^t (eq. 6), or ``None`` = no update
:class:`HeadForward` edge server → device        a U-shaped split's features h_k for the device's head
:class:`HeadGradient` device → edge server       its loss F_i and ∂F_i/∂h_k (the labels stay on the device)
:class:`ModelUpload` device/edge → fed server    block states (+ optimizer state) of device i
:class:`ModelDownload` fed server → device/edge  block states to load (aggregation, hand-off,
                                                 re-partition)
===================  ==========================  ==============================================

Sizes (``num_bytes``) are what a real link would carry: tensors at their element size, labels as
int64. The simulator and the torch.distributed runtime deliver the same objects.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch


class MessageMismatchError(RuntimeError):
    """A message arrived for a different (device, round, step) than the one awaited."""


class DeviceAbsent(RuntimeError):
    """Device ``device`` was lost while its models were read (a real runtime, partial participation)."""

    def __init__(self, device: int) -> None:
        super().__init__(f"device {device} is absent")
        self.device = device


class DevicesLost(RuntimeError):
    """Every device that could take part is absent (lost in a real runtime): the run cannot go on."""


class NonFiniteError(RuntimeError):
    """NaN or inf in a model or a message; the message names round and device."""


def tensor_bytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


_DEFERRED: ContextVar["list[tuple[torch.Tensor, Callable[[], NonFiniteError | None]]] | None"] = \
    ContextVar("adaptplan_deferred_finite_checks", default=None)


def _nonfinite(what: str, round_index: int, device: int | str) -> NonFiniteError:
    return NonFiniteError(f"NaN or inf in {what} at round {round_index}, device {device}")


def check_finite(t: torch.Tensor, what: str, round_index: int, device: int | str) -> None:
    """Raise :class:`NonFiniteError` naming ``what``, the round and the device if ``t`` has NaN/inf
    (inside :func:`deferred_finite_checks`: when that scope ends)."""
    pending = _DEFERRED.get()
    if pending is not None:
        pending.append((torch.isfinite(t).all(), lambda: _nonfinite(what, round_index, device)))
        return
    if not _finite_sum(t) and not bool(torch.isfinite(t).all()):
        raise _nonfinite(what, round_index, device)


def _finite_sum(t: torch.Tensor) -> bool:
    """True if the sum of ``t`` is finite, which proves every entry finite (a NaN or an infinity makes
    any sum NaN or infinite); a sum that overflowed proves nothing, so False asks for the exact test.
    On a CPU about 25× faster than ``isfinite(t).all()`` (one pass, no mask)."""
    return bool(torch.isfinite(t.sum()))


def check_all_finite(items: Sequence[tuple[torch.Tensor, str, int | str]], round_index: int) -> None:
    """:func:`check_finite` of every ``(tensor, what, device)`` with one reduction over all of them
    (the largest |x| of each tensor in one multi-tensor kernel); on a failure the first offending
    item is named, as a check of each in turn would. A tensor that several items hold (a download
    shared by every device) is reduced once. Immediately: one sum per tensor (:func:`_finite_sum`), the
    exact test only when a sum is not finite; deferred: the ∞-norms in one multi-tensor kernel."""
    tensors = list({(t.data_ptr(), t.shape, t.stride(), t.dtype, t.device): t.detach()
                    for t, _, _ in items if t.numel()}.values())
    if not tensors:
        return

    def first() -> NonFiniteError | None:
        for t, what, device in items:
            if not bool(torch.isfinite(t).all()):
                return _nonfinite(what, round_index, device)
        return None

    pending = _DEFERRED.get()
    if pending is None:
        if not bool(torch.isfinite(torch.stack([t.sum().float() for t in tensors])).all()):
            failure = first()
            if failure is not None:
                raise failure
        return
    try:
        largest = list(torch._foreach_norm(tensors, float("inf")))
    except (RuntimeError, TypeError, NotImplementedError):     # an older torch without the ∞-norm there
        largest = [t.abs().amax() for t in tensors]
    pending.append((torch.isfinite(torch.stack([m.float() for m in largest])).all(), first))


def _first_failure(pending: list[tuple[torch.Tensor, Callable[[], NonFiniteError | None]]]) -> NonFiniteError | None:
    if not pending:
        return None
    where = pending[0][0].device
    flags = torch.stack([flag.to(where) for flag, _ in pending])
    if bool(flags.all()):                                            # the one host synchronisation
        return None
    return pending[int((~flags).nonzero()[0, 0])][1]() or NonFiniteError("NaN or inf (found by a deferred check)")


@contextmanager
def deferred_finite_checks(enabled: bool = True) -> Iterator[None]:
    """Within this scope :func:`check_finite` only queues its test on the tensors' device; the scope's
    end reads all of them at once (one host synchronisation instead of one per message) and raises
    the :class:`NonFiniteError` of the first failed check, with the same message an immediate check
    gives. An exception raised inside the scope gives way to that NonFiniteError when a queued check
    failed (a NaN that went on to break something else is reported as the NaN). Off (``enabled``
    False): checks are immediate; nested scopes join the outer one."""
    if not enabled or _DEFERRED.get() is not None:
        yield
        return
    pending: list = []
    token = _DEFERRED.set(pending)
    try:
        yield
    except BaseException as exc:
        _DEFERRED.reset(token)
        error = _first_failure(pending) if isinstance(exc, Exception) else None
        if error is not None:
            raise error from exc
        raise
    _DEFERRED.reset(token)
    error = _first_failure(pending)
    if error is not None:
        raise error


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
class HeadForward:
    """Edge server → device (a U-shaped split, :mod:`trainers.roles.head`): the server blocks' output h_k for the
    activation with the same tags, the input of the device's head."""

    device: int
    round: int
    step: int
    tensor: torch.Tensor

    @property
    def num_bytes(self) -> int:
        return tensor_bytes(self.tensor)


@dataclass
class HeadGradient:
    """Device → edge server: F_i, the mean cross-entropy of the head's output on the device's labels (a 0-d tensor),
    and ∂F_i/∂h_k for the :class:`HeadForward` with the same tags."""

    device: int
    round: int
    step: int
    loss: torch.Tensor
    tensor: torch.Tensor

    @property
    def num_bytes(self) -> int:
        return tensor_bytes(self.tensor) + tensor_bytes(self.loss)


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
    0..cut−1; ``shared`` marks blocks meant for the edge server's shared instances; ``fresh_optimizer``
    tells a device to restart the optimizer state (momentum, Adam moments) of the blocks it loads."""

    device: int
    round: int
    receiver: str
    blocks: dict[int, BlockState]
    cut: int | None = None
    shared: set[int] = field(default_factory=set)
    fresh_optimizer: bool = False     # the device drops its optimizer state of these blocks (a new participation)

    @property
    def num_bytes(self) -> int:
        return sum(b.num_bytes for b in self.blocks.values())
