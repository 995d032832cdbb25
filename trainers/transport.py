"""Messages and the transport interface between devices and the edge server.

Every message carries (device, round, step); ``step`` is the device's running mini-batch counter.
The simulator uses :class:`LocalTransport` (in-process queues); a torch.distributed runner will
implement the same :class:`Transport` interface (send/recv of the same message dataclasses).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch


class MessageMismatchError(RuntimeError):
    """A gradient arrived for a different (device, round, step) than the pending activation."""


class NonFiniteError(RuntimeError):
    """NaN or inf in a model or a message; the message names round and device."""


@dataclass
class ActivationMsg:
    """Device → edge server: cut-layer activations a_i^t (eq. 2) and labels y_i^t."""

    device: int
    round: int
    step: int
    tensor: torch.Tensor
    labels: torch.Tensor

    @property
    def num_bytes(self) -> int:
        return tensor_bytes(self.tensor) + tensor_bytes(self.labels)


@dataclass
class GradientMsg:
    """Edge server → device: ∂F_i/∂a_i^t, the cut-layer gradient used in eq. (6)."""

    device: int
    round: int
    step: int
    tensor: torch.Tensor

    @property
    def num_bytes(self) -> int:
        return tensor_bytes(self.tensor)


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def check_finite(t: torch.Tensor, what: str, round_index: int, device: int | str) -> None:
    """Raise :class:`NonFiniteError` naming ``what``, the round and the device if ``t`` has NaN/inf."""
    if not bool(torch.isfinite(t).all()):
        raise NonFiniteError(f"NaN or inf in {what} at round {round_index}, device {device}")


class Transport:
    """Interface: devices ``send_activation``; the server ``recv_activations``; the server
    ``send_gradient``; device i ``recv_gradient(i)``. Byte counters ``bytes_up``/``bytes_down`` (bytes,
    device→server and server→device) are reset by the engine every round."""

    bytes_up: int = 0
    bytes_down: int = 0

    def send_activation(self, msg: ActivationMsg) -> None:
        raise NotImplementedError

    def recv_activations(self) -> list[ActivationMsg]:
        raise NotImplementedError

    def send_gradient(self, msg: GradientMsg) -> None:
        raise NotImplementedError

    def recv_gradient(self, device: int) -> GradientMsg:
        raise NotImplementedError

    def reset_counters(self) -> None:
        self.bytes_up = self.bytes_down = 0


class LocalTransport(Transport):
    """In-process transport: FIFO queues; the tensors are detached on send (no autograd link
    crosses the device/server boundary)."""

    def __init__(self) -> None:
        self._up: deque[ActivationMsg] = deque()
        self._down: dict[int, deque[GradientMsg]] = {}
        self.bytes_up = self.bytes_down = 0

    def send_activation(self, msg: ActivationMsg) -> None:
        msg.tensor = msg.tensor.detach()
        self.bytes_up += msg.num_bytes
        self._up.append(msg)

    def recv_activations(self) -> list[ActivationMsg]:
        msgs = list(self._up)
        self._up.clear()
        return msgs

    def send_gradient(self, msg: GradientMsg) -> None:
        msg.tensor = msg.tensor.detach()
        self.bytes_down += msg.num_bytes
        self._down.setdefault(msg.device, deque()).append(msg)

    def recv_gradient(self, device: int) -> GradientMsg:
        queue = self._down.get(device)
        if not queue:
            raise MessageMismatchError(f"device {device} expected a gradient but none was sent")
        return queue.popleft()
