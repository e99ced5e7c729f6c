"""vLLM 0.33's hybrid layout for attention layers of different page sizes
(``simulation/hybrid_kv_pages``), by hand on Gemma-4-26B-A4B (bf16 KV, block 16): a sliding
layer caches 8,192 B a token (a 131,072 B page), a global layer 4,096 B (65,536 B), so
``unify_kv_cache_spec_page_size`` gives the global layers blocks of 32; 25 sliding layers and
5 global ones make five sliding groups and one full group of 5 layers, a block of
5 x 131,072 = 655,360 B. ``benches/peers/vllm_kv_spec_diff.py`` checks the same against
vLLM's own planner (98,304 blocks in 60 GiB)."""

from __future__ import annotations

import pytest

from tokenyard.catalog import model
from tokenyard.errors import ConfigError
from tokenyard.simulation.hybrid_kv_pages import blocks_per_request, pages_layout
from tokenyard.simulation.planner import KvGroup, dtype_bytes, kv_groups


def gemma4() -> tuple[KvGroup, ...]:
    spec = model("google/gemma-4-26B-A4B")
    return kv_groups(spec, 1, 1, dtype_bytes("bf16", "bf16")[1])


def test_gemma4_global_layers_get_the_larger_block() -> None:
    layout = pages_layout(gemma4(), 16, "gemma-4")
    assert [g.mixer for g in layout.groups] == ["sliding"] * 5 + ["gqa"]
    assert layout.group_block_sizes == (16, 16, 16, 16, 16, 32)
    assert (layout.layers_per_group, layout.bytes_per_block) == (5, 655_360)
    assert (layout.scheduler_block_size, layout.hash_block_size) == (32, 16)
    assert (60 << 30) // layout.bytes_per_block == 98_304


def test_a_request_holds_blocks_of_each_groups_size() -> None:
    layout = pages_layout(gemma4(), 16, "gemma-4")
    # 32,768 tokens, 1 in flight: each sliding group ceil(1,024 / 16) + 1 = 65, the full
    # group ceil(32,768 / 32) = 1,024.
    assert blocks_per_request(layout, 32_768, 1) == 5 * 65 + 1_024


def test_pages_that_do_not_divide_the_largest_or_beside_state_are_refused() -> None:
    odd = (KvGroup("sliding", 2, 2 * 300, 64), KvGroup("gqa", 2, 2 * 200, 0))
    with pytest.raises(ConfigError, match="do not divide"):
        pages_layout(odd, 16, "odd")
    state = (KvGroup("gqa", 2, 2 * 256, 0), KvGroup("gdn", 2, 0, 0, 1 << 20))
    with pytest.raises(ConfigError, match="linear-attention state"):
        pages_layout(state, 16, "state")
