"""The simulated clock (DESIGN.md "Time"): charges each round the latency model's seconds for the
cuts in force and that round's system state. The latency is computed only by
:class:`adaptplan.latency.LatencyModel` (eqs. 16–26); strategies compose its terms
(``Strategy.round_seconds``). Wall-clock seconds are recorded separately by the driver.
"""

from __future__ import annotations

from dataclasses import replace

from adaptplan.latency import LatencyBreakdown, LatencyModel
from adaptplan.model_profile import ModelProfile
from adaptplan.system import SystemProcess, SystemSpec


class SimClock:
    """Simulated seconds of a run. ``charge(t, cuts, aggregated, strategy)`` adds round t's cost
    under ``process.state(t)`` (per-round re-drawn resources when ``process.redraw``). The batch
    size of the system is overridden by the run's b so the latency matches what is trained."""

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

    def breakdown(self, round_index: int, cuts: list[int]) -> LatencyBreakdown:
        return self.latency_model(round_index).breakdown(cuts)

    def charge(self, round_index: int, cuts: list[int], aggregated: bool, strategy) -> float:
        """Add and return round ``round_index``'s simulated seconds."""
        seconds = float(strategy.round_seconds(self.breakdown(round_index, cuts), aggregated))
        self.seconds += seconds
        return seconds

