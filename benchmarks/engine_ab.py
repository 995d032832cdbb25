"""Two revisions of the engine in lock step: is a change faster or slower than the machine's own noise? (issue 35
item 7: "nothing changes in speed", measured side by side.)

Usage: python benchmarks/engine_ab.py BEFORE [AFTER] [--devices 20] [--algorithm all] [--pairs 15] [--warmup 2]
                                      [--central-samples 4096] [--options JSON] [--json]

BEFORE and AFTER are git revisions, each checked out with ``git worktree add --detach`` into a temporary folder
(removed afterwards); without AFTER the working tree itself is the "after" side. ``--algorithm all`` takes the
algorithms both revisions know. ``--options`` (a JSON object) goes to the after side's strategy, to compare like
with like when a default changed between the revisions (e.g. ``'{"excluded_update": "none"}'`` for GAPSL).

Why lock step: on a shared 2-core machine the same code in two processes differs by up to 9 % (the centralized
control below shows it), and the machine's speed drifts within minutes, so separate runs one after the other
varied by up to 30 %. Here one worker process per revision builds the same engine as ``adaptplan bench engine``
(the CIFAR CNN, cut 1, b = 16 samples per device, synthetic data, SGD, one torch thread), both pinned to one core
while nothing else runs on it; after the warm-up rounds they take turns, A B, B A, A B, …, one engine round each,
and after each pair each worker trains the centralized model on the round's samples (at most
``--central-samples``) at batch b. Each worker's rounds are measured against its own centralized speed, and a
drift of the machine falls on both sides alike.

Prints per algorithm: the median over the pairs of after ÷ before round throughput, the same for the
centralized control (≈ 1 when both processes are equally fast), each side's median × centralized batch-b
throughput and their ratio — the figure to hold against 1. Revisions before the engine's refactoring (trainers/
engine.py as one module, e.g. 6379fbc) are read too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BATCH = 16
BATCHES_PER_DEVICE = 4


# ---- the worker: runs inside one revision's tree (cwd and PYTHONPATH), answers one command per line -------------
def _worker_engine(devices: int, algorithm: str, options: dict):
    """The bench engine of ``algorithm`` and the data it draws from, with this tree's modules."""
    import torch

    from profilers import build_chain
    from trainers.strategies import make_strategy
    try:  # the engine as parts (from the refactoring on)
        from trainers.engine.execution import Execution
        from trainers.engine.split_engine import DeviceData, SplitEngine
        from trainers.inputs.models import build_model
        from trainers.inputs.partition import partition_indices
        extra = {"execution": Execution.resolve("cpu", "auto", "auto", "auto")}
    except ImportError:  # one trainers/engine.py module (before it)
        from trainers.engine import DeviceData, SplitEngine  # type: ignore[attr-defined, no-redef]
        from trainers.models import build_model  # type: ignore[no-redef]
        from trainers.partition import partition_indices  # type: ignore[no-redef]
        extra = {}
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    n = devices * BATCH * BATCHES_PER_DEVICE
    x, y = torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g)

    def fresh():
        torch.manual_seed(0)
        return build_model("cnn", (3, 32, 32), 10, 32)

    strategy = make_strategy(algorithm, options) if options else make_strategy(algorithm)
    blocks = build_chain(fresh(), x[:2]).blocks
    whole = getattr(strategy, "whole_model", False)        # FedAvg's kind (a trait since 2026-12-05): cut L
    engine = SplitEngine(blocks, [len(blocks) if whole else 1] * devices, strategy,
                         DeviceData(x, y, x[:1], y[:1], partition_indices(y.numpy(), devices, "iid", 0)),
                         {"lr": 0.01}, BATCH, seed=0, **extra)
    return engine, fresh(), x, y


def worker(devices: int, algorithm: str, options: dict, central_cap: int) -> None:
    """``round``: the next engine round; ``central``: centralized SGD steps at batch b on the last round's samples
    (at most ``central_cap``). Each answers ``seconds samples``; anything else ends the worker."""
    import torch
    from torch import nn

    import trainers
    if not Path(trainers.__file__).resolve().is_relative_to(Path.cwd().resolve()):
        raise SystemExit(f"worker imported {trainers.__file__}, not the tree in {Path.cwd()}")
    engine, net, x, y = _worker_engine(devices, algorithm, options)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    t, last, pos = 0, devices * BATCH, 0
    print("ready", flush=True)
    for line in sys.stdin:
        start = time.perf_counter()
        if line.strip() == "round":
            t += 1
            samples = last = engine.run_round(t).samples
        elif line.strip() == "central":
            samples = min(last, central_cap)
            for _ in range(max(1, samples // BATCH)):
                xb, yb = x[pos:pos + BATCH], y[pos:pos + BATCH]
                pos = (pos + BATCH) % (len(x) - BATCH)
                loss = nn.functional.cross_entropy(net(xb), yb)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        else:
            return
        print(time.perf_counter() - start, samples, flush=True)


def worker_algorithms() -> None:
    try:
        from trainers.algorithms import ALGORITHMS
    except ImportError:
        from trainers.config import ALGORITHMS  # type: ignore[attr-defined, no-redef]
    print(",".join(ALGORITHMS))


# ---- the driver -------------------------------------------------------------------------------------------------
@dataclass
class PairResult:
    """One algorithm: throughputs in samples per second, one entry per pair of turns."""

    algorithm: str
    devices: int
    before: list[float]
    after: list[float]
    central_before: list[float]
    central_after: list[float]

    @property
    def after_over_before(self) -> float:
        return _median_ratio(self.after, self.before)

    @property
    def central_after_over_before(self) -> float:
        return _median_ratio(self.central_after, self.central_before)

    @property
    def x_central_before(self) -> float:
        return _median_ratio(self.before, self.central_before)

    @property
    def x_central_after(self) -> float:
        return _median_ratio(self.after, self.central_after)


def _median_ratio(numerators: list[float], denominators: list[float]) -> float:
    """The median over the pairs of numerator ÷ denominator, pair by pair."""
    return statistics.median(a / b for a, b in zip(numerators, denominators))


class Worker:
    def __init__(self, tree: Path, devices: int, algorithm: str, options: dict, central_cap: int, core: str) -> None:
        command = [sys.executable, str(Path(__file__).resolve()), "--worker", str(devices), algorithm,
                   json.dumps(options), str(central_cap)]
        if core and shutil.which("taskset"):
            command = ["taskset", "-c", core, *command]
        self.process = subprocess.Popen(command, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if self._line() != "ready":
            raise SystemExit(f"the worker in {tree} did not start ({algorithm}); its error is above")

    def _line(self) -> str:
        assert self.process.stdout is not None
        return self.process.stdout.readline().strip()

    def ask(self, command: str) -> float:
        """Samples per second of one ``round`` or ``central``."""
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        seconds, samples = self._line().split()
        return int(samples) / float(seconds)

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("stop\n")
        self.process.stdin.close()
        self.process.wait()


def measure(before: Path, after: Path, algorithm: str, devices: int, pairs: int, warmup: int, central_cap: int,
            options: dict, core: str = "0") -> PairResult:
    sides = {"before": Worker(before, devices, algorithm, {}, central_cap, core),
             "after": Worker(after, devices, algorithm, options, central_cap, core)}
    try:
        for side in sides.values():
            for _ in range(warmup):
                side.ask("round")
        rounds: dict[str, list[float]] = {"before": [], "after": []}
        central: dict[str, list[float]] = {"before": [], "after": []}
        for k in range(pairs):
            order = ("before", "after") if k % 2 == 0 else ("after", "before")
            for name in order:
                rounds[name].append(sides[name].ask("round"))
            for name in order:
                central[name].append(sides[name].ask("central"))
    finally:
        for side in sides.values():
            side.close()
    return PairResult(algorithm, devices, rounds["before"], rounds["after"], central["before"], central["after"])


HEADER = (f"{'N':>6} {'algorithm':<10} {'after/before':>12} {'central a/b':>12} {'× central before':>17} "
          f"{'× central after':>16} {'after/before':>13}")


def row(r: PairResult) -> str:
    """One line of the table: the round-throughput ratio, the centralized control, and the figure that counts."""
    return (f"{r.devices:>6} {r.algorithm:<10} {r.after_over_before:12.3f} {r.central_after_over_before:12.3f} "
            f"{r.x_central_before:17.3f} {r.x_central_after:16.3f} {r.x_central_after / r.x_central_before:13.3f}")


def _tree(revision: str | None, folder: Path) -> Path:
    if revision is None:
        return ROOT
    path = folder / revision.replace("/", "_")
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(path), revision], check=True,
                   capture_output=True)
    return path


def _algorithms(tree: Path) -> list[str]:
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--list"], cwd=tree, capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(tree)}, check=True).stdout
    return out.strip().split(",")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        worker(int(argv[1]), argv[2], json.loads(argv[3]), int(argv[4]))
        return 0
    if argv[:1] == ["--list"]:
        worker_algorithms()
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", help="git revision of the 'before' side")
    parser.add_argument("after", nargs="?", help="git revision of the 'after' side (default: the working tree)")
    parser.add_argument("--devices", default="20", help="comma-separated device counts (default 20)")
    parser.add_argument("--algorithm", default="all", help="comma-separated algorithms, or all (default)")
    parser.add_argument("--pairs", type=int, default=15, help="turns of each side after the warm-up (default 15)")
    parser.add_argument("--warmup", type=int, default=2, help="rounds of each side before the pairs (default 2)")
    parser.add_argument("--central-samples", type=int, default=4096,
                        help="at most this many centralized samples after each round (default 4096)")
    parser.add_argument("--options", default="{}", help="JSON object of strategy options for the after side")
    parser.add_argument("--json", action="store_true", help="one JSON object per algorithm and size")
    args = parser.parse_args(argv)
    options = json.loads(args.options)
    with tempfile.TemporaryDirectory(prefix="engine_ab_") as folder:
        trees = [_tree(args.before, Path(folder)), _tree(args.after, Path(folder))]
        try:
            known = set(_algorithms(trees[0]))
            wanted = ([a for a in _algorithms(trees[1]) if a in known] if args.algorithm == "all"
                      else args.algorithm.split(","))
            if not args.json:
                print(f"before {args.before}, after {args.after or 'the working tree'}; ratios are medians over "
                      f"{args.pairs} pairs of turns\n{HEADER}", flush=True)
            for devices in (int(n) for n in args.devices.split(",")):
                for algorithm in wanted:
                    result = measure(trees[0], trees[1], algorithm, devices, args.pairs, args.warmup,
                                     args.central_samples, options)
                    print(json.dumps({**asdict(result), "after_over_before": result.after_over_before,
                                      "x_central_before": result.x_central_before,
                                      "x_central_after": result.x_central_after}) if args.json else row(result),
                          flush=True)
        finally:
            for tree in trees:
                if tree != ROOT:
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                                   capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
