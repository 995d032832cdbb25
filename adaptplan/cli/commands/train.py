"""`adaptplan train`: run split training with one algorithm (trainers.run.driver).

Errors of the run's configuration name the command-line flag (``--model``, ``--alpha``...), not
the ``TrainConfig`` field behind it.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from adaptplan.cli.config_flags import add_part, part_values
from adaptplan.cli.flags import int_flag
from adaptplan.cli.leakage_report import MAX_LEAKAGE_SAMPLES
from adaptplan.errors import InputError
from adaptplan.limits import MAX_ROUNDS
from trainers.config.fields import described
from trainers.config.train_config import ALGORITHM_OPTIONS, ALGORITHMS

if TYPE_CHECKING:  # pragma: no cover
    from trainers.config.train_config import TrainConfig


def _defaults_line(algorithm: str) -> str:
    """``sgd 0.005/0.01 m0.9`` — an algorithm's default optimizer, client/server lr, momentum, decay, clip, I."""
    from trainers.config.train_config import ALGORITHM_DEFAULTS

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
    """``adaptplan train``: one option per field of TrainConfig's parts that has a flag (adaptplan.cli.config_flags),
    in one group per part, plus the algorithms' options, ``--cuts``, ``--runtime`` and ``--trust-run-folder``."""
    from trainers.config.train_config import (
        DataConfig,
        ExecutionConfig,
        ModelConfig,
        OptimConfig,
        PlanConfig,
        PrivacyConfig,
        RunConfig,
        RuntimeConfig,
        SystemConfig,
    )

    p = sub.add_parser("train", help=f"run split training ({', '.join(ALGORITHMS)}) on a simulated clock",
                       description="Run split training. One round = every device processes one mini-batch. "
                                   "Simulated seconds come from the latency model (eqs. 16-26); wall seconds are "
                                   "reported separately.")
    p.add_argument("--algorithm", default="adaptsfl", help=f"one of {', '.join(ALGORITHMS)} (default adaptsfl)")
    add_part(p.add_argument_group("data"), DataConfig)
    add_part(p.add_argument_group("model"), ModelConfig)
    plan = p.add_argument_group("plan: cuts and aggregation interval")
    add_part(plan, PlanConfig)
    plan.add_argument("--cuts", type=_cuts, help=described_help(PlanConfig, "cuts"))
    opt = p.add_argument_group("optimizers (default: each algorithm's paper settings, docs/algorithms.md \"Defaults\": "
                               + "; ".join(f"{a} {_defaults_line(a)}" for a in ALGORITHMS) + "; scaled to the built-in "
                               "data: b = 16 samples for every algorithm (about a tenth of CIFAR-10's images), SCALA "
                               "and CycleSL at least 2 participants, GAS half the devices active)")
    add_part(opt, OptimConfig)
    algo = p.add_argument_group("algorithm options (each applies to the algorithms named; default: the paper's value)")
    for option in ALGORITHM_OPTIONS:
        choices = f" {{{','.join(option.choices)}}}" if option.choices else ""
        algo.add_argument(option.flag, dest=f"opt_{option.name}", type=option.type, default=None,
                          help=f"[{', '.join(option.algorithms)}]{choices} {option.help} (default "
                               f"{option.describe_default()})")
    add_part(p.add_argument_group("the simulated system"), SystemConfig)
    add_part(p.add_argument_group("defences: what each device does to its activations before sending them "
                                  "(docs/privacy.md \"Defences\")"), PrivacyConfig)
    folder = p.add_argument_group(f"the run: length, evaluation, folder (a resumed run may give anew only "
                                  f"{', '.join(resumable_flags())})")
    add_part(folder, RunConfig)
    folder.add_argument("--trust-run-folder", action="store_true",
                        help="with --resume: import the user model (package.module:factory) that the run folder's "
                             "checkpoint names without naming it again with --model (by default a resumed run imports "
                             "only code named on the command line: a run folder received from someone else runs no "
                             "code)")
    add_part(p.add_argument_group("execution: how, never what (a resumed run may change these)"), ExecutionConfig)
    leak = p.add_argument_group("the trained model's leakage per cut (docs/privacy.md)")
    leak.add_argument("--leakage-out", metavar="FILE",
                      help="after the run, measure the trained model's leakage at every cut (dCor, the label-inference "
                           "AUCs, the inversion attacker's MSE/PSNR/SSIM on images) under the run's defence, and write "
                           "it as a leakage table (docs/formats.md) for `plan --leakage-table FILE --max-leakage …`; "
                           "simulator runs")
    leak.add_argument("--leakage-samples", type=int_flag(2, MAX_LEAKAGE_SAMPLES, "samples"), default=256,
                      help="with --leakage-out: the training samples attacked, the first ones (default 256), and as "
                           "many test samples for the inversion attacker's decoder")
    leak.add_argument("--leakage-every", type=int_flag(1, MAX_ROUNDS, "rounds"), metavar="N",
                      help="with --leakage-out: measure before the first round, every N rounds and at the last (each in "
                           "history.json's meta.leakage_over_rounds) and write the worst figure of each cut over them: "
                           "a budget for every round the devices send from, not only the trained model's")
    dist = p.add_argument_group("distributed runs (torch.distributed, gloo; docs/distributed.md)")
    add_part(dist, RuntimeConfig)
    dist.add_argument("--runtime", choices=("simulator", "torch", "mqtt"),
                      help="where the roles run: simulator (default: one process), torch (= --distributed: ranks over "
                           "torch.distributed), mqtt (ranks that connect out to a Mosquitto broker with TLS and "
                           "per-rank passwords, for devices behind NATs; needs the mosquitto package and the [mqtt] "
                           "extra; docs/mqtt.md)")
    p.add_argument("--config", metavar="FILE",
                   help="a run file (TOML: one key per option, by its flag without the dashes, e.g. batch-size = 16); "
                        "the command line's flags override it; every run folder holds the config.toml that "
                        "reproduces its run (docs/formats.md \"Run files\")")
    dist.add_argument("--quiet", action="store_true",
                      help="the fed server and device ranks print only errors (by default a line when they have "
                           "joined the run and one per round, on their standard output)")
    p.set_defaults(func=run, parser=p)


def described_help(part: type, key: str) -> str:
    """The help that ``part``'s field ``key`` declares (for the flags the CLI writes itself)."""
    return next(d.meta.help for d in described(part) if d.key == key)


def resumable_flags() -> list[str]:
    """The flags of the options a resumed run may change (trainers.config.train_config.RESUMABLE), but --resume itself."""
    from trainers.config.train_config import RESUMABLE

    return list(dict.fromkeys(flag_of(key) for key in RESUMABLE if key not in ("resume", "overwrite", "out")))


def add_device_options(p: argparse.ArgumentParser, batching: bool = True) -> None:
    """``--device`` and (with ``batching``) ``--client-batching``, shared by train and the benchmarks."""
    from trainers.config.train_config import ExecutionConfig

    add_part(p, ExecutionConfig, ("device", "client_batching") if batching else ("device",))


def add_memory_options(p: argparse.ArgumentParser) -> None:
    """``--client-recompute`` and ``--server-pass-samples`` (memory against time; the same results), shared by
    train and bench engine."""
    from trainers.config.train_config import ExecutionConfig

    add_part(p, ExecutionConfig, ("client_recompute", "server_pass_samples"))


def flag_of(field: str) -> str:
    """The flag of a TrainConfig flat key (``cuts[3]`` → ``--cuts[3]``); flags, keys without a flag and other
    names pass through."""
    if field.startswith(("-", "$")):
        return field
    name, bracket, rest = field.partition("[")
    from trainers.config.train_config import FLAG_OF

    return FLAG_OF[name] + bracket + rest if name in FLAG_OF else field


def run(args: argparse.Namespace) -> int:
    try:
        return _train(args)
    except InputError as exc:
        if exc.field is None or flag_of(exc.field) == exc.field:
            raise
        raise type(exc)(exc.message, field=flag_of(exc.field)) from exc.__cause__   # kept for --debug (a user model's traceback)


def fields_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """TrainConfig's flat keys from the parsed flags (``extra`` holds the algorithm options given)."""
    from trainers.config.train_config import PARTS

    return {
        "algorithm": args.algorithm, **part_values(args, *PARTS.values()),
        "cuts": list(args.cuts) if args.cuts is not None else None,
        "distributed": args.distributed or args.runtime in ("torch", "mqtt"),
        "transport": "mqtt" if args.runtime == "mqtt" else "gloo",
        "extra": {o.name: getattr(args, f"opt_{o.name}") for o in ALGORITHM_OPTIONS if getattr(args, f"opt_{o.name}") is not None},
    }


def explicit_fields(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The TrainConfig fields whose flags appear in ``argv`` (``extra`` for an algorithm option)."""
    given = set()
    for action in parser._actions:
        if any(tok == opt or tok.startswith(opt + "=") for opt in action.option_strings for tok in argv):
            dest = action.dest
            if dest == "runtime":      # one flag, two fields
                given |= {"distributed", "transport"}
                continue
            field = "extra" if dest.startswith("opt_") else dest
            given.add(field)
    return given


def _resumed_config(args: argparse.Namespace) -> "TrainConfig":
    """Resume from the folder alone: the checkpointed run's options, with the flags given on this
    command line applied where a resumed run may change them (``trainers.run.driver.RESUMABLE``); a flag
    that would change anything else is an error naming it."""
    from trainers.config.train_config import DEFAULTS, RESUMABLE, TrainConfig, as_saved_run_trained

    if not args.out:
        raise InputError("needs --out (the run folder holding checkpoint.pt)", field="--resume")
    from trainers.run.checkpoint import load_checkpoint  # torch: a checkpoint is torch's file
    saved = as_saved_run_trained(load_checkpoint(args.out)["config"])   # an object: checked on load
    saved = {**{k: DEFAULTS[k] for k in RESUMABLE if k not in saved}, **saved}
    missing = sorted(set(DEFAULTS) - set(saved))
    if missing:
        raise InputError(f"the checkpoint in {args.out!r} lacks the run options {missing}; start the run again with "
                         "--overwrite", field="--resume")
    given = explicit_fields(args.parser, getattr(args, "argv", []))
    _refuse_unnamed_code(saved.get("model"), args, "model" in given, args.out)
    now = fields_from_args(args)
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


def _check_files(config: "TrainConfig") -> None:
    """The files and folders a new run names, checked before torch is imported (so that a wrong one is named in a
    second, not after the libraries load): the run folder, the system and constants files, the device-data
    folder's manifest."""
    if config.run.out:
        from trainers.run.folder import RunFolder

        RunFolder(config.run.out, overwrite=config.run.overwrite).check()
    if config.system.path:
        from adaptplan.system import SystemSpec

        SystemSpec.load(config.system.path)
    if config.plan.constants_path:
        from adaptplan.constants import ConvergenceConstants

        ConvergenceConstants.load(config.plan.constants_path)
    if config.data.device_data is not None:
        from trainers.inputs.device_data import read_manifest

        read_manifest(config.data.device_data)


def check_flag_combinations(args: argparse.Namespace) -> None:
    """The flags that need or exclude another (InputError naming the flag); also asked by ``provision``."""
    if args.checkpoint_every and not args.out:
        raise InputError("needs --out (where checkpoint.pt is written)", field="--checkpoint-every")
    if args.resume and not args.out:
        raise InputError("needs --out (the run folder holding checkpoint.pt)", field="--resume")
    if args.trust_run_folder and not args.resume:
        raise InputError("applies to --resume (a run folder's checkpoint naming a user model)", field="--trust-run-folder")
    if args.resume and args.overwrite:
        raise InputError("--resume continues the run in --out; --overwrite replaces it: choose one", field="--overwrite")
    if getattr(args, "leakage_every", None) and not args.leakage_out:
        raise InputError("needs --leakage-out (the table the measurements' worst figures are written to)",
                         field="--leakage-every")


def _train(args: argparse.Namespace) -> int:
    from trainers.config.train_config import TrainConfig

    if args.plan_path:
        from adaptplan.plan import Plan

        Plan.load(args.plan_path)   # a bad plan file fails before any data is read or any folder made
    check_flag_combinations(args)
    if not args.resume:
        config = TrainConfig.flat(**fields_from_args(args), **getattr(args, "run_file_fields", {}))
        _check_files(config)
    else:
        config = _resumed_config(args)
    if config.runtime.distributed:
        if args.leakage_out:
            raise InputError("measures the trained model in this process: a simulator run (--runtime simulator)",
                             field="--leakage-out")
        return _train_distributed(args, config)
    from trainers.engine.split_engine import SplitEngine  # torch: only once every flag and file has been checked

    return _train_with(config, SplitEngine,
                       (args.leakage_out, args.leakage_samples, args.leakage_every) if args.leakage_out else None)


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

        largest = None
        if config.runtime.transport == "mqtt":
            from trainers.distributed.frame_bound import largest_frame

            largest = largest_frame(config).largest
        return launch_local(train_args, config.runtime.ranks or default_world_size(config.data.devices), config.data.devices, config.run.out,
                            runtime=config.runtime.transport, partial=STRATEGIES[config.algorithm].allows_absence,
                            detect_seconds=2 * config.runtime.rank_timeout,   # rank 0 may wait one time-out per peer
                            largest_frame_bytes=largest)
    try:
        return run_edge(config.data.devices, config.runtime.rank_timeout, config.runtime.emulate_links, config.execution.threads,
                        lambda factory: _train_with(config, factory),
                        source=_device_source(config))
    except DistributedRunError as exc:
        print(f"adaptplan train: rank 0 (edge server) stopped: {exc}", file=sys.stderr)
        return 3


def _device_source(config: "TrainConfig") -> dict[str, Any]:
    """What the device ranks build from: the data set's name (or the per-device folder's manifest
    digest), the model spec and its width."""
    source: dict[str, Any] = {"dataset": config.data.dataset, "model": config.model.name, "model_width": config.model.width}
    if config.data.device_data is not None:
        from trainers.inputs.device_data import read_manifest

        source["device_data"] = read_manifest(config.data.device_data).digest
    return source


def _train_with(config: "TrainConfig", engine_factory: Any, leakage: tuple[str, int, int | None] | None = None) -> int:
    """Train ``config``'s run; with ``leakage``, (file, samples, every), write its leakage table: the trained
    model's, or with ``every`` the worst over the run (adaptplan/cli/leakage_trace.py)."""
    import sys

    from trainers.run.driver import Trainer
    from trainers.run.folder import Interrupted

    trainer = Trainer(config, engine_factory=engine_factory)
    print(trainer.describe_plan(), file=sys.stderr)
    if trainer.history.events[0]["source"] == "default":
        print(f"warning: {trainer.history.events[0]['reason']}", file=sys.stderr)
    for note in trainer.notes:
        print(f"warning: {note}", file=sys.stderr)
    path, samples, every = leakage if leakage is not None else ("", 0, None)
    if path and every:
        from adaptplan.cli.leakage_trace import LeakageTrace

        trainer.observers.append(LeakageTrace(trainer, path, samples, every))
    try:
        history = trainer.run()
    except Interrupted as exc:
        print(f"adaptplan train: {exc}", file=sys.stderr)
        return 128 + exc.signum
    if path and not every:
        trained_leakage(trainer, path, samples)
    summary = history.summary(config.run.target_accuracy)
    if "to_target" in summary:
        print(target_line(summary["target_accuracy"], summary["to_target"]), file=sys.stderr)
    print(json.dumps(summary, indent=2))
    return 0


def target_line(target: float, found: dict[str, Any]) -> str:
    """One line: when the run reached ``target`` (History.to_target's ``found``) beside what its calibrated plan
    predicted."""
    if found["rounds"] is None:
        measured = "not reached"
    else:
        measured = f"{'at most ' if found['upper_bound'] else ''}{found['rounds']:.4g} rounds, {found['seconds']:.4g} " \
                   "simulated s (interpolated between evaluations)"
    text = f"to {target:.1%} test accuracy: {measured}"
    if "predicted_rounds" in found:
        text += f"; predicted {found['predicted_rounds']} rounds, {found['predicted_seconds']:.4g} s"
        if found["measured_over_predicted"] is not None:
            text += f" (measured/predicted {found['measured_over_predicted']:.2f})"
    return text


def trained_leakage(trainer: Any, path: str, samples: int) -> None:
    """The leakage table of ``trainer``'s trained model at every cut — the first model its global protocol evaluates
    (the strategy's ``eval_models``: the averaged one where the algorithm averages) — its attacker seeing the run's
    defence of the activations; printed and written."""
    import sys

    from adaptplan.cli.leakage_report import leakage_report, write_leakage_table
    from adaptplan.defence_cost import DefenceSetting

    name = DefenceSetting.of_run(trainer.config.privacy).name
    rounds = trainer.history.records[-1].round if trainer.history.records else 0
    blocks = trainer.engine.eval_models()[0]
    text, figures = leakage_report(blocks, trainer.dataset, samples, trainer.config.data.dataset, trainer.engine.defence,
                                   name, weights=f"the weights trained for {rounds} rounds")
    print(text, file=sys.stderr)
    write_leakage_table(path, trainer.profile, trainer.config.data.dataset, samples, trainer.dataset, figures, name,
                        f"trained, round {rounds}")
