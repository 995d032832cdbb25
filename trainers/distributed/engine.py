"""The torch.distributed runtime's round loop, on the edge rank.

:class:`DistributedEngine` is the simulation runtime (:class:`trainers.engine.SplitEngine`) with
its devices and fed server on other ranks (:mod:`trainers.distributed.remote`): the same round
loop, strategy calls, aggregation and re-partition code run unchanged, so a distributed run makes
the same decisions and computes the same numbers as the simulated one. What differs:

* a group's client forwards are started on every device rank at once and their activations taken
  in as they arrive (:meth:`_forward_all`); replies are sent without waiting (:meth:`_backward_all`);
* the round ends when every rank has reported (:meth:`check_models_finite`: each device rank checks
  its own blocks and sends the seconds it measured);
* every round's record carries the measured seconds per stage next to the latency model's
  (``measured_stage_seconds``, ``measured_round_seconds``).
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np
import torch

from trainers.distributed.layout import FED_RANK, SETUP_TIMEOUT_FACTOR
from trainers.distributed.remote import Hub, RemoteBlockState, RemoteDevice, RemoteFed
from trainers.engine import DeviceData, RoundStats, SplitEngine
from trainers.messages import Activation, ModelDownload, NonFiniteError


class DistributedEngine(SplitEngine):
    """SplitEngine whose devices and fed server are remote; ``hub`` connects to them."""

    def __init__(self, *args: Any, hub: Hub, **kwargs: Any) -> None:
        self.hub = hub
        self._last_measured: dict[str, float] = {}
        super().__init__(*args, **kwargs)

    # ---- construction: the device ranks build their devices themselves -------------------------------------
    def _make_devices(self, chain, data: DeviceData, batch_size: int, seed: int, optimizer) -> list[RemoteDevice]:
        """Each device rank loads the data set and builds the chain's architecture itself
        (:func:`trainers.distributed.workers.local_chain`); it is sent the chain's initial weights
        and, per device it hosts, the positions of that device's samples in the data set (not the
        samples), its cut, sampler seed and optimizer."""
        source = dict(self.hub.source, num_train=int(data.x_train.shape[0]), num_classes=int(self.num_classes))
        initial = [{k: v.detach().cpu().clone() for k, v in block.state_dict().items()} for block in chain]
        by_rank: dict[int, dict[int, dict[str, Any]]] = {}
        for i, part in enumerate(data.parts):
            by_rank.setdefault(self.hub.layout.rank_of(i), {})[i] = {
                "cut": self.cuts[i], "positions": torch.as_tensor(np.asarray(part), dtype=torch.long),
                "batch_size": batch_size, "seed": [seed, i], "optimizer": optimizer}
        for rank, devices in by_rank.items():
            self.hub.command(rank, "setup", source=source, initial=initial, devices=devices)
        setup_wait = SETUP_TIMEOUT_FACTOR * self.hub.channel.timeout      # first use of torch on a busy machine
        self.hub.channel.recv_many(list(by_rank), timeout=setup_wait)
        return [RemoteDevice(self.hub, i, self.cuts[i]) for i in range(len(data.parts))]

    def _make_fed(self) -> RemoteFed:
        return RemoteFed(self.hub)

    # ---- a round ----------------------------------------------------------------------------------------------
    def run_round(self, round_index: int) -> RoundStats:
        self.hub.system = self.clock.system(round_index) if self.clock is not None else None
        start = time.time()
        stats = super().run_round(round_index)
        stats.measured_round_seconds = time.time() - start
        stats.measured_stage_seconds = self._last_measured
        return stats

    def _forward_all(self, round_index: int, group: Sequence[int], batch: dict[int, int]) -> dict[int, Activation]:
        by_rank: dict[int, list[tuple[int, int]]] = {}
        for d in group:
            by_rank.setdefault(self.devices[d].rank, []).append((d, batch[d]))
        for rank, items in by_rank.items():
            rates = {d: self.hub.rate(d, "up_bps") for d, _ in items}
            self.hub.command(rank, "forward", round=round_index, items=items, rates=rates)
        out = {}
        for _, envelope in self.hub.channel.recv_many([self.devices[d].rank for d in group]):
            d = envelope["device"]
            out[d] = self.devices[d].receive_activation(envelope)
        return {d: out[d] for d in group}

    def check_models_finite(self, round_index: int) -> None:
        """The round's end: every device rank and the fed server report (finiteness of the device
        models, measured seconds); then the edge server's own blocks are checked here."""
        ranks = [FED_RANK] + self.hub.layout.device_ranks
        for rank in ranks:
            self.hub.command(rank, "report", round=round_index)
        first_error = None
        for _, reply in sorted(self.hub.channel.recv_many(ranks), key=lambda r: r[0]):
            self.hub.measured.merge(reply["seconds"])
            if reply.get("nonfinite") and first_error is None:
                first_error = reply["nonfinite"]
        self._last_measured = self.hub.measured.summary()
        self.hub.measured.take()
        if first_error is not None:
            raise NonFiniteError(first_error)
        self._check_edge_finite(round_index)

    def _deliver_to_edge(self, msgs: list[ModelDownload]) -> None:
        """One transfer of the averaged blocks from the fed server, emulated (``--emulate-links``)
        as the latency model charges it: one copy per device's instance (eq. 25)."""
        refs = [b for m in msgs for b in m.blocks.values() if isinstance(b, RemoteBlockState) and not b.fetched]
        if refs:
            self.hub.fetch(list(dict.fromkeys(r.ref for r in refs)), charged_bytes=sum(m.num_bytes for m in msgs))
        super()._deliver_to_edge(msgs)
