"""`adaptplan provision`: a deployment over an MQTT broker in one command — the broker's folder and one kit per
rank (trainers/distributed/provision.py; docs/mqtt.md "A real deployment")."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from adaptplan.cli.flags import int_flag
from adaptplan.errors import InputError
from adaptplan.limits import MAX_DEVICES

if TYPE_CHECKING:
    from trainers.config.train_config import TrainConfig

OWN_FLAGS = ("--runtime", "--distributed", "--ranks")
"""Training options a kit sets itself (every rank runs over the broker, as the kit's rank of --ranks)."""


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "provision",
        help="write a broker's folder and one kit per rank for a deployment over MQTT",
        description="Write, for a broker reachable at --broker and --devices devices over --ranks ranks, the "
                    "broker's folder (mosquitto.conf, its CA, certificate and key, hashed passwords, access control "
                    "list) and one kit per rank (the CA certificate, the rank's password, the run's secret, its "
                    "environment and run.sh, the one command it runs), every file private to its owner. Training "
                    "options after -- go into every kit's command. Then: cd OUT/broker && mosquitto -c "
                    "mosquitto.conf on the broker's server; copy kits/rank<r> to the machine of rank r and run "
                    "./run.sh there (docs/mqtt.md \"A real deployment\").",
        usage="adaptplan provision --broker HOST:PORT --devices N --out DIR [--ranks W] [--run NAME] [--days D] "
              "[-- TRAIN-OPTIONS]")
    parser.add_argument("--broker", required=True, metavar="HOST:PORT",
                        help="the address every rank reaches the broker at (its certificate is made for HOST)")
    parser.add_argument("--devices", type=int_flag(1, MAX_DEVICES, "devices"), required=True, help="number of devices N")
    parser.add_argument("--ranks", type=int_flag(3, 2 + MAX_DEVICES, "ranks"),
                        help="ranks W: edge server, fed server and W-2 device hosts (default: one device host per "
                             "device, at most 8)")
    parser.add_argument("--out", metavar="DIR", required=True, help="a new folder to write")
    parser.add_argument("--run", metavar="NAME", help="the run's topic prefix on the broker (default: random)")
    parser.add_argument("--days", type=int_flag(1, 3650, "days"), default=365,
                        help="how long the certificates are valid (default 365)")
    parser.add_argument("train_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from trainers.distributed.layout import RankLayout, default_world_size
    from trainers.distributed.provision import provision

    train_args = list(args.train_args)
    if train_args[:1] == ["--"]:
        train_args = train_args[1:]
    taken = [flag for flag in OWN_FLAGS if any(a == flag or a.startswith(flag + "=") for a in train_args)]
    if taken:
        raise InputError(f"{taken[0]} is the kit's to set (every rank runs over the broker as its kit's rank); "
                         "leave it out of the training options", field=taken[0])
    config = _check_training_options(train_args, args.devices)
    world = args.ranks or default_world_size(args.devices)
    if world - 2 > args.devices:
        raise InputError(f"{world} ranks give {world - 2} device hosts for {args.devices} devices: at most "
                         f"{args.devices + 2} ranks (a kit per host that has devices)", field="--ranks")
    if not args.out.strip():
        raise InputError("is empty: give the new folder to write", field="--out")
    deployment = provision(Path(args.out).expanduser(), args.broker, args.devices, world, train_args, args.run,
                           args.days, largest_frame=lambda: _largest_frame(config))
    roles = RankLayout(world, args.devices)
    print(f"wrote {deployment.folder}: broker/ (run {deployment.run}; the broker runs as {deployment.broker_user}), "
          f"kits/rank0..rank{world - 1} ({', '.join(roles.describe(r) for r in range(world))})", file=sys.stderr)
    print(f"next: on the broker's server   cd {deployment.broker} && mosquitto -c mosquitto.conf\n"
          f"      on the machine of rank r  copy {deployment.folder / 'kits'}/rank<r> there, then run rank<r>/run.sh",
          file=sys.stderr)
    return 0


def _largest_frame(config: "TrainConfig") -> int | None:
    """The run's largest frame (bytes, :mod:`trainers.distributed.frame_bound`) for the broker's limits; None,
    said on stderr, where the model cannot be built here (``--device-data`` is the kits' folder, not on this
    machine): the broker then allows MQTT's largest packet."""
    from trainers.distributed.frame_bound import largest_frame

    try:
        return largest_frame(config).largest
    except (InputError, OSError) as exc:
        print(f"adaptplan provision: the broker's packet limit is MQTT's largest ({exc}): the run's model could "
              "not be built here to bound its frames", file=sys.stderr)
        return None


def _check_training_options(train_args: list[str], devices: int) -> "TrainConfig":
    """The options every kit will run with, checked now as ``adaptplan train`` would parse them (not on the
    devices, one by one, later); the configuration they give."""
    from adaptplan import cli
    from adaptplan.cli.commands.train import check_flag_combinations, fields_from_args, flag_of
    from trainers.config.train_config import TrainConfig

    given = [a for a in train_args if a == "--devices" or a.startswith("--devices=")]
    if given:
        raise InputError("give the number of devices once, to provision's own --devices", field="--devices")
    try:
        parsed = cli.build_parser().parse_args(["train", "--devices", str(devices), *train_args])
    except SystemExit as exc:            # argparse has printed its one line
        raise SystemExit(2) from exc
    check_flag_combinations(parsed)                      # --resume without --out, ...
    try:
        return TrainConfig.flat(**fields_from_args(parsed))     # the ranges and choices
    except InputError as exc:                        # named by the flag, as adaptplan train names it
        raise InputError(exc.message, field=flag_of(exc.field) if exc.field else None) from exc.__cause__
