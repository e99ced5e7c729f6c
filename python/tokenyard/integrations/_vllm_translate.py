"""What the vLLM adapter translates without importing vLLM: its configs into a
``tokenyard.sched.SchedulerConfig``, the id arguments its scheduler interface takes, and the
core's block ids as vLLM numbers them.

Everything here reads vLLM's objects by attribute (``VllmConfig``, ``KVCacheConfig``), so it
runs, and is tested, where vLLM is not installed. :mod:`tokenyard.integrations.vllm` builds
the scheduler class itself on top of it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tokenyard.errors import ConfigError
from tokenyard.integrations._vllm_block_sizes import group_block_sizes_of
from tokenyard.integrations._vllm_lookahead_config import (
    eagle_block_drop_of,
    eagle_groups_of,
    hash_lookahead_of,
)
from tokenyard.kv import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    HiSparseHotSpec,
    HiSparseResidentSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from tokenyard.sched import SchedulerConfig

__all__ = [
    "VllmSettings",
    "core_config",
    "core_prompt",
    "hisparse_source_group",
    "kv_groups_of",
    "local_prefill_interval",
    "request_id_list",
    "vllm_block_ids",
]


@dataclass(frozen=True)
class VllmSettings:
    """The parts of vLLM's configs the adapter acts on, beside the core's config."""

    max_num_running_reqs: int
    """vLLM's ``max_num_seqs`` (model-runner slots)."""
    max_num_active_reqs: int
    """Admission cap: ``max_num_active_seqs``, else ``max_num_seqs``."""
    max_num_scheduled_tokens: int
    max_model_len: int
    """The model's ``max_model_len`` (vLLM's scheduler reads the model config's)."""
    num_spec_tokens: int
    num_lookahead_tokens: int
    async_scheduling: bool
    enable_prefix_caching: bool
    policy: str
    num_blocks: int
    block_size: int
    kv_groups: tuple[Any, ...] = ()
    """The core's ``kv_groups`` (``()``: one full-attention group, the single pool)."""
    kv_group_block_sizes: tuple[int, ...] = ()
    """Each group's block size when they differ (``block_size`` is then the hash block
    size); ``()`` otherwise."""
    kv_group_is_eagle: tuple[bool, ...] = ()
    """The groups EAGLE's drop acts in (``eagle_groups_of``); ``()``: every group."""


def _get(obj: Any, name: str, default: Any = None) -> Any:
    return getattr(obj, name, default) if obj is not None else default


def settings(
    vllm_config: Any,
    kv_cache_config: Any,
    block_size: int,
    *,
    async_scheduling: bool = False,
    hash_block_size: int | None = None,
) -> VllmSettings:
    """Reads what the adapter needs from vLLM's ``VllmConfig`` and ``KVCacheConfig``;
    ``async_scheduling=True`` turns async scheduling on whatever the config says (the
    scheduler class decides it, as vLLM's ``AsyncScheduler`` does). ``block_size`` is vLLM's
    scheduler block size, ``hash_block_size`` (default: it) the one requests are hashed at;
    groups of different block sizes take theirs (:mod:`._vllm_block_sizes`).

    Raises:
        ConfigError: a KV cache group the core has no kind for (:func:`kv_groups_of`), a
            Mamba or cross-attention group with prefix caching on, or a value of the wrong
            type.
    """
    sched = vllm_config.scheduler_config
    cache = vllm_config.cache_config
    model = vllm_config.model_config
    kv_groups = kv_groups_of(
        kv_cache_config,
        block_size,
        max_in_flight_tokens=_get(vllm_config, "max_in_flight_tokens"),
        max_model_len=int(model.max_model_len),
    )
    core_block_size, group_sizes = group_block_sizes_of(
        kv_cache_config,
        kv_groups,
        int(block_size),
        int(hash_block_size or block_size),
        enable_caching=bool(_get(cache, "enable_prefix_caching", False)),
        max_model_len=int(model.max_model_len),
    )
    plain_mamba = any(isinstance(g, MambaSpec) and g.mamba_cache_mode == "none" for g in kv_groups)
    if plain_mamba and _get(cache, "enable_prefix_caching"):
        # vLLM 0.33's MambaManager asserts mamba_cache_mode == "align" or caching off.
        raise ConfigError(
            "cache_config.enable_prefix_caching: a Mamba group (mamba_cache_mode='none') "
            "is served with prefix caching off, as vLLM's MambaManager requires",
            field="cache_config.enable_prefix_caching",
            value="True",
        )
    if any(isinstance(g, CrossAttentionSpec) for g in kv_groups) and _get(
        cache, "enable_prefix_caching"
    ):
        # vLLM 0.33's CrossAttentionManager finds no hit and caches nothing (it raises):
        # an encoder-decoder model runs with prefix caching off.
        raise ConfigError(
            "cache_config.enable_prefix_caching: a cross-attention group (an encoder-decoder "
            "model) is served with prefix caching off, as vLLM's CrossAttentionManager "
            "requires",
            field="cache_config.enable_prefix_caching",
            value="True",
        )
    # vLLM's KVCacheManager sizes its block pool by the KV cache config's num_blocks.
    num_blocks = _get(kv_cache_config, "num_blocks") or _get(cache, "num_gpu_blocks")
    max_num_seqs = int(sched.max_num_seqs)
    active = _get(sched, "max_num_active_seqs")
    scheduled = _get(sched, "max_num_scheduled_tokens")
    return VllmSettings(
        max_num_running_reqs=max_num_seqs,
        max_num_active_reqs=int(active) if active is not None else max_num_seqs,
        max_num_scheduled_tokens=int(
            scheduled if scheduled is not None else sched.max_num_batched_tokens
        ),
        max_model_len=int(model.max_model_len),
        num_spec_tokens=int(_get(vllm_config, "num_speculative_tokens", 0) or 0),
        num_lookahead_tokens=int(_get(vllm_config, "num_lookahead_tokens", 0) or 0),
        async_scheduling=async_scheduling or bool(_get(sched, "async_scheduling", False)),
        enable_prefix_caching=bool(_get(cache, "enable_prefix_caching", False)),
        policy=str(_get(sched, "policy", "fcfs")),
        num_blocks=int(num_blocks),
        block_size=core_block_size,
        kv_groups=kv_groups,
        kv_group_block_sizes=group_sizes,
        kv_group_is_eagle=eagle_groups_of(vllm_config, kv_cache_config, len(kv_groups)),
    )


def core_config(
    vllm_config: Any,
    kv_cache_config: Any,
    block_size: int,
    *,
    async_scheduling: bool = False,
    max_num_encoder_input_tokens: int = 0,
    encoder_cache_size: int = 0,
    hash_block_size: int | None = None,
) -> SchedulerConfig:
    """tokenyard's ``SchedulerConfig`` for a vLLM 0.33 ``VllmConfig`` and ``KVCacheConfig``.

    Field by field: the admission cap is ``max_num_active_seqs`` (else ``max_num_seqs``);
    the two budgets are vLLM's: ``max_num_batched_tokens`` (its input budget: tokens and
    draft slots) and ``max_num_scheduled_tokens`` (its token budget, else
    ``max_num_batched_tokens``);
    ``num_blocks`` is vLLM's ``num_gpu_blocks``, its null block included (tokenyard's
    ``reserve_null_block`` sets it aside the same way); ``max_model_len`` is the model
    config's (a KV cache that holds less is accepted, as vLLM's ``Scheduler`` accepts it: a
    request that outgrows the cache is never admitted, or preempts itself) capped, with
    chunked prefill off, at the token budget (vLLM's own ``SchedulerConfig`` refuses a
    longer one then; the smaller budget here). The rest keep vLLM's names.

    Raises:
        ConfigError: see :func:`settings`; the core's own checks run when the scheduler is
            built.
    """
    s = settings(
        vllm_config,
        kv_cache_config,
        block_size,
        async_scheduling=async_scheduling,
        hash_block_size=hash_block_size,
    )
    sched = vllm_config.scheduler_config
    max_model_len = s.max_model_len
    chunked = bool(_get(sched, "enable_chunked_prefill", True))
    if not chunked:
        # vLLM's own SchedulerConfig refuses a budget below max_model_len with chunked
        # prefill off; its tests get past that by giving the scheduler config a shorter
        # max_model_len than the model config's. Sequences are capped at the budget then.
        max_model_len = min(
            max_model_len, s.max_num_scheduled_tokens, int(sched.max_num_batched_tokens)
        )
    max_model_len = max(max_model_len, 2)
    return SchedulerConfig(
        max_num_seqs=s.max_num_active_reqs,
        max_num_batched_tokens=int(sched.max_num_batched_tokens),
        max_num_scheduled_tokens=s.max_num_scheduled_tokens,
        long_prefill_token_threshold=int(_get(sched, "long_prefill_token_threshold", 0) or 0),
        long_prefill_token_threshold_adaptive=bool(
            _get(sched, "long_prefill_token_threshold_adaptive", False)
        ),
        enable_chunked_prefill=chunked,
        policy="priority" if s.policy == "priority" else "fcfs",
        priority_ties="vllm",
        enable_prefix_caching=s.enable_prefix_caching,
        prefix_cache="block_hash",
        block_size=s.block_size,
        num_blocks=s.num_blocks,
        max_model_len=max_model_len,
        # vLLM 0.33 keeps no room for a sampled token under a pooling or diffusion model.
        num_sampled_tokens_per_step=0 if _samples_nothing(vllm_config) else 1,
        num_lookahead_tokens=s.num_lookahead_tokens,
        num_speculative_tokens=s.num_spec_tokens,
        pad_spec_decode=_pads_spec_decode(vllm_config),
        max_loras=int(_get(_get(vllm_config, "lora_config"), "max_loras", 0) or 0),
        scheduler_reserve_full_isl=bool(_get(sched, "scheduler_reserve_full_isl", True)),
        reserve_null_block=True,
        async_scheduling=s.async_scheduling,
        kv_groups=s.kv_groups,
        kv_group_block_sizes=s.kv_group_block_sizes,
        kv_group_is_eagle=s.kv_group_is_eagle,
        kv_window_extra_retained_tokens=window_extra_retained_tokens(kv_cache_config),
        max_num_encoder_input_tokens=max_num_encoder_input_tokens,
        encoder_cache_size=encoder_cache_size,
        disable_chunked_mm_input=bool(_get(sched, "disable_chunked_mm_input", False)),
        prefill_schedule_interval=local_prefill_interval(vllm_config),
        # vLLM 0.33's EAGLE/MTP prefix-cache rules (_vllm_lookahead); the drafter's prefill
        # look-ahead at construction also sets the re-prefillable lag, as vLLM's
        # coordinator reads it once.
        num_prefill_lookahead=int(_get(vllm_config, "num_prefill_lookahead_tokens", 0) or 0),
        num_hash_lookahead_tokens=hash_lookahead_of(vllm_config),
        eagle_block_drop=eagle_block_drop_of(vllm_config),
    )


def kv_groups_of(
    kv_cache_config: Any,
    block_size: int,
    *,
    max_in_flight_tokens: int | None = None,
    max_model_len: int | None = None,
) -> tuple[Any, ...]:
    """The core's ``kv_groups`` for vLLM 0.33's ``kv_cache_config.kv_cache_groups``, spec by
    spec: ``FullAttentionSpec`` (``MLAAttentionSpec`` too) → ``FullAttentionSpec()``,
    ``SlidingWindowSpec`` → ``SlidingWindowSpec(sliding_window=...)``,
    ``SlidingWindowMLASpec`` → the same, ``bounded_replay=True`` where vLLM's spec has it,
    ``ChunkedLocalAttentionSpec`` → ``ChunkedLocalAttentionSpec(attention_chunk_size=...)``,
    ``MambaSpec`` → ``MambaSpec(mamba_cache_mode=...)`` (``"none"`` or ``"align"``, with its
    ``num_speculative_blocks`` and, in align mode, its prefill checkpoint block),
    ``CrossAttentionSpec`` →
    ``CrossAttentionSpec()`` (blocks for a request's encoder tokens under
    ``is_encoder_decoder``), vLLM 0.33's HiSparse layout: the source group
    (``KVCacheGroupRole.HISPARSE_SOURCE``) is the core's host page pool, not a group
    (:func:`hisparse_source_group`), its indexer a ``FullAttentionSpec()``,
    ``HiSparseResidentSpec`` → ``HiSparseResidentSpec(max_admission_blocks=...)`` (vLLM's
    ``max_admission_blocks_per_request`` for ``max_in_flight_tokens``, vLLM's
    ``KVCacheManager`` defaulting it to ``max_model_len``), ``HiSparseHotSpec`` →
    ``HiSparseHotSpec(blocks_per_request=...)``. ``()`` for no group or
    one full-attention group: the core's single pool, as before groups existed. A
    ``"none"``-mode Mamba group whose block holds ``max_model_len`` tokens or more (vLLM's
    default ``mamba_block_size`` in that mode) is one block, ``1 + num_speculative_blocks``
    under speculation, covering the request; a shorter block is
    ``MambaSpec(block_covers_request=False)``: a slot per block, all but the last state's
    nulled, as vLLM's none-mode ``MambaManager`` allocates it.

    Raises:
        ConfigError: a spec kind the core has no group for (uniform-type spec lists,
            ...), named; a static-sink spec (vLLM 0.33's own scheduler fails to build its
            manager); a Mamba prefill checkpoint block without its alignment. Block sizes
            are checked by
            :func:`tokenyard.integrations._vllm_block_sizes.group_block_sizes_of`.
    """
    groups = list(_get(kv_cache_config, "kv_cache_groups", []) or [])
    specs: list[Any] = []
    for i, group in enumerate(groups):
        spec = _get(group, "kv_cache_spec")
        kind = type(spec).__name__
        field = f"kv_cache_groups[{i}].kv_cache_spec"

        def refuse(what: str, field: str = field, kind: str = kind) -> ConfigError:
            return ConfigError(f"{field}: {what} ({kind})", field=field, value=kind)

        if _role(group) == "HISPARSE_SOURCE":
            # The host page pool (_vllm_hisparse), beside the device groups.
            continue
        if kind == "HiSparseResidentSpec":
            limit = max_model_len if max_model_len is not None else 1 << 30
            in_flight = max_in_flight_tokens if max_in_flight_tokens is not None else limit
            cap = spec.max_admission_blocks_per_request(
                max_in_flight_tokens=int(in_flight), max_model_len=int(limit)
            )
            specs.append(HiSparseResidentSpec(max_admission_blocks=int(cap)))
        elif kind == "HiSparseHotSpec":
            specs.append(HiSparseHotSpec(blocks_per_request=int(spec.blocks_per_request)))
        elif kind in ("FullAttentionSpec", "MLAAttentionSpec"):
            # A window or chunk on a full-attention spec is vLLM's layout with its hybrid
            # manager off (unify_hybrid_kv_cache_specs): FullAttentionManager keeps every
            # block, and only the KV events' metadata reads the window.
            specs.append(FullAttentionSpec())
        elif kind == "SinkFullAttentionSpec":
            # SinkFullAttentionManager is a FullAttentionManager, but vLLM 0.33's
            # coordinator cannot build it (its __init__ does not take the
            # needs_kv_cache_zeroing every manager is given: a TypeError in Scheduler's
            # constructor), so no vLLM scheduler serves this layout to agree with.
            raise refuse("vLLM 0.33's own Scheduler cannot build SinkFullAttentionManager")
        elif kind in ("SlidingWindowSpec", "SlidingWindowMLASpec"):
            # SlidingWindowMLASpec(bounded_replay=True) (DeepSeek-V4.1): not prefix-cached,
            # rebuilt by replaying a hit's last window (prefix_replay_tokens == window).
            replay = int(_get(spec, "prefix_replay_tokens", 0) or 0)
            window = int(spec.sliding_window)
            if replay not in (0, window):
                raise refuse(f"prefix replay of {replay} tokens with a {window}-token window")
            specs.append(SlidingWindowSpec(sliding_window=window, bounded_replay=bool(replay)))
        elif kind == "ChunkedLocalAttentionSpec":
            specs.append(
                ChunkedLocalAttentionSpec(attention_chunk_size=int(spec.attention_chunk_size))
            )
        elif kind == "CrossAttentionSpec":
            specs.append(CrossAttentionSpec())
        elif kind == "MambaSpec":
            mode = _get(spec, "mamba_cache_mode", "none")
            if mode not in ("none", "align"):
                raise refuse(f"mamba_cache_mode={mode!r} is not supported ('none' or 'align')")
            # vLLM 0.33's MambaManager: draft-token state blocks in either mode; the internal
            # prefill checkpoint block only in align mode (ignored in "none", as vLLM does).
            checkpoint = mode == "align" and int(
                _get(spec, "num_prefill_checkpoint_blocks", 0) or 0
            )
            alignment = _get(spec, "prefill_checkpoint_alignment") if checkpoint else None
            if checkpoint and alignment is None:
                # vLLM never takes a checkpoint without an alignment (is_mamba_prefill_
                # checkpoint_valid is False) but counts the block: not modelled.
                raise refuse("a prefill checkpoint block without prefill_checkpoint_alignment")
            # vLLM's manager reserves at most one checkpoint block however many are counted.
            # A none-mode block shorter than max_model_len: vLLM's MambaManager allocates a
            # slot per block and nulls all but the last state (block_covers_request=False).
            size = _get(spec, "block_size")
            short = max_model_len is not None and size is not None and int(size) < max_model_len
            specs.append(
                MambaSpec(
                    mamba_cache_mode=mode,
                    num_speculative_blocks=int(_get(spec, "num_speculative_blocks", 0) or 0),
                    num_prefill_checkpoint_blocks=min(int(checkpoint), 1),
                    prefill_checkpoint_alignment=None if alignment is None else int(alignment),
                    block_covers_request=mode == "align" or not short,
                )
            )
        else:
            raise refuse("tokenyard's scheduler has no KV group of this kind")
    if len(specs) == 1 and isinstance(specs[0], FullAttentionSpec):
        return ()
    return tuple(specs)


def window_extra_retained_tokens(kv_cache_config: Any) -> int:
    """The ``extra_retained_tokens`` of the sliding-window groups (vLLM 0.33's planning
    tags every ``SlidingWindowSpec`` with the same ``max(0, num_prefill_lookahead_tokens -
    1)``): the core keeps one value for all its windows.

    Raises:
        ConfigError: two windows retaining different counts, the second named
            (``kv_cache_groups[i].kv_cache_spec.extra_retained_tokens``).
    """
    found: int | None = None
    for i, group in enumerate(_get(kv_cache_config, "kv_cache_groups", []) or []):
        spec = _get(group, "kv_cache_spec")
        if type(spec).__name__ not in ("SlidingWindowSpec", "SlidingWindowMLASpec"):
            continue
        extra = int(_get(spec, "extra_retained_tokens", 0) or 0)
        if found is not None and extra != found:
            field = f"kv_cache_groups[{i}].kv_cache_spec.extra_retained_tokens"
            raise ConfigError(
                f"{field}: windows retaining different counts ({found} before, {extra} "
                "here) are not supported (vLLM's planning gives every window one)",
                field=field,
                value=str(extra),
            )
        found = extra
    return found or 0


def _role(group: Any) -> str | None:
    """The name of a vLLM 0.33 ``KVCacheGroupSpec.role`` (``None`` without one)."""
    return getattr(getattr(group, "role", None), "name", None)


def hisparse_source_group(kv_cache_config: Any) -> int | None:
    """The index of vLLM 0.33's HiSparse source group (``HISPARSE_SOURCE``, the host
    pages) among ``kv_cache_config.kv_cache_groups``, or ``None``."""
    for i, group in enumerate(_get(kv_cache_config, "kv_cache_groups", []) or []):
        if _role(group) == "HISPARSE_SOURCE":
            return i
    return None


def local_prefill_interval(vllm_config: Any) -> int:
    """vLLM 0.33's ``local_prefill_interval``: ``prefill_schedule_interval`` without data
    parallelism, else 1 (a DP engine core drives the cadence through ``throttle_prefills``)."""
    interval = int(_get(vllm_config.scheduler_config, "prefill_schedule_interval", 1) or 1)
    dp = int(_get(_get(vllm_config, "parallel_config"), "data_parallel_size", 1) or 1)
    return interval if dp == 1 else 1


def _pads_spec_decode(vllm_config: Any) -> bool:
    """vLLM 0.33 pads one-token admissions to ``1 + k`` unless ``k`` varies with the batch
    size (``num_speculative_tokens_per_batch_size``, not modelled: ``k`` is fixed here) or
    the model samples no token per step (pooling and diffusion models, whose drafts are not
    rejectable)."""
    spec = _get(vllm_config, "speculative_config")
    if _get(spec, "num_speculative_tokens_per_batch_size"):
        return False
    return not _samples_nothing(vllm_config)


def _samples_nothing(vllm_config: Any) -> bool:
    """vLLM 0.33's ``num_sampled_tokens_per_step == 0`` (``Scheduler.__init__``): a pooling
    or diffusion model appends no sampled token after its prefill."""
    model = _get(vllm_config, "model_config")
    return _get(model, "runner_type") == "pooling" or bool(_get(model, "is_diffusion", False))


def request_id_list(request_ids: str | Iterable[str] | None, every: Iterable[str]) -> list[str]:
    """vLLM's ``finish_requests`` argument as a list: one id (a ``str`` is one id, never its
    characters), an iterable of ids (duplicates dropped, order kept), or ``None`` for
    ``every`` id."""
    if request_ids is None:
        return list(every)
    if isinstance(request_ids, str):
        return [request_ids]
    return list(dict.fromkeys(request_ids))


#: Token ids the core sees at placeholder positions start here (above any vocabulary).
_MM_TOKEN_BASE = 1 << 31


def key_tokens(tokens: list[int], start: int, end: int, range_base: int, digest: bytes) -> None:
    """Replaces ``tokens[start:end]`` by consecutive ids from a point of ``[range_base,
    range_base + 2**30)`` the 4-byte ``digest`` picks: what the core keys blocks by where
    vLLM adds extra keys (multimodal items, prompt embeddings, cache salts) to a block's
    hash. Equal digests give equal ids; distinct ones collide with chance 2**-30."""
    first = range_base + (int.from_bytes(digest, "little") >> 2)
    for i in range(start, end):
        tokens[i] = (first + i - start) % (1 << 32)


def core_prompt(prompt_token_ids: list[int], mm_features: Any) -> list[int]:
    """The prompt the core gets for a multimodal request under prefix caching: each item's
    placeholder tokens replaced by ids made from its identifier and the position within
    the item. vLLM keys a block's hash by the items it holds and where they start
    (``_gen_mm_extra_hash_keys``, ``("mm", identifier, start offset)``); the core keys
    blocks by tokens alone, so two prompts with one placeholder id and different images
    would otherwise share blocks. The core never hands prompt tokens back to vLLM."""
    if not mm_features:
        return prompt_token_ids
    tokens = list(prompt_token_ids)
    for feature in mm_features:
        digest = hashlib.blake2b(str(feature.identifier).encode(), digest_size=4).digest()
        position = feature.mm_position
        end = min(position.offset + position.length, len(tokens))
        key_tokens(tokens, position.offset, end, _MM_TOKEN_BASE, digest)
    return tokens


def stop_rules(params: Any) -> dict[str, Any]:
    """The core's stop rules beyond EOS, stop ids and length for a request's
    ``SamplingParams``: its ``repetition_detection`` as ``(max_pattern_size,
    min_pattern_size, min_count)`` with its ``min_tokens``, which in vLLM 0.33's
    ``check_stop`` defers only that check; nothing where ``check_sequence_repetition``
    never fires (no params, ``max_pattern_size <= 0``, ``min_count < 2``, or the sizes
    out of order once ``min_pattern_size`` 0 counts as 1)."""
    rule = params.repetition_detection if params is not None else None
    if rule is None:
        return {}
    max_size, min_size, count = rule.max_pattern_size, rule.min_pattern_size, rule.min_count
    if max_size <= 0 or count < 2 or max(min_size, 1) > max_size:
        return {}
    return {
        "repetition_detection": (max_size, max(min_size, 0), count),
        "min_tokens": params.min_tokens,
    }


def vllm_block_ids(core_block_ids: Any) -> list[int]:
    """The core's block ids (a numpy array) as vLLM numbers them: vLLM's block 0 is its null
    block, and the core numbers the others from 0 (``reserve_null_block``). Every block id
    that reaches vLLM goes through here."""
    return (core_block_ids + 1).tolist()  # type: ignore[no-any-return]
