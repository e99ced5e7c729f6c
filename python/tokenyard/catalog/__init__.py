"""The catalog of models and accelerators: their shapes, memory, FLOP/s, bandwidths and
illustrative prices, for the memory planner and the execution-time predictor.

    from tokenyard import catalog

    catalog.model("llama-3.1-70b").num_parameters()   # 70_553_706_496
    catalog.device("h100-sxm").memory_bandwidth_gbps  # 3350.0
    catalog.load_catalog_file("my_gpus.toml")         # add or override entries
    catalog.model("path/to/config.json")              # a Hugging Face config (``hf``)

The built-in entries live in ``models.toml`` and ``devices.toml`` beside this module, each
with the URL it was copied from. See ``docs/catalog.md``.
"""

from tokenyard.catalog.hf import bundled_model_names, model_from_config
from tokenyard.catalog.loader import (
    Catalog,
    CatalogEntries,
    builtin_devices,
    builtin_models,
    current_catalog,
    device,
    devices,
    load_catalog_file,
    model,
    models,
    read_catalog_file,
    reset_catalog,
)
from tokenyard.catalog.specs import DeviceSpec, ModelSpec

__all__ = [
    "Catalog",
    "CatalogEntries",
    "DeviceSpec",
    "ModelSpec",
    "builtin_devices",
    "builtin_models",
    "bundled_model_names",
    "current_catalog",
    "device",
    "devices",
    "load_catalog_file",
    "model",
    "model_from_config",
    "models",
    "read_catalog_file",
    "reset_catalog",
]
