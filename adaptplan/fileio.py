"""Reading and writing the JSON/TOML files of docs/formats.md.

JSON is canonical; TOML with the same keys is accepted wherever a file is read. Unknown keys are
an error naming the key; missing required keys are an error naming the key.
"""

from __future__ import annotations

import json
import math
import os
import tomllib
from pathlib import Path
from typing import Any, Iterable, Mapping

from adaptplan.errors import InputError


def load_mapping(path: str | os.PathLike, what: str) -> dict[str, Any]:
    """Read a JSON or TOML file (by extension; ``.toml`` is TOML, anything else JSON) into a dict."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{what} file {str(p)!r} does not exist", field=what)
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} file {str(p)!r} is not UTF-8 text ({exc.reason} at byte {exc.start})", field=what) from None
    try:
        data = tomllib.loads(text) if p.suffix.lower() == ".toml" else json.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InputError(f"{what} file {str(p)!r} is not valid {'TOML' if p.suffix == '.toml' else 'JSON'}: {exc}", field=what) from None
    if not isinstance(data, dict):
        raise InputError(f"{what} file {str(p)!r} must hold an object at the top level", field=what)
    return data


def save_json(data: Mapping[str, Any], path: str | os.PathLike) -> None:
    """Write ``data`` as indented JSON, creating parent folders; the write is atomic (temp file + rename)."""
    save_text(json.dumps(data, indent=2) + "\n", path)


def save_text(text: str, path: str | os.PathLike) -> None:
    """Write ``text`` (UTF-8), creating parent folders; atomic (temp file + rename), so a crash never
    leaves a half-written file."""
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{str(p)!r} is a folder; give a file name", field="output")
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, p)


def check_keys(data: Mapping[str, Any], required: Iterable[str], optional: Iterable[str], where: str) -> None:
    """Raise :class:`InputError` on a missing required key or an unknown key (both named)."""
    required, optional = list(required), list(optional)
    if not isinstance(data, Mapping):
        raise InputError(f"expected an object, got {type(data).__name__}", field=where)
    for key in required:
        if key not in data:
            raise InputError(f"missing required key {key!r}", field=where)
    allowed = set(required) | set(optional)
    for key in data:
        if key not in allowed:
            raise InputError(f"unknown key {key!r} (allowed: {', '.join(sorted(allowed))})", field=where)


def positive_number(value: Any, field: str) -> float:
    """Return ``value`` as a float, or raise naming ``field`` unless it is a finite number > 0."""
    number = finite_number(value, field)
    if number <= 0:
        raise InputError(f"must be > 0, got {value!r}", field=field)
    return number


def non_negative_number(value: Any, field: str) -> float:
    """Return ``value`` as a float, or raise naming ``field`` unless it is a finite number ≥ 0."""
    number = finite_number(value, field)
    if number < 0:
        raise InputError(f"must be ≥ 0, got {value!r}", field=field)
    return number


def finite_number(value: Any, field: str) -> float:
    """Return ``value`` as a float, or raise naming ``field`` unless it is a finite real number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"must be a number, got {value!r}", field=field)
    if not math.isfinite(value):
        raise InputError(f"must be finite, got {value!r}", field=field)
    return float(value)


def positive_int(value: Any, field: str) -> int:
    """Return ``value`` as an int, or raise naming ``field`` unless it is an integer ≥ 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"must be an integer ≥ 1, got {value!r}", field=field)
    return int(value)


def non_empty_list(value: Any, field: str, what: str = "a non-empty list") -> list:
    """Return ``value`` if it is a non-empty JSON list, else raise naming ``field`` (``what`` says what it must hold)."""
    if not isinstance(value, list) or not value:
        raise InputError(f"must be {what}, got {value!r}", field=field)
    return value
