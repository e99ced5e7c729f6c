"""tokenyard: the scheduling core of LLM serving, in Rust, with a Python face."""

from tokenyard import errors, kv, sched
from tokenyard._core import __version__, build_profile
from tokenyard.errors import (
    CapacityError,
    ConfigError,
    ConnectorError,
    InputError,
    InternalError,
    PolicyError,
    TokenyardError,
    UnknownRequestError,
)
from tokenyard.kv import BlockPool, CountingAllocator, RadixCache
from tokenyard.sched import Scheduler, SchedulerConfig

__all__ = [
    "BlockPool",
    "CapacityError",
    "ConfigError",
    "ConnectorError",
    "CountingAllocator",
    "InputError",
    "InternalError",
    "PolicyError",
    "RadixCache",
    "Scheduler",
    "SchedulerConfig",
    "TokenyardError",
    "UnknownRequestError",
    "__version__",
    "build_profile",
    "errors",
    "kv",
    "sched",
]
