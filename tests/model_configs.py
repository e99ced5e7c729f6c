"""Hugging Face ``config.json`` files written for a test and read as catalog models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenyard import catalog


def write_config(tmp_path: Path, config: dict[str, Any], **changes: Any) -> Path:
    """``config`` with ``changes`` over it, as ``tmp_path/config.json``."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, **changes}))
    return path


def load_config(tmp_path: Path, config: dict[str, Any], **changes: Any) -> catalog.ModelSpec:
    """The model of ``write_config(tmp_path, config, **changes)``, read as ``replica.model``."""
    return catalog.model(str(write_config(tmp_path, config, **changes)), field="replica.model")
