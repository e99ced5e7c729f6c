"""``load_workload``: a workload from a config mapping (a TOML/YAML table or JSON object).

The mapping mirrors the constructors, one nested table per config object, and every error
names its full key path (``workload.arrival.kind: unknown value 'poison'; ...``).
``describe()`` of any workload returns a mapping this function accepts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import MISSING, fields
from typing import Any, TypeVar

from tokenyard.errors import ConfigError
from tokenyard.workload.chunk import Workload
from tokenyard.workload.lora import LoraPopularity, LoraWorkload
from tokenyard.workload.synthetic import (
    ArrivalProcess,
    LengthDistribution,
    SharedPrefix,
    SyntheticWorkload,
)
from tokenyard.workload.traces import AzureTrace, MooncakeTrace, VidurTrace

__all__ = ["WORKLOAD_KINDS", "load_workload"]

WORKLOAD_KINDS = ("synthetic", "trace")
T = TypeVar("T")
_READERS: dict[str, type[VidurTrace | MooncakeTrace | AzureTrace]] = {
    "vidur": VidurTrace,
    "mooncake": MooncakeTrace,
    "azure": AzureTrace,
}
_SYNTHETIC_PARTS: dict[str, type[ArrivalProcess | LengthDistribution | SharedPrefix]] = {
    "arrival": ArrivalProcess,
    "prompt_tokens": LengthDistribution,
    "output_tokens": LengthDistribution,
    "shared_prefix": SharedPrefix,
}


def load_workload(
    spec: Mapping[str, object],
    *,
    base_dir: str | os.PathLike[str] | None = None,
    where: str = "workload",
) -> Workload:
    """Build a workload from its config.

    ``{"kind": "synthetic", "num_requests": ..., "seed": ..., "arrival": {...},
    "prompt_tokens": {...}, "output_tokens": {...}, "shared_prefix": {...}}`` builds a
    ``SyntheticWorkload`` (``seed`` and ``shared_prefix`` optional; the nested tables take
    the fields of ``ArrivalProcess``, ``LengthDistribution`` and ``SharedPrefix``).
    ``{"kind": "trace", "format": "vidur" | "mooncake" | "azure", "path": ..., ...}`` builds
    the reader of that format with the other keys as its options. Either may hold a
    ``"lora": {...}`` table (``LoraPopularity``'s fields): each request then runs with an
    adapter from that popularity model (``LoraWorkload``).

    Args:
        spec: the config mapping.
        base_dir: a relative trace ``path`` is taken from here (e.g. the config file's
            folder); by default from the working directory.
        where: the key path of ``spec`` in the whole config, for error messages.

    Raises:
        ConfigError: an unknown kind, format or key, a missing key, or an invalid value;
            the message and ``field`` name the full key path (``workload.arrival.qps``).
    """
    spec = _mapping(spec, where)
    if "lora" in spec:
        # Any workload takes adapters from a popularity model (workload/lora.py).
        inner = {k: v for k, v in spec.items() if k != "lora"}
        table = _mapping(spec["lora"], f"{where}.lora")
        _check_keys(table, f"{where}.lora", _field_names(LoraPopularity), {"num_adapters"}, None)
        popularity = _construct(LoraPopularity, f"{where}.lora", **table)
        return LoraWorkload(load_workload(inner, base_dir=base_dir, where=where), popularity)
    kind = _choice(spec, "kind", WORKLOAD_KINDS, where)
    if kind == "synthetic":
        return _synthetic(spec, where)
    trace_format = _choice(spec, "format", tuple(_READERS), where)
    reader = _READERS[trace_format]
    _check_keys(spec, where, {"kind", "format"} | _field_names(reader), {"path"}, trace_format)
    options: dict[str, Any] = {k: v for k, v in spec.items() if k not in ("kind", "format")}
    path = options.pop("path")
    if isinstance(path, (str, os.PathLike)) and base_dir is not None:
        path = os.path.join(base_dir, path)
    return _construct(reader, where, path, **options)


def _synthetic(spec: Mapping[str, object], where: str) -> SyntheticWorkload:
    names = _field_names(SyntheticWorkload) | {"kind"}
    _check_keys(spec, where, names, _required(SyntheticWorkload), None)
    options: dict[str, Any] = {}
    for key, value in spec.items():
        if key in _SYNTHETIC_PARTS and value is not None:
            part = _SYNTHETIC_PARTS[key]
            table = _mapping(value, f"{where}.{key}")
            _check_keys(table, f"{where}.{key}", _field_names(part), _required(part), None)
            options[key] = _construct(part, f"{where}.{key}", **table)
        elif key != "kind":
            options[key] = value
    return _construct(SyntheticWorkload, where, **options)


def _mapping(value: object, where: str) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{where}: must be a table (mapping), got {type(value).__name__}",
            field=where,
            value=repr(value),
        )
    for key in value:
        if not isinstance(key, str):
            raise ConfigError(
                f"{where}: keys must be strings, got {key!r}", field=where, value=repr(key)
            )
    return value


def _choice(spec: Mapping[str, object], key: str, options: tuple[str, ...], where: str) -> str:
    expected = ", ".join(repr(o) for o in sorted(options))
    if key not in spec:
        raise ConfigError(
            f"{where}.{key}: missing; expected one of {expected}", field=f"{where}.{key}"
        )
    value = spec[key]
    if not isinstance(value, str) or value not in options:
        raise ConfigError(
            f"{where}.{key}: unknown value {value!r}; expected one of {expected}",
            field=f"{where}.{key}",
            value=repr(value),
        )
    return value


def _check_keys(
    spec: Mapping[str, object],
    where: str,
    allowed: set[str],
    required: set[str],
    trace_format: str | None,
) -> None:
    for key in spec:
        if key not in allowed:
            context = "" if trace_format is None else f" for format={trace_format!r}"
            expected = ", ".join(repr(k) for k in sorted(allowed))
            raise ConfigError(
                f"{where}.{key}: unknown key{context}; expected one of {expected}",
                field=f"{where}.{key}",
                value=repr(spec[key]),
            )
    for key in sorted(required):
        if key not in spec:
            raise ConfigError(f"{where}.{key}: missing (required)", field=f"{where}.{key}")


def _field_names(cls: type) -> set[str]:
    return {f.name for f in fields(cls) if f.name != "_"}


def _required(cls: type) -> set[str]:
    return {
        f.name
        for f in fields(cls)
        if f.default is MISSING and f.default_factory is MISSING and f.name != "_"
    }


def _construct(cls: type[T], where: str, *args: object, **kwargs: object) -> T:
    """``cls(*args, **kwargs)``, with a field's ``ConfigError`` re-keyed by its config path:
    ``"ArrivalProcess.qps: ..."`` becomes ``"workload.arrival.qps: ..."``."""
    try:
        return cls(*args, **kwargs)
    except ConfigError as error:
        if error.field is None:
            raise
        prefix = f"{cls.__name__}.{error.field}: "
        reason = error.message.removeprefix(prefix)
        key = f"{where}.{error.field}"
        raise ConfigError(f"{key}: {reason}", field=key, value=error.value) from None
