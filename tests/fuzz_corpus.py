"""A seeded generator of hostile input files for the CLI fuzz test (tests/adaptplan/cli/test_fuzz_cli.py).

Each base document is a small valid profile / system / constants / plan / history. Every field
(every path to a value, containers included) is mutated with kinds drawn by a seeded RNG: wrong
types, NaN, ±inf, huge and tiny numbers, 10**400, negative, null, missing, unknown sibling key,
duplicate key, wrong nesting (wrapped in a list/object, thousands of levels deep), long text. Whole
files are mutated too: empty, binary, not UTF-8, truncated, a list at the top level. The JSON text
is written by hand where ``json.dumps`` cannot express the case (duplicate keys, ``10**400``, deep
nesting): raw snippets replace sentinel strings. Some files are TOML (the same keys; nan/inf/huge
integers as TOML literals).
"""

from __future__ import annotations

import copy
import json
import math
import random
from dataclasses import dataclass
from typing import Any, Iterator

KINDS = ("profile", "system", "constants", "plan", "history")

# raw JSON snippets a value can be replaced with (text, not Python values)
RAW_VALUES = {
    "null": "null", "true": "true", "false": "false", "string": '"fast"', "empty string": '""',
    "empty list": "[]", "empty object": "{}", "NaN": "NaN", "Infinity": "Infinity", "-Infinity": "-Infinity",
    "1e308": "1e308", "-1e308": "-1e308", "5e-324": "5e-324", "1e-300": "1e-300", "10**400": "1" + "0" * 400,
    "-10**400": "-1" + "0" * 400, "zero": "0", "negative": "-1", "negative float": "-2.5", "fraction": "0.5",
    "1e30": "1e30", "1e31": "1e31", "2**63": str(2**63), "huge int": "999999999999999",
    "long string": json.dumps("x" * 5000), "4400 digits": "9" * 4400,
    "nested 50": "[" * 50 + "1" + "]" * 50, "nested 5000": "[" * 5000 + "]" * 5000,
    "nested objects 3000": '{"a":' * 3000 + "1" + "}" * 3000,
}


def base_documents() -> dict[str, dict[str, Any]]:
    """Small valid files of each kind (2 devices, 3 cut points) that plan and plot accept."""
    cut = lambda j: {"index": j, "name": f"layer{j}", "fp_flops": 1e9 * j, "bp_flops": 2e9 * j,  # noqa: E731
                     "activation_bits": 8e6 / j, "gradient_bits": 8e6 / j, "client_param_bits": 1e6 * j}
    device = {"flops": 1e11, "up_bps": 1e7, "down_bps": 2e7, "fed_up_bps": 1e7, "fed_down_bps": 2e7}
    record = lambda t: {"round": t, "train_loss": 2.0 / t, "accuracy": 0.1 * t, "test_loss": 2.1 / t,  # noqa: E731
                        "sim_seconds": 0.5 * t, "round_sim_seconds": 0.5, "wall_seconds": 0.1 * t, "bytes_up": 1000,
                        "bytes_down": 900, "bytes_server": 0, "aggregated": t % 2 == 0, "replanned": False,
                        "cuts": [1, 2], "interval": 2, "participants": [0, 1],
                        "stage_seconds": {"client FP + upload": 0.3, "server": 0.2}, "metrics": {"ratio": 0.5}}
    return {
        "profile": {"model": "toy", "input_shape": [3, 8, 8], "bits_per_value": 32,
                    "flop_convention": "2 per multiply-add", "cut_points": [cut(1), cut(2), cut(3)],
                    "timing": {"batch_size": 16, "repeats": 5}},
        "system": {"batch_size": 10, "server_flops": 1e12, "edge_to_fed_bps": 1e8, "fed_to_edge_bps": 1e8,
                   "devices": [dict(device), dict(device, flops=2e11)]},
        "constants": {"beta": 5.0, "gamma": 0.01, "theta": 2.3, "epsilon": 0.1, "sigma2": [1.0, 1.0, 1.0],
                      "G2": [0.002, 0.002, 0.002]},
        "plan": {"interval": 3, "cuts": [1, 2], "rounds": 300, "aggregations": 100, "round_latency_s": 0.5,
                 "aggregation_latency_s": 0.4, "total_latency_s": 190.0, "objective_s": 190.5,
                 "solver": {"method": "bcd", "iterations": 3}, "breakdown": {"client FP + upload": 0.2, "server FP": 0.01}},
        "history": {"meta": {"config": {"algorithm": "adaptsfl", "devices": 2}, "target_accuracy": 0.2},
                    "events": [{"round": 0, "event": "plan"}], "summary": {"rounds": 2},
                    "records": [record(1), record(2)]},
    }


def paths(value: Any, prefix: tuple = ()) -> Iterator[tuple]:
    """Every path (tuple of keys/indices) to a value inside ``value``, containers included."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield prefix + (key,)
            yield from paths(item, prefix + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield prefix + (index,)
            yield from paths(item, prefix + (index,))


@dataclass(frozen=True)
class Case:
    """One generated file: ``kind`` (profile/system/...), a description, and the file's bytes."""

    kind: str
    description: str
    data: bytes
    suffix: str = ".json"


def _render(doc: Any, raws: dict[str, str]) -> str:
    text = json.dumps(doc)
    for sentinel, raw in raws.items():
        text = text.replace(json.dumps(sentinel), raw)
    return text


def _parent(doc: Any, path: tuple) -> Any:
    for key in path[:-1]:
        doc = doc[key]
    return doc


def mutate(doc: dict[str, Any], path: tuple, how: str, rng: random.Random) -> tuple[str, str]:
    """(description, JSON text) of ``doc`` with the value at ``path`` mutated ``how``."""
    doc = copy.deepcopy(doc)
    parent, key = _parent(doc, path), path[-1]
    where = ".".join(map(str, path))
    raws: dict[str, str] = {}
    if how == "missing":
        if isinstance(parent, dict):
            del parent[key]
        else:
            parent.pop(key)
    elif how == "unknown key":
        target = parent if isinstance(parent, dict) else doc
        target["surprise"] = 1
    elif how == "duplicate key":
        if isinstance(parent, dict):
            parent["@@DUP@@"] = rng.choice([parent[key], 7, "x"])
            raws["@@DUP@@"] = json.dumps(key)
            text = json.dumps(doc).replace('"@@DUP@@":', f"{json.dumps(key)}:")
            return f"{where}: duplicate key", text
        parent.append(copy.deepcopy(parent[key]))    # a list: a duplicated entry instead
    elif how == "wrap in list":
        parent[key] = [parent[key]]
    elif how == "wrap in object":
        parent[key] = {"value": parent[key]}
    else:
        parent[key] = "@@RAW@@"
        raws["@@RAW@@"] = RAW_VALUES[how]
    return f"{where}: {how}", _render(doc, raws)


FIELD_MUTATIONS = (*RAW_VALUES, "missing", "unknown key", "duplicate key", "wrap in list", "wrap in object")


def whole_file_cases(kind: str, doc: dict[str, Any], rng: random.Random) -> list[Case]:
    text = json.dumps(doc).encode()
    return [
        Case(kind, "empty file", b""),
        Case(kind, "binary", bytes(rng.randrange(256) for _ in range(200))),
        Case(kind, "not UTF-8", b'{"model": "\xff\xfe"}'),
        Case(kind, "truncated", text[: rng.randrange(1, len(text))]),
        Case(kind, "top-level list", b"[" + text + b"]"),
        Case(kind, "top-level number", b"42"),
        Case(kind, "NUL byte", text[:5] + b"\x00" + text[5:]),
        Case(kind, "TOML text as JSON", b"beta = 5\n"),
        Case(kind, "valid", text),
        Case(kind, "bad TOML", b"a = [1,\n", ".toml"),
        Case(kind, "TOML with a list", b"beta = [1, 2]\n", ".toml"),
    ]


# Python values a field can take in a TOML file (TOML has no null; nan/inf are TOML literals)
TOML_VALUES = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "1e308": 1e308, "5e-324": 5e-324,
               "10**400": 10**400, "2**63": 2**63, "negative": -1, "zero": 0, "string": "fast", "true": True,
               "empty list": [], "empty table": {}, "nested list": [[[1]]]}


def toml_value(value: Any) -> str:
    """``value`` as TOML text (inline tables for objects)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def toml_text(doc: dict[str, Any]) -> str:
    return "".join(f"{json.dumps(k)} = {toml_value(v)}\n" for k, v in doc.items())


def toml_cases(kind: str, doc: dict[str, Any], rng: random.Random, count: int) -> list[Case]:
    """``count`` TOML files: ``doc`` with one field set to a :data:`TOML_VALUES` value (first: unchanged)."""
    cases = [Case(kind, "valid TOML", toml_text(doc).encode(), ".toml")]
    all_paths = list(paths(doc))
    for _ in range(count - 1):
        path, how = rng.choice(all_paths), rng.choice(list(TOML_VALUES))
        mutated = copy.deepcopy(doc)
        _parent(mutated, path)[path[-1]] = copy.deepcopy(TOML_VALUES[how])
        cases.append(Case(kind, f"TOML {'.'.join(map(str, path))}: {how}", toml_text(mutated).encode(), ".toml"))
    return cases


def generate(seed: int, per_kind: int) -> list[Case]:
    """About ``per_kind`` JSON field mutations per file kind (every field at least once when ``per_kind``
    allows), ``per_kind // 5`` TOML ones, plus the whole-file cases; deterministic in ``seed``."""
    rng = random.Random(seed)
    cases: list[Case] = []
    for kind, doc in base_documents().items():
        cases += whole_file_cases(kind, doc, rng)
        cases += toml_cases(kind, doc, rng, max(1, per_kind // 5))
        all_paths = list(paths(doc))
        chosen = [all_paths[i % len(all_paths)] for i in range(per_kind)]
        rng.shuffle(chosen)
        for path in chosen:
            description, text = mutate(doc, path, rng.choice(FIELD_MUTATIONS), rng)
            cases.append(Case(kind, description, text.encode()))
    return cases
