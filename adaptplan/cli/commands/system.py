"""`adaptplan system`: generate a system file from uniform ranges (docs/formats.md "System")."""

from __future__ import annotations

import argparse
import json
import sys

from adaptplan.cli.flags import float_flag, int_flag, positive_float_flag
from adaptplan.limits import MAX_BATCH_SIZE, MAX_DEVICES, MAX_NOISE_CV, MAX_ROUNDS, MAX_SEED


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "system",
        help="generate a system (devices, links, servers) from uniform ranges",
        description="Draw a system from uniform ranges. Defaults are the PLACEHOLDER values of docs/model.md §6.1 "
                    "(the paper's Table II numbers were not recovered). With --redraw and --round T, prints "
                    "round T's state (device FLOP/s and uplinks re-drawn every round, as in the AdaptSFL "
                    "experiments); --noise-cv adds Gaussian measurement noise (the Fig. 9 setting).",
    )
    parser.add_argument("--devices", type=int_flag(1, MAX_DEVICES, "devices"), required=True, help="number of edge devices N")
    parser.add_argument("--seed", type=int_flag(0, MAX_SEED), default=0, help="random seed (default 0)")
    parser.add_argument("--flops", nargs=2, type=positive_float_flag("FLOP/s"), metavar=("LOW", "HIGH"), default=(0.5e12, 1.5e12),
                        help="device compute range in FLOP/s (placeholder default 0.5e12 1.5e12)")
    parser.add_argument("--up-bps", nargs=2, type=positive_float_flag("bit/s"), metavar=("LOW", "HIGH"), default=(70e6, 80e6),
                        help="device uplink range (to edge and fed server) in bit/s (placeholder default 70e6 80e6)")
    parser.add_argument("--down-bps", nargs=2, type=positive_float_flag("bit/s"), metavar=("LOW", "HIGH"), default=(350e6, 380e6),
                        help="device downlink range in bit/s (placeholder default 350e6 380e6)")
    parser.add_argument("--server-flops", type=positive_float_flag("FLOP/s"), default=50e12,
                        help="edge server compute in FLOP/s (placeholder default 50e12)")
    parser.add_argument("--edge-fed-bps", type=positive_float_flag("bit/s"), default=500e6,
                        help="edge<->fed server rate in bit/s, both directions (placeholder default 500e6)")
    parser.add_argument("--batch-size", type=int_flag(1, MAX_BATCH_SIZE, "samples"), default=16, help="mini-batch size b in samples (default 16)")
    parser.add_argument("--memory-bytes", nargs=2, type=positive_float_flag("bytes"), metavar=("LOW", "HIGH"),
                        help="also give every device a memory budget in bytes, log-uniform in [LOW, HIGH] "
                             "(a cut is then admissible only if the profile's client_memory_bytes fit)")
    parser.add_argument("--redraw", action="store_true", help="re-draw device FLOP/s and uplink rates every round")
    parser.add_argument("--round", type=int_flag(1, MAX_ROUNDS, "rounds"), default=1,
                        help="with --redraw: which round's state to print (1-based, default 1)")
    parser.add_argument("--noise-cv", type=float_flag(0.0, MAX_NOISE_CV), default=0.0,
                        help=f"Gaussian measurement noise, coefficient of variation, a fraction in 0..{MAX_NOISE_CV:g} (e.g. 0.1)")
    parser.add_argument("-o", "--output", metavar="FILE", help="write to FILE (.json or .toml) instead of stdout")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from adaptplan.system import SystemProcess, SystemRanges, generate_system, with_memory_budgets

    ranges = SystemRanges(device_flops=tuple(args.flops), up_bps=tuple(args.up_bps), down_bps=tuple(args.down_bps),
                          server_flops=args.server_flops, edge_fed_bps=args.edge_fed_bps, batch_size=args.batch_size)
    base = generate_system(args.devices, args.seed, ranges)
    if args.memory_bytes:
        base = with_memory_budgets(base, args.memory_bytes, args.seed)
    process = SystemProcess(base, seed=args.seed, redraw=args.redraw, noise_cv=args.noise_cv, ranges=ranges)
    system = process.measured(args.round)
    if args.output:
        system.save(args.output)
        print(f"wrote {args.output} ({system.num_devices} devices)", file=sys.stderr)
    else:
        json.dump(system.to_json(), sys.stdout, indent=2)
        print()
    return 0
