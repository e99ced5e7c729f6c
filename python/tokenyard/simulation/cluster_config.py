"""The ``cluster`` and ``replica`` sections of a simulation config: the replicas, their
router, and each replica's model, device, layout (TP, PP, EP, DP), dtypes and scheduler
(``ReplicaConfig``, defined in ``replica_config.py``, below the decode pool's section).
``SimulationConfig`` (``config.py``) holds them with the execution model, workload and
metrics; each section checks its own keys.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from tokenyard._checks import (
    check_key_int,
    check_key_number,
    fail,
)
from tokenyard.simulation.disagg_config import DecodePoolConfig, KvTransferConfig
from tokenyard.simulation.replica_config import ReplicaConfig
from tokenyard.simulation.scheduler_config import (
    GLOBAL_POLICIES,
    MAX_REPLICAS,
    check_policy,
)

__all__ = ["DEFAULT_BALANCE", "ClusterConfig", "GlobalSchedulerConfig", "ReplicaConfig"]


#: ``prefix_affinity``'s ``balance`` when unset: one cached token against one queued one.
DEFAULT_BALANCE = 1.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class GlobalSchedulerConfig:
    """``policy``: one of the built-in routers or ``"module:Class"`` (a plugin, built with
    ``options`` as keyword arguments)."""

    policy: str = "round_robin"
    #: prefix_affinity: queued prefill tokens one cached token is worth (unset:
    #: ``DEFAULT_BALANCE``). Refused with another router, which would ignore it.
    balance: float | None = None
    #: A plugin's own options (``module:Class`` policies only).
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def check(self, where: str) -> None:
        check_policy(f"{where}.policy", self.policy, GLOBAL_POLICIES)
        if self.balance is not None:
            check_key_number(f"{where}.balance", self.balance, low=0, high=1e9)
            if self.policy != "prefix_affinity":
                raise fail(
                    f"{where}.balance",
                    f"weighs cached tokens for the prefix_affinity router only; the "
                    f"{self.policy!r} router would ignore it",
                    self.balance,
                )
        if self.options and ":" not in self.policy:
            raise fail(
                f"{where}.options",
                f"applies to plugin policies ('module:Class'), not {self.policy!r}",
                dict(self.options),
            )

    def effective_balance(self) -> float:
        """``balance``, or ``DEFAULT_BALANCE`` when unset."""
        return DEFAULT_BALANCE if self.balance is None else self.balance


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    """``num_replicas`` replicas behind ``global_scheduler``; with ``decode`` set they are
    the prefill pool of a disaggregated cluster (docs/disaggregation.md)."""

    num_replicas: int = 4
    global_scheduler: GlobalSchedulerConfig = dataclasses.field(
        default_factory=GlobalSchedulerConfig
    )
    decode: DecodePoolConfig | None = None
    kv_transfer: KvTransferConfig | None = None

    def check(self, where: str) -> None:
        check_key_int(f"{where}.num_replicas", self.num_replicas, low=1, high=MAX_REPLICAS)
        self.global_scheduler.check(f"{where}.global_scheduler")
        if self.decode is not None:
            self.decode.check(f"{where}.decode")
        if self.kv_transfer is not None:
            if self.decode is None:
                raise fail(
                    f"{where}.kv_transfer",
                    "applies to disaggregated clusters (a [cluster.decode] pool); without "
                    "one it would change nothing",
                    "set",
                )
            self.kv_transfer.check(f"{where}.kv_transfer")
