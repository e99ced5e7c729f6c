"""SGLang's prefix-cache interface over tokenyard's radix cache.

:class:`SGLangRadixCache` answers the calls SGLang 0.5.23's scheduler makes on its
``RadixCache`` (``python/sglang/srt/mem_cache/radix_cache.py``) with SGLang's parameter and
result shapes, while the tree itself is tokenyard's Rust :class:`tokenyard.kv.RadixCache`::

    cache = SGLangRadixCache.create_simulated(page_size=1)
    cache.insert(InsertParams(key=RadixKey([1, 2, 3]), value=np.array([10, 11, 12])))
    hit = cache.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 9])))
    hit.device_prefix_len                      # 2
    cache.inc_lock_ref(hit.last_device_node)   # IncLockRefResult(delta=-2)

This module never imports sglang. It reads SGLang's own ``MatchPrefixParams``,
``InsertParams``, ``EvictParams`` and ``RadixKey`` objects by their attributes, and offers
look-alike classes of the same names for callers without SGLang. Where it differs from
SGLang (``docs/integrations.md`` has the list):

- Indices are numpy ``int64`` arrays by default; with ``device=`` (needs torch) they are
  ``int64`` tensors on that device. Keys and values may be sequences, numpy arrays or tensors.
- ``MatchResult`` also carries ``device_indices`` (the matched prefix's KV indices), since
  tokenyard's nodes are opaque handles with no ``path_device_indices``.
- ``InsertResult.last_device_node`` is ``None``: tokenyard's insert does not name the node it
  ended on (match the key to get it, as SGLang's own ``checkpoint`` does).
- ``EvictResult.evicted_indices`` lists the freed indices in eviction order; the allocator,
  if one is given, gets them in one ``free`` call per ``evict`` rather than one per leaf.
- One namespace, LRU eviction only: keys with an ``extra_key``, a ``cache_salt`` or EAGLE's
  bigram view are refused, and ``priority`` / ``inserted_len`` (used only by SGLang's
  priority and LFU eviction policies) are ignored.
- Unlocking a node that is not locked, or using a node that was evicted, raises
  ``InputError``; SGLang would let the lock count go negative.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeAlias

import numpy as np
import numpy.typing as npt

from tokenyard.errors import ConfigError, InputError
from tokenyard.kv import NodeHandle, RadixCache

if TYPE_CHECKING:
    import torch

    #: KV indices as returned: numpy by default, torch tensors when a ``device`` is set.
    IndexArray: TypeAlias = npt.NDArray[np.int64] | torch.Tensor
    #: Token ids or KV indices as accepted: SGLang's ``array('q')``, lists, numpy, tensors.
    IntArray: TypeAlias = Sequence[int] | npt.NDArray[np.integer[Any]] | torch.Tensor

__all__ = [
    "DecLockRefResult",
    "EvictParams",
    "EvictResult",
    "IncLockRefResult",
    "InsertParams",
    "InsertResult",
    "MatchPrefixParams",
    "MatchResult",
    "RadixKey",
    "SGLangRadixCache",
    "TreeLock",
]


class KeyLike(Protocol):
    """SGLang's ``RadixKey`` as the adapter reads it. ``extra_key``, ``cache_salt``,
    ``is_bigram`` and ``limit`` are read when present."""

    @property
    def token_ids(self) -> IntArray: ...


class MatchPrefixParamsLike(Protocol):
    """SGLang's ``MatchPrefixParams``: only ``key`` is read."""

    @property
    def key(self) -> KeyLike: ...


class InsertParamsLike(Protocol):
    """SGLang's ``InsertParams``: ``key`` and ``value`` are read."""

    @property
    def key(self) -> KeyLike | None: ...
    @property
    def value(self) -> IntArray | None: ...


class EvictParamsLike(Protocol):
    """SGLang's ``EvictParams``: only ``num_tokens`` is read."""

    @property
    def num_tokens(self) -> int: ...


class KvAllocator(Protocol):
    """What the adapter needs of SGLang's ``token_to_kv_pool_allocator``: ``free``."""

    def free(self, free_index: Any) -> object: ...


# --- SGLang's parameter and result shapes (sglang 0.5.23, base_prefix_cache.py) ----------


@dataclass(frozen=True)
class RadixKey:
    """A key: token ids (SGLang uses ``array('q')``; any int sequence, array or tensor works).

    The fields after ``token_ids`` exist so SGLang code that sets them runs unchanged; only
    their defaults are supported, except ``limit`` (use only the first ``limit`` tokens).
    """

    token_ids: IntArray
    extra_key: str | None = None
    is_bigram: bool = False
    limit: int | None = None
    cache_salt: str | None = None


@dataclass(frozen=True)
class MatchPrefixParams:
    key: KeyLike


@dataclass(frozen=True)
class InsertParams:
    """``value`` holds one KV index per token; ``None`` stores the token ids themselves
    (SGLang's debug fallback). ``priority`` and ``inserted_len`` are accepted and ignored."""

    key: KeyLike | None = None
    value: IntArray | None = None
    priority: int = 0
    inserted_len: int = 0


@dataclass(frozen=True)
class EvictParams:
    num_tokens: int = 0


class MatchResult(NamedTuple):
    """SGLang's ``MatchResult`` fields for a cache without host memory, plus
    ``device_indices``: the KV indices of the matched prefix."""

    device_prefix_len: int
    last_device_node: NodeHandle
    last_host_node: NodeHandle
    best_match_node: NodeHandle
    device_indices: IndexArray
    host_hit_length: int = 0


@dataclass(frozen=True)
class InsertResult:
    """``prefix_len`` leading tokens were already cached: their indices in the inserted
    ``value`` are duplicates the caller frees (SGLang's ``_insert_cache`` does)."""

    prefix_len: int
    total_len: int = 0
    last_device_node: NodeHandle | None = None


@dataclass(frozen=True)
class EvictResult:
    """``num_tokens_evicted`` may exceed the tokens asked for: whole leaves are evicted."""

    num_tokens_evicted: int = 0
    swa_num_tokens_evicted: int = 0
    mamba_num_evicted: int = 0
    evicted_indices: IndexArray = field(kw_only=True)


@dataclass(frozen=True)
class IncLockRefResult:
    """``delta``: the change in ``evictable_size`` (zero or negative)."""

    delta: int


@dataclass(frozen=True)
class DecLockRefResult:
    """``delta``: the change in ``evictable_size`` (zero or positive)."""

    delta: int


@dataclass(frozen=True)
class TreeLock:
    """One holder's lock on a node, from :meth:`SGLangRadixCache.lock`."""

    node: NodeHandle


# --- the cache -------------------------------------------------------------------------


class SGLangRadixCache:
    """SGLang's ``RadixCache`` interface over tokenyard's Rust radix tree.

    Args:
        page_size: tokens per KV page; keys are cut to whole pages, as in SGLang.
        token_to_kv_pool_allocator: optional; ``evict`` passes the freed indices to its
            ``free``. Without one, read them from ``EvictResult.evicted_indices``.
        device: ``None`` returns numpy arrays; a torch device name (``"cpu"``,
            ``"cuda:0"``) returns ``int64`` tensors there.

    Raises:
        ConfigError: ``page_size`` below 1, or ``device`` set without torch or not a device.
    """

    def __init__(
        self,
        *,
        page_size: int = 1,
        token_to_kv_pool_allocator: KvAllocator | None = None,
        device: str | None = None,
    ) -> None:
        self._tree = RadixCache(page_size=page_size)
        self.page_size = page_size
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        # SGLang's callers read these attributes; the adapter has no request pool.
        self.req_to_token_pool = None
        self.disable = False
        self.device = device
        self._torch = _torch_for(device)

    @classmethod
    def create_simulated(
        cls,
        disable: bool = False,
        mock_allocator: KvAllocator | None = None,
        page_size: int = 1,
    ) -> SGLangRadixCache:
        """SGLang's factory for a cache without memory pools.

        Raises:
            ConfigError: ``disable=True`` (a disabled cache caches nothing; SGLang's
                ``ChunkCache`` is the honest stand-in).
        """
        if disable:
            raise ConfigError(
                "create_simulated.disable: a disabled radix cache is not supported, got True",
                field="disable",
                value="True",
            )
        return cls(page_size=page_size, token_to_kv_pool_allocator=mock_allocator)

    @property
    def root_node(self) -> NodeHandle:
        """The root's handle, what a miss returns; locking it changes nothing."""
        return self._tree.match_prefix([]).handle

    def reset(self) -> None:
        """Drops every node, locked or not; outstanding nodes become stale."""
        self._tree.reset()

    def match_prefix(self, params: MatchPrefixParamsLike | KeyLike | IntArray) -> MatchResult:
        """The longest cached prefix of the key, in whole pages.

        Marks the matched path most recently used; a match ending inside an edge splits it.

        Raises:
            InputError: the key uses an unsupported field (see the module docstring), or a
                token id outside ``[0, 2**32)``.
        """
        found = self._tree.match_prefix(_key_tokens(_key_of(params)))
        node = found.handle
        return MatchResult(
            device_prefix_len=found.matched_len,
            last_device_node=node,
            last_host_node=node,
            best_match_node=node,
            device_indices=self._indices(found.values),
        )

    def insert(self, params: InsertParamsLike) -> InsertResult:
        """Caches ``params.value`` under ``params.key``, both cut to whole pages.

        Raises:
            InputError: no key, fewer values than tokens, or an unsupported key field.
        """
        key = params.key
        if key is None:
            raise InputError("invalid argument key=None: insert needs a key", field="key")
        tokens = _key_tokens(key)
        tokens = tokens[: len(tokens) // self.page_size * self.page_size]
        value = tokens if params.value is None else _host(params.value)[: len(tokens)]
        return InsertResult(prefix_len=self._tree.insert(tokens, value))

    def evict(self, params: EvictParamsLike | int) -> EvictResult:
        """Evicts least recently used unlocked leaves until at least ``num_tokens`` are
        freed or nothing is evictable; gives the freed indices to the allocator, if any."""
        num_tokens = params if isinstance(params, int) else params.num_tokens
        # SGLang's loop simply does not run for a count below one.
        freed = self._indices(self._tree.evict(max(num_tokens, 0)))
        if self.token_to_kv_pool_allocator is not None and len(freed) > 0:
            self.token_to_kv_pool_allocator.free(freed)
        return EvictResult(num_tokens_evicted=len(freed), evicted_indices=freed)

    def inc_lock_ref(self, node: NodeHandle) -> IncLockRefResult:
        """Protects the path from ``node`` to the root from eviction.

        Raises:
            InputError: ``node`` is stale (evicted, or the cache was reset).
        """
        before = self._tree.evictable_size
        self._tree.lock(node)
        return IncLockRefResult(delta=self._tree.evictable_size - before)

    def dec_lock_ref(self, node: NodeHandle, params: object = None) -> DecLockRefResult:
        """Undoes one ``inc_lock_ref`` of ``node``; ``params`` (SGLang's receipt) is ignored.

        Raises:
            InputError: ``node`` is stale or not locked.
        """
        before = self._tree.evictable_size
        self._tree.unlock(node)
        return DecLockRefResult(delta=self._tree.evictable_size - before)

    def lock(self, node: NodeHandle) -> TreeLock:
        """``inc_lock_ref`` for one holder; pass the result to :meth:`unlock`."""
        self.inc_lock_ref(node)
        return TreeLock(node)

    def unlock(self, lock: TreeLock | None) -> None:
        if lock is not None:
            self.dec_lock_ref(lock.node)

    def evictable_size(self) -> int:
        """Tokens in unlocked nodes: what ``evict`` could free."""
        return self._tree.evictable_size

    def protected_size(self) -> int:
        """Tokens in locked nodes."""
        return self._tree.protected_size

    def total_size(self) -> int:
        return self._tree.total_size

    def supports_prefix_sharing(self) -> bool:
        return True

    def _indices(self, values: npt.NDArray[np.int64]) -> IndexArray:
        if self._torch is None:
            return values
        result: IndexArray = self._torch.from_numpy(values).to(self.device)
        return result

    def __repr__(self) -> str:
        return f"SGLangRadixCache({self._tree!r})"


def _torch_for(device: str | None) -> ModuleType | None:
    """torch, checked to know ``device``, or ``None`` when numpy is asked for."""
    if device is None:
        return None
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        raise ConfigError(
            f"SGLangRadixCache.device: tensors need torch, which is not importable; got {device!r}",
            field="device",
            value=repr(device),
        ) from None
    try:
        torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ConfigError(
            f"SGLangRadixCache.device: not a torch device ({err}), got {device!r}",
            field="device",
            value=repr(device),
        ) from None
    return torch


def _key_of(params: MatchPrefixParamsLike | KeyLike | IntArray) -> KeyLike:
    """The key of a params object, a key itself, or a bare token sequence wrapped as one."""
    key: Any = getattr(params, "key", params)
    return key if hasattr(key, "token_ids") else RadixKey(key)


def _key_tokens(key: KeyLike) -> Any:
    """The key's token ids, host-side, refusing the fields tokenyard cannot honour."""
    for name in ("extra_key", "cache_salt"):
        if getattr(key, name, None) is not None:
            value = getattr(key, name)
            raise InputError(
                f"invalid argument key.{name}={value!r}: tokenyard's radix cache has one "
                f"namespace; only {name}=None is supported",
                field=f"key.{name}",
                value=repr(value),
            )
    if getattr(key, "is_bigram", False):
        raise InputError(
            "invalid argument key.is_bigram=True: EAGLE's bigram keys are not supported",
            field="key.is_bigram",
            value="True",
        )
    tokens = _host(key.token_ids)
    limit = getattr(key, "limit", None)
    return tokens if limit is None else tokens[:limit]


def _host(values: IntArray) -> Any:
    """A tensor as a numpy array (the Rust side reads numpy and sequences); else as is."""
    if hasattr(values, "detach"):
        return values.detach().cpu().numpy()
    return values
