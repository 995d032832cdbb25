"""The engine's models as strategies, the trainer and tests read them, and their evaluation: one part of
:class:`trainers.engine.split_engine.SplitEngine` (its ``models``), the :class:`trainers.api.ModelViews` a strategy's
``eval_models`` and ``local_models`` receive.

A view is made of live modules where one exists (a device's blocks, a shared server instance) and of the
engine's evaluation modules where an average is needed (``averaged_model``, ``global_model``): those are made
once and reloaded at every call, so the next call overwrites them (``copy.deepcopy`` a result to keep it).
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from trainers.config.train_config import EVAL_BATCH_SIZE
from trainers.engine.head_split import head_start, on_device, position
from trainers.engine.seams import EngineParts
from trainers.roles.core import weighted_mean
from trainers.roles.messages import BlockState, DeviceAbsent
from trainers.roles.protocol import EDGE, FED, Send

Engine = EngineParts   # the engine as its parts see it (trainers.engine.seams)
"""A :class:`trainers.engine.split_engine.SplitEngine` (not imported: the engine imports this module)."""


class EngineModels:
    """The models of ``engine``'s roles, read through its network and edge server (never copied but for the
    averages), and their evaluation on the test set (global protocol) or the devices' held-out samples (local)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._eval_blocks: dict[Any, nn.Module] = {}

    @property
    def num_devices(self) -> int:
        return self.engine.num_devices

    def present(self, devices: Sequence[int] | None = None) -> list[int]:
        return self.engine.present(devices)

    def block(self, device: int, block: int) -> nn.Module:
        """The live module of block ``block`` (0-based) of device ``device``'s model;
        :class:`DeviceAbsent` for a device lost meanwhile. Its tensors may be shared with other
        devices' (those that loaded the same download, docs/engine.md "One copy of equal models"): read them,
        and change a model only through the roles' messages."""
        e = self.engine
        if on_device(e, device, block):
            blocks = e.net.device_blocks(device)
            if blocks is None:
                raise DeviceAbsent(device)
            return blocks[position(e, device, block)]
        return e.edge.instances[e.edge.key(device, block)]

    def device_model(self, device: int) -> nn.Sequential:
        """Device i's full model w_i = [w_{c,i}; w_{s,i}] as live modules (no copy)."""
        return nn.Sequential(*[self.block(device, j) for j in range(self.engine.num_blocks)])

    def averaged_model(self, devices: Sequence[int] | None = None) -> nn.Sequential:
        """The virtual global model w̄ = (1/N)Σ_i w_i (docs/model.md §2.1): block-wise parameter mean over the
        devices' models (live modules reused where all devices share one instance). Absent devices are left out
        (all present ones when none of ``devices`` is)."""
        devices = (devices is not None and self.present(devices)) or self.present()
        blocks = []
        for j in range(self.engine.num_blocks):
            modules: dict[int, tuple[nn.Module, int]] = {}
            for d in devices:
                m = self.block(d, j)
                modules[id(m)] = (m, modules.get(id(m), (m, 0))[1] + 1)
            if len(modules) == 1:
                blocks.append(next(iter(modules.values()))[0])
                continue
            ms = list(modules.values())
            target = self._eval_blocks.get(j)
            if target is None:
                target = self._eval_blocks[j] = copy.deepcopy(ms[0][0])
            target.load_state_dict(weighted_mean([m.state_dict() for m, _ in ms], [float(c) for _, c in ms]))
            blocks.append(target)
        return nn.Sequential(*blocks)

    def global_model(self, group: int = 0) -> nn.Sequential:
        """The global model of the last aggregation: every block the fed server has averaged, from its global
        model (|𝒟_i|-weighted, eq. 7; GAS-12) — group ``group``'s where the devices are averaged in groups
        (:class:`trainers.api.Aggregation`); a block that devices or per-device server copies hold but that
        no average has reached yet, its initial weights w⁰ (every device started from them); every other
        block, the edge server's one shared instance (the server model, trained every round), even where the fed
        server still holds an average of it from when a cut put it on the devices (Algorithm 1's re-plans)."""
        e = self.engine
        global_states = self.global_states(range(e.num_blocks), group)
        blocks: list[nn.Module] = []
        for j in range(e.num_blocks):
            owners = {e.edge.key(d, j)[0] for d in range(e.num_devices) if j >= e.cuts[d]}
            if max(e.cuts) <= j < head_start(e) and owners == {None}:   # the shared server block, trained every round: a global
                blocks.append(e.edge.instances[(None, j)])   # state of it is from before a re-partition (stale)
                continue
            target = self._eval_blocks.get(("global", group, j))
            if target is None:
                target = self._eval_blocks[("global", group, j)] = copy.deepcopy(e.template[j])
            target.load_state_dict(global_states[j].state if j in global_states else e.template[j].state_dict())
            blocks.append(target)
        return nn.Sequential(*blocks)

    def global_states(self, blocks: Sequence[int] | range, group: int = 0) -> dict[int, BlockState]:
        """The fed server's global blocks among ``blocks`` (those averaged so far; group ``group``'s)."""
        e = self.engine
        wanted = [j for j in blocks if j in e.global_sizes]
        if not wanted:
            return {}
        e.net.send(FED, Send(EDGE, -1, 0, "edge", {j: ("global", j, group) for j in wanted}))
        (got,) = e.net.receive([FED])
        return dict(got.blocks)

    def read(self, what: Callable[[Any], Any]) -> Any:
        """``what(self)``; where a device is lost while the models are read, it becomes absent and they are
        read again without it."""
        while True:
            try:
                return what(self)
            except DeviceAbsent:      # the network counts it lost now: present() leaves it out next time
                continue

    def eval_models(self) -> list[nn.Module]:
        """The strategy's ``eval_models`` (the global protocol's models)."""
        return self.read(self.engine.strategy.eval_models)

    def evaluate_local(self, batch_size: int = EVAL_BATCH_SIZE, devices: Sequence[int] | None = None) -> float | None:
        """The local protocol (CycleSL §4.1): each present device's model (the strategy's ``local_models``) on
        the samples it holds out (``data.local_test``), correct predictions pooled over all of them — or over
        ``devices`` only (the CycleSL authors' protocol: the round's sampled clients, right after their update);
        None when none of them holds any out. Devices sharing one model object are evaluated in one pass."""
        data = self.engine.data
        held = {d: data.local_test[d] for d in self.present(devices) if d < len(data.local_test) and len(data.local_test[d])}
        if not held:
            return None
        models = self.read(self.engine.strategy.local_models)
        groups: dict[int, tuple[nn.Module, list[np.ndarray]]] = {}
        for d, rows in held.items():
            if d in models:
                groups.setdefault(id(models[d]), (models[d], []))[1].append(rows)
        correct = total = 0
        for model, held_rows in groups.values():
            index = torch.from_numpy(np.concatenate(held_rows)).to(data.x_train.device)
            accuracy, _ = self.evaluate(model, batch_size, data=(data.x_train[index], data.y_train[index]))
            correct += round(accuracy * index.numel())
            total += index.numel()
        return correct / total if total else None

    @torch.no_grad()
    def evaluate(self, model: nn.Module, batch_size: int = EVAL_BATCH_SIZE, max_samples: int | None = None,
                 data: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[float, float]:
        """(accuracy in [0, 1], mean cross-entropy) of ``model`` on the test set, or on ``data`` (eval mode)."""
        x, y = (self.engine.data.x_test, self.engine.data.y_test) if data is None else data
        if max_samples is not None:
            x, y = x[:max_samples], y[:max_samples]
        correct = torch.zeros((), dtype=torch.int64, device=x.device)        # summed where the data are,
        loss_sum = torch.zeros((), dtype=torch.float64, device=x.device)     # read once at the end
        was_training = model.training
        model.eval()  # BatchNorm uses its running statistics and Dropout is off; no RNG is consumed
        try:
            for start in range(0, x.shape[0], batch_size):
                logits = model(x[start:start + batch_size])
                target = y[start:start + batch_size]
                loss_sum += nn.functional.cross_entropy(logits, target, reduction="sum").double()
                correct += (logits.argmax(1) == target).sum()
        finally:
            model.train(was_training)
        return int(correct) / x.shape[0], float(loss_sum) / x.shape[0]
