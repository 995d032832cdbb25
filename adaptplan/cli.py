"""The ``adaptplan`` command line: one sub-command per module of :mod:`adaptplan.commands`.

Each command module exposes ``register(subparsers)`` (adds its parser and sets ``func``). User
mistakes raise :class:`adaptplan.errors.InputError` (or argparse errors), and a path that cannot be
read or written raises ``OSError``; all end with one message on stderr and exit code 2, never a
traceback. Output piped into a reader that stops early (``adaptplan plan | head``) ends quietly.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from adaptplan.errors import InputError

COMMAND_MODULES = ("profile", "system", "plan", "train", "plot", "bench")


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose errors are one line and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="adaptplan",
        description="Plan and run split federated learning: optimal cut layers and aggregation interval "
                    "(AdaptSFL), profiles of real models, and a split-training engine. Units are SI: "
                    "FLOPs, bits, seconds, bit/s, FLOP/s.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(f"adaptplan.commands.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        result = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at interpreter exit
    except BrokenPipeError:  # the reader went away (`adaptplan plan | head`): stop quietly, like a Unix tool
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that the final flush at exit cannot fail again
        return 128 + 13  # killed by SIGPIPE
    except InputError as exc:
        print(f"adaptplan {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a path the user named cannot be read or written (directory, permissions, ...)
        where = f" {exc.filename!r}" if exc.filename else ""
        print(f"adaptplan {args.command}: error: cannot use{where}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"adaptplan {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
