"""`adaptplan train`: run split training with one algorithm (trainers.run).

Errors of the run's configuration name the command-line flag (``--model``, ``--alpha``...), not
the ``TrainConfig`` field behind it.
"""

from __future__ import annotations

import argparse
import json

from adaptplan.errors import InputError
from trainers.config import ALGORITHM_OPTIONS, ALGORITHMS, DATASETS, MODELS, OPTIMIZERS, PARTITIONS

# TrainConfig field → flag, where the flag is not "--" + the field with "_" → "-"
FLAGS = {"dirichlet_alpha": "--alpha", "plan_path": "--plan", "system_path": "--system",
         "constants_path": "--constants", "redraw_resources": "--static-resources", "progress": "--no-progress"}


def _cuts(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(c) for c in text.replace(",", " ").split())
    except ValueError:
        raise argparse.ArgumentTypeError(f"cuts must be integers separated by commas, got {text!r}") from None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="run split training (SL, PSL, SplitFed V1/V2, AdaptSFL, GAPSL, SCALA, CycleSL, GAS) "
                                     "on a simulated clock",
                       description="Run split training. One round = every device processes one mini-batch. "
                                   "Simulated seconds come from the latency model (eqs. 16-26); wall seconds are "
                                   "reported separately.")
    p.add_argument("--algorithm", default="adaptsfl", help=f"one of {', '.join(ALGORITHMS)} (default adaptsfl)")
    p.add_argument("--dataset", default="cifar10-subset",
                   help=f"one of {', '.join(DATASETS)} (default cifar10-subset; synthetic = tiny generated data for tests)")
    p.add_argument("--model", default="cnn",
                   help=f"built-in {', '.join(MODELS)} (default cnn), a torchvision classification model name "
                        "(resnet18, mobilenet_v2, ...; random weights) or package.module:factory")
    p.add_argument("--devices", type=int, default=20, help="number of devices N (default 20)")
    p.add_argument("--partition", default="iid", help=f"one of {', '.join(PARTITIONS)} (default iid)")
    p.add_argument("--alpha", type=float, default=0.5, help="Dirichlet concentration α for --partition dirichlet (default 0.5)")
    p.add_argument("--rounds", type=int, default=200, help="training rounds R (default 200)")
    p.add_argument("--plan", help="plan JSON file (adaptplan plan --json) giving cuts and interval")
    p.add_argument("--replan-every", type=int, help="re-plan every Q rounds at aggregation rounds (Algorithm 1), in rounds")
    p.add_argument("--interval", type=int,
                   help="client-side model-averaging interval I, in rounds (overrides the plan and every re-plan)")
    p.add_argument("--cuts", type=_cuts,
                   help="1-based cut index per device on the model's cut points as listed by `adaptplan profile MODEL` "
                        "(one value = all devices), e.g. 3 or 3,3,5; default: the built-in planner's plan")
    p.add_argument("--lr", type=float, default=0.01, help="SGD learning rate γ (default 0.01)")
    p.add_argument("--momentum", type=float, default=0.0, help="SGD momentum (default 0)")
    p.add_argument("--weight-decay", type=float, default=0.0, help="SGD weight decay (L2 coefficient, default 0)")
    p.add_argument("--optimizer", default="sgd", help=f"optimizer of every role: {', '.join(OPTIMIZERS)} (default sgd; "
                   "CycleSL's paper uses adam)")
    p.add_argument("--clip-norm", type=float, help="clip each role's gradient 2-norm at this value before every step "
                   "(SCALA's and GAS's code: 10; default: no clipping)")
    algo = p.add_argument_group("algorithm options (each applies to the algorithms named; default: the paper's value)")
    for option in ALGORITHM_OPTIONS:
        choices = f" {{{','.join(option.choices)}}}" if option.choices else ""
        algo.add_argument(option.flag, dest=f"opt_{option.name}", type=option.type, default=None,
                          help=f"[{', '.join(option.algorithms)}]{choices} {option.help} (default {option.default})")
    p.add_argument("--batch-size", type=int, default=16, help="mini-batch size b per device per round, in samples (default 16)")
    p.add_argument("--seed", type=int, default=0, help="seed for model init, partition and samplers (default 0)")
    p.add_argument("--eval-every", type=int, default=1, help="evaluate on the test set every K rounds (default 1)")
    p.add_argument("--out", help="run folder for history.json/.csv, accuracy.png and checkpoint.pt")
    p.add_argument("--checkpoint-every", type=int, help="write a checkpoint every K rounds (needs --out)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    p.add_argument("--target-accuracy", type=float, help="report simulated seconds to reach this test accuracy (fraction 0-1)")
    p.add_argument("--system", help="system JSON/TOML (default: generated from --system-seed)")
    p.add_argument("--system-seed", type=int, default=0, help="seed of the generated system and its per-round re-draws (default 0)")
    p.add_argument("--static-resources", action="store_true", help="do not re-draw device FLOP/s and uplinks every round "
                   "(re-drawing applies to generated systems only; a --system file keeps its resources)")
    p.add_argument("--constants", help="training constants JSON for the planner, one sigma2/G2 per cut point of --model "
                                             "(default: spec §6.1 placeholders)")
    p.add_argument("--data-root", metavar="DIR",
                   help="folder with the dataset files: cifar10_subset.npz / mnist_test.npz for cifar10-subset and "
                        "mnist-subset (default: $ADAPTPLAN_DATA_DIR, else the project's data/ folder), or "
                        "torchvision's files for cifar10, cifar100, fashion-mnist and full mnist (required for those)")
    p.add_argument("--download", action="store_true",
                   help="let torchvision fetch cifar10/cifar100/mnist/fashion-mnist into --data-root (needs a network)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def flag_of(field: str) -> str:
    """The flag of a TrainConfig field (``cuts[3]`` → ``--cuts[3]``); flags and other names pass through."""
    if field.startswith(("-", "$")):
        return field
    name, bracket, rest = field.partition("[")
    from trainers.config import TrainConfig

    if name not in TrainConfig.__dataclass_fields__:
        return field
    return FLAGS.get(name, "--" + name.replace("_", "-")) + bracket + rest


def run(args: argparse.Namespace) -> int:
    try:
        return _train(args)
    except InputError as exc:
        if exc.field is None or flag_of(exc.field) == exc.field:
            raise
        raise type(exc)(exc.message, field=flag_of(exc.field)) from None


def _train(args: argparse.Namespace) -> int:
    from trainers.config import TrainConfig
    from trainers.run import Trainer

    if args.checkpoint_every and not args.out:
        raise InputError("needs --out (where checkpoint.pt is written)", field="checkpoint_every")
    if args.out:
        from pathlib import Path

        out = Path(args.out)
        if any(p.exists() and not p.is_dir() for p in (out, *out.parents)):
            raise InputError(f"{args.out!r} must be a folder (a file of that name or a parent file is in the way)", field="--out")
        out.mkdir(parents=True, exist_ok=True)  # fail now, not after training
    config = TrainConfig(
        algorithm=args.algorithm, dataset=args.dataset, model=args.model, devices=args.devices,
        partition=args.partition, dirichlet_alpha=args.alpha, rounds=args.rounds, batch_size=args.batch_size,
        lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay, interval=args.interval, cuts=args.cuts,
        plan_path=args.plan, replan_every=args.replan_every, seed=args.seed, eval_every=args.eval_every,
        out=args.out, checkpoint_every=args.checkpoint_every, resume=args.resume,
        target_accuracy=args.target_accuracy, system_path=args.system, system_seed=args.system_seed,
        redraw_resources=not args.static_resources, constants_path=args.constants, data_root=args.data_root,
        download=args.download,
        threads=args.threads, progress=not args.no_progress, optimizer=args.optimizer, clip_norm=args.clip_norm,
        extra={o.name: getattr(args, f"opt_{o.name}") for o in ALGORITHM_OPTIONS if getattr(args, f"opt_{o.name}") is not None},
    )
    history = Trainer(config).run()
    if args.out:
        from pathlib import Path

        from trainers.plotting import plot_histories

        plot_histories([(f"{args.algorithm}", history)], Path(args.out) / "accuracy.png")
    print(json.dumps(history.summary(args.target_accuracy), indent=2))
    return 0
