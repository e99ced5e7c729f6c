"""The package's one config and validation toolkit.

- Checks with lower *and* upper bounds (``check_int``, ``check_number``, ``check_choice``),
  each raising ``ConfigError`` in one message form: ``"<key path>: must be ..., got ..."``
  (``owner`` is the key path of the table, ``name`` the key).
- One typed reader: ``build_dataclass`` turns nested mappings into frozen dataclasses,
  rejecting unknown keys with their key paths.
- One document loader: ``read_document`` reads TOML, YAML or JSON into a mapping.

The workload configs pass a class name as ``owner`` (``"ArrivalProcess.qps: ..."``), which
``load_workload`` rewrites into the config path (``"workload.arrival.qps: ..."``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import types
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from tokenyard.errors import ConfigError

UINT32_MAX = 2**32 - 1


def field_error(owner: str, name: str, reason: str, value: object) -> ConfigError:
    """``ConfigError`` with message ``"{owner}.{name}: {reason}"``, ``field=name``."""
    return ConfigError(f"{owner}.{name}: {reason}", field=name, value=repr(value))


def check_int(owner: str, name: str, value: object, *, low: int, high: int | None = None) -> int:
    """An int (not a bool) in ``[low, high]``."""
    bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        raise field_error(owner, name, f"must be an int {bounds}, got {value!r}", value)
    return value


def check_number(
    owner: str,
    name: str,
    value: object,
    *,
    low: float,
    low_open: bool = False,
    high: float | None = None,
) -> float:
    """A finite int or float (not a bool) ``> low`` (``low_open``) or ``>= low``, and
    ``<= high``."""
    parts = [f"> {low:g}" if low_open else f">= {low:g}"]
    if high is not None:
        parts.append(f"<= {high:g}")
    reason = f"must be a finite number {' and '.join(parts)}, got {value!r}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise field_error(owner, name, reason, value)
    number = float(value)
    if (
        not math.isfinite(number)
        or number < low
        or (low_open and number == low)
        or (high is not None and number > high)
    ):
        raise field_error(owner, name, reason, value)
    return number


def check_choice(owner: str, name: str, value: object, choices: Iterable[str]) -> str:
    """One of ``choices``; the message lists them."""
    options = sorted(choices)
    if not isinstance(value, str) or value not in options:
        expected = ", ".join(repr(c) for c in options)
        raise field_error(
            owner, name, f"unknown value {value!r}; expected one of {expected}", value
        )
    return value


def check_unset(owner: str, name: str, value: object, kind: str, default: object = None) -> None:
    """A field that does not apply to this ``kind`` must keep its default."""
    if value is default:
        return
    if default is None or isinstance(value, bool) or value != default:
        raise field_error(
            owner, name, f"does not apply to kind={kind!r} (got {value!r}); leave it out", value
        )


def fail(where: str, message: str, value: object) -> ConfigError:
    """``ConfigError`` with message ``"{where}: {message}"``, ``field=where``."""
    return ConfigError(f"{where}: {message}", field=where, value=repr(value))


def _at_path(where: str, check: Any, *args: Any, **kwargs: Any) -> Any:
    """Runs a check with ``owner.name`` split from ``where``; the error's field is the
    whole key path."""
    owner, _, name = where.rpartition(".")
    try:
        return check(owner or where, name, *args, **kwargs)
    except ConfigError as exc:
        message = str(exc) if owner else str(exc).replace(f"{where}.{name}:", f"{where}:", 1)
        raise ConfigError(message, field=where, value=exc.value) from None


def check_key_int(where: str, value: object, *, low: int, high: int) -> int:
    """``check_int`` for a dotted key path (the error's field is the path)."""
    result: int = _at_path(where, check_int, value, low=low, high=high)
    return result


def check_key_number(
    where: str, value: object, *, low: float, high: float, low_open: bool = False
) -> float:
    """``check_number`` for a dotted key path (the error's field is the path)."""
    result: float = _at_path(where, check_number, value, low=low, high=high, low_open=low_open)
    return result


def check_key_choice(where: str, value: object, choices: Iterable[str]) -> str:
    """``check_choice`` for a dotted key path (the error's field is the path)."""
    result: str = _at_path(where, check_choice, value, choices)
    return result


def _convert(where: str, hint: Any, value: Any) -> Any:
    """Checks one value against its field's type; nested dataclasses recurse."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return build_dataclass(hint, value, where)
    origin = get_origin(hint)
    if origin is tuple:
        item = get_args(hint)[0]
        kinds = (int, float) if item is float else (item,)
        ok = isinstance(value, (list, tuple)) and all(
            isinstance(v, kinds) and not isinstance(v, bool) for v in value
        )
        if not ok:
            noun = {int: "ints", float: "numbers"}.get(item, "strings")
            raise fail(where, f"must be a list of {noun}, got {value!r}", value)
        return tuple(float(v) for v in value) if item is float else tuple(value)
    if origin in (Union, types.UnionType):  # X | None
        if value is None:
            return None
        return _convert(where, next(a for a in get_args(hint) if a is not type(None)), value)
    if origin is Literal:
        choices = get_args(hint)
        if value not in choices or isinstance(value, bool):
            listed = ", ".join(repr(c) for c in choices)
            raise fail(where, f"must be one of {listed}, got {value!r}", value)
        return value
    if hint is Mapping[str, Any] or origin is Mapping:
        if not isinstance(value, Mapping):
            raise fail(where, f"must be a table, got {value!r}", value)
        return dict(value)
    expected = {bool: "true or false", int: "an int", float: "a number", str: "a string"}
    matches: dict[Any, bool] = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
    }
    if hint in matches:
        if not matches[hint]:
            raise fail(where, f"must be {expected[hint]}, got {value!r}", value)
        return float(value) if hint is float else value
    raise TypeError(f"no conversion for {hint!r}")  # pragma: no cover - a bug here


def build_dataclass(cls: type[Any], mapping: Any, where: str, base: Any = None) -> Any:
    """An instance of the dataclass ``cls`` from a mapping: unknown keys and wrong types
    raise ``ConfigError`` with their key paths. Unset fields take ``base``'s values (when
    given) or the class defaults; the class's own checks run on construction."""
    if not isinstance(mapping, Mapping):
        raise fail(where or "config", f"must be a table, got {mapping!r}", mapping)
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = {}
    for key, value in mapping.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in fields:
            raise fail(path, f"unknown key; expected one of {', '.join(sorted(fields))}", value)
        nested_base = getattr(base, key) if base is not None else _field_default(fields[key])
        hint = hints[key]
        if dataclasses.is_dataclass(hint) and isinstance(hint, type):
            values[key] = build_dataclass(hint, value, path, nested_base)
        else:
            values[key] = _convert(path, hint, value)
    try:
        return dataclasses.replace(base, **values) if base is not None else cls(**values)
    except ConfigError as exc:
        raise _located(exc, where) from None


def _field_default(field: dataclasses.Field[Any]) -> Any:
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


def _located(exc: ConfigError, where: str) -> ConfigError:
    """A class's own check names its field bare (``max_num_seqs: ...``); prefix the path."""
    field = exc.field or ""
    if not where or field.startswith(where) or "." in field:
        return exc
    message = str(exc)
    if message.startswith(f"{field}:") or message.startswith(f"{field} "):
        message = f"{where}.{message}"
    return ConfigError(message, field=f"{where}.{field}", value=exc.value)


def toml_module() -> types.ModuleType:
    """``tomllib`` (Python 3.11+) or its backport ``tomli``."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    return tomllib


def read_document(path: str | Path, *, what: str = "config file") -> dict[str, Any]:
    """The mapping in a ``.toml``, ``.yaml``, ``.yml`` or ``.json`` file (an empty YAML or
    JSON document is an empty mapping); every failure is a ``ConfigError`` naming the
    file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(
            f"{what} {path}: {exc.strerror}", field="config", value=str(path)
        ) from None
    return parse_document(f"{what} {path}", text, path.suffix.lower())


def parse_document(
    source: str, text: str, suffix: str, *, field: str = "config", kind: str = ""
) -> dict[str, Any]:
    """The mapping in ``text``, a document in the format ``suffix`` names (``.toml``,
    ``.yaml``, ``.yml``, ``.json``); errors are ``ConfigError`` with messages starting
    with ``source`` (``kind`` names the document in the unknown-format message)."""
    try:
        if suffix == ".toml":
            return dict(toml_module().loads(text))
        if suffix == ".json":
            return _mapping_document(source, json.loads(text), field)
        if suffix in (".yaml", ".yml"):
            import yaml

            return _mapping_document(source, yaml.safe_load(text), field)
    except ConfigError:
        raise
    except (ValueError, ImportError) as exc:  # TOML, JSON and YAML errors are ValueErrors
        raise ConfigError(f"{source}: {exc}", field=field, value=source) from None
    except Exception as exc:  # yaml.YAMLError
        raise ConfigError(f"{source}: {exc}", field=field, value=source) from None
    noun = f"unknown {kind} format" if kind else "unknown format"
    raise ConfigError(
        f"{source}: {noun} {suffix!r}; use .toml, .yaml, .yml or .json",
        field=field,
        value=source,
    )


def _mapping_document(source: str, data: Any, field: str) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the document must be a mapping", field=field, value=source)
    return data
