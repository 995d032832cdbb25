"""`adaptplan profile MODEL --input CxHxW` (or ``--dataset NAME``, its samples' shape): per-cut profile of a model
(docs/formats.md "Model profile") and optionally its training constants (docs/formats.md "Training constants", docs/model.md §5.4).

torch is imported only when the command runs, so ``adaptplan plan`` stays torch-free.
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from typing import Any

from adaptplan.cli.flags import int_flag, positive_float_flag
from adaptplan.cli.leakage_report import MAX_LEAKAGE_SAMPLES
from adaptplan.errors import InputError
from adaptplan.fileio import show
from adaptplan.limits import MAX_BITS_PER_VALUE, MAX_INPUT_VALUES, MAX_MODEL_WIDTH, MAX_NUM_CLASSES
from trainers.config.train_config import DEVICES, MODELS, OWN_MODEL_HELP

WIDE_MODELS = ("cnn", "mlp")
"""The built-ins ``--model-width`` sizes (:func:`trainers.inputs.models.build_model`)."""

MAX_PROFILE_BATCH = 4096   # samples per timed or statistics batch
MAX_REPEATS = 10_000       # timed passes / statistics mini-batches


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "profile",
        help="profile a model's cut points (FLOPs, bits, optional measured seconds and training constants)",
        description="Trace MODEL, find its single-tensor cut points (block boundaries only) and print, per cut j, "
                    "the cumulative forward/backward FLOPs per sample (2 FLOPs per multiply-add), the activation "
                    "size per sample and the client-side parameter size.",
    )
    parser.add_argument("model", metavar="MODEL",
                        help=f"built-in {', '.join(MODELS)}, a torchvision model name (vgg16, resnet18, mobilenet_v2, ...; "
                             f"random weights) or {OWN_MODEL_HELP}")
    parser.add_argument("--input", metavar="CxHxW",
                        help="per-sample input shape, e.g. 3x32x32 (channels x height x width, in values), or T for a "
                             "text model's window of T character ids (leaf-lstm: 80); with --dataset, default: its "
                             "samples' shape")
    parser.add_argument("--num-classes", type=int_flag(1, MAX_NUM_CLASSES, "classes"), default=10, help="number of output classes (default: 10)")
    parser.add_argument("--model-width", type=int_flag(1, MAX_MODEL_WIDTH, "channels"), metavar="W",
                        help="channels of the first layer of the built-ins cnn and mlp (default 32), as `bench "
                             "--model-width` and the run key model_width train them: the profile and leakage table of "
                             "that model")
    parser.add_argument("-o", "--output", metavar="FILE", help="write the profile JSON (docs/formats.md) to FILE")
    parser.add_argument("--bits", type=int_flag(1, MAX_BITS_PER_VALUE, "bits"), default=32,
                        help="bits per activation/gradient/parameter value (default: 32)")
    parser.add_argument("--json", action="store_true", help="print the profile JSON instead of the table")
    timing = parser.add_argument_group("measured time (seconds per sample, this machine)")
    timing.add_argument("--measure-time", action="store_true",
                        help="also measure per-block forward/backward seconds per sample (median of repeats)")
    timing.add_argument("--time-batch-size", type=int_flag(1, MAX_PROFILE_BATCH, "samples"), default=16, help="samples per timed batch (default: 16)")
    timing.add_argument("--repeats", type=int_flag(1, MAX_REPEATS, "passes"), default=5,
                        help="timed passes per block; the median is kept (default: 5)")
    leak = parser.add_argument_group("leakage per cut (docs/privacy.md; needs --dataset)")
    leak.add_argument("--leakage", action="store_true",
                      help="also measure, per cut, the distance correlation between inputs and activations and the "
                           "AUC of inferring labels from the returned gradients (norm and direction attacks), at the "
                           "model's initial weights on --dataset's training samples")
    leak.add_argument("--leakage-samples", type=int_flag(2, MAX_LEAKAGE_SAMPLES, "samples"), default=256,
                      help="samples the leakage is measured on (the first ones of the training split; default: 256); "
                           "as many of the test split are the model-inversion attacker's auxiliary data")
    leak.add_argument("--leakage-figure", metavar="FILE",
                      help="with --leakage on images: write a PNG of 8 originals above their reconstructions at each cut")
    leak.add_argument("--leakage-defence", metavar="SETTING", default="none",
                      help="measure the activations as a defence releases them (clip=C,noise=σ and labels=ε of "
                           "`train --activation-clip/--activation-noise/--label-epsilon`; docs/privacy.md \"Defences\"): "
                           "the attacker knows the mechanism and draws its own noise (default none)")
    leak.add_argument("--leakage-out", metavar="FILE",
                      help="with --leakage: write the figures per cut as a leakage table (docs/formats.md), which "
                           "`adaptplan plan --leakage-table FILE --max-leakage METRIC=LIMIT` plans within")
    grads = parser.add_argument_group("training constants (beta, sigma_j^2, G_j^2, theta; dimensionless)")
    grads.add_argument("--grad-stats", action="store_true", help="estimate the constants from real data (needs --dataset and --constants-out)")
    grads.add_argument("--dataset", metavar="NAME", help="dataset for --grad-stats and --leakage, and the input shape "
                       "where --input is not given, e.g. cifar10-subset, mnist, cifar10 (with --data-root)")
    grads.add_argument("--data-root", metavar="DIR", help="directory holding the dataset files (default: $ADAPTPLAN_DATA_DIR, "
                                                          "else the project's data/ folder)")
    grads.add_argument("--download", action="store_true", help="let torchvision fetch cifar10/cifar100/mnist/fashion-mnist "
                                                               "into --data-root (needs a network)")
    grads.add_argument("--constants-out", metavar="FILE", help="write the constants JSON (docs/formats.md) to FILE")
    grads.add_argument("--batches", type=int_flag(1, MAX_REPEATS, "mini-batches"), default=8,
                       help="mini-batches used for the statistics (count, default: 8)")
    grads.add_argument("--batch-size", type=int_flag(1, MAX_PROFILE_BATCH, "samples"), default=16, help="samples per mini-batch b (default: 16)")
    grads.add_argument("--gamma", type=positive_float_flag(), default=0.01,
                       help="learning rate gamma written to the constants (dimensionless, default: 0.01)")
    grads.add_argument("--epsilon", type=positive_float_flag(), default=0.1,
                       help="target average squared gradient norm epsilon (dimensionless, default: 0.1)")
    grads.add_argument("--device", choices=DEVICES, default="auto", help="where the statistics are computed: auto "
                       "(default: cuda when torch sees a GPU, else cpu), cpu or cuda (an error where there is no GPU)")
    parser.set_defaults(func=run)


def parse_shape(text: str) -> tuple[int, ...]:
    """``"3x32x32"`` → ``(3, 32, 32)``, ``"80"`` → ``(80,)`` (a text model's window of 80 character ids); anything
    else but C×H×W or T positive integers with at most :data:`MAX_INPUT_VALUES` values per sample is an InputError
    (refused before anything is allocated)."""
    parts = text.lower().replace("×", "x").split("x")
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        shape = ()
    if len(shape) not in (1, 3) or any(s <= 0 for s in shape):
        raise InputError(f"expected CxHxW with three positive integers, e.g. 3x32x32 (or T, one: a text model's "
                         f"window, e.g. 80); got {show(text)}", field="--input")
    values = math.prod(shape)
    if values > MAX_INPUT_VALUES:
        raise InputError(f"{text} is {values:,} values per sample, more than the {MAX_INPUT_VALUES:,} that can be "
                         f"profiled", field="--input")
    return shape


MODEL_SEED = 0
"""torch's seed for the profiled model's initial weights (what ``--grad-stats`` and ``--leakage`` measure at)."""


def _given_shape(args: argparse.Namespace) -> tuple[int, ...] | None:
    """``--input``'s shape, checked against MODEL (None: ``--dataset``'s samples give it); an unknown MODEL or
    neither option is an InputError, before torch loads."""
    from trainers.config.train_config import MODELS, check_model

    if args.input is None and not args.dataset:
        raise InputError("required: the per-sample input shape CxHxW (e.g. 3x32x32; T for a text model), or "
                         "--dataset NAME to take its samples' shape", field="--input")
    shape = parse_shape(args.input) if args.input is not None else None
    if args.model not in MODELS:
        check_model(args.model, "MODEL")        # an unknown name is refused before torch loads
    elif args.model != "mlp" and shape is not None:   # the image built-ins take their input channels from --input
        from profilers.input_shapes import channels_last_hint

        hint = channels_last_hint(shape)
        if hint:
            raise InputError(f"{hint} (the built-in {args.model} would be built with {shape[0]} input channels)",
                             field="--input")
    return shape


def run(args: argparse.Namespace) -> int:
    shape = _given_shape(args)
    if args.grad_stats and (not args.dataset or not args.constants_out):
        raise InputError("--grad-stats needs --dataset NAME and --constants-out FILE", field="--grad-stats")
    if args.leakage and not args.dataset:
        raise InputError("--leakage needs --dataset NAME (the samples it is measured on)", field="--leakage")
    for flag, value in (("--leakage-figure", args.leakage_figure), ("--leakage-out", args.leakage_out),
                        ("--leakage-defence", args.leakage_defence if args.leakage_defence != "none" else None)):
        if value and not args.leakage:
            raise InputError(f"{flag} records the leakage measurement: add --leakage", field=flag)
    from adaptplan.defence_cost import DefenceSetting

    setting = DefenceSetting.parse(args.leakage_defence, "--leakage-defence")
    if setting.nopeek:
        raise InputError("NoPeek changes the weights it trains, and a profile measures one model: compare it with "
                         "`adaptplan bench privacy`", field="--leakage-defence")
    if args.grad_stats:
        from trainers.config.devices import resolve_device

        args.torch_device = resolve_device(args.device)   # no GPU for --device cuda: before any work
    import torch

    from profilers.chain import build_chain
    from profilers.models import check_model_output, describe
    from profilers.profile import profile_model
    from profilers.tracing import example_batch
    from trainers.inputs.models import build_model

    if args.model_width is not None and args.model not in WIDE_MODELS:
        raise InputError(f"sizes the built-ins {' and '.join(WIDE_MODELS)} only, not {args.model}", field="--model-width")
    data: Any = _profiled_data(args, shape) if args.grad_stats or args.leakage or shape is None else None
    if shape is None:                            # data problems first; then --dataset's samples give the shape
        shape = tuple(data.input_shape)
    torch.manual_seed(MODEL_SEED)      # the initial weights --grad-stats and --leakage measure: the same every time
    model = build_model(args.model, shape, args.num_classes, width=args.model_width or 32, field="MODEL")
    check_model_output(model, args.model, shape, args.num_classes)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        try:
            chain = build_chain(model, example_batch(shape))
            profile = profile_model(chain, shape, model_name=args.model, bits_per_value=args.bits,
                                    measure_time=args.measure_time, batch_size=args.time_batch_size,
                                    repeats=args.repeats, progress=sys.stderr.isatty())
        except InputError:
            raise
        except (RuntimeError, TypeError, ValueError, NotImplementedError) as exc:   # the model's own code, or torch.fx
            raise InputError(f"profiling model {args.model!r} failed: {describe(exc)}", field="MODEL") from exc
    for warning in caught:  # NoCutWarning, FlopCheckWarning: one line each, no source location
        if issubclass(warning.category, UserWarning):
            print(f"adaptplan profile: warning: {warning.message}", file=sys.stderr)
    if args.output:
        profile.save(args.output)
        print(f"wrote {args.output} ({profile.num_cuts} cut points)", file=sys.stderr)
    if args.json:
        import json

        print(json.dumps(profile.to_json(), indent=2))
    else:
        print(format_table(profile, chain.output_shapes))
    if args.leakage:
        assert data is not None, "--leakage needs --dataset (checked above)"
        _leakage(args, chain, profile, data, setting)
    if args.grad_stats:
        constants = _grad_stats(args, chain, data)
        constants.save(args.constants_out)
        print(f"constants: beta={constants.beta:.4g} theta={constants.theta:.4g} "
              f"sum sigma2={sum(constants.sigma2):.4g} sum G2={sum(constants.G2):.4g} -> {args.constants_out}")
    return 0


def _profiled_data(args: argparse.Namespace, shape: tuple[int, ...] | None) -> Any:
    """The data set of ``--dataset`` (for ``--grad-stats`` and ``--leakage``, or the input shape where ``--input`` is
    not given), checked against ``--input`` and ``--num-classes``."""
    from trainers.inputs.datasets import load_dataset

    data = load_dataset(args.dataset, args.data_root, download=args.download)
    if shape is not None and tuple(data.input_shape) != shape:
        raise InputError(f"{args.dataset} samples are {'x'.join(map(str, data.input_shape))} but --input is {args.input}",
                         field="--input")
    if data.num_classes != args.num_classes:
        raise InputError(f"{args.dataset} has {data.num_classes} classes; pass --num-classes {data.num_classes}",
                         field="--num-classes")
    return data


def _leakage(args: argparse.Namespace, chain: Any, profile: Any, data: Any, setting: Any) -> None:
    """``--leakage``: the table at the model's initial weights under ``setting``, printed (and with ``--leakage-out``
    written)."""
    from adaptplan.cli.leakage_report import leakage_report, write_leakage_table
    from trainers.roles.defences import ActivationDefence

    text, figures = leakage_report(chain.blocks, data, args.leakage_samples, args.dataset,
                                   ActivationDefence.of_setting(setting, data.num_classes), setting.name,
                                   args.leakage_figure)
    print(text)
    if args.leakage_out:
        write_leakage_table(args.leakage_out, profile, args.dataset, args.leakage_samples, data, figures, setting.name)


def _grad_stats(args: argparse.Namespace, chain: Any, data: Any) -> Any:
    from profilers.gradstats import estimate_constants, iterate_batches

    batches = iterate_batches(data.x_train, data.y_train, args.batch_size, args.batches)
    return estimate_constants(chain, batches, gamma=args.gamma, epsilon=args.epsilon, num_batches=args.batches,
                              progress=True, device=args.torch_device)


def format_table(profile: Any, shapes: list[tuple[int, ...]]) -> str:
    """A readable per-cut table (FLOPs in GFLOPs per sample, sizes in Mbit, time in ms per sample)."""
    timed = profile.timing is not None
    width = max([16] + [len(c.name) for c in profile.cut_points])
    header = f"{'j':>3}  {'name':<{width}} {'output':<14} {'FP GFLOPs':>10} {'BP GFLOPs':>10} {'act Mbit':>9} {'params Mbit':>11}"
    if timed:
        header += f" {'FP ms':>8} {'BP ms':>8}"
    lines = [f"{profile.model}: input {'x'.join(map(str, profile.input_shape))}, {profile.num_cuts} cut points "
             f"(cumulative per sample, 2 FLOPs per multiply-add, {profile.bits_per_value} bits per value)", header]
    for cut, shape in zip(profile.cut_points, shapes):
        row = (f"{cut.index:>3}  {cut.name:<{width}} {'x'.join(map(str, shape)):<14} {cut.fp_flops / 1e9:>10.4f} "
               f"{cut.bp_flops / 1e9:>10.4f} {cut.activation_bits / 1e6:>9.4f} {cut.client_param_bits / 1e6:>11.3f}")
        if timed:
            row += f" {cut.fp_seconds * 1e3:>8.3f} {cut.bp_seconds * 1e3:>8.3f}"
        lines.append(row)
    counting = profile.flop_counting
    if counting:
        check = counting["check"]
        lines.append(f"FLOPs: forward {counting['forward']}; backward {counting['backward']}; forward total "
                     f"{100 * check['relative_difference']:+.1f}% vs {check['counter']} (norm layers and pooling "
                     f"count there as zero); counted as zero: {', '.join(counting['zero_flop_ops']) or 'none'}")
    if timed:
        t = profile.timing
        lines.append(f"time: median of {t['repeats']} batches of {t['batch_size']}, {t['threads']} threads")
    return "\n".join(lines)
