"""The simulation runtime (docs/architecture.md): the three roles of :mod:`trainers.roles.core` in one
process, messages delivered by a discrete-event schedule whose times come from adaptplan's
latency model per device and per stage (:class:`trainers.engine.clock.StageTimes`).

A synchronous round (every algorithm but GAS) is a set of events: each participant's forward and
uplink (arrival at the edge server at T_i^F + T_i^A), the edge server's work (``barrier``: all of a
group together once the last arrives; ``arrival``: one device at a time in arrival order, the
server busy for that device's share of (18)+(19)), each reply's downlink and backward, hand-offs
between groups, and the aggregation (device and edge uploads, then downloads) after the round's
barrier. For AdaptSFL this reproduces T_split + T_agg of §2.4 exactly; SFL-V2 served in arrival
order ends earlier; partial participation charges only the participants. GAS runs on the same
events without a barrier (:meth:`SplitEngine.run_round` dispatches to the asynchronous loop).

:class:`SplitEngine` is the round loop and the read-only view that evaluation and tests use
(``device_model``, ``averaged_model``); the strategy decides at every point (:mod:`trainers.api`).
The loop reaches the devices and the fed server only through messages over a
:class:`~trainers.engine.network.Network`: in this process (:class:`~trainers.engine.network.LocalNetwork`, the
default) or on other ranks (``adaptplan train --distributed``), with the same handlers
(:mod:`trainers.roles.hosts`).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from adaptplan.errors import InputError
from adaptplan.plan import check_cut_vector
from trainers.config.train_config import EVAL_BATCH_SIZE
from trainers.engine.aggregation import aggregate, load_global, start_from_global
from trainers.engine.async_loop import run_async_round
from trainers.engine.clock import StageTimes, stage_maxima
from trainers.engine.execution import Execution, graph_bytes_per_sample
from trainers.engine.head_split import check_u_shaped, head_exchange, server_chain
from trainers.engine.model_views import EngineModels
from trainers.engine.network import LocalNetwork, Network
from trainers.engine.privacy_account import privacy_metrics
from trainers.engine.repartition import repartition
from trainers.engine.round_data import AsyncLoopState, DeviceData, RoundStats, RoundTimeline  # noqa: F401  (DeviceData, RoundStats re-exported)
from trainers.engine.state import engine_state, restore_engine
from trainers.engine.sync_round import handoff, run_group
from trainers.roles.batching import ClientBatcher
from trainers.roles.checks import Schema, schema_of
from trainers.roles.core import Device, EdgeServer, FedServer, random_layer
from trainers.roles.defences import ActivationDefence
from trainers.roles.head import Head
from trainers.roles.hosts import DeviceHost, FedHost, device_finite_items
from trainers.roles.messages import (
    DevicesLost,
    MessageMismatchError,
    NonFiniteError,
    check_all_finite,
    deferred_finite_checks,
    tensor_bytes,
)
from trainers.roles.optim import OptimizerSpec
from trainers.roles.passes import EdgePasses
from trainers.roles.protocol import FED, AggregationRule

if TYPE_CHECKING:  # pragma: no cover
    from trainers.api import RoundContext, Strategy
    from trainers.engine.clock import SimClock

#: Stream word of the strategy's generator, seeded ``[seed, STRATEGY_STREAM]``. Device i's sampler is seeded
#: ``[seed, i]`` with i < MAX_DEVICES (adaptplan.limits), so no device ever shares the strategy's stream.
STRATEGY_STREAM = 2 ** 32 - 1


def local_network(engine: "SplitEngine", optimizer: OptimizerSpec, seed: int) -> LocalNetwork:
    """Every role in this process: device i with its samples ``data.parts[i]``, sampler seeded
    ``[seed, i]``, the client ``optimizer``; the engine's batcher runs groups of them."""
    data = engine.data
    devices = {i: Device(i, engine.template, engine.cuts[i], data.x_train, data.y_train, p, engine.batch_size, [seed, i],
                         optimizer, engine.defence) for i, p in enumerate(data.parts)}
    server = engine.strategy.optimizer("server", engine.server_optimizer)      # the head's layers keep their settings
    heads = {i: Head(i, engine.template, engine.defence.head, server, engine.defence, [seed, i]) for i in devices} \
        if engine.defence.head else None
    return LocalNetwork(DeviceHost(devices, engine.batcher, heads), FedHost())


def check_device_finite(device: Device, round_index: int) -> None:
    """Raise NonFiniteError naming the round, the device and the block if its client model has NaN/inf."""
    check_all_finite(device_finite_items(device), round_index)


def _on_device(chain: nn.Sequential, device: torch.device) -> nn.Sequential:
    """``chain`` if all its tensors are on ``device``, else a copy moved there (the caller's stays put)."""
    tensors = [*chain.parameters(), *chain.buffers()]
    if all(t.device == device for t in tensors):
        return chain
    return copy.deepcopy(chain).to(device)


def block_sizes(chain: nn.Sequential) -> tuple[list[int], list[int], Schema]:
    """Per block of ``chain``: the bytes of its state (what any device's or average's copy of it weighs,
    BlockState.num_bytes), its floating-point entries (what a robust aggregation rule sorts per upload), and its
    entries' shapes and dtypes (what a device's upload must hold, :func:`trainers.roles.checks.check_upload`)."""
    states = [block.state_dict() for block in chain]
    return ([sum(tensor_bytes(t) for t in state.values() if torch.is_tensor(t)) for state in states],
            [sum(t.numel() for t in state.values() if torch.is_tensor(t) and t.is_floating_point()) for state in states],
            schema_of(states))


def _private_template(chain: nn.Sequential, device: torch.device) -> nn.Sequential:
    """``chain`` on ``device``, never the caller's own object: the roles start from the template's tensors
    without copying them, so the template is kept private."""
    on_device = _on_device(chain, device)
    return copy.deepcopy(on_device) if on_device is chain else on_device


def _label_counts(data: DeviceData, num_classes: int) -> list[np.ndarray]:
    """Each device's training samples per class."""
    labels = data.y_train.cpu()
    return [np.bincount(labels[torch.from_numpy(np.asarray(p))].numpy(), minlength=num_classes) for p in data.parts]


def _data_on_device(data: DeviceData, device: torch.device) -> DeviceData:
    """``data`` with its tensors on ``device`` (copied once if they are elsewhere)."""
    moved = {name: getattr(data, name).to(device) for name in ("x_train", "y_train", "x_test", "y_test")}
    if all(moved[name] is getattr(data, name) for name in moved):
        return data
    return dataclasses.replace(data, **moved)


class SplitEngine:
    """Simulated split training of ``chain`` over N devices under ``strategy``.

    Args:
        chain: the model as L blocks (``profilers.build_chain(...).blocks`` or an ``nn.Sequential``).
        cuts: ℓ_i per device, 1-based, 1 ≤ ℓ_i ≤ L.
        strategy: the algorithm (:class:`trainers.api.Strategy`).
        data: the partitioned data.
        optimizer: the devices' :class:`OptimizerSpec` (or ``torch.optim.SGD`` keyword arguments), and the
            edge server's unless ``server_optimizer`` is given; the strategy may choose another per role.
        batch_size: b, samples per device per step.
        seed: seeds the samplers (device i uses ``[seed, i]``) and the strategy's generator
            (``[seed, STRATEGY_STREAM]``).
        interval: I, rounds between client-side model averagings (eq. 7).
        clock: the simulated clock (stage times per round); None = every stage takes 0 s.
        total_rounds: R, for strategies whose schedule depends on t/R (GAPSL's eq. 2).
        device, client_batching, server_pass_samples, client_recompute, batch_devices: how the run is executed
            (:class:`trainers.engine.execution.Execution`, resolved from these unless ``execution`` is given): never a
            number of the run, only where and in which pieces it is computed.
        network: ``network(engine, client optimizer, seed)`` builds the :class:`~trainers.engine.network.Network`
            that hosts the devices and the fed server (default :func:`local_network`: this process).
        defence: what every device does to its activations before sending them (trainers/roles/defences.py).
    """

    def __init__(self, chain: nn.Sequential, cuts: Sequence[int], strategy: "Strategy", data: DeviceData,
                 optimizer: OptimizerSpec | dict[str, Any], batch_size: int, seed: int = 0, interval: int = 1,
                 batch_devices: bool = True, clock: "SimClock | None" = None, total_rounds: int | None = None,
                 device: torch.device | str = "cpu", client_batching: str = "auto",
                 server_optimizer: OptimizerSpec | dict[str, Any] | None = None,
                 server_pass_samples: int | str | None = "auto", client_recompute: str = "auto",
                 network: "Callable[[SplitEngine, OptimizerSpec, int], Network] | None" = None,
                 execution: Execution | None = None, aggregation: tuple[str, float] = ("mean", 0.0),
                 defence: ActivationDefence | None = None) -> None:
        self.execution = execution or Execution.resolve(device, client_batching, server_pass_samples, client_recompute,
                                                        batch_devices)
        self.device = self.execution.device
        chain = _private_template(chain, self.device)
        data = _data_on_device(data, self.device)
        self.template = chain
        self.num_blocks = len(chain)
        self.block_bytes, self.block_values, self.upload_schema = block_sizes(chain)
        self.aggregation = (str(aggregation[0]), float(aggregation[1]))
        """The fed server's rule (:data:`trainers.roles.core.AGGREGATION_RULES`) and trimmed share β."""
        self.num_devices = len(data.parts)
        self.strategy = strategy
        self.data = data
        self.num_classes = data.num_classes or int(torch.cat([data.y_train, data.y_test]).max()) + 1
        self.defence = dataclasses.replace(defence or ActivationDefence(), classes=self.num_classes)   # M, for randomised labels
        spec = lambda s: s if isinstance(s, OptimizerSpec) else OptimizerSpec(**s)   # noqa: E731
        self.optimizer = spec(optimizer)
        self.server_optimizer = self.optimizer if server_optimizer is None else spec(server_optimizer)
        self.batch_size = batch_size
        self.interval = int(interval)
        self.clock = clock
        self.total_rounds = total_rounds
        self.cuts = self.check_cuts(cuts)
        self.rng = np.random.default_rng([seed, STRATEGY_STREAM])
        self.rounds_since_aggregation = 0
        self.absent: set[int] = set()
        """Devices lost for the rest of the run (a real runtime, where the strategy ``allows_absence``); checkpointed."""
        self.period: list[int] | None = None
        """The running aggregation period's participants (kept until its aggregation, where averaged); checkpointed."""
        self.stale: set[int] = set()
        """Devices that missed the last average (partial participation): drawn again, they first download it."""
        self.label_counts = _label_counts(data, self.num_classes)
        strategy.validate(self.context(0))
        self.batcher = ClientBatcher(chain) if self.execution.client_batching else None
        self.net: Network = (network or local_network)(self, strategy.optimizer("client", self.optimizer), seed)
        if self.aggregation[0] != "mean":
            self.net.send(FED, AggregationRule(*self.aggregation))
        self.edge = EdgeServer(server_chain(self), self.cuts, strategy.server_owner, strategy.optimizer("server", self.server_optimizer))
        self.passes = EdgePasses(self.edge, self.execution.concatenate, self.execution.server_pass_samples,  # strategy's
                                 head_exchange(self) if self.defence.head else None)
        self._random_layers = random_layer(chain) is not None
        self.async_state: AsyncLoopState | None = None
        self.models = EngineModels(self)                # the models' views and their evaluation
        self.global_sizes: dict[int, int] = {}        # the fed server's global blocks (bytes each)
        self.awaiting: set[int] = set()                # devices whose activation is not answered yet
        self._next_key = 0
        self._measured: dict[str, dict[str, float]] | None = None
        self._graph_bytes: dict[int, float] = {}      # a client graph's bytes per sample, per cut (recompute)
        self.timeline = RoundTimeline()
        """The running round's stage seconds, when the edge server is free, bytes and samples."""

    # ---- the simulator's own views of the roles (tests, inspection; not on other runtimes) ------------------
    @property
    def devices(self) -> list[Device]:
        """The :class:`~trainers.roles.core.Device` objects, where they live in this process."""
        return self._local().devices

    @property
    def fed(self) -> FedServer:
        """The :class:`~trainers.roles.core.FedServer`, where it lives in this process."""
        return self._local().fed

    def _local(self) -> LocalNetwork:
        if not isinstance(self.net, LocalNetwork):
            raise AttributeError("the devices and the fed server live on other processes in this runtime")
        return self.net

    # ---- context ------------------------------------------------------------------------------------
    def check_cuts(self, cuts: Sequence[int]) -> list[int]:
        """``cuts`` as a list after :func:`check_cut_vector`; a strategy of the whole model (the registry's
        ``whole_model``: federated learning) takes cut L on every device only."""
        checked: list[int] = check_cut_vector(cuts, self.num_devices, self.num_blocks).tolist()
        if self.strategy.whole_model and set(checked) != {self.num_blocks}:
            raise InputError(f"{self.strategy.name} trains the whole model on every device (no split): every cut "
                             f"must be {self.num_blocks}, got {sorted(set(checked))}", field="cuts")
        check_u_shaped(self, checked)
        return checked

    @property
    def deepest_cut(self) -> int:
        """L_c = max_i ℓ_i (docs/model.md §1)."""
        return max(self.cuts)

    def data_sizes(self) -> list[int]:
        return [int(np.asarray(p).size) for p in self.data.parts]

    def context(self, round_index: int) -> "RoundContext":
        from trainers.api import RoundContext

        return RoundContext(round_index, self.num_devices, self.num_blocks, list(self.cuts), self.data_sizes(), self.batch_size,
                            self.interval, self.rounds_since_aggregation + 1, self.total_rounds, self.rng,
                            self.num_classes, self.label_counts, absent=frozenset(self.absent),
                            participants=list(self.period or []))

    def present(self, devices: Sequence[int] | None = None) -> list[int]:
        """``devices`` (default all) without the absent ones, after taking in the network's losses;
        :class:`DevicesLost` when none is left."""
        self.absent |= self.net.absent_devices()
        kept = [int(d) for d in (range(self.num_devices) if devices is None else devices) if int(d) not in self.absent]
        if devices is None and not kept:
            raise DevicesLost(f"every device of the run is absent (lost: {sorted(self.absent)}): nothing can train")
        return kept

    def stage_times(self, round_index: int) -> StageTimes:
        if self.clock is None:
            return StageTimes.zeros(self.num_devices, self.batch_size)
        return self.clock.stage_times(round_index, self.cuts)

    # ---- one synchronous round ----------------------------------------------------------------------
    def run_round(self, round_index: int) -> RoundStats:
        """Round t: participants step once each (in the strategy's groups), then the strategy's
        hand-offs and aggregation; simulated seconds from the event times. Off the CPU
        (``execution.defer_checks``) the round's NaN/inf checks are read once, at its end. Where the network
        measures (other processes), the record carries the measured seconds per stage and the
        round's wall seconds next to the simulated ones."""
        self._take_back(round_index)
        self.net.begin_round(round_index, self.clock)
        started = time.time()
        with deferred_finite_checks(self.execution.defer_checks):
            stats = self._run_round(round_index)
        if self._measured is not None:
            stats.measured_seconds_by_role = self._measured
            stats.measured_stage_seconds = stage_maxima(self._measured)
            stats.measured_round_seconds = time.time() - started
        return stats

    def _run_round(self, round_index: int) -> RoundStats:
        self.timeline = self.timeline.next_round()
        if self.strategy.asynchronous:
            return run_async_round(self, round_index)
        s = self.strategy
        ctx = self.context(round_index)
        times = self.stage_times(round_index)
        participants = ctx.participants = self.present(self._participants(ctx))
        batch = {d: int(s.batch_size(ctx, d)) for d in participants}
        now = start_from_global(self, participants, ctx.round, times)
        for group in s.schedule(ctx, participants):
            now = run_group(self, ctx, list(group), batch, times, now)
            for passed in s.after_group(ctx, group):
                now = handoff(self, passed, round_index, times, now)
        aggregation = s.aggregation(ctx)
        self.rounds_since_aggregation += 1
        if aggregation is not None:
            now = aggregate(self, aggregation, ctx, participants, times, now)
            self.rounds_since_aggregation = 0
        self.check_models_finite(round_index)
        return self.round_stats(ctx, aggregation is not None, self.present(participants), now)

    def _participants(self, ctx: "RoundContext") -> list[int]:
        """The round's participants (the strategy's draw). A strategy that averages client models draws
        them once per aggregation period, FedAvg's round of I local rounds (SCALA's global iteration), and
        keeps them until its aggregation; the others draw every round."""
        if self.strategy.averages_clients and self.period is not None and self.rounds_since_aggregation > 0:
            return list(self.period)
        self.period = [int(d) for d in self.strategy.participants(ctx)]
        return list(self.period)

    def round_stats(self, ctx: "RoundContext", aggregated: bool, participants: list[int], seconds: float) -> RoundStats:
        """The round's figures (loss, bytes, participants, simulated seconds, stage summary, metrics), the bytes and
        stage seconds from the round's :class:`~trainers.engine.round_data.RoundTimeline`."""
        self.absent |= self.net.absent_devices()
        if self.absent:
            ctx.metrics["absent_devices"] = float(len(self.absent))
        loss = float(torch.stack(list(ctx.losses.values())).mean()) if ctx.losses else float("nan")
        if ctx.losses and not math.isfinite(loss):      # finite models can still give an infinite loss (issue 67 E7)
            worst = max(ctx.losses, key=lambda d: not math.isfinite(float(ctx.losses[d])))
            raise NonFiniteError(f"training loss {float(ctx.losses[worst])} at round {ctx.round}, device {worst}")
        tally, ledger = self.timeline.tally, self.timeline.ledger
        return RoundStats(loss, tally.up, tally.down, tally.server, aggregated, participants,
                          float(seconds), ledger.summary(), {**ctx.metrics, **privacy_metrics(self)}, samples=tally.samples,
                          seconds_by_role=ledger.by_role())

    @property
    def may_stream(self) -> bool:
        """Whether a group's devices may forward chunk by chunk as the server goes (no device that may
        be lost midway, no random layer whose masks would be drawn in another order)."""
        return not self.strategy.allows_absence and not self._random_layers

    def recompute(self, batch: Mapping[int, int]) -> bool:
        """Whether the devices of ``batch`` (device → samples) recompute their client forwards at backward time
        (:meth:`Execution.recompute`, each cut's graph bytes per sample measured once)."""
        by_cut: dict[int, int] = {}
        for d, samples in batch.items():
            by_cut[self.cuts[d]] = by_cut.get(self.cuts[d], 0) + int(samples)
        return self.execution.recompute(by_cut, self._graph_bytes_per_sample)

    def _graph_bytes_per_sample(self, cut: int) -> float:
        if cut not in self._graph_bytes:
            rows = torch.arange(min(2, len(self.data.x_train)), device=self.data.x_train.device)
            self._graph_bytes[cut] = graph_bytes_per_sample(self.template[:cut], self.data.x_train[rows])
        return self._graph_bytes[cut]

    def blocks_bytes(self, blocks: Sequence[int]) -> int:   # bytes of one copy of ``blocks``
        return sum(self.block_bytes[j] for j in blocks)

    def next_key(self) -> int:
        self._next_key += 1
        return self._next_key

    @property
    def fresh_client_state(self) -> bool:   # a loading device restarts its optimizer: --client-state, else the strategy's
        return self.strategy.reset_client_optimizer if self.optimizer.restart_on_download is None else self.optimizer.restart_on_download

    def load_global(self, device: int, round_index: int, fresh_optimizer: bool) -> int:
        return load_global(self, device, round_index, fresh_optimizer)

    def _take_back(self, round_index: int) -> None:
        """Devices whose host came back as a new process (a real runtime, partial participation) are present again
        from this round, from the global client model where there is one, with fresh optimizer state (as at start)."""
        for d in self.net.readmit():
            self.absent.discard(d)
            self.stale.discard(d)
            self.load_global(d, round_index, fresh_optimizer=True)

    # ---- re-partition (Algorithm 1; trainers.engine.repartition) ---------------------------------------------------
    def set_cuts(self, new_cuts: Sequence[int], round_index: int = 0) -> None:
        """Move layers between devices and the edge server without losing state (:func:`trainers.engine.repartition.
        repartition`)."""
        new = self.check_cuts(new_cuts)
        if new == list(self.cuts):
            return
        if self.awaiting:
            raise MessageMismatchError(f"cannot re-partition with unanswered activations from devices {sorted(self.awaiting)}")
        start_from_global(self, sorted(self.stale), round_index, StageTimes.zeros(self.num_devices, self.batch_size))
        repartition(self, new, round_index)

    # ---- the models, as strategies, the trainer and tests read them (trainers.engine.model_views) -------------------
    def block(self, device: int, block: int) -> nn.Module:
        return self.models.block(device, block)

    def device_model(self, device: int) -> nn.Sequential:
        return self.models.device_model(device)

    def averaged_model(self, devices: Sequence[int] | None = None) -> nn.Sequential:
        return self.models.averaged_model(devices)

    def global_model(self, group: int = 0) -> nn.Sequential:
        return self.models.global_model(group)

    def eval_models(self) -> list[nn.Module]:
        return self.models.eval_models()

    def evaluate(self, model: nn.Module, batch_size: int = EVAL_BATCH_SIZE, max_samples: int | None = None,
                 data: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[float, float]:
        return self.models.evaluate(model, batch_size, max_samples, data)

    def evaluate_local(self, batch_size: int = EVAL_BATCH_SIZE, devices: Sequence[int] | None = None) -> float | None:
        return self.models.evaluate_local(batch_size, devices)

    def release(self) -> None:
        """Training is over: the network's hosts may end (:meth:`~trainers.engine.network.Network.release`)."""
        self.net.release()

    def check_models_finite(self, round_index: int) -> None:
        """Raise NonFiniteError naming the round and device (or the server instance) on NaN/inf
        (the devices' hosts check theirs, then the edge server its instances; the first offending
        parameter is named). A network that measures hands over the round's seconds here."""
        self._measured = self.net.end_round(round_index)
        self.edge.check_finite(round_index)

    # ---- checkpoint (trainers.engine.state) -----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return engine_state(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        restore_engine(self, state)
