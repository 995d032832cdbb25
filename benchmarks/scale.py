"""Planning at scale on random and adversarial instances (issue 16): time, nodes, gap, memory.

Usage: python benchmarks/scale.py [--sizes 1000 10000 100000] [--kinds random adversarial] [--seeds 0 1]
                                  [--memory] [--json]

Each (kind, N, seed) runs in its own process (so the peak resident memory is that run's):
build the instance (:mod:`solvers.instances`, 20 candidate cuts), then ``solve_bcd`` as the
planner calls it (ms_method auto, with the certificate). Prints seconds to build and to solve (wall clock and this process's CPU time: the machine is
shared, CPU time is the fairer figure), the
threshold method's branch-and-bound nodes, BCD's interval and objective (28), the certified gap and
the peak RSS in MiB. ``--memory`` gives every adversarial device a memory budget (log-uniform
between the smallest and ~the median client memory of the profile).

Before and after the sweep it prints the CPU seconds of a fixed reference loop (``sum(range(10**8))``): the
shared 2-core machine's speed drifts by more than 2× from day to day (1.05 s on a fast day, 2.2–2.6 s on slow
ones), so a solve's CPU seconds are read against it (issue 38 item 4's targets are for the fast day's core).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run_one(kind: str, num_devices: int, seed: int, memory: bool) -> dict:
    from solvers.bcd import solve_bcd
    from solvers.instances import adversarial_problem, adversarial_profile, random_problem

    start = time.perf_counter()
    if kind == "random":
        problem = random_problem(num_devices, 21, seed)
    else:
        budget = None
        if memory:
            need = sorted(adversarial_profile(21, seed).client_memory)
            budget = (need[0], need[len(need) // 2])
        problem = adversarial_problem(num_devices, 21, seed, memory_bytes=budget)
    built = time.perf_counter() - start
    start, cpu = time.perf_counter(), time.process_time()
    result = solve_bcd(problem)
    solved, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"kind": kind + (" +memory" if memory and kind != "random" else ""), "devices": num_devices, "seed": seed,
            "build_s": round(built, 3), "solve_s": round(solved, 3), "solve_cpu_s": round(cpu, 3), "nodes": result.nodes,
            "interval": result.interval, "objective_s": result.objective, "gap": result.gap, "status": result.status,
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def reference_seconds() -> float:
    """CPU seconds of ``sum(range(10**8))`` in this process: the machine's speed at the moment (module docstring)."""
    cpu = time.process_time()
    sum(range(10**8))
    return time.process_time() - cpu


def main() -> int:
    """Run the sweep; exit status 1 when any run failed (its line says why), 0 otherwise."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--kinds", nargs="+", default=["random", "adversarial"], choices=["random", "adversarial"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--memory", action="store_true", help="memory budgets on the adversarial devices")
    parser.add_argument("--json", action="store_true", help="one JSON object per run instead of the table")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, n, seed, memory = args.child
        print(json.dumps(run_one(kind, int(n), int(seed), memory == "1")))
        return 0
    before = reference_seconds()
    if not args.json:
        print(f"machine reference: sum(range(10**8)) {before:.2f} s CPU (1.05 s on a fast day)", flush=True)
        print(f"{'instance':<20} {'N':>7} {'seed':>4} {'build s':>8} {'solve s':>8} {'CPU s':>7} {'nodes':>6} {'I':>4} "
              f"{'objective (28) s':>17} {'gap %':>8} {'peak MiB':>9}  status", flush=True)
    failures = 0
    for kind in args.kinds:
        for n in args.sizes:
            for seed in args.seeds:
                out = subprocess.run([sys.executable, __file__, "--child", kind, str(n), str(seed),
                                      "1" if args.memory else "0"], capture_output=True, text=True, cwd=ROOT)
                if out.returncode:
                    print(f"{kind} N={n} seed={seed}: failed: {out.stderr.strip().splitlines()[-1:]}", flush=True)
                    failures += 1
                    continue
                row = json.loads(out.stdout)
                if args.json:
                    print(json.dumps(row), flush=True)
                else:
                    print(f"{row['kind']:<20} {n:>7} {seed:>4} {row['build_s']:>8.2f} {row['solve_s']:>8.2f} "
                          f"{row['solve_cpu_s']:>7.2f} {row['nodes']:>6} {row['interval']:>4} {row['objective_s']:>17.1f} "
                          f"{100 * row['gap']:>8.3g} {row['peak_rss_mib']:>9.0f}  {row['status']}", flush=True)
    after = reference_seconds()
    if args.json:
        print(json.dumps({"reference_cpu_s": [round(before, 3), round(after, 3)]}), flush=True)
    else:
        print(f"machine reference after the sweep: {after:.2f} s CPU", flush=True)
    if failures:
        print(f"{failures} run(s) failed", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
