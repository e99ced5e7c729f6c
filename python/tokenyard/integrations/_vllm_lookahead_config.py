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


def refuse_partial_eagle_groups(vllm_config: Any, kv_cache_config: Any) -> None:
    """Raises ConfigError where EAGLE's drop would reach only some KV cache groups: vLLM
    0.33's ``KVCacheCoordinator`` drops in the groups flagged ``is_eagle_group`` (all of
    them when none is), and the core drops in every group or none."""
    groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or [])
    flagged = [bool(getattr(g, "is_eagle_group", False)) for g in groups]
    if len(groups) < 2 or not eagle_block_drop_of(vllm_config) or all(flagged):
        return
    if any(flagged):
        i = flagged.index(False)
        field = f"kv_cache_groups[{i}].is_eagle_group"
        raise ConfigError(
            f"{field}: False beside groups flagged as EAGLE groups; EAGLE's block drop in "
            "some groups only is not modelled (the core drops in every group or none)",
            field=field,
            value="False",
        )
