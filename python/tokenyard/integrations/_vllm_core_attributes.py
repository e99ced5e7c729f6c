"""The attributes of vLLM 0.33's ``Scheduler`` that ``TokenyardScheduler``
(``tokenyard.integrations.vllm``) mirrors from the core, as properties: assigning one on a
built scheduler sets the core's, as assigning it on vLLM's takes effect there. The
deferred-free gates and fence counters (``defer_block_free``, ``defer_async_loads``,
``sched_step_seq``, ``processed_step_seq``, ``deferred_frees``) and the encoder budget and
cache (``max_num_encoder_input_tokens``, ``is_encoder_decoder``, ``encoder_cache_manager``).
Imported only by that module, so vLLM is installed when this runs."""

from __future__ import annotations

from typing import Any

from tokenyard.integrations._vllm_encoder_cache import EncoderCacheView, assigned_cache_size
from tokenyard.integrations._vllm_state import AdapterBase, non_negative


class CoreAttributes(AdapterBase):
    """vLLM's scheduler attributes as properties over the core's (set in
    ``TokenyardScheduler.__init__``)."""

    _max_num_encoder_input_tokens: int
    _encoder_cache_size: int
    _encoder_cache_view: EncoderCacheView
    _mm_refused: str | None
    _mm_model: bool

    @property
    def defer_block_free(self) -> bool:
        """vLLM 0.33's gate (set for a KV consumer with several batches in flight, or by
        hand): the blocks of a request finished or preempted while a step that served it is
        in flight wait for the newest step scheduled then to be processed. Set by the core,
        so that setting it on a built scheduler takes effect as in vLLM."""
        return bool(self._core.defer_block_free)

    @defer_block_free.setter
    def defer_block_free(self, value: bool) -> None:
        self._core.defer_block_free = bool(value)

    @property
    def defer_async_loads(self) -> bool:
        """vLLM 0.33's gate (HiSparse, or set by hand): an asynchronous KV load admitted
        while a step is in flight is handed to the connector once that step is processed."""
        return bool(self._core.defer_async_loads)

    @defer_async_loads.setter
    def defer_async_loads(self, value: bool) -> None:
        self._core.defer_async_loads = bool(value)

    # vLLM's fence counters: non-empty steps scheduled / processed while frees are deferred.
    sched_step_seq = property(lambda self: self._core.sched_step_seq)
    processed_step_seq = property(lambda self: self._core.processed_step_seq)

    @property
    def deferred_frees(self) -> list[tuple[int, list[int]]]:
        """The deferred frees as ``(fence step, block ids)``, oldest first (vLLM keeps the
        ``KVCacheBlock`` objects; the blocks are the core's here). A snapshot."""
        frees: list[tuple[int, list[int]]] = self._core.deferred_frees()
        return frees

    # --- the encoder budget and cache -------------------------------------------------------

    @property
    def max_num_encoder_input_tokens(self) -> int:
        """vLLM 0.33's encoder compute budget per step, in embeddings; assigning it on a
        built scheduler sets the core's from the next step on (0 encodes nothing)."""
        return self._max_num_encoder_input_tokens

    @max_num_encoder_input_tokens.setter
    def max_num_encoder_input_tokens(self, value: int) -> None:
        budget = non_negative(value, "max_num_encoder_input_tokens")
        self._core.encoder_budget = budget
        self._max_num_encoder_input_tokens = budget

    @property
    def is_encoder_decoder(self) -> bool:
        """vLLM 0.33's flag: encoder inputs are an encoder-decoder model's (the core's
        ``set_encoder_decoder``); assignable while no request has multimodal items."""
        return bool(self._core.is_encoder_decoder)

    @is_encoder_decoder.setter
    def is_encoder_decoder(self, value: bool) -> None:
        self._core.set_encoder_decoder(bool(value))

    @property
    def encoder_cache_manager(self) -> EncoderCacheView:
        """The encoder cache under vLLM's ``EncoderCacheManager`` names (a view of the
        core's). Assigning one of vLLM's (empty) managers gives the core's cache its size,
        as assigning it on vLLM's scheduler does."""
        return self._encoder_cache_view

    @encoder_cache_manager.setter
    def encoder_cache_manager(self, manager: Any) -> None:
        self._set_encoder_cache_size(assigned_cache_size(manager, self.is_encoder_decoder))

    def _set_encoder_cache_size(self, cache_size: int) -> None:
        """Replaces the core's encoder cache with an empty one of ``cache_size`` embeddings.

        Raises:
            ConfigError: a negative size; InputError: a request holds an entry.
        """
        size = non_negative(cache_size, "encoder_cache_manager.cache_size")
        self._core.set_encoder_cache_size(size)
        self._encoder_cache_size = size

    @property
    def _mm_refusal(self) -> str | None:
        """Why a request's multimodal items are refused now (None: served). A text-only
        model's items are served once an encoder budget and cache are set on the scheduler
        (vLLM's are 0 and 0 then: it would accept them and never encode them)."""
        if self._mm_refused is not None or self._mm_model:
            return self._mm_refused
        if self._max_num_encoder_input_tokens == 0 or self._encoder_cache_size == 0:
            return (
                "(the model takes none: set max_num_encoder_input_tokens and "
                "encoder_cache_manager on the scheduler to give it an encoder budget)"
            )
        return None
