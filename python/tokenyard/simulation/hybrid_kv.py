"""vLLM 0.33's hybrid KV cache manager as the simulator plans it: the KV cache groups its
allocator forms for a model with several attention kinds, the pool size they give, and
whether vLLM would run it for a configuration (``replica.hybrid_kv_cache_manager``).

Groups (``kv_cache_planning._get_kv_cache_groups_uniform_page_size``): the layers of one
device, bucketed by kind in layer order, are split into groups of ``group_size`` layers,
the fewest layers of any kind (or the most, when that is under 1.5 times the fewest), the
last group of a kind padded. Every group's block holds ``group_size`` layers' pages, so

    bytes per block = group_size x page bytes per layer   [page: block_size tokens' K and V]
    num_blocks      = available KV bytes // bytes per block   [get_kv_cache_config_from_groups]

and a request of ``L`` tokens holds, per group (``max_memory_usage_bytes`` of its spec, with
``f = max_in_flight_tokens``): full attention ``ceil(L/bs)``; a sliding window ``w``
``ceil(min(w - 1 + f, L)/bs) + 1``; chunked local ``c`` ``ceil(min(c + f, L)/bs)``. vLLM's
maximum concurrency is ``num_blocks`` over their sum (``get_max_concurrency_for_kv_cache_config``).

Modelled: attention-only hybrids whose layers have one page size (gpt-oss: 2 groups).
Refused (``hybrid_kv_cache_manager = true``): per-layer page sizes that differ (Gemma 4's
global layers: vLLM gives their group a larger block size, the coordinator has one),
linear-attention state groups (Qwen3.5, Nemotron-H: vLLM aligns the attention block size
to the Mamba page), a KV connector (P/D) or host tier, and non-``vllm_v1`` replicas.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tokenyard._core import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from tokenyard.errors import ConfigError
from tokenyard.simulation.planner import KvGroup, MemoryPlan

if TYPE_CHECKING:
    from tokenyard.simulation.config import SimulationConfig

__all__ = [
    "HybridKvLayout",
    "blocks_per_request",
    "group_specs",
    "hybrid_default",
    "max_model_len_fitting",
    "plan_hybrid",
    "resolve_hybrid",
    "vllm_kv_layout",
]

_FIELD = "replica.hybrid_kv_cache_manager"

_GroupSpec = FullAttentionSpec | SlidingWindowSpec | ChunkedLocalAttentionSpec | MambaSpec


@dataclass(frozen=True)
class HybridKvLayout:
    """The KV cache groups of vLLM's hybrid allocator on one device, in its order."""

    #: One per KV cache group: its kind (``mixer``), ``layers`` (``layers_per_group``,
    #: padding included), the bytes a token takes in it and its ``window``.
    groups: tuple[KvGroup, ...]
    layers_per_group: int
    bytes_per_block: int


def is_hybrid(groups: tuple[KvGroup, ...]) -> bool:
    """Whether the model has layers that are not full attention (windowed or linear)."""
    return any(g.window or g.state_bytes_per_request for g in groups)


def _one_window_kind(groups: tuple[KvGroup, ...]) -> bool:
    """Every layer one sliding or chunked kind (Mistral 7B v0.1's window on every layer)."""
    return len(groups) == 1 and bool(groups[0].window)


def vllm_kv_layout(groups: tuple[KvGroup, ...], block_size: int, model: str) -> HybridKvLayout:
    """vLLM 0.33's groups for the layers ``groups`` (``planner.kv_groups``: one device's
    layers by kind, in layer order).

    Raises:
        ConfigError (field ``replica.hybrid_kv_cache_manager``): a linear-attention group,
            or attention layers whose page sizes differ.
    """
    linear = [g.mixer for g in groups if g.state_bytes_per_request]
    if linear:
        raise ConfigError(
            f"{_FIELD}: {model}'s {'/'.join(linear)} state layers would be Mamba groups "
            "whose page vLLM 0.33 aligns to the attention block size (a larger block than "
            "replica.scheduler.block_size), which is not modelled; set it false (state "
            "reserved for max_num_seqs requests), got true",
            field=_FIELD,
            value="True",
        )
    per_layer = {g.bytes_per_token // g.layers for g in groups}
    if len(per_layer) > 1:
        sizes = ", ".join(f"{g.mixer} {g.bytes_per_token // g.layers:,}" for g in groups)
        raise ConfigError(
            f"{_FIELD}: {model}'s layers cache different bytes per token ({sizes}); vLLM "
            "0.33 then gives the smaller pages a larger block size "
            "(unify_kv_cache_spec_page_size), while the coordinator has one block size; set "
            "it false, got true",
            field=_FIELD,
            value="True",
        )
    counts = [g.layers for g in groups]
    group_size = min(counts)
    if max(counts) < group_size * 1.5:
        group_size = max(counts)
    page = per_layer.pop() * block_size
    out = []
    for g in groups:
        for _ in range(math.ceil(g.layers / group_size)):
            out.append(KvGroup(g.mixer, group_size, page // block_size * group_size, g.window))
    return HybridKvLayout(tuple(out), group_size, group_size * page)


def blocks_per_request(
    layout: HybridKvLayout, num_tokens: int, block_size: int, max_in_flight_tokens: int
) -> int:
    """Blocks a request of ``num_tokens`` holds at most over every group (vLLM's
    ``max_memory_usage_bytes`` per group, in pages)."""
    total = 0
    for g in layout.groups:
        if g.mixer == "sliding":
            total += math.ceil(min(g.window - 1 + max_in_flight_tokens, num_tokens) / block_size)
            total += 1
        elif g.mixer == "chunked":
            total += math.ceil(min(g.window + max_in_flight_tokens, num_tokens) / block_size)
        else:
            total += math.ceil(num_tokens / block_size)
    return total


def group_specs(groups: tuple[KvGroup, ...]) -> tuple[_GroupSpec, ...]:
    """vLLM's groups (``HybridKvLayout.groups``) as ``tokenyard.kv`` specs, for
    ``SchedulerConfig.kv_groups``."""
    specs: list[_GroupSpec] = []
    for g in groups:
        if g.mixer == "sliding":
            specs.append(SlidingWindowSpec(sliding_window=g.window))
        elif g.mixer == "chunked":
            specs.append(ChunkedLocalAttentionSpec(attention_chunk_size=g.window))
        elif g.state_bytes_per_request:
            specs.append(MambaSpec())
        else:
            specs.append(FullAttentionSpec())
    return tuple(specs)


def hybrid_default(groups: tuple[KvGroup, ...], *, connector: str | None) -> tuple[bool, str]:
    """What vLLM 0.33 does for a model with these layers (``VllmConfig.__post_init__``'s
    hybrid-manager rules) and what the simulator plans, with the banner's words.

    ``connector``: the KV connector the configuration implies (``"P/D"``, ``"host tier"``),
    or ``None``.
    """
    if not is_hybrid(groups):
        return False, ""
    mixers = {g.mixer for g in groups}
    if "chunked" in mixers:
        return False, (
            "chunked local attention: vLLM 0.33 turns its hybrid KV cache manager off by "
            "default (unless VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1; "
            "replica.hybrid_kv_cache_manager = true plans that)"
        )
    if connector is not None:
        return False, (
            f"with a {connector} KV connector vLLM 0.33 keeps its hybrid KV cache manager "
            "when the connector supports it (NixlConnector, OffloadingConnector do); the "
            "simulator's groups serve no connector, so this is planned as "
            "--disable-hybrid-kv-cache-manager"
        )
    if any(g.state_bytes_per_request for g in groups):
        return False, (
            "vLLM 0.33 needs its hybrid KV cache manager for linear-attention state (Mamba "
            "groups in the block pool); not modelled yet: the state is reserved instead"
        )
    if len({g.bytes_per_token // g.layers for g in groups}) > 1:
        return False, (
            "vLLM 0.33 runs its hybrid KV cache manager with a larger block size for the "
            "layers with smaller pages; not modelled (one block size): planned as "
            "--disable-hybrid-kv-cache-manager"
        )
    return True, ""


def resolve_hybrid(config: SimulationConfig, groups: tuple[KvGroup, ...]) -> tuple[bool, str]:
    """Whether the plan uses vLLM's hybrid KV cache manager for ``config`` (its
    ``replica.hybrid_kv_cache_manager``, or vLLM 0.33's choice when unset), and why not
    when vLLM would and it does not.

    Raises:
        ConfigError (field ``replica.hybrid_kv_cache_manager``): ``true`` for a model with
            only full-attention layers, under P/D disaggregation or prefix-affinity
            routing, or for layers it cannot model (``vllm_kv_layout``).
    """
    setting = config.replica.hybrid_kv_cache_manager
    model = config.model_name()
    if _one_window_kind(groups):
        # vLLM keeps a model of one windowed kind in its single window group whatever the
        # flag (unify_hybrid_kv_cache_specs promotes only mixed kinds).
        if setting is False:
            raise ConfigError(
                f"{_FIELD}: every layer of {model} is {groups[0].mixer} attention: vLLM 0.33 "
                "keeps its one window group even with --disable-hybrid-kv-cache-manager "
                "(unify_hybrid_kv_cache_specs promotes only mixed kinds); leave it unset, got "
                "false",
                field=_FIELD,
                value="False",
            )
        if config.replica.scheduler.policy == "vllm_v1":
            return True, ""
    pd = config.cluster.decode is not None
    connector = "P/D" if pd else ("host tier" if config.replica.kv_offload else None)
    if setting is None:
        if config.replica.scheduler.policy != "vllm_v1":
            return False, ""
        use, why = hybrid_default(groups, connector=connector)
        if use and config.cluster.global_scheduler.policy == "prefix_affinity":
            return False, (
                "vLLM 0.33 would run its hybrid KV cache manager; prefix_affinity routing "
                "reads KV cache events, which the KV groups' coordinator does not record, "
                "so this is planned as --disable-hybrid-kv-cache-manager"
            )
        return use, why
    if not setting:
        return False, ""
    if not is_hybrid(groups):
        raise ConfigError(
            f"{_FIELD}: {model} has only full-attention layers: one KV group either way; "
            "leave it unset, got true",
            field=_FIELD,
            value="True",
        )
    if pd:
        raise ConfigError(
            f"{_FIELD}: P/D disaggregation moves KV through a connector, which the KV "
            "groups' coordinator does not serve; set it false (vLLM 0.33's "
            "--disable-hybrid-kv-cache-manager), got true",
            field=_FIELD,
            value="True",
        )
    if config.cluster.global_scheduler.policy == "prefix_affinity":
        raise ConfigError(
            f"{_FIELD}: prefix_affinity routing reads KV cache events, which the KV "
            "groups' coordinator does not record; set it false or route otherwise, got true",
            field=_FIELD,
            value="True",
        )
    return True, ""


def max_model_len_fitting(
    specs: tuple[KvGroup, ...], num_kv_blocks: int, block_size: int, max_num_batched_tokens: int
) -> int:
    """The longest request whose blocks over every group fit ``num_kv_blocks`` as the
    step scheduler counts them (``SchedulerConfig::blocks_per_request``: a window group's
    blocks capped at its admission cap for one step in flight)."""

    def needed(tokens: int) -> int:
        total = 0
        for g in specs:
            required = math.ceil(tokens / block_size)
            if g.mixer == "sliding":
                cap = math.ceil((g.window - 1 + max_num_batched_tokens) / block_size) + 1
                required = min(required, cap)
            elif g.mixer == "chunked":
                required = min(
                    required, math.ceil((g.window + max_num_batched_tokens) / block_size)
                )
            total += required
        return total

    low, high = 0, num_kv_blocks * block_size
    while low < high:
        mid = (low + high + 1) // 2
        if needed(mid) <= num_kv_blocks:
            low = mid
        else:
            high = mid - 1
    return low


def plan_hybrid(
    config: SimulationConfig, plan: MemoryPlan, *, max_request_tokens: int, block_size: int
) -> MemoryPlan:
    """``plan`` (every attention layer as full attention) re-sized for vLLM's hybrid KV
    cache manager when ``resolve_hybrid`` says so, else ``plan`` with the banner's words
    on why not."""
    use, why = resolve_hybrid(config, plan.groups)
    if not use:
        return dataclasses.replace(plan, kv_groups_note=why) if why else plan
    layout = vllm_kv_layout(plan.groups, block_size, config.model_name())
    in_flight = config.replica.scheduler.vllm_v1.max_num_batched_tokens
    num_blocks = plan.available_kv_bytes // layout.bytes_per_block
    per_request = blocks_per_request(layout, max_request_tokens, block_size, in_flight)
    max_batch_size = num_blocks // per_request
    if max_batch_size < 1:
        raise ConfigError(
            f"replica.device: {config.model_name()} leaves {num_blocks} KV blocks under vLLM's "
            f"hybrid KV cache manager, fewer than one request of {max_request_tokens:,} tokens "
            f"holds ({per_request})",
            field="replica.device",
            value=config.replica.device,
        )
    full_blocks = math.ceil(max_request_tokens / block_size)
    kinds = " + ".join(
        f"{g.mixer}{f' (window {g.window})' if g.window else ''}" for g in layout.groups
    )
    note = (
        f"KV PLANNED WITH vLLM's HYBRID KV CACHE MANAGER (replica.hybrid_kv_cache_manager "
        f"{'true' if config.replica.hybrid_kv_cache_manager else 'unset: vLLM 0.33 default'}): "
        f"{len(layout.groups)} KV groups of {layout.layers_per_group} layers ({kinds}), "
        f"{layout.bytes_per_block:,} B per block: {num_blocks:,} blocks; a "
        f"{max_request_tokens:,}-token request holds {per_request} blocks, so {max_batch_size} "
        f"run at once (vLLM's max concurrency), against {plan.num_blocks:,} blocks of "
        f"{full_blocks} per request, {plan.num_blocks // full_blocks}, with "
        "--disable-hybrid-kv-cache-manager (replica.hybrid_kv_cache_manager = false)"
    )
    return dataclasses.replace(
        plan,
        kv_bytes_per_token=layout.bytes_per_block // block_size,
        num_blocks=num_blocks,
        max_kv_tokens=num_blocks * block_size,
        max_request_slots=num_blocks,
        max_batch_size=max_batch_size,
        kv_cache_groups=layout.groups,
        kv_groups_note=note,
    )
