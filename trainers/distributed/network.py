"""Rank 0's :class:`~trainers.network.Network`: the devices and the fed server on other ranks.

The round loop (:class:`trainers.engine.SplitEngine`) is the simulator's, unchanged; its messages
go to the ranks that host the roles (:mod:`trainers.distributed.serve`, with the same handlers as
the simulator, :mod:`trainers.hosts`). Besides delivering them this network

* sets the device ranks up (:meth:`RankNetwork.setup`: sample positions and initial weights, never samples);
* books what rank 0 measures: each activation's uplink time, the edge server's work (from the
  group's activations to its first reply), the edge server's model download;
* at the round's end collects every rank's report (its NaN/inf check and measured seconds) and
  returns the longest participant's seconds per stage;
* with ``--emulate-links`` sends every rank the round's link rates (:class:`LinkRates`).
"""

from __future__ import annotations

import copy
import time
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch
from torch import nn

from trainers.distributed.control import DeviceSpec, LinkRates, Report, Setup
from trainers.distributed.layout import FED_RANK, SETUP_TIMEOUT_FACTOR, RankLayout
from trainers.distributed.timing import StageLedger, book_transfer, link_rate
from trainers.distributed.transport import FrameChannel
from trainers.messages import Activation, CutGradient
from trainers.optim import OptimizerSpec
from trainers.protocol import EDGE, FED, Address, Blocks, GetBlocks, RoundEnd

if TYPE_CHECKING:  # pragma: no cover
    from trainers.clock import SimClock
    from trainers.engine import SplitEngine


class RankNetwork:
    """Messages to and from the ranks of ``layout`` over ``channel``; ``source`` names the data set
    and model the device ranks build (dataset, model, model_width)."""

    def __init__(self, channel: FrameChannel, layout: RankLayout, emulate: bool, source: dict[str, Any]) -> None:
        self.channel = channel
        self.layout = layout
        self.emulate = emulate
        self.source = dict(source)
        self.template: nn.Sequential | None = None
        self.rates: LinkRates | None = None
        self.ledger = StageLedger()
        self.served_from: float | None = None
        self._blocks: dict[int, nn.ModuleList] = {}

    # ---- setting the device ranks up -------------------------------------------------------------------
    def setup(self, engine: "SplitEngine", optimizer: OptimizerSpec, seed: int) -> "RankNetwork":
        """Each device rank loads the data set and builds the chain's architecture itself
        (:func:`trainers.distributed.serve.local_chain`); it is sent the chain's initial weights and,
        per device it hosts, the positions of that device's samples in the data set, its cut,
        sampler seed and optimizer. Returns this network once every device rank is ready."""
        self.template = engine.template
        data = engine.data
        source = dict(self.source, num_train=int(data.x_train.shape[0]), num_classes=int(engine.num_classes))
        initial = [{k: v.detach().cpu().clone() for k, v in block.state_dict().items()} for block in engine.template]
        by_rank: dict[int, dict[int, DeviceSpec]] = {}
        for i, part in enumerate(data.parts):
            by_rank.setdefault(self.layout.rank_of(i), {})[i] = DeviceSpec(
                engine.cuts[i], torch.as_tensor(np.asarray(part), dtype=torch.long), engine.batch_size, [seed, i], optimizer)
        for rank, devices in by_rank.items():
            self.channel.send(Setup(source, initial, devices), rank)
        self.channel.recv_many(list(by_rank), timeout=SETUP_TIMEOUT_FACTOR * self.channel.timeout)
        return self

    # ---- Network ------------------------------------------------------------------------------------------
    def _rank(self, address: Address) -> int:
        return FED_RANK if address == FED else self.layout.rank_of(int(address))

    def hosts(self, devices: Sequence[int]) -> list[list[int]]:
        by_rank: dict[int, list[int]] = {}
        for d in devices:
            by_rank.setdefault(self.layout.rank_of(d), []).append(d)
        return list(by_rank.values())

    def send(self, to: Address, msg: Any) -> None:
        if to != FED:
            self._blocks.pop(int(to), None)         # the device may change: its blocks are read anew
        if isinstance(msg, CutGradient) and self.served_from is not None:
            self.ledger.add("edge", "server", time.time() - self.served_from)   # since the group's activations came
            self.served_from = None
        self.channel.send(msg, self._rank(to), rate=link_rate(self.rates, msg, EDGE, to))

    def receive(self, sources: Sequence[Address]) -> list[Any]:
        out = []
        for _, envelope in self.channel.recv_many([self._rank(s) for s in sources]):
            msg = book_transfer(self.ledger, envelope, EDGE)
            if isinstance(msg, Activation):
                self.served_from = time.time()
            out.append(msg)
        return out

    def device_blocks(self, device: int) -> nn.ModuleList:
        if device not in self._blocks:
            self.channel.send(GetBlocks(device), self._rank(device))
            (_, envelope), = self.channel.recv_many([self._rank(device)])
            reply: Blocks = envelope.msg
            assert self.template is not None, "set up before the first round"
            modules = []
            for j, state in enumerate(reply.states):
                module = copy.deepcopy(self.template[j])
                module.load_state_dict(state)
                modules.append(module)
            self._blocks[device] = nn.ModuleList(modules)
        return self._blocks[device]

    def begin_round(self, round_index: int, clock: "SimClock | None") -> None:
        if not self.emulate or clock is None:
            return
        system = clock.system(round_index)
        names = ("up_bps", "down_bps", "fed_up_bps", "fed_down_bps")
        self.rates = LinkRates({i: {n: float(getattr(d, n)) for n in names} for i, d in enumerate(system.devices)},
                               float(system.edge_to_fed_bps), float(system.fed_to_edge_bps))
        for rank in [FED_RANK, *self.layout.device_ranks]:
            self.channel.send(self.rates, rank)

    def end_round(self, round_index: int) -> dict[str, float]:
        """Every rank checks its models and reports its measured seconds (rank 0 raises the first
        divergence a rank reports); the longest participant's seconds per stage of the round."""
        ranks = [FED_RANK, *self.layout.device_ranks]
        for rank in ranks:
            self.channel.send(RoundEnd(round_index), rank)
        for _, envelope in sorted(self.channel.recv_many(ranks), key=lambda r: r[0]):
            report: Report = envelope.msg
            self.ledger.merge(report.seconds)
        summary = self.ledger.summary()
        self.ledger.take()
        return summary

