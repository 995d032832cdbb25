"""``python -m adaptplan.distributed TRAIN-OPTIONS`` — one rank of a torch.distributed training run.

Takes the options of ``adaptplan train``. Started by ``torchrun`` (or by ``adaptplan train
--distributed``, which sets the same environment) it runs the rank named by ``RANK``: rank 0 is the
edge server and runs the training loop, rank 1 the fed server, the others host devices
(docs/distributed.md). Started by hand without ``RANK``, it does what ``adaptplan train
--distributed`` does: starts every rank on this machine.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from trainers.distributed.serve import WorkerOptions


def main(argv: list[str] | None = None) -> int:
    """Run the rank; a rank process ends with ``os._exit`` once its output is flushed (its receiving
    threads stay blocked inside gloo, and a normal interpreter exit would abort on them)."""
    code = _run(argv)
    if _in_rank():
        import os

        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _in_rank() -> bool:
    from trainers.distributed.session import in_rank

    return in_rank()


def _run(argv: list[str] | None) -> int:
    from adaptplan import cli
    from trainers.distributed.session import in_rank, serve_rank

    args = list(sys.argv[1:] if argv is None else argv)
    if "--distributed" not in args:
        args.append("--distributed")
    if in_rank():
        import os

        if int(os.environ["RANK"]) != 0:
            parsed = _worker_options(args)
            if parsed is None:
                return 2
            return serve_rank(parsed)
    return cli.main(["train", *args])


def _worker_options(args: list[str]) -> "WorkerOptions | None":
    """What a rank that only serves takes from its own command line (--rank-timeout, --threads,
    --data-root, --download, --device-data, --quiet, and --model when named): everything else is rank 0's to
    check."""
    from adaptplan import cli
    from adaptplan.cli.commands.train import explicit_fields
    from adaptplan.errors import InputError
    from trainers.distributed.serve import WorkerOptions

    parser = cli.build_parser()
    try:
        argv, _ = cli.with_run_file(["train", *args], parser)      # the ranks read the same run file
        parsed = parser.parse_args(argv)
    except (SystemExit, InputError):
        return None
    args = argv[1:]
    named = "model" in explicit_fields(parsed.parser, args)
    return WorkerOptions(float(parsed.rank_timeout), parsed.threads, parsed.data_root, bool(parsed.download),
                         parsed.model if named else None, parsed.device_data, bool(parsed.quiet))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
