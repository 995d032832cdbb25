"""Simulated time (docs/architecture.md "The runtime"). The latency model of adaptplan
(:class:`adaptplan.latency.LatencyModel`, eqs. 16–25) gives every stage's seconds per device;
the simulation runtime turns them into event times (a synchronous round is a barrier, GAS is
asynchronous). Nothing here re-implements the latency model: :class:`StageTimes` only picks its
per-device terms and scales the per-sample ones to each device's batch size.
Wall-clock seconds are recorded separately by the driver.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import numpy as np

from adaptplan.latency import LatencyModel
from adaptplan.model_profile import ModelProfile
from adaptplan.system import SystemProcess, SystemSpec

STAGES = ("device FP", "uplink", "server", "downlink", "device BP", "model upload", "model download")


@dataclass(frozen=True)
class StageTimes:
    """Seconds per device for one cut vector (arrays of shape (N,)).

    ``client_fp`` (16), ``upload`` (17), ``download`` (20), ``client_bp`` (21) for the run's b,
    ``server`` device i's share of (18)+(19) (``server_backward`` its share of (19) alone), ``model_up`` (22) and
    ``model_down`` (24);
    ``edge_to_fed_bps``/``fed_to_edge_bps`` (bit/s) time the edge server's model messages from
    their real size (eqs. 23, 25 when the edge sends AdaptSFL's non-common parts); ``server_flops``
    f_s (FLOP/s) times the server work a strategy charges beyond one pass per arrival.
    """

    client_fp: np.ndarray
    upload: np.ndarray
    server: np.ndarray
    download: np.ndarray
    client_bp: np.ndarray
    model_up: np.ndarray
    model_down: np.ndarray
    edge_to_fed_bps: float
    fed_to_edge_bps: float
    batch_size: int
    server_flops: float = float("inf")
    server_backward: np.ndarray | None = None

    @classmethod
    def zeros(cls, num_devices: int, batch_size: int) -> "StageTimes":
        z = np.zeros(num_devices)
        return cls(z, z, z, z, z, z, z, float("inf"), float("inf"), batch_size, server_backward=z)

    def scale(self, device: int, batch_size: int) -> float:
        """b_i / b: per-sample terms scale with the device's own batch size."""
        return batch_size / self.batch_size

    def extra_server_seconds(self, samples: dict[int, float], flops: float,
                             backward: dict[int, float] | None = None) -> float:
        """Seconds of server work a strategy does beyond one forward+backward per arrival
        (:meth:`trainers.api.RoundContext.charge_server`): ``samples[d]`` more forward+backward passes of
        one sample through device d's server blocks, each (18)+(19) per sample = ``server[d] / b``,
        ``backward[d]`` more backward passes, each (19) per sample = ``server_backward[d] / b``, plus
        ``flops`` FLOPs outside the model (2 per multiply–add) at the server's FLOP/s f_s."""
        per_sample = sum(float(n) * float(self.server[d]) / self.batch_size for d, n in samples.items())
        if backward:
            assert self.server_backward is not None, "these stage times have no backward share"
            per_sample += sum(float(n) * float(self.server_backward[d]) / self.batch_size for d, n in backward.items())
        return per_sample + (float(flops) / self.server_flops if flops else 0.0)

    def edge_up_seconds(self, bits: float) -> float:
        return bits / self.edge_to_fed_bps

    def edge_down_seconds(self, bits: float) -> float:
        return bits / self.fed_to_edge_bps


class SimClock:
    """Latency terms per round: ``stage_times(t, cuts)`` under ``process.state(t)`` (per-round
    re-drawn resources when ``process.redraw``). The system's batch size is overridden by the
    run's b so the latency matches what is trained. ``seconds`` is the simulated time so far."""

    def __init__(self, profile: ModelProfile, process: SystemProcess, batch_size: int) -> None:
        self.profile = profile
        self.process = process
        self.batch_size = batch_size
        self.seconds = 0.0
        self._cache: tuple[int, LatencyModel] | None = None

    def system(self, round_index: int) -> SystemSpec:
        state = self.process.state(round_index)
        return state if state.batch_size == self.batch_size else replace(state, batch_size=self.batch_size)

    def latency_model(self, round_index: int) -> LatencyModel:
        key = round_index if self.process.redraw else 0
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, LatencyModel(self.profile, self.system(round_index)))
        return self._cache[1]

    def stage_times(self, round_index: int, cuts: Sequence[int]) -> StageTimes:
        """Every device's stage seconds in round ``round_index`` for the 1-based ``cuts``."""
        lm = self.latency_model(round_index)
        b = lm.breakdown(cuts)
        j = np.asarray(cuts, dtype=int) - 1
        system = lm.system
        return StageTimes(b.client_fp, b.upload, lm.server_per_device[j], b.download, b.client_bp, b.model_up,
                          b.model_down, float(system.edge_to_fed_bps), float(system.fed_to_edge_bps), self.batch_size,
                          float(system.server_flops), lm.server_bp_per_device[j])


def stage_maxima(by_role: Mapping[str, Mapping[Any, float]]) -> dict[str, float]:
    """Per stage, the longest role's seconds: a round's stage seconds from its seconds per stage and role."""
    return {stage: max(seconds.values()) for stage, seconds in by_role.items() if seconds}


class StageLedger:
    """Seconds each role (a device index or ``"edge"``) spent in each stage of :data:`STAGES` during one round, the
    simulated ones (the engine's) or the measured ones (a runtime of processes merges every rank's report);
    :meth:`summary` is the round's per-stage maximum over the roles (``RoundStats.stage_seconds``)."""

    def __init__(self) -> None:
        self.seconds: dict[str, dict[int | str, float]] = {s: {} for s in STAGES}

    def add(self, who: int | str, stage: str, seconds: float) -> None:
        self.seconds[stage][who] = self.seconds[stage].get(who, 0.0) + max(0.0, float(seconds))

    def merge(self, other: dict[str, dict[Any, float]]) -> None:
        for stage, by_who in other.items():
            for who, seconds in by_who.items():
                self.add(who, stage, seconds)

    def summary(self) -> dict[str, float]:
        return stage_maxima(self.seconds)

    def by_role(self) -> dict[str, dict[str, float]]:
        """{stage: {role: seconds}} with the roles as text (``"3"``, ``"edge"``), as history.json keeps them."""
        return {s: {str(who): v for who, v in by_who.items()} for s, by_who in self.seconds.items() if by_who}

    def take(self) -> dict[str, dict[int | str, float]]:
        """The round's seconds, the ledger emptied for the next round."""
        out = {s: dict(v) for s, v in self.seconds.items() if v}
        self.seconds = {s: {} for s in STAGES}
        return out
