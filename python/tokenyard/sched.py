"""The embeddable step scheduler (vLLM V1 semantics).

A serving engine calls it once per iteration::

    scheduler = Scheduler(SchedulerConfig(num_blocks=4096))
    scheduler.add_request("r1", prompt_token_ids, max_tokens=128)
    while scheduler.has_unfinished_requests():
        output = scheduler.schedule()           # what to run this step
        sampled = run_model(output)             # {request_id: [token ids]}
        scheduler.update_from_output(sampled)   # append tokens, finish, free

See ``docs/embedding.md`` for a runnable loop and the meaning of each output field.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt

from tokenyard._checks import check_key_choice, check_key_int, fail
from tokenyard._core import (
    CachedRequestData,
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    EncoderCache,
    FullAttentionSpec,
    HiSparseHotSpec,
    HiSparseResidentSpec,
    KvLoad,
    MambaSpec,
    NewRequestData,
    RequestView,
    Scheduler,
    SchedulerOutput,
    SchedulerStats,
    SlidingWindowSpec,
)

__all__ = [
    "PLACEHOLDER_DRAFT",
    "CachedRequestData",
    "EncoderCache",
    "KvConnector",
    "KvLoad",
    "MmFeature",
    "NewRequestData",
    "PolicyPlugin",
    "RequestView",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerOutput",
    "SchedulerStats",
    "ShortestPromptFirst",
]

#: The draft id of a padded admission's placeholder drafts in ``scheduled_spec_decode_tokens``
#: (``SchedulerConfig.pad_spec_decode``): vLLM 0.33's ``-1`` as a ``uint32``. No model samples
#: it, so the engine reports every placeholder rejected (one sampled token, ``k`` rejected).
PLACEHOLDER_DRAFT = 2**32 - 1


class PolicyPlugin(Protocol):
    """Replaces the waiting-queue order and the choice of preemption victims.

    Pass one as ``Scheduler(config, plugin=...)``. Both methods are called once at the start
    of every ``schedule()``, before anything changes, with the requests as ``RequestView``s;
    each returns the same request ids reordered. If a method raises, ``schedule()`` re-raises
    that exception and the scheduler is unchanged; an answer that is not a reordering of the
    ids it was given raises ``PolicyError``. The budget, sequence-cap and memory rules (and
    head-of-line blocking) stay the scheduler's.
    """

    def order_waiting(self, waiting: list[RequestView]) -> Sequence[int | str]:
        """Admission order: the first id is admitted first."""
        ...

    def preemption_order(self, running: list[RequestView]) -> Sequence[int | str]:
        """Victim order when memory runs out: the first id is preempted first."""
        ...


class KvConnector(Protocol):
    """Loads KV from outside the pool and sends finished requests' KV: vLLM V1's
    scheduler-side KV connector (``KVConnectorBase_V1``), with its method names and answers.

    Pass one as ``Scheduler(config, connector=...)`` (``prefix_cache="block_hash"`` only).
    With several KV groups it may also define ``get_loaded_kv_cache_group_ids(request)``
    (vLLM 0.33's): the groups its load restores, an iterable of group indices (without it,
    or ``None``: every group but a bounded-replay window, what a prefix-cache store holds);
    a load that restores the window is not replayed, and its groups' blocks are not zeroed
    under an asynchronous load.
    Its optional attribute ``supports_divergent_local_hybrid_hits`` (vLLM 0.33's property,
    read when the connector is set; false without it) says its loads restore a Mamba state
    lagging behind a deeper full-attention hit: with a Mamba ``align`` group the local hit
    is then full attention's, kept if the connector loads past it
    (``docs/integrations.md``).
    Each method gets the request as a ``RequestView`` (its ``status`` is
    ``"waiting_for_remote_kvs"`` while its KV loads). If a method raises or answers badly,
    the scheduler's method raises ``ConnectorError`` naming it (the exception as
    ``__cause__``); see ``docs/embedding.md`` for what that call has done by then.
    """

    def get_num_new_matched_tokens(
        self, request: RequestView, num_computed_tokens: int, /
    ) -> tuple[int | None, bool] | None:
        """Tokens after ``num_computed_tokens`` (the local prefix hit) the connector can
        load, and whether the load is asynchronous (the request waits, holding blocks for
        them, until ``Scheduler.finish_kv_transfers`` reports it). ``None`` (or vLLM's
        ``(None, False)``): cannot tell yet, ask again next step. Asked when a request with
        nothing computed is admitted, including after a preemption."""
        ...

    def update_state_after_alloc(
        self,
        request: RequestView,
        block_ids: npt.NDArray[np.uint32] | tuple[npt.NDArray[np.uint32], ...],
        num_external_tokens: int,
        /,
    ) -> object:
        """Blocks were allocated for an admitted request: its whole block table, of which
        the ``num_external_tokens`` after the local hit are to be loaded (0: nothing to
        load). With several KV groups (``SchedulerConfig.kv_groups``) a tuple of tables,
        one per group (null blocks, id 0, where a group no longer attends). The return
        value is ignored."""
        ...

    def request_finished(
        self,
        request: RequestView,
        block_ids: npt.NDArray[np.uint32] | tuple[npt.NDArray[np.uint32], ...],
        /,
    ) -> bool | tuple[bool, object]:
        """A running request finished (or was aborted) holding ``block_ids`` (with several
        KV groups a tuple of tables, without the blocks its windows left on the
        processed-token basis, as vLLM 0.33's ``_connector_finished``). ``True``: the
        connector sends them, and the scheduler keeps them until the engine reports the send
        in ``finish_kv_transfers(finished_sending=...)``. vLLM's ``(bool, kv_transfer_params)``
        is accepted too; the params are ignored."""
        ...


class ShortestPromptFirst:
    """Example plugin: admit the shortest prompts first (ties by arrival), and preempt the
    request holding the most tokens first."""

    def order_waiting(self, waiting: list[RequestView]) -> list[int | str]:
        return [r.request_id for r in sorted(waiting, key=lambda r: r.num_prompt_tokens)]

    def preemption_order(self, running: list[RequestView]) -> list[int | str]:
        return [r.request_id for r in sorted(running, key=lambda r: -r.num_tokens)]


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    """Options of the step scheduler; names follow vLLM's ``SchedulerConfig``.

    Raises:
        ConfigError: a field has the wrong type or an impossible value (checked here and
            again when the ``Scheduler`` is built; a KV cache smaller than
            ``max_model_len`` is accepted there, as vLLM 0.33's scheduler accepts it).
    """

    max_num_seqs: int = 256
    """Cap on running requests; 0 = unbounded."""
    max_num_batched_tokens: int = 8192
    """Token budget of one step: the tokens it schedules and, as vLLM 0.33's input budget,
    each scheduled request's draft slots (``Scheduler.num_draft_slots_per_request``)."""
    max_num_scheduled_tokens: int | None = None
    """vLLM 0.33's ``max_num_scheduled_tokens``: the tokens one step schedules, a budget of
    its own beside ``max_num_batched_tokens`` (a request gets at most the smaller of what
    each leaves); ``None``: the same as ``max_num_batched_tokens``."""
    long_prefill_token_threshold: int = 0
    """Per-request cap on tokens in one step; 0 = off. As in vLLM 0.33, it applies only in
    steps that start with more than one request running or waiting."""
    long_prefill_token_threshold_adaptive: bool = False
    """vLLM 0.33's option: the cap is at least ``max_num_batched_tokens`` divided by the
    requests running or waiting (a fair share of the step)."""
    enable_chunked_prefill: bool = True
    policy: Literal["fcfs", "priority"] = "fcfs"
    priority_ties: Literal["vllm", "arrival_order"] = "vllm"
    """How ``policy="priority"`` breaks ties on ``(priority, arrival_time)``. ``"vllm"``
    (vLLM 0.33): waiting requests by request id, and the victim is the first tied request
    in running order (two tied requests can then preempt each other for good when memory
    holds only one). ``"arrival_order"``: waiting requests in arrival order, and the victim
    is the latest arrival (never livelocks)."""
    enable_prefix_caching: bool = True
    prefix_cache: Literal["block_hash", "radix"] = "block_hash"
    """``"block_hash"``: vLLM V1's block pool, caching blocks as they are computed.
    ``"radix"``: SGLang's radix tree over a page allocator (pages of ``block_size`` tokens),
    caching a request's pages when it finishes or is preempted; LoRA requests bypass it."""
    block_size: int = 16
    num_blocks: int = 8192
    max_model_len: int = 8192
    num_sampled_tokens_per_step: int = 1
    """Tokens a step samples once a request's known tokens are computed, kept as room under
    ``max_model_len`` (vLLM 0.33's ``num_sampled_tokens_per_step``): 1, or 0 for a pooling
    or diffusion model, whose prompt may then fill ``max_model_len``."""
    prioritize_prefill: bool = False
    """Seed 001: running prefills and admissions take the budget before decodes."""
    num_lookahead_tokens: int = 0
    """KV slots reserved past a request's scheduled tokens for a drafter that writes its own
    KV there (vLLM's ``num_lookahead_tokens``: ``k`` for EAGLE, MTP and draft models, 0 for
    n-gram); capped at ``max_model_len``."""
    num_speculative_tokens: int = 0
    """Draft tokens per step under speculative decoding (vLLM's ``num_speculative_tokens``,
    ``k``); 0 = off. Drafts the engine proposes are scheduled either way; ``k`` drives
    ``pad_spec_decode`` and ``cache_accepted_drafts``."""
    pad_spec_decode: bool = True
    """vLLM 0.33 with ``k > 0``: a waiting request admitted for exactly one token (its prompt
    hit or loaded but the last token, or a one-token prompt joining running decodes), in a
    step that schedules no running prefill, computes ``1 + k`` tokens: its token and ``k``
    placeholder drafts (``PLACEHOLDER_DRAFT``, always rejected); admission stops if they do
    not fit the budget. ``False``: it computes its one token."""
    cache_accepted_drafts: bool = True
    """vLLM 0.33: full blocks that accepted drafts complete enter the prefix cache in
    ``update_from_output``, even when the request finishes there. ``False``: at the
    request's next allocation (never, if it finished)."""
    max_loras: int = 0
    """Distinct LoRA adapters in one step; 0 = no gating."""
    scheduler_reserve_full_isl: bool = True
    """vLLM 0.33's admission gate: a waiting request is admitted only if its whole sequence
    (prompt and outputs so far, up to ``max_model_len``) fits in free blocks beside its
    prefix hit, not just this step's chunk."""
    reserve_null_block: bool = True
    """vLLM's null block: one of the ``num_blocks`` is never handed out, so
    ``num_blocks - 1`` hold KV (vLLM's ``num_gpu_blocks`` counts it the same way)."""
    host_num_blocks: int = 0
    """Blocks of a host-memory KV tier that evicted cached blocks are offloaded to, and
    that prefix hits load back from (asynchronously: ``kv_loads``); needs
    ``enable_prefix_caching`` with ``prefix_cache="block_hash"``. 0 = none."""
    prefill_schedule_interval: int = 1
    """vLLM 0.33's prefill cadence as one engine applies it: while a running request
    decodes, prefill work (admissions with prompt left beyond its last token, running
    prefill chunks) is held until this many executed steps (steps that scheduled any
    token) have passed since the last one that carried prefill; not while the last step
    that released prefill left the waiting queue undrained. 1 = off."""
    async_scheduling: bool = False
    """Allow ``schedule()`` before the previous step's output arrived (vLLM V1's default)."""
    kv_groups: tuple[
        FullAttentionSpec
        | SlidingWindowSpec
        | ChunkedLocalAttentionSpec
        | MambaSpec
        | CrossAttentionSpec
        | HiSparseResidentSpec
        | HiSparseHotSpec,
        ...,
    ] = ()
    """A hybrid model's KV cache groups (``tokenyard.kv`` specs), as vLLM 0.33's hybrid
    allocator forms them: one block table per group over one pool (vLLM's coordinator),
    a sliding-window or chunked group freeing blocks that leave its window, a Mamba group
    holding one block per request (``mamba_cache_mode="none"``) or its states at block
    boundaries, prefix-cached (``"align"``), a cross-attention group (an encoder-decoder model,
    ``Scheduler.set_encoder_decoder``) blocks for a request's encoder tokens, HiSparse's
    resident and hot page groups (vLLM 0.33's; with prefix caching nothing hits: no host
    page is published without the HiSparse connector). Outputs then
    carry ``group_block_ids``. ``()`` or one
    ``FullAttentionSpec``: the single-group pool. Refused with ``prefix_cache="radix"``,
    ``host_num_blocks``, and a ``MambaSpec`` in ``"none"`` mode or a ``CrossAttentionSpec``
    with prefix caching (see
    ``docs/kv.md``)."""
    kv_group_block_sizes: tuple[int, ...] = ()
    """Each KV group's own block size, when ``kv_groups`` differ in it (vLLM 0.33 layouts
    whose layer kinds have different page sizes, e.g. Gemma 4's global layers):
    ``block_size`` is then vLLM's ``hash_block_size``, each of these a multiple of it; a
    group allocates and caches blocks of its size and prefix hits land on their least
    common multiple (vLLM's ``scheduler_block_size``). ``()``: every group's is
    ``block_size``. Only full-attention and sliding-window groups take their own size;
    refused beside a KV connector and beside speculative steps (``1 + num_speculative_tokens
    + num_lookahead_tokens`` slots) longer than ``block_size`` (``docs/kv.md``)."""
    max_num_encoder_input_tokens: int = 0
    """Encoder embeddings computed per step, all requests together (vLLM 0.33's encoder
    compute budget); 0 = ``max_num_batched_tokens``, vLLM's default. A request's item whose
    encoder output is not cached and does not fit what is left stops the request's tokens
    just before the item (``docs/embedding.md``). vLLM raises the budget to the model's
    largest item; here a larger item is refused at ``add_request``."""
    encoder_cache_size: int = 0
    """Embeddings the encoder cache holds (vLLM 0.33's ``encoder_cache_size``); 0 =
    ``max_num_batched_tokens``. Items with one identifier share an entry; an entry no
    request needs stays until an allocation evicts it (oldest first)."""
    disable_chunked_mm_input: bool = False
    """vLLM 0.33: never schedule part of an item's placeholder range; a chunk that would end
    inside one stops before it."""
    mamba_align_block_size: int = 0
    """vLLM 0.33's Mamba prefix caching in ``align`` mode, its scheduling half
    (``Scheduler._mamba_block_aligned_split``): a prefill chunk that stops before the prompt's
    end stops on a multiple of this many tokens, a chunk starting mid-block stops at the
    next boundary, and none runs past the last block boundary whose state can be reused
    (``docs/integrations.md``). 0 = off. The state blocks themselves are a
    ``MambaSpec(mamba_cache_mode="align")`` group in ``kv_groups``."""
    num_prefill_lookahead: int = 0
    """Known prefill tokens a multi-module MTP or EAGLE drafter reads past a chunk's end
    (vLLM 0.33's ``num_prefill_lookahead``): encoder inputs are scheduled that far ahead,
    and a prefill chunk never ends closer than this to the end of the request's known
    tokens (it finishes them or leaves this many). 0 = off. With one KV group and prefix
    caching, the last ``num_prefill_lookahead - 1`` computed tokens are never cached (vLLM's
    ``num_reprefillable_tokens``: a multi-module MTP drafter may re-prefill them); with
    several, only in the groups ``eagle_block_drop`` acts in (``kv_group_is_eagle``)."""
    num_hash_lookahead_tokens: int = 0
    """Tokens past each block that its hash covers (vLLM 0.33's
    ``VllmConfig.num_hash_lookahead_tokens``, its default for EAGLE/EAGLE3/MTP drafters with
    prefix caching): a block is hashed, cached and hit only once the tokens after it exist,
    and two prompts share it only if they agree on those too. 0 = off (the legacy hashes).
    Needs block-hash prefix caching; refused with a KV connector, as vLLM keeps the legacy
    hashes there."""
    eagle_block_drop: bool = False
    """vLLM 0.33's trailing-block drop for EAGLE-style drafters when look-ahead hashes are off
    (``disable_lookahead_block_hashes``): every prefix hit loses its last block, which is
    recomputed for the drafter; with KV groups, in each group it acts in
    (``kv_group_is_eagle``), beside groups of different block sizes too. Needs block-hash
    prefix caching and no look-ahead."""
    kv_group_is_eagle: tuple[bool, ...] = ()
    """vLLM 0.33's ``KVCacheGroupSpec.is_eagle_group`` of each of ``kv_groups``: the groups
    ``eagle_block_drop`` acts in (the drafter's groups); ``()`` or none ``True``: every
    group, vLLM's fallback. Groups sharing a spec drop together when one is flagged; a
    ``ChunkedLocalAttentionSpec`` group may stand beside the drop only unflagged (vLLM's
    manager asserts). One flag per group, and only with several groups."""
    kv_window_extra_retained_tokens: int = 0
    """Tokens kept below every sliding window of ``kv_groups`` though not attended (vLLM
    0.33's ``SlidingWindowSpec.extra_retained_tokens``: its planning tags each window with
    ``max(0, num_prefill_lookahead_tokens - 1)`` of a multi-module MTP drafter, which may
    re-prefill them): a window frees a block only once it lies that far below the window,
    and a request's admission cap counts them; a hit still needs only the window's own run
    of blocks. 0 = off; refused without a sliding-window group."""

    def __post_init__(self) -> None:
        groups = self.kv_groups
        if isinstance(groups, str) or not isinstance(groups, (tuple, list)):
            raise fail("kv_groups", f"must be a tuple of KV group specs, got {groups!r}", groups)
        for i, group in enumerate(groups):
            if not isinstance(group, _GROUP_SPECS):
                raise fail(
                    "kv_groups",
                    f"kv_groups[{i}] must be a FullAttentionSpec, SlidingWindowSpec, "
                    "ChunkedLocalAttentionSpec, MambaSpec, CrossAttentionSpec, "
                    f"HiSparseResidentSpec or HiSparseHotSpec, got {group!r}",
                    group,
                )
        object.__setattr__(self, "kv_groups", tuple(groups))
        sizes = self.kv_group_block_sizes
        if isinstance(sizes, str) or not isinstance(sizes, (tuple, list)):
            raise fail("kv_group_block_sizes", f"must be a tuple of ints, got {sizes!r}", sizes)
        for i, size in enumerate(sizes):
            check_key_int(f"kv_group_block_sizes[{i}]", size, low=1, high=MAX_COUNT)
        object.__setattr__(self, "kv_group_block_sizes", tuple(sizes))
        flags = self.kv_group_is_eagle
        if isinstance(flags, str) or not isinstance(flags, (tuple, list)):
            raise fail("kv_group_is_eagle", f"must be a tuple of bools, got {flags!r}", flags)
        for i, flag in enumerate(flags):
            if not isinstance(flag, bool):
                raise fail(f"kv_group_is_eagle[{i}]", f"must be true or false, got {flag!r}", flag)
        object.__setattr__(self, "kv_group_is_eagle", tuple(flags))
        for name in _COUNT_FIELDS:
            check_key_int(name, getattr(self, name), low=0, high=MAX_COUNT)
        check_key_int(
            "prefill_schedule_interval", self.prefill_schedule_interval, low=1, high=MAX_COUNT
        )
        if self.max_num_scheduled_tokens is not None:
            check_key_int(
                "max_num_scheduled_tokens", self.max_num_scheduled_tokens, low=1, high=MAX_COUNT
            )
        check_key_int(
            "num_sampled_tokens_per_step", self.num_sampled_tokens_per_step, low=0, high=1
        )
        for name in _FLAG_FIELDS:
            if not isinstance(getattr(self, name), bool):
                value = getattr(self, name)
                raise fail(name, f"must be true or false, got {value!r}", value)
        check_key_choice("policy", self.policy, ("fcfs", "priority"))
        check_key_choice("priority_ties", self.priority_ties, ("vllm", "arrival_order"))
        check_key_choice("prefix_cache", self.prefix_cache, ("block_hash", "radix"))


@dataclass(frozen=True)
class MmFeature:
    """One multimodal item of a prompt (vLLM 0.33's ``MultiModalFeatureSpec`` with its
    ``PlaceholderRange``), for ``Scheduler.add_request(..., mm_features=[...])``. vLLM's own
    ``MultiModalFeatureSpec`` objects and ``(offset, length, identifier)`` tuples are
    accepted there too."""

    offset: int
    """Where the item's placeholder tokens start in the prompt."""
    length: int
    """Its placeholder tokens."""
    identifier: str
    """The encoder cache's key (vLLM's ``mm_hash``): items with one identifier share one
    encoder output."""
    is_embed: tuple[bool, ...] | None = None
    """Which placeholder positions take an encoder embedding (vLLM's ``is_embed``);
    ``None``: all. The item costs its embeddings in the budget and the cache."""


_GROUP_SPECS = (
    FullAttentionSpec,
    SlidingWindowSpec,
    ChunkedLocalAttentionSpec,
    MambaSpec,
    CrossAttentionSpec,
    HiSparseResidentSpec,
    HiSparseHotSpec,
)

_COUNT_FIELDS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "long_prefill_token_threshold",
    "block_size",
    "num_blocks",
    "max_model_len",
    "num_lookahead_tokens",
    "num_speculative_tokens",
    "mamba_align_block_size",
    "num_prefill_lookahead",
    "num_hash_lookahead_tokens",
    "kv_window_extra_retained_tokens",
    "max_loras",
    "host_num_blocks",
    "max_num_encoder_input_tokens",
    "encoder_cache_size",
)
_FLAG_FIELDS = (
    "eagle_block_drop",
    "pad_spec_decode",
    "cache_accepted_drafts",
    "scheduler_reserve_full_isl",
    "reserve_null_block",
    "long_prefill_token_threshold_adaptive",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "prioritize_prefill",
    "async_scheduling",
    "disable_chunked_mm_input",
)


#: The largest count a field takes (blocks, tokens, requests).
MAX_COUNT = 2**30
