"""Engine benchmark: samples/s of simulated split training vs centralized training of the same
model on the same samples, in the same process and on the same device, with each side's peak memory.

Both sides train one model (the CIFAR-10 CNN of :mod:`trainers.inputs.models` by default; any ``--model``
of ``adaptplan train``) on random CIFAR-shaped tensors (two mini-batches per device, cycled) with
SGD, on ``--device`` (the CPU or a CUDA GPU). Split training: ``rounds`` rounds of the engine, per
algorithm, on the chain ``adaptplan train`` uses (``profilers.build_chain``; default cut 1 = the
first parameterised block on the device), with the algorithm's real client/server split and message
exchange, devices concatenated at shared server blocks, the devices' client passes batched or not
(``client_batching``; trainers.roles.batching), recomputed or held (``client_recompute``) and the server's
barrier passes chunked (``server_pass_samples``). Its samples are the ones the devices' activation
messages carried (``RoundStats.samples``: the participants' steps — GAS's active devices, a
sampled fraction's). Centralized: ``devices`` SGD steps of b samples per round (``central_b``), or
one step of N·b samples per round (``central_Nb``; not run above :data:`CENTRAL_NB_LIMIT` samples,
whose activations alone would fill the machine). Reported ratio = split samples/s ÷ centralized
samples/s (goal ≥ 0.8), side by side (below).

A third reference, ``split_b``, is the same split written by hand in plain PyTorch (:data:`HAND_SPLIT`): what
splitting the model costs by itself, with no engine. Its ratio to centralized batch b is the price of the cut
(two autograd calls and two optimizer steps per mini-batch instead of one, the detach at the cut); an
algorithm's samples/s over it (``× split b``) is what the engine keeps of a hand-written loop — below 1 by the
engine's own work (messages, checks, scheduling, aggregation) and by the algorithm's arithmetic beyond a plain
split step (SCALA's second backward, GAS's generated activations, GAPSL's per-device gradients).

The measurements are interleaved ``repeats`` times. Each side's samples/s is its best (highest) repeat, so a
burst of load from other processes does not decide it; each ratio is the median over the repeats of the two
sides' samples/s measured in the same repeat (seconds apart), so that neither does a machine whose speed drifts
over minutes (measured: centralized batch b at 1,927 and 2,250 samples/s in two runs a minute apart on the idle
2-core machine) — a ratio of two bests would pair one side's fast minute with the other's slow one. The report
gives the lowest and highest of those per-repeat ratios beside each median (× central b), so that a gap can be told
from the machine's drift. Peak memory
per side: on CUDA ``torch.cuda.max_memory_allocated`` above what was allocated before the side
started (the input data); on Linux CPUs the resident set's high-water mark (``VmHWM``, reset
through ``/proc/self/clear_refs`` before the side, freed memory handed back with ``malloc_trim``)
above the resident set when the side started — what the side itself added, not the interpreter,
torch or the input data; elsewhere the whole process's peak resident set (``ru_maxrss``).
:func:`run_engine_sweep` repeats the measurement over several device counts and plots seconds
per round and memory against N.
"""

from __future__ import annotations

import copy
import functools
import math
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch
from torch import nn

from trainers.config.train_config import ExecutionConfig

if TYPE_CHECKING:  # pragma: no cover
    from trainers.engine.execution import Execution

INPUT_SHAPE = (3, 32, 32)
NUM_CLASSES = 10
BATCHES_PER_DEVICE = 2
"""Random mini-batches of data per device (cycled by its sampler), so the input data grows with N only."""
CENTRAL_NB_LIMIT = 8192
"""Largest N·b for the centralized one-step-of-N·b side (beyond it its activations alone take GiBs)."""

CLOCKS = {
    "zero": "zero-time clock (every stage 0 s: arrivals in device order)",
    "system": "the generated system's clock (arrivals in the order of its latency model)",
}
"""``--clock``: the stage times the simulated runs see. They decide the order of arrivals only (the wall-clock
throughput measured is the engine's), and so what may share a server pass: under the zero-time clock GAS's
first active slot wins every tie, so its devices run their local steps one device after another, one arrival
at a time; under the system's clock its active devices interleave, as in training."""

HAND_SPLIT = ("one client model per device and one server model, in plain PyTorch; per mini-batch of b: the "
              "device's forward, detach at the cut, the server's forward, loss, backward and SGD step, the device's "
              "backward from the cut gradient and SGD step; devices one after another")
"""What the ``split_b`` side runs (the module docstring)."""

MEMORY_NOTES = {
    "cuda": "torch.cuda.max_memory_allocated of each side, above the input data",
    "rss": "the resident set's peak during each side (VmHWM) above the resident set when it started",
}


class HandSplit:
    """:data:`HAND_SPLIT`: ``blocks`` cut after block ``cut``, a copy of the client blocks per device, one server
    model, each with plain SGD at ``lr`` (the reference the engine's algorithms are measured against)."""

    def __init__(self, blocks: nn.Sequential | Sequence[nn.Module], cut: int, devices: int, lr: float,
                 device: torch.device | str = "cpu") -> None:
        self.server = nn.Sequential(*blocks[cut:]).to(device)
        self.clients = [copy.deepcopy(nn.Sequential(*blocks[:cut])).to(device) for _ in range(devices)]
        self.server_opt = self._sgd(self.server, lr)
        self.client_opts = [self._sgd(c, lr) for c in self.clients]

    @staticmethod
    def _sgd(module: nn.Module, lr: float) -> torch.optim.Optimizer | None:
        params = [p for p in module.parameters() if p.requires_grad]
        return torch.optim.SGD(params, lr=lr) if params else None

    def step(self, device: int, x: torch.Tensor, y: torch.Tensor) -> None:
        """Device ``device`` trains on the mini-batch (x, y) with the server: both step with their gradients of the
        mean cross-entropy."""
        h = self.clients[device](x)
        cut_input = h.detach().requires_grad_()
        loss = nn.functional.cross_entropy(self.server(cut_input), y)
        opts = [opt for opt in (self.server_opt, self.client_opts[device]) if opt is not None]
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        loss.backward()
        if h.requires_grad:
            h.backward(cut_input.grad)
        for opt in opts:
            opt.step()

    def model(self, device: int) -> nn.Sequential:
        """Device ``device``'s client blocks followed by the server's: its whole model."""
        return nn.Sequential(*self.clients[device], *self.server)


@dataclass(frozen=True)
class EngineBenchResult:
    """Throughputs in samples per wall-clock second, their ratios, seconds per simulated round and
    peak memory in bytes per side (``memory_measure``: ``"cuda"``, ``"rss"`` or ``""`` = not per side)."""

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
    central_nb_samples_per_s: float | None
    peak_memory_bytes: dict[str, int] = field(default_factory=dict)   # per side
    process_peak_rss_bytes: int | None = None                          # the whole process's high-water mark
    per_device_cuts: dict[str, str] = field(default_factory=dict)      # algorithm → why its client passes were not batched
    sfl_seconds_per_round: dict[str, float] = field(default_factory=dict)
    memory_measure: str = ""
    client_recompute: str = "auto"
    server_pass_samples: int | None = None
    flops_per_sample: dict[str, float] = field(default_factory=dict)   # side → counted FLOPs per trained sample
    clock: str = "zero"                # the simulated clock's stage times: "zero" (every stage 0 s) or "system"
    split_b_samples_per_s: float | None = None   # the hand-written split (HAND_SPLIT); None: not measured
    repeat_samples_per_s: dict[str, list[float]] = field(default_factory=dict)   # side → samples/s of each repeat

    def side_ratio(self, side: str, reference: str) -> float | None:
        """``side``'s samples/s over ``reference``'s (side names: an algorithm, ``split_b``, ``central_b``,
        ``central_Nb``): the median over the repeats of the two measured in the same repeat, or the ratio of their
        bests where the repeats were not kept; None where either side was not measured."""
        paired = self.paired_ratios(side, reference)
        if paired:
            return statistics.median(paired)
        best = {**self.sfl_samples_per_s, "split_b": self.split_b_samples_per_s,
                "central_b": self.central_b_samples_per_s, "central_Nb": self.central_nb_samples_per_s}
        top, bottom = best.get(side), best.get(reference)
        return top / bottom if top and bottom else None

    def paired_ratios(self, side: str, reference: str) -> list[float] | None:
        """``side``'s samples/s over ``reference``'s in each repeat (the two measured seconds apart), in the repeats'
        order; None where the repeats were not kept for both."""
        mine, theirs = self.repeat_samples_per_s.get(side), self.repeat_samples_per_s.get(reference)
        if mine and theirs and len(mine) == len(theirs):
            return [m / t for m, t in zip(mine, theirs)]
        return None

    def ratio_b_range(self, algorithm: str | None = None) -> tuple[float, float] | None:
        """The lowest and the highest of the repeats' × central b (:meth:`paired_ratios`), of which the table shows the
        median: how far this machine's own drift moves the ratio. None with fewer than two paired repeats."""
        paired = self.paired_ratios(algorithm or self.algorithms[0], "central_b")
        return (min(paired), max(paired)) if paired and len(paired) > 1 else None

    def ratio_b(self, algorithm: str | None = None) -> float:
        """× central b (:meth:`side_ratio`; the first algorithm by default)."""
        ratio = self.side_ratio(algorithm or self.algorithms[0], "central_b")
        assert ratio is not None, "both sides are always measured"
        return ratio

    def ratio_nb(self, algorithm: str | None = None) -> float | None:
        """× central N·b; None where N·b was too large to run."""
        return self.side_ratio(algorithm or self.algorithms[0], "central_Nb")

    def ratio_split(self, algorithm: str | None = None) -> float | None:
        """× split b: the algorithm's samples/s over the hand-written split's (HAND_SPLIT), what the engine keeps of
        it; None where the split was not measured."""
        return self.side_ratio(algorithm or self.algorithms[0], "split_b")

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["algorithms"] = list(self.algorithms)
        data["ratio_vs_central_b"] = {a: self.ratio_b(a) for a in self.algorithms}
        data["ratio_vs_central_Nb"] = {a: self.ratio_nb(a) for a in self.algorithms}
        data["ratio_vs_split_b"] = {a: self.ratio_split(a) for a in self.algorithms}
        data["ratio_vs_central_b_range"] = {a: self.ratio_b_range(a) for a in self.algorithms}
        data["flops_vs_central_b"] = {a: self.flops_ratio(a) for a in self.algorithms if self.flops_ratio(a)}
        return data

    def flops_ratio(self, algorithm: str) -> float | None:
        """The algorithm's counted FLOPs per trained sample over centralized training's at batch b (``--flops``)."""
        mine, central = self.flops_per_sample.get(algorithm), self.flops_per_sample.get("central_b")
        return mine / central if mine and central else None

    def report(self) -> str:
        def memory(side: str) -> str:
            value = self.peak_memory_bytes.get(side)
            return f"{value / 2**20:9.1f} MiB" if value is not None else f"{'-':>13}"

        def ratio(value: float | None) -> str:
            return f"{value:14.2f}" if value is not None else f"{'-':>14}"

        from trainers.algorithms import REGISTRY

        whole = [a for a in self.algorithms if a in REGISTRY and REGISTRY[a].whole_model]
        cut = f"cut {self.cut}" + (f" ({', '.join(whole)}: the whole model, cut L)" if whole else "")
        lines = [f"{self.model} on {self.device}, {self.devices} devices, b = {self.batch_size}, {cut}, "
                 f"client batching {self.client_batching}, client recompute {self.client_recompute}, server passes of "
                 f"{'any size' if self.server_pass_samples is None else f'≤ {self.server_pass_samples} samples'}, "
                 f"{self.rounds} rounds, best of {self.repeats} (ratios: median of each repeat's), "
                 f"{self.threads} threads, {CLOCKS[self.clock]}",
                 f"  {'':<26} {'samples/s':>10} {'× central b':>12} {'× central N·b':>14} {'peak memory':>13} "
                 f"{'s/round':>9} {'× split b':>10}"]
        for a in self.algorithms:
            per_round = self.sfl_seconds_per_round.get(a)
            split = self.ratio_split(a)
            lines.append(f"  {a + ' (simulated)':<26} {self.sfl_samples_per_s[a]:10.1f} {self.ratio_b(a):12.2f} "
                         f"{ratio(self.ratio_nb(a))} {memory(a)} "
                         f"{f'{per_round:9.3f}' if per_round is not None else '-':>9} "
                         f"{f'{split:10.2f}' if split is not None else '-':>10}")
        if self.split_b_samples_per_s:
            lines.append(f"  {'split by hand, batch b':<26} {self.split_b_samples_per_s:10.1f} "
                         f"{self.side_ratio('split_b', 'central_b'):12.2f} {'':>14} "
                         f"{memory('split_b')}")
        lines.append(f"  {'centralized, batch b':<26} {self.central_b_samples_per_s:10.1f} {'':>12} {'':>14} "
                     f"{memory('central_b')}")
        if self.central_nb_samples_per_s is None:
            lines.append(f"  {'centralized, batch N·b':<26} {'-':>10} {'':>12} {'':>14} {'-':>13}  not run: "
                         f"N·b = {self.devices * self.batch_size:,} samples > {CENTRAL_NB_LIMIT:,}")
        else:
            lines.append(f"  {'centralized, batch N·b':<26} {self.central_nb_samples_per_s:10.1f} {'':>12} {'':>14} "
                         f"{memory('central_Nb')}")
        ranges = {a: self.ratio_b_range(a) for a in self.algorithms}
        if any(ranges.values()):
            lines.append("  × central b in each repeat, lowest–highest (the table: their median): " + ", ".join(
                f"{a} {span[0]:.2f}–{span[1]:.2f}" for a, span in ranges.items() if span))
        rss = f"{self.process_peak_rss_bytes / 2**20:.0f} MiB" if self.process_peak_rss_bytes else "unknown"
        note = MEMORY_NOTES.get(self.memory_measure, "not measured per side here")
        lines.append(f"  peak memory: {note}; the whole process's peak resident set (ru_maxrss) was {rss}")
        if self.split_b_samples_per_s:
            lines.append(f"  split by hand: {HAND_SPLIT}")
        for a, why in self.per_device_cuts.items():
            lines.append(f"  {a}: client passes ran per device ({why})")
        if self.flops_per_sample:
            lines.append(f"  counted FLOPs per trained sample (FlopCounterMode formulas, one more round; centralized "
                         f"batch b: {self.flops_per_sample.get('central_b', 0) / 1e6:.2f} MFLOP), × central b, and the "
                         "throughput per FLOP (× central b ÷ FLOPs × central b):")
            for a in self.algorithms:
                flops = self.flops_ratio(a)
                if flops:
                    lines.append(f"    {a:<10} {self.flops_per_sample[a] / 1e6:8.2f} MFLOP {flops:6.2f}× "
                                 f"{self.ratio_b(a) * flops:6.2f}")
        return "\n".join(lines)


def header(w: EngineWorkload, device: str = "cpu") -> str:
    """One line saying what is timed, printed before the (minute-long) measurement starts."""
    return (f"bench engine: wall-clock samples/s of {w.rounds} rounds of simulated {', '.join(w.algorithms)} split "
            f"training ({w.devices} devices x {w.batch_size} samples, {w.model} cut {w.cut}) vs centralized training "
            f"of the same model on the same samples (batch {w.batch_size} and {w.devices}x{w.batch_size}) on {device}; "
            f"best of {w.repeats} interleaved repeats, each ratio the median of the repeats' side-by-side ratios")


def _peak_rss_bytes() -> int | None:
    try:
        import resource
        import sys
    except ImportError:  # pragma: no cover  (not on Windows)
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)     # bytes on macOS, KiB on Linux


def _status_kib(name: str) -> int:
    """A ``VmRSS``/``VmHWM`` line of /proc/self/status, KiB."""
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith(f"{name}:"))


class SideMemory:
    """The CPU memory one side adds at its peak (bytes): resident high-water mark (VmHWM, reset by
    writing 5 to /proc/self/clear_refs) above the resident set at the start, after garbage
    collection and ``malloc_trim`` have handed freed memory back. ``peak`` stays None where Linux's
    interface is missing."""

    def __init__(self) -> None:
        self.peak: int | None = None
        self.high_water = 0                 # bytes: the process's high-water mark before the reset or during the side
        self._start: int | None = None

    def __enter__(self) -> "SideMemory":
        import ctypes
        import gc

        gc.collect()
        try:
            self.high_water = _status_kib("VmHWM") * 1024   # the reset below also resets ru_maxrss
            ctypes.CDLL("libc.so.6").malloc_trim(0)
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")
            self._start = _status_kib("VmRSS")
        except (OSError, AttributeError, StopIteration):
            self._start = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._start is not None:
            high = _status_kib("VmHWM")
            self.peak = max(0, high - self._start) * 1024
            self.high_water = max(self.high_water, high * 1024)


def _system_clock(model: str, chain: Any, devices: int, batch_size: int, seed: int) -> Any:
    """The simulated clock of ``--clock system``: :func:`adaptplan.system.generate_system` of ``devices`` at
    ``seed``, fixed resources, over the FLOP profile of ``chain`` (a :class:`profilers.chain.Chain`)."""
    from adaptplan.system import SystemProcess, generate_system
    from profilers import profile_model
    from trainers.engine.clock import SimClock

    profile = profile_model(chain, INPUT_SHAPE, model_name=model, batch_size=batch_size, num_classes=NUM_CLASSES)
    return SimClock(profile, SystemProcess(generate_system(devices, seed), seed=seed, redraw=False), batch_size)


class _Sides:
    """The sides one engine bench measures over the same random samples (module docstring): each algorithm's engine
    (:meth:`split`), the split written by hand (:meth:`split_by_hand`) and centralized SGD (:meth:`central`); beside
    each side's samples/s it keeps the split's best seconds per round, the FLOPs per trained sample
    (``count_flops``) and why an algorithm's client passes ran per device."""

    def __init__(self, model: str, width: int, devices: int, batch_size: int, rounds: int, cut: int, warmup: int,
                 seed: int, execution: Any, count_flops: bool, clock: Any) -> None:
        from trainers.inputs.partition import partition_indices

        self.model, self.width, self.devices, self.batch_size, self.rounds, self.cut = model, width, devices, \
            batch_size, rounds, cut
        self.warmup, self.seed, self.execution, self.count_flops, self.clock = warmup, seed, execution, count_flops, clock
        self.device = execution.device
        g = torch.Generator().manual_seed(seed)
        self.n = devices * batch_size * BATCHES_PER_DEVICE
        x = torch.randn(self.n, *INPUT_SHAPE, generator=g)
        y = torch.randint(0, NUM_CLASSES, (self.n,), generator=g)
        self.parts = partition_indices(y.numpy(), devices, "iid", seed)
        self.x, self.y = x.to(self.device), y.to(self.device)
        self.total = devices * batch_size * rounds
        self.per_device: dict[str, str] = {}
        self.per_round: dict[str, float] = {}
        self.flops: dict[str, float] = {}

    def fresh_model(self) -> nn.Module:
        from trainers.inputs.models import build_model

        torch.manual_seed(self.seed)
        return build_model(self.model, INPUT_SHAPE, NUM_CLASSES, self.width)

    def chain(self) -> Any:
        """The model as ``adaptplan train`` cuts it (:func:`profilers.build_chain`), freshly initialised."""
        from profilers import build_chain

        return build_chain(self.fresh_model(), self.x[:2].cpu())

    def blocks(self) -> nn.Sequential:
        return self.chain().blocks

    def split(self, name: str) -> float:
        """Samples/s of ``rounds`` rounds of algorithm ``name``'s engine after ``warmup`` untimed ones."""
        from profilers.flops import TotalFlops
        from trainers.algorithms import REGISTRY
        from trainers.config.devices import synchronize
        from trainers.engine.split_engine import DeviceData, SplitEngine
        from trainers.strategies import make_strategy

        blocks = self.blocks()
        x, y, warmup = self.x, self.y, self.warmup
        cut = REGISTRY[name].cut_for(self.cut, len(blocks))              # FedAvg's kind: the whole model, cut L
        engine = SplitEngine(blocks, [cut] * self.devices, make_strategy(name),
                             DeviceData(x, y, x[:1], y[:1], self.parts), {"lr": 0.01}, self.batch_size, seed=self.seed,
                             execution=self.execution, clock=self.clock)
        for t in range(1, warmup + 1):
            engine.run_round(t)
        synchronize(self.device)
        start = time.perf_counter()
        samples = sum(engine.run_round(t).samples for t in range(warmup + 1, warmup + self.rounds + 1))
        synchronize(self.device)
        seconds = time.perf_counter() - start
        self.per_round[name] = min(self.per_round.get(name, math.inf), seconds / self.rounds)
        if self.count_flops and name not in self.flops:
            with TotalFlops() as counter:
                counted = engine.run_round(warmup + self.rounds + 1).samples
            self.flops[name] = counter.total / max(counted, 1)
        if engine.batcher is not None and engine.batcher.reasons.get(cut):
            self.per_device[name] = str(engine.batcher.reasons[cut])
        elif engine.batcher is not None and cut not in engine.batcher.reasons:
            self.per_device[name] = "the algorithm runs one device at a time"
        return samples / seconds

    def timed_steps(self, step_batch: int, step: Callable[[int, torch.Tensor, torch.Tensor], None]) -> float:
        """Samples/s of ``step(k, x_k, y_k)`` over the cycled mini-batches of ``step_batch`` samples: ``warmup``
        untimed steps, then ``total`` samples timed."""
        from trainers.config.devices import synchronize

        x, y, n = self.x, self.y, self.n
        begin = 0.0
        for k, s in enumerate(range(0, self.total + self.warmup * step_batch, step_batch)):
            if k == self.warmup:
                synchronize(self.device)
                begin = time.perf_counter()
            step(k, x[s % n:s % n + step_batch], y[s % n:s % n + step_batch])
        synchronize(self.device)
        return self.total / (time.perf_counter() - begin)

    def central(self, step_batch: int) -> float:
        """Samples/s of centralized SGD in steps of ``step_batch`` samples."""
        from profilers.flops import TotalFlops

        net = self.fresh_model().to(self.device)
        opt = torch.optim.SGD(net.parameters(), lr=0.01)

        def step(k: int, xb: torch.Tensor, yb: torch.Tensor) -> None:
            loss = nn.functional.cross_entropy(net(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        speed = self.timed_steps(step_batch, step)
        if self.count_flops and f"central_{step_batch}" not in self.flops:
            with TotalFlops() as counter:
                step(0, self.x[:step_batch], self.y[:step_batch])
            self.flops[f"central_{step_batch}"] = counter.total / step_batch
        return speed

    def split_by_hand(self) -> float:
        """HAND_SPLIT on the engine's blocks, over the same mini-batches as ``central``, device k mod N at step k."""
        split = HandSplit(self.blocks(), self.cut, self.devices, 0.01, self.device)
        return self.timed_steps(self.batch_size, lambda k, xb, yb: split.step(k % self.devices, xb, yb))

    def measures(self, algorithms: Sequence[str]) -> dict[str, Callable[[], float]]:
        """Every side by name: the algorithms, ``split_b``, ``central_b`` and (up to CENTRAL_NB_LIMIT) ``central_Nb``."""
        sides: dict[str, Callable[[], float]] = {a: functools.partial(self.split, a) for a in algorithms}
        sides["split_b"] = self.split_by_hand
        sides["central_b"] = lambda: self.central(self.batch_size)
        if self.devices * self.batch_size <= CENTRAL_NB_LIMIT:
            sides["central_Nb"] = lambda: self.central(self.devices * self.batch_size)
        return sides


def _measure_interleaved(sides: dict[str, Callable[[], float]], repeats: int,
                         device: torch.device) -> tuple[dict[str, list[float]], dict[str, int], int]:
    """(each side's samples/s per repeat, its peak memory in bytes, the CPU's high-water mark): the sides run one
    after another, ``repeats`` times (module docstring: memory on CUDA, on a Linux CPU and elsewhere)."""
    each: dict[str, list[float]] = {side: [] for side in sides}
    peak: dict[str, int] = {}
    high_water = 0
    for _ in range(repeats):
        for side, measure in sides.items():
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
                before = torch.cuda.memory_allocated(device)
                each[side].append(measure())
                peak[side] = max(peak.get(side, 0), torch.cuda.max_memory_allocated(device) - before)
                continue
            with SideMemory() as memory:
                each[side].append(measure())
            if memory.peak is not None:
                peak[side] = max(peak.get(side, 0), memory.peak)
                high_water = max(high_water, memory.high_water)
    return each, peak, high_water


@dataclass(frozen=True)
class EngineWorkload:
    """What ``bench engine`` times (module docstring): ``devices`` N simulated devices of ``batch_size`` samples
    each, every one at ``cut`` (1-based on the model's cut points), ``rounds`` measured rounds per side after
    ``warmup`` untimed ones, ``repeats`` interleaved repeats, each of ``algorithms``; ``model`` (a built-in's
    ``width``) on random CIFAR-shaped data from ``seed``; ``clock`` a key of :data:`CLOCKS` (the system:
    :func:`adaptplan.system.generate_system` of N devices at ``seed``, fixed resources, over the model's FLOP
    profile); ``count_flops``: after the timed rounds, one more round of each side under
    :class:`profilers.flops.TotalFlops` (FlopCounterMode's formulas; not timed), so that a ratio below 1 can be told
    apart from the algorithm's own arithmetic."""

    devices: int = 20
    batch_size: int = 16
    rounds: int = 10
    cut: int = 1
    algorithms: tuple[str, ...] = ("adaptsfl",)
    model: str = "cnn"
    width: int = 32
    warmup: int = 2
    repeats: int = 3
    seed: int = 0
    clock: str = "zero"
    count_flops: bool = False


def run_engine_bench(workload: EngineWorkload = EngineWorkload(),
                     execution: ExecutionConfig | None = None) -> EngineBenchResult:
    """Measure ``workload`` under ``execution`` (the run's :class:`~trainers.config.train_config.ExecutionConfig`:
    ``device`` ``"auto"`` resolved here, ``client_batching``, ``client_recompute``, ``server_pass_samples``
    ``"auto"`` = the engine's default for the device, ``threads``; None: train's defaults) and return an :class:`EngineBenchResult`
    (module docstring)."""
    from adaptplan.errors import InputError
    from trainers.config.devices import resolve_device
    from trainers.config.host import use_cpu
    from trainers.engine.execution import Execution

    w = workload
    ex = execution if execution is not None else ExecutionConfig()
    execution_policy = Execution.resolve(resolve_device(ex.device), ex.client_batching,
                                         ex.server_pass_samples, ex.client_recompute)
    use_cpu(ex.threads)
    run = _Sides(w.model, w.width, w.devices, w.batch_size, w.rounds, w.cut, w.warmup, w.seed, execution_policy,
                 w.count_flops, None)
    chain = run.chain()
    if not 1 <= w.cut <= len(chain.blocks):
        raise InputError(f"{w.model} has {len(chain.blocks)} cut points; the cut must be in 1..{len(chain.blocks)}, "
                         f"got {w.cut}", field="--cut")
    if w.clock not in CLOCKS:
        raise InputError(f"must be one of {', '.join(CLOCKS)}, got {w.clock!r}", field="--clock")
    if w.clock == "system":
        run.clock = _system_clock(w.model, chain, w.devices, w.batch_size, w.seed)
    each, peak, high_water = _measure_interleaved(run.measures(w.algorithms), w.repeats, execution_policy.device)
    return _result(w, ex, execution_policy, run, each, peak, high_water)


def _result(w: EngineWorkload, execution: ExecutionConfig, policy: "Execution", run: "_Sides",
            each: dict[str, list[float]], peak: dict[str, int], high_water: int) -> EngineBenchResult:
    """The :class:`EngineBenchResult` of the measured samples/s ``each`` (per side and repeat) and memory."""
    from trainers.config.devices import describe

    best = {side: max(values) for side, values in each.items()}
    flops = run.flops
    central = f"central_{w.batch_size}"
    return EngineBenchResult(w.algorithms, w.model, describe(policy.device),
                             ("on" if policy.client_batching else "off")
                             + (" (auto)" if execution.client_batching == "auto" else ""),
                             w.devices, w.batch_size, w.cut, w.rounds, w.repeats, torch.get_num_threads(),
                             {a: best[a] for a in w.algorithms}, best["central_b"], best.get("central_Nb"), peak,
                             max(high_water, _peak_rss_bytes() or 0) or None, run.per_device, run.per_round,
                             "cuda" if policy.device.type == "cuda" else "rss" if peak else "",
                             execution.client_recompute, policy.server_pass_samples,
                             {**{a: flops[a] for a in w.algorithms if a in flops},
                              **({"central_b": flops[central]} if central in flops else {})},
                             w.clock, best["split_b"], each)


def run_engine_sweep(device_counts: Sequence[int], workload: EngineWorkload = EngineWorkload(),
                     execution: ExecutionConfig | None = None, plot_path: str | None = None,
                     progress: Callable[[str], None] | None = None) -> list[EngineBenchResult]:
    """:func:`run_engine_bench` of ``workload`` at every N of ``device_counts``, and optionally a plot of seconds
    per round and peak memory of each algorithm against N (``plot_path``)."""
    results = []
    for count in device_counts:
        if progress is not None:
            progress(f"{count} devices ...")
        results.append(run_engine_bench(replace(workload, devices=int(count)), execution))
    if plot_path:
        plot_sweep(results, plot_path)
    return results


def sweep_table(results: Sequence[EngineBenchResult]) -> str:
    """One line per (N, algorithm): seconds per round, samples/s, × central b, × split b, peak memory; with counted FLOPs
    (``--flops``) also the FLOPs per trained sample × centralized training's and the throughput per FLOP
    (× central b times that ratio: 1 when the algorithm runs its arithmetic as fast as centralized training)."""
    counted = any(r.flops_per_sample for r in results)
    lines = [f"  {'N':>6} {'algorithm':<10} {'s/round':>9} {'samples/s':>10} {'× central b':>12} {'× split b':>10} "
             f"{'peak MiB':>9}" + (f" {'FLOPs × central':>16} {'per FLOP':>9}" if counted else "")]
    for r in results:
        for a in r.algorithms:
            mem, split = r.peak_memory_bytes.get(a), r.ratio_split(a)
            line = (f"  {r.devices:>6} {a:<10} {r.sfl_seconds_per_round.get(a, math.nan):9.3f} "
                    f"{r.sfl_samples_per_s[a]:10.1f} {r.ratio_b(a):12.2f} "
                    f"{f'{split:10.2f}' if split is not None else '-':>10} "
                    f"{f'{mem / 2**20:9.1f}' if mem is not None else '-':>9}")
            if counted:
                flops = r.flops_ratio(a)
                line += f" {flops:16.2f} {r.ratio_b(a) * flops:9.2f}" if flops else f" {'-':>16} {'-':>9}"
            lines.append(line)
    return "\n".join(lines)


def plot_sweep(results: Sequence[EngineBenchResult], path: str) -> None:
    """Write :func:`sweep_figure` to ``path`` (an image; the format from its extension)."""
    import matplotlib.pyplot as plt

    from adaptplan.fileio import atomic_write
    from trainers.run.plotting import image_path

    fig = sweep_figure(results)
    target, fmt = image_path(path)
    atomic_write(target, lambda fh: fig.savefig(fh, format=fmt, dpi=120))
    plt.close(fig)


def sweep_figure(results: Sequence[EngineBenchResult]) -> Any:
    """Seconds per round (left) and each side's peak memory in MiB (right) against N, one line per
    algorithm and the centralized batch-b side's memory, N on a log axis ticked at the counts run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    counts = [r.devices for r in results]
    for a in results[0].algorithms:
        left.plot(counts, [r.sfl_seconds_per_round.get(a, math.nan) for r in results], "o-", label=a)
        right.plot(counts, [r.peak_memory_bytes.get(a, math.nan) / 2**20 for r in results], "o-", label=a)
    right.plot(counts, [r.peak_memory_bytes.get("central_b", math.nan) / 2**20 for r in results], "k:o",
               label="centralized, batch b")
    left.set_yscale("log")   # GAS's global iterations are 10-20x a synchronous round
    for ax, label in ((left, "wall-clock seconds per round"), (right, "peak memory [MiB]")):
        ax.set_xscale("log")
        ax.set_xticks(counts, [f"{c:,}" for c in counts])
        ax.minorticks_off()
        ax.set_xlabel("devices N")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    r = results[0]
    fig.suptitle(f"bench engine: {r.model} cut {r.cut}, b = {r.batch_size}, {r.device}", fontsize="medium")
    fig.tight_layout()
    return fig


if __name__ == "__main__":  # pragma: no cover
    print(run_engine_bench().report())
