"""argparse value types for numeric flags: finite, in range, the unit named in the message.

``type=int_flag(0, MAX_SEED)`` turns ``--seed -1`` into ``argument --seed: must be an integer in
0..4,294,967,295, got -1`` (exit code 2) instead of a traceback later; the checks are
:mod:`adaptplan.fileio`'s, so a flag and a file field obey the same rules.
"""

from __future__ import annotations

import argparse
from typing import Callable

from adaptplan.errors import InputError
from adaptplan.fileio import MAX_MAGNITUDE, MIN_POSITIVE, int_in_range, number_in_range, show


def _flag_type(parse: Callable[[str], object], check: Callable[[object], object], name: str) -> Callable[[str], object]:
    def convert(text: str) -> object:
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {name}, got {show(text)}") from None
        try:
            return check(value)
        except InputError as exc:
            raise argparse.ArgumentTypeError(exc.message) from None

    convert.__name__ = name
    return convert


def int_flag(low: int, high: int, unit: str = "") -> Callable[[str], int]:
    """An argparse ``type`` for an integer in ``low``..``high`` (``unit`` named in the message)."""
    return _flag_type(int, lambda v: int_in_range(v, "", low, high, unit), "an integer")  # type: ignore[return-value]


def auto_or_int_flag(low: int, high: int, unit: str = "") -> Callable[[str], int | str]:
    """An argparse ``type`` for ``auto`` or an integer in ``low``..``high``."""
    whole = int_flag(low, high, unit)

    def convert(text: str) -> int | str:
        if text == "auto":
            return text
        try:
            return whole(text)
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(str(exc).replace("must be an integer", "must be auto or an integer", 1)) from None

    convert.__name__ = "auto or an integer"
    return convert


def float_flag(low: float, high: float = MAX_MAGNITUDE, unit: str = "", *, low_open: bool = False,
               high_open: bool = False) -> Callable[[str], float]:
    """An argparse ``type`` for a finite number in ``low``..``high`` (open ends exclude the bound)."""
    return _flag_type(float, lambda v: number_in_range(v, "", low, high, unit, low_open=low_open, high_open=high_open),
                      "a number")  # type: ignore[return-value]


def positive_float_flag(unit: str = "") -> Callable[[str], float]:
    """An argparse ``type`` for a positive quantity in [:data:`MIN_POSITIVE`, :data:`MAX_MAGNITUDE`]."""
    return float_flag(MIN_POSITIVE, MAX_MAGNITUDE, unit)


def whole_numbers(text: str, flag: str, low: int, high: int) -> list[int]:
    """``A,B,...`` → distinct integers in ``low``..``high``, in order; one message naming ``flag`` otherwise."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InputError(f"must be integers separated by commas, got {text!r}", field=flag) from None
    if not values:
        raise InputError(f"name at least one, got {text!r}", field=flag)
    if any(not low <= v <= high for v in values):
        raise InputError(f"each must be in {low}..{high}, got {text!r}", field=flag)
    if len(set(values)) != len(values):
        raise InputError(f"each may appear once, got {text!r}", field=flag)
    return values
