"""vLLM 0.33 KV cache groups with different block sizes (layouts whose layer kinds have
different page sizes, e.g. Gemma 4's global layers: ``unify_kv_cache_spec_page_size`` grows
the block of the layers with smaller pages).

vLLM's engine resolves two sizes (``resolve_kv_cache_block_sizes`` in
``vllm/v1/core/kv_cache_utils.py``) and hands both to the scheduler: ``block_size``, the
scheduler block size (the least common multiple of the groups'), and ``hash_block_size``,
the size requests are hashed at (``cache_config.prefix_match_unit``, else the gcd of the
prefix-cacheable groups'). The core takes the hash block size as its ``block_size`` and each
group's own (``SchedulerConfig.kv_group_block_sizes``); hits land on the least common
multiple, as ``HybridKVCacheCoordinator`` aligns them.

Served beside differing sizes besides full attention and sliding windows (since branch
``mambadiff``): a Mamba ``align`` group without a prefill checkpoint block (hits on the
scheduler block size), chunked local attention without prefix caching or on the scheduler
block size, a ``none``-mode Mamba group without prefix caching. Refused by name: other group
kinds, a Mamba prefill checkpoint block, and in particular vLLM 0.33's fine-grained partial
hash hits
(``partial_hash_hits_enabled`` in ``kv_cache_utils.py``: with prefix caching, a Mamba
``align`` block larger than the hash block, every other prefix-cached group of the hash
block size or a full-attention one), where a hit may end inside a Mamba block and vLLM's
managers copy the shared block into a private one (``_apply_cow``,
``SchedulerOutput.kv_cache_block_copies``). The core has the rules' pure pieces
(``tokenyard._core.partial_hash_hits_enabled``, ``fine_grained_hit``, the split's tail stop)
but its KV groups do not serve them yet. Speculative steps of any length are served,
EAGLE-style drafters' prefix rules (hash look-ahead, the trailing-block drop) with vLLM's partial
tail-block entries (the core's ``coordinator_sizes_tail``), and a KV connector: vLLM 0.33
has no connector rule of its own for the sizes (its loaded tokens take blocks of each
group's size, ``allocate_external_computed_blocks``; a landed load caches below the
scheduler block size's last boundary, ``get_num_cacheable_tokens``), and the core's
coordinator does the same.
"""

from __future__ import annotations

import math
from typing import Any

from tokenyard._core import partial_hash_hits_enabled
from tokenyard.errors import ConfigError
from tokenyard.kv import FullAttentionSpec, SlidingWindowSpec

__all__ = ["group_block_sizes_of"]


def _get(obj: Any, name: str, default: Any = None) -> Any:
    return getattr(obj, name, default) if obj is not None else default


def group_block_sizes_of(
    kv_cache_config: Any,
    core_groups: tuple[Any, ...],
    block_size: int,
    hash_block_size: int,
    *,
    enable_caching: bool = True,
    max_model_len: int | None = None,
) -> tuple[int, tuple[int, ...]]:
    """The core's ``block_size`` and ``kv_group_block_sizes`` for vLLM 0.33's groups:
    ``(block_size, ())`` when every group's block size is the scheduler's, else the hash
    block size and one size per group the core serves (HiSparse's source group is its host
    pool, not a group). ``block_size`` is vLLM's scheduler block size, ``hash_block_size``
    its hash block size (unused without prefix caching: vLLM's
    ``KVCacheCoordinatorNoPrefixCache`` hashes nothing, and the core then takes the groups'
    gcd). A ``"none"``-mode Mamba group whose one block covers ``max_model_len`` tokens
    (vLLM's default ``mamba_block_size`` in that mode) is counted on the scheduler's block
    size: its size is not a block grid; a shorter one takes its own size (a slot per block,
    ``MambaSpec(block_covers_request=False)``).

    Raises:
        ConfigError: a group size that vLLM's coordinator rejects
            (``KVCacheCoordinator.__init__`` asserts the scheduler block size is a multiple
            of each group's and of the hash block size; ``HybridKVCacheCoordinator.__init__``
            that each prefix-cacheable group's is a multiple of the hash block size), or
            differing sizes beside a group kind the core does not serve with them.
    """
    groups = [
        g
        for g in (_get(kv_cache_config, "kv_cache_groups", []) or [])
        if _get(_get(g, "role"), "name") != "HISPARSE_SOURCE"
    ]
    sizes: list[int] = []
    for group in groups:
        spec = _get(group, "kv_cache_spec")
        size = _get(spec, "block_size")
        whole_request = (
            type(spec).__name__ == "MambaSpec"
            and _get(spec, "mamba_cache_mode", "none") == "none"
            and max_model_len is not None
            and size is not None
            and int(size) >= max_model_len
        )
        sizes.append(block_size if size is None or whole_request else int(size))
    if not core_groups:
        # One full-attention group: the single pool, on the scheduler's block size.
        if sizes and sizes[0] != block_size:
            raise _refuse(0, sizes[0], f"differs from the scheduler's {block_size}")
        return block_size, ()
    if not enable_caching:
        hash_block_size = math.gcd(*sizes)
    for i, size in enumerate(sizes):
        if block_size % size:
            raise _refuse(i, size, f"does not divide the scheduler block size {block_size}")
        cacheable = bool(_get(_get(groups[i], "kv_cache_spec"), "prefix_cacheable", True))
        if cacheable and size % hash_block_size:
            raise _refuse(i, size, f"is not a multiple of hash_block_size={hash_block_size}")
    if all(size == block_size for size in sizes) and hash_block_size == block_size:
        return block_size, ()
    if (
        enable_caching
        and len(core_groups) == len(sizes)
        and partial_hash_hits_enabled(list(core_groups), sizes, hash_block_size)
    ):
        raise _refuse_partial_hits(core_groups, sizes, hash_block_size)
    for i, spec in enumerate(core_groups):
        why = _unserved_beside_sizes(spec, sizes[i], block_size, enable_caching)
        if why is None:
            continue
        field = f"kv_cache_groups[{i}].kv_cache_spec"
        raise ConfigError(
            f"{field}: {type(spec).__name__} beside groups of different block sizes "
            f"{tuple(sizes)} is not modelled ({why})",
            field=field,
            value=type(spec).__name__,
        )
    return hash_block_size, tuple(sizes)


def _unserved_beside_sizes(
    spec: Any, size: int, block_size: int, enable_caching: bool
) -> str | None:
    """Why the core does not serve the group beside differing block sizes, or ``None``.

    Served: full attention and sliding windows; a ``none``-mode Mamba group without prefix
    caching (vLLM 0.33's ``MambaManager`` outside align mode: one state block, or a slot per
    block of its own size); a Mamba ``align`` group without a prefill checkpoint block (its
    hits land on the scheduler block size, ``MambaManager.find_longest_cache_hit`` passing
    over states off that grid; the partial-hash-hit layout is refused before this); chunked
    local attention without prefix caching, or on the scheduler block size
    (``ChunkedLocalAttentionManager.find_longest_cache_hit`` asserts its block is the hit
    alignment, so any other size fails at vLLM's first lookup)."""
    kind = type(spec).__name__
    if isinstance(spec, (FullAttentionSpec, SlidingWindowSpec)) and not getattr(
        spec, "bounded_replay", False
    ):
        return None
    if kind == "MambaSpec" and getattr(spec, "mamba_cache_mode", "none") == "none":
        return None if not enable_caching else "a none-mode Mamba group under prefix caching"
    if kind == "MambaSpec":
        if getattr(spec, "prefill_checkpoint_alignment", None) is not None:
            return "a Mamba align prefill checkpoint block beside them"
        return None
    if kind == "ChunkedLocalAttentionSpec":
        if not enable_caching or size == block_size:
            return None
        return (
            f"under prefix caching chunked local attention takes the scheduler block size "
            f"{block_size}: vLLM 0.33's ChunkedLocalAttentionManager asserts it at its first "
            "lookup"
        )
    return (
        "only full-attention, sliding-window, Mamba (none mode without prefix caching, align "
        "mode) and chunked local attention groups take their own block size; a Mamba state "
        "larger than the hash block is vLLM's partial hash hit with copy-on-write, on only "
        "with cache_config.prefix_match_unit below the Mamba block size"
    )


def _refuse_partial_hits(
    core_groups: tuple[Any, ...], sizes: list[int], hash_block_size: int
) -> ConfigError:
    """The refusal of vLLM 0.33's fine-grained partial hash hits, naming the hash block
    size (``cache_config.prefix_match_unit``, else the groups' gcd) and the Mamba block."""
    mamba = next(
        size
        for spec, size in zip(core_groups, sizes, strict=True)
        if getattr(spec, "mamba_cache_mode", None) == "align" and size > hash_block_size
    )
    advice = (
        f" (set cache_config.prefix_match_unit={mamba}: every group's block size is {mamba})"
        if all(size == mamba for size in sizes)
        else ""
    )
    return ConfigError(
        f"hash_block_size: {hash_block_size} (cache_config.prefix_match_unit, else the groups' "
        f"gcd) below the Mamba align block of {mamba} turns on vLLM 0.33's fine-grained partial "
        "hash hits (partial_hash_hits_enabled), whose hits end inside Mamba blocks and copy the "
        "shared state block (copy-on-write); not served yet" + advice,
        field="hash_block_size",
        value=str(hash_block_size),
    )


def _refuse(i: int, size: int, why: str) -> ConfigError:
    field = f"kv_cache_groups[{i}].kv_cache_spec.block_size"
    return ConfigError(f"{field}: {size} {why}", field=field, value=str(size))
