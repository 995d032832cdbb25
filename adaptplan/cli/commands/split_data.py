"""`adaptplan split-data`: write a per-device data folder (trainers/inputs/device_data.py) from a data set and
a partition rule — the partition ``adaptplan train`` draws with the same options, so training on the
folder (``--device-data DIR``) gives the same numbers as training on the data set."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

from adaptplan.cli.flags import int_flag, positive_float_flag
from adaptplan.errors import InputError
from adaptplan.limits import MAX_BATCH_SIZE, MAX_DEVICES, MAX_SEED


def register(sub: argparse._SubParsersAction) -> None:
    from adaptplan.cli.config_flags import add_field
    from trainers.config.train_config import PARTITIONS
    from trainers.inputs.datasets import dataset_names

    parser = sub.add_parser(
        "split-data",
        help="write a per-device data folder (one file per device) for --device-data",
        description="Split a data set over N devices (the partition adaptplan train draws with the same "
                    "--partition, --alpha, --seed and --batch-size) and write one file per device, the test set "
                    "and a manifest with each device's sample count, label counts and SHA-256 "
                    "(docs/distributed.md \"Data on the devices\"), and print how skewed the partition is "
                    "(trainers/inputs/skew.py). Give each device machine the manifest and its "
                    "own device-<i>.npz; the edge server the manifest and test.npz.",
    )
    parser.add_argument("--dataset", default="cifar10-subset", help=f"one of {', '.join(dataset_names())} (default cifar10-subset)")
    parser.add_argument("--data-root", metavar="DIR", help="folder of the data set's files (as for adaptplan train)")
    parser.add_argument("--devices", type=int_flag(1, MAX_DEVICES, "devices"), required=True, help="number of devices N")
    parser.add_argument("--partition", default="iid", help=f"one of {', '.join(PARTITIONS)} (default iid)")
    parser.add_argument("--alpha", type=positive_float_flag(""), default=0.5,
                        help="Dirichlet concentration α for --partition dirichlet (default 0.5)")
    add_field(parser, "labels_per_device")
    add_field(parser, "size_exponent")
    parser.add_argument("--seed", type=int_flag(0, MAX_SEED), default=0, help="the partition's seed (default 0)")
    parser.add_argument("--batch-size", type=int_flag(1, MAX_BATCH_SIZE, "samples"), default=16,
                        help="every device gets at least this many samples (the training batch size b; default 16)")
    parser.add_argument("--out", metavar="DIR", required=True, help="the folder to write")
    parser.add_argument("--overwrite", action="store_true", help="replace a folder already written there")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from trainers.inputs.device_data import MANIFEST, write_device_folder

    if not args.out.strip():
        raise InputError("names no folder: give the folder to write, e.g. --out devdata", field="--out")
    out = Path(args.out).expanduser()
    if out.exists() and not out.is_dir():
        raise InputError(f"{str(out)!r} is a file, not a folder", field="--out")
    if (out / MANIFEST).exists():
        if not args.overwrite:
            raise InputError(f"{str(out)!r} already holds a device-data folder; add --overwrite to replace it",
                             field="--out")
    elif out.is_dir() and any(out.iterdir()):
        raise InputError(f"{str(out)!r} holds other files and no device-data folder: name a new or empty folder",
                         field="--out")

    import numpy as np

    from trainers.inputs.datasets import load_dataset
    from trainers.inputs.partition import partition_indices
    from trainers.inputs.skew import PartitionSkew

    data = load_dataset(args.dataset, args.data_root)
    parts = partition_indices(data.y_train.numpy(), args.devices, args.partition, args.seed, args.alpha,
                              min_size=args.batch_size, labels_per_device=args.labels_per_device,
                              size_exponent=args.size_exponent, groups=data.groups)
    smallest = min(len(p) for p in parts)
    if smallest < args.batch_size:
        raise InputError(f"the smallest device gets {smallest} samples, fewer than --batch-size {args.batch_size}",
                         field="--batch-size")
    manifest = write_whole(data, parts, out, write_device_folder)
    sizes = [e.samples for e in manifest.devices]
    print(f"wrote {out}: {manifest.name}, {len(sizes)} devices ({min(sizes)}-{max(sizes)} samples each, "
          f"{manifest.total} in all), test.npz, manifest.json", file=sys.stderr)
    skew = PartitionSkew.of(np.asarray([e.label_counts for e in manifest.devices]))
    print(f"{args.partition} partition, {skew.line()}", file=sys.stderr)
    return 0


def write_whole(data: Any, parts: Any, out: Path, write: Callable[[Any, Any, Path], Any]) -> Any:
    """``write(data, parts, folder)`` into a temporary folder beside ``out``, renamed to ``out`` once complete: a
    full disk or a stop leaves no half-written device-data folder (issue 67), and an earlier one is replaced whole
    (moved aside first, removed last). The temporary folder is removed on any failure. The manifest read back."""
    import shutil
    import tempfile

    from trainers.inputs.device_data import read_manifest

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    except OSError as exc:
        raise InputError(f"cannot write beside {str(out)!r}: {exc.strerror or exc}", field="--out") from None
    old = None
    try:
        write(data, parts, staging)
        if out.exists():
            old = out.parent / f"{staging.name}.old"
            out.rename(old)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if old is not None and not out.exists():
            old.rename(out)                      # the earlier folder back where it was
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return read_manifest(out)
