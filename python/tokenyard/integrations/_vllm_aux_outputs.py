"""vLLM 0.33's auxiliary-output connector beside ``TokenyardScheduler``
(``tokenyard.integrations.vllm``).

vLLM's ``AuxOutputSchedulerConnector`` (``vllm/distributed/aux_output_connector/
connector.py``) keeps per-token records the model runner emits with the KV (a MoE model's
routed experts) by vLLM's block hashes, and asks vLLM's block pool which of those blocks are
still cached (``BlockPool.get_cached_block``) to cap a prefix hit at the records it keeps.
The core hashes blocks its own way, so this module keeps the map from vLLM's hashes to the
core's (:class:`BlockHashIndex`, behind ``kv_cache_manager.block_pool.get_cached_block``) and
is the core's auxiliary-output connector (:class:`AuxOutputBridge`, given to
``tokenyard.sched.Scheduler.set_aux_output_connector``): the core asks it at admission, as
vLLM's ``schedule()`` asks the connector, and it hands vLLM's connector the vLLM ``Request``.
Imported only by that module, so vLLM is installed when this runs."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from vllm.v1.request import Request

from tokenyard._core import group_block_hashes
from tokenyard.integrations._vllm_outputs import keyed_prompt
from tokenyard.kv import block_hashes as core_block_hashes


class AuxState(Protocol):
    """What this module reads of ``TokenyardScheduler``."""

    block_size: int
    hash_block_size: int
    _core_block_size: int
    _core: Any
    _num_kv_blocks: int
    _prefix_caching: bool
    _kv_groups: int

    @property
    def kv_cache_manager(self) -> Any: ...

    def _request_of(self, core_id: Any) -> Request: ...


class BlockHashIndex:
    """vLLM's block hashes (``Request.block_hashes``) of whole KV blocks, mapped to the core's
    hashes of the same blocks, so that vLLM's ``get_cached_block`` can be answered from the
    core's pool. A request's hashes are entered whenever its connector is asked about it
    (admission, a load, its finish or preemption); entries whose block the pool no longer
    caches are dropped when the map outgrows a few times the pool (a block is cached again
    only by a request computing it, whose hashes are entered again when it is asked about).
    """

    def __init__(self, scheduler: AuxState) -> None:
        self._scheduler = scheduler
        self._core_hash: dict[Any, int] = {}
        # The other way: each core hash's vLLM hash and the tokens it covers (vLLM's
        # ``KVCacheBlock.block_hash_num_tokens``), for the block pool view's ``block_hash``.
        self._vllm_hash: dict[int, tuple[Any, int]] = {}
        # While the core asks the connector (it cannot be called back then): the asked
        # request's vLLM hashes with the block caching each, as the core gave them.
        self._asking: dict[Any, int | None] | None = None
        self._limit = 4 * (scheduler._num_kv_blocks + 1) + 1024
        # Over the core's coordinator (KV groups; 0 for its single pool) a block caches
        # its hash keyed by its group (``group_block_hashes``): each key's hash and group.
        self._groups = scheduler._kv_groups
        self._keyed: dict[int, tuple[int, int]] = {}
        # The blocks the core hashes: the scheduler's, or vLLM's hash block beside groups
        # of differing block sizes (each group's block then caches its last hash block's
        # hash, as vLLM's resolve_block_hashes keys it), indexed one by one.
        self._unit = scheduler._core_block_size
        self._step = self._unit // scheduler.hash_block_size
        # Bumped whenever a core hash's vLLM hash changes or leaves (``vllm_hash`` answers
        # otherwise only grow): the block pool view keeps its resolved answers until then.
        self.version = 0

    def _whole_block_hashes(self, request: Request) -> Sequence[Any]:
        """vLLM's hashes of the request's whole core blocks (the last hash of each block's
        ``block_size // hash_block_size`` hashes: the one that covers the block's end)."""
        step = self._step
        hashes: Sequence[Any] = request.block_hashes
        return hashes[step - 1 :: step] if step > 1 else hashes

    def index(self, request: Request, core_hashes: Sequence[int] | None = None) -> None:
        """Enters the request's whole blocks (``core_hashes``: the core's hashes of them,
        if the caller has them; else computed from the request's tokens)."""
        vllm_hashes = self._whole_block_hashes(request)
        if not vllm_hashes:
            return
        if core_hashes is None:
            core_hashes = self._core_hashes(request, len(vllm_hashes))
        self._core_hash.update(zip(vllm_hashes, core_hashes, strict=False))
        block_size = self._unit
        by_core = self._vllm_hash
        changed = False
        for i, (vllm_hash, core_hash) in enumerate(zip(vllm_hashes, core_hashes, strict=False)):
            entry = (vllm_hash, (i + 1) * block_size)
            old = by_core.get(core_hash)
            if old != entry:
                changed = changed or old is not None
                by_core[core_hash] = entry
        if changed:
            self.version += 1
        if self._groups:
            core = list(core_hashes[: len(vllm_hashes)])
            for group in range(self._groups):
                keys = group_block_hashes(core, group=group)
                self._keyed.update(zip(keys, ((c, group) for c in core), strict=True))
        if len(self._core_hash) > self._limit:
            self._prune()

    def core_hashes(self, vllm_hashes: Sequence[Any]) -> list[int]:
        """The core's hashes of the whole blocks ``vllm_hashes`` (a request's
        ``block_hashes``) name, up to the first the index does not hold."""
        step = self._step
        whole = vllm_hashes[step - 1 :: step] if step > 1 else vllm_hashes
        out: list[int] = []
        for block_hash in whole:
            core_hash = self._core_hash.get(block_hash)
            if core_hash is None:
                break
            out.append(core_hash)
        return out

    def knows_all(self, core_hashes: Sequence[int | None]) -> bool:
        """Whether every core hash of ``core_hashes`` (``None`` skipped; with several KV
        groups, the blocks' group-keyed ones) has its vLLM hash."""
        known = self._keyed if self._groups else self._vllm_hash
        return known.keys() >= set(core_hashes) - {None}

    def keyed(self, block_key: int) -> tuple[int, int] | None:
        """With several KV groups: the core hash and group of a block's group-keyed hash
        (``block_hashes()``'s), from the requests entered; ``None`` if none has it."""
        return self._keyed.get(block_key)

    def vllm_hash(self, core_hash: int) -> tuple[Any, int] | None:
        """vLLM's hash of the whole block the core hashes ``core_hash`` and the tokens it
        covers, from the requests entered; ``None`` if none of them has that block."""
        return self._vllm_hash.get(core_hash)

    def _core_hashes(self, request: Request, num_blocks: int) -> list[int]:
        """The core's hashes of the request's first ``num_blocks`` blocks: over the tokens
        the core was given (``keyed_prompt``), keyed by its LoRA."""
        scheduler = self._scheduler
        num_prompt = request.num_prompt_tokens
        # A look-ahead hash reads the tokens past its block (SchedulerConfig's).
        lookahead: int = scheduler._core.num_hash_lookahead_tokens
        tokens = list(request.all_token_ids[: num_blocks * self._unit + lookahead])
        if scheduler._prefix_caching:
            prompt = keyed_prompt(
                request, tokens[:num_prompt], scheduler.hash_block_size, lookahead=lookahead
            )
            tokens = [*prompt, *tokens[num_prompt:]]
        lora = request.lora_request
        extra_key = lora.lora_int_id if lora is not None and lora.lora_int_id > 0 else None
        hashes: list[int] = core_block_hashes(
            tokens,
            block_size=self._unit,
            extra_key=extra_key,
            num_hash_lookahead_tokens=lookahead,
        )[:num_blocks]
        return hashes

    def _prune(self) -> None:
        cached = self._scheduler._core.cached_block_id
        if self._groups:
            # A hash may stay cached in one group after another evicted it.
            self._keyed = {k: cg for k, cg in self._keyed.items() if cached(*cg) is not None}
            live = {c for c, _ in self._keyed.values()}
        else:
            live = {c for c in self._vllm_hash if cached(c) is not None}
        self._core_hash = {v: c for v, c in self._core_hash.items() if c in live}
        self._vllm_hash = {c: v for c, v in self._vllm_hash.items() if c in live}
        self._limit = max(self._limit, 2 * len(self._core_hash))
        self.version += 1

    @contextmanager
    def asking(
        self, request: Request, core_hashes: Sequence[int], block_ids: Sequence[int | None]
    ) -> Iterator[None]:
        """The core is asking the connector about ``request``: its blocks' hashes and the
        blocks caching them are the core's answers until the call returns."""
        vllm_hashes = self._whole_block_hashes(request)
        self.index(request, core_hashes)
        self._asking = dict(zip(vllm_hashes, block_ids, strict=False))
        try:
            yield
        finally:
            self._asking = None

    def cached_block_ids(self, block_hash: Any, group_ids: Sequence[int]) -> list[int] | None:
        """The core's blocks caching ``block_hash`` (vLLM's) in each group, or ``None`` if
        some group caches none (vLLM's ``get_cached_block``). Ids are the core's."""
        asking = self._asking
        if asking is not None:
            # Only the asked group's answers were given: vLLM's connector asks its
            # coordinator's full_attention_group_id (or 0), as the core hands them over.
            coordinator = self._scheduler.kv_cache_manager.coordinator
            asked = getattr(coordinator, "full_attention_group_id", None)
            block = asking.get(block_hash) if list(group_ids) == [asked or 0] else None
            return None if block is None else [block]
        core_hash = self._core_hash.get(block_hash)
        if core_hash is None:
            return None
        cached = self._scheduler._core.cached_block_id
        blocks = []
        for group in group_ids:
            block = cached(core_hash, group)
            if block is None:
                return None
            blocks.append(block)
        return blocks


class AuxOutputBridge:
    """vLLM's ``AuxOutputSchedulerConnector`` as the core's auxiliary-output connector: each
    call the core makes while forming a step goes to vLLM's connector with the vLLM
    ``Request``, the core's answers about the request's blocks standing for vLLM's block
    pool meanwhile."""

    def __init__(self, scheduler: AuxState, connector: Any, index: BlockHashIndex) -> None:
        self._scheduler = scheduler
        self._connector = connector
        self._index = index

    def max_cache_hit(self, view: Any, block_hashes: list[int], block_ids: list[int | None]) -> int:
        request = self._scheduler._request_of(view.request_id)
        with self._index.asking(request, block_hashes, block_ids):
            return int(self._connector.max_cache_hit(request))

    def cap_external_hit(
        self,
        view: Any,
        num_local: int,
        num_external: int,
        block_hashes: list[int],
        block_ids: list[int | None],
    ) -> int:
        request = self._scheduler._request_of(view.request_id)
        with self._index.asking(request, block_hashes, block_ids):
            return int(self._connector.cap_external_hit(request, num_local, num_external))

    def request_loading(self, view: Any, num_tokens: int) -> None:
        request = self._scheduler._request_of(view.request_id)
        self._connector.request_loading(request, num_tokens)


def take_aux_outputs(
    connector: Any,
    outputs: dict[int, list[Any]],
    requests: dict[str, Request],
    model_runner_output: Any,
) -> None:
    """vLLM 0.33's ``update_from_output``: each request that emits an output this step (new
    tokens, a pooler output, a stop) takes its accepted auxiliary rows from the worker's
    output (``AuxOutputSchedulerConnector.take_output``), sent as ``routed_experts``.
    ``requests``: the step's emitting requests by id (finished ones included)."""
    aux_output = model_runner_output.aux_output_connector_output
    for client_outputs in outputs.values():
        for output in client_outputs:
            request = requests.get(output.request_id)
            if request is not None:
                output.routed_experts = connector.take_output(request, aux_output)
