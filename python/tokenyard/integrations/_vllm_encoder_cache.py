"""``TokenyardScheduler.encoder_cache_manager``: vLLM 0.33's ``EncoderCacheManager``
(``vllm/v1/core/encoder_cache_manager.py``) as its callers read it, answered by the core's
encoder cache (``tokenyard.sched.Scheduler.encoder_cache_entries`` and the counters), and
what assigning one of vLLM's managers to the scheduler does (its size becomes the core's).
Imported only by ``tokenyard.integrations.vllm``, so vLLM is installed when this runs."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Protocol

from vllm.v1.core.encoder_cache_manager import EncoderCacheManager, EncoderDecoderCacheManager

from tokenyard.errors import ConfigError, InputError


class _Adapter(Protocol):
    """What the view reads of ``TokenyardScheduler``."""

    _core: Any
    _vllm_ids: dict[Any, str]

    def _set_encoder_cache_size(self, cache_size: int) -> None: ...


class EncoderCacheView:
    """The scheduler's encoder cache under vLLM's names: ``cache_size``, ``num_free_slots``,
    ``num_freeable_slots`` (embeddings), ``cached`` (``mm_hash`` -> the vLLM ids of the
    requests referencing it; an empty set: freeable), ``freeable`` (``mm_hash`` ->
    embeddings, oldest first: the eviction order) and ``freed`` (evicted, not yet reported
    to the worker). Each read is a snapshot. Setting ``cache_size`` replaces the cache with
    an empty one of that size, as assigning a new manager does; vLLM's mutating methods
    (``allocate``, ``free``) are not offered: the scheduler's steps own the cache."""

    # `__dict__`: a caller may replace `can_allocate` on the instance (vLLM's tests do).
    __slots__ = ("__dict__", "_scheduler")

    # Set while the core asks a replaced can_allocate (``_vllm_hooks``).
    _asked_by_core = False

    def __init__(self, scheduler: _Adapter) -> None:
        self._scheduler = scheduler

    def can_allocate(
        self,
        request: Any,
        input_id: int,
        encoder_compute_budget: int,
        num_embeds_to_schedule: int,
    ) -> bool:
        """vLLM's ``can_allocate``. The core's encoder cache decides within
        ``schedule()``; a replacement on the instance is asked first there
        (``_vllm_hooks``), and one that calls this gets True: the core then decides.

        Raises:
            InputError: called outside a replacement the core is asking (the cache's room
                is the core's, given within ``schedule()``).
        """
        if self._asked_by_core:
            return True
        raise InputError(
            f"encoder_cache_manager.can_allocate: input {input_id} of "
            f"{getattr(request, 'request_id', request)!r} is given cache room by the core "
            "within schedule(); answered only there",
            field="input_id",
            value=str(input_id),
        )

    def _usage(self) -> tuple[int, int, int]:
        usage: tuple[int, int, int] = self._scheduler._core.encoder_cache_usage()
        return usage

    @property
    def cache_size(self) -> int:
        return self._usage()[2]

    @cache_size.setter
    def cache_size(self, cache_size: int) -> None:
        self._scheduler._set_encoder_cache_size(cache_size)

    @property
    def num_free_slots(self) -> int:
        return self._usage()[0]

    @num_free_slots.setter
    def num_free_slots(self, value: int) -> None:
        self._check_counter("num_free_slots", value, self.num_free_slots)

    @property
    def num_freeable_slots(self) -> int:
        return self._usage()[1]

    @num_freeable_slots.setter
    def num_freeable_slots(self, value: int) -> None:
        self._check_counter("num_freeable_slots", value, self.num_freeable_slots)

    @staticmethod
    def _check_counter(name: str, value: int, now: int) -> None:
        # vLLM's tests resize a fresh manager by setting its three counters together
        # (`cache_size = num_free_slots = num_freeable_slots = n`): the counters follow the
        # size here, so only that consistent assignment is taken.
        if value != now:
            raise ConfigError(
                f"encoder_cache_manager.{name}: the core keeps this counter ({now}); set "
                "cache_size to resize the cache",
                field=f"encoder_cache_manager.{name}",
                value=str(value),
            )

    @property
    def cached(self) -> dict[str, set[str]]:
        ids = self._scheduler._vllm_ids
        entries = self._scheduler._core.encoder_cache_entries()
        return {mm_hash: {ids.get(i, str(i)) for i in refs} for mm_hash, refs in entries}

    @property
    def freeable(self) -> OrderedDict[str, int]:
        return OrderedDict(self._scheduler._core.encoder_cache_freeable())

    @property
    def freed(self) -> list[str]:
        freed: list[str] = self._scheduler._core.encoder_cache_freed()
        return freed


def assigned_cache_size(manager: Any, encoder_decoder: bool) -> int:
    """The size of an encoder cache manager assigned to the scheduler: vLLM's
    ``EncoderCacheManager`` (empty) or this view; for an encoder-decoder scheduler
    (``is_encoder_decoder``), vLLM's ``EncoderDecoderCacheManager`` (nothing allocated).

    Raises:
        ConfigError: another kind (the other of vLLM's two for this scheduler, whose
            ``is_encoder_decoder`` picks the core's), or a manager already in use.
    """
    if isinstance(manager, EncoderCacheView):
        return manager.cache_size
    wanted = EncoderDecoderCacheManager if encoder_decoder else EncoderCacheManager
    if not isinstance(manager, wanted) or (
        not encoder_decoder and isinstance(manager, EncoderDecoderCacheManager)
    ):
        raise ConfigError(
            f"encoder_cache_manager: {type(manager).__name__} is not served by a scheduler "
            f"with is_encoder_decoder={encoder_decoder} (it takes vLLM's {wanted.__name__})",
            field="encoder_cache_manager",
            value=type(manager).__name__,
        )
    if encoder_decoder:
        if manager.allocated or manager.to_free or manager.num_free_slots != manager.cache_size:
            raise ConfigError(
                "encoder_cache_manager: the manager assigned is in use (only its size is "
                "taken: assign a fresh one)",
                field="encoder_cache_manager",
                value=f"{len(manager.allocated)} allocated",
            )
        return int(manager.cache_size)
    if manager.cached:
        raise ConfigError(
            "encoder_cache_manager: the manager assigned already holds entries (only its "
            "size is taken: assign an empty one)",
            field="encoder_cache_manager",
            value=f"{len(manager.cached)} entries",
        )
    return int(manager.cache_size)
