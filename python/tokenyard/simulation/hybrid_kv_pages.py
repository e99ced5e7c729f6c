"""vLLM 0.33's hybrid KV layout for a model whose attention layers have different page sizes
(Gemma 4: its global layers' ``num_global_key_value_heads`` and ``global_head_dim`` give them
another page than its sliding-window layers'), as its planner forms it.

``unify_kv_cache_spec_page_size`` (``vllm/v1/core/kv_cache_planning.py``) grows the block size
of the layers with smaller pages until every page has the largest size (a page that does not
divide it would be padded instead: not modelled, refused), then the layers are grouped as for
one page size (``_get_kv_cache_groups_uniform_page_size``: groups of the fewest layers of any
kind, or the most when that is under 1.5 times the fewest) and the pool is

    bytes per block = group_size x the largest page
    num_blocks      = available KV bytes // bytes per block   [get_kv_cache_config_from_groups]

A request of ``L`` tokens holds in each group ``ceil(L / its block size)`` blocks, a sliding
window ``w`` ``ceil(min(w - 1 + f, L) / its block size) + 1`` (``max_memory_usage_bytes``).
The step scheduler runs such groups with ``SchedulerConfig.kv_group_block_sizes`` (hits on
the lcm of the block sizes, requests hashed at their gcd: ``resolve_kv_cache_block_sizes``).

This module plans the layout (checked against vLLM's own planner by
``benches/peers/vllm_kv_spec_diff.py``) and the simulator's runs use it (``plan_pages``: the
memory plan carries each group's block size, ``MemoryPlan.kv_group_block_sizes``, and the
step scheduler's ``block_size`` is the hash block size). Beside differing sizes the step
scheduler serves a KV connector (since branch ``bszconn``; the simulator's P/D since
``simpd``: both pools plan the same groups, ``PdConfig::validate`` checks their block
sizes agree, and the link moves each group's KV, ``disagg_config.hybrid_link_terms``) but
neither chunked local nor Mamba groups:
with the setting unset such a configuration is planned as
``--disable-hybrid-kv-cache-manager`` (the banner says why), with ``true`` refused naming
the key. Speculative steps of any length are
served (vLLM's ``_spec_decode_step_blocks`` counts each group on its own block size, as the
step scheduler does), and EAGLE/MTP drafters with prefix caching on or off (vLLM's
``use_eagle`` rules, hash look-ahead or the trailing-block drop, with the partial tail-block
entries its full-attention managers register beside differing sizes: the core's
``coordinator_sizes_tail``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tokenyard.errors import ConfigError
from tokenyard.simulation.planner import KvGroup, MemoryPlan

if TYPE_CHECKING:
    from tokenyard.simulation.config import SimulationConfig

__all__ = [
    "PagesLayout",
    "attention_blocks",
    "blocks_per_request",
    "check_pool_groups",
    "fitting_tokens",
    "pages_differ",
    "pages_layout",
    "plan_pages",
    "requests_held",
]

_FIELD = "replica.hybrid_kv_cache_manager"


@dataclass(frozen=True)
class PagesLayout:
    """vLLM's KV cache groups on one device when attention pages differ, in its order."""

    #: One per KV cache group (``layers_per_group`` layers each, padding included).
    groups: tuple[KvGroup, ...]
    #: Each group's block size in tokens (the smaller pages' grown).
    group_block_sizes: tuple[int, ...]
    layers_per_group: int
    bytes_per_block: int

    @property
    def scheduler_block_size(self) -> int:
        """vLLM's ``scheduler_block_size``: the lcm of the groups' block sizes."""
        return math.lcm(*self.group_block_sizes)

    @property
    def hash_block_size(self) -> int:
        """vLLM's ``hash_block_size`` under prefix caching: their gcd."""
        return math.gcd(*self.group_block_sizes)


def pages_layout(groups: tuple[KvGroup, ...], block_size: int, model: str) -> PagesLayout:
    """vLLM 0.33's groups for the layers ``groups`` (``planner.kv_groups``: one device's layers
    by kind, in layer order) whose attention pages differ.

    Raises:
        ConfigError (field ``replica.hybrid_kv_cache_manager``): linear-attention state
            beside them, or a page that does not divide the largest (vLLM pads it).
    """
    if any(g.state_bytes_per_request for g in groups):
        raise ConfigError(
            f"{_FIELD}: {model}'s attention pages differ beside linear-attention state, which "
            "is not modelled; got true",
            field=_FIELD,
            value="True",
        )
    pages = [g.bytes_per_token // g.layers * block_size for g in groups]
    largest = max(pages)
    if any(largest % page for page in pages):
        raise ConfigError(
            f"{_FIELD}: {model}'s attention pages ({', '.join(f'{p:,}' for p in pages)} B) do "
            "not divide the largest, which vLLM 0.33 pads (unify_kv_cache_spec_page_size): "
            "not modelled; got true",
            field=_FIELD,
            value="True",
        )
    counts = [g.layers for g in groups]
    group_size = min(counts)
    if max(counts) < group_size * 1.5:
        group_size = max(counts)
    out: list[KvGroup] = []
    sizes: list[int] = []
    for g, page in zip(groups, pages, strict=True):
        per_token = g.bytes_per_token // g.layers
        for _ in range(math.ceil(g.layers / group_size)):
            out.append(KvGroup(g.mixer, group_size, per_token * group_size, g.window))
            sizes.append(block_size * (largest // page))
    return PagesLayout(tuple(out), tuple(sizes), group_size, group_size * largest)


def attention_blocks(
    group: KvGroup, num_tokens: int, block_size: int, max_in_flight_tokens: int
) -> int:
    """Blocks a request of ``num_tokens`` holds at most in one attention group of
    ``block_size`` tokens a block (vLLM's ``max_memory_usage_bytes``, in pages): a window's
    last ``window - 1`` tokens and those in flight, plus one; a chunk's; else every token."""
    if group.mixer == "sliding":
        in_window = min(group.window - 1 + max_in_flight_tokens, num_tokens)
        return math.ceil(in_window / block_size) + 1
    if group.mixer == "chunked":
        return math.ceil(min(group.window + max_in_flight_tokens, num_tokens) / block_size)
    return math.ceil(num_tokens / block_size)


def blocks_per_request(layout: PagesLayout, num_tokens: int, max_in_flight_tokens: int) -> int:
    """Blocks a request of ``num_tokens`` holds at most over the layout's groups, each on its
    own block size (:func:`attention_blocks`)."""
    sizes = zip(layout.groups, layout.group_block_sizes, strict=True)
    return sum(attention_blocks(g, num_tokens, size, max_in_flight_tokens) for g, size in sizes)


def pages_differ(groups: tuple[KvGroup, ...]) -> bool:
    """Whether the attention layers among ``groups`` (``planner.kv_groups``) cache pages of
    different sizes (Gemma 4's global layers)."""
    attention = [g for g in groups if not g.state_bytes_per_request]
    return len({g.bytes_per_token // g.layers for g in attention}) > 1


def _unserved(layout: PagesLayout) -> tuple[str, str, str] | None:
    """``(field, value, why)`` for what the step scheduler does not serve beside groups of
    different block sizes (``SchedulerConfig::validate_group_block_sizes``), or None. A KV
    connector (``cluster.decode``: P/D) is served (``Scheduler::set_connector``,
    branch ``bszconn``)."""
    if any(g.mixer == "chunked" for g in layout.groups):
        return _FIELD, "True", "chunked local attention groups do not take their own block size"
    return None


def check_pool_groups(
    prefill: MemoryPlan, decode: MemoryPlan, block_sizes: tuple[int, int], decode_tp: int
) -> None:
    """Both P/D pools' groups of different block sizes agree, group by group and in the hash
    block size (the connector moves each group's blocks as they are; the core's
    ``PdConfig::validate`` checks the same). ``block_sizes``: the prefill and the decode
    pool's ``scheduler.vllm_v1.block_size``.

    Raises:
        ConfigError: they differ; field ``cluster.decode.scheduler.vllm_v1.block_size``
            where the pools' block sizes differ, else ``cluster.decode.tensor_parallel_size``
            (the TP decides which layers' pages are the smaller: Gemma 4 at TP 8).
    """
    if not (prefill.kv_group_block_sizes or decode.kv_group_block_sizes):
        return
    ours = (decode.kv_group_block_sizes, decode.kv_block_size)
    if (prefill.kv_group_block_sizes, prefill.kv_block_size) == ours:
        return
    field, value, hint = (
        ("cluster.decode.tensor_parallel_size", decode_tp, "a TP whose pages agree")
        if block_sizes[0] == block_sizes[1]
        else ("cluster.decode.scheduler.vllm_v1.block_size", block_sizes[1], "its block size")
    )
    raise ConfigError(
        f"{field}: the decode pool's KV groups take blocks of {decode.kv_group_block_sizes} "
        f"(hashed at {decode.kv_block_size}), the prefill pool's "
        f"{prefill.kv_group_block_sizes} (hashed at {prefill.kv_block_size}); each group's "
        f"blocks move as they are: use the prefill pool's {hint}, got {value}",
        field=field,
        value=str(value),
    )


def plan_pages(
    config: SimulationConfig, plan: MemoryPlan, *, max_request_tokens: int, block_size: int
) -> MemoryPlan:
    """``plan`` (every attention layer as full attention) re-sized for vLLM 0.33's groups of
    different block sizes (``pages_layout``), or ``plan`` with the banner's words on why not
    where the step scheduler does not serve them (``_unserved``) and the setting is unset.

    Raises:
        ConfigError: ``replica.hybrid_kv_cache_manager = true`` with what is not served
            (the field is the key to change), a layout ``pages_layout`` refuses, or no room
            for one request (field ``replica.device``; with what is not served, no room with
            every layer full attention).
    """
    model = config.model_name()
    layout = pages_layout(plan.groups, block_size, model)
    unserved = _unserved(layout)
    if unserved is not None:
        field, value, why = unserved
        if config.replica.hybrid_kv_cache_manager:
            raise ConfigError(
                f"{field}: {model}'s attention pages differ, so vLLM 0.33's groups have "
                f"different block sizes {layout.group_block_sizes}; {why}: set "
                f"replica.hybrid_kv_cache_manager false or change it, got {value}",
                field=field,
                value=value,
            )
        if plan.available_kv_bytes < plan.kv_bytes_per_token * max_request_tokens:
            # plan_for's one-token plan: only the groups could hold the longest request.
            raise ConfigError(
                f"replica.device: {model} does not fit one request of {max_request_tokens:,} "
                "tokens with every layer full attention, and vLLM's groups of different "
                f"block sizes are not modelled here: {why}",
                field="replica.device",
                value=config.replica.device,
            )
        return dataclasses.replace(
            plan,
            kv_groups_note=(
                f"vLLM 0.33 would run its hybrid KV cache manager with groups of different "
                f"block sizes {layout.group_block_sizes}; {why}, so this is planned as "
                "--disable-hybrid-kv-cache-manager"
            ),
        )
    in_flight = config.replica.scheduler.vllm_v1.max_num_batched_tokens
    available = plan.available_kv_bytes + plan.reserved_state_bytes
    num_blocks = available // layout.bytes_per_block
    per_request = blocks_per_request(layout, max_request_tokens, in_flight)
    if num_blocks < per_request:
        raise ConfigError(
            f"replica.device: {model} leaves {num_blocks} KV blocks under vLLM's hybrid KV "
            f"cache manager, fewer than one request of {max_request_tokens:,} tokens holds "
            f"({per_request})",
            field="replica.device",
            value=config.replica.device,
        )
    hash_size = layout.hash_block_size
    return dataclasses.replace(
        plan,
        kv_bytes_per_token=layout.bytes_per_block // hash_size,
        available_kv_bytes=available,
        num_blocks=num_blocks,
        max_kv_tokens=num_blocks * hash_size,
        max_request_slots=num_blocks,
        max_batch_size=num_blocks // per_request,
        reserved_state_bytes=0,
        kv_cache_groups=layout.groups,
        kv_block_size=hash_size,
        kv_group_block_sizes=layout.group_block_sizes,
        kv_groups_note=_words(config, plan, layout, num_blocks, per_request, max_request_tokens),
    )


def _words(
    config: SimulationConfig,
    plan: MemoryPlan,
    layout: PagesLayout,
    num_blocks: int,
    per_request: int,
    max_request_tokens: int,
) -> str:
    """The banner's note: the groups and their block sizes, the pool, vLLM's max
    concurrency, and the plan with every layer full attention it replaces."""
    runs: list[list[Any]] = []  # [words, count] per run of equal groups, in vLLM's order
    for g, size in zip(layout.groups, layout.group_block_sizes, strict=True):
        kind = f"{g.mixer}{f' (window {g.window})' if g.window else ''} in blocks of {size}"
        if runs and runs[-1][0] == kind:
            runs[-1][1] += 1
        else:
            runs.append([kind, 1])
    kinds = " + ".join(f"{n} x {kind}" if n > 1 else kind for kind, n in runs)
    setting = config.replica.hybrid_kv_cache_manager
    block_size = config.replica.scheduler.block_size
    full_blocks = math.ceil(max_request_tokens / block_size)
    return (
        f"KV PLANNED WITH vLLM's HYBRID KV CACHE MANAGER (replica.hybrid_kv_cache_manager "
        f"{'true' if setting else 'unset: vLLM 0.33 default'}): {len(layout.groups)} KV groups "
        f"of {layout.layers_per_group} layers ({kinds}: the smaller pages' block grown to the "
        "largest page, vLLM's unify_kv_cache_spec_page_size; prefix hits land on "
        f"{layout.scheduler_block_size} tokens, requests hashed at {layout.hash_block_size}), "
        f"{layout.bytes_per_block:,} B per block: {num_blocks:,} blocks; a "
        f"{max_request_tokens:,}-token request holds {per_request} blocks, so "
        f"{num_blocks // per_request} run at once (vLLM's max concurrency), against "
        f"{plan.num_blocks:,} blocks of {full_blocks} per request, "
        f"{plan.num_blocks // full_blocks}, with --disable-hybrid-kv-cache-manager "
        "(replica.hybrid_kv_cache_manager = false)"
    )


def _blocks_needed(
    groups: tuple[KvGroup, ...], sizes: tuple[int, ...], tokens: int, in_flight: int
) -> int:
    """Blocks a request of ``tokens`` holds as the step scheduler counts them
    (``SchedulerConfig::blocks_per_request``: a window group's capped at its admission cap
    for one step in flight, each group on its own block size)."""
    total = 0
    for g, size in zip(groups, sizes, strict=True):
        required = math.ceil(tokens / size)
        if g.mixer == "sliding":
            required = min(required, math.ceil((g.window - 1 + in_flight) / size) + 1)
        total += required
    return total


def fitting_tokens(plan: MemoryPlan, num_kv_blocks: int, max_num_batched_tokens: int) -> int:
    """The longest request whose blocks over ``plan``'s groups of different block sizes fit
    ``num_kv_blocks``, each group on its own block size."""
    sizes = plan.kv_group_block_sizes
    groups = plan.kv_cache_groups
    low, high = 0, num_kv_blocks * max(sizes)
    while low < high:
        mid = (low + high + 1) // 2
        if _blocks_needed(groups, sizes, mid, max_num_batched_tokens) <= num_kv_blocks:
            low = mid
        else:
            high = mid - 1
    return low


def requests_held(config: SimulationConfig, plan: MemoryPlan, num_tokens: int) -> int:
    """Requests of ``num_tokens`` tokens each that a plan with groups of different block
    sizes holds at once (vLLM's max concurrency: ``blocks_per_request`` on each group's)."""
    layout = PagesLayout(
        plan.kv_cache_groups, plan.kv_group_block_sizes, plan.kv_cache_groups[0].layers, 0
    )
    in_flight = config.replica.scheduler.vllm_v1.max_num_batched_tokens
    return plan.num_blocks // blocks_per_request(layout, num_tokens, in_flight)
