"""The trace readers' error: a bad row or file, named by path, line and field."""

from __future__ import annotations

from tokenyard.errors import InputError

__all__ = ["TraceError"]


class TraceError(InputError):
    """A trace file is malformed: a missing column, a bad value, timestamps going backwards,
    or no requests at all.

    The message reads ``"{path}:{line}: {field}: {problem}"`` (the line and field are left
    out when they do not apply); ``path``, ``line``, ``field`` and ``value`` carry the same
    information for programs. Lines count from 1, the CSV header being line 1.
    """

    def __init__(
        self,
        problem: str,
        *,
        path: str,
        line: int | None = None,
        field: str | None = None,
        value: str | None = None,
    ):
        where = path if line is None else f"{path}:{line}"
        message = f"{where}: {problem}" if field is None else f"{where}: {field}: {problem}"
        super().__init__(message, field=field, value=value)
        self.path = path
        self.line = line
