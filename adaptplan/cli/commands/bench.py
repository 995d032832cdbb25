"""`adaptplan bench`: benchmarks that print ratios measured side by side in one run."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from adaptplan.cli.commands.train import add_device_options, add_memory_options
from adaptplan.cli.config_flags import add_field
from adaptplan.cli.flags import int_flag, whole_numbers
from adaptplan.errors import InputError
from adaptplan.limits import MAX_CUT_POINTS, MAX_DEVICES, MAX_SEED, MAX_STEPS, MAX_THREADS
from trainers.config.train_config import ALGORITHMS

if TYPE_CHECKING:  # pragma: no cover
    from adaptplan.benches.comparison import Setting
    from adaptplan.benches.workload import Workload

    W = TypeVar("W", bound=Workload)

MAX_BENCH_DEVICES = MAX_DEVICES    # simulated devices of `bench engine` (CycleSL's FEMNIST has 3,550 clients)
MAX_BENCH_ROUNDS = 10_000   # interleaved repeats of `bench engine` (its rounds: train's --rounds limit)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("bench", help="benchmarks: solvers (latency vs baselines and exact, solve time), engine "
                            "(samples/s), algorithms (every registered algorithm side by side), training (planning policies in the loop), "
                            "papers (each paper's claim at this scale), plans (the planner's plan against a grid "
                            "of fixed plans) and privacy (accuracy and time beside leakage, per cut and defence)")
    which = parser.add_subparsers(dest="bench", metavar="BENCH")
    which.required = True
    from adaptplan.cli.commands.bench_privacy import privacy_parser

    for add in (_solvers_parser, _engine_parser, _algorithms_parser, _training_parser, _papers_parser,
                _plans_parser, privacy_parser):
        add(which)


def _solvers_parser(which: argparse._SubParsersAction) -> None:
    """``bench solvers``: the planner against baselines and exact optima, and its solve time."""
    solvers = which.add_parser("solvers", help="AdaptSFL vs baselines vs exact optimum; solve time vs devices and cut points")
    solvers.add_argument("--quick", action="store_true", help="smaller sizes, for CI (about 70 s on one idle core). "
                         "Every MILP stops at a node limit, never a wall-clock one: each run prints the same objectives")
    add_field(solvers, "seed", help="seed of generated scenarios (default 0)")
    solvers.add_argument("--plot", metavar="PNG", help="also write a plot to PNG (objective vs baselines; planning "
                         "time vs devices on random and adversarial instances, with an N log N reference)")
    solvers.add_argument("--profile", metavar="FILE", help="benchmark on your instance: model profile JSON/TOML "
                         "(default: the shipped VGG-16/CIFAR-10 profile)")
    add_field(solvers, "system_path", dest="system", help="your system JSON/TOML (FLOP/s, bit/s, optional "
              "memory_bytes); default: --devices generated devices")
    add_field(solvers, "constants_path", dest="constants", help="your training constants JSON/TOML (default: "
              "placeholder constants of docs/model.md §6.1)")
    add_field(solvers, "devices", help="generated devices when --system is not given (default 20)")
    solvers.set_defaults(func=run_solvers)


def _engine_parser(which: argparse._SubParsersAction) -> None:
    """``bench engine``: samples/s of the simulated engine against centralized training."""
    engine = which.add_parser("engine", help="samples/s of simulated SFL (20 devices) vs centralized training, same "
                              "process and device")
    engine.add_argument("--devices", type=device_counts, default=[20], metavar="N[,N...]",
                        help="number of simulated devices (default 20); several, comma-separated, run a sweep: a table "
                             "of seconds per round and peak memory against N (and a plot with --plot)")
    engine.add_argument("--plot", metavar="FILE", help="with several --devices: seconds per round and peak memory "
                        "against N, as an image")
    add_field(engine, "rounds", default=10, help="measured rounds per side (default 10)")
    add_field(engine, "batch_size", help="samples per device per round (default 16)")
    engine.add_argument("--algorithm", default="adaptsfl",
                        help="split algorithm(s) to time, comma-separated, or all (default adaptsfl)")
    add_field(engine, "model", help="model of both sides on 3x32x32 inputs, 10 classes: cnn (default), vgg16-cifar, mlp, "
              "or any --model of adaptplan train")
    engine.add_argument("--cut", type=int_flag(1, MAX_CUT_POINTS, "cut points"), default=1,
                        help="every device's cut, 1-based on the model's cut points (default 1)")
    add_field(engine, "threads")
    add_device_options(engine)
    add_memory_options(engine)
    engine.add_argument("--repeats", type=int_flag(1, MAX_BENCH_ROUNDS, "repeats"), default=3,
                        help="interleaved repeats; each side keeps its best (default 3)")
    engine.add_argument("--json", action="store_true", help="print the measurements as JSON")
    engine.add_argument("--flops", action="store_true",
                        help="also count each side's FLOPs per trained sample (one more round under torch's "
                             "FlopCounterMode, not timed) and print them against centralized training's: a ratio "
                             "below 1 that equals the FLOP ratio is the algorithm's own arithmetic, not overhead")
    engine.add_argument("--clock", default="zero", help="the simulated runs' stage times, which order the arrivals: "
                        "zero (every stage 0 s, the default) or system (a generated system's latency model, as "
                        "adaptplan train runs it: GAS's active devices interleave)")
    engine.set_defaults(func=run_engine)


def _algorithms_parser(which: argparse._SubParsersAction) -> None:
    """``bench algorithms``: every registered algorithm on one setting."""
    algos = which.add_parser("algorithms", help="every split algorithm on one data set and plan, IID and non-IID: "
                             "accuracy at equal rounds and equal simulated time, time to a target")
    algos.add_argument("--algorithms", default=",".join(ALGORITHMS), help="comma-separated (default: every registered algorithm)")
    algos.add_argument("--partitions", default="iid,dirichlet-0.1,shards-2",
                       help="comma-separated: iid, dirichlet-0.1 (Dirichlet α = 0.1), shards-2 (2 label shards per device)")
    _training_options(algos, rounds=100, target=0.3)
    algos.add_argument("--cuts", help="one cut for every device (default: the planner's plan)")
    add_field(algos, "batch_size")
    algos.add_argument("--out", metavar="DIR", help="write table.txt, results.json and accuracy.png into DIR")
    algos.set_defaults(func=run_algorithms)


def _training_parser(which: argparse._SubParsersAction) -> None:
    """``bench training``: the planning policies in the training loop."""
    training = which.add_parser("training", help="planning policies in the training loop (AdaptSFL vs the paper's "
                                "benchmarks): time to accuracy, converged time, IID and non-IID")
    training.add_argument("--policies", default="adaptsfl,rma+ms,ma+rms,rma+rms,dama+rms,rma+ams,sfl,psl",
                          help="comma-separated policies (trainers.run.policies; default: AdaptSFL, the paper's five, SFL, PSL)")
    training.add_argument("--partition", dest="partitions", default="both", help="iid, shards (2 label shards per device) or both (default)")
    _training_options(training, rounds=600, target=0.4)
    add_field(training, "replan_every", default=50, help="AdaptSFL re-plans every Q rounds (default 50)")
    add_field(training, "noise_cv", flag="--noise-cv", help="coefficient of variation of the Gaussian noise on what "
              "planners measure (default 0)")
    training.add_argument("--sweep", metavar="NAME=V1,V2,...",
                          help="repeat on the first partition for each value: device-flops (scale of the device FLOP/s "
                               "range), bandwidth (scale of every link rate) or noise-cv; prints a table and, with "
                               "--out, plots time to target against the value")
    training.add_argument("--more-targets", metavar="A,B,...", default="",
                          help="further accuracies (fractions) whose simulated time to reach is reported next to "
                               "--target-accuracy's, e.g. 0.3")
    training.add_argument("--json", metavar="FILE", help="write the figures (and every run's accuracy curve) as JSON "
                          "to FILE")
    training.add_argument("--out", metavar="DIR", help="write table.txt and accuracy.png (one panel per partition) into DIR")
    training.set_defaults(func=run_training)


def _papers_parser(which: argparse._SubParsersAction) -> None:
    """``bench papers``: each paper's claims from its recipe."""
    from adaptplan.benches.recipes import DEFAULT_NAMES, NAMES

    papers = which.add_parser("papers", help="the comparison each source paper headlines (GAPSL, SCALA, CycleSL, GAS, "
                              "AdaptSFL), run from its recipe file over seeds: claim, measured difference, spread, "
                              "verdict")
    papers.add_argument("--paper", "--papers", dest="papers", default=",".join(DEFAULT_NAMES),
                        help=f"comma-separated subset of {', '.join(NAMES)} (default: {', '.join(DEFAULT_NAMES)}; "
                             "gas-fmnist is GAS's Table 1 on the full Fashion-MNIST of Debian's dataset-fashion-mnist, "
                             "cyclesl-shakespeare CycleSL's Table 3 on LEAF's Shakespeare, its texts under "
                             "$ADAPTPLAN_SHAKESPEARE_DIR); "
                             "each runs its recipe, adaptplan/benches/recipes/NAME.toml")
    papers.add_argument("--seeds", type=int_flag(1, MAX_SEED + 1, "seeds"),
                        help="seeds 0..n-1 per run (default 3; --tier test: 1). The spread needs ≥ 2: 1 seed only "
                             "with --tier test")
    add_field(papers, "target_accuracy", help="replace the recipes' target accuracy of the time-to-target claims (a "
              "fraction)")
    add_field(papers, "data_root", help="run each recipe at its paper's scale ([paper_scale]: the paper's own data set, "
              "read from DIR, and model), nothing else changed; with --device cuda on a GPU")
    papers.add_argument("--full-fashion-mnist", action="store_true",
                        help="run each recipe on the whole Fashion-MNIST training set (Debian's dataset-fashion-mnist) "
                             "over its devices, nothing else changed: the papers' images per device (600 at 100 "
                             "devices) where the built-in subsets give about 51")
    papers.add_argument("--workers", type=int_flag(1, MAX_THREADS, "processes"),
                        help="worker processes, one torch thread each (default: all cores)")
    papers.add_argument("--tier", choices=("full", "hour", "test"), default="full",
                        help="full (default): every recipe as written, its rounds raised until the plateau "
                             "check (SCALA's 18 runs of 28,800 rounds alone 20-35 CPU-hours; with --out the runs that "
                             "ended are read back, or trained on (from the start without their checkpoints) when a "
                             "recipe's rounds grow, so it can take several "
                             "sittings); "
                             "hour: the first half of every full run (half the rounds, the same evaluation rounds, "
                             "or the first part a recipe's [hour_tier] states; all five at 3 seeds fit 60 minutes of "
                             "2 cores); test: the synthetic data set, 4 devices, 4 rounds, 1 seed (verdicts "
                             "meaningless)")
    papers.add_argument("--quick", action="store_true", help="the same as --tier test")
    add_device_options(papers)
    papers.add_argument("--out", metavar="DIR", default="bench-papers",
                        help="write table.txt, results.json and accuracy.png into DIR (default bench-papers), and "
                             "each run's file and folder into DIR/runs: the same command run again continues a stopped "
                             "bench (runs that ended are read back, stopped ones resume from their checkpoints)")
    papers.set_defaults(func=run_papers)


def _plans_parser(which: argparse._SubParsersAction) -> None:
    """``bench plans``: the planner's plan against a grid of fixed plans."""
    plans = which.add_parser("plans", help="the planner's plan against a grid of fixed plans (every device at cut j × "
                             "interval I, each device's latency-best cut × I) over seeds: simulated time to a target "
                             "accuracy, the planner's rank and ratio to the best, beside what it predicted; a heat-map")
    _plans_options(plans)
    plans.set_defaults(func=run_plans)

def _plans_options(parser: argparse.ArgumentParser) -> None:
    """``bench plans``' flags: the setting of ``train`` (one for every plan), the seeds, the target, the grid of
    intervals and the outputs."""
    add_field(parser, "dataset")
    add_field(parser, "model", help="model (default cnn); its cut points are the grid's cuts")
    add_field(parser, "model_width", default=None, flag="--model-width",
              help="the model's width (default: its own; the AdaptSFL recipe trains the cnn at 16)")
    add_field(parser, "devices")
    add_field(parser, "partition")
    add_field(parser, "dirichlet_alpha", dest="alpha")
    add_field(parser, "rounds", default=600)
    add_field(parser, "batch_size", default=None, shown="16, AdaptSFL's")
    setting_options(parser)
    add_field(parser, "eval_every", default=5, help="evaluate every K rounds (default 5; the time to target is "
              "interpolated between evaluations)")
    add_field(parser, "max_test_samples", default=500, flag="--test-samples", dest="test_samples",
              help="test images per evaluation (default 500)")
    parser.add_argument("--seeds", default="0,1,2", metavar="S,S,...",
                        help="seeds of data, model and samplers, one run of every plan each (default 0,1,2)")
    add_field(parser, "target_accuracy", default=0.4, help="target test accuracy, a fraction (default 0.4)")
    parser.add_argument("--intervals", default="1,2,4,8", metavar="I,I,...",
                        help="the grid's aggregation intervals I, in rounds (default 1,2,4,8)")
    parser.add_argument("--defence", default="none", metavar="SETTING",
                        help="every run's devices defend their activations (clip=C,noise=σ,nopeek=α,labels=ε, any of "
                             "them, or clip_rms=c; docs/privacy.md \"Defences\"); the planners plan with its FLOPs "
                             "charged (eqs. 16, 21), as `plan --defence` does (default none)")
    parser.add_argument("--leakage-table", metavar="FILE",
                        help="with --max-leakage: the model's leakage table (`adaptplan profile MODEL --leakage "
                             "--leakage-out FILE`, measured under --defence)")
    parser.add_argument("--max-leakage", metavar="METRIC=LIMIT",
                        help="every plan within this leakage budget (dcor=0.9 for every device, or dcor=0.9,0.8,... "
                             "one limit per device; docs/privacy.md): the grid's one-cut plans at the cuts every device "
                             "may use, each device's latency-best cut among its own, the planners planning within it")
    parser.add_argument("--workers", type=int_flag(1, MAX_THREADS, "processes"),
                        help="worker processes, one torch thread each (default: all cores)")
    add_device_options(parser)
    parser.add_argument("--out", metavar="DIR",
                        help="write table.txt (and results.json, heatmap.png unless --json, --plot name other files) "
                             "into DIR and train each run in DIR/runs/seed<S>/<plan>: the same command run again reads "
                             "back the runs that ended and continues stopped ones (default: runs in a temporary folder)")
    parser.add_argument("--json", metavar="FILE", help="write every plan's figures, runs and curves as JSON to FILE")
    parser.add_argument("--plot", metavar="PNG", help="write the heat-map (cut × I, colour = mean simulated seconds to "
                        "target, the planner's plan outlined) to PNG")


def _training_options(parser: argparse.ArgumentParser, rounds: int, target: float) -> None:
    """The options both training benchmarks share (what every run of the benchmark trains with)."""
    add_field(parser, "rounds", default=rounds, help=f"rounds per run (default {rounds})")
    add_field(parser, "devices")
    add_field(parser, "dataset")
    add_field(parser, "model")
    add_field(parser, "seed", help="seed of data, model, samplers and system trace (default 0)")
    setting_options(parser)
    add_field(parser, "eval_every", help="evaluate every K rounds (default 10)")
    add_field(parser, "max_test_samples", default=500, flag="--test-samples", dest="test_samples",
              help="test images per evaluation (default 500)")
    add_field(parser, "target_accuracy", default=target, help=f"target test accuracy, a fraction (default {target})")
    parser.add_argument("--workers", type=int_flag(1, MAX_THREADS, "processes"),
                        help="worker processes, one torch thread each (default: all cores)")
    add_device_options(parser)


def setting_options(parser: argparse.ArgumentParser) -> None:
    """The flags that change the comparison's one training setting for every method at once (default: the
    comparison's own, printed above its table; adaptplan.benches.comparison)."""
    group = parser.add_argument_group("the one training setting of every method (default: the comparison's, "
                                      "printed above its table)")
    for key in ("optimizer", "lr", "client_lr", "server_lr", "momentum", "weight_decay", "clip_norm"):
        add_field(group, key, default=None, shown="the comparison's")
    add_field(group, "participation", default=None, shown="the comparison's",
              help="fraction ρ of the devices per round (GAS: C = ⌈ρN⌉ active)")
    add_field(group, "local_steps", default=None, shown="the comparison's",
              help="local rounds between two averages: the interval I of every averaging algorithm, GAS's E")
    add_field(group, "client_state", default=None, shown="the comparison's",
              help="a device that loads the global client model keeps (keep) or restarts (restart) its optimizer "
                   "state, for every method")


def setting_from(args: argparse.Namespace, base: "Setting") -> "Setting":
    """``base`` with the setting flags given on the command line (and ``--rounds``, ``--batch-size``) applied."""
    names = ("optimizer", "lr", "client_lr", "server_lr", "momentum", "weight_decay", "clip_norm", "participation",
             "local_steps", "rounds", "batch_size", "client_state")
    return base.with_overrides(**{n: getattr(args, n, None) for n in names})


def workload_from(args: argparse.Namespace, setting: "Setting", kind: "type[W]") -> "W":
    """The bench's workload of class ``kind`` (:class:`adaptplan.benches.workload.Workload` or a subclass) from its
    flags: every field that the command has a flag of (``target`` from ``--target-accuracy``; the rest keep the
    class's defaults), with ``setting``."""
    from dataclasses import fields

    def flag(name: str) -> str:
        return "target_accuracy" if name == "target" else name

    return kind(setting, **{f.name: getattr(args, flag(f.name)) for f in fields(kind)
                            if f.name != "setting" and hasattr(args, flag(f.name))})


def _check_device(args: argparse.Namespace) -> None:
    """``--device cuda`` without a GPU fails here, once, before any worker starts."""
    from trainers.config.devices import resolve_device

    resolve_device(args.device)


def run_solvers(args: argparse.Namespace) -> int:
    from adaptplan.benches.solvers import run_solver_bench
    from adaptplan.cli.commands.plan import load_instance
    from solvers.problem import PlanningProblem

    if args.plot:
        from trainers.run.plotting import image_path

        image_path(args.plot)   # an unknown image format or a folder fails before the benchmark runs
    own = bool(args.profile or args.system or args.constants)
    profile, system, constants, title = load_instance(args)
    problem = PlanningProblem.from_parts(profile, system, constants)
    sizes = (100, 300) if args.quick else (100, 300, 1000, 3000, 10000)
    run_solver_bench(problem, sizes=sizes, seed=args.seed, plot_path=args.plot, quick=args.quick,
                     title="your instance" if own else "default scenario", generated=not own)  # prints as it goes
    return 0


def run_engine(args: argparse.Namespace) -> int:
    import json
    import sys

    from trainers.config.train_config import check_choice, check_model

    names = [a.strip() for a in args.algorithm.split(",") if a.strip()]
    algorithms = list(ALGORITHMS) if names == ["all"] else [check_choice(a, ALGORITHMS, "--algorithm") for a in names]
    clock = check_choice(args.clock, ("zero", "system"), "--clock")
    if not algorithms:
        raise InputError("name at least one algorithm", field="--algorithm")
    check_model(args.model, "--model")
    if args.plot and len(args.devices) < 2:
        raise InputError("a plot needs a sweep: give several --devices, e.g. --devices 20,200,1000", field="--plot")
    plot_path = None
    if args.plot:
        from trainers.run.plotting import image_path

        plot_path = str(image_path(args.plot)[0])   # an unknown format or a folder fails before the benchmark runs
    from adaptplan.benches.engine import EngineWorkload, header, run_engine_bench, run_engine_sweep, sweep_table
    from trainers.config.devices import resolve_device
    from trainers.config.train_config import ExecutionConfig

    workload = EngineWorkload(args.devices[0], args.batch_size, args.rounds, args.cut, tuple(algorithms), args.model,
                              repeats=args.repeats, clock=clock, count_flops=args.flops)
    execution = ExecutionConfig(args.device, args.client_batching, args.client_recompute, args.server_pass_samples,
                                args.threads)
    device = resolve_device(args.device)           # no GPU for --device cuda: one message before any work
    if len(args.devices) == 1:
        print(header(workload, device.type), file=sys.stderr, flush=True)
        result = run_engine_bench(workload, execution)
        print(json.dumps(result.to_json(), indent=2) if args.json else result.report())
        return 0
    results = run_engine_sweep(args.devices, workload, execution, plot_path=plot_path,
                               progress=lambda text: print(f"[bench] {text}", file=sys.stderr, flush=True))
    if args.json:
        print(json.dumps([r.to_json() for r in results], indent=2))
    else:
        print("\n\n".join(r.report() for r in results) + "\n\nsweep:\n" + sweep_table(results))
    if plot_path:
        print(f"[bench] wrote {plot_path}", file=sys.stderr)
    return 0


def device_counts(text: str) -> list[int]:
    """``"20,200,1000"`` → [20, 200, 1000], each in 1..MAX_BENCH_DEVICES (a --devices type)."""
    parse = int_flag(1, MAX_BENCH_DEVICES, "devices")
    counts = [parse(part.strip()) for part in text.split(",") if part.strip()]
    if not counts:
        raise argparse.ArgumentTypeError(f"expected N or N,N,... devices, got {text!r}")
    return counts


def run_algorithms(args: argparse.Namespace) -> int:
    from adaptplan.benches import algorithms as bench
    from adaptplan.benches.workload import Workload
    from trainers.config.train_config import check_choice

    algorithms = [check_choice(a.strip(), ALGORITHMS, "--algorithms") for a in args.algorithms.split(",") if a.strip()]
    partitions = [check_choice(p.strip(), tuple(bench.PARTITIONS), "--partitions") for p in args.partitions.split(",")
                  if p.strip()]
    if not algorithms or not partitions:
        raise InputError("name at least one algorithm and one partition", field="--algorithms")
    _check_device(args)
    cuts = None
    if args.cuts:
        try:
            cuts = [int(args.cuts)] * args.devices
        except ValueError:
            raise InputError(f"one integer cut for every device, got {args.cuts!r}", field="--cuts") from None
    out = Path(args.out) if args.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    setting = setting_from(args, bench.GAPSL_SETTING)
    for algorithm in algorithms:
        setting.fields(algorithm, args.devices)          # one message naming the flag before any run starts
    results = bench.run_algorithm_bench(algorithms, partitions, workload_from(args, setting, Workload), seed=args.seed,
                                        cuts=cuts, workers=args.workers)
    text = bench.table(results, args.target_accuracy, setting)
    print(text)
    if out is not None:
        (out / "table.txt").write_text(text + "\n", encoding="utf-8")
        bench.save_json(results, args.target_accuracy, out / "results.json", setting)
        from adaptplan.benches.runs import plot

        plot(results, out / "accuracy.png")
        print(f"wrote {out / 'table.txt'}, {out / 'results.json'}, {out / 'accuracy.png'}")
    return 0


def run_training(args: argparse.Namespace) -> int:
    from adaptplan.benches import training as bench
    from adaptplan.benches.runs import plot
    from adaptplan.benches.workload import Workload
    from trainers.config.train_config import POLICIES, check_choice

    policies = [check_choice(p.strip(), POLICIES, "--policies") for p in args.policies.split(",") if p.strip()]
    if "fixed-cut" in policies:
        raise InputError("fixed-cut needs a cut; compare it with adaptplan train --policy fixed-cut --cuts J", field="--policies")
    partitions = list(bench.PARTITIONS) if args.partitions == "both" else [
        check_choice(args.partitions, bench.PARTITIONS + ("both",), "--partition")]
    _check_device(args)
    if not policies:
        raise InputError("name at least one policy", field="--policies")
    out = Path(args.out) if args.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    sweep = _sweep(args.sweep, bench.SWEEPS) if args.sweep else None
    more = _fractions(args.more_targets, "--more-targets")
    setting = setting_from(args, bench.ADAPTSFL_SETTING)
    if setting.local_steps is not None:
        raise InputError("the planning policies decide the interval; drop --local-steps", field="--local-steps")
    planning = bench.Planning(replan_every=args.replan_every, noise_cv=args.noise_cv, sweep=sweep)
    results = bench.run_training_bench(policies, partitions, workload_from(args, setting, Workload), planning, seed=args.seed,
                                       workers=args.workers)
    text = bench.table(results, args.target_accuracy, more, setting)
    if sweep is not None:
        text += "\n" + bench.sweep_table(results, sweep[0])
        if out is not None:
            bench.sweep_plot(results, sweep[0], out / f"sweep-{sweep[0]}.png")
    print(text)
    if args.json:
        bench.save_json(results, args.target_accuracy, args.json, more, setting)
        print(f"wrote {args.json}", file=sys.stderr)
    if out is not None:
        (out / "table.txt").write_text(text + "\n", encoding="utf-8")
        plot(results, out / "accuracy.png")
        print(f"wrote {out / 'table.txt'} and {out / 'accuracy.png'}")
    return 0


def run_papers(args: argparse.Namespace) -> int:
    from adaptplan.benches import papers as bench

    selected = bench.parse_papers(args.papers)
    tier = "test" if args.quick else args.tier
    seeds = args.seeds if args.seeds is not None else (1 if tier == "test" else bench.DEFAULT_SEEDS)
    if seeds < 1:
        raise InputError(f"must be ≥ 1, got {seeds}", field="--seeds")
    if seeds == 1 and tier != "test":
        raise InputError("one seed has no spread: give ≥ 2 (3 by default), or 1 with --tier test", field="--seeds")
    if args.data_root is not None and not Path(args.data_root).is_dir():
        raise InputError(f"{args.data_root!r} is not a directory", field="--data-root")
    if args.target_accuracy is not None and not 0 < args.target_accuracy <= 1:
        raise InputError(f"must be a fraction in (0, 1], got {args.target_accuracy}", field="--target-accuracy")
    book = bench.catalogue(selected, tier=tier, data_root=args.data_root, fashion_mnist=args.full_fashion_mnist)
    _check_device(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    files = bench.write_run_files(bench.jobs(book, list(range(seeds)), args.device, args.client_batching,
                                             args.target_accuracy), out / "runs")
    print(f"wrote {len(files)} run files into {out / 'runs'} (adaptplan train --config FILE trains one run alone)",
          file=sys.stderr)
    todo, results = bench.run_paper_bench(book, range(seeds), workers=args.workers, device=args.device,
                                          client_batching=args.client_batching, target=args.target_accuracy,
                                          runs_dir=out / "runs")
    found = bench.comparisons(todo, results, book, args.target_accuracy)
    text = bench.table(found, book, todo, results, args.target_accuracy)
    print(text)
    (out / "table.txt").write_text(text + "\n", encoding="utf-8")
    bench.save_json(found, book, todo, results, out / "results.json")
    bench.plot(todo, results, book, out / "accuracy.png")
    print(f"wrote {out / 'table.txt'}, {out / 'results.json'}, {out / 'accuracy.png'}")
    return 0


def _fractions(text: str, flag: str) -> list[float]:
    """``A,B,...`` → accuracies in (0, 1]; one message naming ``flag`` otherwise."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InputError(f"must be fractions separated by commas, got {text!r}", field=flag) from None
    if any(not 0 < v <= 1 for v in values):
        raise InputError(f"each must be a fraction in (0, 1], got {text!r}", field=flag)
    return values


def _sweep(text: str, names: dict[str, str]) -> tuple[str, list[float]]:
    """``NAME=V1,V2,...`` → (NAME, [values]); one message naming --sweep otherwise."""
    name, _, values = text.partition("=")
    if name not in names or not values:
        raise InputError(f"expected NAME=V1,V2,... with NAME one of {', '.join(names)}; got {text!r}", field="--sweep")
    try:
        numbers = [float(v) for v in values.split(",") if v.strip()]
    except ValueError:
        raise InputError(f"values must be numbers, got {values!r}", field="--sweep") from None
    lowest = 0.0 if name == "noise-cv" else 1e-300
    if not numbers or any(not (lowest <= v < float("inf")) for v in numbers):
        raise InputError(f"values must be finite and {'≥ 0' if name == 'noise-cv' else '> 0'}, got {values!r}",
                         field="--sweep")
    return name, numbers




def run_plans(args: argparse.Namespace) -> int:
    import tempfile

    from adaptplan.benches import plans as bench
    from adaptplan.benches.training import ADAPTSFL_SETTING
    from trainers.config.train_config import DATASETS, PARTITIONS, check_choice, check_model

    check_choice(args.dataset, DATASETS, "--dataset")
    check_model(args.model, "--model")
    check_choice(args.partition, PARTITIONS, "--partition")
    seeds = whole_numbers(args.seeds, "--seeds", 0, MAX_SEED)
    intervals = whole_numbers(args.intervals, "--intervals", 1, MAX_STEPS)
    from adaptplan.defence_cost import DefenceSetting

    args.defence = DefenceSetting.parse(args.defence, "--defence").name    # one message naming the flag; its name
    if max(intervals) > args.rounds:
        raise InputError(f"I = {max(intervals)} exceeds --rounds {args.rounds}: those runs would never average the "
                         "devices' models; give intervals up to the rounds", field="--intervals")
    setting = setting_from(args, ADAPTSFL_SETTING)
    if setting.local_steps is not None:
        raise InputError("each plan sets its own interval (--intervals); drop --local-steps", field="--local-steps")
    setting.fields(bench.ALGORITHM, args.devices, planned=True)     # one message naming the flag before any run
    from adaptplan.leakage_table import check_budget_pair

    check_budget_pair(args.leakage_table, args.max_leakage)
    out = Path(args.out) if args.out else None
    json_path = args.json or (str(out / "results.json") if out is not None else None)
    plot_path = args.plot or (str(out / "heatmap.png") if out is not None else None)
    if plot_path is not None:
        from trainers.run.plotting import image_path

        try:
            plot_path = str(image_path(plot_path)[0])     # an unknown format or a folder fails before any run
        except InputError as exc:
            raise InputError(exc.message, field="--plot" if args.plot else "--out") from None
    _check_device(args)
    setup = workload_from(args, setting, bench.BenchSetting)
    if setup.max_leakage is not None:
        bench.probe(setup, seeds[0], intervals[:1])      # the budget's table against the model, before anything is written
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="adaptplan-bench-plans-") as scratch:
        runs_dir = out / "runs" if out is not None else Path(scratch)
        results, missing = bench.run_plans_bench(setup, seeds, intervals, runs_dir, workers=args.workers)
    text = bench.table(results, setup, seeds, missing)
    print(text)
    written = []
    if out is not None:
        (out / "table.txt").write_text(text + "\n", encoding="utf-8")
        written.append(str(out / "table.txt"))
    if json_path is not None:
        bench.save_json(results, setup, seeds, intervals, json_path)
        written.append(json_path)
    if plot_path is not None:
        bench.plot(results, intervals, plot_path)
        written.append(plot_path)
    if written:
        print(f"wrote {', '.join(written)}", file=sys.stderr)
    return 0
