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

from tokenyard._checks import check_key_int
from tokenyard.catalog.vision import VisionEncoder
from tokenyard.errors import ConfigError
from tokenyard.workload.chunk import MAX_REQUESTS, Workload
from tokenyard.workload.columns import TIME_UNITS, ColumnFilter, ColumnTrace, TraceColumns
from tokenyard.workload.images import ImageInputs
from tokenyard.workload.lora import LoraPopularity, LoraWorkload
from tokenyard.workload.session_traces import BailianTrace, SessionTrace
from tokenyard.workload.sessions import ClosedLoop, SessionWorkload, ThinkTime
from tokenyard.workload.synthetic import (
    ArrivalProcess,
    LengthDistribution,
    SharedPrefix,
    SyntheticWorkload,
)
from tokenyard.workload.traces import AzureTrace, MooncakeTrace, VidurTrace

__all__ = ["WORKLOAD_KINDS", "load_workload"]

WORKLOAD_KINDS = ("synthetic", "sessions", "trace")
T = TypeVar("T")
_READERS: dict[
    str, type[VidurTrace | MooncakeTrace | AzureTrace | ColumnTrace | SessionTrace | BailianTrace]
] = {
    "vidur": VidurTrace,
    "mooncake": MooncakeTrace,
    "azure": AzureTrace,
    "columns": ColumnTrace,
    "sessions": SessionTrace,
    "bailian": BailianTrace,
}
_FILTER_TESTS = ("equals", "in", "not_in")
_Part = type[ArrivalProcess | LengthDistribution | SharedPrefix | ThinkTime | ImageInputs]
_SYNTHETIC_PARTS: dict[str, _Part] = {
    "arrival": ArrivalProcess,
    "prompt_tokens": LengthDistribution,
    "output_tokens": LengthDistribution,
    "shared_prefix": SharedPrefix,
    "images": ImageInputs,
}
_SESSION_PARTS: dict[str, _Part] = {
    "arrival": ArrivalProcess,
    "turns": LengthDistribution,
    "first_prompt_tokens": LengthDistribution,
    "input_tokens": LengthDistribution,
    "output_tokens": LengthDistribution,
    "think_time": ThinkTime,
}


def check_workload_sizes(spec: Mapping[str, object], where: str = "workload") -> None:
    """The counts a workload config gives (requests, sessions, a trace's ``limit``,
    closed-loop users) within ``[1, MAX_REQUESTS]``, checked without building the workload
    (a trace file need not exist yet): the same bound ``load_workload`` applies, at config
    time.

    Raises:
        ConfigError: a count out of range; ``field`` is its key path.
    """
    spec = _mapping(spec, where)
    keys = ("num_requests", "num_sessions", "limit")
    counts = [(f"{where}.{key}", spec.get(key)) for key in keys]
    closed = spec.get("closed_loop")
    if isinstance(closed, Mapping):
        counts.append((f"{where}.closed_loop.concurrency", closed.get("concurrency")))
    for key, value in counts:
        if value is not None:
            check_key_int(key, value, low=1, high=MAX_REQUESTS)


def load_workload(
    spec: Mapping[str, object],
    *,
    base_dir: str | os.PathLike[str] | None = None,
    where: str = "workload",
    vision: VisionEncoder | None = None,
) -> Workload:
    """Build a workload from its config.

    ``{"kind": "synthetic", "num_requests": ..., "seed": ..., "arrival": {...},
    "prompt_tokens": {...}, "output_tokens": {...}, "shared_prefix": {...}}`` builds a
    ``SyntheticWorkload`` (``seed`` and ``shared_prefix`` optional; the nested tables take
    the fields of ``ArrivalProcess``, ``LengthDistribution`` and ``SharedPrefix``).
    ``{"kind": "trace", "format": "vidur" | "mooncake" | "azure", "path": ..., ...}`` builds
    the reader of that format with the other keys as its options. ``"format": "columns"``
    builds a ``ColumnTrace``: ``columns`` is a table of ``TraceColumns``' fields and
    ``filter`` a table (or a list of tables) with ``column`` and one of ``equals``, ``in``
    or ``not_in``; ``"sessions"`` and ``"bailian"`` read session traces. ``{"kind":
    "sessions", ...}`` builds a ``SessionWorkload`` (multi-turn conversations).

    Any of them may hold a ``"lora": {...}`` table (``LoraPopularity``'s fields): each
    request then runs with an adapter from that popularity model (``LoraWorkload``); and a
    ``"closed_loop": {...}`` table (``concurrency``, ``think_time``, ``seed``): a fixed
    number of users send the requests (``ClosedLoop``).

    A synthetic workload's ``"images": {...}`` table (``ImageInputs``' fields, ``count``
    a ``LengthDistribution`` table) adds vision tokens to its prompts; ``vision`` maps an
    image's pixels to tokens.

    Args:
        spec: the config mapping.
        vision: the model's vision tower (``ModelSpec.vision``), for ``images`` given in
            pixels.
        base_dir: a relative trace ``path`` is taken from here (e.g. the config file's
            folder); by default from the working directory.
        where: the key path of ``spec`` in the whole config, for error messages.

    Raises:
        ConfigError: an unknown kind, format or key, a missing key, or an invalid value;
            the message and ``field`` name the full key path (``workload.arrival.qps``).
    """
    spec = _mapping(spec, where)
    if "closed_loop" in spec:
        inner = {k: v for k, v in spec.items() if k != "closed_loop"}
        inner_workload = load_workload(inner, base_dir=base_dir, where=where, vision=vision)
        return _closed_loop(inner_workload, spec, where)
    if "lora" in spec:
        # Any workload takes adapters from a popularity model (workload/lora.py).
        columns = spec.get("columns")
        if isinstance(columns, Mapping) and columns.get("lora") is not None:
            raise ConfigError(
                f"{where}.lora: the trace names each request's adapter "
                f"({where}.columns.lora = {columns['lora']!r}); give one or the other",
                field=f"{where}.lora",
                value=repr(spec["lora"]),
            )
        inner = {k: v for k, v in spec.items() if k != "lora"}
        table = _mapping(spec["lora"], f"{where}.lora")
        _check_keys(table, f"{where}.lora", _field_names(LoraPopularity), {"num_adapters"}, None)
        popularity = _construct(LoraPopularity, f"{where}.lora", **table)
        inner_workload = load_workload(inner, base_dir=base_dir, where=where, vision=vision)
        return LoraWorkload(inner_workload, popularity)
    kind = _choice(spec, "kind", WORKLOAD_KINDS, where)
    if kind == "synthetic":
        return _with_parts(SyntheticWorkload, _SYNTHETIC_PARTS, spec, where, vision)
    if kind == "sessions":
        return _with_parts(SessionWorkload, _SESSION_PARTS, spec, where)
    trace_format = _choice(spec, "format", tuple(_READERS), where)
    reader = _READERS[trace_format]
    allowed = {"kind", "format"} | _field_names(reader)
    _check_keys(spec, where, allowed, _required(reader), trace_format)
    options: dict[str, Any] = {k: v for k, v in spec.items() if k not in ("kind", "format")}
    if reader is ColumnTrace:
        options = _column_options(options, where)
    path = options.pop("path")
    if isinstance(path, (str, os.PathLike)) and base_dir is not None:
        path = os.path.join(base_dir, path)
    return _construct(reader, where, path, **options)


def _with_parts(
    cls: type[T],
    parts: Mapping[str, _Part],
    spec: Mapping[str, object],
    where: str,
    vision: VisionEncoder | None = None,
) -> T:
    """``cls`` from ``spec``, its nested tables built as ``parts`` say."""
    names = _field_names(cls) | {"kind"}
    _check_keys(spec, where, names, _required(cls), None)
    options: dict[str, Any] = {}
    for key, value in spec.items():
        if key in parts and value is not None:
            part = parts[key]
            table = _mapping(value, f"{where}.{key}")
            names = _field_names(part) - {"vision"}
            _check_keys(table, f"{where}.{key}", names, _required(part), None)
            if part is ImageInputs:
                table = _image_table(table, f"{where}.{key}", vision)
            options[key] = _construct(part, f"{where}.{key}", **table)
        elif key != "kind":
            options[key] = value
    return _construct(cls, where, **options)


def _image_table(
    table: Mapping[str, object], where: str, vision: VisionEncoder | None
) -> dict[str, object]:
    """An ``images`` table with its ``count`` built and the model's tower set."""
    out: dict[str, object] = {**table, "vision": vision}
    if table.get("count") is not None:
        count = _mapping(table["count"], f"{where}.count")
        names, required = _field_names(LengthDistribution), _required(LengthDistribution)
        _check_keys(count, f"{where}.count", names, required, None)
        out["count"] = _construct(LengthDistribution, f"{where}.count", **count)
    return out


def _closed_loop(workload: Workload, spec: Mapping[str, object], where: str) -> ClosedLoop:
    """``workload.closed_loop = {concurrency, think_time, seed}`` around any workload."""
    key = f"{where}.closed_loop"
    table = _mapping(spec["closed_loop"], key)
    _check_keys(table, key, {"concurrency", "think_time", "seed"}, {"concurrency"}, None)
    think = None
    if table.get("think_time") is not None:
        think_table = _mapping(table["think_time"], f"{key}.think_time")
        think = _construct(ThinkTime, f"{key}.think_time", **think_table)
    options = {k: v for k, v in table.items() if k != "think_time"}
    return _construct(ClosedLoop, key, workload, think_time=think, **options)


def _column_options(options: dict[str, Any], where: str) -> dict[str, Any]:
    """``columns`` and ``filter`` of a ``format = "columns"`` trace, from tables to the
    reader's typed options."""
    key = f"{where}.columns"
    table = _mapping(options["columns"], key)
    _check_keys(
        table, key, _field_names(TraceColumns), _required(TraceColumns) - {"time_unit"}, None
    )
    if "time_unit" not in table:  # no default: say what to write
        units = ", ".join(repr(u) for u in TIME_UNITS)
        raise ConfigError(
            f"{key}.time_unit: missing (required, no default); one of {units}",
            field=f"{key}.time_unit",
        )
    options["columns"] = _construct(TraceColumns, key, **table)
    if "filter" in options:
        key = f"{where}.filter"
        rules = options["filter"]
        if isinstance(rules, Mapping):
            options["filter"] = (_column_filter(rules, key),)
        elif isinstance(rules, (list, tuple)):
            options["filter"] = tuple(_column_filter(r, f"{key}[{i}]") for i, r in enumerate(rules))
        else:
            raise ConfigError(
                f"{key}: must be a table or a list of tables, got {rules!r}",
                field=key,
                value=repr(rules),
            )
    return options


def _column_filter(value: object, where: str) -> ColumnFilter:
    """``{column, equals | in | not_in}`` as a ``ColumnFilter``."""
    table = _mapping(value, where)
    _check_keys(table, where, {"column", *_FILTER_TESTS}, {"column"}, None)
    given = [test for test in _FILTER_TESTS if test in table]
    if len(given) != 1:
        raise ConfigError(
            f"{where}: give exactly one of 'equals', 'in', 'not_in', got "
            f"{', '.join(map(repr, given)) or 'none'}",
            field=where,
            value=repr(dict(table)),
        )
    test = given[0]
    raw = table[test]
    values = [raw] if test == "equals" else raw
    if (
        not isinstance(values, (list, tuple))
        or not values
        or any(isinstance(v, bool) or not isinstance(v, (str, int)) for v in values)
    ):
        wanted = "a string or an int" if test == "equals" else "a non-empty list of strings or ints"
        raise ConfigError(
            f"{where}.{test}: must be {wanted}, got {raw!r}",
            field=f"{where}.{test}",
            value=repr(raw),
        )
    return _construct(
        ColumnFilter, where, table["column"], values=tuple(values), exclude=test == "not_in"
    )


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
