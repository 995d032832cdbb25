"""Command-line options generated from the metadata of :class:`trainers.config.train_config.TrainConfig`'s parts
(:mod:`trainers.config.fields`): one argparse option per field that has a flag, its ``dest`` the field's flat key,
its help, default, choices and metavar the field's; a number with ``auto`` allowed is checked as it is parsed.
"""

from __future__ import annotations

import argparse
import re
from typing import Any, Callable, Iterable

from adaptplan.cli.flags import auto_or_int_flag, float_flag, int_flag
from adaptplan.fileio import MAX_MAGNITUDE, int_limits
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


KEEP: Any = object()
"""``add_field``'s default: the field's own default."""


def _declared(key: str) -> tuple[Described | None, Any]:
    """The described TrainConfig field of flat key ``key``, or else the registry's option of that name
    (:data:`trainers.algorithms.REGISTRY`); KeyError when neither declares it."""
    from trainers.algorithms import REGISTRY
    from trainers.config.train_config import PARTS

    for part in PARTS.values():
        for d in described(part):
            if d.key == key:
                return d, None
    for entry in REGISTRY.values():
        for option in entry.options:
            if option.name == key:
                return None, option
    raise KeyError(f"no configuration field or algorithm option named {key!r}")


def _with_default(help: str, default: Any) -> str:
    """``help`` with its ``(default …)`` saying ``default`` instead (appended where it has none)."""
    shown = default if isinstance(default, str) else f"{default:g}" if isinstance(default, float) else str(default)
    stripped, count = re.subn(r"\(default[^()]*(\([^()]*\)[^()]*)*\)", f"(default {shown})", help, count=1)
    return stripped if count else f"{help} (default {shown})"


def add_field(parser: Any, key: str, *, default: Any = KEEP, shown: str | None = None, flag: str | None = None,
              help: str | None = None, dest: str | None = None) -> None:
    """The option of a run's configuration field (flat key ``key``) or of the algorithm option of that name, as
    its declaration states it: the type, limits (checked as the value is parsed: one message naming the flag and
    the range), choices, unit and help that ``adaptplan train`` uses. A command that shares the option with train
    may give its own ``default`` (the help then says it, or ``shown`` where the value alone would not say what it
    means), ``flag`` (default: the field's), ``help`` and ``dest`` (default: ``key``)."""
    d, option = _declared(key)
    if d is not None:
        meta = d.meta
        base, choices, text, own, name = d.base, meta.choices, meta.help, d.default, flag or d.flag
        limits = (meta.low, meta.high, meta.unit, meta.low_open, meta.high_open)
        auto, metavar = meta.auto, meta.metavar
    else:
        base, choices, text, own, name = option.type.__name__, option.choices, option.help, option.default, \
            flag or option.flag
        limits = (*option.limits, option.unit, option.low_open, option.high_open)
        auto, metavar = False, None
    name = name or "--" + key.replace("_", "-")
    value = own if default is KEEP else default
    options: dict[str, Any] = {"dest": dest or key, "default": value}
    options["help"] = help or (text if default is KEEP and shown is None else _with_default(text, shown or value))
    if base == "bool":
        options.update(action="store_true")
        parser.add_argument(name, **options)
        return
    kind = limited_flag(base, *limits, auto=auto)
    if kind is not None:
        options["type"] = kind
    if choices:
        options["choices"] = choices
    else:
        options["metavar"] = metavar or name[2:].upper().replace("-", "_")
    parser.add_argument(name, **options)


def limited_flag(base: str, low: float | None, high: float | None, unit: str = "", low_open: bool = False,
                 high_open: bool = False, *, auto: bool = False) -> Callable[[str], Any] | None:
    """The argparse ``type`` of a number declared with these limits (None: an integer's 1 and
    :data:`~adaptplan.fileio.MAX_COUNT`, a number's ±:data:`~adaptplan.fileio.MAX_MAGNITUDE`), ``auto`` allowed
    beside an integer; None for text."""
    if base == "int":
        bounds = int_limits(low, high)
        return auto_or_int_flag(*bounds, unit) if auto else int_flag(*bounds, unit)
    if base == "float":
        return float_flag(-MAX_MAGNITUDE if low is None else low, MAX_MAGNITUDE if high is None else high, unit,
                          low_open=low_open, high_open=high_open)
    return None
