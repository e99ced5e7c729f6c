"""The simulator's view of ``tokenyard.catalog`` (kept for the code that imports it here).

``model_spec``/``device_spec`` look a name up as the ``replica.model``/``replica.device``
config key, so an unknown name is a ``ConfigError`` naming that key. ``MODELS`` and
``DEVICES`` are live read-only views of the registry (files loaded with
``tokenyard.catalog.load_catalog_file`` included; device aliases not listed).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from tokenyard.catalog import Catalog, DeviceSpec, ModelSpec, current_catalog, device, model
from tokenyard.catalog.loader import _DEVICES, _MODELS

if TYPE_CHECKING:
    from tokenyard.simulation.config import SimulationConfig

__all__ = [
    "DEVICES",
    "MODELS",
    "DeviceSpec",
    "ModelSpec",
    "catalog_for",
    "device_spec",
    "model_spec",
]

MODELS: Mapping[str, ModelSpec] = MappingProxyType(_MODELS)
DEVICES: Mapping[str, DeviceSpec] = MappingProxyType(_DEVICES)


def model_spec(name: str) -> ModelSpec:
    """The catalog model ``name``; raises ConfigError with field ``replica.model``."""
    return model(name, field="replica.model")


def device_spec(name: str) -> DeviceSpec:
    """The catalog device ``name`` (or alias); raises ConfigError with field
    ``replica.device``."""
    return device(name, field="replica.device")


def catalog_for(config: SimulationConfig) -> Catalog:
    """The catalog a simulation of ``config`` sees: the process's registry plus the files of
    ``config.catalog`` (relative to its ``base_dir``), as a value; nothing global changes."""
    catalog = current_catalog()
    for name in config.catalog:
        catalog = catalog.with_file(config.path(name))
    return catalog
