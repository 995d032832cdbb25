"""The edits the hostile-input harnesses make (tools/hostile_recipes.py, hostile_files.py, hostile_frames.py): every
key path of a parsed document, and the document with the value at one path replaced or deleted."""

from __future__ import annotations

import copy
from typing import Any, Iterator

DELETE = object()
"""The edit that deletes the key (or list item) at the path."""


def paths(value: Any, path: tuple = (), every_item: bool = True) -> Iterator[tuple]:
    """Every key path of a nested value (not the value itself); of a list (or tuple) every item's, or with
    ``every_item`` false the first and the last item's (where the items are alike, e.g. one per device)."""
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, (list, tuple)):
        items = list(enumerate(value))
        if not every_item and len(items) > 2:
            items = items[:1] + items[-1:]
    else:
        items = []
    for key, inner in items:
        yield path + (key,)
        yield from paths(inner, path + (key,), every_item)


def edited(document: Any, path: tuple, value: Any) -> Any:
    """A deep copy of ``document`` with the value at ``path`` replaced by ``value`` (:data:`DELETE`: removed); a tuple
    on the way is edited as a list."""
    out = copy.deepcopy(document)
    holder = out
    for key in path[:-1]:
        inner = holder[key]
        if isinstance(inner, tuple):
            inner = holder[key] = list(inner)
        holder = inner
    if isinstance(holder, tuple):                        # the document itself a tuple: not one of ours
        raise TypeError("the document is a tuple")
    if value is DELETE:
        del holder[path[-1]]
    else:
        holder[path[-1]] = value
    return out


def at(document: Any, path: tuple) -> Any:
    """The value at ``path``."""
    for key in path:
        document = document[key]
    return document
