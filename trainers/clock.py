"""The simulated clock (DESIGN.md "Time"): charges each round the latency model's seconds for the
cuts in force and that round's system state. The latency is computed only by
:class:`adaptplan.latency.LatencyModel` (eqs. 16–26); strategies compose its terms
(``Strategy.round_seconds``). Wall-clock seconds are recorded separately by the driver.

Also :func:`sequential_profile`, the fallback ModelProfile of an ``nn.Sequential`` chain for when
``profilers.profile_model`` is unavailable: per-block FLOPs counted from Conv2d/Linear shapes
(2 FLOPs per multiply–add, BP = 2 × FP), activation/gradient bits at 32 bits per value,
client-parameter bits cumulative.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from adaptplan.latency import LatencyBreakdown, LatencyModel
from adaptplan.model_profile import CutPoint, ModelProfile
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


def sequential_profile(chain: nn.Sequential, input_shape: tuple[int, ...], name: str = "model",
                       bits_per_value: int = 32) -> ModelProfile:
    """A ModelProfile with one cut point per block of ``chain`` (see the module docstring)."""
    flops = [0.0]

    def hook(module: nn.Module, inputs, output) -> None:
        if isinstance(module, nn.Conv2d):
            k = module.kernel_size[0] * module.kernel_size[1] * module.in_channels // module.groups
            flops[0] += 2.0 * k * output.numel()
        elif isinstance(module, nn.Linear):
            flops[0] += 2.0 * module.in_features * module.out_features * (output.numel() // module.out_features)
        elif len(list(module.children())) == 0:
            flops[0] += float(output.numel())

    handles = [m.register_forward_hook(hook) for m in chain.modules() if len(list(m.children())) == 0]
    cuts, fp, params = [], 0.0, 0
    try:
        with torch.no_grad():
            h = torch.zeros(1, *input_shape)
            for j, block in enumerate(chain):
                flops[0] = 0.0
                h = block(h)
                fp += flops[0]
                params += sum(p.numel() for p in block.parameters())
                bits = float(h.numel() * bits_per_value)
                cuts.append(CutPoint(index=j + 1, name=str(j), fp_flops=fp, bp_flops=2 * fp, activation_bits=bits,
                                     gradient_bits=bits, client_param_bits=float(params * bits_per_value)))
    finally:
        for handle in handles:
            handle.remove()
    return ModelProfile(model=name, input_shape=tuple(input_shape), bits_per_value=bits_per_value, cut_points=tuple(cuts))
