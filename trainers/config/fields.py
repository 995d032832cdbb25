"""What a configuration field says about itself: :class:`Meta` (its flat name, flag, help, unit, limits,
choices, whether a resumed run may change it), declared once beside the field with :func:`option`.

The parts of :class:`trainers.config.train_config.TrainConfig` are dataclasses of such fields; from their metadata come the
range and choice checks (:func:`check_fields`), the set of options a resumed run may change and the flags'
names (:mod:`trainers.config.train_config`), and the command line's options (:mod:`adaptplan.cli.config_flags`). Torch-free
and argparse-free: the CLI reads this, not the other way round.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from adaptplan.errors import InputError
from adaptplan.fileio import int_limits, show, value_in_limits
from trainers.algorithms import check_choice

META = "adaptplan"
"""The key of a field's :class:`Meta` in ``dataclasses.Field.metadata``."""


@dataclass(frozen=True)
class Meta:
    """One configuration field's description.

    ``key``: its flat name (saved configurations, error messages; default the attribute's name). ``flag``: the
    command-line flag that sets it (``""`` = ``--key-with-dashes``, None = none: a Python-only option);
    ``generated``: False where the CLI writes the flag itself (``--cuts`` parses a list, ``--runtime`` sets two
    fields). ``help`` as the CLI prints it. ``unit`` of a number; ``low``/``high`` its limits (None: 1 for an
    integer, none for a number; :data:`~adaptplan.fileio.MAX_COUNT` for an integer, none for a number),
    ``low_open``/``high_open`` exclude them; ``auto``: the text
    ``"auto"`` is allowed beside the numbers. ``choices`` of a text field. ``resumable``: a resumed run may give it
    anew. ``negated``: the flag sets the field to False (``--no-progress``), the command line's default being True.
    """

    help: str = ""
    key: str = ""
    flag: str | None = ""
    generated: bool = True
    unit: str = ""
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    auto: bool = False
    choices: tuple[str, ...] = ()
    resumable: bool = False
    negated: bool = False
    metavar: str | None = None


def option(default: Any = dataclasses.MISSING, help: str = "", *, factory: Callable[[], Any] | None = None,
           **meta: Any) -> Any:
    """A dataclass field with its :class:`Meta` (``meta`` as its fields); ``factory`` for a mutable default."""
    info = {META: Meta(help=help, **meta)}
    if factory is not None:
        return field(default_factory=factory, metadata=info)
    return field(default=default, metadata=info)


@dataclass(frozen=True)
class Described:
    """A field of a part with its metadata resolved: the attribute ``name``, the flat ``key``, the ``flag``
    (None: no flag), its annotation ``kind`` (``"int | None"``...), its default and the :class:`Meta`."""

    name: str
    key: str
    flag: str | None
    kind: str
    default: Any
    meta: Meta

    @property
    def base(self) -> str:
        """The annotation's first type (``"int"`` of ``"int | None"``)."""
        return self.kind.split("|")[0].strip()

    @property
    def optional(self) -> bool:
        """None is a value of the field."""
        return "None" in (k.strip() for k in self.kind.split("|"))

    @property
    def int_limits(self) -> tuple[int, int]:
        """An integer field's limits: its ``low`` (default 1) and ``high`` (default :data:`MAX_COUNT`)."""
        return int_limits(self.meta.low, self.meta.high)

    @property
    def on_command_line(self) -> bool:
        """The CLI generates its flag (it has one and no command writes it itself)."""
        return self.flag is not None and self.meta.generated


def described(part: Any) -> Iterator[Described]:
    """The fields of the dataclass (or instance) ``part`` that carry a :class:`Meta`, in declaration order."""
    for f in dataclasses.fields(part):
        meta = f.metadata.get(META)
        if meta is None:
            continue
        key = meta.key or f.name
        flag = None if meta.flag is None else meta.flag or "--" + key.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        yield Described(f.name, key, flag, str(f.type), default, meta)


_TYPES: dict[str, type] = {"str": str, "bool": bool, "dict[str, Any]": dict}
_WORDS = {"str": "text", "bool": "true or false", "dict[str, Any]": "an object"}


def check_fields(part: Any) -> None:
    """Raise InputError naming the flat key of the first field of ``part`` whose value is not of its type, not
    one of its ``choices`` or outside its limits (generated from each field's annotation and :class:`Meta`)."""
    for d in described(part):
        value = getattr(part, d.name)
        if (value is None and d.optional) or (d.meta.auto and value == "auto"):
            continue
        if d.base in _TYPES:
            if not isinstance(value, _TYPES[d.base]):
                words = _WORDS[d.base] + (" or null" if d.optional else "")
                raise InputError(f"must be {words}, got {type(value).__name__}", field=d.key)
            if d.meta.choices:                     # text fields only
                check_choice(str(value), d.meta.choices, d.key)
        elif d.base in ("int", "float"):
            if d.meta.auto and isinstance(value, str) and d.base == "int":
                raise InputError(f"must be auto or an integer, got {show(value)}", field=d.key)
            value_in_limits(value, d.key, d.base, d.meta.low, d.meta.high, d.meta.unit, low_open=d.meta.low_open,
                            high_open=d.meta.high_open)


def resumable_keys(*parts: Any) -> tuple[str, ...]:
    """The flat keys of the fields of ``parts`` (dataclasses) that a resumed run may change."""
    return tuple(d.key for part in parts for d in described(part) if d.meta.resumable)
