"""Package attributes imported at first use (PEP 562), so that importing a package for one
of its submodules does not import all of them."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attribute(namespace: dict[str, Any], exports: Mapping[str, str], name: str) -> Any:
    """The package attribute `name` from its module in `exports` (name -> module), kept in
    the package's `namespace` once imported; `AttributeError` for any other name."""
    module = exports.get(name)
    if module is None:
        raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    namespace[name] = value
    return value


def lazy_dir(namespace: dict[str, Any], exports: Mapping[str, str]) -> list[str]:
    """The package's names, those not imported yet included (for `dir()` and completion)."""
    return sorted(set(namespace) | set(exports))


def lazy_module(
    namespace: dict[str, Any], exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` over ``exports`` (name -> module)."""

    def getattr_(name: str) -> Any:
        return lazy_attribute(namespace, exports, name)

    def dir_() -> list[str]:
        return lazy_dir(namespace, exports)

    return getattr_, dir_
