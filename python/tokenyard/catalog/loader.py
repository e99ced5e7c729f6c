"""Reading catalog files and the registry of known models and devices.

The registry starts with the built-in ``models.toml`` and ``devices.toml`` beside this
module; ``load_catalog_file`` adds (or overrides) entries from a user's TOML, YAML or JSON
file. Invariant: every spec in the registry passed validation, a device alias never names
another device, and a file that fails validation changes nothing.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

from tokenyard._checks import parse_document
from tokenyard.catalog import hf
from tokenyard.catalog.specs import (
    DEVICE_FIELDS,
    MODEL_FIELDS,
    DeviceSpec,
    ModelSpec,
    required_fields,
)
from tokenyard.errors import ConfigError

__all__ = [
    "Catalog",
    "CatalogEntries",
    "builtin_devices",
    "builtin_models",
    "current_catalog",
    "device",
    "devices",
    "load_catalog_file",
    "model",
    "models",
    "read_catalog_file",
    "reset_catalog",
]


class CatalogEntries(NamedTuple):
    """The models and devices one catalog file defines, by name."""

    models: dict[str, ModelSpec]
    devices: dict[str, DeviceSpec]


def _parse(source: str, text: str, suffix: str) -> Any:
    return parse_document(source, text, suffix, field="catalog", kind="catalog")


def _entry(
    source: str, section: str, name: Any, raw: Any, fields: dict[str, str]
) -> dict[str, Any]:
    """Checks one ``[section.name]`` table's keys; returns the constructor's keywords."""
    where = f"{section}.{name}"
    if not isinstance(name, str) or not name:
        raise ConfigError(
            f"{source}: {section}: entry names must be non-empty strings, got {name!r}",
            field=section,
            value=repr(name),
        )
    if not isinstance(raw, Mapping):
        raise ConfigError(
            f"{source}: {where}: must be a table of fields, got {raw!r}",
            field=where,
            value=repr(raw),
        )
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ConfigError(
            f"{source}: {where}.{unknown[0]}: unknown field; known fields are {', '.join(fields)}",
            field=f"{where}.{unknown[0]}",
            value=repr(raw[unknown[0]]),
        )
    spec = ModelSpec if section == "models" else DeviceSpec
    required = [f for f in required_fields(spec) if f != "head_dim"]
    missing = [f for f in required if f not in raw]
    if missing:
        raise ConfigError(
            f"{source}: {where}: missing required field(s) {', '.join(missing)}",
            field=f"{where}.{missing[0]}",
            value=None,
        )
    kwargs = dict(raw)
    if section == "models" and "head_dim" not in kwargs:
        heads, hidden = kwargs["num_heads"], kwargs["hidden_size"]
        if isinstance(heads, int) and isinstance(hidden, int) and heads > 0:
            kwargs["head_dim"] = hidden // heads
        else:
            kwargs["head_dim"] = 0  # the constructor reports num_heads or hidden_size
    if section == "devices" and isinstance(kwargs.get("aliases"), list):
        kwargs["aliases"] = tuple(kwargs["aliases"])
    return kwargs


def _entries(source: str, data: Any) -> CatalogEntries:
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{source}: the document must be a mapping with 'models' and/or 'devices' tables",
            field="catalog",
            value=source,
        )
    unknown = sorted(set(data) - {"models", "devices"})
    if unknown:
        raise ConfigError(
            f"{source}: {unknown[0]}: unknown table; a catalog file has 'models' and 'devices'",
            field=str(unknown[0]),
            value=repr(unknown[0]),
        )
    return CatalogEntries(
        models={n: ModelSpec(name=n, **kw) for n, kw in _table(source, data, "models")},
        devices={n: DeviceSpec(name=n, **kw) for n, kw in _table(source, data, "devices")},
    )


def _table(source: str, data: Mapping[str, Any], section: str) -> list[tuple[str, Any]]:
    """The ``section`` table's entries as (name, constructor keywords), each checked by
    building it once so that errors carry the file name."""
    table = data.get(section, {})
    if not isinstance(table, Mapping):
        raise ConfigError(
            f"{source}: {section}: must be a table of named entries, got {table!r}",
            field=section,
            value=repr(table),
        )
    spec: type[ModelSpec] | type[DeviceSpec] = ModelSpec if section == "models" else DeviceSpec
    entries = []
    for name, raw in table.items():
        kwargs = _entry(
            source, section, name, raw, MODEL_FIELDS if spec is ModelSpec else DEVICE_FIELDS
        )
        try:
            spec(name=name, **kwargs)
        except ConfigError as exc:
            raise ConfigError(
                f"{source}: {exc.message}", field=exc.field, value=exc.value
            ) from None
        entries.append((name, kwargs))
    return entries


def read_catalog_file(path: str | Path) -> CatalogEntries:
    """Reads and validates a catalog file without adding it to the registry.

    Raises:
        ConfigError: unreadable file, bad syntax, unknown or missing field, bad value; the
            message starts with the file name and ``field`` is e.g. ``models.x.num_heads``.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(
            f"catalog file {path}: {exc.strerror}", field="catalog", value=str(path)
        ) from None
    return _entries(str(path), _parse(str(path), text, path.suffix.lower()))


def _read_builtin(filename: str) -> CatalogEntries:
    text = resources.files("tokenyard.catalog").joinpath(filename).read_text()
    return _entries(f"tokenyard/catalog/{filename}", _parse(filename, text, ".toml"))


_BUILTIN_MODELS = _read_builtin("models.toml").models
_BUILTIN_DEVICES = _read_builtin("devices.toml").devices
# The registry: mutated in place, so read-only views of these dicts stay current.
_MODELS: dict[str, ModelSpec] = dict(_BUILTIN_MODELS)
_DEVICES: dict[str, DeviceSpec] = dict(_BUILTIN_DEVICES)
_ALIASES: dict[str, str] = {}


def _index_aliases(known: Mapping[str, DeviceSpec], source: str) -> dict[str, str]:
    aliases: dict[str, str] = {}
    for spec in known.values():
        for alias in spec.aliases:
            if alias in known or aliases.get(alias, spec.name) != spec.name:
                other = "a device" if alias in known else f"an alias of {aliases[alias]!r}"
                raise ConfigError(
                    f"{source}: devices.{spec.name}.aliases: {alias!r} is already the name of "
                    f"{other}",
                    field=f"devices.{spec.name}.aliases",
                    value=repr(alias),
                )
            aliases[alias] = spec.name
    return aliases


_ALIASES.update(_index_aliases(_DEVICES, "tokenyard/catalog/devices.toml"))


def builtin_models() -> dict[str, ModelSpec]:
    """The models shipped with tokenyard, whatever user files have been loaded."""
    return dict(_BUILTIN_MODELS)


def builtin_devices() -> dict[str, DeviceSpec]:
    """The devices shipped with tokenyard, whatever user files have been loaded."""
    return dict(_BUILTIN_DEVICES)


def models() -> dict[str, ModelSpec]:
    """Every known model by name: built-in, then from loaded files."""
    return dict(_MODELS)


def devices() -> dict[str, DeviceSpec]:
    """Every known device by name (aliases not repeated)."""
    return dict(_DEVICES)


@dataclasses.dataclass(frozen=True)
class Catalog:
    """A set of models and devices, as a value: ``simulate`` builds one from the built-ins,
    the files loaded in this process and the config's own ``catalog`` files, and looks every
    name up in it, so a simulation never changes the registry other code sees."""

    models: Mapping[str, ModelSpec]
    devices: Mapping[str, DeviceSpec]
    aliases: Mapping[str, str]

    def with_file(self, path: str | Path) -> Catalog:
        """This catalog plus a file's entries (a same-named entry is replaced)."""
        found = read_catalog_file(path)
        devices = {**self.devices, **found.devices}
        return Catalog(
            models={**self.models, **found.models},
            devices=devices,
            aliases=_index_aliases(devices, str(path)),
        )

    def model(self, name: str, *, field: str = "model") -> ModelSpec:
        """The model called ``name``: a catalog entry, else a Hugging Face ``config.json``
        that ``name`` is the path of, or the repo id of a bundled one
        (``hf.config_path``).

        Raises:
            ConfigError: unknown name, or a config that cannot be read or is refused
                (``hf.model_from_config``); ``field`` is the caller's (e.g.
                ``replica.model``) and an unknown name's message lists the known names.
        """
        spec = self.models.get(name) if isinstance(name, str) else None
        if spec is not None:
            return spec
        path = hf.config_path(name) if isinstance(name, str) else None
        if path is not None:
            return hf.model_from_config(path, name=name, field=field)
        raise ConfigError(self._unknown_model(name, field), field=field, value=repr(name))

    def _unknown_model(self, name: object, field: str) -> str:
        bundled = hf.bundled_model_names()
        message = (
            f"{field}: unknown model {name!r}; expected one of {', '.join(self.models)}, or "
            "the path of a Hugging Face config.json"
        )
        if bundled:
            message += ", or a repo id of catalog.bundled_model_names()"
        else:
            message += (
                " (`pip install tokenyard[measured]` adds the Hugging Face configs that "
                "aiconfigurator-core bundles, by repo id, e.g. meta-llama/Meta-Llama-3.1-8B)"
            )
        close = difflib.get_close_matches(str(name), [*self.models, *bundled], n=1)
        return message + (f"; did you mean {close[0]!r}?" if close else "")

    def device(self, name: str, *, field: str = "device") -> DeviceSpec:
        """The device called ``name`` or one of its aliases (``h100-80gb`` is
        ``h100-sxm``).

        Raises:
            ConfigError: unknown name; ``field`` is the caller's (e.g. ``replica.device``)
                and the message lists the known names and aliases.
        """
        if isinstance(name, str):
            spec = self.devices.get(name) or self.devices.get(self.aliases.get(name, ""))
            if spec is not None:
                return spec
        aliases = ", ".join(f"{a} = {d}" for a, d in self.aliases.items())
        raise ConfigError(
            f"{field}: unknown device {name!r}; expected one of {', '.join(self.devices)}"
            + (f" (aliases: {aliases})" if aliases else ""),
            field=field,
            value=repr(name),
        )


def current_catalog() -> Catalog:
    """The process's registry as a value: built-ins plus files loaded with
    ``load_catalog_file``."""
    return Catalog(models=dict(_MODELS), devices=dict(_DEVICES), aliases=dict(_ALIASES))


def model(name: str, *, field: str = "model") -> ModelSpec:
    """``current_catalog().model(name)``: see ``Catalog.model``."""
    return Catalog(_MODELS, _DEVICES, _ALIASES).model(name, field=field)


def device(name: str, *, field: str = "device") -> DeviceSpec:
    """``current_catalog().device(name)``: see ``Catalog.device``."""
    return Catalog(_MODELS, _DEVICES, _ALIASES).device(name, field=field)


def load_catalog_file(path: str | Path) -> CatalogEntries:
    """Adds the models and devices of a TOML, YAML or JSON catalog file (``[models.<name>]``
    and ``[devices.<name>]`` tables, the built-in files' schema) to the registry. An entry
    with the name of a known one replaces it. All or nothing: a file with one bad entry
    adds none.

    Returns:
        The entries the file defined.

    Raises:
        ConfigError: see ``read_catalog_file``; also a device alias that names another
            device.
    """
    found = read_catalog_file(path)
    merged = {**_DEVICES, **found.devices}
    aliases = _index_aliases(merged, str(path))
    _MODELS.update(found.models)
    _DEVICES.update(found.devices)
    _ALIASES.clear()
    _ALIASES.update(aliases)
    return found


def reset_catalog() -> None:
    """Forgets every entry loaded from user files: back to the built-in catalog."""
    _MODELS.clear()
    _MODELS.update(_BUILTIN_MODELS)
    _DEVICES.clear()
    _DEVICES.update(_BUILTIN_DEVICES)
    _ALIASES.clear()
    _ALIASES.update(_index_aliases(_DEVICES, "tokenyard/catalog/devices.toml"))
