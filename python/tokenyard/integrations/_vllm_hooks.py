"""vLLM 0.33 ``Scheduler`` methods that callers replace on a built scheduler, routed through
the replacement as vLLM's ``schedule()`` would call it (vLLM's tests patch
``kv_cache_manager.allocate_slots`` and ``encoder_cache_manager.can_allocate`` and assign
``_mamba_block_aligned_split``), and
``num_sampled_tokens_per_step`` assigned on a built scheduler.

The core decides both in Rust; a replacement is seen at the start of each ``schedule()``
(an attribute of the instance, where vLLM's is the class's) and handed to the core as a
step hook (``Scheduler.set_step_hooks``), which asks it at each point vLLM calls the method:

- ``allocate_slots(request, num_new_tokens, num_lookahead_tokens=...)`` before each
  allocation of a running request (again after each preemption) and of an admission (vLLM's
  ``schedule()``, its running and waiting loops). ``None`` refuses, as vLLM's ``None``
  does (no room): the running request preempts a victim or waits for a deferred free, the
  admission stops the queue. The view's own ``allocate_slots`` (``_KVCacheManagerView``),
  called from the replacement, lets the core allocate: its answer is the empty
  ``KVCacheBlocks`` (the blocks are the core's, reported in the step's output), never
  ``None``, even where the core then finds no room and takes that path itself.
- ``encoder_cache_manager.can_allocate(request, input_id, encoder_compute_budget,
  num_embeds_to_schedule)`` (an attribute of the view) before an encoder input is given
  cache room (vLLM's ``_try_schedule_encoder_inputs``): falsy refuses, as when the cache or
  budget has no room (the request is scheduled up to the item); the view's own
  ``can_allocate``, called from the replacement, lets the core decide.
- ``_mamba_block_aligned_split(request, num_new_tokens, num_new_local_computed_tokens,
  num_external_computed_tokens)`` while the split is on (``need_mamba_block_aligned_split``):
  its answer is the chunk (a padded decode it clips drops its padding, vLLM's rule); the
  adapter's own method, called from the replacement, answers the core's split.

- ``_handle_blocked_waiting_request`` for a request waiting outside the core for a blocked
  status (``_vllm_adopt``): the core asks ``_waiting_ready`` when its admission loop
  reaches one (its ``waiting_ready`` hook, installed while any waits), which calls
  ``_update_waiting_for_remote_kv`` as looked up on the scheduler (a replacement too).

Under the priority policy the core also reads each running request's ``priority`` from its
vLLM ``Request`` before it picks a victim, as vLLM's ``max(self.running, key=lambda r:
(r.priority, r.arrival_time))`` does (a caller may change it after ``add_request``). Nothing
else is asked of Python while nothing is replaced. Imported only by
``tokenyard.integrations.vllm``, so vLLM is installed when this runs.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.request import Request

from tokenyard.errors import InputError
from tokenyard.integrations._vllm_encoder_cache import EncoderCacheView
from tokenyard.integrations._vllm_state import AdapterBase, non_negative


def _weak(method: weakref.WeakMethod[Any]) -> Any:
    """A callable that calls ``method`` while its object lives (the core's hooks)."""

    def call(*args: Any) -> Any:
        bound = method()
        if bound is None:
            raise InputError(
                "step hook: the scheduler it belongs to is gone", field="scheduler", value="None"
            )
        return bound(*args)

    return call


def draft_slots_per_request(vllm_config: Any) -> int:
    """vLLM 0.33's ``draft_slots`` in ``Scheduler.schedule()``: the speculative config's
    ``max_num_new_slots_for_drafting`` (0 without one), the input slots each scheduled
    request takes of ``max_num_batched_tokens`` beside its tokens (the core keeps
    ``max_num_scheduled_tokens`` as a budget of its own, as vLLM does)."""
    spec = vllm_config.speculative_config
    return int(spec.max_num_new_slots_for_drafting) if spec is not None else 0


class ReplacedMethods(AdapterBase):
    """The routing, mixed into ``TokenyardScheduler``."""

    kv_cache_manager: Any
    _encoder_cache_view: EncoderCacheView
    # The replacements handed to the core, by identity (None: the core's own), the
    # connector's pending-frees hook (_vllm_hisparse), and whether requests wait outside it.
    _routed: tuple[Any, Any, Any, Any, bool] = (None, None, None, None, False)
    _routed_once = False
    policy: SchedulingPolicy
    # (request id, num_new_tokens, the core's split) while the core asks for a split.
    _split_asked: tuple[str, int, int] | None = None

    if TYPE_CHECKING:

        def _request_of(self, core_id: Any) -> Request: ...

        def _pending_block_frees_hook(self) -> Any: ...

        def _waiting_ready(self, core_id: Any) -> bool: ...

    def _route_replaced_methods(self) -> None:
        """Hands the core this step's replacements (called at each ``schedule()``), and
        under the priority policy the requests' live priorities (vLLM 0.33 picks a victim
        by ``max(running, key=(r.priority, r.arrival_time))``, reading them then)."""
        allocate = vars(self.kv_cache_manager).get("allocate_slots")
        split = vars(self).get("_mamba_block_aligned_split")
        frees = self._pending_block_frees_hook()
        encoder = vars(self._encoder_cache_view).get("can_allocate")
        # Requests waiting outside the core for a blocked status (_vllm_adopt): vLLM's
        # _handle_blocked_waiting_request is asked when admission reaches one.
        blocked = bool(self._blocked_ids)
        routed = (allocate, split, frees, encoder, blocked)
        if routed == self._routed and self._routed_once:
            return
        # The core holds the hooks, and this scheduler the core: the hooks reach it through
        # a weak reference, so the pair is freed like any scheduler (the extension does not
        # take part in Python's cycle collection).
        ref = weakref.WeakMethod
        self._core.set_step_hooks(
            allocate=None if allocate is None else _weak(ref(self._ask_allocate_slots)),
            mamba_split=None if split is None else _weak(ref(self._ask_mamba_split)),
            priority=(
                _weak(ref(self._live_priority))
                if self.policy == SchedulingPolicy.PRIORITY
                else None
            ),
            pending_block_frees=frees,
            encoder_can_allocate=(
                None if encoder is None else _weak(ref(self._ask_encoder_can_allocate))
            ),
            waiting_ready=_weak(ref(self._waiting_ready)) if blocked else None,
        )
        self._routed = routed
        self._routed_once = True

    def _live_priority(self, core_id: Any) -> int:
        priority: int = self._request_of(core_id).priority
        return priority

    def _ask_allocate_slots(
        self, core_id: Any, num_new_tokens: int, num_lookahead_tokens: int
    ) -> bool:
        request = self._request_of(core_id)
        manager = self.kv_cache_manager
        manager._asked_by_core = True
        try:
            blocks = manager.allocate_slots(
                request, num_new_tokens, num_lookahead_tokens=num_lookahead_tokens
            )
        finally:
            manager._asked_by_core = False
        return blocks is not None

    def _ask_encoder_can_allocate(
        self, core_id: Any, input_index: int, budget_left: int, num_embeds_to_schedule: int
    ) -> bool:
        request = self._request_of(core_id)
        view = self._encoder_cache_view
        view._asked_by_core = True
        try:
            return bool(
                view.can_allocate(request, input_index, budget_left, num_embeds_to_schedule)
            )
        finally:
            view._asked_by_core = False

    def _ask_mamba_split(
        self, core_id: Any, start: int, num_new_tokens: int, core_split: int
    ) -> int:
        request = self._request_of(core_id)
        # The tokens past the request's computed ones that the chunk starts after (a hit).
        num_local = max(start - request.num_computed_tokens, 0)
        self._split_asked = (request.request_id, num_new_tokens, core_split)
        try:
            split = self._mamba_block_aligned_split(request, num_new_tokens, num_local, 0)
        finally:
            self._split_asked = None
        return int(split)

    def _mamba_block_aligned_split(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_local_computed_tokens: int = 0,
        num_external_computed_tokens: int = 0,
    ) -> int:
        """vLLM 0.33's ``Scheduler._mamba_block_aligned_split``: the tokens of a chunk of
        ``num_new_tokens`` that the Mamba ``align`` split keeps, the core's answer. Answered
        while the core asks (a replacement calling it); InputError otherwise."""
        asked = self._split_asked
        if asked is None or asked[:2] != (request.request_id, num_new_tokens):
            raise InputError(
                f"_mamba_block_aligned_split: the split of {num_new_tokens} tokens of "
                f"{request.request_id!r} is the core's, answered only while schedule() asks "
                "for it",
                field="num_new_tokens",
                value=str(num_new_tokens),
            )
        return asked[2]

    @property
    def num_sampled_tokens_per_step(self) -> int:
        """vLLM 0.33's ``num_sampled_tokens_per_step``: 1, or 0 for a pooling or diffusion
        model (no room kept for a sampled token, no admission padded with placeholder
        drafts); assignable, from the next step on (ConfigError for another value)."""
        num: int = self._core.num_sampled_tokens_per_step
        return num

    @num_sampled_tokens_per_step.setter
    def num_sampled_tokens_per_step(self, value: int) -> None:
        num = non_negative(value, "num_sampled_tokens_per_step")
        self._core.num_sampled_tokens_per_step = num
