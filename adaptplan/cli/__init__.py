"""The ``adaptplan`` command line: one sub-command per module of :mod:`adaptplan.cli.commands`.

Each command module exposes ``register(subparsers)`` (adds its parser and sets ``func``). User
mistakes raise :class:`adaptplan.errors.InputError` (or argparse errors), and a path that cannot be
read or written raises ``OSError``; all end with one message on stderr and exit code 2, never a
traceback. Output piped into a reader that stops early (``adaptplan plan | head``) ends quietly.
Any other exception is a bug (or a fault of the machine): one line
``internal error: ... (rerun with --debug)`` and exit code 1. ``--debug`` (or the environment
variable ``ADAPTPLAN_DEBUG=1``) shows the traceback instead, also the one behind a user error such
as a user's model that raises.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import re
import signal
import stat
import sys
import traceback

from adaptplan.errors import InputError

COMMAND_MODULES = ("profile", "system", "plan", "train", "split_data", "provision", "plot", "bench")


LONG_WORD = 200
"""A word (a run of non-blank characters) of an error message longer than this many characters is
shortened: a value given by mistake (a file pasted into a flag, a 10⁶-character field) is shown by its
first :data:`SHOWN_CHARACTERS` characters and its length, not echoed whole."""
SHOWN_CHARACTERS = 60


def clip_message(text: str) -> str:
    """``text`` with every word longer than :data:`LONG_WORD` characters cut to its first
    :data:`SHOWN_CHARACTERS` and its length (``xxxx… (100,000 characters)``)."""
    def shorten(match: re.Match) -> str:
        word = match.group()
        tail = word[-1] if word[-1] in ":;,." else ""   # the sentence's punctuation stays
        return f"{word[:SHOWN_CHARACTERS]}… ({len(word) - len(tail):,} characters){tail}"

    return re.sub(rf"\S{{{LONG_WORD + 1},}}", shorten, text)


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose errors are one line and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        one_line = message.replace("\r", "\\r").replace("\n", "\\n")   # a value holding a line break stays one line
        self.exit(2, clip_message(f"{self.prog}: error: {one_line}") + "\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="adaptplan",
        description="Plan and run split federated learning: optimal cut layers and aggregation interval "
                    "(AdaptSFL), profiles of real models, and a split-training engine. Units are SI: "
                    "FLOPs, bits, seconds, bit/s, FLOP/s.",
    )
    parser.add_argument("--debug", action="store_true",
                        help="show Python tracebacks (of internal errors and behind user errors such as a model "
                             "that raises); also ADAPTPLAN_DEBUG=1")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(f"adaptplan.cli.commands.{name}").register(sub)
    for command in sub.choices.values():   # `adaptplan plan --debug ...` works too
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parser


def with_run_file(argv: list[str], parser: argparse.ArgumentParser) -> tuple[list[str], dict]:
    """``argv`` with a ``train --config FILE`` replaced by the file's options (adaptplan/cli/run_file.py), and the
    file's Python-only options."""
    at = next((i for i, token in enumerate(argv) if not token.startswith("-")), None)
    if at is None or argv[at] != "train" or not any(t == "--config" or t.startswith("--config=") for t in argv[at:]):
        return argv, {}
    from adaptplan.cli.run_file import expand_run_file

    train = parser._subparsers._group_actions[0].choices["train"]        # type: ignore[union-attr,index]
    rest, python_only = expand_run_file(argv[at + 1:], train)
    return [*argv[:at + 1], *rest], python_only


def debug_requested(args: argparse.Namespace) -> bool:
    """``--debug`` was given or ``ADAPTPLAN_DEBUG`` is set to anything but "", "0", "false" or "no"."""
    env = os.environ.get("ADAPTPLAN_DEBUG", "").strip().lower()
    return bool(getattr(args, "debug", False)) or env not in ("", "0", "false", "no")


def unwritable_stdout(exc: OSError) -> str | None:
    """Where the standard output goes (a file's path, else ``"standard output"``) when ``exc`` is the
    failure to write it: an error without a file name (a write to a descriptor) of a full disk or
    quota, the standard output being a regular file; ``None`` otherwise."""
    if exc.filename or exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return None
    try:
        fd = sys.stdout.fileno()
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
    except (OSError, ValueError, AttributeError):   # no file descriptor (captured output)
        return None
    try:
        return repr(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:   # not Linux
        return "standard output"


def _continues(args: argparse.Namespace) -> str:
    """What a stopped command kept, for its stop message: ``bench papers`` keeps each run in a folder of ``--out``
    and continues it when run again; the other benches start their runs afresh."""
    if args.command == "bench" and getattr(args, "bench", None) == "papers":
        from adaptplan.benches.runs import STOP_GRACE_S

        return (f"; each run in progress saved its round and checkpoint in its folder under --out (a run killed after "
                f"the {STOP_GRACE_S:g}-s grace keeps its last checkpoint): run the same command again to continue them")
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        argv, python_only = with_run_file(argv, parser)
    except InputError as exc:
        print(clip_message(f"adaptplan train: error: {exc}"), file=sys.stderr)
        return 2
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:   # a flag error (message printed, exit code 2) or --help (0), returned like the rest
        return exc.code if isinstance(exc.code, int) else 2
    args.argv = argv
    args.run_file_fields = python_only
    debug = debug_requested(args)
    try:
        result = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at interpreter exit
    except BrokenPipeError:  # the reader went away (`adaptplan plan | head`): stop quietly, like a Unix tool
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that the final flush at exit cannot fail again
        return 128 + 13  # killed by SIGPIPE
    except InputError as exc:
        if debug and exc.__cause__ is not None:
            traceback.print_exception(exc.__cause__, file=sys.stderr)
        print(clip_message(f"adaptplan {args.command}: error: {exc}"), file=sys.stderr)
        return 2
    except OSError as exc:  # a path the user named cannot be read or written (directory, permissions, ...)
        stdout = unwritable_stdout(exc)
        if stdout is not None:   # `adaptplan plan > file` on a full disk: the redirection is the path
            print(f"adaptplan {args.command}: error: cannot write the standard output ({stdout}): "
                  f"{exc.strerror or exc}", file=sys.stderr)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 2
        where = f" {exc.filename!r}" if exc.filename else ""
        print(clip_message(f"adaptplan {args.command}: error: cannot use{where}: {exc.strerror or exc}"), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"adaptplan {args.command}: interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:
        from adaptplan.benches.runs import BenchStopped

        if not isinstance(exc, BenchStopped):
            raise
        print(f"adaptplan {args.command}: stopped by {signal.Signals(exc.signum).name}{_continues(args)}",
              file=sys.stderr)
        return 128 + exc.signum
    except Exception as exc:  # a bug, or a fault the commands do not expect
        from trainers.run.folder import Interrupted

        if isinstance(exc, Interrupted):   # a run inside the command (a bench's, in this process) stopped on a signal
            again = " (or run the same command again: the bench continues its runs)" if _continues(args) else ""
            print(f"adaptplan {args.command}: {exc}{again}", file=sys.stderr)   # unclipped, as train's: a resume path
            return 128 + exc.signum
        if debug:
            raise
        text = " ".join(str(exc).split())
        text = text if len(text) <= 300 else text[:297] + "..."
        print(f"adaptplan {args.command}: internal error: {type(exc).__name__}: {text} (rerun with --debug)",
              file=sys.stderr)
        return 1
    return int(result or 0)

