"""``tokenyard profile``: time one decoder layer's operations on this machine.

:func:`profile_model` times each operation over a :class:`ProfileGrid` of shapes and returns
rows of tokenyard profile format v1; :func:`write_profile` writes them as CSV, which
:func:`tokenyard.predictor.profiles.read_profiles` reads back. Needs torch (and triton for
``backend="triton"``). See ``docs/profiling.md``.
"""

from __future__ import annotations

from tokenyard.profiler.run import (
    GRIDS,
    ModelShape,
    ProfileGrid,
    ProfileRow,
    comms_available,
    profile_model,
    write_profile,
)

__all__ = [
    "GRIDS",
    "ModelShape",
    "ProfileGrid",
    "ProfileRow",
    "comms_available",
    "profile_model",
    "write_profile",
]
