"""Command-line options generated from the metadata of :class:`trainers.config.train_config.TrainConfig`'s parts
(:mod:`trainers.config.fields`): one argparse option per field that has a flag, its ``dest`` the field's flat key,
its help, default, choices and metavar the field's; a number with ``auto`` allowed is checked as it is parsed.
"""

from __future__ import annotations

import argparse
from typing import Any, Iterable

from adaptplan.cli.flags import auto_or_int_flag
from trainers.config.fields import Described, described


def add_flag(parser: Any, d: Described) -> None:
    """Add the option of the described field ``d`` to ``parser`` (a parser or an argument group)."""
    assert d.flag is not None
    options: dict[str, Any] = {"dest": d.key, "help": d.meta.help}
    if d.base == "bool":
        options.update(action="store_false" if d.meta.negated else "store_true",
                       default=True if d.meta.negated else d.default)
    else:
        options["default"] = d.default
        if d.meta.auto:
            options["type"] = auto_or_int_flag(*d.int_limits, d.meta.unit)
        elif d.base in ("int", "float"):
            options["type"] = int if d.base == "int" else float
        if d.meta.choices:
            options["choices"] = d.meta.choices
        else:
            options["metavar"] = d.meta.metavar or d.flag[2:].upper().replace("-", "_")
    parser.add_argument(d.flag, **options)


def add_part(parser: Any, part: type, only: Iterable[str] | None = None) -> None:
    """The options of every field of ``part`` (a dataclass of :mod:`trainers.config.train_config`) that has a generated flag,
    or of the flat keys ``only``, in declaration order."""
    keep = None if only is None else set(only)
    for d in described(part):
        if d.on_command_line and (keep is None or d.key in keep):
            add_flag(parser, d)


def part_values(args: argparse.Namespace, *parts: type) -> dict[str, Any]:
    """The flat key → value of every generated option of ``parts`` in the parsed ``args``."""
    return {d.key: getattr(args, d.key) for part in parts for d in described(part) if d.on_command_line}
