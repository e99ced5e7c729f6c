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

Linear-attention layers (Qwen3.5's GDN, Nemotron-H's Mamba2) become Mamba groups of the
same pool: vLLM 0.33 raises the attention block size until one attention layer's page holds
a Mamba page and pads the Mamba page to it (``Platform._align_hybrid_block_size``,
``platforms/interface.py``)::

    attn  = k x ceil(mamba page / (k x attention bytes per token)),  k = max(16, bs)
    block = max(bs, 16 x ceil(attn / 16))   [16: FLASH_ATTN's MultipleOf(16) kernel blocks]

vLLM 0.33's default for these models is prefix caching on with ``mamba_cache_mode="align"``
(``MambaModelConfig.verify_and_update_config``, ``model_executor/models/config.py``), which
the simulator runs (``align_mode``): each Mamba group keeps its state at block boundaries,
cached under the block's hash, a request holding the running state and the one it was copied
from, and under speculative decoding ``num_speculative_tokens`` more, a state per draft token
(``2 + num_speculative_blocks`` pages: ``MambaSpec.max_memory_usage_bytes`` in align mode,
``kv_cache_interface.py``; the blocks ``MambaManager`` moves along behind the state), and the
scheduler ends a prefill chunk on a block boundary (``Scheduler.
_mamba_block_aligned_split``; ``mamba_block_size`` is the aligned block,
``_align_hybrid_block_size``). With ``enable_prefix_caching = false`` vLLM keeps
``mamba_cache_mode="none"``: one page per Mamba group, ``1 + num_speculative_tokens`` under
speculative decoding. A workload without prefix identity runs ``align`` too, as vLLM
(which never sees the workload) does: nothing hits, but the pages held and the aligned
chunks are vLLM's. Not modelled in align mode: the backend's internal prefill checkpoint
(``num_prefill_checkpoint_blocks``: one more page, and no split at the last cacheable
boundary, in vLLM's Mamba2 layers and its FlashInfer GDN prefill), and its alignment in the
block size.

Modelled: hybrids whose attention layers have one page size (gpt-oss: 2 groups; Qwen3.5:
1 full + 3 Mamba groups), beside a P/D connector (NixlConnector is ``SupportsHMA``), and
attention pages of different sizes (Gemma 4's global layers: groups of different block sizes,
``hybrid_kv_pages.plan_pages``, which also says what is not served beside them).
Refused (``hybrid_kv_cache_manager = true``): a host tier, prefix-affinity routing, and
non-``vllm_v1`` replicas; ``= false`` for a model with linear-attention state (vLLM cannot
promote a Mamba layer to full attention).
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
from tokenyard.simulation import hybrid_kv_pages
from tokenyard.simulation.planner import KvGroup, MemoryPlan

if TYPE_CHECKING:
    from tokenyard.simulation.config import SimulationConfig

__all__ = [
    "HybridKvLayout",
    "align_mode",
    "aligned_block_size",
    "blocks_per_request",
    "check_pool_blocks",
    "group_specs",
    "has_state_groups",
    "hybrid_default",
    "max_model_len_fitting",
    "plan_hybrid",
    "resolve_hybrid",
    "speculative_blocks",
    "vllm_kv_layout",
]

_FIELD = "replica.hybrid_kv_cache_manager"

_GroupSpec = FullAttentionSpec | SlidingWindowSpec | ChunkedLocalAttentionSpec | MambaSpec


@dataclass(frozen=True)
class HybridKvLayout:
    """The KV cache groups of vLLM's hybrid allocator on one device, in its order."""

    #: One per KV cache group: its kind (``mixer``), ``layers`` (``layers_per_group``,
    #: padding included), the bytes a token takes in it and its ``window``; a Mamba group
    #: its padded pages as ``state_bytes_per_request``.
    groups: tuple[KvGroup, ...]
    layers_per_group: int
    bytes_per_block: int
    #: Tokens per block: the scheduler's, or vLLM's aligned attention block with Mamba
    #: groups (``aligned_block_size``).
    block_size: int = 16
    #: One Mamba layer's state page before padding (0: no Mamba group).
    mamba_page_bytes: int = 0


def is_hybrid(groups: tuple[KvGroup, ...]) -> bool:
    """Whether the model has layers that are not full attention (windowed or linear)."""
    return any(g.window or g.state_bytes_per_request for g in groups)


def _one_window_kind(groups: tuple[KvGroup, ...]) -> bool:
    """Every layer one sliding or chunked kind (Mistral 7B v0.1's window on every layer)."""
    return len(groups) == 1 and bool(groups[0].window)


#: vLLM 0.33's smallest attention kernel block on CUDA (FLASH_ATTN and FlashInfer both
#: take multiples of 16: ``get_supported_kernel_block_sizes``).
KERNEL_BLOCK_ALIGNMENT = 16


def aligned_block_size(attn_bytes_per_token: int, mamba_page_bytes: int, block_size: int) -> int:
    """vLLM 0.33's attention block size beside Mamba layers (``Platform.
    _align_hybrid_block_size``): the fewest kernel-aligned tokens whose page of one
    attention layer (``attn_bytes_per_token`` each) holds one Mamba page, or
    ``block_size`` when that is larger."""
    k = max(KERNEL_BLOCK_ALIGNMENT, block_size)
    attn = k * math.ceil(mamba_page_bytes / (k * attn_bytes_per_token))
    attn = KERNEL_BLOCK_ALIGNMENT * math.ceil(attn / KERNEL_BLOCK_ALIGNMENT)
    return max(block_size, attn)


def vllm_kv_layout(groups: tuple[KvGroup, ...], block_size: int, model: str) -> HybridKvLayout:
    """vLLM 0.33's groups for the layers ``groups`` (``planner.kv_groups``: one device's
    layers by kind, in layer order). Mamba layers (``state_bytes_per_request``) give the
    attention layers vLLM's aligned block size and their pages padded to its page.

    Raises:
        ConfigError (field ``replica.hybrid_kv_cache_manager``): attention layers whose page
            sizes differ (``hybrid_kv_pages.pages_layout`` plans those), or no attention
            layer beside the Mamba ones.
    """
    attention = [g for g in groups if not g.state_bytes_per_request]
    linear = [g for g in groups if g.state_bytes_per_request]
    if not attention:
        raise ConfigError(
            f"{_FIELD}: {model} has no attention layer beside its "
            f"{'/'.join(g.mixer for g in linear)} state layers (vLLM then sizes Mamba blocks "
            "by max_model_len), which is not modelled; got true",
            field=_FIELD,
            value="True",
        )
    per_layer = {g.bytes_per_token // g.layers for g in attention}
    if len(per_layer) > 1:
        sizes = ", ".join(f"{g.mixer} {g.bytes_per_token // g.layers:,}" for g in attention)
        raise ConfigError(
            f"{_FIELD}: {model}'s layers cache different bytes per token ({sizes}); vLLM "
            "0.33 then gives the smaller pages a larger block size "
            "(unify_kv_cache_spec_page_size): plan it with hybrid_kv_pages.pages_layout, not "
            "one block size; got true",
            field=_FIELD,
            value="True",
        )
    per_token = per_layer.pop()
    mamba_page = max((g.state_bytes_per_request // g.layers for g in linear), default=0)
    if mamba_page:
        block_size = aligned_block_size(per_token, mamba_page, block_size)
    counts = [g.layers for g in groups]
    group_size = min(counts)
    if max(counts) < group_size * 1.5:
        group_size = max(counts)
    page = per_token * block_size
    out = []
    for g in groups:
        for _ in range(math.ceil(g.layers / group_size)):
            if g.state_bytes_per_request:
                out.append(KvGroup(g.mixer, group_size, 0, 0, page * group_size))
            else:
                out.append(KvGroup(g.mixer, group_size, per_token * group_size, g.window))
    return HybridKvLayout(tuple(out), group_size, group_size * page, block_size, mamba_page)


def blocks_per_request(
    groups: tuple[KvGroup, ...],
    num_tokens: int,
    block_size: int,
    max_in_flight_tokens: int,
    speculative_blocks: int = 0,
    *,
    align: bool = False,
) -> int:
    """Blocks a request of ``num_tokens`` holds at most over ``groups`` (a layout's or a
    plan's ``kv_cache_groups``; vLLM's
    ``max_memory_usage_bytes`` per group, in pages); a Mamba group holds one state page and
    ``speculative_blocks`` more (``mamba_cache_mode="none"``), or with ``align`` two (the
    running state and the one it was copied from) and ``speculative_blocks`` more."""
    total = 0
    for g in groups:
        if g.state_bytes_per_request:
            total += (2 if align else 1) + speculative_blocks
        else:
            total += hybrid_kv_pages.attention_blocks(
                g, num_tokens, block_size, max_in_flight_tokens
            )
    return total


def requests_held(config: SimulationConfig, plan: MemoryPlan, num_tokens: int) -> int:
    """Requests of ``num_tokens`` tokens each that ``plan``'s KV groups hold at once: a
    request takes blocks in every group (``blocks_per_request``), so with vLLM's hybrid
    groups the pool's ``max_kv_tokens`` (``num_blocks x block_size``) overstates it, by a
    factor of about the number of groups. ``plan`` must have ``kv_cache_groups``."""
    if not plan.kv_cache_groups:
        raise ValueError("requests_held: the plan has no KV cache groups")
    if plan.kv_group_block_sizes:
        return hybrid_kv_pages.requests_held(config, plan, num_tokens)
    in_flight = config.replica.scheduler.vllm_v1.max_num_batched_tokens
    per_request = blocks_per_request(
        plan.kv_cache_groups,
        num_tokens,
        plan.kv_block_size,
        in_flight,
        speculative_blocks(config),
        align=align_mode(config),
    )
    return plan.num_blocks // per_request


def speculative_blocks(config: SimulationConfig) -> int:
    """The pages a Mamba group holds per request beyond its state under speculative
    decoding: vLLM 0.33's ``MambaSpec.num_speculative_blocks`` is
    ``vllm_config.num_speculative_tokens`` (``MambaBase.get_kv_cache_spec``,
    ``model_executor/layers/mamba/abstract.py``; 0 with ReplaySSM, not modelled), a state
    slot per draft token."""
    spec = config.replica.speculative
    return (spec.num_speculative_tokens or 0) if spec.method is not None else 0


def align_mode(config: SimulationConfig) -> bool:
    """Whether a ``vllm_v1`` replica's Mamba groups run ``mamba_cache_mode="align"``, as
    vLLM 0.33 sets it whenever prefix caching is on (``MambaModelConfig.
    verify_and_update_config``): ``enable_prefix_caching`` on, speculative decoding or not
    (the align groups hold the draft tokens' states, ``speculative_blocks``), whether or
    not the workload has prefix identity (vLLM never sees the workload; ``"none"`` runs
    only with ``enable_prefix_caching = false``, vLLM's own switch). The one rule for the
    plan (``plan_hybrid``), the run (``replica_plan.replica_spec``) and the recommender
    (``requests_held``)."""
    c = config.replica.scheduler
    return c.policy == "vllm_v1" and c.vllm_v1.enable_prefix_caching


def group_specs(
    groups: tuple[KvGroup, ...], speculative_blocks: int = 0, *, align: bool = False
) -> tuple[_GroupSpec, ...]:
    """vLLM's groups (``HybridKvLayout.groups``) as ``tokenyard.kv`` specs, for
    ``SchedulerConfig.kv_groups``. A Mamba group becomes one ``MambaSpec(mamba_cache_mode=
    "align", num_speculative_blocks=speculative_blocks)`` with ``align`` (vLLM's spec), else
    ``1 + speculative_blocks`` ``MambaSpec`` groups: one page per request each, as many as
    vLLM's group holds (its draft tokens' state slots), so the pool is charged as vLLM's is."""
    specs: list[_GroupSpec] = []
    for g in groups:
        if g.mixer == "sliding":
            specs.append(SlidingWindowSpec(sliding_window=g.window))
        elif g.mixer == "chunked":
            specs.append(ChunkedLocalAttentionSpec(attention_chunk_size=g.window))
        elif g.state_bytes_per_request and align:
            specs.append(
                MambaSpec(mamba_cache_mode="align", num_speculative_blocks=speculative_blocks)
            )
        elif g.state_bytes_per_request:
            specs.extend(MambaSpec() for _ in range(1 + speculative_blocks))
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
    if connector == "host tier":
        return False, (
            "with a host tier (vLLM's OffloadingConnector) vLLM 0.33 keeps its hybrid KV "
            "cache manager; the simulator's KV groups serve no host tier, so this is planned "
            "as --disable-hybrid-kv-cache-manager"
        )
    # A P/D connector is served: vLLM 0.33 keeps the hybrid manager when the connector
    # supports it (NixlConnector subclasses SupportsHMA: kv_connector/v1/nixl/connector.py;
    # VllmConfig.__post_init__ asks KVConnectorFactory.supports_hma_config). Attention
    # pages of different sizes: groups of different block sizes (hybrid_kv_pages.plan_pages
    # keeps every layer full attention where the step scheduler does not serve them).
    return True, ""


def resolve_hybrid(config: SimulationConfig, groups: tuple[KvGroup, ...]) -> tuple[bool, str]:
    """Whether the plan uses vLLM's hybrid KV cache manager for ``config`` (its
    ``replica.hybrid_kv_cache_manager``, or vLLM 0.33's choice when unset), and why not
    when vLLM would and it does not.

    Raises:
        ConfigError (field ``replica.hybrid_kv_cache_manager``): ``true`` for a model with
            only full-attention layers, under prefix-affinity routing, or for layers it
            cannot model (``vllm_kv_layout``); ``false`` for a ``vllm_v1`` replica of a model
            with linear-attention state (vLLM cannot run it so). Unset or ``true`` for such
            a replica with what keeps the groups off (``_check_state_groups_servable``:
            the field is the key to change).
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
    decode = config.cluster.decode
    # A host tier on either pool keeps both off the groups (the coordinator serves no tier,
    # and the pools' blocks must agree to move as they are).
    tier = config.replica.kv_offload is not None or (
        decode is not None and decode.kv_offload is not None
    )
    connector = "host tier" if tier else ("P/D" if decode is not None else None)
    linear = [g.mixer for g in groups if g.state_bytes_per_request]
    if linear and config.replica.scheduler.policy == "vllm_v1" and setting is not False:
        _check_state_groups_servable(config, groups, "/".join(linear), tier=tier)
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
        if linear and config.replica.scheduler.policy == "vllm_v1":
            raise ConfigError(
                f"{_FIELD}: {model}'s {'/'.join(linear)} layers hold a state that vLLM 0.33 "
                "keeps only in Mamba groups of its hybrid KV cache manager: with "
                "--disable-hybrid-kv-cache-manager it fails at startup "
                "(unify_hybrid_kv_cache_specs cannot promote a MambaSpec); leave it unset or "
                "true, got false",
                field=_FIELD,
                value="False",
            )
        return False, ""
    if not is_hybrid(groups):
        raise ConfigError(
            f"{_FIELD}: {model} has only full-attention layers: one KV group either way; "
            "leave it unset, got true",
            field=_FIELD,
            value="True",
        )
    if tier:
        raise ConfigError(
            f"{_FIELD}: the KV groups' coordinator serves no host tier (replica.kv_offload "
            "or cluster.decode.kv_offload): set it false (--disable-hybrid-kv-cache-manager), "
            "got true",
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


def _check_state_groups_servable(
    config: SimulationConfig, groups: tuple[KvGroup, ...], linear: str, *, tier: bool
) -> None:
    """A ``vllm_v1`` replica of a model with linear-attention state runs only on Mamba
    groups (vLLM 0.33 cannot start it without them), so what keeps the simulator's groups
    off is refused, naming the key to change, rather than planned as a layout vLLM refuses.

    Raises:
        ConfigError: a host tier (field ``replica.kv_offload`` or
            ``cluster.decode.kv_offload``), ``prefix_affinity`` routing (field
            ``cluster.global_scheduler.policy``), or attention layers of different page
            sizes (field ``replica.model``).
    """
    model = config.model_name()
    why = (
        f"{model}'s {linear} layers hold a state vLLM 0.33 keeps only in Mamba groups of its "
        "hybrid KV cache manager (without it vLLM fails at startup: "
        "unify_hybrid_kv_cache_specs cannot promote a MambaSpec)"
    )
    if tier:
        if config.replica.kv_offload is not None:
            key, value = "replica.kv_offload", str(config.replica.kv_offload)
        else:
            decode = config.cluster.decode
            key, value = "cluster.decode.kv_offload", str(decode.kv_offload if decode else None)
        raise ConfigError(
            f"{key}: {why}, and the simulator's KV groups serve no host tier: remove the "
            "host tier for this model",
            field=key,
            value=value,
        )
    policy = config.cluster.global_scheduler.policy
    if policy == "prefix_affinity":
        raise ConfigError(
            f"cluster.global_scheduler.policy: {why}, and prefix_affinity routing reads KV "
            "cache events, which the KV groups' coordinator does not record: route "
            "otherwise for this model, got prefix_affinity",
            field="cluster.global_scheduler.policy",
            value=policy,
        )
    attention = [g for g in groups if not g.state_bytes_per_request]
    if len({g.bytes_per_token // g.layers for g in attention}) > 1:
        raise ConfigError(
            f"replica.model: {why}, and its attention layers have different page sizes, "
            "which vLLM serves with a larger block size for the smaller pages: not modelled "
            f"beside Mamba groups, got {model}",
            field="replica.model",
            value=model,
        )


def plan_fitting_tokens(
    plan: MemoryPlan,
    num_kv_blocks: int,
    block_size: int,
    max_num_batched_tokens: int,
    speculative_blocks: int,
    *,
    align: bool,
) -> int:
    """The longest request whose blocks over ``plan``'s groups fit ``num_kv_blocks``: each
    group on its own block size where they differ (``hybrid_kv_pages.fitting_tokens``),
    else :func:`max_model_len_fitting` on ``block_size``, Mamba groups included."""
    if plan.kv_group_block_sizes:
        return hybrid_kv_pages.fitting_tokens(plan, num_kv_blocks, max_num_batched_tokens)
    return max_model_len_fitting(
        plan.kv_cache_groups,
        num_kv_blocks,
        block_size,
        max_num_batched_tokens,
        speculative_blocks,
        align=align,
    )


def max_model_len_fitting(
    specs: tuple[KvGroup, ...],
    num_kv_blocks: int,
    block_size: int,
    max_num_batched_tokens: int,
    speculative_blocks: int = 0,
    *,
    align: bool = False,
) -> int:
    """The longest request whose blocks over every group fit ``num_kv_blocks`` as the
    step scheduler counts them (``SchedulerConfig::blocks_per_request``: a window group's
    blocks capped at its admission cap for one step in flight; a Mamba group's
    ``1 + speculative_blocks``, as ``group_specs`` repeats it; with ``align`` a Mamba
    group's two states and ``speculative_blocks``, vLLM 0.33's
    ``MambaSpec.max_memory_usage_bytes`` in ``align`` mode: its table has a slot per block
    and the speculative ones, the earlier block slots the null block)."""

    def needed(tokens: int) -> int:
        total = 0
        for g in specs:
            required = math.ceil(tokens / block_size)
            if g.state_bytes_per_request:
                if align:
                    required = min(required, 2) + speculative_blocks
                else:
                    required = min(required, 1) * (1 + speculative_blocks)
            elif g.mixer == "sliding":
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
    config: SimulationConfig,
    plan: MemoryPlan,
    *,
    max_request_tokens: int,
    block_size: int,
) -> MemoryPlan:
    """``plan`` (every attention layer as full attention, any linear-attention state
    reserved) re-sized for vLLM's hybrid KV cache manager when ``resolve_hybrid`` says so,
    else ``plan`` with the banner's words on why not. With Mamba groups the state comes out
    of the pool (nothing reserved) and ``kv_block_size`` is vLLM's aligned block."""
    use, why = resolve_hybrid(config, plan.groups)
    if not use:
        return dataclasses.replace(plan, kv_groups_note=why) if why else plan
    if hybrid_kv_pages.pages_differ(plan.groups) and not has_state_groups(plan.groups):
        return hybrid_kv_pages.plan_pages(
            config, plan, max_request_tokens=max_request_tokens, block_size=block_size
        )
    layout = vllm_kv_layout(plan.groups, block_size, config.model_name())
    bs = layout.block_size
    in_flight = config.replica.scheduler.vllm_v1.max_num_batched_tokens
    available = plan.available_kv_bytes + plan.reserved_state_bytes
    num_blocks = available // layout.bytes_per_block
    spec = speculative_blocks(config)
    align = align_mode(config)
    per_request = blocks_per_request(
        layout.groups, max_request_tokens, bs, in_flight, spec, align=align
    )
    max_batch_size = num_blocks // per_request
    if max_batch_size < 1:
        raise ConfigError(
            f"replica.device: {config.model_name()} leaves {num_blocks} KV blocks under vLLM's "
            f"hybrid KV cache manager, fewer than one request of {max_request_tokens:,} tokens "
            f"holds ({per_request})",
            field="replica.device",
            value=config.replica.device,
        )
    note = _plan_words(
        config, plan, layout, num_blocks, per_request, max_request_tokens, align=align
    )
    return dataclasses.replace(
        plan,
        kv_bytes_per_token=layout.bytes_per_block // bs,
        available_kv_bytes=available,
        num_blocks=num_blocks,
        max_kv_tokens=num_blocks * bs,
        max_request_slots=num_blocks,
        max_batch_size=max_batch_size,
        reserved_state_bytes=0,
        kv_cache_groups=layout.groups,
        kv_block_size=bs,
        kv_groups_note=note,
    )


def check_pool_blocks(prefill_block_size: int, decode_block_size: int, decode_tp: int) -> None:
    """Both P/D pools' KV groups use one block size (blocks move as they are): with Mamba
    groups vLLM aligns it to each layout's Mamba page, which two TP layouts may size apart.

    Raises:
        ConfigError (field ``cluster.decode.tensor_parallel_size``): the sizes differ.
    """
    if prefill_block_size != decode_block_size:
        raise ConfigError(
            "cluster.decode.tensor_parallel_size: vLLM aligns the attention block to the "
            f"Mamba page of each layout, {prefill_block_size} tokens on the prefill pool and "
            f"{decode_block_size} on the decode pool; the simulator moves blocks as they are: "
            f"use layouts whose blocks agree, got {decode_tp}",
            field="cluster.decode.tensor_parallel_size",
            value=str(decode_tp),
        )


def has_state_groups(groups: tuple[KvGroup, ...]) -> bool:
    """Whether a plan's KV cache groups include Mamba (linear-attention state) groups
    (prefix-cached only in ``mamba_cache_mode="align"``, ``align_mode``)."""
    return any(g.state_bytes_per_request for g in groups)


def _plan_words(
    config: SimulationConfig,
    plan: MemoryPlan,
    layout: HybridKvLayout,
    num_blocks: int,
    per_request: int,
    max_request_tokens: int,
    *,
    align: bool,
) -> str:
    """The banner's note on a hybrid plan: the groups, the pool, vLLM's max concurrency,
    and the plan without groups it replaces (not for Mamba groups: vLLM has none)."""
    kinds = " + ".join(
        f"{g.mixer}{f' (window {g.window})' if g.window else ''}" for g in layout.groups
    )
    setting = config.replica.hybrid_kv_cache_manager
    words = (
        f"KV PLANNED WITH vLLM's HYBRID KV CACHE MANAGER (replica.hybrid_kv_cache_manager "
        f"{'true' if setting else 'unset: vLLM 0.33 default'}): "
        f"{len(layout.groups)} KV groups of {layout.layers_per_group} layers ({kinds}), "
        f"{layout.bytes_per_block:,} B per block of {layout.block_size} tokens: "
        f"{num_blocks:,} blocks; a {max_request_tokens:,}-token request holds {per_request} "
        f"blocks, so {num_blocks // per_request} run at once (vLLM's max concurrency)"
    )
    block_size = config.replica.scheduler.block_size
    full_blocks = math.ceil(max_request_tokens / block_size)
    mamba = sum(1 for g in layout.groups if g.state_bytes_per_request)
    if not mamba:
        return words + (
            f", against {plan.num_blocks:,} blocks of {full_blocks} per request, "
            f"{plan.num_blocks // full_blocks}, with --disable-hybrid-kv-cache-manager "
            "(replica.hybrid_kv_cache_manager = false)"
        )
    spec = speculative_blocks(config)
    head = (
        f". The attention block is {layout.block_size} tokens, not {block_size}, so one "
        f"attention layer's page holds a {layout.mamba_page_bytes:,} B Mamba state page "
        "(vLLM's _align_hybrid_block_size; the state pages padded to it)"
    )
    if align:
        mode = (
            ". PREFIX CACHING ON WITH mamba_cache_mode 'align' (vLLM 0.33's default): each "
            f"Mamba group caches its state at block boundaries and holds {2 + spec} pages per "
            "request (the running state and the one it was copied from"
            + (f", and {spec} for the draft tokens' states" if spec else "")
            + "), and a prefill chunk ends on "
            f"a {layout.block_size}-token boundary unless it ends the prompt. Not modelled: "
            "vLLM's internal "
            "prefill checkpoint (one more page, in its Mamba2 layers and FlashInfer GDN "
            "prefill)"
        )
    else:
        pages = f"1 + {spec} pages (a state slot per draft token)" if spec else "one page"
        mode = (
            f"; each Mamba group holds {pages} per request (mamba_cache_mode 'none') "
            "(enable_prefix_caching = false)"
        )
    # No "without groups" figures: vLLM 0.33 cannot start a model with Mamba state without
    # its hybrid manager (resolve_hybrid refuses false), and the plan without groups may be
    # the one-request fallback (plan_for).
    return words + head + mode
