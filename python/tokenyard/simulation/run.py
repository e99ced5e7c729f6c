"""``simulate(config)``: derive every size (memory planner), stream the workload through the
Rust event loop, and assemble the result."""

from __future__ import annotations

import dataclasses
import importlib
import time
from collections.abc import Callable
from typing import Any

from tokenyard import _core
from tokenyard.errors import ConfigError, OutputError
from tokenyard.simulation import disagg_config, hybrid_kv_pages
from tokenyard.simulation.catalog import catalog_for
from tokenyard.simulation.config import SimulationConfig, config_document
from tokenyard.simulation.execution import (
    build_mtp_predictor,
    build_predictor,
    choose_execution,
    lora_core,
    with_lora,
)
from tokenyard.simulation.execution import describe as describe_execution
from tokenyard.simulation.hybrid_kv import check_pool_blocks
from tokenyard.simulation.kv_offload_config import KvOffloadConfig
from tokenyard.simulation.planner import MemoryPlan, dtype_bytes
from tokenyard.simulation.replica_plan import (
    layout_text,
    num_schedulers,
    plan_for,
    planning_notes,
    replica_host_blocks,
    replica_spec,
    request_limit,
)
from tokenyard.simulation.results import (
    SimulationResult,
    request_columns,
    summarize,
    token_gap_table,
)
from tokenyard.simulation.speculative import SpeculativeConfig
from tokenyard.simulation.vision import vision_for, with_images
from tokenyard.workload import ClosedLoop, load_workload

__all__ = ["load_object", "plan_for", "replica_spec", "simulate"]

#: Requests per chunk handed to the core: the synthetic generator's own block, so nothing
#: is concatenated, and a chunk's arrays (tens of MB at 65,536) never leave freed holes in
#: the heap that stay resident for the whole run (benches/RESULTS.md, 2026-11-27: peak RSS
#: of 2M requests 690 -> 530 MB, same output and speed).
CHUNK_SIZE = 4096
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


def simulate(
    config: SimulationConfig,
    *,
    progress: Progress | None = None,
    coalesce_decode_steps: bool = True,
) -> SimulationResult:
    """Runs one simulation.

    Args:
        config: what to simulate (``SimulationConfig()`` is the built-in default job).
        progress: called now and then with the number of requests completed so far.
        coalesce_decode_steps: let ``vllm_v1`` replicas advance runs of pure-decode steps
            at once (docs/simulate.md, "Coalesced decode steps"). The results are the same
            bit for bit either way; ``False`` steps one by one, which only checks that.

    Raises:
        ConfigError: a bad or impossible config (e.g. the model does not fit the device).
        InputError / TraceError: a bad request in the workload (the file, line and field).
        CapacityError: requests the replicas could never schedule.
    """
    vision = vision_for(config)
    workload = load_workload(config.seeded_workload(), base_dir=config.base_dir, vision=vision)
    # No prefix identity: every prompt is unique, so a prefix cache would only cost time
    # (replica_spec keeps it on for Mamba groups, whose align mode vLLM runs regardless).
    caching = workload.hash_block_size is not None
    plan = plan_for(config)
    num_blocks = config.replica.scheduler.num_blocks or plan.num_blocks
    decode_tier = config.cluster.decode.kv_offload if config.cluster.decode else None
    for key, tier_config in (
        ("replica.kv_offload", config.replica.kv_offload),
        ("cluster.decode.kv_offload", decode_tier),
    ):
        if tier_config is not None and not caching:
            raise ConfigError(
                f"{key}: the workload gives its requests no prefix identity (hash ids), so "
                "no KV is ever reused and a host tier would change nothing",
                field=key,
                value="set",
            )
    replica = replica_spec(config, plan, prefix_caching=caching)
    concurrency = workload.concurrency if isinstance(workload, ClosedLoop) else None
    decode = _decode_pool(config, plan, prefix_caching=caching)
    core_config = _core_config(
        config,
        replica,
        workload.hash_block_size or 16,
        concurrency,
        decode=decode.core if decode else None,
        kv_offload=_kv_offload(config, plan),
        coalesce_decode_steps=coalesce_decode_steps,
    )
    choice = choose_execution(config)
    predictor = build_predictor(config, choice)
    exec_model: Any = None
    vision_record: dict[str, Any] | None = None
    if vision is not None:
        predictor, vision_record, vision_note = with_images(
            config, predictor, workload, vision, choice
        )
    if predictor is not None:
        predictor = with_lora(config, predictor)
        exec_model = _core.CompiledOps(
            predictor.fused(config.replica.num_pipeline_stages).to_core()
        )
    elif ":" in config.execution.model:
        exec_model = load_object(config.execution.model, "execution.model")
        if not callable(exec_model):
            raise ConfigError(
                f"execution.model: {config.execution.model!r} is a "
                f"{type(exec_model).__name__}, not a callable returning seconds",
                field="execution.model",
                value=repr(config.execution.model),
            )
    route_plugin, replica_plugins = _plugins(config, num_blocks)
    policy_plugins = _policy_plugins(config)
    draft_pricing = _draft_pricing(config)
    start = time.perf_counter()
    raw = _core.simulate(
        core_config,
        workload.chunks(CHUNK_SIZE),
        exec_model=exec_model,
        progress=progress,
        route_plugin=route_plugin,
        replica_plugins=replica_plugins,
        policy_plugins=policy_plugins,
        decode_exec_model=decode.exec_model if decode else None,
        **draft_pricing,
    )
    wall_s = time.perf_counter() - start
    columns = request_columns(raw.pop("requests"))
    description: dict[str, Any] = {
        "replica_policy": config.replica.scheduler.policy,
        "global_policy": config.cluster.global_scheduler.policy,
        "num_replicas": config.cluster.num_replicas,
        "tensor_parallel_size": config.replica.tensor_parallel_size,
        "num_pipeline_stages": config.replica.num_pipeline_stages,
        "expert_parallel_size": config.replica.expert_parallel_size,
        "data_parallel_size": config.replica.data_parallel_size,
        "layout": layout_text(config),
        "model": config.replica.model,
        "device": config.replica.device,
        "num_blocks": num_blocks,
        "max_request_tokens": request_limit(config)[0],
        "execution": describe_execution(predictor, config, choice),
        "workload": workload.describe(),
        "seed": config.seed,
    }
    notes = planning_notes(config, plan)
    if vision_record is not None:
        description["vision"] = vision_record
        notes = [*notes, vision_note]
    if notes:
        description["notes"] = notes
    if config.replica.lora is not None:
        description["lora"] = dataclasses.asdict(config.replica.lora)
    if config.replica.speculative.enabled:
        description["speculative"] = dataclasses.asdict(config.replica.speculative)
    offload = config.replica.kv_offload
    if offload is not None:
        # The weight routing used (none unless prefix_affinity reads the tier).
        routed = config.cluster.global_scheduler.policy == "prefix_affinity"
        weight = offload.effective_host_hit_weight() if routed else None
        tier = _tier_description(config, offload, plan)
        description["kv_offload"] = {**tier, "host_hit_weight": weight}
    if decode is not None:
        description["decode"] = decode.description
    summary = summarize(
        columns,
        raw,
        num_stages=config.replica.num_pipeline_stages,
        slo_ttft_s=config.metrics.slo_ttft_s,
        slo_tpot_s=config.metrics.slo_tpot_s,
        wall_s=wall_s,
        description=description,
    )
    stages = raw.get("stages")
    result = SimulationResult(
        summary,
        columns,
        raw["samples"],
        stages if config.metrics.record_stages else None,
        token_gaps=token_gap_table(raw),
        config=config_document(config),
    )
    metrics = config.metrics
    if metrics.trace_events is not None:
        from tokenyard.simulation.trace_events import write_trace_events

        try:
            write_trace_events(
                result,
                config.path(metrics.trace_events),
                window_s=metrics.trace_window_s,
                requests=metrics.trace_requests,
                max_events=metrics.trace_max_events,
                stages=stages,
            )
        except OSError as exc:
            raise OutputError.of(exc, metrics.trace_events) from None
    return result


@dataclasses.dataclass(frozen=True)
class DecodePool:
    """The decode pool as the core takes it, its execution model and its description."""

    core: dict[str, Any]
    exec_model: Any
    description: dict[str, Any]


def decode_config(config: SimulationConfig) -> SimulationConfig:
    """``config`` as the decode pool sees it: its replicas, device, layout (EP and
    attention DP included), scheduler and host tier (each unset one the replica's); same
    model and dtypes."""
    pool = config.cluster.decode
    if pool is None:
        raise ValueError("not a disaggregated config")
    return dataclasses.replace(
        config,
        cluster=dataclasses.replace(config.cluster, num_replicas=pool.num_replicas),
        replica=pool.resolve(config.replica),
    )


def _decode_pool(
    config: SimulationConfig, prefill_plan: MemoryPlan, *, prefix_caching: bool
) -> DecodePool | None:
    """The decode pool of a disaggregated config: memory plan, scheduler, execution model
    and the KV link, each checked (a ConfigError names the key). ``prefill_plan``: the
    prefill pool's (``plan_for(config)``)."""
    pool = config.cluster.decode
    if pool is None:
        return None
    decode = decode_config(config)
    catalog = catalog_for(config)
    model = catalog.model(config.model_name(), field="replica.model")
    prefill_device = catalog.device(config.replica.device, field="replica.device")
    decode_device = catalog.device(decode.replica.device, field="cluster.decode.device")
    prefill_tp, decode_tp = config.replica.tensor_parallel_size, decode.replica.tensor_parallel_size
    disagg_config.check_head_layouts(model, prefill_tp, decode_tp)
    try:
        plan = plan_for(decode)
    except ConfigError as exc:
        # The decode pool's layout keys live under [cluster.decode], not [replica].
        field = (exc.field or "").replace("replica.", "cluster.decode.", 1)
        text = str(exc)
        if exc.field and text.startswith(exc.field):
            text = field + text[len(exc.field) :]  # the message names the decode pool's key
        else:
            text = f"cluster.decode: {text}"
        raise ConfigError(text, field=field, value=exc.value) from None
    choice = choose_execution(decode)
    predictor = build_predictor(decode, choice)
    exec_model = (
        _core.CompiledOps(predictor.fused(decode.replica.num_pipeline_stages).to_core())
        if predictor is not None
        else None
    )
    transfer = config.cluster.kv_transfer or disagg_config.KvTransferConfig()
    figures = disagg_config.link_figures(transfer, prefill_device, decode_device)
    _, kv_bytes = dtype_bytes(config.replica.dtype, config.replica.kv_cache_dtype)
    layout = decode.replica
    # The core's replicas are schedulers, one per attention DP rank: a rank's KV lives
    # on its own TP x PP GPUs, so those send and receive it (ranks placed in order).
    link = {
        "kv_bytes_per_token": disagg_config.kv_bytes_per_token(model, kv_bytes),
        "gpus_per_node": transfer.gpus_per_node,
        "prefill_gpus": prefill_tp * config.replica.num_pipeline_stages,
        "decode_gpus": decode_tp * layout.num_pipeline_stages,
        **figures,
    }
    if bool(prefill_plan.kv_cache_groups) != bool(plan.kv_cache_groups):
        # The link moves blocks as they are: one pool's groups the other cannot take in.
        words = {True: "vLLM's hybrid KV groups", False: "every layer as full attention"}
        raise ConfigError(
            f"cluster.decode.scheduler: the prefill pool plans "
            f"{words[bool(prefill_plan.kv_cache_groups)]}, the decode pool "
            f"{words[bool(plan.kv_cache_groups)]} (its {decode.replica.scheduler.policy} "
            "policy); the KV moves between them as it is: use a policy whose KV layout "
            f"agrees, got {decode.replica.scheduler.policy}",
            field="cluster.decode.scheduler",
            value=decode.replica.scheduler.policy,
        )
    if plan.kv_cache_groups:
        block_size = plan.kv_block_size or decode.replica.scheduler.block_size
        prefill = prefill_plan.kv_block_size or config.replica.scheduler.block_size
        sizes = (config.replica.scheduler.block_size, decode.replica.scheduler.block_size)
        hybrid_kv_pages.check_pool_groups(prefill_plan, plan, sizes, decode_tp)
        check_pool_blocks(prefill, block_size, decode_tp)
        window_block = disagg_config.window_block_size(
            plan.kv_cache_groups, plan.kv_group_block_sizes, block_size
        )
        link.update(disagg_config.hybrid_link_terms(model, kv_bytes, window_block))
    else:
        disagg_config.check_transferable(model)
    core = {
        "num_replicas": num_schedulers(decode),
        "num_stages": layout.num_pipeline_stages,
        "replica": replica_spec(decode, plan, prefix_caching=prefix_caching),
        "global_policy": pool.global_scheduler.policy,
        "balance": 1.0,
        "link": link,
        "host_link": _host_link(decode, plan),
    }
    description = disagg_config.describe(
        pool,
        {
            "device": layout.device,
            "tensor_parallel_size": decode_tp,
            "num_pipeline_stages": layout.num_pipeline_stages,
            "expert_parallel_size": layout.expert_parallel_size,
            "data_parallel_size": layout.data_parallel_size,
            "layout": layout_text(decode),
            "num_blocks": decode.replica.scheduler.num_blocks or plan.num_blocks,
            "execution": describe_execution(predictor, decode, choice),
            "link": link,
        },
    )
    if decode.replica.kv_offload is not None:
        description["kv_offload"] = _tier_description(decode, decode.replica.kv_offload, plan)
    return DecodePool(core, exec_model, description)


def _tier_description(
    config: SimulationConfig, offload: KvOffloadConfig, plan: MemoryPlan
) -> dict[str, Any]:
    """A pool's host tier (``offload``, its ``config.replica.kv_offload``) as the summary's
    config describes it."""
    layout = config.replica
    return {
        **dataclasses.asdict(offload),
        # Only prefix_affinity routing of the prefill pool reads a weight (set by the caller).
        "host_hit_weight": None,
        "host_num_blocks": replica_host_blocks(config, plan),
        "kv_bytes_per_block": plan.kv_bytes_per_token
        * layout.tensor_parallel_size
        * layout.num_pipeline_stages
        * layout.scheduler.block_size,
    }


def _host_link(config: SimulationConfig, plan: MemoryPlan) -> dict[str, float] | None:
    """The replicas' host link for the core (their device's PCIe, their per-GPU share of
    a token's KV); ``None`` without a tier."""
    offload = config.replica.kv_offload
    if offload is None:
        return None
    device = catalog_for(config).device(config.replica.device, field="replica.device")
    return offload.link(plan.kv_bytes_per_token, device)


def _kv_offload(config: SimulationConfig, plan: MemoryPlan) -> dict[str, float] | None:
    link = _host_link(config, plan)
    if link is None or config.replica.kv_offload is None:
        return None
    return {**link, "host_hit_weight": config.replica.kv_offload.effective_host_hit_weight()}


def _plugins(config: SimulationConfig, num_blocks: int) -> tuple[Any, list[Any] | None]:
    """Instantiates ``module:Class`` policies (see docs/plugins.md) with their options."""
    route_plugin = None
    g = config.cluster.global_scheduler
    if ":" in g.policy:
        cls = load_object(g.policy, "cluster.global_scheduler.policy")
        route_plugin = _construct(
            cls,
            "cluster.global_scheduler",
            dict(num_replicas=num_schedulers(config), seed=config.seed, **g.options),
        )
    replica_plugins = None
    s = config.replica.scheduler
    if s.section == "plugin":
        cls = load_object(s.policy, "replica.scheduler.policy")
        replica_plugins = [
            _construct(
                cls,
                "replica.scheduler.plugin",
                dict(
                    replica_id=i,
                    num_blocks=num_blocks,
                    block_size=s.plugin.block_size,
                    **s.plugin.options,
                ),
            )
            for i in range(num_schedulers(config))
        ]
    return route_plugin, replica_plugins


def _policy_plugins(config: SimulationConfig) -> list[Any] | None:
    """``vllm_v1``'s step-scheduler plugins (``docs/plugins.md``), one per replica."""
    s = config.replica.scheduler
    if s.policy_plugin is None:
        return None
    cls = load_object(s.policy_plugin, "replica.scheduler.policy_plugin")
    return [
        _construct(cls, "replica.scheduler.policy_plugin", dict(s.policy_plugin_options))
        for _ in range(num_schedulers(config))
    ]


def _draft_pricing(config: SimulationConfig) -> dict[str, Any]:
    """What prices the draft work (docs/speculative.md): ``draft_model``: the draft model's
    own predictor on the same device (the execution model the config chose, built for it);
    ``mtp`` / ``eagle``: one target layer per pass; ``ngram``: nothing (CPU-side)."""
    spec = config.replica.speculative
    if spec.method in (None, "ngram"):
        return {}
    catalog = catalog_for(config)
    if spec.method == "mtp":
        return _mtp_pricing(config)
    if spec.method == "eagle":
        target = catalog.model(config.model_name(), field="replica.model")
        return {"draft_layer_fraction": 1.0 / target.num_layers}
    draft = str(spec.draft_model)
    catalog.model(draft, field="replica.speculative.draft_model")
    draft_config = dataclasses.replace(
        config,
        replica=dataclasses.replace(
            config.replica,
            model=draft,
            num_pipeline_stages=1,
            speculative=SpeculativeConfig(),
        ),
    )
    predictor = build_predictor(draft_config)
    if predictor is None:
        raise ConfigError(
            f"replica.speculative.draft_model: execution.model = {config.execution.model!r} "
            "cannot price a draft model (it ignores the model); use auto, measured, roofline "
            "or profiled, or another method",
            field="replica.speculative.draft_model",
            value=repr(draft),
        )
    return {"draft_exec_model": _core.CompiledOps(predictor.fused(1).to_core())}


def mtp_module(config: SimulationConfig) -> bool:
    """Whether the ``mtp`` drafter is priced as its own module (a compiled execution
    model), which the core then runs as a draft model."""
    kind = choose_execution(config).kind
    return config.replica.speculative.method == "mtp" and kind in (
        "measured",
        "roofline",
        "profiled",
    )


def _mtp_pricing(config: SimulationConfig) -> dict[str, Any]:
    """The ``mtp`` drafter: the target's MTP module (``ModelSpec.mtp_drafter()``: one
    decoder layer of the target's shape, ``eh_proj``, the shared LM head) priced by the
    execution model the config chose, on the same device and layout, one pipeline stage;
    the core runs it as a draft model (``draft_exec_model``). ``linear`` and Python
    functions cannot price a module: they keep one target layer per pass.

    Raises:
        ConfigError: the model has no MTP layers (``replica.speculative.method``)."""
    catalog = catalog_for(config)
    target = catalog.model(config.model_name(), field="replica.model")
    drafter = target.mtp_drafter()
    predictor = build_mtp_predictor(config, drafter)
    if predictor is None:
        return {"draft_layer_fraction": 1.0 / target.num_layers}
    return {"draft_exec_model": _core.CompiledOps(predictor.fused(1).to_core())}


def _construct(cls: Any, where: str, kwargs: dict[str, Any]) -> Any:
    """``cls(**kwargs)``; a constructor that rejects its options is a ConfigError."""
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(
            f"{where}: cannot build {cls.__name__} with {sorted(kwargs)}: {exc}",
            field=f"{where}.options",
            value=repr(kwargs),
        ) from None


def _core_config(
    config: SimulationConfig,
    replica: _core.ReplicaSpec,
    hash_block_size: int,
    concurrency: int | None = None,
    *,
    decode: dict[str, Any] | None = None,
    kv_offload: dict[str, float] | None = None,
    coalesce_decode_steps: bool = True,
) -> _core.SimConfig:
    g = config.cluster.global_scheduler
    return _core.SimConfig(
        num_replicas=num_schedulers(config),
        num_stages=config.replica.num_pipeline_stages,
        # A routing plugin replaces the router; the core's is never consulted.
        global_policy="round_robin" if ":" in g.policy else g.policy,
        balance=g.effective_balance(),
        replica=replica,
        linear=_core.LinearModel(**config.execution.linear_coefficients()),
        seed=config.seed,
        hash_block_size=hash_block_size,
        sample_interval_s=config.metrics.sample_interval_s,
        # A trace-event file needs every batch stage (the result keeps them only when
        # record_stages asks for them too).
        record_stages=config.metrics.record_stages or config.metrics.trace_events is not None,
        over_length=config.replica.over_length,
        concurrency=concurrency,
        lora=lora_core(config),
        speculative=config.replica.speculative.to_core(mtp_as_draft_model=mtp_module(config)),
        decode=decode,
        kv_offload=kv_offload,
        coalesce_decode_steps=coalesce_decode_steps,
        request_limit=request_limit(config),
    )
