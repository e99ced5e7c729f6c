"""``simulate(config)``: derive every size (memory planner), stream the workload through the
Rust event loop, and assemble the result."""

from __future__ import annotations

import dataclasses
import importlib
import time
from collections.abc import Callable
from typing import Any

from tokenyard import _core
from tokenyard.catalog import load_catalog_file
from tokenyard.errors import ConfigError
from tokenyard.sched import SchedulerConfig
from tokenyard.simulation.catalog import device_spec, model_spec
from tokenyard.simulation.config import SimulationConfig, config_document
from tokenyard.simulation.execution import build_predictor, choose_execution
from tokenyard.simulation.execution import describe as describe_execution
from tokenyard.simulation.planner import MemoryPlan, plan_memory
from tokenyard.simulation.results import (
    SimulationResult,
    request_columns,
    summarize,
    token_gap_table,
)
from tokenyard.workload import load_workload

__all__ = ["load_catalog_files", "load_object", "plan_for", "simulate"]

CHUNK_SIZE = 65536
Progress = Callable[[int], None]


def load_object(spec: str, where: str) -> Any:
    """Imports ``"package.module:attribute"``; a ConfigError names the key on failure."""
    module_name, _, attribute = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
        return getattr(module, attribute)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(
            f"{where}: cannot load {spec!r}: {exc}", field=where, value=repr(spec)
        ) from None


def simulate(config: SimulationConfig, *, progress: Progress | None = None) -> SimulationResult:
    """Runs one simulation.

    Args:
        config: what to simulate (``SimulationConfig()`` is the built-in default job).
        progress: called now and then with the number of requests completed so far.

    Raises:
        ConfigError: a bad or impossible config (e.g. the model does not fit the device).
        InputError / TraceError: a bad request in the workload (the file, line and field).
        CapacityError: requests the replicas could never schedule.
    """
    workload = load_workload(config.workload, base_dir=config.base_dir)
    plan = plan_for(config)
    core_config = _core_config(config, plan, workload.hash_block_size or 16)
    if workload.hash_block_size is None:
        # No prefix identity: every prompt is unique, so a prefix cache would only cost time.
        core_config["replica"]["vllm_v1"] = dataclasses.replace(
            core_config["replica"]["vllm_v1"], enable_prefix_caching=False
        )
    choice = choose_execution(config)
    predictor = build_predictor(config, choice)
    exec_model = None
    if predictor is not None:
        core_config["ops"] = predictor.fused(config.replica.num_pipeline_stages).to_core()
    elif ":" in config.execution.model:
        exec_model = load_object(config.execution.model, "execution.model")
    route_plugin, replica_plugins = _plugins(config, core_config)
    start = time.perf_counter()
    raw = _core.simulate(
        core_config,
        workload.chunks(CHUNK_SIZE),
        exec_model=exec_model,
        progress=progress,
        route_plugin=route_plugin,
        replica_plugins=replica_plugins,
    )
    wall_s = time.perf_counter() - start
    columns = request_columns(raw.pop("requests"))
    description = {
        "replica_policy": config.replica.scheduler.policy,
        "global_policy": config.cluster.global_scheduler.policy,
        "num_replicas": config.cluster.num_replicas,
        "tensor_parallel_size": config.replica.tensor_parallel_size,
        "num_pipeline_stages": config.replica.num_pipeline_stages,
        "model": config.replica.model,
        "device": config.replica.device,
        "num_blocks": core_config["replica"]["num_blocks"],
        "execution": describe_execution(predictor, config, choice),
        "workload": workload.describe(),
        "seed": config.seed,
    }
    summary = summarize(
        columns,
        raw,
        num_stages=config.replica.num_pipeline_stages,
        slo_ttft_s=config.metrics.slo_ttft_s,
        slo_tpot_s=config.metrics.slo_tpot_s,
        wall_s=wall_s,
        description=description,
    )
    return SimulationResult(
        summary,
        columns,
        raw["samples"],
        raw.get("stages"),
        token_gaps=token_gap_table(raw),
        config=config_document(config),
    )


def _plugins(config: SimulationConfig, core: dict[str, Any]) -> tuple[Any, list[Any] | None]:
    """Instantiates ``module:Class`` policies (see docs/plugins.md); the core then runs a
    built-in policy's name in their place, never consulted."""
    route_plugin = None
    policy = config.cluster.global_scheduler.policy
    if ":" in policy:
        cls = load_object(policy, "cluster.global_scheduler.policy")
        route_plugin = cls(num_replicas=config.cluster.num_replicas, seed=config.seed)
        core["global_policy"] = "round_robin"
    replica_plugins = None
    policy = config.replica.scheduler.policy
    if ":" in policy:
        cls = load_object(policy, "replica.scheduler.policy")
        replica_plugins = [
            cls(
                replica_id=i,
                num_blocks=core["replica"]["num_blocks"],
                block_size=config.replica.scheduler.block_size,
            )
            for i in range(config.cluster.num_replicas)
        ]
        core["replica"]["policy"] = "vllm"
    return route_plugin, replica_plugins


def load_catalog_files(config: SimulationConfig) -> None:
    """Adds the models and GPUs of ``config.catalog``'s files to the catalog."""
    for name in config.catalog:
        load_catalog_file(config.path(name))


def plan_for(config: SimulationConfig) -> MemoryPlan:
    """The memory plan ``simulate`` uses for ``config`` (raises ConfigError if it does not fit)."""
    load_catalog_files(config)
    replica = config.replica
    return plan_memory(
        model_spec(config.model_name()),
        device_spec(replica.device),
        tensor_parallel_size=replica.tensor_parallel_size,
        num_pipeline_stages=replica.num_pipeline_stages,
        memory_margin_fraction=replica.memory_margin_fraction,
        max_request_tokens=replica.scheduler.max_request_tokens,
        block_size=replica.scheduler.block_size,
        weight_dtype=replica.dtype,
        kv_cache_dtype=replica.kv_cache_dtype,
    )


def _core_config(
    config: SimulationConfig, plan: MemoryPlan, hash_block_size: int
) -> dict[str, Any]:
    s = config.replica.scheduler
    num_stages = config.replica.num_pipeline_stages
    num_blocks = s.num_blocks or plan.num_blocks
    max_batch_size = min(plan.max_batch_size, s.batch_size_cap)
    replica: dict[str, Any] = {
        "policy": s.policy,
        "num_blocks": num_blocks,
        "vidur": {
            "num_blocks": num_blocks,
            "block_size": s.block_size,
            "watermark_blocks": int(s.watermark_blocks_fraction * num_blocks),
            "batch_size_cap": s.batch_size_cap,
            "max_batch_size": max_batch_size,
            "num_stages": num_stages,
            "restart": s.restart,
            "max_blocks_per_sequence": s.max_request_tokens // s.block_size,
            "max_tokens_in_batch": s.max_tokens_in_batch,
            "chunk_size": s.chunk_size,
            "max_waiting_iters": s.max_waiting_iters,
        },
        "vllm_v1": SchedulerConfig(
            max_num_seqs=s.max_num_seqs,
            max_num_batched_tokens=s.max_num_batched_tokens,
            long_prefill_token_threshold=s.long_prefill_token_threshold,
            enable_chunked_prefill=s.enable_chunked_prefill,
            policy=s.scheduling_policy,  # type: ignore[arg-type]  # checked by the config
            enable_prefix_caching=s.enable_prefix_caching,
            prefix_cache=s.prefix_cache,  # type: ignore[arg-type]
            block_size=s.block_size,
            num_blocks=num_blocks,
            max_model_len=min(s.max_request_tokens, num_blocks * s.block_size),
        ),
        "sglang": {
            "num_pages": num_blocks,
            "page_size": s.block_size,
            "max_running_requests": s.max_num_seqs or 256,
            "max_extend_tokens": s.max_num_batched_tokens,
            "graph_batch_sizes": list(s.graph_batch_sizes),
        },
    }
    g = config.cluster.global_scheduler
    return {
        "num_replicas": config.cluster.num_replicas,
        "num_stages": num_stages,
        "global_policy": g.policy,
        "balance": g.balance,
        "replica": replica,
        "linear": config.execution.linear_coefficients(),
        "seed": config.seed,
        "hash_block_size": hash_block_size,
        "sample_interval_s": config.metrics.sample_interval_s,
        "record_stages": config.metrics.record_stages,
    }
