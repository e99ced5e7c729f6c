"""``tokenyard profile``: time one decoder layer's operations on this machine.

:func:`profile_model` times each operation over a :class:`ProfileGrid` of shapes and returns
rows of tokenyard profile format v1; :func:`write_profile` writes them as CSV, which
:func:`tokenyard.predictor.profiles.read_profiles` reads back. Needs torch (and triton for
``backend="triton"``). See ``docs/profiling.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenyard._lazy import lazy_module

if TYPE_CHECKING:
    from tokenyard.profiler.run import (
        GRIDS,
        ModelShape,
        ProfileGrid,
        ProfileRow,
        comms_available,
        profile_model,
        write_profile,
    )

# Imported at first use: the command line imports this package to add its
# subcommand, and every other command would pay for its modules at start-up.
_EXPORTS = {
    "GRIDS": "tokenyard.profiler.run",
    "ModelShape": "tokenyard.profiler.run",
    "ProfileGrid": "tokenyard.profiler.run",
    "ProfileRow": "tokenyard.profiler.run",
    "comms_available": "tokenyard.profiler.run",
    "profile_model": "tokenyard.profiler.run",
    "write_profile": "tokenyard.profiler.run",
}


__getattr__, __dir__ = lazy_module(globals(), _EXPORTS)


__all__ = [
    "GRIDS",
    "ModelShape",
    "ProfileGrid",
    "ProfileRow",
    "comms_available",
    "profile_model",
    "write_profile",
]
