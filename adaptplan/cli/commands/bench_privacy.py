"""``adaptplan bench privacy``: per cut and defence setting, accuracy and simulated time beside the leakage of the
trained model's released activations (adaptplan/benches/privacy.py, docs/privacy.md "The attack bench")."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, cast

from adaptplan.cli.config_flags import add_field
from adaptplan.cli.flags import int_flag, whole_numbers
from adaptplan.errors import InputError
from adaptplan.limits import MAX_CUT_POINTS, MAX_SEED, MAX_THREADS

DEFENCES = "none;clip=4,noise=1;nopeek=0.5"
"""The default settings of ``--defences``: none, the Gaussian mechanism at C = 4, σ = 1, and NoPeek at α = 0.5."""


def privacy_parser(which: argparse._SubParsersAction) -> None:
    p = which.add_parser("privacy", help="per cut and defence: test accuracy and simulated time beside the trained "
                         "model's leakage (inversion PSNR/SSIM, dCor, label-inference AUCs) over seeds; a trade-off plot")
    add_field(p, "dataset")
    add_field(p, "model")
    p.add_argument("--algorithm", default="sfl-v1", help="the split algorithm every run trains (default sfl-v1)")
    add_field(p, "devices", default=10)
    add_field(p, "rounds", default=200)
    add_field(p, "batch_size", default=16)
    add_field(p, "eval_every", default=50)
    add_field(p, "max_test_samples", default=500, flag="--test-samples", dest="test_samples",
              help="test samples per evaluation (default 500)")
    p.add_argument("--cuts", default=None, metavar="J,J,...",
                   help="the cuts, every device at each in turn (default: every cut of the model but its output)")
    p.add_argument("--defences", default=DEFENCES, metavar="SETTING;...",
                   help=f"defence settings separated by ';', each none or clip=C,noise=σ,nopeek=α (any of them; "
                        f"default {DEFENCES})")
    p.add_argument("--seeds", default="0,1,2", metavar="S,S,...", help="seeds (default 0,1,2)")
    p.add_argument("--leakage-samples", type=int_flag(2, 4096, "samples"), default=256,
                   help="training samples attacked, and test samples the inversion attacker fits on (default 256)")
    p.add_argument("--workers", type=int_flag(1, MAX_THREADS, "processes"),
                   help="worker processes, one torch thread each (default: all cores)")
    p.add_argument("--out", metavar="DIR", help="write table.txt, results.json and tradeoff.png into DIR and each "
                   "run into DIR/runs/seed<S>/cut<j>/<defence> (a rerun reads back the finished runs)")
    p.set_defaults(func=run_privacy)


def run_privacy(args: argparse.Namespace) -> int:
    from adaptplan.benches import privacy as bench
    from adaptplan.benches.runs import run_jobs
    from adaptplan.fileio import save_json
    from trainers.config.train_config import ALGORITHMS, DATASETS, check_choice, check_model

    check_choice(args.dataset, DATASETS, "--dataset")
    check_model(args.model, "--model")
    check_choice(args.algorithm, ALGORITHMS, "--algorithm")
    defences = bench.parse_defences(args.defences)
    seeds = whole_numbers(args.seeds, "--seeds", 0, MAX_SEED)
    base = {"algorithm": args.algorithm, "dataset": args.dataset, "model": args.model, "devices": args.devices,
            "rounds": args.rounds, "batch_size": args.batch_size, "eval_every": args.eval_every,
            "max_test_samples": args.test_samples, "threads": 1}
    cuts, blocks = _cuts(args, base)
    for d in defences:
        left = [c for c in cuts if c in bench.head_cuts(blocks, d.head)]
        if d.head and not left:
            raise InputError(f"{d.name} keeps {d.head} of the model's {blocks} blocks on the device: it runs at cuts "
                             f"1..{blocks - d.head - 1}, none of {cuts}", field="--defences")
        if d.head and left != cuts:
            print(f"note: {d.name} runs at cuts {left} only (a cut from {blocks - d.head} on leaves the edge server "
                  "nothing before the head)", file=sys.stderr)
    out = Path(args.out) if args.out else None
    jobs = bench.privacy_jobs(base, cuts, defences, seeds, args.leakage_samples, out, blocks)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    figures = cast(list[dict[str, Any]], run_jobs(jobs, workers=args.workers, desc="bench privacy",
                                                  work=bench.privacy_run))     # privacy_run's figures, one per job
    rows = bench.summarise(jobs, figures)
    header = (f"bench privacy: {args.algorithm}, {args.model} on {args.dataset}, {args.devices} devices, {args.rounds} "
              f"rounds, batch {args.batch_size}; seeds {', '.join(map(str, seeds))} (mean ± s.d.); the leakage of the "
              f"trained model's released activations at the run's cut, {args.leakage_samples} training samples "
              "attacked (docs/privacy.md \"The attack bench\"); ε: the largest device's, under noise")
    text = bench.table(rows, header)
    print(text)
    if out is not None:
        (out / "table.txt").write_text(text + "\n", encoding="utf-8")
        save_json({"header": header, "rows": [r.to_json() for r in rows], "runs": [
            {k: j[k] for k in ("cut", "defence", "seed")} | {"figures": f} for j, f in zip(jobs, figures)]},
            out / "results.json")
        bench.plot(rows, out / "tradeoff.png")
        print(f"wrote {out / 'table.txt'}, {out / 'results.json'}, {out / 'tradeoff.png'}", file=sys.stderr)
    return 0


def _cuts(args: argparse.Namespace, base: dict[str, Any]) -> tuple[list[int], int]:
    """``--cuts`` (checked against the model's cut points), or every cut of the model but its output; and the model's
    number of blocks."""
    from profilers import build_chain
    from trainers.inputs.datasets import load_dataset
    from trainers.inputs.models import build_model

    data = load_dataset(base["dataset"])
    shape = tuple(int(s) for s in data.x_train.shape[1:])
    last = len(build_chain(build_model(base["model"], shape, data.num_classes), data.x_train[:2]).blocks)
    if args.cuts is None:
        return list(range(1, last)), last
    cuts = whole_numbers(args.cuts, "--cuts", 1, MAX_CUT_POINTS)
    if max(cuts) >= last:
        raise InputError(f"the model has cuts 1..{last - 1} below its output, got {max(cuts)}", field="--cuts")
    return cuts, last
