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
``benches/peers/vllm_kv_spec_diff.py``); the simulator's runs do not use it yet: its memory plan
carries one block size (``docs/catalog.md``, "KV").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tokenyard.errors import ConfigError
from tokenyard.simulation.planner import KvGroup

__all__ = ["PagesLayout", "blocks_per_request", "pages_layout"]

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


def blocks_per_request(layout: PagesLayout, num_tokens: int, max_in_flight_tokens: int) -> int:
    """Blocks a request of ``num_tokens`` holds at most over the layout's groups, each on its
    own block size (vLLM's ``max_memory_usage_bytes`` per group, in pages)."""
    total = 0
    for g, size in zip(layout.groups, layout.group_block_sizes, strict=True):
        if g.mixer == "sliding":
            total += math.ceil(min(g.window - 1 + max_in_flight_tokens, num_tokens) / size) + 1
        elif g.mixer == "chunked":
            total += math.ceil(min(g.window + max_in_flight_tokens, num_tokens) / size)
        else:
            total += math.ceil(num_tokens / size)
    return total
