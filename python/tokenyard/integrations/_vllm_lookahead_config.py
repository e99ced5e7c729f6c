"""vLLM 0.33's EAGLE/EAGLE3/MTP prefix-cache settings read off its configs
(``VllmConfig.num_hash_lookahead_tokens``, ``Scheduler.use_eagle_block_drop``), for the
config translation (``_vllm_translate``, importable without vLLM) and the adapter's
look-ahead (``_vllm_lookahead``, which says what the rules are)."""

from __future__ import annotations

from typing import Any

from tokenyard.errors import ConfigError


def hash_lookahead_of(vllm_config: Any) -> int:
    """vLLM 0.33's ``VllmConfig.num_hash_lookahead_tokens`` (0 where the config has none)."""
    return int(getattr(vllm_config, "num_hash_lookahead_tokens", 0) or 0)


def eagle_block_drop(vllm_config: Any) -> bool:
    """vLLM 0.33's ``Scheduler.use_eagle_block_drop``: the speculative config's, off when
    hash look-ahead tokens prove the boundary token (what the Mamba ``align`` split reads)."""
    speculative = getattr(vllm_config, "speculative_config", None)
    if speculative is None or hash_lookahead_of(vllm_config) > 0:
        return False
    use_drop = getattr(speculative, "use_eagle_block_drop", None)
    return bool(use_drop()) if callable(use_drop) else False


def eagle_block_drop_of(vllm_config: Any) -> bool:
    """:func:`eagle_block_drop` as it reaches the KV cache manager (``use_eagle``): only
    with prefix caching, where it changes the hits."""
    caching = getattr(vllm_config.cache_config, "enable_prefix_caching", False)
    return eagle_block_drop(vllm_config) and bool(caching)


def eagle_groups_of(
    vllm_config: Any, kv_cache_config: Any, num_core_groups: int
) -> tuple[bool, ...]:
    """The core's ``kv_group_is_eagle`` for vLLM 0.33's groups: where EAGLE's block drop
    acts. vLLM's ``KVCacheCoordinator.__init__`` drops in the groups flagged
    ``is_eagle_group`` (``drop_eagle_group_ids``; all of them when none is), a spec group
    when any member is (``verify_and_split_kv_cache_groups``). ``()`` (every group) without
    the drop, with fewer than two core groups, or with every group flagged; else one flag
    per core group (the HiSparse source group, the core's host pool, is none).

    Raises:
        ConfigError: the only flagged group is the HiSparse source group (not a core
            group), naming ``kv_cache_groups[i].is_eagle_group``.
    """
    groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or [])
    flagged = [bool(getattr(g, "is_eagle_group", False)) for g in groups]
    if num_core_groups < 2 or not eagle_block_drop_of(vllm_config) or all(flagged):
        return ()
    if not any(flagged):
        return ()
    source = [_is_hisparse_source(g) for g in groups]
    core = tuple(flag for flag, skip in zip(flagged, source, strict=True) if not skip)
    if not any(core):
        i = flagged.index(True)
        field = f"kv_cache_groups[{i}].is_eagle_group"
        raise ConfigError(
            f"{field}: True on the HiSparse source group alone, which is the core's host "
            "pool, not a KV group; EAGLE's drop there is not modelled",
            field=field,
            value="True",
        )
    return core if not all(core) else ()


def _is_hisparse_source(group: Any) -> bool:
    """vLLM 0.33's ``KVCacheGroupRole.HISPARSE_SOURCE`` (``_vllm_translate._role``)."""
    return getattr(getattr(group, "role", None), "name", None) == "HISPARSE_SOURCE"
