"""Engine benchmark: samples/s of simulated SFL (20 devices) vs centralized training of the same
model on the same samples in the same process.

Both sides train the CIFAR-10 CNN of :mod:`trainers.models` on random CIFAR-shaped tensors with
SGD. SFL: ``rounds`` rounds of the engine on the chain ``adaptplan train`` uses
(``profilers.build_chain``: 5 cut points; default cut 1 = conv1 on the device), every device one
mini-batch of b samples; the algorithm's real client/server split with message exchange, devices
batched at shared server blocks. Centralized: the same number of samples, either as ``devices``
SGD steps of b samples per round (``central_b``: the same per-step batch as each device) or one
step of N·b samples per round (``central_Nb``: the same samples per optimizer step as the shared
server part). Reported ratio = SFL samples/s ÷ centralized samples/s (goal ≥ 0.8).

The three measurements are interleaved ``repeats`` times and each side keeps its best (highest
samples/s) repeat, so a burst of load from other processes does not decide the ratio.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class EngineBenchResult:
    """Throughputs in samples per wall-clock second and their ratios."""

    algorithm: str
    devices: int
    batch_size: int
    cut: int
    rounds: int
    repeats: int
    threads: int
    sfl_samples_per_s: float
    central_b_samples_per_s: float
    central_nb_samples_per_s: float

    @property
    def ratio_b(self) -> float:
        return self.sfl_samples_per_s / self.central_b_samples_per_s

    @property
    def ratio_nb(self) -> float:
        return self.sfl_samples_per_s / self.central_nb_samples_per_s

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ratio_vs_central_b": self.ratio_b, "ratio_vs_central_Nb": self.ratio_nb}

    def report(self) -> str:
        return (f"{self.algorithm}, {self.devices} devices, b = {self.batch_size}, cut {self.cut}, {self.rounds} rounds, "
                f"best of {self.repeats}, {self.threads} threads\n"
                f"  SFL (simulated)           {self.sfl_samples_per_s:10.1f} samples/s\n"
                f"  centralized, batch b      {self.central_b_samples_per_s:10.1f} samples/s   ratio {self.ratio_b:.2f}\n"
                f"  centralized, batch N·b    {self.central_nb_samples_per_s:10.1f} samples/s   ratio {self.ratio_nb:.2f}")


def header(devices: int, batch_size: int, rounds: int, algorithm: str, repeats: int) -> str:
    """One line saying what is timed, printed before the (minute-long) measurement starts."""
    return (f"bench engine: wall-clock samples/s of {rounds} rounds of simulated {algorithm} split training "
            f"({devices} devices x {batch_size} samples, CIFAR-10 CNN cut after conv1) vs centralized training of "
            f"the same model on the same samples (batch {batch_size} and {devices}x{batch_size}); "
            f"best of {repeats} interleaved repeats")


def run_engine_bench(devices: int = 20, batch_size: int = 16, rounds: int = 10, cut: int = 1, algorithm: str = "adaptsfl",
                     width: int = 32, threads: int | None = None, warmup: int = 2, repeats: int = 3,
                     seed: int = 0) -> EngineBenchResult:
    """Measure and return an :class:`EngineBenchResult` (see the module docstring)."""
    from profilers import build_chain
    from trainers.engine import DeviceData, SplitEngine
    from trainers.models import cnn
    from trainers.partition import partition_indices
    from trainers.strategies import make_strategy

    if threads:
        torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(seed)
    n = devices * batch_size * (rounds + warmup)
    x = torch.randn(n, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    parts = partition_indices(y.numpy(), devices, "iid", seed)
    total = devices * batch_size * rounds

    def sfl() -> float:
        torch.manual_seed(seed)
        chain = build_chain(cnn(3, 32, 10, width), x[:2])
        engine = SplitEngine(chain.blocks, [cut] * devices, make_strategy(algorithm), DeviceData(x, y, x[:1], y[:1], parts),
                             {"lr": 0.01}, batch_size, seed=seed)
        for t in range(1, warmup + 1):
            engine.run_round(t)
        start = time.perf_counter()
        for t in range(warmup + 1, warmup + rounds + 1):
            engine.run_round(t)
        return total / (time.perf_counter() - start)

    def central(step_batch: int) -> float:
        torch.manual_seed(seed)
        net = cnn(3, 32, 10, width)
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        begin = None
        for k, s in enumerate(range(0, total + warmup * step_batch, step_batch)):
            if k == warmup:
                begin = time.perf_counter()
            xb, yb = x[s % n:s % n + step_batch], y[s % n:s % n + step_batch]
            loss = nn.functional.cross_entropy(net(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return total / (time.perf_counter() - begin)

    best = [0.0, 0.0, 0.0]
    for _ in range(repeats):
        for k, measure in enumerate((sfl, lambda: central(batch_size), lambda: central(devices * batch_size))):
            best[k] = max(best[k], measure())
    return EngineBenchResult(algorithm, devices, batch_size, cut, rounds, repeats, torch.get_num_threads(), *best)


if __name__ == "__main__":  # pragma: no cover
    print(run_engine_bench().report())
