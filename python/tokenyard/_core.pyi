"""Type stubs of the native module; users import these classes from ``tokenyard.kv``."""

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, Protocol, TypeAlias, final

import numpy as np
import numpy.typing as npt

__all__ = [
    "GLOBAL_POLICIES",
    "MAX_CLUSTER_BLOCKS",
    "REPLICA_POLICIES",
    "BlockPool",
    "BlockPoolStats",
    "CachedRequestData",
    "ChunkedLocalAttentionSpec",
    "CompiledOps",
    "ComputedBlocks",
    "CountingAllocator",
    "CrossAttentionSpec",
    "EncoderCache",
    "FullAttentionSpec",
    "GroupedComputedBlocks",
    "HiSparseConnectorPool",
    "HiSparseDeviceResidency",
    "HiSparseHostPublication",
    "HiSparseHotSpec",
    "HiSparseResidentSpec",
    "KvCoordinator",
    "KvLoad",
    "LinearModel",
    "MambaSpec",
    "MatchResult",
    "NewRequestData",
    "NodeHandle",
    "RadixCache",
    "ReplicaSpec",
    "RequestView",
    "Scheduler",
    "SchedulerOutput",
    "SchedulerStats",
    "SimConfig",
    "SimRequestView",
    "SlidingWindowSpec",
    "SpeculativeConfig",
    "__version__",
    "block_hashes",
    "build_profile",
    "evaluate_ops",
    "fine_grained_hit",
    "group_block_hashes",
    "partial_hash_hits_enabled",
    "read_mooncake_lines",
    "simulate",
]

__version__: str
build_profile: str

_RequestId: TypeAlias = int | str
_TokenIds: TypeAlias = Sequence[int] | npt.NDArray[np.integer[Any]]

@final
class CountingAllocator:
    """Vidur's block-counting allocator.

    ``num_blocks`` blocks; ``floor(watermark_fraction * num_blocks)`` of them are kept free
    against new admissions (``can_admit``) but not against growth (``can_allocate``).

    Raises:
        ConfigError: ``num_blocks < 1`` or ``watermark_fraction`` outside [0, 1).
    """

    def __new__(cls, *, num_blocks: int, watermark_fraction: float = 0.0) -> CountingAllocator: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def watermark_blocks(self) -> int: ...
    @property
    def num_allocated_blocks(self) -> int: ...
    @property
    def num_free_blocks(self) -> int: ...
    @property
    def usage(self) -> float:
        """Fraction of blocks allocated, in [0, 1]."""
    @property
    def num_requests(self) -> int: ...
    def can_allocate(self, num_blocks: int) -> bool:
        """Whether ``num_blocks`` more blocks are free (a running request growing)."""
    def can_admit(self, num_blocks: int) -> bool:
        """Whether ``num_blocks`` fit and leave the watermark free (a new admission)."""
    def allocate(self, request_id: _RequestId, num_blocks: int) -> None:
        """Gives ``num_blocks`` (>= 1) more blocks to the request.

        Raises:
            CapacityError: fewer than ``num_blocks`` blocks are free.
            InputError: ``num_blocks < 1``.
        """
    def free(self, *request_ids: _RequestId) -> int:
        """Frees every block of each request; returns the number of blocks freed.

        All-or-nothing: nothing is freed if any id is unknown or repeated.

        Raises:
            UnknownRequestError: an id holds no blocks.
            InputError: an id is repeated.
        """
    def num_blocks_of(self, request_id: _RequestId) -> int:
        """Blocks the request holds (0 if none)."""
    def __contains__(self, request_id: _RequestId, /) -> bool: ...
    def __len__(self) -> int: ...
    def check_invariants(self) -> None:
        """Raises InternalError if the internal bookkeeping is inconsistent (a bug)."""

@final
class ComputedBlocks:
    """The cached prefix of some token ids, from ``BlockPool.get_computed_blocks``."""

    @property
    def block_ids(self) -> npt.NDArray[np.uint32]:
        """Ids of the cached leading blocks, in order."""
    @property
    def num_computed_tokens(self) -> int:
        """Tokens covered by those blocks (``len(block_ids) * block_size``)."""
    @property
    def num_host_computed_tokens(self) -> int:
        """Tokens of the blocks after those that the host tier holds (loaded on admission)."""

@final
class BlockPoolStats:
    """Prefix-cache lookups since the pool was built, and the host tier's traffic."""

    @property
    def num_lookups(self) -> int: ...
    @property
    def num_query_tokens(self) -> int: ...
    @property
    def num_hit_tokens(self) -> int:
        """Tokens found in GPU blocks."""
    @property
    def num_host_hit_tokens(self) -> int:
        """Tokens found in the host tier after the GPU hits."""
    @property
    def num_offloaded_blocks(self) -> int:
        """Hashes that entered the host tier (GPU evictions written back)."""
    @property
    def num_loaded_blocks(self) -> int:
        """Host-tier blocks loaded back into GPU blocks."""
    @property
    def hit_rate(self) -> float:
        """``num_hit_tokens / num_query_tokens`` (0 before any lookup)."""

@final
class BlockPool:
    """vLLM V1's prefix-caching KV block pool with per-request block tables.

    ``host_num_blocks`` > 0 adds a host-memory tier of that many blocks: hashes evicted
    from GPU blocks are offloaded there, and lookups continue into it (docs/kv.md).

    Raises:
        ConfigError: ``num_blocks`` or ``block_size`` below 1 or absurdly large;
            ``host_num_blocks`` negative, absurdly large, or set with caching off.
    """

    def __new__(
        cls,
        *,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        host_num_blocks: int = 0,
    ) -> BlockPool: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def enable_caching(self) -> bool: ...
    @property
    def num_free_blocks(self) -> int:
        """Blocks no request holds, including cached ones (evicted on demand)."""
    @property
    def num_used_blocks(self) -> int: ...
    @property
    def num_cached_blocks(self) -> int:
        """Blocks registered in the prefix cache, held or free (every copy of a hash counts)."""
    @property
    def num_cached_free_blocks(self) -> int: ...
    @property
    def num_requests(self) -> int: ...
    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests, in [0, 1]."""
    @property
    def host_num_blocks(self) -> int:
        """The host tier's capacity in blocks (0: no tier)."""
    @property
    def num_host_blocks(self) -> int:
        """Hashes the host tier holds."""
    def host_block_hashes(self) -> list[int]:
        """The host tier's hashes, least recently used first (as ``block_hashes`` computes)."""
    def stats(self) -> BlockPoolStats: ...
    def get_computed_blocks(
        self, token_ids: _TokenIds, *, extra_key: int | None = None
    ) -> ComputedBlocks:
        """Longest cached prefix of ``token_ids`` in whole blocks, never the whole prompt.

        The last token is always left to recompute, so the model produces its logits.
        ``extra_key`` (e.g. a LoRA id) separates otherwise equal prefixes. Counts in stats.
        With a host tier, the blocks after the GPU hit that the tier holds follow
        (``num_host_computed_tokens``); GPU and host hits together leave the last token.

        Raises:
            InputError: a token id is negative or >= 2**32.
        """
    def allocate_slots(
        self,
        request_id: _RequestId,
        num_new_tokens: int,
        num_lookahead_tokens: int = 0,
        *,
        token_ids: _TokenIds | None = None,
        new_computed_blocks: ComputedBlocks | None = None,
        extra_key: int | None = None,
    ) -> npt.NDArray[np.uint32] | None:
        """Slots for ``num_new_tokens`` more tokens (+ speculative lookahead slots).

        ``token_ids`` are the request's token ids not given before (its prompt on the first
        call, then each newly sampled token). On the first call, ``new_computed_blocks``
        from ``get_computed_blocks`` over the same ids shares the cached prefix. Full blocks
        that become computed are cached for reuse. ``num_new_tokens`` may run ahead of the
        ids given (speculative tokens, or tokens still being sampled); only given ids are
        hashed and cached, the rest once they arrive in a later call.

        Returns:
            The newly allocated block ids, or ``None`` if the free blocks do not suffice.
            A ``None`` or an exception changes nothing; retry with the same ``token_ids``.

        With a host hit in ``new_computed_blocks``, its blocks are loaded: they take fresh
        blocks after the GPU hit, count as computed and are cached at once (copy them before
        the step runs); ``num_new_tokens`` counts the tokens after both hits.

        Raises:
            InputError: ``num_new_tokens < 1``, a stale or mismatched
                ``new_computed_blocks``, or bad token ids.
        """
    def allocate_slots_external(
        self,
        request_id: _RequestId,
        num_external_tokens: int,
        *,
        token_ids: _TokenIds,
        new_computed_blocks: ComputedBlocks | None = None,
        extra_key: int | None = None,
    ) -> npt.NDArray[np.uint32] | None:
        """A request's first allocation when tokens are loaded rather than computed.

        The host hit of ``new_computed_blocks`` and ``num_external_tokens`` more tokens
        (from beyond the pool, e.g. a prefill instance) get slots and count as computed,
        but are cached only at ``cache_loaded_blocks``, once their data has landed.
        ``num_external_tokens`` may be 0 when the hit has host blocks.

        Returns:
            The newly allocated block ids, or ``None`` (nothing changed) if they do not fit.

        Raises:
            InputError: the request already holds blocks, nothing to load, more tokens
                than ``token_ids`` has, or a stale or mismatched ``new_computed_blocks``.
        """
    def cache_loaded_blocks(self, request_id: _RequestId) -> None:
        """Caches the request's loaded blocks: their data has landed.

        Raises:
            UnknownRequestError: the request holds no blocks.
        """
    def free(self, request_id: _RequestId) -> None:
        """Releases the request's blocks, last block first (tails are evicted first).

        Raises:
            UnknownRequestError: the request holds no blocks.
        """
    def block_ids(self, request_id: _RequestId) -> npt.NDArray[np.uint32]:
        """The request's block table. Raises UnknownRequestError."""
    def num_computed_tokens(self, request_id: _RequestId) -> int:
        """Tokens of the request with slots. Raises UnknownRequestError."""
    def free_block_ids(self) -> npt.NDArray[np.uint32]:
        """Free block ids in eviction order, next evicted first."""
    def ref_count(self, block_id: int) -> int:
        """Number of requests holding the block. Raises InputError for a bad id."""
    def touch(self, block_ids: list[int]) -> None:
        """vLLM 0.33's ``BlockPool.touch`` by id (a KV connector keeping blocks it copies):
        one reference more on each, held outside any request until ``free_blocks``; a free
        block leaves the free queue with its cached hash (not evicted, still hit).

        Raises:
            InputError: an id past the pool (nothing changes then).
        """
    def free_blocks(self, block_ids: list[int]) -> None:
        """vLLM 0.33's ``BlockPool.free_blocks`` on references ``touch`` took (first
        evicted first): a block left unheld rejoins the free queue (a cached one at the
        back).

        Raises:
            InputError: a block without such a reference left (nothing changes then).
        """
    def reset_prefix_cache(self) -> bool:
        """Forgets every cached prefix if no request holds blocks; returns whether it did."""
    def __contains__(self, request_id: _RequestId, /) -> bool: ...
    def __len__(self) -> int: ...
    def check_invariants(self) -> None:
        """Raises InternalError if the internal bookkeeping is inconsistent (a bug)."""

@final
class FullAttentionSpec:
    """A full-attention KV cache group (vLLM's ``FullAttentionSpec``)."""

    def __new__(cls) -> FullAttentionSpec: ...

@final
class SlidingWindowSpec:
    """A sliding-window group: each token attends to the ``sliding_window`` tokens ending
    at itself (vLLM's ``SlidingWindowSpec``). With ``bounded_replay``, the group is not
    prefix-cached: after a prefix hit the scheduler recomputes the hit's last
    ``sliding_window`` tokens to rebuild it, keeping the other groups' hit blocks (vLLM
    0.33's ``SlidingWindowMLASpec(bounded_replay=True)``; ``NewRequestData.replay_start``).

    Raises:
        ConfigError: ``sliding_window`` is not an int >= 1.
    """

    def __new__(cls, *, sliding_window: int, bounded_replay: bool = False) -> SlidingWindowSpec: ...
    @property
    def sliding_window(self) -> int: ...
    @property
    def bounded_replay(self) -> bool: ...

@final
class ChunkedLocalAttentionSpec:
    """A chunked local attention group: tokens attend within their chunk of
    ``attention_chunk_size`` tokens (vLLM's ``ChunkedLocalAttentionSpec``).

    Raises:
        ConfigError: ``attention_chunk_size`` is not an int >= 1.
    """

    def __new__(cls, *, attention_chunk_size: int) -> ChunkedLocalAttentionSpec: ...
    @property
    def attention_chunk_size(self) -> int: ...

@final
class MambaSpec:
    """A Mamba / linear-attention state group (vLLM's ``MambaSpec``). ``"none"``: one block
    per request, not prefix-cached. ``"align"``: a state block at each block boundary the
    request's chunks end on, prefix-cached (a hit needs only the state at its end), the
    state a step was copied from freed at the next allocation.

    ``num_speculative_blocks``: blocks for the draft tokens' states under speculative
    decoding (vLLM sets ``num_speculative_tokens``), held after the running state.
    ``num_prefill_checkpoint_blocks=1`` with ``prefill_checkpoint_alignment`` (align mode
    only): the backend writes the last reusable state from inside a prompt's final chunk
    into one more block, so that chunk is not stopped there.
    ``block_covers_request=False`` (``"none"`` mode only): the group's block is shorter than
    ``max_model_len``, and vLLM 0.33's ``MambaManager`` then holds a slot per block of the
    request's slots plus ``num_speculative_blocks``, every block before the last computed
    token's state freed to a null block, as a sliding window of 2 tokens frees them.

    Raises:
        ConfigError: an unknown mode; a negative count; more than one checkpoint block; a
            checkpoint block in ``"none"`` mode or without its alignment (or the reverse);
            ``block_covers_request=False`` in ``"align"`` mode.
    """

    def __new__(
        cls,
        *,
        mamba_cache_mode: Literal["none", "align"] = "none",
        num_speculative_blocks: int = 0,
        num_prefill_checkpoint_blocks: int = 0,
        prefill_checkpoint_alignment: int | None = None,
        block_covers_request: bool = True,
    ) -> MambaSpec: ...
    @property
    def mamba_cache_mode(self) -> Literal["none", "align"]: ...
    @property
    def num_speculative_blocks(self) -> int: ...
    @property
    def num_prefill_checkpoint_blocks(self) -> int: ...
    @property
    def prefill_checkpoint_alignment(self) -> int | None: ...
    @property
    def block_covers_request(self) -> bool: ...

@final
class CrossAttentionSpec:
    """An encoder-decoder model's cross-attention group (vLLM's ``CrossAttentionSpec``):
    blocks for a request's encoder tokens, allocated when its encoder inputs are scheduled
    and held to its end; not prefix-cached."""

    def __new__(cls) -> CrossAttentionSpec: ...

@final
class HiSparseResidentSpec:
    """HiSparse's GPU-resident pages (vLLM 0.33's ``HiSparseResidentSpec``): a block per
    ``block_size`` tokens as full attention holds them, never prefix-cached, counted at the
    full-sequence admission gate up to ``max_admission_blocks`` (vLLM's
    ``max_admission_blocks_per_request``)."""

    def __new__(cls, *, max_admission_blocks: int) -> HiSparseResidentSpec: ...
    @property
    def max_admission_blocks(self) -> int: ...

@final
class HiSparseHotSpec:
    """HiSparse's hot region (vLLM 0.33's ``HiSparseHotSpec``): ``blocks_per_request``
    blocks for a request that reads host-backed history: one admitted with a connector load
    (a host prefix hit, the other way, needs host pages published on the HiSparse
    connector's acknowledged write-backs, not modelled); none otherwise. Never prefix-cached."""

    def __new__(cls, *, blocks_per_request: int) -> HiSparseHotSpec: ...
    @property
    def blocks_per_request(self) -> int: ...

_GroupSpec: TypeAlias = (
    FullAttentionSpec
    | SlidingWindowSpec
    | ChunkedLocalAttentionSpec
    | MambaSpec
    | CrossAttentionSpec
    | HiSparseResidentSpec
    | HiSparseHotSpec
)

@final
class GroupedComputedBlocks:
    """The prefix hit every group agrees on, from ``KvCoordinator.get_computed_blocks``."""

    @property
    def block_ids(self) -> tuple[npt.NDArray[np.uint32], ...]:
        """Per group, the blocks covering the hit (``NULL_BLOCK_ID`` where it does not attend)."""
    @property
    def num_computed_tokens(self) -> int:
        """Tokens of the hit, the same for every group."""

@final
class KvCoordinator:
    """vLLM V1's KV cache coordinator: one KV cache group per layer kind of a hybrid
    model, over one pool of ``num_blocks`` blocks of which block 0 is the null block.

    ``group_block_sizes`` gives each group its own block size (vLLM 0.33 layouts whose layer
    kinds have different page sizes, e.g. Gemma 4): ``block_size`` is then vLLM's
    ``hash_block_size``, each group's a multiple of it; a group allocates and caches blocks
    of its own size, and prefix hits land on their least common multiple
    (``scheduler_block_size``).

    ``eagle_block_drop`` is vLLM's ``use_eagle``: every group's hits drop their trailing
    block; beside differing block sizes each group then caches a block past the scheduler
    block boundary and full-attention groups key the block holding the prompt's last hash
    boundary (``set_num_prompt_tokens``; docs/kv.md).

    Raises:
        ConfigError: no groups or a value that is not a group spec; ``num_blocks < 2``;
            ``block_size < 1``; a Mamba group with ``enable_caching=True``;
            ``group_block_sizes`` not one multiple of ``block_size`` per group, or
            differing beside a group the core does not serve with them (served: full
            attention, sliding windows, ``none``-mode Mamba uncached, Mamba ``align``
            without a checkpoint block where partial hash hits stay off, chunked local
            attention uncached or on the scheduler block size);
            ``eagle_block_drop`` without caching or beside a chunked local group.
    """

    NULL_BLOCK_ID: int
    def __new__(
        cls,
        *,
        groups: Sequence[_GroupSpec],
        num_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        group_block_sizes: Sequence[int] | None = None,
        eagle_block_drop: bool = False,
    ) -> KvCoordinator: ...
    @property
    def group_block_sizes(self) -> tuple[int, ...]:
        """Each group's block size (all ``block_size`` unless set apart)."""
    @property
    def eagle_block_drop(self) -> bool:
        """Whether every group's hits drop EAGLE's trailing block (vLLM's ``use_eagle``)."""
    def set_num_prompt_tokens(self, request_id: _RequestId, num_prompt_tokens: int) -> None:
        """The request's prompt length (vLLM's ``num_prompt_tokens``), which places the
        partial tail-block entries beside differing block sizes under EAGLE's drop; kept
        for the id until set again (without it, the tokens known when first cached)."""
    @property
    def scheduler_block_size(self) -> int:
        """vLLM's ``scheduler_block_size``: the least common multiple of the groups' block
        sizes, where prefix hits land."""
    @property
    def groups(self) -> tuple[_GroupSpec, ...]: ...
    @property
    def num_groups(self) -> int: ...
    @property
    def num_blocks(self) -> int:
        """Blocks of the pool, the null block included."""
    @property
    def block_size(self) -> int: ...
    @property
    def enable_caching(self) -> bool: ...
    @property
    def num_free_blocks(self) -> int:
        """Blocks no request holds, cached ones included (evicted on demand)."""
    @property
    def num_used_blocks(self) -> int: ...
    @property
    def num_cached_blocks(self) -> int:
        """Blocks registered in the prefix cache, every group's, held or free."""
    @property
    def num_requests(self) -> int: ...
    @property
    def usage(self) -> float:
        """Fraction of the blocks (the null block aside) held by requests."""
    def stats(self) -> BlockPoolStats:
        """Lookups and hit tokens (hits agreed across groups; no host tier)."""
    def get_computed_blocks(
        self, token_ids: _TokenIds, *, extra_key: int | None = None
    ) -> GroupedComputedBlocks:
        """The longest prefix of ``token_ids`` every group can serve, never all of it.

        Full-attention groups are looked up first; each other group verifies within that
        length (a sliding window needs only its window's blocks before the hit's end).

        Raises:
            InputError: a token id is negative or >= 2**32.
        """
    def allocate_slots(
        self,
        request_id: _RequestId,
        num_new_tokens: int,
        num_lookahead_tokens: int = 0,
        *,
        token_ids: _TokenIds | None = None,
        new_computed_blocks: GroupedComputedBlocks | None = None,
        extra_key: int | None = None,
        num_encoder_tokens: int = 0,
    ) -> tuple[npt.NDArray[np.uint32], ...] | None:
        """Slots in every group for ``num_new_tokens`` more tokens (+ lookahead slots);
        ``CrossAttentionSpec`` groups get slots for ``num_encoder_tokens`` instead (vLLM's
        argument: the encoder tokens of the inputs scheduled with this allocation; 0 leaves
        such a group as it is).

        First each group frees the blocks wholly before the tokens the next token attends
        to (null blocks in their place), then counts what every group needs against the
        free blocks. ``token_ids`` are the token ids not given before (the prompt on the
        first call); ``new_computed_blocks`` is taken on the first call only.

        Returns:
            Each group's newly allocated block ids, or ``None`` if they do not fit: then
            nothing changed but the blocks freed for leaving a window (as in vLLM).

        Raises:
            InputError: ``num_new_tokens < 1``, a stale or mismatched
                ``new_computed_blocks``, or bad token ids (and nothing changed).
        """
    def cache_blocks(self, request_id: _RequestId, token_ids: _TokenIds) -> None:
        """Gives the request's newly known ``token_ids`` and caches its full computed blocks.

        Raises:
            UnknownRequestError: the request holds no blocks.
        """
    def free(self, request_id: _RequestId) -> None:
        """Releases the request's blocks group by group, each last block first.

        Raises:
            UnknownRequestError: the request holds no blocks.
        """
    def new_step_starts(self) -> None:
        """A new step begins (vLLM's ``new_step_starts``): Mamba ``align`` states cached
        before it may be hit by other requests (an admission hitting a state cached since
        the last call does not fit)."""
    def block_ids(self, request_id: _RequestId) -> tuple[npt.NDArray[np.uint32], ...]:
        """The request's block table of each group. Raises UnknownRequestError."""
    def num_computed_tokens(self, request_id: _RequestId) -> int:
        """Tokens of the request with slots. Raises UnknownRequestError."""
    def free_block_ids(self) -> npt.NDArray[np.uint32]:
        """Free block ids in eviction order, next evicted first."""
    def ref_count(self, block_id: int) -> int:
        """Number of table entries holding the block. Raises InputError for a bad id."""
    def __contains__(self, request_id: _RequestId, /) -> bool: ...
    def __len__(self) -> int: ...
    def check_invariants(self) -> None:
        """Raises InternalError if the internal bookkeeping is inconsistent (a bug)."""

def block_hashes(
    token_ids: _TokenIds,
    *,
    block_size: int,
    extra_key: int | None = None,
    num_hash_lookahead_tokens: int = 0,
) -> list[int]:
    """The chained hashes of the full blocks of ``token_ids``, as ``BlockPool`` computes them;
    with ``num_hash_lookahead_tokens`` (vLLM 0.33's look-ahead hashes), each also covering
    that many tokens after its block, for the blocks that have them.

    Raises:
        InputError: ``block_size < 1``, a negative look-ahead or bad token ids.
    """

def group_block_hashes(block_hashes: Sequence[int], *, group: int) -> list[int]:
    """The keys a ``KvCoordinator`` (several KV groups) caches blocks of ``group`` under, for
    the hashes ``block_hashes`` computes (its ``block_hash``es; vLLM's
    ``make_block_hash_with_group_id``), in their order."""

def partial_hash_hits_enabled(
    groups: Sequence[_GroupSpec], block_sizes: Sequence[int], hash_block_size: int
) -> bool:
    """vLLM 0.33's ``partial_hash_hits_enabled`` (no DCP): a Mamba ``align`` group whose
    block is larger than ``hash_block_size``, and every other prefix-cached group either of
    the hash block size or able to look up inside its blocks (full attention).

    Raises:
        ConfigError: ``block_sizes`` not one per group, or an unknown group spec.
    """

def fine_grained_hit(
    *,
    mamba: bool,
    block_size: int,
    hash_block_size: int,
    cached: Sequence[int | None],
    max_length: int,
    drop_eagle_block: bool = False,
) -> tuple[list[int], int]:
    """One full-attention (``mamba=False``) or Mamba ``align`` group's hit under vLLM 0.33's
    fine-grained lookups (``find_longest_cache_hit`` with ``alignment_tokens`` the hash
    block size): ``cached[i]`` is the block cached under hash block ``i``'s hash, or None.
    Returns the hit's blocks (nulls, block 0, before a Mamba state) and its tokens.

    Raises:
        ConfigError: ``block_size`` not a larger multiple of ``hash_block_size``.
    """

@final
class NodeHandle:
    """Names the last node of a radix-cache match; lock it while the prefix is in use."""

    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class MatchResult:
    """What ``RadixCache.match_prefix`` found."""

    @property
    def matched_len(self) -> int:
        """Matched tokens, a multiple of the page size."""
    @property
    def values(self) -> npt.NDArray[np.int64]:
        """KV slot indices of the matched prefix, one per token."""
    @property
    def handle(self) -> NodeHandle: ...

@final
class HiSparseConnectorPool:
    """vLLM 0.33's HiSparse connector, device half, with prefix caching off, run on the
    core's KV coordinator (the step scheduler's KV structure, its HiSparse pins: ``touch``,
    ``unpin_blocks`` with reuse watchers, the residency row) with a host pool holding the
    write-backs' references (the core's ``kv::HiSparseConnectorPool``); the interface of
    ``HiSparseDeviceResidency``, which hands out the same block ids. Not yet driven by the
    vLLM adapter.

    Raises:
        ConfigError: a pool below 2 blocks, or another value below 1.
    """

    def __new__(
        cls,
        *,
        num_blocks: int,
        host_num_blocks: int,
        block_size: int,
        blocks_per_request: int,
        max_admission_blocks_per_request: int,
        max_spill_pages: int,
    ) -> HiSparseConnectorPool: ...
    @property
    def num_free_blocks(self) -> int: ...
    def free_blocks(self) -> list[int]:
        """Free device blocks, the next handed out first."""
    def host_free_blocks(self) -> list[int]:
        """Free host blocks, the next handed out first."""
    def tables(
        self, request_id: _RequestId
    ) -> tuple[list[int], list[int], list[int], list[int]] | None:
        """``(host, indexer, resident row, hot)`` block ids (the row 0 for a lost page), or
        None."""
    def has_pending_work(self) -> bool: ...
    def has_pending_reclamation(self) -> bool:
        """Whether a pending write-back frees a block when it lands."""
    def allocate_slots(self, request_id: _RequestId, num_tokens: int) -> bool:
        """vLLM's ``KVCacheManager.allocate_slots`` as its scheduler calls it: the tables grow
        to back ``num_tokens`` slots; False when the pools cannot back them.

        Raises:
            InputError: ``num_tokens`` below 1, or pages this allocation reused required a
                hot region the pool cannot back (vLLM's ``get_new_blocks`` raises there).
        """
    def advance_scheduled(self, request_id: _RequestId, num_computed_tokens: int) -> None:
        """vLLM's ``HiSparseCoordinator.advance_scheduled`` for one scheduled request.

        Raises:
            UnknownRequestError: the request holds no blocks.
        """
    def take_transfers(self) -> list[tuple[int, int, int]]:
        """``[(transfer_id, host_block_id, resident_block_id)]`` planned since the last call."""
    def take_lost_pages(self) -> list[tuple[_RequestId, int]]:
        """``[(request_id, page)]`` lost since the last call, in the order their blocks were
        handed out again."""
    def acknowledge(self, enqueued: dict[int, int], completed: dict[int, int]) -> None:
        """The workers' counts by transfer id (vLLM's ``update_spills``)."""
    def free(self, request_id: _RequestId) -> None:
        """Frees the request (finished or preempted).

        Raises:
            UnknownRequestError: the request holds no blocks.
        """
    def check(self) -> None:
        """Raises InternalError if blocks are not conserved."""

@final
class HiSparseDeviceResidency:
    """vLLM 0.33's HiSparse connector, device half, with prefix caching off: the device pool
    shared by the indexer, resident and hot groups, the host pool, write-back references on
    both, hot regions, unpinning and the free order (the core's ``kv::DeviceResidency``;
    docs/integrations.md, "vLLM 0.33's scheduler-side HiSparse rule", items 2, 3, 7 and 8).
    Not yet driven by the vLLM adapter.

    Raises:
        ConfigError: a pool below 2 blocks, or another value below 1.
    """

    def __new__(
        cls,
        *,
        num_blocks: int,
        host_num_blocks: int,
        block_size: int,
        blocks_per_request: int,
        max_admission_blocks_per_request: int,
        max_spill_pages: int,
    ) -> HiSparseDeviceResidency: ...
    @property
    def num_free_blocks(self) -> int: ...
    def free_blocks(self) -> list[int]:
        """Free device blocks, the next handed out first."""
    def host_free_blocks(self) -> list[int]:
        """Free host blocks, the next handed out first."""
    def tables(
        self, request_id: _RequestId
    ) -> tuple[list[int], list[int], list[int], list[int]] | None:
        """``(host, indexer, resident, hot)`` block ids (resident with residency applied:
        0 for a page read from host), or None."""
    def has_pending_work(self) -> bool: ...
    def has_pending_reclamation(self) -> bool:
        """Whether a pending write-back frees a block when it lands (vLLM's
        ``has_pending_reclamation``: its host block has no other reference, or its request
        can read from host)."""
    def admit(
        self, request_id: _RequestId, num_tokens: int, max_new_tokens: int | None = None
    ) -> bool:
        """Admits a prompt (at most ``max_new_tokens`` of it); False when the pools cannot
        back it (nothing changes).

        Raises:
            InputError: the request holds blocks already.
        """
    def step(self, request_id: _RequestId, num_new_tokens: int) -> bool:
        """The next prefill chunk; False when the pools cannot back it."""
    def decode(self, request_id: _RequestId) -> bool:
        """One sampled token joins the request and is computed; False without room."""
    def allocate_slots(self, request_id: _RequestId, num_tokens: int) -> bool:
        """vLLM's ``KVCacheManager.allocate_slots`` as its scheduler calls it: the tables grow
        to back ``num_tokens`` slots (a request holding none is admitted); nothing is planned
        until ``advance_scheduled``. False when the pools cannot back them (nothing changes).

        Raises:
            InputError: ``num_tokens`` below 1.
        """
    def advance_scheduled(self, request_id: _RequestId, num_computed_tokens: int) -> None:
        """vLLM's ``HiSparseCoordinator.advance_scheduled`` for one scheduled request (the
        tokens computed once its step lands): write-backs planned, then residency updated.

        Raises:
            UnknownRequestError: the request holds no blocks.
        """
    def take_transfers(self) -> list[tuple[int, int, int]]:
        """``[(transfer_id, host_block_id, resident_block_id)]`` planned since the last call."""
    def acknowledge(self, enqueued: dict[int, int], completed: dict[int, int]) -> None:
        """The workers' counts by transfer id (vLLM's ``update_spills``)."""
    def free(self, request_id: _RequestId) -> None:
        """Frees the request (finished or preempted).

        Raises:
            UnknownRequestError: the request holds no blocks.
        """
    def check(self) -> None:
        """Raises InternalError if blocks are not conserved."""

@final
class HiSparseHostPublication:
    """vLLM 0.33's HiSparse host pool with prefix caching on, as the HiSparse connector's
    write-backs and the worker's acknowledgements drive it (the core's
    ``kv::HostPublication``; docs/integrations.md, "vLLM 0.33's scheduler-side HiSparse
    rule", points 2-5 and 8, host side). Not yet driven by the vLLM adapter.

    ``num_blocks`` host blocks (block 0 the null block) of ``block_size`` tokens; at most
    ``max_spill_pages`` write-backs planned between two ``take_transfers``.

    Raises:
        ConfigError: ``num_blocks < 2``, ``block_size < 1`` or ``max_spill_pages < 1``.
    """

    def __new__(
        cls, *, num_blocks: int, block_size: int, max_spill_pages: int
    ) -> HiSparseHostPublication: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def num_free_blocks(self) -> int: ...
    def free_blocks(self) -> list[int]:
        """Free blocks, the next handed out first."""
    def published_blocks(self) -> list[int]:
        """Blocks published for a page (hit-able), ascending."""
    def ref_count(self, block_id: int) -> int: ...
    def table(self, request_id: _RequestId) -> list[int] | None: ...
    def hit_blocks(self, token_ids: _TokenIds) -> list[int]:
        """The blocks of the longest published prefix of ``token_ids`` (never the last token)."""
    def has_pending_work(self) -> bool: ...
    def has_pending_host_reclamation(self) -> bool:
        """Whether a pending write-back alone holds its host block."""
    def admit(
        self, request_id: _RequestId, token_ids: _TokenIds, max_new_tokens: int | None = None
    ) -> int | None:
        """Admits the prompt (at most ``max_new_tokens`` past the hit); returns the hit in
        tokens, or None when the pool cannot back it (nothing changes).

        Raises:
            InputError: the request holds blocks already, or ``token_ids`` is empty.
        """
    def step(self, request_id: _RequestId, num_new_tokens: int) -> bool:
        """The next prefill chunk; False when the pool cannot back it (nothing changes)."""
    def decode(self, request_id: _RequestId, token_id: int) -> bool:
        """Appends ``token_id`` and computes it; False when the pool cannot back its page."""
    def take_transfers(self) -> list[tuple[int, int]]:
        """``[(transfer_id, host_block_id)]`` planned since the last call."""
    def acknowledge(self, enqueued: dict[int, int], completed: dict[int, int]) -> list[_RequestId]:
        """The workers' counts by transfer id (vLLM's ``update_spills``); returns the live
        requests with pages landed, in transfer order, for ``publish_ready``.

        Raises:
            InputError: a negative id or count.
        """
    def publish_ready(self, request_ids: list[_RequestId]) -> None:
        """Publishes each named request's ready prefix, in the order given."""
    def free(self, request_id: _RequestId, *, finished: bool = True) -> None:
        """Frees a finished (or, ``finished=False``, preempted) request's blocks.

        Raises:
            UnknownRequestError: the request holds no blocks.
        """
    def check(self) -> None:
        """Raises InternalError if blocks are not conserved."""

@final
class RadixCache:
    """SGLang's radix prefix cache over token ids, holding one KV slot index per token.

    Raises:
        ConfigError: ``page_size`` below 1 or absurdly large.
    """

    def __new__(cls, *, page_size: int | None = None) -> RadixCache: ...
    @property
    def page_size(self) -> int: ...
    @property
    def evictable_size(self) -> int:
        """Tokens in unlocked nodes: what ``evict`` could free."""
    @property
    def protected_size(self) -> int:
        """Tokens in locked nodes."""
    @property
    def total_size(self) -> int: ...
    @property
    def num_nodes(self) -> int: ...
    def match_prefix(self, token_ids: _TokenIds) -> MatchResult:
        """Longest cached prefix, in whole pages; marks the path most recently used.

        A match ending inside an edge splits it, so the handle names exactly the prefix.
        """
    def insert(self, token_ids: _TokenIds, values: _TokenIds) -> int:
        """Caches ``values`` (one KV slot per token) under ``token_ids``.

        Returns:
            How many leading tokens were already cached; the caller owns (and should free)
            those duplicate slots among ``values``.

        Raises:
            InputError: lengths differ, or the length is not a multiple of page_size.
        """
    def lock(self, handle: NodeHandle) -> None:
        """Protects the path from the handle's node to the root from eviction.

        Raises:
            InputError: the handle is stale (its node was evicted or the cache reset).
        """
    def unlock(self, handle: NodeHandle) -> None:
        """Undoes one ``lock``. Raises InputError if stale or not locked."""
    def evict(self, num_tokens: int) -> npt.NDArray[np.int64]:
        """Evicts least recently used unlocked leaves until >= ``num_tokens`` are freed or
        nothing is evictable; returns the freed slot indices in eviction order."""
    def reset(self) -> None:
        """Drops every node, locked or not; outstanding handles become stale."""
    def check_invariants(self) -> None:
        """Raises InternalError if the internal bookkeeping is inconsistent (a bug)."""

class _MmPositionLike(Protocol):
    @property
    def offset(self) -> int: ...
    @property
    def length(self) -> int: ...

class _VllmMmFeatureLike(Protocol):
    @property
    def identifier(self) -> str: ...
    @property
    def mm_position(self) -> _MmPositionLike: ...

class _MmFeatureObjectLike(Protocol):
    @property
    def offset(self) -> int: ...
    @property
    def length(self) -> int: ...
    @property
    def identifier(self) -> str: ...

_MmFeatureLike: TypeAlias = (
    _MmFeatureObjectLike
    | _VllmMmFeatureLike
    | tuple[int, int, str]
    | tuple[int, int, str, Sequence[bool] | None]
)

class _SchedulerConfigLike(Protocol):
    """Read-only view of ``tokenyard.sched.SchedulerConfig`` (a frozen dataclass)."""

    @property
    def max_num_seqs(self) -> int: ...
    @property
    def max_num_batched_tokens(self) -> int: ...
    @property
    def long_prefill_token_threshold(self) -> int: ...
    @property
    def enable_chunked_prefill(self) -> bool: ...
    @property
    def policy(self) -> str: ...
    @property
    def enable_prefix_caching(self) -> bool: ...
    @property
    def prefix_cache(self) -> str: ...
    @property
    def block_size(self) -> int: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def max_model_len(self) -> int: ...
    @property
    def prioritize_prefill(self) -> bool: ...
    @property
    def num_lookahead_tokens(self) -> int: ...
    @property
    def max_loras(self) -> int: ...
    @property
    def async_scheduling(self) -> bool: ...

@final
class NewRequestData:
    """A request scheduled for the first time, or resumed after preemption."""

    @property
    def req_id(self) -> _RequestId: ...
    @property
    def token_ids(self) -> npt.NDArray[np.uint32]:
        """The prompt (new request), or prompt + outputs so far (resumed: it recomputes)."""
    @property
    def block_ids(self) -> npt.NDArray[np.uint32]:
        """Its whole block table (empty with several KV groups: ``group_block_ids``)."""
    @property
    def group_block_ids(self) -> tuple[npt.NDArray[np.uint32], ...]:
        """With several KV groups (``SchedulerConfig.kv_groups``), its block table of each
        group, vLLM's ``block_ids`` tuple (null blocks, id 0, where a group no longer
        attends); ``()`` with one group."""
    @property
    def num_computed_tokens(self) -> int:
        """Tokens already in the KV cache before this step (prefix-cache hit)."""
    @property
    def lora_id(self) -> int | None: ...
    @property
    def replay_start(self) -> int:
        """Where the replay of its prefix hit starts (SWA bounded replay; vLLM 0.33's
        ``NewRequestData.replay_start``): equal to ``num_computed_tokens`` when the step
        recomputes the hit's last window, else 0."""

@final
class CachedRequestData:
    """Requests running before this step, as parallel sequences."""

    @property
    def req_ids(self) -> list[_RequestId]: ...
    @property
    def new_block_ids(self) -> list[npt.NDArray[np.uint32]]:
        """Blocks appended to each table this step (usually empty for a decode; empty with
        several KV groups)."""
    @property
    def new_group_block_ids(self) -> list[tuple[npt.NDArray[np.uint32], ...]]:
        """With several KV groups, the blocks appended to each group's table this step, per
        request; ``()`` for each with one group."""
    @property
    def num_computed_tokens(self) -> npt.NDArray[np.uint64]:
        """Computed tokens of each before this step."""

@final
class SchedulerOutput:
    """One step's decisions (vLLM V1's ``SchedulerOutput``). Fields are built when read."""

    @property
    def scheduled_new_reqs(self) -> list[NewRequestData]: ...
    @property
    def scheduled_resumed_reqs(self) -> list[NewRequestData]: ...
    @property
    def scheduled_cached_reqs(self) -> CachedRequestData: ...
    @property
    def num_scheduled_tokens(self) -> dict[_RequestId, int]:
        """Tokens to compute per request, in batch order."""
    def num_scheduled_tokens_arrays(
        self,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """``num_scheduled_tokens`` as ``(request_ids, num_tokens)`` int64 arrays in batch
        order: the bulk path for integer request ids (InputError on a str id)."""
    def scheduled_cached_reqs_arrays(
        self,
    ) -> tuple[
        npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.uint32]
    ]:
        """``scheduled_cached_reqs`` as arrays in its order, for integer request ids:
        ``(request_ids, num_computed_tokens, num_new_block_ids, new_block_ids)``, the last
        the new blocks of all of them concatenated (``num_new_block_ids[i]`` each).
        InputError on a str id."""
    @property
    def total_num_scheduled_tokens(self) -> int: ...
    @property
    def scheduled_spec_decode_tokens(self) -> dict[_RequestId, npt.NDArray[np.uint32]]:
        """Draft tokens to verify this step."""
    @property
    def preempted_req_ids(self) -> list[_RequestId]: ...
    @property
    def finished_req_ids(self) -> list[_RequestId]:
        """Requests that finished or were aborted since the previous step."""
    @property
    def kv_loads(self) -> list[KvLoad]:
        """KV loads that began this step (a KV connector's asynchronous loads); each
        request waits until ``Scheduler.finish_kv_transfers`` reports its load."""
    @property
    def scheduled_encoder_inputs(self) -> dict[_RequestId, list[int]]:
        """Per request whose items the encoder runs this step, their indices in its
        ``mm_features`` (vLLM's name)."""
    @property
    def kv_cache_block_copies(self) -> list[tuple[int, int]]:
        """``(src, dst)`` block copies run before this step's forward (vLLM 0.33's)."""
    @property
    def free_encoder_mm_hashes(self) -> list[str]:
        """Identifiers the encoder cache evicted since the last step (vLLM's name)."""

@final
class KvLoad:
    """A KV load that began this step: the engine moves the tokens into the request's
    blocks, then reports it through ``Scheduler.finish_kv_transfers``."""

    @property
    def request_id(self) -> _RequestId: ...
    @property
    def num_external_tokens(self) -> int:
        """Tokens the connector loads, after the local prefix hit."""
    @property
    def num_host_tokens(self) -> int:
        """Tokens loaded from the pool's host-memory tier (0 for now)."""

@final
class SchedulerStats:
    """Queue sizes, KV usage and counters since the scheduler was built."""

    @property
    def num_waiting(self) -> int: ...
    @property
    def num_deferred_waiting(self) -> int:
        """Of ``num_waiting``, those the admission scan skipped (``deferred_waiting_ids``)."""
    @property
    def num_running(self) -> int: ...
    @property
    def kv_usage(self) -> float: ...
    @property
    def prefix_cache_queries(self) -> int:
        """Tokens looked up in the prefix cache."""
    @property
    def prefix_cache_hits(self) -> int:
        """Tokens found there."""
    @property
    def num_preemptions(self) -> int: ...
    @property
    def num_steps(self) -> int: ...

@final
class RequestView:
    """What a policy plugin or a KV connector sees of a request."""

    @property
    def request_id(self) -> _RequestId: ...
    @property
    def num_prompt_tokens(self) -> int: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def num_computed_tokens(self) -> int: ...
    @property
    def max_tokens(self) -> int: ...
    @property
    def priority(self) -> int: ...
    @property
    def arrival_time(self) -> float: ...
    @property
    def num_preemptions(self) -> int: ...
    @property
    def status(self) -> str:
        """ "waiting", "waiting_for_remote_kvs", "preempted" or "running"."""
    @property
    def shared_prefix_boundary(self) -> int:
        """vLLM 0.33's ``Request.shared_prefix_boundary`` as the request's latest prefix
        lookup set it: the hit plus the shared prefix some KV group caches past it, or 0."""

class _PolicyPluginLike(Protocol):
    def order_waiting(self, waiting: list[RequestView], /) -> Iterable[_RequestId]: ...
    def preemption_order(self, running: list[RequestView], /) -> Iterable[_RequestId]: ...

class _KvConnectorLike(Protocol):
    def get_num_new_matched_tokens(
        self, request: RequestView, num_computed_tokens: int, /
    ) -> tuple[int | None, bool] | None: ...
    def update_state_after_alloc(
        self,
        request: RequestView,
        block_ids: npt.NDArray[np.uint32] | tuple[npt.NDArray[np.uint32], ...],
        num_external_tokens: int,
        /,
    ) -> object: ...
    def request_finished(
        self,
        request: RequestView,
        block_ids: npt.NDArray[np.uint32] | tuple[npt.NDArray[np.uint32], ...],
        /,
    ) -> bool | tuple[bool, object]: ...

class _AuxOutputConnector(Protocol):
    def max_cache_hit(
        self, request: RequestView, block_hashes: list[int], block_ids: list[int | None], /
    ) -> int: ...
    def cap_external_hit(
        self,
        request: RequestView,
        num_local: int,
        num_external: int,
        block_hashes: list[int],
        block_ids: list[int | None],
        /,
    ) -> int: ...
    def request_loading(self, request: RequestView, num_tokens: int, /) -> object: ...

class _EncoderConnector(Protocol):
    def has_cache_item(self, identifier: str, /) -> bool: ...
    def update_state_after_alloc(self, request: RequestView, input_id: int, /) -> object: ...

@final
class Scheduler:
    """vLLM V1's step scheduler over a prefix-caching block pool.

    ``plugin`` (see ``tokenyard.sched.PolicyPlugin``) replaces the waiting order and the
    choice of preemption victims. ``connector`` (see ``tokenyard.sched.KvConnector``) loads
    KV from outside the pool and keeps finished requests' blocks for sends (vLLM V1's
    scheduler-side KV connector; docs/embedding.md).

    Raises:
        ConfigError: an impossible config, e.g. ``max_model_len`` beyond the KV capacity,
            a plugin without the two methods, a connector without the three, or a
            connector with ``prefix_cache="radix"``.
    """

    def __new__(
        cls,
        config: _SchedulerConfigLike,
        *,
        plugin: _PolicyPluginLike | None = None,
        connector: _KvConnectorLike | None = None,
    ) -> Scheduler: ...
    def add_request(
        self,
        request_id: _RequestId,
        prompt_token_ids: _TokenIds,
        max_tokens: int,
        *,
        priority: int | None = None,
        arrival_time: float | None = None,
        eos_token_id: int | None = None,
        stop_token_ids: _TokenIds | None = None,
        ignore_eos: bool = False,
        lora_id: int | None = None,
        mm_features: Sequence[_MmFeatureLike] | None = None,
        num_computed_tokens: int | None = None,
        resumable: bool = False,
        repetition_detection: tuple[int, int, int] | None = None,
        min_tokens: int | None = None,
    ) -> None:
        """Queues a request. ``priority`` (default 0): lower runs first
        (policy="priority"); ties go by ``arrival_time`` (default 0.0) then arrival order.
        ``mm_features``: its multimodal items (``tokenyard.sched.MmFeature``, vLLM's
        ``MultiModalFeatureSpec`` or ``(offset, length, identifier[, is_embed])``), sorted by
        offset, under the encoder budget and cache (docs/embedding.md).
        ``num_computed_tokens``: prompt tokens whose KV is already computed (a P/D decode
        side's request, vLLM 0.33's): its first admission counts them, with no prefix
        lookup, and allocates blocks for them with its first chunk.
        ``resumable``: a streaming-input session (vLLM 0.33's): a turn that stops (EOS, a
        stop id, ``max_tokens``) is reported finished by ``update_from_output`` but parks
        the request with its blocks (``num_parked``) until ``resume_session``.
        ``repetition_detection``: ``(max_pattern_size, min_pattern_size, min_count)``,
        vLLM 0.33's ``RepetitionDetectionParams``: after EOS, the stop ids and the length,
        each appended output ends the request (``"repetition"``) when the outputs end in
        their last ``n`` tokens repeated ``min_count`` times, for some ``n`` from
        ``min_pattern_size`` (0 counts as 1) to ``max_pattern_size`` (0 disables it).
        ``min_tokens`` (default 0): outputs before which it is not checked (vLLM's
        ``min_tokens`` defers only this rule in ``check_stop``).

        Raises:
            InputError: duplicate id, empty prompt, ``max_tokens < 1``, a prompt that
                leaves no room for an output token under ``max_model_len`` (none needed
                with ``num_sampled_tokens_per_step=0``), ``num_computed_tokens`` not below
                the prompt's length or with several KV groups, or an item that
                overlaps another, leaves the prompt, or could never be scheduled (more
                embeddings than ``max_num_encoder_input_tokens`` or ``encoder_cache_size``;
                longer than ``max_num_batched_tokens`` under ``disable_chunked_mm_input``),
                ``repetition_detection`` settings vLLM refuses (``min_pattern_size`` above
                ``max_pattern_size``, ``min_count < 2`` with ``max_pattern_size > 0``), or
                ``min_tokens`` without ``repetition_detection``.
        """
    def schedule(self, *, throttle_prefills: bool = False) -> SchedulerOutput:
        """Forms the next batch: running requests first, then admissions.
        ``throttle_prefills`` (vLLM 0.33's DP prefill balancing: the step is not
        cadence-aligned) holds prefill work back while a request decodes, unless the last
        step that released prefill left the waiting queue undrained.

        Raises:
            PolicyError: the plugin's answer is not a reordering of the ids it was given.
            Any exception the plugin raised, unchanged (the scheduler is unchanged too).
            ConnectorError: the connector raised or answered badly while a request was
                admitted; admission stopped there and the step formed so far is returned
                by the next call.
        """
    def update_draft_token_ids(self, spec_token_ids: Mapping[_RequestId, _TokenIds]) -> None:
        """Drafts proposed after a step's update (vLLM's ``update_draft_token_ids``): as
        ``update_from_output({}, spec_token_ids=...)``, but no step's output (a preempted
        request's stale outputs are not counted as landed by it).

        Raises:
            InputError: an id the scheduler does not hold, or too many drafts.
        """
    def update_from_output(
        self,
        sampled_token_ids: Mapping[_RequestId, _TokenIds],
        *,
        num_rejected_tokens: Mapping[_RequestId, int] | None = None,
        spec_token_ids: Mapping[_RequestId, _TokenIds] | None = None,
    ) -> list[tuple[_RequestId, str]]:
        """Applies the engine's results; returns the requests that finished and why
        (``"length"``, ``"stop"``, ``"repetition"``, ``"error"``). All-or-nothing on bad ids.

        Raises:
            UnknownRequestError: an id the scheduler does not hold.
            InputError: an id repeated, tokens for a request that is not running, or more
                rejected tokens than were speculated.
            ConnectorError: the connector's ``request_finished`` raised or answered badly;
                the update was applied in full all the same (that request's blocks freed),
                and the finished requests appear in the next step's ``finished_req_ids``.
        """
    def update_from_output_arrays(
        self,
        request_ids: npt.ArrayLike,
        sampled_token_ids: _TokenIds,
        num_sampled: npt.ArrayLike | None = None,
    ) -> list[tuple[_RequestId, str]]:
        """``update_from_output`` in bulk for integer request ids: ``request_ids[i]``
        sampled ``num_sampled[i]`` tokens (one each when omitted), taken in order from
        ``sampled_token_ids``; no speculation. Same checks and result; InputError when the
        lengths do not agree."""
    def abort(self, request_ids: _RequestId | Iterable[_RequestId]) -> None:
        """Finishes requests wherever they are: one id or an iterable of them (a str is one
        id). Raises UnknownRequestError first if any id is unknown; ConnectorError (after
        aborting them all) if the connector's ``request_finished`` failed."""
    def finish_kv_transfers(
        self,
        *,
        finished_recving: Iterable[_RequestId] = (),
        finished_sending: Iterable[_RequestId] = (),
        failed_recving: Iterable[_RequestId] = (),
    ) -> None:
        """Reports KV transfers that ended (vLLM's ``KVConnectorOutput``): loads that landed
        (the request runs from the next ``schedule()``), loads that failed (it recomputes
        its prompt; the connector is not asked again), and sends that completed (the
        finished request's blocks are freed). All-or-nothing.

        Raises:
            InputError: an id with no such transfer in flight (not loading, and no finished
                request's blocks are held for it), or an argument that is not an iterable
                of ids.
        """
    def has_unfinished_requests(self) -> bool:
        """Whether any request can still make progress (parked sessions excepted)."""
    @property
    def num_waiting(self) -> int: ...
    @property
    def num_parked(self) -> int:
        """Streaming-input sessions parked between turns (``resume_session``)."""
    @property
    def num_unparked_resumes(self) -> int:
        """Chunks taken by sessions whose streaming wait was set by hand
        (``resume_unparked_session``); vLLM 0.33 takes each off its parked-session counter,
        so its admission cap counts that many fewer."""
    def resume_session(
        self,
        request_id: _RequestId,
        prompt_token_ids: _TokenIds,
        max_tokens: int,
        *,
        arrival_time: float = 0.0,
        eos_token_id: int | None = None,
        stop_token_ids: _TokenIds | None = None,
        ignore_eos: bool = False,
        repetition_detection: tuple[int, int, int] | None = None,
        min_tokens: int | None = None,
        at_stop: bool = False,
        mm_features: Sequence[_MmFeatureLike] | None = None,
    ) -> None:
        """A parked session's next input chunk (vLLM 0.33's ``_update_request_as_session``):
        its last sampled token is dropped, its other outputs and ``prompt_token_ids``
        become its prompt, the settings given replace its own, and it waits among the
        requests holding blocks, keeping its computed tokens (its next admission computes
        only the rest). The outputs of its steps in flight when it parked are no longer
        expected. ``at_stop``: the chunk was queued while the session ran and is taken as
        its turn stops, so it is not among the requests admission skipped (vLLM's
        ``deferred_waiting``); a chunk for a session parked earlier leaves it there.
        ``mm_features``: the chunk's multimodal items, offsets counted from its first
        token; they are placed after the kept tokens and appended to the session's items
        (checked as ``add_request`` checks them, over the new prompt).

        Raises:
            InputError: an unknown id, a request not parked, ``max_tokens < 1``, a prompt
                that leaves no room for an output token under ``max_model_len``, or stop
                rules ``add_request`` refuses.
        """
    @property
    def num_running(self) -> int: ...
    @property
    def num_free_blocks(self) -> int:
        """Blocks free for allocation (cached blocks no request holds included; less the
        gap ``force_num_free_blocks`` forced)."""
    def force_num_free_blocks(self, num_free_blocks: int) -> None:
        """Forces the free count the fit checks read, as vLLM's tests set
        ``FreeKVCacheBlockQueue.num_free_blocks``: the gap to the free queue's length then
        stays as blocks are taken and freed; the queue keeps its order. Raises
        ``InputError`` (``num_free_blocks``) above the queue's blocks, or on the radix pool."""
    @property
    def num_kv_transfers(self) -> tuple[int, int]:
        """``(loading, held)``: requests waiting for a KV load, and finished requests whose
        blocks are held for a transfer (a send, or an aborted request's load)."""
    @property
    def defer_block_free(self) -> bool:
        """vLLM 0.33's ``defer_block_free`` (settable): blocks of a request finished or
        preempted while a step that served it is in flight return to the pool only once the
        newest step scheduled then is processed (``step_processed``)."""
    @defer_block_free.setter
    def defer_block_free(self, defer: bool) -> None: ...
    @property
    def drop_stale_output(self) -> bool:
        """Under async scheduling, whether a request preempted within a step drops the
        outputs of its steps in flight (settable; vLLM 0.33's ``drop_stale_output`` with a KV
        connector that ``requires_kv_delivery``). Otherwise they are delivered (and with
        ``wait_for_stale_outputs`` the request waits for them)."""
    @drop_stale_output.setter
    def drop_stale_output(self, drop: bool) -> None: ...
    @property
    def wait_for_stale_outputs(self) -> bool:
        """Under async scheduling, whether a preempted request whose outputs in flight are
        delivered waits for them before it is admitted again (settable, default ``False``;
        vLLM 0.33's rule, which vLLM's adapter turns on). Needs ``update_from_output`` once
        per step scheduled, empty steps included."""
    @wait_for_stale_outputs.setter
    def wait_for_stale_outputs(self, wait: bool) -> None: ...
    def resume_unparked_session(
        self,
        request_id: _RequestId,
        output_token_ids: _TokenIds,
        num_computed_tokens: int,
        prompt_token_ids: _TokenIds,
        max_tokens: int,
        *,
        arrival_time: float = 0.0,
        eos_token_id: int | None = None,
        stop_token_ids: _TokenIds | None = None,
        ignore_eos: bool = False,
        repetition_detection: tuple[int, int, int] | None = None,
        min_tokens: int | None = None,
        mm_features: Sequence[_MmFeatureLike] | None = None,
    ) -> None:
        """A chunk for a session whose streaming wait was set by hand on a request queued
        and never scheduled (vLLM 0.33's ``_update_request_as_session`` on it):
        ``output_token_ids`` (appended by hand) join its tokens, its last token is dropped,
        the kept ones and ``prompt_token_ids`` make its prompt, and ``num_computed_tokens``
        of them count as computed. It stays where it waits; admission takes it from those
        computed tokens (no prefix lookup), scheduling its items past them. ``mm_features``:
        the chunk's items, offsets counted from the chunk, as for ``resume_session``.

        Raises:
            InputError: an unknown id, a request that is parked or not a session queued
                untouched, no token to drop, ``num_computed_tokens`` covering the last
                token, or as ``resume_session`` for the chunk.
        """
    def end_session(self, request_id: _RequestId) -> None:
        """The session finishes at its next stop instead of parking.

        Raises:
            UnknownRequestError: an id the scheduler does not hold.
        """
    @property
    def ask_again_after_failed_load(self) -> bool:
        """Whether a request whose KV load failed (``failed_recving``) asks the connector
        again when it is next admitted, as vLLM 0.33 does under
        ``kv_load_failure_policy = "recompute"`` (settable; off by default: it recomputes its
        prompt without the connector)."""
    @ask_again_after_failed_load.setter
    def ask_again_after_failed_load(self, on: bool) -> None: ...
    @property
    def append_prefill_chunk_outputs(self) -> bool:
        """Whether tokens given for a running request's prefill chunk (a step that samples
        nothing) are appended as its output, as vLLM 0.33's ``update_from_output`` appends
        what its runner returns for any scheduled request (settable; off by default: such
        tokens raise ``InputError`` naming the request)."""
    @append_prefill_chunk_outputs.setter
    def append_prefill_chunk_outputs(self, on: bool) -> None: ...
    @property
    def kv_load_failure_policy(self) -> str:
        """vLLM 0.33's ``kv_load_failure_policy``: ``"recompute"`` (the default: a failed
        load's request recomputes what did not load) or ``"fail"`` (it finishes with
        ``FinishReason.ERROR``). Settable.

        Raises:
            ConfigError: any other name.
        """
    @kv_load_failure_policy.setter
    def kv_load_failure_policy(self, policy: str) -> None: ...
    def failed_load_ids(self) -> list[_RequestId]:
        """Loading requests whose load failed (whole or in part) and was not taken yet
        (vLLM 0.33's ``failed_recving_kv_req_ids``), in no particular order."""
    def handle_kv_load_failures(
        self,
        *,
        failed_recving: Iterable[_RequestId] | None = None,
        invalid_block_ids: Iterable[int] | None = None,
        num_scheduled_tokens: dict[_RequestId, int] | None = None,
    ) -> tuple[list[tuple[_RequestId, int]], list[_RequestId], list[_RequestId], int]:
        """The engine's failed KV loads for the step being updated, applied before its
        outputs, as vLLM 0.33's ``update_from_output`` applies them
        (``_handle_failed_recving``, ``_handle_invalid_blocks``): ``failed_recving``, loading
        requests whose load failed whole (others are ignored); ``invalid_block_ids``,
        blocks a load left invalid; ``num_scheduled_tokens``, the step's tokens by id.
        Every loading, then running, request whose computed blocks (before the step) hold
        an invalid block is cut back to the start of its first one no request before it
        marked; a loading one lands later with that valid prefix cached, a running one
        keeps its blocks and recomputes from there. Under ``"fail"`` each affected request
        finishes with ``FinishReason.ERROR`` instead, at the next ``update_from_output``
        after its outputs (reported among its finished requests).

        Returns:
            ``(truncated, rescheduled, failed, num_affected_tokens)``: each affected request
            with its computed tokens as cut back; the running ones whose output of this
            step is not to be given (``update_from_output`` without them); those the next
            update finishes with an error (their outputs not to be given either); the
            tokens they lost.

        Raises:
            ConfigError: ``invalid_block_ids`` with several KV cache groups, or for a
                running request on a pool other than the block-hash one.
            InputError: a running request with more than this step in flight.
            Nothing changed then.
        """
    @property
    def defer_async_loads(self) -> bool:
        """vLLM 0.33's ``defer_async_loads`` (settable; with ``defer_block_free``): an
        asynchronous KV load admitted while a step is in flight is handed to the connector
        once that step is processed."""
    @defer_async_loads.setter
    def defer_async_loads(self, defer: bool) -> None: ...
    def deferred_load_ids(self) -> list[_RequestId]:
        """Requests whose asynchronous load waits for a step in flight before it starts."""
    def set_hisparse_host_pages(
        self,
        num_blocks: int | None = None,
        block_size: int | None = None,
        source_group: int | None = None,
    ) -> None:
        """vLLM 0.33's HiSparse host page pool (``hisparse_host_num_blocks``, its null block
        included; ``block_size`` defaults to the config's, the only one served): one host
        block per block of the first KV group (or the single pool) a request holds, handed
        out and taken back in vLLM's host pool's order, the whole prompt's pages checked at
        admission, released with the blocks; ``None``: off. ``source_group``: the place of
        vLLM's source group among its groups, where the per-group block ids then carry the
        host tables (KV groups only). Raises ConfigError for fewer than 2 blocks, another
        block size or pool kind, ``scheduler_reserve_full_isl`` off, requests already
        holding blocks, the HiSparse connector on (it holds the pool), or a
        ``source_group`` without KV groups or past them."""
    @property
    def hisparse_host_pages(self) -> tuple[int, int, int] | None:
        """``(num_blocks, block_size, num_free_blocks)`` of the HiSparse host pool, or None."""
    def hisparse_host_free_blocks(self) -> list[int]:
        """The HiSparse host pool's free blocks, the next handed out first."""
    def set_hisparse_connector(self, *, max_spill_pages: int) -> None:
        """Turns vLLM 0.33's HiSparse connector on (prefix caching off) over the host pool
        and the KV groups: the step plans its write-backs (at most ``max_spill_pages``,
        vLLM's ``max_model_len // block_size``) after the step's allocations, the host pool
        becomes the connector's. Raises ConfigError without the host pool or the
        resident and hot groups, with prefix caching on, or once requests hold blocks."""
    @property
    def hisparse_connector(self) -> bool:
        """Whether the HiSparse connector is on."""
    def take_hisparse_transfers(self) -> list[tuple[int, int, int]]:
        """The write-backs planned since the last call, ``(transfer_id, host_block_id,
        resident_block_id)`` (vLLM's ``build_offload_command``). ConfigError without the
        connector."""
    def hisparse_tables(
        self, request_id: _RequestId
    ) -> tuple[list[int], list[int], list[int], list[int]] | None:
        """``(host, indexer, resident row, hot)`` block ids of the request (pages lost to
        reuse 0), or None when it holds no blocks or the connector is off."""
    def hisparse_acknowledge(self, enqueued: dict[int, int], completed: dict[int, int]) -> None:
        """The workers' ``{transfer_id: count}`` reports (vLLM's ``update_spills``), after
        the step's update. InputError for a negative id or count; ConfigError without the
        connector."""
    def take_hisparse_lost_pages(self) -> list[tuple[_RequestId, int]]:
        """``(request_id, page)`` lost to block reuse since the last call."""
    @property
    def hisparse_pending_reclamation(self) -> bool:
        """vLLM's ``has_pending_reclamation`` (the connector's ``has_pending_block_frees``)."""
    @property
    def hisparse_num_pending_transfers(self) -> int:
        """Write-backs planned and not yet acknowledged (vLLM's ``pending_spills``)."""
    @property
    def hisparse_pending_work(self) -> bool:
        """vLLM's ``has_pending_work`` (the connector's ``has_pending_push_work``)."""
    def inflight_prefill_ids(self) -> list[_RequestId]:
        """The requests whose prefill is in flight (vLLM 0.33's ``_inflight_prefills``):
        admitted with prompt left to compute, or loading asynchronously."""
    @property
    def sched_step_seq(self) -> int:
        """Steps that scheduled any token while frees were deferred (vLLM's)."""
    @property
    def processed_step_seq(self) -> int:
        """Of those, the steps reported processed (vLLM's)."""
    def step_processed(self) -> None:
        """The oldest step in flight that scheduled any token was processed (call before
        its ``update_from_output``): deferred frees whose fence it reaches are freed."""
    def deferred_frees(self) -> list[tuple[int, list[int]]]:
        """The deferred frees, oldest first: ``(fence_step, block_ids)``."""
    def take_loose_blocks(self, num_blocks: int) -> list[int]:
        """vLLM 0.33's ``BlockPool.get_new_blocks``: free blocks held outside any request.
        Raises ConfigError over the radix pool, InputError when fewer are free."""
    def free_loose_blocks(self, block_ids: list[int]) -> None:
        """vLLM 0.33's ``BlockPool.free_blocks`` on blocks from ``take_loose_blocks``.
        Raises InputError for a block without such a reference left."""
    def touch_loose_blocks(self, block_ids: list[int]) -> None:
        """vLLM 0.33's ``BlockPool.touch`` by id: one reference more on each, held outside
        any request until ``free_loose_blocks`` (a free block leaves the free queue, its
        cached hash kept). Raises ConfigError over the radix pool, InputError for an id
        that is not a block of the pool (nothing changes then)."""
    def queue_block_copies(self, copies: list[tuple[int, int]]) -> None:
        """Queues ``(src, dst)`` copies for the next step's ``kv_cache_block_copies``; each
        endpoint's ``take_loose_blocks`` reference is retained until that step is processed.
        Raises InputError (nothing queued) for an endpoint without one."""
    def pending_block_copies(self) -> list[tuple[int, int]]:
        """The copies queued and not yet carried by a step."""
    def take_pending_block_copies(self) -> list[tuple[int, int]]:
        """Hands the queued copies to a step formed without ``schedule()`` (a paused
        engine's empty step), releasing their endpoints as that step's would be."""
    @property
    def encoder_budget(self) -> int:
        """The encoder compute budget per step, in embeddings (settable: from the next step
        on, as given; 0 encodes nothing)."""
    @encoder_budget.setter
    def encoder_budget(self, max_num_encoder_input_tokens: int) -> None: ...
    @property
    def num_prefill_lookahead(self) -> int:
        """Known prefill tokens a drafter reads past a chunk's end (vLLM 0.33's
        ``num_prefill_lookahead``; settable, from the next step on)."""
    @num_prefill_lookahead.setter
    def num_prefill_lookahead(self, num_prefill_lookahead: int) -> None: ...
    @property
    def num_hash_lookahead_tokens(self) -> int:
        """Tokens past each block that its hash covers (vLLM 0.33's
        ``num_hash_lookahead_tokens``; ``SchedulerConfig``'s). Settable while no request
        holds blocks; raises ``ConfigError`` otherwise, with a KV connector, or where the
        config would refuse it."""
    @num_hash_lookahead_tokens.setter
    def num_hash_lookahead_tokens(self, lookahead: int) -> None: ...
    @property
    def mamba_align(self) -> tuple[int, bool, int] | None:
        """vLLM 0.33's Mamba ``align`` split in force as ``(block_size, drop_eagle_block,
        num_hash_lookahead_tokens)``, the look-ahead being the scheduler's
        (``num_hash_lookahead_tokens``); ``None``: off."""
    def set_mamba_align(self, block_size: int, drop_eagle_block: bool = False) -> None:
        """Turns the Mamba ``align`` split on over blocks of ``block_size`` tokens (0: off)
        from the next step (``Scheduler._mamba_block_aligned_split``); its hash look-ahead
        is ``num_hash_lookahead_tokens``."""
    def cached_block_id(self, block_hash: int, group: int = 0) -> int | None:
        """The KV block of ``group`` caching ``block_hash`` (tokenyard's hash, as
        ``tokenyard.kv.block_hashes`` computes it), or ``None``; ids as in
        ``block_ref_counts``."""
    def set_aux_output_connector(self, connector: _AuxOutputConnector | None) -> None:
        """Sets (``None``: removes) the auxiliary-output connector asked at admission
        (vLLM 0.33's ``AuxOutputSchedulerConnector``): the local prefix hit is capped at
        its ``max_cache_hit(view, block_hashes, block_ids)``, a KV connector's tokens at its
        ``cap_external_hit(view, num_local, num_external, block_hashes, block_ids)``, and
        each asynchronous load is reported to its ``request_loading(view, num_tokens)``.
        ``block_hashes`` are the request's full blocks' hashes and ``block_ids`` the KV
        group 0 block caching each (``None``: none), as ``cached_block_id`` would answer
        (the scheduler cannot be called back while it asks). Raises ConfigError for an
        object without those methods or with the radix pool."""
    def set_encoder_connector(self, connector: _EncoderConnector | None) -> None:
        """Sets (``None``: removes) the encoder-cache connector asked while steps are formed
        (vLLM 0.33's ``ECConnectorBase``): an item whose ``has_cache_item(identifier)`` is
        true takes encoder-cache room but no encoder budget and is not encoded; each item
        given room is reported to ``update_state_after_alloc(view, input_id)``. An object
        that also has ``ensure_cache_available(view, num_computed_tokens)`` is asked it
        before a request with items is given tokens; ``False`` skips the request for the
        step (vLLM 0.33's inputs in transit). One that also has
        ``update_state_after_free(view, input_id)`` is told of each item an update lets go
        (vLLM 0.33's ``_free_encoder_input``). One that also has ``request_finished(view)``
        is asked it for each request that finishes, after the KV connector: ``True``
        (delay-free) keeps the request's KV blocks until ``finish_kv_transfers`` lists it
        in ``finished_sending`` (vLLM 0.33's ``_free_request``). Its exceptions come back
        as the cause of a ``ConnectorError`` from ``schedule()``, whose step the next call
        returns (from ``update_from_output`` after the update is applied, for
        ``update_state_after_free`` and ``request_finished``).
        Raises ConfigError for an object without the first two methods."""
    def set_step_hooks(
        self,
        *,
        allocate: Callable[[Any, int, int], object] | None = None,
        mamba_split: Callable[[Any, int, int, int], int] | None = None,
        priority: Callable[[Any], int | None] | None = None,
        pending_block_frees: Callable[[], object] | None = None,
        encoder_can_allocate: Callable[[Any, int, int, int], object] | None = None,
        waiting_ready: Callable[[Any], object] | None = None,
    ) -> None:
        """Routes the step's allocations (``allocate(request_id, num_new_tokens,
        num_lookahead_tokens)``, falsy: refused, as when the pool has no room), Mamba
        ``align`` splits (``mamba_split(request_id, start, num_new_tokens, core_split)``,
        the tokens kept) and, under the priority policy, the running requests' priorities
        before a victim is picked (``priority(request_id)``, None: unchanged) through
        Python from the next step; ``pending_block_frees()`` is asked when a running
        request's allocation finds no room (truthy: it waits instead of preempting, vLLM
        0.33's connector ``has_pending_block_frees``) and ``encoder_can_allocate(request_id,
        input_index, budget_left, num_embeds_to_schedule)`` before an encoder input is
        given cache room (falsy: refused, as when the cache or budget has none; vLLM's
        ``EncoderCacheManager.can_allocate``), and ``waiting_ready(request_id)`` when
        admission reaches a request waiting outside (``wait_outside``; truthy ends the wait,
        vLLM 0.33's ``_handle_blocked_waiting_request``); none: the core alone."""
    @property
    def num_draft_slots_per_request(self) -> int:
        """Input slots a parallel drafter takes per scheduled request beside its tokens
        (vLLM 0.33's ``max_num_new_slots_for_drafting``: each scheduled request costs its
        tokens and these of the budget, gets at most the budget less these, and none is
        scheduled once no more than these remain); settable, from the next step on."""
    @num_draft_slots_per_request.setter
    def num_draft_slots_per_request(self, num_draft_slots: int) -> None: ...
    @property
    def num_sampled_tokens_per_step(self) -> int:
        """vLLM 0.33's ``num_sampled_tokens_per_step`` (1, or 0 for a pooling or diffusion
        model: no room kept for a sampled token, no admission padded with drafts); settable,
        from the next step on."""
    @num_sampled_tokens_per_step.setter
    def num_sampled_tokens_per_step(self, num: int) -> None: ...
    @property
    def is_encoder_decoder(self) -> bool:
        """Whether encoder inputs are an encoder-decoder model's (vLLM 0.33's
        ``is_encoder_decoder``): all of a request's items are encoded with its first decoder
        tokens, wherever their placeholder ranges lie, their encoder tokens size its
        ``CrossAttentionSpec`` groups, and the cache is vLLM's ``EncoderDecoderCacheManager``
        counter (``docs/embedding.md``)."""
    def set_encoder_decoder(self, encoder_decoder: bool) -> None:
        """Sets ``is_encoder_decoder``. Raises InputError while a request has multimodal
        items."""
    def set_encoder_cache_size(self, cache_size: int) -> None:
        """Replaces the encoder cache with an empty one of ``cache_size`` embeddings; its
        freeable entries are reported freed with the next step. Raises InputError while a
        request holds an entry."""
    def encoder_cache_entries(self) -> list[tuple[str, list[_RequestId]]]:
        """The encoder cache's entries by ``mm_hash``, each with the requests referencing
        it (none: freeable)."""
    def encoder_cache_freeable(self) -> list[tuple[str, int]]:
        """The freeable entries, oldest first (the eviction order): ``(mm_hash,
        num_embeds)``."""
    def encoder_cache_freed(self) -> list[str]:
        """Identifiers evicted since the last step's ``free_encoder_mm_hashes``."""
    def last_sched_seq(self, request_id: _RequestId) -> int:
        """The latest numbered step that served the request. Raises UnknownRequestError."""
    @property
    def num_executed_steps(self) -> int:
        """Steps that scheduled any token (vLLM 0.33's ``num_executed_steps``)."""
    @property
    def last_prefill_step(self) -> int:
        """The executed step that last carried prefill (``prefill_schedule_interval``);
        a full interval before 0 until one has."""
    @property
    def prefill_capacity_bound(self) -> bool:
        """The last step that released prefill left requests waiting that it did not skip
        (vLLM 0.33's ``prefill_capacity_bound``): throttling stands aside."""
    def running_ids(self) -> list[_RequestId]: ...
    def waiting_ids(self) -> list[_RequestId]:
        """Waiting requests in the order they would be admitted."""
    def deferred_waiting_ids(self) -> list[_RequestId]:
        """Waiting requests the admission scan skipped (a KV load not landed, a LoRA slot,
        a connector that could not tell) and not admitted since (vLLM 0.33's
        ``deferred_waiting``), in admission order."""
    def holding_waiting_ids(self) -> list[_RequestId]:
        """The waiting requests served first (vLLM 0.33's ``kv_holding_waiting``): those
        holding KV blocks and remote-KV waits outside, in order."""
    def wait_outside(self, request_id: _RequestId, holds_kv: bool, defer: bool = True) -> None:
        """Makes a waiting request's wait its caller's (vLLM 0.33's blocked waiting
        statuses the core does not model; ``holds_kv``: served with the block holders, a
        remote-KV wait whose load the core did not start): skipped, keeping its place,
        until the step hook ``waiting_ready(request_id)`` answers truthy when admission
        reaches it, or ``end_outside_wait``. With ``defer`` it counts as skipped (vLLM's
        ``deferred_waiting``, which a blocked request joins on arrival, not through a
        queue's ``add_request``). Raises InputError for a request that is not waiting or
        holds blocks."""
    def end_outside_wait(self, request_id: _RequestId) -> bool:
        """Ends a request's outside wait; returns whether it had one."""
    def waits_outside(self, request_id: _RequestId) -> bool:
        """Whether the request is live and waits outside."""
    def requeue_waiting(self, request_id: _RequestId, holding: bool) -> None:
        """Moves a waiting request holding no blocks to the back of the block holders
        (``holding``) or of the rest (vLLM 0.33's ``kv_holding_waiting.add_request`` or
        ``waiting.add_request``). Raises InputError as ``wait_outside``."""
    def set_admit_new(self, admit_new: bool) -> None:
        """With ``False``, only waiting requests that hold KV blocks (their load began) are
        admitted; the rest keep their places (vLLM's ``PAUSED_NEW``)."""
    def num_cached_prefix_tokens(self, token_ids: _TokenIds, *, lora_id: int | None = None) -> int:
        """Tokens of ``token_ids`` the prefix cache holds now (whole blocks, never the last
        token), as an admission would find them; nothing is allocated."""
    def kv_hits_per_group(
        self, block_hashes: Sequence[int], max_length: int
    ) -> tuple[tuple[npt.NDArray[np.uint32], ...], list[int]]:
        """Each KV group's own prefix hit over the core's hashes of a query's first full
        blocks (``tokenyard.kv.block_hashes``), no longer than ``max_length`` tokens, not
        reconciled across groups (vLLM's ``find_longest_cache_hit_per_group``): each
        group's blocks and hit length. ConfigError without KV groups."""
    def kv_allocate_outside(
        self,
        request_id: _RequestId,
        token_ids: _TokenIds,
        num_new_tokens: int,
        *,
        lora_id: int | None = None,
    ) -> tuple[npt.NDArray[np.uint32], ...] | None:
        """vLLM's ``allocate_slots`` for a request this scheduler does not hold (its prefix
        cache seeded directly, as vLLM's tests do): ``token_ids`` not given before,
        ``num_new_tokens`` more computed. Each group's new blocks, or None when they do not
        fit. ConfigError without KV groups; InputError for a request the scheduler holds."""
    def adopt_running(
        self, request_id: _RequestId, output_token_ids: _TokenIds, num_computed_tokens: int
    ) -> None:
        """Moves a request queued and not yet scheduled to the end of the running list,
        ``output_token_ids`` appended and ``num_computed_tokens`` computed (blocks allocated
        for them; vLLM's ``scheduler.running.append``). InputError for a request not queued
        untouched or computed tokens past its tokens; CapacityError when they do not fit."""
    def update_from_outside_step(
        self,
        step: Mapping[_RequestId, tuple[int, int]],
        sampled_token_ids: Mapping[_RequestId, _TokenIds],
        *,
        num_rejected_tokens: Mapping[_RequestId, int] | None = None,
        spec_token_ids: Mapping[_RequestId, _TokenIds] | None = None,
    ) -> list[tuple[_RequestId, str]]:
        """``update_from_output`` for a step formed outside the scheduler: ``step`` maps
        each of its running requests to ``(num_scheduled_tokens, num_spec_tokens)``, tokens
        already counted as computed; the outputs name only its requests. It lands none of
        the scheduler's own steps. InputError for a request not running, with a step of
        the scheduler's in flight, or a count out of range; as ``update_from_output``
        otherwise."""
    def kv_outside_tokens(self, request_id: _RequestId) -> tuple[int, int] | None:
        """The tokens given and computed of a request ``kv_allocate_outside`` gave blocks
        to, or ``None``."""
    def kv_free_outside(self, request_id: _RequestId) -> None:
        """Frees the blocks ``kv_allocate_outside`` gave the request (InputError for any
        other request)."""
    def kv_evict_blocks(self, block_ids: Sequence[int]) -> None:
        """Takes the blocks out of the prefix cache, held or free (vLLM's
        ``BlockPool.evict_blocks``). ConfigError without KV groups; InputError for an id
        past the pool."""
    def num_computed_tokens(self, request_id: _RequestId) -> int:
        """Tokens with KV, counting those scheduled in the latest step."""
    def num_tokens(self, request_id: _RequestId) -> int:
        """Prompt plus output tokens so far."""
    def num_outputs_in_flight(self, request_id: _RequestId) -> int:
        """Outputs still expected for the request (its sampling steps in flight), live or
        finished: a request that finished with steps in flight (async scheduling) has its
        blocks freed at once, and its late outputs are accepted and dropped. 0 for an id
        never seen or done with."""
    def block_ids(self, request_id: _RequestId) -> npt.NDArray[np.uint32]:
        """The request's block table in order; empty while it holds none.

        Raises:
            UnknownRequestError: an id the scheduler does not hold.
        """
    def group_block_ids(self, request_id: _RequestId) -> tuple[npt.NDArray[np.uint32], ...]:
        """With several KV groups, the request's block table of each group; ``()`` with one
        group. Raises UnknownRequestError."""
    def waiting_for_remote_kvs(self, request_id: _RequestId) -> bool:
        """Whether the request waits for its KV load (``WAITING_FOR_REMOTE_KVS``): not yet
        reported, or reported and not yet taken by an admission pass. Raises
        UnknownRequestError."""
    def set_kv_cache_zeroing(self, on: bool) -> None:
        """Zeroes new KV blocks before use (vLLM 0.33's ``needs_kv_cache_zeroing``): each
        step's go to ``take_new_block_ids``, but those an asynchronous load writes in the
        groups it restores. Raises ConfigError with one KV group."""
    def take_new_block_ids(self) -> npt.NDArray[np.uint32]:
        """The KV blocks to zero handed out since the last call, group by group (vLLM's
        ``SchedulerOutput.new_block_ids_to_zero``); empty without zeroing."""
    def prune_skipped_blocks(self, request_id: _RequestId) -> tuple[npt.NDArray[np.uint32], ...]:
        """Frees the blocks the request's KV groups no longer attend to on the
        processed-token basis (its computed tokens less those of steps in flight), as vLLM
        0.33's ``_connector_finished`` does; returns each group's table after (one table
        with one group). Raises UnknownRequestError."""
    def preempt_request(self, request_id: _RequestId) -> None:
        """Preempts a running request from outside a step (vLLM's ``_preempt_request``
        called directly): its blocks are freed, it goes back to the head of the waiting
        queue and recomputes; the outputs of its steps in flight are still accepted.

        Raises:
            UnknownRequestError: an id the scheduler does not hold.
            InputError: the request is not running.
        """
    def block_ref_counts(self) -> npt.NDArray[np.uint32]:
        """Per KV block, the requests holding it, in block-id order: the single pool's own
        ids (vLLM's less one), or with several KV groups the coordinator's, whose block 0 is
        vLLM's null block. Empty with ``prefix_cache="radix"``. O(blocks)."""
    def block_hashes(self) -> list[int | None]:
        """Per KV block, in the order of ``block_ref_counts``, the 128-bit hash it caches
        (tokenyard's own, not vLLM's), or ``None``. O(blocks)."""
    def free_block_ids(self) -> npt.NDArray[np.uint32]:
        """Free KV block ids, next to be handed out first (ids as in
        ``block_ref_counts``); cached blocks no request holds included."""
    def kv_request_ids(self) -> list[_RequestId]:
        """The requests holding a block table in the KV pool (finished ones whose blocks a
        KV transfer holds included), in no order."""
    def kv_block_tables(self, request_id: _RequestId) -> tuple[npt.NDArray[np.uint32], ...] | None:
        """The request's block table of each KV group (one with a single group; ids as in
        ``block_ref_counts``), a finished request's whose blocks a KV transfer holds and one
        ``kv_allocate_outside`` gave blocks included; ``None`` if it holds none."""
    def num_cached_blocks_of(self, request_id: _RequestId) -> list[int] | None:
        """Per KV group, the request's leading blocks registered in the prefix cache
        (vLLM's ``num_cached_block``); ``None`` if it holds no blocks."""
    def reset_prefix_cache(self, *, preempt_running: bool = False) -> tuple[bool, list[_RequestId]]:
        """vLLM's ``reset_prefix_cache``: forgets every cached prefix, which needs every
        block free (``prefix_cache="radix"`` never resets). With ``preempt_running`` the
        running requests are preempted first, the last first, and the outputs of their
        steps in flight dropped. Returns whether the cache was reset, and the ids
        preempted (they come back in ``scheduled_resumed_reqs``)."""
    def enable_kv_events(self) -> None:
        """Starts recording prefix-cache events for ``drain_kv_events``."""
    def drain_kv_events(self) -> list[tuple[str, int]]:
        """Prefix-cache events since the last call, oldest first: ``(kind, block_hash)``,
        kind ``"stored"``, ``"removed"``, ``"host_stored"``, ``"host_removed"`` or
        ``"all_cleared"`` (hash 0). Hashes are tokenyard's own (128-bit), not vLLM's."""
    def enable_kv_cache_calls(self) -> None:
        """Starts recording each cache call and each lookup's hit beside the prefix-cache
        events (which it turns on too), for ``drain_kv_events_detailed``. ConfigError
        (``kv_events``) for the radix pool and, with prefix caching on, beside HiSparse and
        bounded-replay groups, a Mamba ``align`` group's prefill checkpoint block, and
        groups of different block sizes under EAGLE's drop or a hash look-ahead."""
    def drain_kv_events_detailed(
        self,
    ) -> tuple[
        list[tuple[str, int]],
        list[tuple[int, _RequestId, int, int, int, list[int], bool, bool]],
    ]:
        """The prefix-cache events since the last drain (as ``drain_kv_events`` gives them)
        and the cache calls, ``(at, request_id, group, first_block, end_block, skipped,
        reused, partial)``: the call cached the request's blocks ``first_block..end_block`` of KV
        cache group ``group`` but those in ``skipped`` (null blocks), whose ``stored``
        events are ``events[at:at + end_block - first_block - len(skipped)]``; a ``reused``
        call is a lookup's hit of blocks ``0..end_block`` (vLLM's
        ``emit_cached_block_events``), with no events; a ``partial`` call registered the
        hash at the end of hash block ``end_block - 1`` (of the hash block size) on a
        block of the group, one event (vLLM's ``cache_partial_block``: a full-attention
        group's prompt tail beside differing block sizes). With several groups a hash is
        the group-keyed one."""
    def stats(self) -> SchedulerStats: ...
    def check_invariants(self) -> None:
        """Raises InternalError if the internal bookkeeping is inconsistent (a bug)."""
    def encoder_cache_usage(self) -> tuple[int, int, int]:
        """The encoder cache's ``(num_free_slots, num_freeable_slots, cache_size)``, in
        embeddings."""
    def encoder_cache_refs(self, mm_hash: str) -> int | None:
        """Requests referencing the encoder cache's entry ``mm_hash`` (0: freeable);
        ``None`` if no entry is held."""

@final
class EncoderCache:
    """vLLM 0.33's ``EncoderCacheManager`` on its own (the scheduler's encoder cache), with
    its method names; counts are encoder embeddings."""

    def __new__(cls, cache_size: int) -> EncoderCache: ...
    @property
    def cache_size(self) -> int: ...
    @property
    def num_free_slots(self) -> int: ...
    @property
    def num_freeable_slots(self) -> int:
        """Free slots plus those of entries no request references."""
    def check_and_update_cache(self, request_id: _RequestId, input_id: int, mm_hash: str) -> bool:
        """Whether ``mm_hash`` is held; if so the request references it."""
    def can_allocate(self, num_embeds: int, budget: int, num_embeds_to_schedule: int) -> bool:
        """Whether ``num_embeds`` fit the budget and (after those already promised) the
        cache, evicting unreferenced entries oldest first if needed."""
    def allocate(
        self, request_id: _RequestId, input_id: int, mm_hash: str, num_embeds: int
    ) -> None:
        """Raises:
        InputError: no room (``can_allocate`` first), or ``mm_hash`` already cached
            (``check_and_update_cache`` references it instead)."""
    def free_encoder_input(self, request_id: _RequestId, input_id: int, mm_hash: str) -> None: ...
    def get_cached_input_ids(self, request_id: _RequestId) -> list[int]: ...
    def get_cached_num_encoder_embeds(self, mm_hash: str) -> int | None: ...
    def num_refs(self, mm_hash: str) -> int: ...
    def entries(self) -> list[str]:
        """Held identifiers, sorted."""
    def freeable(self) -> list[str]:
        """Unreferenced identifiers, oldest first (the eviction order)."""
    def get_freed_mm_hashes(self) -> list[str]:
        """Identifiers evicted since the last call, less those allocated again."""
    def check_invariants(self) -> None:
        """Raises InternalError if the counters disagree with the entries (a bug)."""

@final
class SimRequestView:
    """What a replica-policy plugin sees of a simulated request (see docs/plugins.md)."""

    @property
    def request_id(self) -> int: ...
    @property
    def arrived_at(self) -> float: ...
    @property
    def num_prefill_tokens(self) -> int:
        """Prompt tokens, plus earlier outputs after a restart."""
    @property
    def num_decode_tokens(self) -> int: ...
    @property
    def num_processed_tokens(self) -> int:
        """Tokens computed so far (the prompt's last one yields the first output)."""
    @property
    def is_prefill_complete(self) -> bool: ...
    @property
    def completed(self) -> bool: ...
    @property
    def num_restarts(self) -> int: ...

class _RequestChunkLike(Protocol):
    @property
    def arrived_at(self) -> npt.NDArray[np.float64]: ...
    @property
    def num_prefill_tokens(self) -> npt.NDArray[np.uint32]: ...
    @property
    def num_decode_tokens(self) -> npt.NDArray[np.uint32]: ...
    @property
    def hash_offsets(self) -> npt.NDArray[np.uint64] | None: ...
    @property
    def hash_ids(self) -> npt.NDArray[np.uint64] | None: ...

#: The replica policies in the core's registry: name -> {section, pipeline_parallel, summary}.
REPLICA_POLICIES: dict[str, dict[str, Any]]
#: The built-in global (routing) policies.
GLOBAL_POLICIES: list[str]
#: The most KV blocks (GPU and host tier, every pool) one simulation tracks.
MAX_CLUSTER_BLOCKS: int

@final
class ReplicaSpec:
    """One replica policy with every size derived; built by ``tokenyard.simulation``."""

    @staticmethod
    def vidur(
        policy: str,
        *,
        num_blocks: int,
        block_size: int,
        watermark_blocks: int,
        batch_size_cap: int,
        max_batch_size: int,
        num_stages: int,
        max_blocks_per_sequence: int,
        max_tokens_in_batch: int,
        chunk_size: int,
        max_waiting_iters: int,
        restart: str,
    ) -> ReplicaSpec: ...
    @staticmethod
    def vllm_v1(config: _SchedulerConfigLike) -> ReplicaSpec: ...
    @staticmethod
    def sglang(
        *,
        num_pages: int,
        page_size: int,
        max_running_requests: int,
        max_extend_tokens: int,
        graph_batch_sizes: list[int],
    ) -> ReplicaSpec: ...
    @staticmethod
    def plugin(block_size: int) -> ReplicaSpec: ...
    @property
    def policy(self) -> str: ...
    def request_limit(self, num_prefill_tokens: int, num_decode_tokens: int) -> str | None:
        """Why a request of these lengths can never run on a replica, or ``None``."""

@final
class LinearModel:
    """The linear execution-time model's coefficients (seconds)."""

    def __new__(
        cls,
        *,
        constant_s: float,
        per_prefill_token_s: float,
        per_decode_token_s: float,
        per_decode_context_token_s: float,
        per_prefill_context_token_s: float,
        cpu_overhead_s: float,
    ) -> LinearModel: ...

@final
class CompiledOps:
    """A compiled per-operation execution-time model (``tokenyard.predictor``'s dict)."""

    def __new__(cls, spec: dict[str, Any]) -> CompiledOps: ...
    @property
    def num_ops(self) -> int: ...

@final
class SpeculativeConfig:
    """Speculative decoding of ``vllm_v1`` replicas (``[replica.speculative]``): exactly
    one acceptance form is given."""

    def __new__(
        cls,
        *,
        method: str,
        num_speculative_tokens: int,
        acceptance_rate: float | None = None,
        acceptance_rates: Sequence[float] | None = None,
        accepted_distribution: Sequence[float] | None = None,
    ) -> SpeculativeConfig: ...
    @property
    def method(self) -> str: ...

@final
class SimConfig:
    """A whole simulation's config, checked by the core when built.
    ``coalesce_decode_steps``: ``vllm_v1`` replicas of one pipeline stage advance runs of
    pure-decode steps at once (the same results bit for bit; ``False`` steps one by one).
    ``request_limit``: ``(max_tokens, setting)``, the longest request (prompt + output) any
    replica serves, refused at arrival alike for every policy; ``setting`` names what sets
    it, for the message."""

    def __new__(
        cls,
        *,
        num_replicas: int,
        num_stages: int,
        global_policy: str,
        balance: float,
        replica: ReplicaSpec,
        linear: LinearModel,
        seed: int,
        hash_block_size: int,
        sample_interval_s: float,
        record_stages: bool,
        over_length: str,
        concurrency: int | None = None,
        lora: dict[str, float] | None = None,
        speculative: SpeculativeConfig | None = None,
        decode: dict[str, Any] | None = None,
        kv_offload: dict[str, float] | None = None,
        coalesce_decode_steps: bool = True,
        request_limit: tuple[int, str] | None = None,
    ) -> SimConfig: ...
    @property
    def replica_policy(self) -> str: ...

def simulate(
    config: SimConfig,
    chunks: Iterable[_RequestChunkLike],
    *,
    exec_model: CompiledOps | Callable[..., float | tuple[float, float]] | None = None,
    progress: Callable[[int], object] | None = None,
    route_plugin: object | None = None,
    replica_plugins: Sequence[object] | None = None,
    policy_plugins: Sequence[_PolicyPluginLike] | None = None,
    exec_repeat: int = 1,
    draft_exec_model: CompiledOps | None = None,
    draft_layer_fraction: float | None = None,
    decode_exec_model: CompiledOps | None = None,
) -> dict[str, Any]:
    """Runs the core simulator (use ``tokenyard.simulation.simulate``) with the GIL
    released: a typed config, an iterator of request chunks, an optional execution-time
    model (compiled ops, or a Python callable: the slow path) and progress callback;
    ``policy_plugins``: one step-scheduler plugin per ``vllm_v1`` replica.
    ``exec_repeat`` asks the model that many times per batch stage (a benchmark aid).
    With ``config.speculative``: ``draft_exec_model`` prices the ``draft_model`` method's
    passes, ``draft_layer_fraction`` (1 / the target's layers) the ``mtp`` / ``eagle`` head.
    Returns numpy arrays in a dict.

    Raises:
        ConfigError, InputError, CapacityError, PolicyError; or the exception a callback
        raised.
    """

def evaluate_ops(
    spec: dict[str, Any],
    shapes: Mapping[str, npt.NDArray[np.uint64]],
    *,
    stage: int = 0,
    num_stages: int = 1,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """``(total_s, model_s)`` of each batch shape (columns ``num_requests``,
    ``num_prefill_tokens``, ``num_decode_tokens``, ``sum_decode_context``,
    ``sum_prefill_context``, ``sum_prefill_squared``, ``num_padding_rows``, and optionally
    ``num_lora_tokens`` and ``num_lora_adapters``) under a compiled
    per-operation model (``CompiledPredictor.to_core()``), evaluated by the simulator's code.

    Raises:
        ConfigError: a bad model (the field and value) or mismatched columns.
    """

def read_mooncake_lines(
    buf: bytes,
    start: int,
    first_line: int,
    hash_block_size: int,
    max_rows: int,
    is_final: bool,
) -> tuple[
    npt.NDArray[np.uint64],
    npt.NDArray[np.float64],
    npt.NDArray[np.uint32],
    npt.NDArray[np.uint32],
    npt.NDArray[np.uint64],
    npt.NDArray[np.uint64],
    int,
    int,
    int | None,
]:
    """Whole lines of a Mooncake trace from byte ``start`` (line ``first_line + 1``) read
    into columns, at most ``max_rows`` rows: ``(lines, times_s, input_lengths,
    output_lengths, hash_offsets, hash_ids, end, last_line, handed_back)``. Only rows
    Python's reader takes on its fast path are read; reading stops before any other line,
    whose end is ``handed_back`` (``tokenyard.workload.traces`` reads it). Without
    ``is_final`` a last line that may continue in the next buffer is left unread.
    """
