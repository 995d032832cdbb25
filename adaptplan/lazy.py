"""Lazy re-exports (PEP 562 module ``__getattr__``), so that importing a package does not load torch."""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping


def lazy_getattr(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that imports ``exports[name]`` on first use.

    ``exports`` maps a public name to ``"module"`` (same attribute name) or ``"module:attribute"``.
    """

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attribute = exports[name].partition(":")
        return getattr(importlib.import_module(module), attribute or name)

    return __getattr__
