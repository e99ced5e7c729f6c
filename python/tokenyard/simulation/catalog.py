"""The simulator's view of ``tokenyard.catalog`` (kept for the code that imports it here).

``model_spec``/``device_spec`` look a name up as the ``replica.model``/``replica.device``
config key, so an unknown name is a ``ConfigError`` naming that key. ``MODELS`` and
``DEVICES`` are live read-only views of the registry (files loaded with
``tokenyard.catalog.load_catalog_file`` included; device aliases not listed).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from tokenyard.catalog import DeviceSpec, ModelSpec, device, model
from tokenyard.catalog.loader import _DEVICES, _MODELS

__all__ = ["DEVICES", "MODELS", "DeviceSpec", "ModelSpec", "device_spec", "model_spec"]

MODELS: Mapping[str, ModelSpec] = MappingProxyType(_MODELS)
DEVICES: Mapping[str, DeviceSpec] = MappingProxyType(_DEVICES)


def model_spec(name: str) -> ModelSpec:
    """The catalog model ``name``; raises ConfigError with field ``replica.model``."""
    return model(name, field="replica.model")


def device_spec(name: str) -> DeviceSpec:
    """The catalog device ``name`` (or alias); raises ConfigError with field
    ``replica.device``."""
    return device(name, field="replica.device")
