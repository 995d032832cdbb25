"""`adaptplan bench`: benchmarks that print ratios measured side by side in one run."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("bench", help="benchmarks: solvers (latency vs baselines and exact, solve time) and engine (samples/s)")
    which = parser.add_subparsers(dest="bench", metavar="BENCH")
    which.required = True
    solvers = which.add_parser("solvers", help="AdaptSFL vs baselines vs exact optimum; solve time vs devices and cut points")
    solvers.add_argument("--quick", action="store_true", help="smaller sizes, for CI")
    solvers.add_argument("--seed", type=int, default=0, help="seed of generated scenarios (default 0)")
    solvers.add_argument("--plot", metavar="PNG", help="also write a plot to PNG")
    solvers.set_defaults(func=run_solvers)
    engine = which.add_parser("engine", help="samples/s of simulated SFL (20 devices) vs centralized training, same process")
    engine.add_argument("--devices", type=int, default=20, help="number of simulated devices (default 20)")
    engine.add_argument("--rounds", type=int, default=10, help="measured rounds per side (default 10)")
    engine.add_argument("--batch-size", type=int, default=16, help="samples per device per round (default 16)")
    engine.add_argument("--algorithm", default="adaptsfl", help="split algorithm to time (default adaptsfl)")
    engine.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    engine.add_argument("--repeats", type=int, default=3, help="interleaved repeats; each side keeps its best (default 3)")
    engine.add_argument("--json", action="store_true", help="print the measurements as JSON")
    engine.set_defaults(func=run_engine)


def run_solvers(args: argparse.Namespace) -> int:
    from adaptplan.bench_solvers import run_solver_bench
    from adaptplan.scenarios import default_scenario
    from solvers.problem import PlanningProblem

    scenario = default_scenario()
    problem = PlanningProblem.from_parts(scenario.profile, scenario.system, scenario.constants)
    sizes = (20, 100) if args.quick else (20, 100, 500, 1000)
    run_solver_bench(problem, sizes=sizes, seed=args.seed, plot_path=args.plot, quick=args.quick)  # prints as it goes
    return 0


def run_engine(args: argparse.Namespace) -> int:
    from adaptplan.bench_engine import run_engine_bench

    import json

    result = run_engine_bench(devices=args.devices, batch_size=args.batch_size, rounds=args.rounds,
                              algorithm=args.algorithm, threads=args.threads, repeats=args.repeats)
    print(json.dumps(result.to_json(), indent=2) if args.json else result.report())
    return 0
