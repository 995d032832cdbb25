"""`adaptplan train`: run split training with one algorithm (trainers.run).

Errors of the run's configuration name the command-line flag (``--model``, ``--alpha``...), not
the ``TrainConfig`` field behind it.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from adaptplan.errors import InputError
from trainers.config import (
    ALGORITHM_OPTIONS,
    ALGORITHMS,
    CLIENT_BATCHING,
    DATASETS,
    DEVICES,
    MODELS,
    OPTIMIZERS,
    OWN_MODEL_HELP,
    PARTITIONS,
    POLICIES,
)

if TYPE_CHECKING:  # pragma: no cover
    from trainers.config import TrainConfig

# TrainConfig field → flag, where the flag is not "--" + the field with "_" → "-"
FLAGS = {"dirichlet_alpha": "--alpha", "plan_path": "--plan", "system_path": "--system",
         "constants_path": "--constants", "redraw_resources": "--static-resources", "progress": "--no-progress",
         "transport": "--runtime"}


def _defaults_line(algorithm: str) -> str:
    """``sgd 0.005/0.01 m0.9`` — an algorithm's default optimizer, client/server lr, momentum, decay, clip, I."""
    from trainers.config import ALGORITHM_DEFAULTS

    d = ALGORITHM_DEFAULTS[algorithm]
    lr = f"{d.lr:g}" if d.client_lr == d.server_lr == d.lr else f"{d.client_lr:g}/{d.server_lr:g}"
    parts = [d.optimizer, lr] + ([f"m{d.momentum:g}"] if d.optimizer == "sgd" else [])
    parts += [f"wd {d.weight_decay:g}"] if d.weight_decay else []
    parts += [f"clip {d.clip_norm:g}"] if d.clip_norm else []
    parts += [f"I {d.interval}"] if d.interval else []
    return " ".join(parts)


def _cuts(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(c) for c in text.replace(",", " ").split())
    except ValueError:
        raise argparse.ArgumentTypeError(f"cuts must be integers separated by commas, got {text!r}") from None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help=f"run split training ({', '.join(ALGORITHMS)}) on a simulated clock",
                       description="Run split training. One round = every device processes one mini-batch. "
                                   "Simulated seconds come from the latency model (eqs. 16-26); wall seconds are "
                                   "reported separately.")
    p.add_argument("--algorithm", default="adaptsfl", help=f"one of {', '.join(ALGORITHMS)} (default adaptsfl)")
    p.add_argument("--dataset", default="cifar10-subset",
                   help=f"one of {', '.join(DATASETS)} (default cifar10-subset; synthetic = tiny generated data for tests)")
    p.add_argument("--model", default="cnn",
                   help=f"built-in {', '.join(MODELS)} (default cnn), a torchvision classification model name "
                        f"(resnet18, mobilenet_v2, ...; random weights) or {OWN_MODEL_HELP}")
    p.add_argument("--devices", type=int, default=20, help="number of devices N (default 20)")
    p.add_argument("--partition", default="iid", help=f"one of {', '.join(PARTITIONS)} (default iid)")
    p.add_argument("--alpha", type=float, default=0.5, help="Dirichlet concentration α for --partition dirichlet and dirichlet-equal (default 0.5)")
    p.add_argument("--rounds", type=int, default=200, help="training rounds R (default 200)")
    p.add_argument("--plan", help="plan JSON file (adaptplan plan --json) giving cuts and interval")
    p.add_argument("--policy", help=f"planning policy deciding cuts and interval in the loop: {', '.join(POLICIES)} "
                   "(random ones re-draw at every aggregation; adaptsfl re-plans every --replan-every rounds; fixed-cut "
                   "uses --cuts J); default: plan once with the built-in planner")
    p.add_argument("--reestimate", action="store_true",
                   help="at every re-planning point, re-estimate beta, sigma_j^2, G_j^2 and theta from the run's own "
                        "model and data (Algorithm 1) instead of keeping the constants fixed")
    p.add_argument("--replan-every", type=int, help="re-plan every Q rounds at aggregation rounds (Algorithm 1), in rounds")
    p.add_argument("--interval", type=int,
                   help="client-side model-averaging interval I, in rounds (overrides the plan and every re-plan)")
    p.add_argument("--cuts", type=_cuts,
                   help="1-based cut index per device on the model's cut points as listed by `adaptplan profile MODEL` "
                        "(one value = all devices), e.g. 3 or 3,3,5; default: the built-in planner's plan")
    opt = p.add_argument_group("optimizers (default: each algorithm's paper settings, docs/algorithms.md \"Defaults\": "
                               + "; ".join(f"{a} {_defaults_line(a)}" for a in ALGORITHMS) + "; scaled to the built-in "
                               "data: b = 16 samples for every algorithm (about a tenth of CIFAR-10's images), SCALA "
                               "and CycleSL at least 2 participants, GAS half the devices active)")
    opt.add_argument("--lr", type=float, help="learning rate γ of both roles, also the planner's γ (default: the "
                     "algorithm's)")
    opt.add_argument("--client-lr", type=float, help="the devices' learning rate (default: --lr if given, else the "
                     "algorithm's)")
    opt.add_argument("--server-lr", type=float, help="the edge server's learning rate (default: --lr if given, else "
                     "the algorithm's)")
    opt.add_argument("--momentum", type=float, help="SGD momentum of both roles (default: the algorithm's)")
    opt.add_argument("--weight-decay", type=float, help="weight decay, L2 coefficient (default: the algorithm's)")
    opt.add_argument("--optimizer", help=f"optimizer of both roles: {', '.join(OPTIMIZERS)} (default: the algorithm's)")
    opt.add_argument("--client-optimizer", help="the devices' optimizer (default: --optimizer)")
    opt.add_argument("--server-optimizer", help="the edge server's optimizer (default: --optimizer)")
    opt.add_argument("--clip-norm", type=float, help="clip each role's gradient 2-norm at this value before every step; "
                     "0 = no clipping (default: the algorithm's, 10 for SCALA and GAS as in their code)")
    algo = p.add_argument_group("algorithm options (each applies to the algorithms named; default: the paper's value)")
    for option in ALGORITHM_OPTIONS:
        choices = f" {{{','.join(option.choices)}}}" if option.choices else ""
        algo.add_argument(option.flag, dest=f"opt_{option.name}", type=option.type, default=None,
                          help=f"[{', '.join(option.algorithms)}]{choices} {option.help} (default "
                               f"{option.describe_default()})")
    p.add_argument("--batch-size", type=int, default=16, help="mini-batch size b per device per round, in samples (default 16)")
    p.add_argument("--seed", type=int, default=0, help="seed for model init, partition and samplers (default 0)")
    p.add_argument("--eval-every", type=int, default=10, help="evaluate on the test set every K rounds (default 10; "
                   "an evaluation costs about as much as 3 training rounds of the default run)")
    p.add_argument("--max-test-samples", type=int, help="evaluate on the first K test images only (default: all)")
    p.add_argument("--local-test-fraction", type=float, default=0.1,
                   help="share of each device's samples held out (never trained on) for the local evaluation "
                        "protocol: every evaluation also reports the accuracy of each device's model on its own "
                        "held-out samples, pooled over the devices (CycleSL's sample-wise 90/10 split); 0 = none, at "
                        "most 0.5 (default 0.1)")
    p.add_argument("--out", help="run folder for history.json/.csv, accuracy.png and checkpoint.pt")
    p.add_argument("--checkpoint-every", type=int, help="write a checkpoint every K rounds (needs --out)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its checkpoint with the options it was started with (only "
                        "--rounds, --eval-every, --checkpoint-every, --threads, --device, --client-batching, "
                        "--client-recompute, --server-pass-samples, --target-accuracy, --no-progress and the "
                        "distributed-run options may be given anew)")
    p.add_argument("--trust-run-folder", action="store_true",
                   help="with --resume: import the user model (package.module:factory) that the run folder's checkpoint "
                        "names without naming it again with --model (by default a resumed run imports only code "
                        "named on the command line: a run folder received from someone else runs no code)")
    p.add_argument("--overwrite", action="store_true", help="replace the run already in --out (its history, checkpoint "
                   "and plot are removed first)")
    p.add_argument("--allow-fallback", action="store_true",
                   help="when the planner finds no feasible plan, train every device at cut ceil(L/2) with I = 1 "
                        "(printed) instead of stopping with the reason")
    p.add_argument("--target-accuracy", type=float, help="report simulated seconds to reach this test accuracy (fraction 0-1)")
    p.add_argument("--system", help="system JSON/TOML (default: generated from --system-seed)")
    p.add_argument("--system-seed", type=int, default=0, help="seed of the generated system and its per-round re-draws (default 0)")
    p.add_argument("--static-resources", action="store_true", help="do not re-draw device FLOP/s and uplinks every round "
                   "(re-drawing applies to generated systems only; a --system file keeps its resources)")
    p.add_argument("--constants", help="training constants JSON for the planner, one sigma2/G2 per cut point of --model "
                                             "(default: docs/model.md §6.1 placeholders)")
    p.add_argument("--data-root", metavar="DIR",
                   help="folder with the dataset files: cifar10_subset.npz / mnist_test.npz for cifar10-subset and "
                        "mnist-subset (default: $ADAPTPLAN_DATA_DIR, else the project's data/ folder), or "
                        "torchvision's files for cifar10, cifar100, fashion-mnist and full mnist (required for those)")
    p.add_argument("--download", action="store_true",
                   help="let torchvision fetch cifar10/cifar100/mnist/fashion-mnist into --data-root (needs a network)")
    p.add_argument("--device-data", metavar="DIR",
                   help="a per-device data folder (adaptplan split-data; docs/distributed.md): each device trains on "
                        "its own file and the folder fixes the partition (--dataset, --partition do not apply); with "
                        "--distributed the edge server reads only manifest.json and test.npz, a device rank only its "
                        "devices' files")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    add_device_options(p)
    add_memory_options(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    dist = p.add_argument_group("distributed runs (torch.distributed, gloo; docs/distributed.md)")
    dist.add_argument("--distributed", action="store_true",
                      help="run the roles as processes on this machine: rank 0 edge server, rank 1 fed server, the "
                           "others host the devices; same numbers as the simulation, plus measured seconds per stage "
                           "(across machines: torchrun ... -m adaptplan.distributed OPTIONS)")
    dist.add_argument("--runtime", choices=("simulator", "torch", "mqtt"),
                      help="where the roles run: simulator (default: one process), torch (= --distributed: ranks over "
                           "torch.distributed), mqtt (ranks that connect out to a Mosquitto broker with TLS and "
                           "per-rank passwords, for devices behind NATs; needs the mosquitto package and the [mqtt] "
                           "extra; docs/mqtt.md)")
    dist.add_argument("--ranks", type=int, help="processes of a --distributed run, ≥ 3 (default: 2 + min(devices, 8); "
                      "a device rank hosts several devices when there are more devices than device ranks)")
    dist.add_argument("--emulate-links", action="store_true",
                      help="deliver every message no earlier than its size over the link's rate in the round's system "
                           "(bit/s), so measured transfer times follow the latency model on loopback")
    dist.add_argument("--rank-timeout", type=float, default=12.0,
                      help="seconds rank 0 waits for another rank's reply before the run stops naming it (default 12; "
                           "must exceed one device rank's work in a round); the other ranks wait 1.5x this for rank 0's "
                           "next command (must exceed rank 0's longest pause, e.g. an evaluation)")
    p.set_defaults(func=run, parser=p)


def add_device_options(p: argparse.ArgumentParser, batching: bool = True) -> None:
    """``--device`` and (with ``batching``) ``--client-batching``, shared by train and the benchmarks."""
    p.add_argument("--device", choices=DEVICES, default="auto",
                   help="where models and data live: auto (default: cuda when torch sees a GPU, else cpu), cpu or cuda "
                        "(an error where there is no GPU)")
    if batching:
        p.add_argument("--client-batching", choices=CLIENT_BATCHING, default="auto",
                       help="run the client blocks of devices that share a cut as one call (stacked per-device weights, "
                            "torch.func.vmap; same results up to rounding): auto (default: on with cuda, off on a cpu, "
                            "where per-device calls are faster), on or off; models with BatchNorm or Dropout stay "
                            "per device")


def add_memory_options(p: argparse.ArgumentParser) -> None:
    """``--client-recompute`` and ``--server-pass-samples`` (memory against time; the same results), shared by
    train and bench engine."""
    from adaptplan.cli.flags import auto_or_int_flag
    from adaptplan.limits import MAX_STEPS
    from trainers.config import CLIENT_RECOMPUTE, CPU_PASS_SAMPLES, RECOMPUTE_SAMPLES, SERVER_PASS_SAMPLES

    p.add_argument("--client-recompute", choices=CLIENT_RECOMPUTE, default="auto",
                   help="a device waiting for its reply keeps only its sample indices and recomputes its forward at "
                        "backward time (one more client forward per step, no client activations held; the same "
                        f"results): auto (default: when the waiting devices hold more than {RECOMPUTE_SAMPLES} samples; a barrier "
                        "of the default serve waits one server pass at a time), on or off")
    p.add_argument("--server-pass-samples", type=auto_or_int_flag(1, MAX_STEPS, "samples"), default="auto",
                   metavar="SAMPLES",
                   help="the most samples the edge server runs through its blocks in one pass: a barrier round over "
                        "more is served in chunks, its gradients accumulated (results equal up to float rounding): auto "
                        f"(default: {CPU_PASS_SAMPLES} on a cpu, where passes that fit the caches are faster, "
                        f"{SERVER_PASS_SAMPLES} on cuda) or a number; cyclesl steps on its own b_S = b batches and "
                        "gapsl's gradients g_i are taken one device at a time")


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
        raise type(exc)(exc.message, field=flag_of(exc.field)) from exc.__cause__   # kept for --debug (a user model's traceback)


def _fields_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """TrainConfig fields from the parsed flags (``extra`` holds the algorithm options given)."""
    return dict(
        algorithm=args.algorithm, dataset=args.dataset, model=args.model, devices=args.devices,
        partition=args.partition, dirichlet_alpha=args.alpha, rounds=args.rounds, batch_size=args.batch_size,
        lr=args.lr, client_lr=args.client_lr, server_lr=args.server_lr, momentum=args.momentum,
        weight_decay=args.weight_decay, interval=args.interval,
        cuts=list(args.cuts) if args.cuts is not None else None, plan_path=args.plan, replan_every=args.replan_every,
        policy=args.policy, reestimate=args.reestimate,
        seed=args.seed, eval_every=args.eval_every, max_test_samples=args.max_test_samples,
        local_test_fraction=args.local_test_fraction, out=args.out, checkpoint_every=args.checkpoint_every,
        resume=args.resume, overwrite=args.overwrite, allow_fallback=args.allow_fallback,
        target_accuracy=args.target_accuracy, system_path=args.system, system_seed=args.system_seed,
        redraw_resources=not args.static_resources, constants_path=args.constants, data_root=args.data_root,
        download=args.download, device_data=args.device_data, threads=args.threads, progress=not args.no_progress, optimizer=args.optimizer,
        client_optimizer=args.client_optimizer, server_optimizer=args.server_optimizer,
        clip_norm=args.clip_norm, device=args.device, client_batching=args.client_batching,
        client_recompute=args.client_recompute, server_pass_samples=args.server_pass_samples,
        distributed=args.distributed or args.runtime in ("torch", "mqtt"),
        transport="mqtt" if args.runtime == "mqtt" else "gloo", ranks=args.ranks, emulate_links=args.emulate_links, rank_timeout=args.rank_timeout,
        extra={o.name: getattr(args, f"opt_{o.name}") for o in ALGORITHM_OPTIONS if getattr(args, f"opt_{o.name}") is not None},
    )


def explicit_fields(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The TrainConfig fields whose flags appear in ``argv`` (``extra`` for an algorithm option)."""
    given = set()
    for action in parser._actions:
        if any(tok == opt or tok.startswith(opt + "=") for opt in action.option_strings for tok in argv):
            dest = action.dest
            if dest == "runtime":      # one flag, two fields
                given |= {"distributed", "transport"}
                continue
            field = "extra" if dest.startswith("opt_") else DEST_FIELDS.get(dest, dest)
            given.add(field)
    return given


DEST_FIELDS = {flag[2:].replace("-", "_"): field for field, flag in FLAGS.items()}
"""argparse dest → TrainConfig field, for the flags not named after their field (the inverse of FLAGS)."""


def _resumed_config(args: argparse.Namespace) -> "TrainConfig":
    """Resume from the folder alone: the checkpointed run's options, with the flags given on this
    command line applied where a resumed run may change them (``trainers.run.RESUMABLE``); a flag
    that would change anything else is an error naming it."""
    from trainers.checkpoint import load_checkpoint
    from trainers.config import TrainConfig, as_saved_run_trained
    from trainers.run import RESUMABLE

    if not args.out:
        raise InputError("needs --out (the run folder holding checkpoint.pt)", field="--resume")
    saved = as_saved_run_trained(load_checkpoint(args.out)["config"])   # an object: checked on load
    defaults = TrainConfig.__dataclass_fields__
    saved = {**{k: defaults[k].default for k in RESUMABLE if k in defaults and k not in saved}, **saved}
    missing = sorted(set(defaults) - set(saved))
    if missing:
        raise InputError(f"the checkpoint in {args.out!r} lacks the run options {missing}; start the run again with "
                         "--overwrite", field="--resume")
    given = explicit_fields(args.parser, getattr(args, "argv", []))
    _refuse_unnamed_code(saved.get("model"), args, "model" in given, args.out)
    now = _fields_from_args(args)
    merged = dict(saved)
    for field in given:
        if field in RESUMABLE:
            merged[field] = now[field]
        elif now.get(field) != saved.get(field):
            raise InputError(f"cannot change on --resume (the run used {saved.get(field)!r}); start a new run with "
                             "another --out to change it", field=field)
    merged.update(resume=True, out=args.out, overwrite=False)
    return TrainConfig.from_json(merged)


def _refuse_unnamed_code(model: Any, args: argparse.Namespace, named: bool, folder: str) -> None:
    """A checkpoint naming a user model (``package.module:factory``) is resumed only when this command line
    names the same model (``--model``) or says ``--trust-run-folder``: importing a module runs its code."""
    if not (isinstance(model, str) and ":" in model) or getattr(args, "trust_run_folder", False):
        return
    if named and args.model == model:
        return
    raise InputError(f"the run in {folder!r} trains the user model {model[:200]!r}; a resumed run imports only code "
                     f"named on the command line: add --model {model[:200]} (or --trust-run-folder if you trust the "
                     "folder)", field="--resume")


def _train(args: argparse.Namespace) -> int:
    from trainers.config import TrainConfig
    from trainers.engine import SplitEngine

    if args.plan:
        from adaptplan.plan import Plan

        Plan.load(args.plan)   # a bad plan file fails before any data is read or any folder made
    if args.checkpoint_every and not args.out:
        raise InputError("needs --out (where checkpoint.pt is written)", field="checkpoint_every")
    if args.trust_run_folder and not args.resume:
        raise InputError("applies to --resume (a run folder's checkpoint naming a user model)", field="--trust-run-folder")
    if args.resume and args.overwrite:
        raise InputError("--resume continues the run in --out; --overwrite replaces it: choose one", field="--overwrite")
    config = _resumed_config(args) if args.resume else TrainConfig(**_fields_from_args(args))
    if config.distributed:
        return _train_distributed(args, config)
    return _train_with(config, SplitEngine)


def _train_distributed(args: argparse.Namespace, config: "TrainConfig") -> int:
    """Start the ranks here (no RANK in the environment), or be rank 0 (docs/distributed.md)."""
    import sys

    from trainers.distributed.layout import default_world_size
    from trainers.distributed.session import DistributedRunError, in_rank, run_edge

    if not in_rank():
        from trainers.distributed.launch import launch_local

        argv = list(getattr(args, "argv", []))
        train_args = argv[argv.index("train") + 1:] if "train" in argv else argv
        from trainers.strategies import STRATEGIES

        return launch_local(train_args, config.ranks or default_world_size(config.devices), config.devices, config.out,
                            runtime=config.transport, partial=STRATEGIES[config.algorithm].allows_absence)
    try:
        return run_edge(config.devices, config.rank_timeout, config.emulate_links, config.threads,
                        lambda factory: _train_with(config, factory),
                        source=_device_source(config))
    except DistributedRunError as exc:
        print(f"adaptplan train: rank 0 (edge server) stopped: {exc}", file=sys.stderr)
        return 3


def _device_source(config: "TrainConfig") -> dict[str, Any]:
    """What the device ranks build from: the data set's name (or the per-device folder's manifest
    digest), the model spec and its width."""
    source: dict[str, Any] = {"dataset": config.dataset, "model": config.model, "model_width": config.model_width}
    if config.device_data is not None:
        from trainers.device_data import read_manifest

        source["device_data"] = read_manifest(config.device_data).digest
    return source


def _train_with(config: "TrainConfig", engine_factory: Any) -> int:
    import sys

    from trainers.run import Trainer
    from trainers.run_folder import Interrupted

    trainer = Trainer(config, engine_factory=engine_factory)
    print(trainer.describe_plan(), file=sys.stderr)
    if trainer.history.events[0]["source"] == "default":
        print(f"warning: {trainer.history.events[0]['reason']}", file=sys.stderr)
    for note in trainer.notes:
        print(f"warning: {note}", file=sys.stderr)
    try:
        history = trainer.run()
    except Interrupted as exc:
        print(f"adaptplan train: {exc}", file=sys.stderr)
        return 128 + exc.signum
    if config.out:
        from pathlib import Path

        from trainers.plotting import plot_histories

        plot_histories([(config.algorithm, history)], Path(config.out) / "accuracy.png")
    print(json.dumps(history.summary(config.target_accuracy), indent=2))
    return 0
