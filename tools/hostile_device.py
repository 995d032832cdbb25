#!/usr/bin/env python3
"""A device that holds the run's secret and lies (issue 67 item 5): real ranks over torch.distributed (gloo) and
through a Mosquitto broker, device 0's messages changed on its rank before they leave (tests/process_runs.py:
lying_device), field by field: its activations (tensor, labels, device, round, step), its model uploads (each
field of the first block, the block set, the stated weight, sender, device and round) and its rank's report of
measured seconds. Each lie is given to SplitFed V1 (every message kind; the run stops) and to GAS (which lets a
lying device leave and trains on), over both runtimes.

Each case ends as one of: clean (the run stopped with exit 3 naming device 0's rank and the field, or — GAS — went
on without device 0 naming it), accepted (exit 0: judged by comparing the losses with the honest simulation;
"accepted, harmless" when every round's loss is equal to 1e-4 — the lies start in round 2, and round 3 trains on
round 2's average), diverged (the lie taken, the run stopped as a divergence: exit 2 blaming --lr),
internal (exit 1, a traceback, an internal error), wrong rank
(exit 3 blaming another rank) or hang (no end in ``--timeout`` s). Prints the counts per runtime and algorithm, and
each case that is not clean.

    python tools/hostile_device.py [--runtime distributed|mqtt ...] [--only SUBSTRING] [--timeout S]
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.process_runs import losses, lying_device, simulate  # noqa: E402

TENSOR = "msg.tensor"
BLOCK = "b = next(iter(msg.blocks.values())); k = next(iter(b.state)); "
FORWARD = {
    "tensor: another shape": f"{TENSOR} = torch.zeros({TENSOR}.shape[0], 3)",
    "tensor: one row more": f"{TENSOR} = torch.cat([{TENSOR}, {TENSOR}[:1]])",
    "tensor: 0-d": f"{TENSOR} = torch.tensor(7.0)",
    "tensor: float64": f"{TENSOR} = {TENSOR}.double()",
    "tensor: float16": f"{TENSOR} = {TENSOR}.half()",
    "tensor: int64": f"{TENSOR} = {TENSOR}.long()",
    "tensor: empty": f"{TENSOR}, msg.labels = {TENSOR}[:0], msg.labels[:0]",
    "tensor: NaN": f"{TENSOR} = torch.full_like({TENSOR}, float('nan'))",
    "tensor: +inf": f"{TENSOR} = torch.full_like({TENSOR}, float('inf'))",
    "tensor: 3e38": f"{TENSOR} = torch.full_like({TENSOR}, 3e38)",
    "tensor: -3e38": f"{TENSOR} = torch.full_like({TENSOR}, -3e38)",
    "tensor: one NaN": f"{TENSOR} = {TENSOR}.clone(); {TENSOR}.view(-1)[0] = float('nan')",
    "tensor: not a tensor": f"{TENSOR} = [1.0, 2.0]",
    "labels: 10^12": "msg.labels = torch.full_like(msg.labels, 10**12)",
    "labels: -1": "msg.labels = torch.full_like(msg.labels, -1)",
    "labels: float": "msg.labels = msg.labels.float()",
    "labels: one fewer": "msg.labels = msg.labels[:-1]",
    "labels: one more": "msg.labels = torch.cat([msg.labels, msg.labels[:1]])",
    "labels: 2-d": "msg.labels = msg.labels[:, None]",
    "labels: not a tensor": "msg.labels = 3",
    "device: another device": "msg.device = 1",
    "device: -1": "msg.device = -1",
    "round: the next": "msg.round = msg.round + 1",
    "round: -1": "msg.round = -1",
    "step: the next": "msg.step = msg.step + 1",
}
UPLOAD = {
    "weight: 1e30": "msg.weight = 1e30",
    "weight: -1": "msg.weight = -1.0",
    "weight: NaN": "msg.weight = float('nan')",
    "weight: 0": "msg.weight = 0.0",
    "block tensor: another shape": BLOCK + "b.state[k] = torch.zeros(2)",
    "block tensor: float64": BLOCK + "b.state[k] = b.state[k].double()",
    "block tensor: NaN": BLOCK + "b.state[k] = torch.full_like(b.state[k], float('nan'))",
    "block tensor: 1e38": BLOCK + "b.state[k] = torch.full_like(b.state[k], 1e38)",
    "block tensor: empty": BLOCK + "b.state[k] = b.state[k].reshape(-1)[:0]",
    "block tensor: missing": BLOCK + "del b.state[k]",
    "block tensor: an extra key": BLOCK + "b.state['extra'] = torch.zeros(1)",
    "blocks: none": "msg.blocks = {}",
    "blocks: another block": "msg.blocks = {99: next(iter(msg.blocks.values()))}",
    "sender: the edge server": "msg.sender = 'edge'",
    "device: another device": "msg.device = 1",
    "round: -1": "msg.round = -1",
}
REPORT = {
    "seconds: another device": "msg.seconds = {'device FP': {1: 1e5}}",
    "seconds: -1": "msg.seconds = {'device FP': {0: -1.0}}",
    "seconds: NaN": "msg.seconds = {'device FP': {0: float('nan')}}",
    "seconds: an unknown stage": "msg.seconds = {'x': {0: 1.0}}",
    "seconds: not a table": "msg.seconds = 5",
}
COMMON = ["--devices", "2", "--dataset", "synthetic", "--model", "mlp", "--seed", "5", "--no-progress", "--cuts",
          "2", "--client-batching", "off"]
ALGORITHMS = {
    "sfl-v1": ["--algorithm", "sfl-v1", "--rounds", "3", "--eval-every", "3"],   # round 3 trains on round 2's average
    "gas": ["--algorithm", "gas", "--rounds", "4", "--eval-every", "2", "--active", "2", "--local-steps", "1"],
}
RUNTIMES = {"distributed": ["--distributed"], "mqtt": ["--runtime", "mqtt"]}
RANKS = {"sfl-v1": "3", "gas": "4"}       # GAS: device 0 alone on rank 2, so that its rank may leave


def cases(only: str) -> list[tuple[str, str, str, str]]:
    """(algorithm, message kind, lie's name, its code): every lie for SplitFed V1, the activations' for GAS (its
    devices upload no client model mid-run) and no reports (the rank's report is rank 0's check, as for SFL)."""
    out = []
    for kind, table in (("forward", FORWARD), ("upload", UPLOAD), ("report", REPORT)):
        for name, code in table.items():
            out.append(("sfl-v1", kind, name, code))
            if kind == "forward":
                out.append(("gas", kind, name, code))
    return [c for c in out if only in f"{c[0]} {c[1]} {c[2]}"]


def outcome(run: subprocess.CompletedProcess, argv: list[str], algorithm: str, tmp: Path) -> str:
    err = run.stderr
    if "internal error" in err or "Traceback" in err or run.returncode not in (0, 2, 3):
        return "internal"
    if run.returncode == 3:
        return "clean" if "rank 2 (device 0) sent" in err or "rank 2 (devices 0" in err else "wrong rank"
    if run.returncode == 2 and "training diverged" in err:
        return "diverged"                      # stopped, but blamed on the learning rate
    if run.returncode == 0 and algorithm == "gas" and "goes on without devices 0" in err:
        return "clean"
    if run.returncode == 0:
        honest = simulate(tmp, "sim", argv)
        got = losses(tmp / "run")
        same = len(got) == len(honest) and max(abs(a - b) for a, b in zip(got, honest)) <= 1e-4
        return "accepted, harmless" if same else "accepted"
    return "diverged" if "training diverged" in err else "clean" if run.returncode == 2 else "internal"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtime", action="append", choices=list(RUNTIMES))
    parser.add_argument("--only", default="")
    parser.add_argument("--timeout", type=float, default=240.0)
    args = parser.parse_args()
    runtimes = args.runtime or list(RUNTIMES)
    if "mqtt" in runtimes and not (shutil.which("mosquitto") or shutil.which("mosquitto", path="/usr/sbin")):
        sys.exit("hostile_device: the mosquitto broker is not installed (apt-get install mosquitto)")
    counts: dict[tuple[str, str], collections.Counter] = collections.defaultdict(collections.Counter)
    notes = []
    for runtime in runtimes:
        for algorithm, kind, name, code in cases(args.only):
            argv = [*ALGORITHMS[algorithm], *COMMON]
            with tempfile.TemporaryDirectory(prefix="hostile-device-") as folder:
                tmp = Path(folder)
                full = [*argv, *RUNTIMES[runtime], "--ranks", RANKS[algorithm], "--out", str(tmp / "run")]
                try:
                    run = lying_device(tmp, name, full, timeout=args.timeout, code=code, message=kind)
                    result = outcome(run, argv, algorithm, tmp)
                    line = (run.stderr.strip().splitlines() or [""])[-1][:160]
                except subprocess.TimeoutExpired:
                    result, line = "hang", ""
            counts[(runtime, algorithm)][result] += 1
            print(f"{runtime:11s} {algorithm:6s} {kind:7s} {name:28s} {result}", flush=True)
            if result != "clean":
                notes.append(f"{runtime} {algorithm} {kind} {name}: {result}: {line}")
    print("\nruntime      algorithm  cases  clean  accepted (harmless)  diverged  internal  wrong rank  hang")
    for (runtime, algorithm), c in sorted(counts.items()):
        print(f"{runtime:12s} {algorithm:9s} {sum(c.values()):6d} {c['clean']:6d} {c['accepted']:9d} "
              f"({c['accepted, harmless']}) {c['diverged']:9d} {c['internal']:9d} {c['wrong rank']:11d} {c['hang']:5d}")
    for note in notes:
        print("  " + note)


if __name__ == "__main__":
    main()
