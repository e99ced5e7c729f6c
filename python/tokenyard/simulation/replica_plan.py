"""What one replica is built from, shared by ``simulate`` and its decode pool: the memory
plan (``plan_for``), the core's ``ReplicaSpec`` with every size derived from it
(``replica_spec``), the longest request, the step schedulers a replica runs, and the
banner's words on what the plan assumed. It imports nothing from ``run.py``; ``run.py``
builds the cluster, the decode pool and the result on top of it."""

from __future__ import annotations

import dataclasses
from typing import Any

from tokenyard import _core
from tokenyard.errors import ConfigError
from tokenyard.simulation.catalog import catalog_for
from tokenyard.simulation.config import SimulationConfig
from tokenyard.simulation.execution import quantization_for
from tokenyard.simulation.hybrid_kv import (
    align_mode,
    group_specs,
    has_state_groups,
    plan_fitting_tokens,
    plan_hybrid,
    resolve_hybrid,
    speculative_blocks,
)
from tokenyard.simulation.lora_config import slot_bytes
from tokenyard.simulation.planner import MemoryPlan, hybrid_kv_words, plan_memory

__all__ = [
    "DEFAULT_STATE_SEQS",
    "layout_text",
    "num_schedulers",
    "plan_for",
    "planning_notes",
    "replica_host_blocks",
    "replica_spec",
    "request_limit",
    "state_seqs",
]


def request_limit(config: SimulationConfig) -> tuple[int, str]:
    """The longest request ``config``'s replicas serve and the setting that makes it so
    (``ReplicaSchedulerConfig.request_limit``, against the model's context length)."""
    model = catalog_for(config).model(config.model_name(), field="replica.model")
    return config.replica.scheduler.request_limit(model.name, model.context_length)


def planning_notes(config: SimulationConfig, plan: MemoryPlan) -> list[str]:
    """What the run assumed that bounds its answer and the user did not set, said on the
    banner: Vidur's policies cap their batches at the requests that fit if each grows to
    the longest request, which by default is the model's whole context."""
    notes = _layer_kind_notes(config, plan)
    s = config.replica.scheduler
    if s.section != "vidur" or s.max_request_tokens is not None:
        return notes
    if plan.max_batch_size >= s.vidur.batch_size_cap:
        return notes
    limit, _ = request_limit(config)
    return [
        *notes,
        f"{s.policy} batches hold at most {plan.max_batch_size} requests: the memory planner "
        f"sizes them for requests as long as the model's context ({limit:,} tokens); set "
        "replica.scheduler.max_request_tokens to the workload's longest request",
    ]


#: The requests whose linear-attention state is reserved when the scheduler sets no
#: max_num_seqs (vLLM's default max_num_seqs).
DEFAULT_STATE_SEQS = 256


def state_seqs(config: SimulationConfig) -> int:
    """The running requests whose linear-attention state the plan reserves: the
    scheduler's ``max_num_seqs`` (``max_running_requests``), else vLLM's default 256."""
    s = config.replica.scheduler
    section = getattr(s, s.section, None)
    seqs = getattr(section, "max_num_seqs", 0) or getattr(section, "max_running_requests", 0)
    return int(seqs) if seqs else DEFAULT_STATE_SEQS


def _layer_kind_notes(config: SimulationConfig, plan: MemoryPlan) -> list[str]:
    """The banner's words on what the KV plan assumes for windowed and linear layers."""
    groups = plan.groups
    notes = []
    windowed = [g for g in groups if g.window]
    if plan.kv_cache_groups:
        notes.append(plan.kv_groups_note)
    elif windowed:
        limit, _ = request_limit(config)
        words = hybrid_kv_words(groups, limit, config.replica.scheduler.block_size)
        kinds = ", ".join(f"{g.mixer} (window {g.window})" for g in windowed)
        notes.append(
            f"KV PLANNED AS vLLM --disable-hybrid-kv-cache-manager (replica."
            f"hybrid_kv_cache_manager {_hybrid_setting_words(config)}): {kinds} layers hold "
            f"every token's KV, as full attention. "
            + (f"Why: {plan.kv_groups_note}. " if plan.kv_groups_note else "")
            + words
        )
    if plan.state_bytes_per_request and not plan.kv_cache_groups:
        seqs = state_seqs(config)
        linear = ", ".join(f"{g.mixer} x {g.layers}" for g in groups if g.state_bytes_per_request)
        notes.append(
            f"LINEAR-ATTENTION STATE RESERVED for {seqs} requests ({linear} layers, "
            f"{plan.state_bytes_per_request:,} B per request, "
            f"{plan.reserved_state_bytes / 2**30:.2f} GiB) out of the KV memory (vLLM 0.33 "
            "instead takes a running request's state from its shared block pool, one block "
            f"per Mamba KV group"
            + (f"; {plan.kv_groups_note}" if plan.kv_groups_note and not windowed else "")
            + f"); {_state_bound_words(config, seqs)}"
        )
    return notes


def _hybrid_setting_words(config: SimulationConfig) -> str:
    setting = config.replica.hybrid_kv_cache_manager
    if setting is not None:
        return str(setting).lower()
    policy = config.replica.scheduler.policy
    if policy != "vllm_v1":
        return f"unset; KV groups are simulated on vllm_v1 replicas only, not {policy}"
    return "unset: vLLM 0.33's choice"


def _state_bound_words(config: SimulationConfig, seqs: int) -> str:
    """How the scheduler keeps its running requests within the ``seqs`` whose state is
    reserved (a request beyond them would have no state memory)."""
    s = config.replica.scheduler
    if s.section == "vllm_v1":
        if s.vllm_v1.max_num_seqs == 0:
            return (
                f"vllm_v1.max_num_seqs 0 (unbounded) is set to {seqs} per scheduler, as a "
                "request beyond the reservation would have no state memory"
            )
        return f"vllm_v1.max_num_seqs ({seqs}) keeps the running requests within it"
    if s.section == "sglang":
        return f"sglang.max_running_requests ({seqs}) keeps the running requests within it"
    return (
        "the block pool does not hold per-request state, so more running requests than that "
        "are not refused"
    )


def plan_for(config: SimulationConfig) -> MemoryPlan:
    """The memory plan ``simulate`` uses for ``config`` (raises ConfigError if it does not
    fit)."""
    replica = config.replica
    catalog = catalog_for(config)
    model = catalog.model(config.model_name(), field="replica.model")
    tp, pp = replica.tensor_parallel_size, replica.num_pipeline_stages
    lora = replica.lora
    max_request_tokens = replica.scheduler.request_limit(model.name, model.context_length)[0]
    options: dict[str, Any] = dict(
        tensor_parallel_size=replica.tensor_parallel_size,
        num_pipeline_stages=replica.num_pipeline_stages,
        memory_margin_fraction=replica.memory_margin_fraction,
        block_size=replica.scheduler.block_size,
        weight_dtype=replica.dtype,
        kv_cache_dtype=replica.kv_cache_dtype,
        reserved_bytes=slot_bytes(lora, model, replica.dtype, tp, pp) if lora else 0,
        quantization=quantization_for(config, model),
        expert_parallel_size=replica.expert_parallel_size,
        data_parallel_size=replica.data_parallel_size,
        max_num_seqs=state_seqs(config),
    )
    device = catalog.device(replica.device, field="replica.device")
    try:
        plan = plan_memory(model, device, max_request_tokens=max_request_tokens, **options)
    except ConfigError as exc:
        # No room for one request with every layer full attention: the hybrid groups hold
        # less per request, so they decide (plan_hybrid refuses if it does not fit either).
        if exc.field != "replica.device":
            raise
        # One request's state reserved at most: Mamba groups take it from the pool.
        plan = plan_memory(model, device, max_request_tokens=1, **{**options, "max_num_seqs": 1})
        if not resolve_hybrid(config, plan.groups)[0]:
            raise
    return plan_hybrid(
        config,
        plan,
        max_request_tokens=max_request_tokens,
        block_size=replica.scheduler.block_size,
    )


def num_schedulers(config: SimulationConfig) -> int:
    """The step schedulers the core runs: one per attention DP rank of each replica
    (``cluster.num_replicas x replica.data_parallel_size``). A DP rank batches its own
    requests over its own KV cache, as each of vLLM's DP engine cores does."""
    return config.cluster.num_replicas * config.replica.data_parallel_size


def layout_text(config: SimulationConfig) -> str:
    """The banner's words for a replica's layout: ``TP 8, PP 1`` or, with expert and
    attention data parallelism, ``TP 1 x DP 8 (8 schedulers), EP 8, PP 1``."""
    r = config.replica
    tp, pp, ep, dp = (
        r.tensor_parallel_size,
        r.num_pipeline_stages,
        r.expert_parallel_size,
        r.data_parallel_size,
    )
    attention = f"TP {tp} x DP {dp} ({dp} schedulers)" if dp > 1 else f"TP {tp}"
    experts = f", EP {ep}" if ep > 1 else ""  # DP without EP: the experts by TP x DP
    return f"{attention}{experts}, PP {pp}"


def replica_spec(
    config: SimulationConfig, plan: MemoryPlan, *, prefix_caching: bool = True
) -> _core.ReplicaSpec:
    """The selected replica policy with every size derived, checked by the core."""
    s = config.replica.scheduler
    num_blocks = s.num_blocks or plan.num_blocks
    max_request_tokens, _ = request_limit(config)
    section = s.section
    if section == "plugin":
        return _core.ReplicaSpec.plugin(s.plugin.block_size)
    if section == "vllm_v1":
        c = s.vllm_v1
        if plan.kv_cache_groups:
            # Mamba groups run vLLM's mamba_cache_mode "align" whenever prefix caching is
            # on (hybrid_kv.align_mode; plan_hybrid's note says which mode runs): their
            # pool is prefix-cached then, prefix identity or not (the split and the
            # look-ahead follow vLLM's; nothing hits without identity).
            state = has_state_groups(plan.kv_cache_groups)
            align = state and align_mode(config)
            hybrid = _hybrid_scheduler(config, plan, num_blocks, align=align)
            caching = c.enable_prefix_caching and (align or prefix_caching)
            # Beside KV groups only the drop the section asks for goes in: the connector
            # fallback (P/D with EAGLE/MTP over groups) is not derived here yet.
            prefill_lookahead, hash_lookahead, _ = _drafter_lookahead(config, caching=caching)
            return _core.ReplicaSpec.vllm_v1(
                dataclasses.replace(
                    hybrid,
                    enable_prefix_caching=caching,
                    num_prefill_lookahead=prefill_lookahead,
                    num_hash_lookahead_tokens=hash_lookahead,
                )
            )
        caching = c.enable_prefix_caching and prefix_caching
        prefill_lookahead, hash_lookahead, drop = _drafter_lookahead(config, caching=caching)
        return _core.ReplicaSpec.vllm_v1(
            dataclasses.replace(
                c,
                eagle_block_drop=c.eagle_block_drop or drop,
                num_prefill_lookahead=prefill_lookahead,
                num_hash_lookahead_tokens=hash_lookahead,
                num_blocks=num_blocks,
                # [replica.lora]'s GPU slots are the step scheduler's adapter gate.
                max_loras=config.replica.lora.max_loras if config.replica.lora else 0,
                host_num_blocks=replica_host_blocks(config, plan),
                # A drafter's lookahead slots go beyond the longest request.
                max_model_len=min(
                    max_request_tokens,
                    (num_blocks - c.reserve_null_block) * c.block_size
                    - config.replica.speculative.num_lookahead_tokens(),
                ),
                enable_prefix_caching=caching,
                # Linear-attention state is reserved for state_seqs requests only: no more
                # may run at once (planning_notes says so).
                max_num_seqs=(
                    state_seqs(config)
                    if c.max_num_seqs == 0 and plan.state_bytes_per_request
                    else c.max_num_seqs
                ),
            )
        )
    if section == "sglang":
        g = s.sglang
        return _core.ReplicaSpec.sglang(
            num_pages=num_blocks,
            page_size=g.page_size,
            max_running_requests=g.max_running_requests,
            max_extend_tokens=g.chunked_prefill_size,
            graph_batch_sizes=list(g.cuda_graph_bs),
        )
    v = s.vidur
    num_stages = config.replica.num_pipeline_stages
    max_batch_size = min(plan.max_batch_size, v.batch_size_cap)
    return _core.ReplicaSpec.vidur(
        s.policy,
        num_blocks=num_blocks,
        block_size=v.block_size,
        watermark_blocks=int(v.watermark_blocks_fraction * num_blocks),
        batch_size_cap=v.batch_size_cap,
        max_batch_size=max_batch_size,
        num_stages=num_stages,
        restart=v.restart,
        max_blocks_per_sequence=max_request_tokens // v.block_size,
        max_tokens_in_batch=v.max_tokens_in_batch,
        chunk_size=v.chunk_size,
        max_waiting_iters=v.max_waiting_iters,
    )


def _drafter_lookahead(config: SimulationConfig, *, caching: bool) -> tuple[int, int, bool]:
    """``SpeculativeConfig.scheduler_lookahead`` for the replica's model and pools, and
    whether a prefix hit drops its trailing block for the drafter: vLLM 0.33's
    ``Scheduler.__init__`` keeps EAGLE/MTP's ``use_eagle_block_drop`` unless look-ahead
    hashes prove the boundary token, so a KV connector (P/D, or a host tier: vLLM's
    ``kv_offloading_size`` builds an offloading connector) means the drop."""
    spec = config.replica.speculative
    if spec.method not in ("eagle", "mtp"):
        return 0, 0, False
    model = catalog_for(config).model(config.model_name(), field="replica.model")
    hashes = caching and not config.replica.scheduler.vllm_v1.eagle_block_drop
    connector = config.cluster.decode is not None or config.replica.kv_offload is not None
    prefill, hash_lookahead = spec.scheduler_lookahead(
        model.num_mtp_layers, prefix_caching=hashes, kv_connector=connector
    )
    return prefill, hash_lookahead, caching and hash_lookahead == 0


def _hybrid_scheduler(
    config: SimulationConfig, plan: MemoryPlan, num_blocks: int, *, align: bool
) -> Any:
    """The ``vllm_v1`` section with vLLM's hybrid KV cache groups (``hybrid_kv``): the
    longest request is the longest whose blocks over every group fit. ``align``: Mamba
    groups in ``mamba_cache_mode="align"`` with vLLM's block-aligned prefill split
    (``mamba_block_size`` = the aligned block, ``_align_hybrid_block_size``)."""
    c = config.replica.scheduler.vllm_v1
    block_size = plan.kv_block_size or c.block_size
    spec = speculative_blocks(config)
    blocks = num_blocks - c.reserve_null_block
    fitting = plan_fitting_tokens(
        plan, blocks, block_size, c.max_num_batched_tokens, spec, align=align
    )
    return dataclasses.replace(
        c,
        num_blocks=num_blocks,
        # vLLM's attention block aligned to the Mamba page (hybrid_kv.aligned_block_size),
        # or its hash block size beside each group's own (hybrid_kv_pages.plan_pages).
        block_size=block_size,
        kv_group_block_sizes=plan.kv_group_block_sizes,
        max_loras=config.replica.lora.max_loras if config.replica.lora else 0,
        # A drafter's lookahead slots go beyond the longest request.
        max_model_len=min(
            request_limit(config)[0],
            fitting - config.replica.speculative.num_lookahead_tokens(),
        ),
        kv_groups=group_specs(plan.kv_cache_groups, spec, align=align),
        mamba_align_block_size=block_size if align else 0,
    )


def replica_host_blocks(config: SimulationConfig, plan: MemoryPlan) -> int:
    """The host tier's blocks per replica: ``vllm_v1.host_num_blocks`` if given, else what
    ``kv_offload.host_memory_gb`` holds (0 without a tier)."""
    offload = config.replica.kv_offload
    if offload is None:
        return 0
    replica = config.replica
    return replica.scheduler.vllm_v1.host_num_blocks or offload.num_host_blocks(
        plan.kv_bytes_per_token,
        replica.tensor_parallel_size * replica.num_pipeline_stages,
        replica.scheduler.block_size,
    )
