"""glibc's heap kept (trainers/config/host.py) against its defaults, side by side on the same training run.

Usage: python benchmarks/allocator_ab.py [--pairs 2] [--json] [-- TRAIN-ARGS...]

Each pair trains the same ``adaptplan train TRAIN-ARGS`` twice in fresh processes, once with
``ADAPTPLAN_KEEP_HEAP=0`` (glibc's defaults) and once as shipped (freed memory kept), the order alternating
between pairs so that a drift of the machine falls on both sides. Only the training loop is measured
(``getrusage`` around ``Trainer.run``: data loading, planning and start-up are outside). Default TRAIN-ARGS: the
LEAF LSTM on the synthetic text task, 20 devices, SGLR, 30 rounds, one thread.

Prints per side the medians over the pairs of CPU seconds (user + system), the system share, minor page faults and
wall seconds, and the kept ÷ default ratios: the figure to hold against 1 is the CPU ratio (the wall ratio is
only as good as the machine's idleness). Both sides train bit for bit alike; the script checks that the two
histories' losses agree and says so.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_ARGS = ["--dataset", "synthetic-text", "--model", "leaf-lstm", "--devices", "20", "--algorithm", "sglr",
                "--rounds", "30", "--eval-every", "1000", "--threads", "1"]

#: Runs inside each training process: the CLI, with the training loop's resource use printed as one JSON line.
WORKER = """
import json, resource, sys, time
from trainers.run import driver
run = driver.Trainer.run
def measured(self, *args, **kwargs):
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    history = run(self, *args, **kwargs)
    after = resource.getrusage(resource.RUSAGE_SELF)
    print("ALLOCATOR_AB " + json.dumps({"user": after.ru_utime - before.ru_utime,
          "sys": after.ru_stime - before.ru_stime, "faults": after.ru_minflt - before.ru_minflt,
          "wall": time.perf_counter() - start, "losses": [r.train_loss for r in history.records]}), flush=True)
    return history
driver.Trainer.run = measured
from adaptplan.cli import main
sys.exit(main(sys.argv[1:]))
"""


def train_once(train_args: list[str], keep: bool, out: Path) -> dict:
    """One training process; its ``ALLOCATOR_AB`` line as a dict."""
    env = dict(os.environ, ADAPTPLAN_KEEP_HEAP="1" if keep else "0")
    done = subprocess.run([sys.executable, "-c", WORKER, "train", *train_args, "--no-progress", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if line.startswith("ALLOCATOR_AB "):
            return json.loads(line.removeprefix("ALLOCATOR_AB "))
    raise SystemExit(f"allocator_ab: the training run failed:\n{done.stderr[-2000:]}")


def summary(runs: list[dict]) -> dict:
    """Medians over the pairs of one side."""
    cpu = [r["user"] + r["sys"] for r in runs]
    return {"cpu_s": statistics.median(cpu), "sys_share": statistics.median(r["sys"] / c for r, c in zip(runs, cpu)),
            "faults": statistics.median(r["faults"] for r in runs), "wall_s": statistics.median(r["wall"] for r in runs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("train_args", nargs="*", help="adaptplan train arguments (after --)")
    args = parser.parse_args()
    train_args = args.train_args or DEFAULT_ARGS
    sides: dict[bool, list[dict]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="allocator_ab_") as scratch:
        for pair in range(args.pairs):
            for keep in ((False, True) if pair % 2 == 0 else (True, False)):
                sides[keep].append(train_once(train_args, keep, Path(scratch) / f"{pair}-{keep}"))
    alike = all(a["losses"] == b["losses"] for a, b in zip(sides[False], sides[True]))
    default, kept = summary(sides[False]), summary(sides[True])
    ratio = {k: kept[k] / default[k] if default[k] else float("nan") for k in ("cpu_s", "faults", "wall_s")}
    if args.json:
        print(json.dumps({"default": default, "kept": kept, "ratio": ratio, "losses_alike": alike}, indent=2))
        return
    print(f"adaptplan train {' '.join(train_args)}  ({args.pairs} pairs, medians)")
    print(f"{'':10}{'CPU s':>10}{'system share':>14}{'minor faults':>14}{'wall s':>10}")
    for name, side in (("default", default), ("kept", kept)):
        print(f"{name:10}{side['cpu_s']:10.2f}{side['sys_share']:14.1%}{side['faults']:14,.0f}{side['wall_s']:10.2f}")
    print(f"{'kept ÷ def':10}{ratio['cpu_s']:10.3f}{'':14}{ratio['faults']:14.3f}{ratio['wall_s']:10.3f}")
    print("losses bit for bit alike" if alike else "LOSSES DIFFER between the sides")


if __name__ == "__main__":
    main()
