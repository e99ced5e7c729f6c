"""Hybrid KV cache layouts of one block size whose groups vLLM 0.33 flags as EAGLE groups in
part (``KVCacheGroupSpec.is_eagle_group``), for ``vllm_adapter_diff.py --layout``. vLLM's
``KVCacheCoordinator.__init__`` drops EAGLE's block only in the flagged groups (all of them
when none is: ``drop_eagle_group_ids``), a spec group when any member is
(``HybridKVCacheCoordinator.verify_and_split_kv_cache_groups``); a chunked local attention
group may stand beside the drop only unflagged (``ChunkedLocalAttentionManager`` asserts).

Layouts (blocks of 16; ``*`` marks an EAGLE group):

- ``full-eagle``: full attention* beside a window of 128 (gpt-oss's layout, its window not the
  drafter's);
- ``window-eagle``: full attention beside a window of 32*;
- ``windows-partial``: full attention*, windows of 32 and of 80*;
- ``chunked``: full attention* beside chunked local attention (chunks of 64);
- ``chunked-window``: full attention, chunked local attention (chunks of 32) and a window of
  48*.
"""

from __future__ import annotations

from typing import Any

BLOCK = 16

#: Per layout: (kind, size: window or chunk, is_eagle_group) of each group.
LAYOUTS: dict[str, list[tuple[str, int, bool]]] = {
    "full-eagle": [("full", 0, True), ("window", 128, False)],
    "window-eagle": [("full", 0, False), ("window", 32, True)],
    "windows-partial": [("full", 0, True), ("window", 32, False), ("window", 80, True)],
    "chunked": [("full", 0, True), ("chunked", 64, False)],
    "chunked-window": [("full", 0, False), ("chunked", 32, False), ("window", 48, True)],
}


def groups_of(layout: str) -> list[Any]:
    """vLLM's ``KVCacheGroupSpec`` list for ``layout``."""
    import torch
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        FullAttentionSpec,
        KVCacheGroupSpec,
        SlidingWindowSpec,
    )

    groups = []
    for i, (kind, size, eagle) in enumerate(LAYOUTS[layout]):
        common = {"block_size": BLOCK, "num_kv_heads": 1, "head_size": 1, "dtype": torch.float16}
        if kind == "full":
            spec: Any = FullAttentionSpec(**common)
        elif kind == "window":
            spec = SlidingWindowSpec(sliding_window=size, **common)
        else:
            spec = ChunkedLocalAttentionSpec(attention_chunk_size=size, **common)
        groups.append(KVCacheGroupSpec([f"layers.{i}"], spec, is_eagle_group=eagle))
    return groups


def install(layout: str) -> None:
    """Makes ``vllm_peer.VllmSchedulerPeer`` build both schedulers over ``layout`` (blocks of
    16, hashed at 16, as the peer's requests are)."""
    import vllm_peer
    from vllm.v1.kv_cache_interface import KVCacheConfig

    def layout_build(self: Any, cls: type, kv_cache_config: Any, **kw: Any) -> Any:
        from vllm.v1.structured_output import StructuredOutputManager

        config = KVCacheConfig(
            num_blocks=kv_cache_config.num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=groups_of(layout),
        )
        # vLLM's engine picks AsyncScheduler when async scheduling is on, and its window
        # groups' admission cap counts two batches in flight then.
        self.vllm_config.scheduler_config.async_scheduling = "Async" in cls.__name__
        return cls(
            vllm_config=self.vllm_config,
            kv_cache_config=config,
            structured_output_manager=StructuredOutputManager(self.vllm_config),
            block_size=BLOCK,
            hash_block_size=BLOCK,
            log_stats=kw.get("log_stats", True),
        )

    vllm_peer.VllmSchedulerPeer.build = layout_build  # type: ignore[method-assign]
