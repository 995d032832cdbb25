"""Time ``solve_bcd`` (ms_method="auto") on 1,000 devices (target < 2 s on 2 CPU cores).

Usage: python benchmarks/plan_1000.py [--repeats 3]
Instances: the synthetic 20-candidate-cut scenario of ``adaptplan.benches.solvers._problem(1000, 21, 0)``
and the default VGG-16 profile (candidates 1..15) with generate_system(1000, 0) and the placeholder
constants. Prints the median wall-clock time and the plan (I, objective, cut histogram) of each.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adaptplan.benches.solvers import _problem  # noqa: E402
from adaptplan.constants import ConvergenceConstants  # noqa: E402
from adaptplan.scenarios import default_profile  # noqa: E402
from adaptplan.system import generate_system  # noqa: E402
from solvers.bcd import choose_ms_method, solve_bcd  # noqa: E402
from solvers.problem import PlanningProblem  # noqa: E402


def instances() -> list[tuple[str, PlanningProblem]]:
    profile = default_profile()
    vgg = PlanningProblem.from_parts(profile, generate_system(1000, 0),
                                     ConvergenceConstants.placeholder(profile.num_cuts))
    return [("synthetic 1000 x 20 cuts (_problem(1000, 21, 0))", _problem(1000, 21, 0)),
            ("default VGG-16, 1000 devices, placeholder constants", vgg)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for name, problem in instances():
        times, result = [], None
        for _ in range(args.repeats):
            start = time.perf_counter()
            result = solve_bcd(problem, ms_method="auto")
            times.append(time.perf_counter() - start)
        hist = dict(sorted(Counter(result.cuts).items()))
        print(f"{name}: N={problem.num_devices}, {problem.candidates.size} candidates, "
              f"MS method {choose_ms_method(problem)}")
        print(f"  solve_bcd median {statistics.median(times):.3f} s over {args.repeats} "
              f"(all: {', '.join(f'{t:.3f}' for t in times)})")
        print(f"  plan: I={result.interval}, objective={result.objective!r}, L_c={max(result.cuts)}, "
              f"iterations={result.iterations}, {result.status}")
        print(f"  cuts histogram {hist}")
        for rec in result.history:
            print(f"    iter {rec['iteration']}: I={rec['interval']} obj={rec['objective']!r}")


if __name__ == "__main__":
    main()
