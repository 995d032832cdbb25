"""Engine benchmark: samples/s of simulated split training (20 devices) vs centralized training of
the same model on the same samples, in the same process and on the same device.

Both sides train one model (the CIFAR-10 CNN of :mod:`trainers.models` by default; any ``--model``
of ``adaptplan train``) on random CIFAR-shaped tensors with SGD, on ``--device`` (the CPU or a
CUDA GPU). Split training: ``rounds`` rounds of the engine, per algorithm, on the chain ``adaptplan
train`` uses (``profilers.build_chain``; default cut 1 = the first parameterised block on the
device), every device one mini-batch of b samples; the algorithm's real client/server split with
message exchange, devices concatenated at shared server blocks, and the devices' client passes
batched or not (``client_batching``; trainers.batching). Centralized: the same number of samples,
either as ``devices`` SGD steps of b samples per round (``central_b``: the same per-step batch as
each device) or one step of N·b samples per round (``central_Nb``: the same samples per optimizer
step as the shared server part). Reported ratio = split samples/s ÷ centralized samples/s (goal ≥ 0.8).

The measurements are interleaved ``repeats`` times and each side keeps its best (highest
samples/s) repeat, so a burst of load from other processes does not decide the ratio. On CUDA the
clock is read after ``torch.cuda.synchronize`` and each side's peak GPU memory is
``torch.cuda.max_memory_allocated`` above what was allocated before it started (the input data);
on a CPU memory is not measured per side: the report gives the process's peak resident set
(``ru_maxrss``) instead, labelled as such.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import nn

INPUT_SHAPE = (3, 32, 32)
NUM_CLASSES = 10


@dataclass(frozen=True)
class EngineBenchResult:
    """Throughputs in samples per wall-clock second, their ratios, and peak memory in bytes."""

    algorithms: tuple[str, ...]
    model: str
    device: str
    client_batching: str
    devices: int
    batch_size: int
    cut: int
    rounds: int
    repeats: int
    threads: int
    sfl_samples_per_s: dict[str, float]
    central_b_samples_per_s: float
    central_nb_samples_per_s: float
    peak_memory_bytes: dict[str, int] = field(default_factory=dict)   # per side, CUDA only
    process_peak_rss_bytes: int | None = None                          # CPU: the whole process's high-water mark
    per_device_cuts: dict[str, str] = field(default_factory=dict)      # algorithm → why its client passes were not batched

    def ratio_b(self, algorithm: str | None = None) -> float:
        return self.sfl_samples_per_s[algorithm or self.algorithms[0]] / self.central_b_samples_per_s

    def ratio_nb(self, algorithm: str | None = None) -> float:
        return self.sfl_samples_per_s[algorithm or self.algorithms[0]] / self.central_nb_samples_per_s

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["algorithms"] = list(self.algorithms)
        data["ratio_vs_central_b"] = {a: self.ratio_b(a) for a in self.algorithms}
        data["ratio_vs_central_Nb"] = {a: self.ratio_nb(a) for a in self.algorithms}
        return data

    def report(self) -> str:
        def memory(side: str) -> str:
            value = self.peak_memory_bytes.get(side)
            return f"{value / 2**20:9.1f} MiB" if value is not None else f"{'-':>13}"

        lines = [f"{self.model} on {self.device}, {self.devices} devices, b = {self.batch_size}, cut {self.cut}, "
                 f"client batching {self.client_batching}, {self.rounds} rounds, best of {self.repeats}, "
                 f"{self.threads} threads",
                 f"  {'':<26} {'samples/s':>10} {'× central b':>12} {'× central N·b':>14} {'peak memory':>13}"]
        for a in self.algorithms:
            lines.append(f"  {a + ' (simulated)':<26} {self.sfl_samples_per_s[a]:10.1f} {self.ratio_b(a):12.2f} "
                         f"{self.ratio_nb(a):14.2f} {memory(a)}")
        lines.append(f"  {'centralized, batch b':<26} {self.central_b_samples_per_s:10.1f} {'':>12} {'':>14} "
                     f"{memory('central_b')}")
        lines.append(f"  {'centralized, batch N·b':<26} {self.central_nb_samples_per_s:10.1f} {'':>12} {'':>14} "
                     f"{memory('central_Nb')}")
        if self.peak_memory_bytes:
            lines.append("  peak memory: torch.cuda.max_memory_allocated of each side, above the input data")
        else:
            rss = f"{self.process_peak_rss_bytes / 2**20:.0f} MiB" if self.process_peak_rss_bytes else "unknown"
            lines.append(f"  peak memory: not measured per side on a CPU; the whole process's peak resident set "
                         f"(ru_maxrss) was {rss}")
        for a, why in self.per_device_cuts.items():
            lines.append(f"  {a}: client passes ran per device ({why})")
        return "\n".join(lines)


def header(devices: int, batch_size: int, rounds: int, algorithms: Sequence[str], repeats: int, model: str = "cnn",
           device: str = "cpu", cut: int = 1) -> str:
    """One line saying what is timed, printed before the (minute-long) measurement starts."""
    return (f"bench engine: wall-clock samples/s of {rounds} rounds of simulated {', '.join(algorithms)} split training "
            f"({devices} devices x {batch_size} samples, {model} cut {cut}) vs centralized training of the same model "
            f"on the same samples (batch {batch_size} and {devices}x{batch_size}) on {device}; best of {repeats} "
            f"interleaved repeats")


def _peak_rss_bytes() -> int | None:
    try:
        import resource
        import sys
    except ImportError:  # pragma: no cover  (not on Windows)
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)     # bytes on macOS, KiB on Linux


def run_engine_bench(devices: int = 20, batch_size: int = 16, rounds: int = 10, cut: int = 1,
                     algorithm: str | Sequence[str] = "adaptsfl", width: int = 32, threads: int | None = None,
                     warmup: int = 2, repeats: int = 3, seed: int = 0, model: str = "cnn",
                     device: torch.device | str = "cpu", client_batching: str = "auto") -> EngineBenchResult:
    """Measure and return an :class:`EngineBenchResult` (see the module docstring)."""
    from adaptplan.errors import InputError
    from profilers import build_chain
    from trainers.batching import use_batching
    from trainers.devices import describe, synchronize
    from trainers.engine import DeviceData, SplitEngine
    from trainers.models import build_model
    from trainers.partition import partition_indices
    from trainers.strategies import make_strategy

    algorithms = (algorithm,) if isinstance(algorithm, str) else tuple(algorithm)
    device = torch.device(device)
    if threads:
        torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(seed)
    n = devices * batch_size * (rounds + warmup)
    x = torch.randn(n, *INPUT_SHAPE, generator=g)
    y = torch.randint(0, NUM_CLASSES, (n,), generator=g)
    parts = partition_indices(y.numpy(), devices, "iid", seed)
    x, y = x.to(device), y.to(device)
    total = devices * batch_size * rounds

    def fresh_model() -> nn.Module:
        torch.manual_seed(seed)
        return build_model(model, INPUT_SHAPE, NUM_CLASSES, width)

    blocks = build_chain(fresh_model(), x[:2].cpu()).blocks
    if not 1 <= cut <= len(blocks):
        raise InputError(f"{model} has {len(blocks)} cut points; the cut must be in 1..{len(blocks)}, got {cut}",
                         field="--cut")
    per_device: dict[str, str] = {}

    def sfl(name: str) -> float:
        chain = build_chain(fresh_model(), x[:2].cpu())
        engine = SplitEngine(chain.blocks, [cut] * devices, make_strategy(name), DeviceData(x, y, x[:1], y[:1], parts),
                             {"lr": 0.01}, batch_size, seed=seed, device=device, client_batching=client_batching)
        for t in range(1, warmup + 1):
            engine.run_round(t)
        synchronize(device)
        start = time.perf_counter()
        for t in range(warmup + 1, warmup + rounds + 1):
            engine.run_round(t)
        synchronize(device)
        seconds = time.perf_counter() - start
        if engine.batcher is not None and engine.batcher.reasons.get(cut):
            per_device[name] = str(engine.batcher.reasons[cut])
        elif engine.batcher is not None and cut not in engine.batcher.reasons:
            per_device[name] = "the algorithm runs one device at a time"
        return total / seconds

    def central(step_batch: int) -> float:
        net = fresh_model().to(device)
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        begin = 0.0
        for k, s in enumerate(range(0, total + warmup * step_batch, step_batch)):
            if k == warmup:
                synchronize(device)
                begin = time.perf_counter()
            xb, yb = x[s % n:s % n + step_batch], y[s % n:s % n + step_batch]
            loss = nn.functional.cross_entropy(net(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        synchronize(device)
        return total / (time.perf_counter() - begin)

    sides: dict[str, Callable[[], float]] = {a: (lambda a=a: sfl(a)) for a in algorithms}
    sides["central_b"] = lambda: central(batch_size)
    sides["central_Nb"] = lambda: central(devices * batch_size)
    best = {side: 0.0 for side in sides}
    peak: dict[str, int] = {}
    for _ in range(repeats):
        for side, measure in sides.items():
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
                before = torch.cuda.memory_allocated(device)
            best[side] = max(best[side], measure())
            if device.type == "cuda":
                peak[side] = max(peak.get(side, 0), torch.cuda.max_memory_allocated(device) - before)
    batching = use_batching(client_batching, device)
    return EngineBenchResult(algorithms, model, describe(device),
                             f"{'on' if batching else 'off'}" + (" (auto)" if client_batching == "auto" else ""),
                             devices, batch_size, cut, rounds, repeats, torch.get_num_threads(),
                             {a: best[a] for a in algorithms}, best["central_b"], best["central_Nb"], peak,
                             None if device.type == "cuda" else _peak_rss_bytes(), per_device)


if __name__ == "__main__":  # pragma: no cover
    print(run_engine_bench().report())
