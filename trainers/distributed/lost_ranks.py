"""Rank 0's device ranks out of the run (partial participation: ``Strategy.allows_absence``) and their return as new
processes: one part of :class:`trainers.distributed.network.RankNetwork` (its base class; docs/mqtt.md "Churn").

A device rank that died or stayed silent past ``--rank-timeout`` is taken out of the run where the algorithm allows
absence (:meth:`LostRanks._may_lose`): its devices become absent, nothing more is sent to it or awaited from it. A
new process of it that asks (:class:`~trainers.distributed.control.Rejoin`) is set up again and taken back
(:meth:`LostRanks.readmit`). A network that follows another (a change of model) keeps the previous one's lost ranks
out (:meth:`LostRanks._carry_lost`).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Sequence

from trainers.distributed.control import Envelope, Layout, Readmit, Rejoin, Setup
from trainers.distributed.layout import FED_RANK, SETUP_TIMEOUT_FACTOR, RankLayout
from trainers.distributed.transport import FrameChannel, PeerError


class LostRanks:
    """The lost device ranks of a run (the attributes below are the network's)."""

    channel: FrameChannel
    layout: RankLayout
    tolerant: bool
    algorithm: str
    lost: dict[int, str]
    returning: set[int]
    setting_up: dict[int, float]
    _setups: dict[int, Setup]
    last_step: dict[int, int]

    def _carry_lost(self, previous: "LostRanks") -> None:
        """The device ranks ``previous`` took out of the run stay out; a new process of one is taken back as there
        (:meth:`readmit`, with this network's set-up), except one that was setting up with the previous model's,
        which stays out."""
        self.lost, self.returning = dict(previous.lost), set(previous.returning)
        for rank in previous.setting_up:
            print(f"adaptplan train: rank {rank} ({self.layout.describe(rank)}) was setting up again when "
                  f"{previous.algorithm} moved to another model; it stays out of the run", file=sys.stderr, flush=True)

    def absent_devices(self) -> set[int]:
        return {d for rank in self.lost for d in self.layout.devices_of(rank)}

    def _may_lose(self, exc: PeerError) -> bool:
        """Take the device rank ``exc`` names out of the run if the algorithm allows absence; False
        (the caller raises) for the fed server's rank or any other algorithm."""
        if not self.tolerant or exc.rank not in self.layout.device_ranks:
            return False
        if exc.rank not in self.lost:
            self.lost[exc.rank] = str(exc)
            self.channel.forget(exc.rank, "taken out of the run")   # (a new process of it is already kept apart)
            devices = ", ".join(map(str, self.layout.devices_of(exc.rank)))
            print(f"adaptplan train: {exc}; {self.algorithm} goes on without devices {devices} "
                  "(partial participation: they are absent from now on)", file=sys.stderr, flush=True)
        return True

    def _recv(self, rank: int, deadline: float | None = None) -> Envelope:
        """The next envelope from device rank ``rank``; a :class:`Rejoin` there means its earlier
        process died: :class:`PeerError` (the rank is noted as returning)."""
        envelope = self.channel.recv(rank, deadline=deadline)
        if isinstance(envelope.msg, Rejoin):
            self.returning.add(rank)
            raise PeerError(rank, self.layout.describe(rank), "was started again as a new process (its models are gone)")
        return envelope

    def readmit(self) -> list[int]:
        """Take back the device ranks out of the run whose new process asked to (:class:`Rejoin`),
        without holding the run up while they set up: at the first round's start after the
        :class:`Rejoin` the fed server numbers their frames anew and they are sent their set-up as at
        the start (sample positions, the initial weights, their seeds); at the first round's start
        after they reported ready their devices are returned, present again. A rank not ready within
        ``SETUP_TIMEOUT_FACTOR`` time-outs stays out of the run. (Waiting on its set-up here, rank 0
        would send the other ranks nothing for as long as the new process takes to load its data,
        and they allow rank 0 only ``IDLE_FACTOR`` time-outs: :mod:`trainers.distributed.serve`.)"""
        for rank in sorted(self.lost):
            if rank in self.setting_up or (rank not in self.returning
                                           and self.channel.take_waiting(rank, Rejoin) is None):
                continue
            self.returning.discard(rank)
            self.channel.admit(rank)
            self._send(Readmit(rank), FED_RANK)
            self.channel.send(Layout(self.layout.num_devices), rank)
            self.channel.send(self._setups[rank], rank)
            self.setting_up[rank] = time.monotonic() + SETUP_TIMEOUT_FACTOR * self.channel.timeout
        back: list[int] = []
        for rank, deadline in sorted(self.setting_up.items()):
            if not self.channel.waiting(rank) and time.monotonic() < deadline:
                continue                            # still setting up: asked again at the next round's start
            del self.setting_up[rank], self.lost[rank]
            try:
                self._recv(rank, deadline=deadline)   # at once: its reply is in, or its time is up
            except PeerError as exc:
                if exc.rank == rank and self._may_lose(exc):
                    continue
                raise
            devices = self.layout.devices_of(rank)
            for device in devices:                  # a new process numbers its steps anew
                self.last_step.pop(device, None)
            print(f"adaptplan train: rank {rank} ({self.layout.describe(rank)}) came back as a new process; "
                  f"{self.algorithm} takes devices {', '.join(map(str, devices))} back (from the global client model "
                  "where there is one, else the initial weights)", file=sys.stderr, flush=True)
            back += devices
        return back

    def _live(self, ranks: Sequence[int]) -> list[int]:
        return [r for r in ranks if r not in self.lost]

    def _send(self, msg: Any, rank: int, **kwargs: Any) -> None:
        """Send to ``rank`` unless it was taken out of the run (a send that fails may take it out)."""
        if rank in self.lost:
            return
        try:
            self.channel.send(msg, rank, **kwargs)
        except PeerError as exc:
            if not self._may_lose(exc):
                raise

    def _send_anyway(self, msg: Any, rank: int) -> None:
        """Send to ``rank`` even though it is out of the run (a new process setting up); a failure is its own."""
        try:
            self.channel.send(msg, rank)
        except PeerError:
            pass
