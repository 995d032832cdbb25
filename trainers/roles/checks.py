"""What a device may send, checked before its message is used (issue 67: a device that holds the run's secret but
lies, or is buggy).

A device sends these messages, which its receiver computes with:

* an :class:`~trainers.roles.messages.Activation` to the edge server: exactly the rows the edge server asked for
  (its :class:`~trainers.roles.protocol.Forward`), each of the cut's shape and the model's dtype, finite and at most
  :data:`MAX_MAGNITUDE` in absolute value, with one int64 label per row in 0..M−1;
* a :class:`~trainers.roles.messages.ModelUpload` to the fed server: the blocks it was asked for, each with exactly
  the template's entries, shapes and dtypes, finite. Its FedAvg weight is never the device's word: the fed server
  takes the one the edge server's :class:`~trainers.roles.protocol.Take` states (|D_i|, from the partition);
* a :class:`~trainers.roles.protocol.Blocks` reply to the edge server (its client blocks, for evaluation): as many
  blocks as its cut, each like an upload's (and a U-shaped split's head blocks after them);
* under a U-shaped split, a :class:`~trainers.roles.messages.HeadGradient` to the edge server: the gradient of the
  features it was sent, of their shape and dtype, and a scalar loss, finite and within :data:`MAX_MAGNITUDE`; its
  activations then carry no label.

A message that breaks a rule raises :class:`BadMessageError` naming the device and the field; the runtimes turn
it into the device rank's failure (docs/distributed.md "A device that lies"). In one process (the simulator) the
devices are the run's own code, and nothing is checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch

from adaptplan.fileio import is_int, show
from trainers.roles.messages import Activation, HeadForward, HeadGradient, MessageMismatchError, ModelUpload
from trainers.roles.protocol import Blocks

MAX_MAGNITUDE = 1e10
"""The largest |value| an activation may hold. A float32 reaches 3.4·10³⁸, and finite activations of 3·10³⁸ made
every later loss infinite (issue 67 E7); a trained network's cut-layer values are many orders below 10¹⁰."""

Schema = Mapping[int, Mapping[str, tuple[tuple[int, ...], str]]]
"""Per block index, per state entry: (shape, dtype name), e.g. ``{0: {"0.weight": ((16, 3, 3, 3), "float32")}}``."""


class BadMessageError(MessageMismatchError):
    """Device ``device`` (or, as text, the rank that sent a rank's own message, e.g. ``"rank 2"``) sent a message its
    role may not send; ``field`` names what is wrong."""

    def __init__(self, device: int | str, what: str, field: str, why: str) -> None:
        super().__init__(f"{device if isinstance(device, str) else f'device {device}'}'s {what}: {field}: {why}")
        self.device, self.field = device, field


@dataclass(frozen=True)
class ActivationRule:
    """What an activation at one cut holds: per-sample ``shape`` and ``dtype``; labels in 0..``num_classes``−1, or
    none at all where ``labels`` is False (a U-shaped split: they stay on the device)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    num_classes: int
    labels: bool = True


def check_activation(msg: Activation, device: int, rows: int, rule: ActivationRule) -> None:
    """Raise :class:`BadMessageError` unless ``msg`` is device ``device``'s activation of ``rows`` rows by ``rule``."""
    def bad(field: str, why: str) -> BadMessageError:
        return BadMessageError(device, "activation", field, why)

    if msg.device != device:
        raise bad("device", f"is {msg.device}, but this is device {device}'s reply")
    x, y = msg.tensor, msg.labels
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise bad("tensor", "the activation and its labels must be tensors")
    if x.dtype != rule.dtype:
        raise bad("tensor.dtype", f"is {x.dtype}, expected {rule.dtype}")
    expected = (rows, *rule.shape)
    if tuple(x.shape) != expected:
        raise bad("tensor.shape", f"is {list(x.shape)}, expected {list(expected)} ({rows} samples asked for)")
    if not rule.labels:
        if y.dtype != torch.int64 or tuple(y.shape) != (0,):
            raise bad("labels", f"are {y.dtype}{list(y.shape)}, expected none (torch.int64[0]): a U-shaped split's "
                                "device keeps its labels")
    elif y.dtype != torch.int64 or tuple(y.shape) != (rows,):
        raise bad("labels", f"are {y.dtype}{list(y.shape)}, expected torch.int64[{rows}] (one per row)")
    elif rows and not 0 <= int(y.min()) <= int(y.max()) < rule.num_classes:
        raise bad("labels", f"span {int(y.min())}..{int(y.max())}, outside 0..{rule.num_classes - 1}")
    _check_magnitude(bad, "tensor", x)


def _check_magnitude(bad: Callable[[str, str], BadMessageError], field: str, t: torch.Tensor) -> None:
    """``t``'s values finite and at most :data:`MAX_MAGNITUDE` in absolute value (``bad(field, why)`` otherwise)."""
    if t.numel():
        largest = float(t.detach().abs().amax())
        if not largest <= MAX_MAGNITUDE:          # NaN fails this too
            raise bad(field, f"holds {largest:.3g}: NaN, infinite or above {MAX_MAGNITUDE:.0e} in absolute value")


def check_step(msg: Activation, device: int, last: int | None) -> int:
    """``msg.step``, unless it is not the step after device ``device``'s ``last`` (a device counts its steps by one;
    None: its first activation since it started) → :class:`BadMessageError`."""
    if not is_int(msg.step) or msg.step < 1 or (last is not None and msg.step != last + 1):
        raise BadMessageError(device, "activation", "step", f"is {show(msg.step)}, but its last was {last}: a device "
                              "counts its steps by one" if last is not None else f"is {show(msg.step)}, not a step number")
    return int(msg.step)


def schema_of(states: Sequence[Mapping[str, torch.Tensor]]) -> dict[int, dict[str, tuple[tuple[int, ...], str]]]:
    """The :data:`Schema` of blocks 0.. whose state dicts are ``states`` (the template's)."""
    return {j: {name: (tuple(int(s) for s in t.shape), str(t.dtype).removeprefix("torch.")) for name, t in state.items()}
            for j, state in enumerate(states)}


def check_upload(msg: ModelUpload, device: int, blocks: Sequence[int], schema: Schema) -> None:
    """Raise :class:`BadMessageError` unless ``msg`` is device ``device``'s upload of ``blocks`` by ``schema``."""
    def bad(field: str, why: str) -> BadMessageError:
        return BadMessageError(device, "model upload", field, why)

    if msg.device != device:
        raise bad("device", f"is {msg.device}, but this is device {device}'s upload")
    if msg.sender != "device":               # an edge server's upload is booked to the edge server's links
        raise bad("sender", f"is {msg.sender!r}, but a device sends as 'device'")
    if set(msg.blocks) != set(blocks):
        extra = sorted(set(msg.blocks) - set(blocks))
        raise bad("blocks", f"holds block {extra[0]}, which it was not asked for ({sorted(blocks)})" if extra else
              f"holds blocks {sorted(msg.blocks)}, but it was asked for {sorted(blocks)}")
    for j, block in msg.blocks.items():
        _check_state(bad, f"blocks[{j}]", block.state, schema.get(j, {}))


def check_blocks(msg: object, device: int, indices: Sequence[int], schema: Schema) -> None:
    """Raise :class:`BadMessageError` unless ``msg`` is device ``device``'s :class:`~trainers.roles.protocol.Blocks`
    reply (to the edge server's GetBlocks, for evaluation): the blocks it holds, ``indices`` in order (its first
    blocks to its cut, then a U-shaped split's head), each with exactly the template's entries, shapes and dtypes,
    finite."""
    def bad(field: str, why: str) -> BadMessageError:
        return BadMessageError(device, "blocks", field, why)

    if not isinstance(msg, Blocks):
        raise bad("type", f"is {type(msg).__name__}, expected Blocks (the reply to GetBlocks)")
    if msg.device != device:
        raise bad("device", f"is {msg.device}, but this is device {device}'s reply")
    if len(msg.states) != len(indices):
        raise bad("states", f"holds {len(msg.states)} blocks, expected {len(indices)}")
    for j, state in zip(indices, msg.states):
        _check_state(bad, f"states[{j}]", state, schema.get(j, {}))


def check_head_gradient(msg: object, device: int, asked: HeadForward) -> None:
    """Raise :class:`BadMessageError` unless ``msg`` is device ``device``'s answer to the features ``asked`` (a U-shaped
    split, :mod:`trainers.roles.head`): its tags, a gradient of the features' shape and dtype within
    :data:`MAX_MAGNITUDE`, and a finite scalar loss of that dtype."""
    def bad(field: str, why: str) -> BadMessageError:
        return BadMessageError(device, "head gradient", field, why)

    if not isinstance(msg, HeadGradient):
        raise bad("type", f"is {type(msg).__name__}, expected HeadGradient")
    if (msg.device, msg.round, msg.step) != (device, asked.round, asked.step):
        raise bad("tags", f"are (device {show(msg.device)}, round {show(msg.round)}, step {show(msg.step)}), expected "
                          f"(device {device}, round {asked.round}, step {asked.step})")
    g, loss = msg.tensor, msg.loss
    if not isinstance(g, torch.Tensor) or g.dtype != asked.tensor.dtype or g.shape != asked.tensor.shape:
        got = f"{g.dtype}{list(g.shape)}" if isinstance(g, torch.Tensor) else type(g).__name__
        raise bad("tensor", f"is {got}, expected {asked.tensor.dtype}{list(asked.tensor.shape)}")
    if not isinstance(loss, torch.Tensor) or loss.dtype != g.dtype or loss.dim() != 0:
        raise bad("loss", f"must be a scalar {g.dtype} tensor")
    _check_magnitude(bad, "tensor", g)
    _check_magnitude(bad, "loss", loss)


def _check_state(bad: Callable[[str, str], BadMessageError], where: str, state: Mapping[str, object],
                 expected: Mapping[str, tuple[tuple[int, ...], str]]) -> None:
    """One block's state against its template ``expected`` (:data:`Schema`'s entry): the same entries, each a tensor of
    the template's shape and dtype, finite. Not bounded in magnitude: an honest run's weights grow without bound as it
    diverges, and are stopped as a divergence when they overflow (a device's finite 10³⁸ averaged in ends the same way;
    ``--aggregation median`` or ``trimmed`` keeps one device's values out of the average, docs/distributed.md)."""
    if set(state) != set(expected):
        missing = sorted(set(expected) - set(state)) or sorted(set(state) - set(expected))
        raise bad(where, f"holds entries {sorted(state)[:5]}, expected {sorted(expected)[:5]} (differs at {missing[0]!r})")
    for name, tensor in state.items():
        shape, dtype = expected[name]
        if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != shape \
                or str(tensor.dtype).removeprefix("torch.") != dtype:
            got = f"{tensor.dtype}{list(tensor.shape)}" if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise bad(f"{where}.{name}", f"is {got}, expected {dtype}{list(shape)}")
        if tensor.is_floating_point() and tensor.numel() and not bool(torch.isfinite(tensor).all()):
            raise bad(f"{where}.{name}", "holds NaN or infinite values")
