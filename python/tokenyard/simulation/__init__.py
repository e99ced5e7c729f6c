"""The cluster simulator: replay a trace or a synthetic workload through replicas under a
global router, replica batch schedulers and pipeline stages, on simulated time.

    from tokenyard.simulation import SimulationConfig, simulate

    result = simulate(SimulationConfig())
    print(result.summary["latency_s"]["ttft"])

See ``docs/simulate.md``.
"""

from tokenyard.simulation.config import (
    ClusterConfig,
    ExecutionConfig,
    GlobalSchedulerConfig,
    MetricsConfig,
    ReplicaConfig,
    ReplicaSchedulerConfig,
    SimulationConfig,
    apply_overrides,
    config_from_mapping,
    load_config,
)
from tokenyard.simulation.planner import MemoryPlan, plan_memory
from tokenyard.simulation.results import SimulationResult
from tokenyard.simulation.run import simulate

__all__ = [
    "ClusterConfig",
    "ExecutionConfig",
    "GlobalSchedulerConfig",
    "MemoryPlan",
    "MetricsConfig",
    "ReplicaConfig",
    "ReplicaSchedulerConfig",
    "SimulationConfig",
    "SimulationResult",
    "apply_overrides",
    "config_from_mapping",
    "load_config",
    "plan_memory",
    "simulate",
]
