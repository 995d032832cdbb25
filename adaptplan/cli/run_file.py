"""``adaptplan train --config FILE``: a run file's options (trainers/config/run_file.py, docs/formats.md "Run
files") as the command-line tokens they stand for, placed before the command line's own so that a flag given
there overrides the file."""

from __future__ import annotations

import argparse
import difflib
from pathlib import Path
from typing import Any

from adaptplan.errors import InputError
from adaptplan.fileio import MAX_NESTING, nesting_depth

CONFIG_FLAG = "--config"
MAX_RUN_FILE_BYTES = 1 << 20
"""A run file is a few kB; a larger one is refused before it is parsed."""


def config_path(argv: list[str]) -> tuple[str | None, list[str]]:
    """The ``--config FILE`` of ``argv`` (None when absent) and ``argv`` without it."""
    rest, path = [], None
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == CONFIG_FLAG:
            if i + 1 >= len(argv):
                raise InputError("needs a file: --config run.toml", field=CONFIG_FLAG)
            path, i = argv[i + 1], i + 2
            continue
        if token.startswith(CONFIG_FLAG + "="):
            path = token.split("=", 1)[1]
        else:
            rest.append(token)
        i += 1
    return path, rest


def expand_run_file(argv: list[str], parser: argparse.ArgumentParser) -> tuple[list[str], dict[str, Any]]:
    """``argv`` (the ``train`` command's tokens) with ``--config FILE`` replaced by the file's options, which come
    first, and the file's Python-only options (flat key → value, for :meth:`TrainConfig.flat`); an InputError
    names the file and the key of anything the command line would not take."""
    path, rest = config_path(argv)
    if path is None:
        return argv, {}
    tokens, python_only = file_tokens(Path(path), parser)
    return [*tokens, *rest], python_only


def read_run_file(path: Path) -> dict[str, Any]:
    import tomllib

    where = f"{CONFIG_FLAG} {path}"
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise InputError(f"{str(path)!r} is not a file", field=CONFIG_FLAG)
        if size > MAX_RUN_FILE_BYTES:
            raise InputError(f"{str(path)!r} is {size:,} bytes, more than a run file's {MAX_RUN_FILE_BYTES:,}",
                             field=CONFIG_FLAG)
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except RecursionError:                                  # tomllib recurses once per level of nesting
        raise InputError(f"{where} nests deeper than {MAX_NESTING} levels", field=CONFIG_FLAG) from None
    except FileNotFoundError:
        raise InputError(f"{str(path)!r} does not exist", field=CONFIG_FLAG) from None
    except UnicodeDecodeError:
        raise InputError(f"{str(path)!r} is not UTF-8 text", field=CONFIG_FLAG) from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{where} is not TOML: {exc}", field=CONFIG_FLAG) from None
    if nesting_depth(data) > MAX_NESTING:
        raise InputError(f"{where} nests deeper than {MAX_NESTING} levels", field=CONFIG_FLAG)
    return data


OTHER_NAMES = {"learning-rate": "lr", "client-learning-rate": "client-lr", "server-learning-rate": "server-lr",
               "num-devices": "devices", "clients": "devices", "num-clients": "devices", "epochs": "rounds",
               "num-rounds": "rounds", "iterations": "rounds", "bs": "batch-size", "batch": "batch-size",
               "aggregation-interval": "interval", "cut": "cuts", "cut-layer": "cuts", "data": "dataset"}
"""Names other tools give an option (PyTorch, Flower, the papers), answered with adaptplan's: a close spelling
alone (difflib) misses them (``learning_rate`` is not near ``lr``)."""


def file_tokens(path: Path, parser: argparse.ArgumentParser) -> tuple[list[str], dict[str, Any]]:
    """The command-line tokens of the run file at ``path`` for the ``train`` parser ``parser``, and its
    Python-only options (the flat keys without a flag)."""
    from trainers.config.train_config import FLAG_OF, FLAT_KEYS, TOP_LEVEL

    table = read_run_file(path)
    actions = {s.removeprefix("--"): a for a in parser._actions for s in a.option_strings if s.startswith("--")}
    actions.pop(CONFIG_FLAG.removeprefix("--"), None)
    python_only = {k for k in FLAT_KEYS if k not in FLAG_OF and k not in TOP_LEVEL}
    tokens: list[str] = []
    extras: dict[str, Any] = {}
    for key, value in table.items():
        if key in python_only:
            extras[key] = value
            continue
        name = key.replace("_", "-")
        action = actions.get(name)
        field = f"{path}: {key}"
        if action is None:
            if isinstance(value, dict):
                raise InputError(f"[{key}] is a table; a run file is flat: write each option as a top-level "
                                 "`name = value` line (as `adaptplan train --out DIR` writes config.toml)", field=field)
            near = OTHER_NAMES.get(name) or next(iter(difflib.get_close_matches(name, list(actions), n=1)), None)
            hint = f" (did you mean {near!r}?)" if near else ""
            raise InputError(f"{key!r} is not an option of adaptplan train{hint}", field=field)
        flag = "--" + name
        if action.nargs == 0:                                     # a switch: true gives it, false leaves it out
            if not isinstance(value, bool):
                raise InputError(f"must be true or false, got {value!r}", field=field)
            tokens += [flag] if value else []
        elif isinstance(value, bool) or isinstance(value, dict):
            raise InputError(f"takes a value ({action.metavar or action.dest}), not {value!r}", field=field)
        elif isinstance(value, list):
            if not value or not all(isinstance(v, (int, float, str)) and not isinstance(v, bool) for v in value):
                raise InputError(f"must be a list of numbers or texts, got {value!r}", field=field)
            tokens += [flag, ",".join(str(v) for v in value)]
        else:
            tokens += [flag, str(value)]
    return tokens, extras
