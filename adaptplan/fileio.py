"""Reading and writing the JSON/TOML files of docs/formats.md, and the value checks every reader uses.

JSON is canonical; TOML with the same keys is accepted wherever a file is read. Unknown keys are
an error naming the key; missing required keys are an error naming the key; a key given twice in
one object is an error (JSON parsers usually keep the last one silently).

Limits on what a file may hold (documented in README "Input limits"), so that the float arithmetic
of the latency and convergence models can never overflow, underflow to 0 in a divisor, or give a
round count that does not fit:

* a file is at most :data:`MAX_FILE_BYTES` and nests at most :data:`MAX_NESTING` levels;
* every number is finite with magnitude ≤ :data:`MAX_MAGNITUDE` (10³⁰); a value that must be
  > 0 is ≥ :data:`MIN_POSITIVE` (10⁻³⁰) — products and quotients of a dozen such values stay far
  inside the float range (≈10^±308);
* counts (batch size, indices, rounds...) are integers ≤ a per-field maximum, by default
  :data:`MAX_COUNT` (2⁵³, exact as a float).

Writes are atomic (:func:`atomic_write`): a temporary file in the destination's folder, fsync,
rename; the temporary file is removed on any failure, and a failure (disk full, read-only folder)
is an :class:`InputError` naming the path and the cause. Writing to a symbolic link writes through
it to the file it points to (as a shell redirection does); the link itself is kept.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import tomllib
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Mapping, TypeGuard

from adaptplan.errors import InputError

MAX_FILE_BYTES = 64 * 2**20   # bytes of one input file
MAX_NESTING = 32              # levels of objects/lists in one input file
MAX_MAGNITUDE = 1e30          # largest |x| of any number read from a file or a flag
MIN_POSITIVE = 1e-30          # smallest value of a quantity that must be > 0
MAX_COUNT = 2**53             # default largest integer count (exactly representable as a float)


class _DuplicateKey(ValueError):
    """A JSON object names the same key twice."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise _DuplicateKey(key)
        data[key] = value
    return data


def parse_text(text: str, toml: bool) -> Any:
    """Parse JSON (duplicate keys refused) or TOML; raises ``ValueError`` (or ``RecursionError``) on bad text."""
    if toml:
        return tomllib.loads(text)
    return json.loads(text, object_pairs_hook=_no_duplicates)


def is_int(value: Any) -> TypeGuard[int]:
    """An int that is not a bool (JSON and pickled state alike)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> TypeGuard[int | float]:
    """An int or float that is not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_finite_number(value: Any) -> TypeGuard[int | float]:
    """An int (of any size: every int is finite, and one beyond a float's range must not raise OverflowError) or a
    finite float, not a bool."""
    return is_int(value) or (is_number(value) and math.isfinite(value))


def toml_value(value: Any) -> str:
    """``value`` (a bool, number, text or list of them) as a TOML value: text as a basic string (JSON's escapes),
    infinities and NaN by their TOML names."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return ("inf" if value > 0 else "-inf") if math.isinf(value) else "nan" if math.isnan(value) else repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"a TOML file here holds no {type(value).__name__}")


def nesting_depth(data: Any) -> int:
    """Levels of dicts/lists in ``data`` (a scalar is 0), computed without recursion."""
    depth, level = 0, [data]
    while level:
        containers = [x for x in level if isinstance(x, (dict, list))]
        if not containers:
            break
        depth += 1
        level = [v for c in containers for v in (c.values() if isinstance(c, dict) else c)]
    return depth


def load_mapping(path: str | os.PathLike, what: str) -> dict[str, Any]:
    """Read a JSON or TOML file (by extension; ``.toml`` is TOML, anything else JSON) into a dict.

    Raises :class:`InputError` naming the file when it is missing, larger than
    :data:`MAX_FILE_BYTES`, not UTF-8, not valid JSON/TOML, names a key twice in one object, nests
    deeper than :data:`MAX_NESTING` levels or does not hold an object at the top level.
    """
    p = Path(path)
    name = str(p)
    if not p.is_file():
        problem = "is not a regular file" if p.exists() else "does not exist"
        raise InputError(f"{what} file {name!r} {problem}", field=what)
    if p.stat().st_size > MAX_FILE_BYTES:
        raise InputError(f"{what} file {name!r} is larger than {MAX_FILE_BYTES // 2**20} MiB", field=what)
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} file {name!r} is not UTF-8 text ({exc.reason} at byte {exc.start})", field=what) from None
    toml = p.suffix.lower() == ".toml"
    kind = "TOML" if toml else "JSON"
    try:
        data = parse_text(text, toml)
    except _DuplicateKey as exc:
        raise InputError(f"{what} file {name!r} gives the key {exc.args[0]!r} twice in one object", field=what) from None
    except RecursionError:
        raise InputError(f"{what} file {name!r} nests deeper than {MAX_NESTING} levels", field=what) from None
    except ValueError as exc:  # JSONDecodeError, TOMLDecodeError, an integer of more than 4300 digits
        raise InputError(f"{what} file {name!r} is not valid {kind}: {exc}", field=what) from None
    if not isinstance(data, dict):
        raise InputError(f"{what} file {name!r} must hold an object at the top level", field=what)
    if nesting_depth(data) > MAX_NESTING:
        raise InputError(f"{what} file {name!r} nests deeper than {MAX_NESTING} levels", field=what)
    return data


def load_file(path: str | os.PathLike, what: str, parse: Callable[[dict[str, Any]], Any]) -> Any:
    """``parse(load_mapping(path, what))``, with an :class:`InputError` from ``parse`` prefixed by the
    file name, e.g. ``system.json: system.devices[3].up_bps: must be > 0, got -1``."""
    data = load_mapping(path, what)
    try:
        return parse(data)
    except InputError as exc:
        where = f"{os.fspath(path)}: {exc.field}" if exc.field else os.fspath(path)
        raise type(exc)(exc.message, field=where) from None


def save_json(data: Mapping[str, Any], path: str | os.PathLike) -> None:
    """Write ``data`` as indented JSON (see :func:`save_text`)."""
    save_text(json.dumps(data, indent=2) + "\n", path)


def save_text(text: str, path: str | os.PathLike) -> None:
    """Write ``text`` (UTF-8) atomically with :func:`atomic_write`."""
    atomic_write(path, lambda fh: fh.write(text.encode("utf-8")))


def output_path(path: str | os.PathLike) -> Path:
    """Where a write to ``path`` lands: the target of a symbolic link (written through, the link
    kept), else ``path``. An existing folder is an :class:`InputError`."""
    p = Path(path)
    if p.is_symlink():
        p = Path(os.path.realpath(p))
    if p.is_dir():
        raise InputError(f"{str(path)!r} is a folder; give a file name", field="output")
    return p


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], Any]) -> Path:
    """Create or replace the file ``path`` with what ``write(binary_file)`` writes, atomically.

    Parent folders are created. The bytes go to a temporary file in the same folder, are fsynced
    and renamed over the destination, so a crash or kill leaves either the old file or the new one,
    never a partial file; the temporary file is removed on any failure. A symbolic link is written
    through (see :func:`output_path`). Returns the path written.

    Raises:
        InputError: naming ``path`` and the cause when the folder cannot be created or written
            (read-only, disk full, permissions...).
    """
    target = output_path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise InputError(f"cannot write {str(path)!r}: {exc.strerror or exc}", field="output") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise InputError(f"cannot write {str(path)!r}: {exc.strerror or exc}", field="output") from None
        raise
    return target


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


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
            raise InputError(f"unknown key {show(key)} (allowed: {', '.join(sorted(allowed))})", field=where)


def show(value: Any, limit: int = 60) -> str:
    """A short repr of a (possibly hostile) value for a message: long text is cut, a huge integer is
    described by its number of digits."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _units(unit: str) -> str:
    return f" {unit}" if unit else ""


def _in_units(unit: str) -> str:
    return f" in {unit}" if unit else ""


def _real(value: Any, field: str, unit: str) -> int | float:
    """``value`` unless it is not a real number (a bool, text, null...) or a NaN/inf float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"must be a number{_in_units(unit)}, got {show(value)}", field=field)
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"must be a finite number{_in_units(unit)}, got {show(value)}", field=field)
    return value


def finite_number(value: Any, field: str, unit: str = "") -> float:
    """Return ``value`` as a float, or raise naming ``field`` unless it is a real number (not a bool),
    finite, with magnitude ≤ :data:`MAX_MAGNITUDE`. ``unit`` (e.g. ``"bit/s"``) is named in the message."""
    _real(value, field, unit)
    if abs(value) > MAX_MAGNITUDE:
        raise InputError(f"must be at most {MAX_MAGNITUDE:g}{_units(unit)} in magnitude, got {show(value)}", field=field)
    return float(value)


def number_in_range(value: Any, field: str, low: float, high: float, unit: str = "", *,
                    low_open: bool = False, high_open: bool = False) -> float:
    """:func:`finite_number` also within ``low``..``high`` (an open end excludes the bound)."""
    number = _real(value, field, unit)
    below = number <= low if low_open else number < low
    above = number >= high if high_open else number > high
    if below or above:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise InputError(f"must be in {interval}{_units(unit)}, got {show(value)}", field=field)
    return float(number)


def int_limits(low: float | None, high: float | None) -> tuple[int, int]:
    """An integer's declared limits with their defaults: ``low`` else 1, ``high`` else :data:`MAX_COUNT`."""
    return 1 if low is None else int(low), MAX_COUNT if high is None else int(high)


def value_in_limits(value: Any, field: str, kind: str, low: float | None = None, high: float | None = None,
                    unit: str = "", *, low_open: bool = False, high_open: bool = False) -> int | float:
    """``value`` checked against declared limits (a configuration field's, an algorithm option's): ``kind``
    ``"int"`` an integer in ``low``..``high`` (None: 1 and :data:`MAX_COUNT`), ``"float"`` a finite number within
    them (None: ±:data:`MAX_MAGNITUDE`; an open end excludes the bound). InputError naming ``field`` otherwise."""
    if kind == "int":
        least, most = int_limits(low, high)
        return positive_int(value, field, most, unit) if least == 1 else int_in_range(value, field, least, most, unit)
    return number_in_range(value, field, -MAX_MAGNITUDE if low is None else low, MAX_MAGNITUDE if high is None else high,
                           unit, low_open=low_open, high_open=high_open)


def positive_number(value: Any, field: str, unit: str = "") -> float:
    """Return ``value`` as a float, or raise naming ``field`` unless it is a finite number > 0
    (at least :data:`MIN_POSITIVE`, at most :data:`MAX_MAGNITUDE`)."""
    number = finite_number(value, field, unit)
    if number <= 0:
        raise InputError(f"must be > 0{_units(unit)}, got {show(value)}", field=field)
    if number < MIN_POSITIVE:
        raise InputError(f"must be at least {MIN_POSITIVE:g}{_units(unit)} (smaller positive values are not "
                         f"supported), got {show(value)}", field=field)
    return number


def non_negative_number(value: Any, field: str, unit: str = "") -> float:
    """Return ``value`` as a float, or raise naming ``field`` unless it is a finite number ≥ 0
    (at most :data:`MAX_MAGNITUDE`)."""
    number = finite_number(value, field, unit)
    if number < 0:
        raise InputError(f"must be ≥ 0{_units(unit)}, got {show(value)}", field=field)
    return number


def int_in_range(value: Any, field: str, low: int, high: int, unit: str = "") -> int:
    """Return ``value`` as an int, or raise naming ``field`` unless it is an integer (not a bool)
    in ``low``..``high``."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InputError(f"must be an integer in {low:,}..{high:,}{_units(unit)}, got {show(value)}", field=field)
    return int(value)


def positive_int(value: Any, field: str, maximum: int = MAX_COUNT, unit: str = "") -> int:
    """Return ``value`` as an int, or raise naming ``field`` unless it is an integer in 1..``maximum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"must be an integer ≥ 1{_units(unit)}, got {show(value)}", field=field)
    if value > maximum:
        raise InputError(f"must be at most {maximum:,}{_units(unit)}, got {show(value)}", field=field)
    return int(value)


def text_value(value: Any, field: str, max_length: int = 1000) -> str:
    """Return ``value`` if it is a string of at most ``max_length`` characters, else raise naming ``field``."""
    if not isinstance(value, str):
        raise InputError(f"must be a string, got {show(value)}", field=field)
    if len(value) > max_length:
        raise InputError(f"must be at most {max_length} characters, got {len(value)}", field=field)
    return value


def mapping_value(value: Any, field: str) -> dict[str, Any]:
    """Return ``value`` if it is a JSON object (a dict), else raise naming ``field``."""
    if not isinstance(value, dict):
        raise InputError(f"must be an object, got {show(value)}", field=field)
    return value


def non_empty_list(value: Any, field: str, what: str = "a non-empty list", max_items: int = MAX_COUNT) -> list:
    """Return ``value`` if it is a non-empty JSON list of at most ``max_items`` entries, else raise
    naming ``field`` (``what`` says what it must hold)."""
    if not isinstance(value, list) or not value:
        raise InputError(f"must be {what}, got {show(value)}", field=field)
    if len(value) > max_items:
        raise InputError(f"must have at most {max_items:,} entries, got {len(value):,}", field=field)
    return value
