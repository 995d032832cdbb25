"""The split-training engine: the mechanics every split algorithm shares (DESIGN.md "The engine
and the algorithms"). A :class:`~trainers.strategies.base.Strategy` decides; the engine does.

Model layout. The model is a chain of L blocks (``nn.Sequential``). Device i's cut ℓ_i (1-based)
puts blocks 1..ℓ_i on the device (w_{c,i}) and blocks ℓ_i+1..L on the edge server. Every block j
of device i's full model w_i lives in exactly one *instance*, keyed by ``(owner, j)`` where
``owner = (part, who)``: part ∈ {"client", "server"}, who = device index or ``None`` for an
instance shared by all devices. The strategy chooses the owners (``client_owner``,
``server_owner``), so copies exist only where an algorithm needs them:

* AdaptSFL: client blocks per device (w_{c,i}); server blocks ℓ_i+1..L_c per device (w_{n,i},
  the non-common part); blocks L_c+1..L shared (w_s, the common part). spec §2.1.
* SFL-V1: client and server blocks per device. PSL / SFL-V2: server blocks shared. SL: all shared.

Optimizers are one ``torch.optim.SGD`` per owner (per (device, part)), built once from the config
and kept across batches and rounds (their state is checkpointed and carried across re-partitions).

Exchange. ``client_forward`` runs the device's blocks, keeps the autograd graph, and emits an
:class:`ActivationMsg` (device, round, step). The server side receives detached tensors, sets
``requires_grad``, runs its blocks, forms the loss and returns :class:`GradientMsg` objects;
``client_backward`` checks that a gradient matches the pending (device, round, step) — a mismatch
raises :class:`MessageMismatchError` — then back-propagates it and steps the client optimizer.
Devices whose streams meet at a shared server instance are concatenated into one batch
(mathematically identical: the models have no batch-coupled layers such as BatchNorm; if one is
present, batching is switched off). Client passes run per device: devices that share a cut hold
different weights between aggregations, and batching them with ``torch.func.vmap`` over stacked
weights was measured 1.5–3× slower on CPU (grouped convolutions; ``benchmarks/client_vmap.py``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Hashable, Iterable, Sequence

import numpy as np
import torch
from torch import nn

from adaptplan.errors import InputError
from adaptplan.plan import check_cut_vector
from trainers.partition import DeviceSampler
from trainers.transport import (
    ActivationMsg,
    GradientMsg,
    LocalTransport,
    MessageMismatchError,
    Transport,
    check_finite,
)

if TYPE_CHECKING:  # pragma: no cover
    from trainers.strategies.base import Strategy

Owner = tuple[str, Hashable]          # ("client" | "server", device index or None = shared)
Key = tuple[Owner, int]               # (owner, 0-based block index)


@dataclass
class DeviceData:
    """Training data and its partition: ``parts[i]`` are device i's sample indices into x_train."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    parts: list[np.ndarray]


@dataclass
class Pending:
    """A device's forward awaiting its gradient: (round, step) and the live cut tensor."""

    round: int
    step: int
    activation: torch.Tensor


@dataclass
class RoundStats:
    """What one round did: mean training loss over participating devices, bytes (device→server
    ``bytes_up``, server→device ``bytes_down``, edge↔fed ``bytes_server``), and whether client-side
    model averaging (eq. 7) happened."""

    loss: float
    bytes_up: int
    bytes_down: int
    bytes_server: int
    aggregated: bool
    participants: list[int] = field(default_factory=list)


def _has_batch_coupling(module: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules())


def _param_bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


class SplitEngine:
    """Runs split training of ``chain`` over N devices under ``strategy``.

    Args:
        chain: the model as L blocks (``profilers.build_chain(...).blocks`` or an ``nn.Sequential``).
        cuts: ℓ_i per device, 1-based, 1 ≤ ℓ_i ≤ L.
        strategy: the algorithm (hooks, see :mod:`trainers.strategies.base`).
        data: the partitioned data.
        optimizer_kwargs: ``torch.optim.SGD`` arguments (``TrainConfig.optimizer_kwargs()``).
        batch_size: b, samples per device per round.
        seed: seeds the per-device samplers (device i uses ``[seed, i]``).
        interval: I, rounds between client-side model averagings (eq. 7).
        transport: message transport (default :class:`LocalTransport`).
        batch_devices: concatenate devices' tensors at shared server blocks.
        loss_fn: per-device loss, mean over the device's mini-batch (F_i of spec §1).
    """

    def __init__(self, chain: nn.Sequential, cuts: Sequence[int], strategy: "Strategy", data: DeviceData,
                 optimizer_kwargs: dict[str, float], batch_size: int, seed: int = 0, interval: int = 1,
                 transport: Transport | None = None, batch_devices: bool = True,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> None:
        self.template = chain
        self.num_blocks = len(chain)
        self.num_devices = len(data.parts)
        self.strategy = strategy
        self.data = data
        self.optimizer_kwargs = dict(optimizer_kwargs)
        self.batch_size = batch_size
        self.interval = int(interval)
        self.transport = transport or LocalTransport()
        self.batch_devices = batch_devices and not _has_batch_coupling(chain)
        self.loss_fn = loss_fn or nn.functional.cross_entropy
        self.cuts = self._check_cuts(cuts)
        self.samplers = [DeviceSampler(p, batch_size, [seed, i]) for i, p in enumerate(data.parts)]
        self.steps = [0] * self.num_devices
        self.pending: dict[int, Pending] = {}
        self.round_losses: dict[int, float] = {}
        self.rounds_since_aggregation = 0
        self.bytes_server = 0
        self.instances: dict[Key, nn.Module] = {}
        self.optimizers: dict[Owner, torch.optim.Optimizer] = {}
        strategy.validate(self)
        for key in self._layout():
            self.instances[key] = copy.deepcopy(chain[key[1]])
        self._build_optimizers({})
        strategy.setup(self)

    # ---- layout -----------------------------------------------------------------------------
    def _check_cuts(self, cuts: Sequence[int]) -> list[int]:
        return check_cut_vector(cuts, self.num_devices, self.num_blocks).tolist()

    @property
    def deepest_cut(self) -> int:
        """L_c = max_i ℓ_i (spec §1)."""
        return max(self.cuts)

    def owner(self, device: int, block: int, cuts: Sequence[int] | None = None) -> Owner:
        """The owner of block ``block`` (0-based) of device ``device``'s model under ``cuts``."""
        cuts = self.cuts if cuts is None else cuts
        if block < cuts[device]:
            return ("client", self.strategy.client_owner(device))
        return ("server", self.strategy.server_owner(device, block, max(cuts)))

    def key(self, device: int, block: int) -> Key:
        return (self.owner(device, block), block)

    def block(self, device: int, block: int) -> nn.Module:
        """The live module of block ``block`` (0-based) of device ``device``."""
        return self.instances[self.key(device, block)]

    def _layout(self, cuts: Sequence[int] | None = None) -> list[Key]:
        keys: dict[Key, None] = {}
        for i in range(self.num_devices):
            for j in range(self.num_blocks):
                keys[(self.owner(i, j, cuts), j)] = None
        return list(keys)

    def device_model(self, device: int) -> nn.Sequential:
        """Device i's full model w_i = [w_{c,i}; w_{s,i}] as live modules (no copy)."""
        return nn.Sequential(*[self.block(device, j) for j in range(self.num_blocks)])

    def _build_optimizers(self, old_state: dict[nn.Parameter, dict[str, Any]]) -> None:
        by_owner: dict[Owner, list[nn.Parameter]] = {}
        for (owner, _), module in sorted(self.instances.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
            by_owner.setdefault(owner, []).extend(module.parameters())
        self.optimizers = {}
        for owner, params in by_owner.items():
            if not params:
                continue
            opt = torch.optim.SGD(params, **self.optimizer_kwargs)
            for p in params:
                if p in old_state:
                    opt.state[p] = old_state[p]
            self.optimizers[owner] = opt

    # ---- data -------------------------------------------------------------------------------
    def draw_batch(self, device: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Device i's next mini-batch ℬ_i^t (b samples, spec §2.1)."""
        idx = torch.from_numpy(self.samplers[device].next())
        return self.data.x_train[idx], self.data.y_train[idx]

    # ---- per-batch primitives ---------------------------------------------------------------
    def client_forward(self, device: int, round_index: int) -> ActivationMsg:
        """Eq. (2): a_i^t = φ(x_i^t; w_{c,i}^{t−1}); keeps the graph for ``client_backward``."""
        if device in self.pending:
            raise MessageMismatchError(f"device {device} starts round {round_index} with an unanswered activation "
                                       f"(round {self.pending[device].round}, step {self.pending[device].step})")
        x, y = self.draw_batch(device)
        h = x
        for j in range(self.cuts[device]):
            h = self.block(device, j)(h)
        check_finite(h, "client activation", round_index, device)
        self.steps[device] += 1
        step = self.steps[device]
        self.pending[device] = Pending(round_index, step, h)
        return ActivationMsg(device, round_index, step, h.detach(), y)

    def client_backward(self, device: int, msg: GradientMsg) -> None:
        """Eq. (6): back-propagate the received cut gradient and step w_{c,i}. The gradient must
        match the pending (device, round, step) and the activation's shape."""
        pending = self.pending.get(device)
        if msg.device != device or pending is None or (msg.round, msg.step) != (pending.round, pending.step):
            expected = "nothing" if pending is None else f"(device {device}, round {pending.round}, step {pending.step})"
            raise MessageMismatchError(f"gradient for (device {msg.device}, round {msg.round}, step {msg.step}) "
                                       f"delivered to device {device}, which expects {expected}")
        if msg.tensor.shape != pending.activation.shape:
            raise MessageMismatchError(f"gradient shape {tuple(msg.tensor.shape)} ≠ activation shape "
                                       f"{tuple(pending.activation.shape)} (device {device}, round {msg.round})")
        check_finite(msg.tensor, "gradient message", msg.round, device)
        del self.pending[device]
        if pending.activation.requires_grad:
            pending.activation.backward(msg.tensor)
        self.step_owners([("client", self.strategy.client_owner(device))])

    def server_forward_backward(self, msgs: Sequence[ActivationMsg]) -> list[GradientMsg]:
        """Eq. (3) and the server's backward for a set of devices' messages.

        Runs every device's server blocks (devices meeting at a shared instance are concatenated),
        forms Σ_i F_i (each F_i the mean loss over device i's batch), and back-propagates once. So
        per-device instances receive g_{n,i} (eq. 5's gradient), shared instances Σ_i g_{s,i}
        (callers scale it, e.g. by 1/N for eq. 4), and each returned gradient is exactly
        ∂F_i/∂a_i. Losses are stored in ``round_losses``. Does not step any optimizer.
        """
        if not msgs:
            return []
        inputs = {m.device: m.tensor.detach().requires_grad_(True) for m in msgs}
        labels = {m.device: m.labels for m in msgs}
        round_index = msgs[0].round
        if len(inputs) != len(msgs):
            raise MessageMismatchError(f"two activation messages from one device in round {round_index}")
        outputs = self._server_forward(inputs)
        total = None
        for m in msgs:
            loss = self.loss_fn(outputs[m.device], labels[m.device])
            check_finite(loss.detach(), "loss", round_index, m.device)
            self.round_losses[m.device] = float(loss.detach())
            total = loss if total is None else total + loss
        total.backward()
        grads = []
        for m in msgs:
            g = inputs[m.device].grad
            if g is None:
                g = torch.zeros_like(inputs[m.device])
            grads.append(GradientMsg(m.device, m.round, m.step, g))
        return grads

    def _server_forward(self, inputs: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        """Run blocks ℓ_i+1..L for every device in ``inputs``; streams of devices that use the same
        instance of a block are concatenated (when ``batch_devices``)."""
        streams: list[tuple[list[int], torch.Tensor, list[int]]] = []
        start = min(self.cuts[d] for d in inputs)
        for j in range(start, self.num_blocks):
            for d, a in inputs.items():
                if self.cuts[d] == j:
                    streams.append(([d], a, [a.shape[0]]))
            buckets: dict[Key, list[tuple[list[int], torch.Tensor, list[int]]]] = {}
            for devices, tensor, sizes in streams:
                keys = {self.key(d, j) for d in devices}
                if len(keys) == 1:
                    buckets.setdefault(keys.pop(), []).append((devices, tensor, sizes))
                else:
                    for d, piece, n in zip(devices, tensor.split(sizes), sizes):
                        buckets.setdefault(self.key(d, j), []).append(([d], piece, [n]))
            streams = []
            for key, group in buckets.items():
                module = self.instances[key]
                if self.batch_devices and len(group) > 1:
                    devices = [d for g in group for d in g[0]]
                    sizes = [n for g in group for n in g[2]]
                    streams.append((devices, module(torch.cat([g[1] for g in group])), sizes))
                else:
                    streams.extend((g[0], module(g[1]), g[2]) for g in group)
        outputs = {d: a for d, a in inputs.items() if self.cuts[d] == self.num_blocks}
        for devices, tensor, sizes in streams:
            outputs.update(zip(devices, tensor.split(sizes)))
        return outputs

    def step_owners(self, owners: Iterable[Owner], scale: dict[Owner, float] | None = None) -> None:
        """One optimizer step for each owner (gradients multiplied by ``scale[owner]`` first), then
        clear its gradients."""
        for owner in dict.fromkeys(owners):
            opt = self.optimizers.get(owner)
            if opt is None:
                continue
            factor = (scale or {}).get(owner, 1.0)
            if factor != 1.0:
                grads = [p.grad for group in opt.param_groups for p in group["params"] if p.grad is not None]
                if grads:
                    torch._foreach_mul_(grads, factor)
            opt.step()
            opt.zero_grad(set_to_none=True)

    def server_owners(self, devices: Iterable[int]) -> list[Owner]:
        """The owners of the server-side blocks of ``devices``."""
        owners: dict[Owner, None] = {}
        for d in devices:
            for j in range(self.cuts[d], self.num_blocks):
                owners[self.owner(d, j)] = None
        return list(owners)

    # ---- ready-made server steps (strategies choose) -----------------------------------------
    def server_step_parallel(self, msgs: Sequence[ActivationMsg]) -> list[GradientMsg]:
        """All devices in parallel at w^{t−1}: per-device instances step with their own gradient
        (eq. 5), shared instances with the device-averaged gradient (1/N)Σ_i g_{s,i} (eq. 4)."""
        grads = self.server_forward_backward(msgs)
        devices = [m.device for m in msgs]
        owners = self.server_owners(devices)
        self.step_owners(owners, {o: 1.0 / len(msgs) for o in owners if o[1] is None})
        return grads

    def server_step_sequential(self, msgs: Sequence[ActivationMsg]) -> list[GradientMsg]:
        """One device at a time, in message order: forward, backward and step the server-side
        model before the next device's activations are processed (SFL-V2, SL)."""
        grads = []
        for m in msgs:
            grads += self.server_forward_backward([m])
            self.step_owners(self.server_owners([m.device]))
        return grads

    # ---- model averaging ----------------------------------------------------------------------
    def average_blocks(self, blocks: Iterable[int], devices: Sequence[int] | None = None) -> None:
        """FedAvg (eq. 7 style): for each block j, replace every per-device instance of the given
        devices by their plain average (shared instances are left alone). Accounts the model
        bytes: client instances up and down between device and fed server, server instances
        between edge and fed server."""
        devices = list(range(self.num_devices)) if devices is None else list(devices)
        for j in blocks:
            keys = list(dict.fromkeys(self.key(d, j) for d in devices if self.owner(d, j)[1] is not None))
            if len(keys) < 2:
                continue
            modules = [self.instances[k] for k in keys]
            _assign_mean(modules, [1.0] * len(modules))
            for k, m in zip(keys, modules):
                size = _param_bytes(m)
                if k[0][0] == "client":
                    self.transport.bytes_up += size
                    self.transport.bytes_down += size
                else:
                    self.bytes_server += 2 * size

    def averaged_model(self, devices: Sequence[int] | None = None) -> nn.Sequential:
        """The virtual global model w̄ = (1/N)Σ_i w_i (spec §2.1) as a new module (live instances
        are reused where all devices share one)."""
        devices = list(range(self.num_devices)) if devices is None else list(devices)
        blocks = []
        for j in range(self.num_blocks):
            counts: dict[Key, int] = {}
            for d in devices:
                k = self.key(d, j)
                counts[k] = counts.get(k, 0) + 1
            if len(counts) == 1:
                blocks.append(self.instances[next(iter(counts))])
                continue
            target = copy.deepcopy(self.instances[next(iter(counts))])
            _assign_mean([self.instances[k] for k in counts], [float(c) for c in counts.values()], out=target)
            blocks.append(target)
        return nn.Sequential(*blocks)

    # ---- re-partition (Algorithm 1) ------------------------------------------------------------
    def set_cuts(self, new_cuts: Sequence[int]) -> None:
        """Move layers between devices and the server without losing state (spec §5.4): every
        instance of the new layout takes the (weighted) average of the old instances its devices
        used — an exact copy when those are identical, as they are at an aggregation boundary.
        Optimizer state (e.g. momentum buffers) is carried the same way."""
        new_cuts = self._check_cuts(new_cuts)
        if self.pending:
            raise MessageMismatchError(f"cannot re-partition with unanswered activations from devices {sorted(self.pending)}")
        old_state: dict[nn.Parameter, dict[str, Any]] = {}
        for opt in self.optimizers.values():
            old_state.update(opt.state)
        new_instances: dict[Key, nn.Module] = {}
        carried: dict[nn.Parameter, dict[str, Any]] = {}
        for new_key in self._layout(new_cuts):
            j = new_key[1]
            devices = [d for d in range(self.num_devices) if (self.owner(d, j, new_cuts), j) == new_key]
            sources: dict[Key, int] = {}
            for d in devices:
                k = self.key(d, j)
                sources[k] = sources.get(k, 0) + 1
            if new_key in sources and len(sources) == 1:
                new_instances[new_key] = self.instances[new_key]          # untouched: keep object + state
                continue
            modules = [self.instances[k] for k in sources]
            target = copy.deepcopy(modules[0])
            _assign_mean(modules, [float(c) for c in sources.values()], out=target)
            for p_new, *p_olds in zip(target.parameters(), *[m.parameters() for m in modules]):
                states = [old_state[p] for p in p_olds if p in old_state]
                if states:
                    carried[p_new] = _mean_state(states)
            new_instances[new_key] = target
        self.instances = new_instances
        self.cuts = new_cuts
        old_state.update(carried)
        self._build_optimizers(old_state)

    # ---- checks, evaluation --------------------------------------------------------------------
    def check_models_finite(self, round_index: int) -> None:
        """Raise NonFiniteError naming the round and device (or "server") if any parameter is NaN/inf."""
        for (owner, j), module in self.instances.items():
            for p in module.parameters():
                who = owner[1] if owner[1] is not None else f"shared {owner[0]}"
                check_finite(p.detach(), f"{owner[0]} model block {j + 1}", round_index, who)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, batch_size: int = 1000, max_samples: int | None = None) -> tuple[float, float]:
        """(accuracy in [0, 1], mean cross-entropy) of ``model`` on the test set."""
        x, y = self.data.x_test, self.data.y_test
        if max_samples is not None:
            x, y = x[:max_samples], y[:max_samples]
        correct, loss_sum = 0, 0.0
        was_training = model.training
        model.eval()  # BatchNorm uses its running statistics and Dropout is off; no RNG is consumed
        try:
            for start in range(0, x.shape[0], batch_size):
                logits = model(x[start:start + batch_size])
                target = y[start:start + batch_size]
                loss_sum += float(nn.functional.cross_entropy(logits, target, reduction="sum"))
                correct += int((logits.argmax(1) == target).sum())
        finally:
            model.train(was_training)
        return correct / x.shape[0], loss_sum / x.shape[0]

    # ---- one round ---------------------------------------------------------------------------------
    def run_round(self, round_index: int) -> RoundStats:
        """One training round t (spec §2.1): every selected device processes one mini-batch; then the
        strategy's aggregation hook runs. The strategy decides at every hook; the engine does."""
        s = self.strategy
        self.transport.reset_counters()
        self.bytes_server = 0
        self.round_losses = {}
        participants = s.select(self, round_index)
        for group in s.schedule(self, round_index, participants):
            for d in group:
                self.transport.send_activation(s.client_forward(self, d, round_index))
            msgs = s.order_arrivals(self, round_index, self.transport.recv_activations())
            for m in msgs:
                check_finite(m.tensor, "activation message", m.round, m.device)
            for g in s.server_step(self, round_index, msgs):
                self.transport.send_gradient(g)
            for m in msgs:
                s.client_step(self, m.device, self.transport.recv_gradient(m.device))
        self.rounds_since_aggregation += 1
        aggregated = bool(s.aggregate(self, round_index))
        if aggregated:
            self.rounds_since_aggregation = 0
        self.check_models_finite(round_index)
        loss = float(np.mean(list(self.round_losses.values()))) if self.round_losses else float("nan")
        return RoundStats(loss, self.transport.bytes_up, self.transport.bytes_down, self.bytes_server, aggregated,
                          list(participants))

    # ---- checkpoint state ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue bit-identically: parameters, optimizer states, cuts, I,
        samplers, step counters, the aggregation phase and the strategy's own state."""
        keys = list(self.instances)
        return {
            "cuts": list(self.cuts),
            "interval": self.interval,
            "rounds_since_aggregation": self.rounds_since_aggregation,
            "steps": list(self.steps),
            "keys": keys,
            "instances": [self.instances[k].state_dict() for k in keys],
            "optimizers": {owner: opt.state_dict() for owner, opt in self.optimizers.items()},
            "samplers": [s.state() for s in self.samplers],
            "strategy": self.strategy.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cuts = self._check_cuts(state["cuts"])
        self.interval = int(state["interval"])
        self.rounds_since_aggregation = int(state["rounds_since_aggregation"])
        self.steps = list(state["steps"])
        self.instances = {}
        for key, sd in zip(state["keys"], state["instances"]):
            module = copy.deepcopy(self.template[key[1]])
            module.load_state_dict(sd)
            self.instances[tuple(key)] = module  # type: ignore[index]
        if set(self.instances) != set(self._layout()):
            raise InputError("checkpoint layout does not match the algorithm's layout", field="resume")
        self._build_optimizers({})
        for owner, sd in state["optimizers"].items():
            self.optimizers[owner].load_state_dict(sd)
        for sampler, s in zip(self.samplers, state["samplers"]):
            sampler.load_state(s)
        self.pending = {}
        self.strategy.load_state_dict(state["strategy"])


@torch.no_grad()
def _assign_mean(modules: Sequence[nn.Module], weights: Sequence[float], out: nn.Module | None = None) -> None:
    """Weighted mean of the parameters and float buffers of ``modules``; written into ``out`` (or
    into every module when ``out`` is None). If all modules are bitwise equal the first one's
    values are copied exactly (no rounding from summing identical tensors)."""
    targets = [out] if out is not None else list(modules)
    target_lists = [list(t.parameters()) + list(t.buffers()) for t in targets]
    tensor_lists = [list(m.parameters()) + list(m.buffers()) for m in modules]
    total = float(sum(weights))
    equal_weights = all(w == weights[0] for w in weights)
    for position, tensors in enumerate(zip(*tensor_lists)):
        first = tensors[0]
        if not first.is_floating_point() or all(torch.equal(first, t) for t in tensors[1:]):
            value = first.clone()
        elif equal_weights:
            value = torch.stack(tensors).mean(0)
        else:
            value = torch.stack([t * (w / total) for t, w in zip(tensors, weights)]).sum(0)
        for dests in target_lists:
            dests[position].copy_(value)


def _mean_state(states: list[dict[str, Any]]) -> dict[str, Any]:
    """Average optimizer states (tensors averaged, other entries taken from the first)."""
    if len(states) == 1:
        return {k: v.clone() if torch.is_tensor(v) else v for k, v in states[0].items()}
    merged = {}
    for k, v in states[0].items():
        if torch.is_tensor(v) and v.is_floating_point() and all(k in s for s in states):
            merged[k] = torch.stack([s[k] for s in states]).mean(0)
        else:
            merged[k] = v.clone() if torch.is_tensor(v) else v
    return merged
