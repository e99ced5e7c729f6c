"""Exceptions raised by tokenyard.

Every error names what was wrong and the value received; ``field`` and ``value`` carry
the same information for programs. A call that raises leaves its object unchanged.

- ``ConfigError``: a constructor or configuration value is invalid (also a ``ValueError``).
- ``InputError``: an argument is invalid for the object's current state (a ``ValueError``).
- ``UnknownRequestError``: a request id the object does not hold (an ``InputError`` and a
  ``KeyError``).
- ``CapacityError``: not enough free memory for an explicit allocation.
- ``PolicyError``: a policy plugin returned an invalid answer.
- ``ConnectorError``: a KV connector raised or returned an invalid answer (``field`` names
  its method).
- ``OutputError``: a result could not be written (the path and the OS's reason; also an
  ``OSError``).
- ``InternalError``: an internal invariant broke; this is a tokenyard bug, please report it.

Warnings (``warnings.warn``) share one base too, ``TokenyardWarning``, so a program can
filter them as a group:

- ``MeasuredUnavailableWarning``: the default execution model cannot use the measured GPU
  tables on this Python (the ``tokenyard[measured]`` extra does not install there) and prices
  batches with the calibrated roofline instead.
"""

from __future__ import annotations

__all__ = [
    "CapacityError",
    "ConfigError",
    "ConnectorError",
    "InputError",
    "InternalError",
    "MeasuredUnavailableWarning",
    "OutputError",
    "PolicyError",
    "TokenyardError",
    "TokenyardWarning",
    "UnknownRequestError",
]


class TokenyardError(Exception):
    """Base class of every error tokenyard raises on purpose."""

    def __init__(self, message: str, *, field: str | None = None, value: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field
        self.value = value

    def __str__(self) -> str:
        return self.message


class ConfigError(TokenyardError, ValueError):
    """A configuration or constructor value is invalid."""


class InputError(TokenyardError, ValueError):
    """An argument is invalid for the object's current state."""


class UnknownRequestError(InputError, KeyError):
    """The request id is not held by the object (never added, or already freed)."""


class CapacityError(TokenyardError, RuntimeError):
    """Not enough free memory for the allocation asked for."""


class PolicyError(TokenyardError, RuntimeError):
    """A policy plugin returned an invalid answer (e.g. not a permutation of the ids)."""


class ConnectorError(TokenyardError, RuntimeError):
    """A KV connector raised (the exception is the ``__cause__``) or returned an invalid
    answer; ``field`` is the connector's method, ``value`` what it returned or raised.

    Unlike the other errors, the call that raises it has gone through: ``schedule()`` keeps
    the step formed up to the failing request and returns it on its next call;
    ``update_from_output()`` and ``abort()`` finish the requests they were given (freeing
    the blocks of one whose ``request_finished`` raised)."""


class OutputError(TokenyardError, OSError):
    """A result file or folder could not be written; ``field`` is the path."""

    @classmethod
    def of(cls, exc: OSError, path: object) -> OutputError:
        """The error for ``exc`` raised while writing under ``path``."""
        where = exc.filename if exc.filename is not None else path
        reason = exc.strerror or str(exc)
        return cls(f"cannot write {where}: {reason}", field=str(where), value=str(path))


class InternalError(TokenyardError, RuntimeError):
    """An internal invariant broke: a bug in tokenyard."""


class TokenyardWarning(UserWarning):
    """Base class of every warning tokenyard issues."""


class MeasuredUnavailableWarning(TokenyardWarning):
    """``execution.model = "auto"`` cannot use the measured tables on the running Python
    (their package, ``aiconfigurator-core``, does not support it) and falls back to the
    calibrated roofline; the message says what to do."""
