"""The docs' example configs (``docs/examples/`` in the repository), shipped in the wheel so
an installed tokenyard runs them too::

    python -m tokenyard.examples          # prints this folder
    tokenyard search capacity "$(python -m tokenyard.examples)/search_capacity.toml"

In the repository each ``.toml`` here is a relative symlink into ``docs/examples/``, one per
config, as ``tokenyard/kernels/`` links into ``kernels/``: maturin copies linked files into the
wheel (tests/test_wheel.py keeps the links and the configs in step).
"""

from __future__ import annotations

from pathlib import Path

from tokenyard.errors import ConfigError

__all__ = ["FOLDER", "names", "path"]

#: Where the example configs are (inside the installed package).
FOLDER = Path(__file__).parent


def names() -> list[str]:
    """The example configs' file names, sorted."""
    return sorted(p.name for p in FOLDER.glob("*.toml"))


def path(name: str) -> Path:
    """The path of the example config ``name`` (``routing.toml``).

    Raises:
        ConfigError: no example has that name (the message lists them).
    """
    if name not in names():
        raise ConfigError(
            f"no example config {name!r}; shipped: {', '.join(names())}",
            field="name",
            value=repr(name),
        )
    return FOLDER / name
