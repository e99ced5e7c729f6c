"""vLLM's scheduler, answered by tokenyard's Rust step scheduler.

:class:`TokenyardScheduler` implements vLLM 0.33's ``SchedulerInterface``
(``vllm/v1/core/sched/interface.py``) with the constructor of vLLM's own ``Scheduler``, so
vLLM builds it from its ``scheduler_cls`` setting::

    vllm serve MODEL --scheduler-cls tokenyard.integrations.vllm.TokenyardScheduler
    # or: LLM(model=..., scheduler_cls="tokenyard.integrations.vllm.TokenyardScheduler")

It takes vLLM ``Request`` objects and returns vLLM's ``SchedulerOutput`` and
``EngineCoreOutputs``; the decisions (token budget, sequence cap, chunked prefill, the
long-prefill threshold, prefix caching in a block pool, preemption, FCFS or priority,
speculative tokens and their padding, async scheduling, KV connector loads and sends) are
tokenyard's :class:`tokenyard.sched.Scheduler`, which follows vLLM 0.33's rules
(``docs/embedding.md``). The vLLM ``Request`` objects are kept up to date (status,
``num_computed_tokens``, output tokens, drafts, placeholders) as vLLM's scheduler keeps
them, since vLLM's engine and model runner read them.

This module imports vLLM and fails with an ``ImportError`` naming it where vLLM is not
installed; nothing else in tokenyard imports it. What it does not do (each refused with an
error naming it, never silently different) is listed in ``docs/integrations.md``: multimodal
and encoder-decoder requests, prompt embeddings, pooling, structured output, streaming
sessions, hybrid KV cache groups (sliding window, Mamba), and vLLM's ``KVCacheManager``
object itself (``kv_cache_manager``), whose block pool lives in Rust here.
"""

from __future__ import annotations

import itertools
import operator
import time
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import numpy as np

try:
    from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole
    from vllm.distributed.ec_transfer.ec_connector.factory import ECConnectorFactory
    from vllm.distributed.kv_events import (
        AllBlocksCleared,
        BlockRemoved,
        BlockStored,
        EventPublisherFactory,
        KVEventBatch,
    )
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.multimodal import MULTIMODAL_REGISTRY
    from vllm.v1.core.sched.interface import PauseState, SchedulerInterface
    from vllm.v1.core.sched.output import (
        CachedRequestData,
        NewRequestData,
        SchedulerOutput,
    )
    from vllm.v1.core.sched.request_queue import SchedulingPolicy
    from vllm.v1.core.sched.utils import check_stop
    from vllm.v1.engine import EngineCoreEventType, EngineCoreOutput, EngineCoreOutputs
    from vllm.v1.metrics.stats import (
        PrefillStats,
        PrefixCacheStats,
        RequestSpecDecodeMetrics,
        SchedulerStats,
    )
    from vllm.v1.request import Request, RequestStatus
    from vllm.v1.spec_decode.metrics import SpecDecodingStats
except ImportError as err:  # pragma: no cover - exercised only without vLLM
    raise ImportError(
        "tokenyard.integrations.vllm needs vLLM 0.33 (pip install vllm==0.33.0); the rest "
        "of tokenyard works without it"
    ) from err

from tokenyard.errors import InputError
from tokenyard.integrations._vllm_outputs import (
    attach_logprobs,
    attach_prefill_stats,
    check_supported,
    errors_in_vllm_ids,
)
from tokenyard.integrations._vllm_translate import (
    core_config,
    local_prefill_interval,
    request_id_list,
    settings,
    vllm_block_ids,
)
from tokenyard.integrations._vllm_views import (
    _ConnectorBridge,
    _KVCacheManagerView,
    _WaitingView,
)
from tokenyard.sched import Scheduler as _CoreScheduler

__all__ = ["AsyncTokenyardScheduler", "TokenyardScheduler"]

_RUNNING = RequestStatus.RUNNING
_PREEMPTED = RequestStatus.PREEMPTED
_WAITING = RequestStatus.WAITING
_WAITING_FOR_REMOTE_KVS = RequestStatus.WAITING_FOR_REMOTE_KVS
_client_index = operator.attrgetter("client_index")


class TokenyardScheduler(SchedulerInterface):  # type: ignore[misc]
    """vLLM 0.33's ``SchedulerInterface`` over :class:`tokenyard.sched.Scheduler`.

    Built by vLLM with the arguments it gives its own ``Scheduler``.

    Raises:
        ConfigError: a setting this scheduler does not serve (several KV cache groups or
            one that is not full attention), or one the core refuses.
    """

    # Async scheduling whatever scheduler_config.async_scheduling says (AsyncTokenyardScheduler).
    _async_scheduling_class = False

    def __init__(
        self,
        vllm_config: Any,
        kv_cache_config: Any,
        structured_output_manager: Any,
        block_size: int,
        hash_block_size: int | None = None,
        mm_registry: Any = MULTIMODAL_REGISTRY,
        include_finished_set: bool = False,
        log_stats: bool = False,
    ) -> None:
        self.vllm_config = vllm_config
        self.scheduler_config = vllm_config.scheduler_config
        self.cache_config = vllm_config.cache_config
        self.lora_config = vllm_config.lora_config
        self.kv_cache_config = kv_cache_config
        self.kv_events_config = vllm_config.kv_events_config
        self.parallel_config = vllm_config.parallel_config
        self.observability_config = vllm_config.observability_config
        self.structured_output_manager = structured_output_manager
        self.log_stats = log_stats
        self.block_size = block_size
        self.hash_block_size = hash_block_size or block_size
        force_async = self._async_scheduling_class
        s = settings(vllm_config, kv_cache_config, block_size, async_scheduling=force_async)
        self.max_num_running_reqs = s.max_num_running_reqs
        self.max_num_active_reqs = s.max_num_active_reqs
        self.max_num_scheduled_tokens = s.max_num_scheduled_tokens
        self.max_model_len = s.max_model_len
        self.num_spec_tokens = s.num_spec_tokens
        self.num_lookahead_tokens = s.num_lookahead_tokens
        self.async_scheduling = s.async_scheduling
        self.policy = SchedulingPolicy(s.policy)
        # Typed loosely: its ids are vLLM's str ids throughout.
        self.requests: dict[str, Request] = {}
        # The core's id of each request and back. Under FCFS the core gets ints (the next one
        # at each add_request: its bulk, array paths take them, and its maps hash them
        # faster than strs); under the priority policy vLLM breaks ties by the str id, so
        # the core gets the str itself. Entries go when the request leaves `requests`.
        self._core_ids: dict[str, Any] = {}
        self._vllm_ids: dict[Any, str] = {}
        # Finished requests with outputs still in flight (async scheduling), by vLLM id: the
        # core id their late outputs go to (the core drops them; their blocks were freed
        # when they finished, as vLLM frees them). An entry goes when the last one lands.
        self._late_core_ids: dict[str, Any] = {}
        self._int_ids = s.policy != "priority"
        self._next_core_id = itertools.count()
        # vLLM's KV connector (kv_transfer_config), bridged to the core's connector protocol.
        self.connector: Any = None
        self.connector_prefix_cache_stats: PrefixCacheStats | None = None
        self._bridge: _ConnectorBridge | None = None
        # Loads reported landed whose request has not been scheduled since (vLLM's).
        self.finished_recving_kv_req_ids: set[str] = set()
        if vllm_config.kv_transfer_config is not None:
            self.connector = KVConnectorFactory.create_connector(
                config=vllm_config, role=KVConnectorRole.SCHEDULER, kv_cache_config=kv_cache_config
            )
            self._bridge = _ConnectorBridge(self, self.connector)
            if log_stats:
                self.connector_prefix_cache_stats = PrefixCacheStats()
        self._core: Any = _CoreScheduler(
            core_config(vllm_config, kv_cache_config, block_size, async_scheduling=force_async),
            connector=self._bridge,
        )
        self._num_kv_blocks = s.num_blocks - 1
        self.local_prefill_interval = local_prefill_interval(vllm_config)

        # Requests that finished since the previous schedule() (SchedulerOutput's field).
        self.finished_req_ids: set[str] = set()
        self.finished_req_ids_dict: dict[int, set[str]] | None = (
            defaultdict(set) if include_finished_set else None
        )
        # Requests preempted outside schedule() (reset_prefix_cache), for the next output.
        self.reset_preempted_req_ids: set[str] = set()
        self.prev_step_scheduled_req_ids: set[str] = set()
        self.use_pp = self.parallel_config.pipeline_parallel_size > 1
        self.use_v2_model_runner = getattr(vllm_config, "use_v2_model_runner", False)
        # vLLM 0.33's flag: drafts may be skipped (skip_drafts) only for drafters with their
        # own forward pass on the V2 runner (they reserve lookahead slots).
        self.can_skip_drafts = self.num_lookahead_tokens > 0 and self.use_v2_model_runner
        # vLLM's encoder-cache connector: built and driven as vLLM does, though with
        # multimodal requests refused it never has an encoder input to move.
        self.ec_connector: Any = None
        if getattr(vllm_config, "ec_transfer_config", None) is not None:
            self.ec_connector = ECConnectorFactory.create_connector(
                config=vllm_config, role=ECConnectorRole.SCHEDULER
            )
        self.kv_cache_manager = _KVCacheManagerView(self)
        self.spec_decode_metrics_level = self.observability_config.per_request_spec_decode_metrics
        self._num_hash_lookahead_tokens = getattr(vllm_config, "num_hash_lookahead_tokens", 0)
        self.aux_output_connector: Any = None
        self.current_step = 0
        self._pause_state = PauseState.UNPAUSED
        self._spec_token_placeholders = [-1] * self.num_spec_tokens
        # Requests preempted by reset_prefix_cache: outputs of their steps then in flight
        # are dropped, not delivered.
        self._dropped_outputs: set[str] = set()
        # Admitted requests whose PrefillStats go out with their first output, and the
        # stats of this step's first outputs.
        self._prefill_stats_due: set[str] = set()
        self._prefill_stats_ready: dict[str, PrefillStats] = {}
        self._prefix_cache_stats = PrefixCacheStats() if log_stats else None
        self._prefix_caching = s.enable_prefix_caching
        self.enable_kv_cache_events = bool(
            self.kv_events_config is not None and self.kv_events_config.enable_kv_cache_events
        )
        self.kv_event_publisher = EventPublisherFactory.create(
            self.kv_events_config, self.parallel_config.data_parallel_index
        )
        if self.enable_kv_cache_events:
            self._core.enable_kv_events()

    # --- queues -----------------------------------------------------------------------------

    def _vllm_requests(self, core_ids: Iterable[Any]) -> list[Request]:
        """The vLLM requests of core ids, in their order."""
        return list(map(self.requests.__getitem__, map(self._vllm_ids.__getitem__, core_ids)))

    @property
    def running(self) -> list[Request]:
        """The running requests in running order (a new list on each read)."""
        return self._vllm_requests(self._core.running_ids())

    @property
    def waiting(self) -> _WaitingView:
        """The waiting requests in scheduling order (a snapshot), those whose KV a
        connector is loading excepted (vLLM keeps them in ``kv_holding_waiting``)."""
        holding = self._holding_kv()
        waiting = self._vllm_requests(self._core.waiting_ids())
        return _WaitingView([r for r in waiting if not holding or r.request_id not in holding])

    @property
    def kv_holding_waiting(self) -> _WaitingView:
        """The waiting requests that hold KV blocks: those whose KV a connector is loading
        or has loaded (a snapshot, in scheduling order)."""
        holding = self._holding_kv()
        if not holding:
            return _WaitingView([])
        waiting = self._vllm_requests(self._core.waiting_ids())
        return _WaitingView([r for r in waiting if r.request_id in holding])

    def _holding_kv(self) -> set[str]:
        """Waiting requests holding KV blocks: loads in flight, and loads that landed
        whose request has not been scheduled since."""
        if self._bridge is None:
            return set()
        return self._bridge.loading | self.finished_recving_kv_req_ids

    # vLLM 0.33's prefill cadence state, read from the core.
    num_executed_steps = property(lambda self: self._core.num_executed_steps)
    last_prefill_step = property(lambda self: self._core.last_prefill_step)
    prefill_capacity_bound = property(lambda self: self._core.prefill_capacity_bound)

    @property
    def deferred_waiting(self) -> set[Request]:
        """Waiting requests the admission scan skipped, not admitted since (a snapshot)."""
        return set(self._vllm_requests(self._core.deferred_waiting_ids()))

    def get_request_counts(self) -> tuple[int, int]:
        """(running, waiting)."""
        return self._core.num_running, self._core.num_waiting

    def get_kv_cache_usage(self) -> float:
        return float(self._core.stats().kv_usage)

    def has_request(self, request_id: str) -> bool:
        return request_id in self.requests

    def get_num_unfinished_requests(self) -> int:
        if self._pause_state == PauseState.PAUSED_ALL:
            return 0
        num_running, num_waiting = self.get_request_counts()
        if self._pause_state == PauseState.PAUSED_NEW:
            # Requests holding KV blocks still drain; queued ones stay queued.
            return num_running + len(self.kv_holding_waiting)
        return num_running + num_waiting

    def has_finished_requests(self) -> bool:
        if self.finished_req_ids:
            return True
        # Finished requests whose blocks a KV transfer holds stay in `requests` (vLLM's).
        if self.connector is None:
            return False
        num_running, num_waiting = self.get_request_counts()
        return len(self.requests) > num_running + num_waiting

    @property
    def pause_state(self) -> PauseState:
        return self._pause_state

    def set_pause_state(self, pause_state: PauseState) -> None:
        """vLLM's pause states: ``PAUSED_NEW`` admits only waiting requests that hold KV
        blocks (their loads drain), ``PAUSED_ALL`` schedules nothing."""
        self._pause_state = pause_state
        self._core.set_admit_new(pause_state == PauseState.UNPAUSED)

    # --- requests in and out ----------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        """Queues a vLLM ``Request``.

        Raises:
            InputError: a request kind tokenyard does not schedule (multimodal inputs,
                prompt embeddings, pooling, structured output, a streaming session), a
                duplicate id, or one the core refuses (e.g. a prompt with no room for an
                output token under ``max_model_len``).
        """
        request_id = request.request_id
        if request_id in self.requests:
            raise InputError(
                f"request_id: {request_id!r} is already queued or running (streaming-input "
                "sessions are not supported)",
                field="request_id",
                value=request_id,
            )
        check_supported(request)
        params = request.sampling_params
        lora = request.lora_request
        core_id = next(self._next_core_id) if self._int_ids else request_id
        self._core.add_request(
            core_id,
            request.prompt_token_ids,
            request.max_tokens,
            priority=request.priority,
            arrival_time=request.arrival_time,
            eos_token_id=params.eos_token_id,
            stop_token_ids=params.stop_token_ids or None,
            lora_id=lora.lora_int_id if lora is not None and lora.lora_int_id > 0 else None,
        )
        self.requests[request_id] = request
        self._core_ids[request_id] = core_id
        self._vllm_ids[core_id] = request_id
        if self.spec_decode_metrics_level != "none":
            request.spec_decode_metrics = RequestSpecDecodeMetrics.new(self.num_spec_tokens)
        if self.connector is not None:
            self.connector.on_new_request(request)
        if self.log_stats:
            request.record_event(EngineCoreEventType.QUEUED)

    def finish_requests(
        self, request_ids: str | Iterable[str] | None, finished_status: RequestStatus
    ) -> list[Request]:
        """Finishes requests from outside (aborts, stop strings found by the detokenizer):
        one id (a ``str`` is one id), an iterable of ids, or ``None`` for all. Unknown or
        already finished ids are skipped, as in vLLM. Returns the requests finished."""
        if not RequestStatus.is_finished(finished_status):
            raise InputError(
                f"finished_status: {finished_status!s} is not a finished status",
                field="finished_status",
                value=str(finished_status),
            )
        ids = [
            i
            for i in request_id_list(request_ids, self.requests)
            if i in self.requests and not self.requests[i].is_finished()
        ]
        if not ids:
            return []
        self._core.abort([self._core_ids[i] for i in ids])
        finished = []
        for request_id in ids:
            request = self.requests[request_id]
            request.status = finished_status
            self._free_request(request)
            finished.append(request)
        return finished

    def _free_request(self, request: Request) -> None:
        if self.aux_output_connector is not None:
            self.aux_output_connector.request_finished(request)
        if self.ec_connector is not None:
            # A text-only request has no encoder outputs for the connector to keep: its
            # delay-free answer has nothing to delay.
            self.ec_connector.request_finished(request)
        request_id = request.request_id
        self.finished_recving_kv_req_ids.discard(request_id)
        # Finished before its first output (an abort): its PrefillStats never go out.
        self._prefill_stats_due.discard(request_id)
        self.finished_req_ids.add(request_id)
        if self.finished_req_ids_dict is not None:
            self.finished_req_ids_dict[request.client_index].add(request_id)
        bridge = self._bridge
        # As vLLM's: a request whose blocks a KV send (or an aborted load) holds stays in
        # `requests` until the transfer is reported.
        if bridge is None or (
            request_id not in bridge.sending and request_id not in bridge.loading
        ):
            self._forget(request_id)

    def _request_of(self, core_id: Any) -> Request:
        """The vLLM request of a core id."""
        return self.requests[self._vllm_ids[core_id]]

    def _forget(self, request_id: str) -> None:
        """Drops a request the core no longer holds. One with outputs in flight keeps its
        core id until they land (``_late_core_ids``)."""
        del self.requests[request_id]
        core_id = self._core_ids.pop(request_id)
        if self.async_scheduling and self._core.num_outputs_in_flight(core_id):
            self._late_core_ids[request_id] = core_id
        else:
            del self._vllm_ids[core_id]

    # --- one step ---------------------------------------------------------------------------

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        """Forms the next batch (``throttle_prefills``: vLLM's DP prefill balancing)."""
        self.current_step += 1
        requests = self.requests
        vllm_ids = self._vllm_ids
        if self._pause_state == PauseState.PAUSED_ALL:
            out = SchedulerOutput.make_empty()
            out.finished_req_ids = self.finished_req_ids
            out.preempted_req_ids = self.reset_preempted_req_ids
            self.finished_req_ids = set()
            self.reset_preempted_req_ids = set()
            return out
        core = self._core.schedule(throttle_prefills=throttle_prefills)
        bridge = self._bridge
        if bridge is not None:
            for load in core.kv_loads:
                request_id = vllm_ids[load.request_id]
                requests[request_id].status = _WAITING_FOR_REMOTE_KVS
                bridge.loading.add(request_id)
        now = time.monotonic()
        self._apply_preemptions(core.preempted_req_ids, now)
        new_reqs_data, resumed = self._new_and_resumed(core, now)
        scheduled: tuple[Any, list[str]] | None = None
        if self._int_ids:
            ids, counts = core.num_scheduled_tokens_arrays()
            scheduled = ids, list(map(vllm_ids.__getitem__, ids.tolist()))
            num_scheduled_tokens = dict(zip(scheduled[1], counts.tolist(), strict=True))
        else:
            num_scheduled_tokens = {vllm_ids[i]: n for i, n in core.num_scheduled_tokens.items()}
        cached_data = self._cached_request_data(core, resumed, num_scheduled_tokens, scheduled)
        spec_decode_tokens = self._spec_decode_tokens(core.scheduled_spec_decode_tokens)
        out = SchedulerOutput(
            scheduled_new_reqs=new_reqs_data,
            scheduled_cached_reqs=cached_data,
            num_scheduled_tokens=num_scheduled_tokens,
            total_num_scheduled_tokens=core.total_num_scheduled_tokens,
            scheduled_spec_decode_tokens=spec_decode_tokens,
            scheduled_encoder_inputs={},
            preempted_req_ids=self.reset_preempted_req_ids,
            finished_req_ids=self.finished_req_ids,
            free_encoder_mm_hashes=[],
            num_spec_tokens_to_schedule=self.num_spec_tokens,
        )
        if not self.use_v2_model_runner:
            self.prev_step_scheduled_req_ids = set(num_scheduled_tokens)
        out.skip_drafts = not self._after_schedule(num_scheduled_tokens, spec_decode_tokens)
        if bridge is not None:
            out.has_sync_kv_loads = bridge.has_sync_kv_loads
            bridge.has_sync_kv_loads = False
        if self.connector is not None:
            out.kv_connector_metadata = self.connector.build_connector_meta(out)
        if self.ec_connector is not None:
            out.ec_connector_metadata = self.ec_connector.build_connector_meta(out)
        self.finished_req_ids = set()
        self.reset_preempted_req_ids = set()
        return out

    def _apply_preemptions(self, preempted_ids: list[Any], now: float) -> None:
        """The core's preemptions on the vLLM requests, as vLLM's ``_preempt_request``."""
        for request in self._vllm_requests(preempted_ids):
            request.status = _PREEMPTED
            request.num_computed_tokens = 0
            request.num_output_placeholders = 0
            request.num_preemptions += 1
            if request.spec_token_ids:
                request.spec_token_ids = []
            if self.log_stats:
                request.record_event(EngineCoreEventType.PREEMPTED, now)
            self.reset_preempted_req_ids.add(request.request_id)

    def _new_and_resumed(
        self, core: Any, now: float
    ) -> tuple[list[NewRequestData], list[tuple[Request, tuple[list[int], ...]]]]:
        """The step's admissions: ``NewRequestData`` for new requests (and resumed ones
        under the V2 runner), and the resumed requests with their block ids for the V1
        runner's ``CachedRequestData``."""
        requests = self.requests
        vllm_ids = self._vllm_ids
        bridge = self._bridge
        log_stats = self.log_stats
        v2 = self.use_v2_model_runner
        new_reqs_data = []
        resumed: list[tuple[Request, tuple[list[int], ...]]] = []
        for data in itertools.chain(core.scheduled_new_reqs, core.scheduled_resumed_reqs):
            request_id = vllm_ids[data.req_id]
            request = requests[request_id]
            # A preempted request whose KV a connector loaded resumes too (vLLM promotes it
            # to PREEMPTED when its load lands).
            was_preempted = request.status == _PREEMPTED or (
                request.status == _WAITING_FOR_REMOTE_KVS and request.num_preemptions > 0
            )
            if was_preempted:
                self._dropped_outputs.discard(request_id)
            if bridge is not None:
                self.finished_recving_kv_req_ids.discard(request_id)
            request.status = _RUNNING
            request.num_computed_tokens = data.num_computed_tokens
            external = bridge.external_hits.pop(request_id, 0) if bridge is not None else 0
            if log_stats:
                request.record_event(EngineCoreEventType.SCHEDULED, now)
                if bridge is not None and request_id in bridge.lookups_recorded:
                    bridge.lookups_recorded.discard(request_id)
                else:
                    self._record_prefix_lookup(request, data.num_computed_tokens - external)
            if not was_preempted and request.num_preemptions <= 0:
                self._set_prefill_stats(request, data.num_computed_tokens, external)
            block_ids = (vllm_block_ids(data.block_ids),)
            if was_preempted and not v2:
                resumed.append((request, block_ids))
            else:
                new_reqs_data.append(
                    NewRequestData.from_request(
                        request, block_ids, request._all_token_ids if v2 else None
                    )
                )
        return new_reqs_data, resumed

    def _finish_prefill_stats(self, live: list[Request], live_ids: list[str]) -> None:
        """Takes the stats of the requests emitting their first output, finalized with the
        tokens they leave in the prefix cache (vLLM's ``estimate_cached_tokens``: their
        full prompt blocks, with prefix caching on)."""
        due = self._prefill_stats_due
        bs = self.block_size
        for request_id, request in zip(live_ids, live, strict=True):
            if request_id not in due:
                continue
            due.discard(request_id)
            stats = request.take_prefill_stats()
            if stats is None:
                continue
            cached = 0
            if self._prefix_caching:
                cached = min(request.num_computed_tokens, request.num_prompt_tokens) // bs * bs
            stats.finalize(cached)
            self._prefill_stats_ready[request_id] = stats

    def _set_prefill_stats(self, request: Request, num_computed: int, num_external: int) -> None:
        """vLLM's ``PrefillStats.set`` at a request's first admission: its prompt, and the
        tokens it found cached locally and the connector gave it."""
        stats = request.prefill_stats
        if stats is None:
            return
        stats.set(
            num_prompt_tokens=request.num_prompt_tokens,
            num_local_cached_tokens=num_computed - num_external,
            num_external_cached_tokens=num_external,
        )
        self._prefill_stats_due.add(request.request_id)

    def _cached_blocks(
        self, core: Any, scheduled: tuple[Any, list[str]] | None
    ) -> tuple[list[str], list[int], list[Any]]:
        """The core's running requests this step: their vLLM ids, computed tokens, and
        new block ids (``None`` where none). ``scheduled``: the step's core ids and their
        vLLM ids (int ids only), which the running requests usually begin with."""
        vllm_ids = self._vllm_ids
        if not self._int_ids:
            cached = core.scheduled_cached_reqs
            return (
                [vllm_ids[i] for i in cached.req_ids],
                cached.num_computed_tokens.tolist(),
                [(vllm_block_ids(b),) if len(b) else None for b in cached.new_block_ids],
            )
        ids, computed, num_new, blocks = core.scheduled_cached_reqs_arrays()
        num = len(ids)
        if scheduled is not None and np.array_equal(ids, scheduled[0][:num]):
            cached_ids = scheduled[1][:num]
        else:
            cached_ids = list(map(vllm_ids.__getitem__, ids.tolist()))
        new_block_ids: list[Any] = [None] * num
        if len(blocks):
            # Most decodes get no block: only those that do are sliced.
            with_blocks = np.flatnonzero(num_new)
            ends = np.cumsum(num_new)[with_blocks].tolist()
            block_list = vllm_block_ids(blocks)
            for i, n, end in zip(
                with_blocks.tolist(), num_new[with_blocks].tolist(), ends, strict=True
            ):
                new_block_ids[i] = (block_list[end - n : end],)
        return cached_ids, computed.tolist(), new_block_ids

    def _cached_request_data(
        self,
        core: Any,
        resumed: list[tuple[Request, tuple[list[int], ...]]],
        num_scheduled_tokens: dict[str, int],
        scheduled: tuple[Any, list[str]] | None,
    ) -> CachedRequestData:
        """``CachedRequestData`` for the requests that ran before, and (V1 runner) the
        resumed ones with their whole token lists."""
        requests = self.requests
        v2 = self.use_v2_model_runner
        cached_ids, num_computed, new_block_ids = self._cached_blocks(core, scheduled)
        num_output = [
            len(r._output_token_ids) + r.num_output_placeholders
            for r in map(requests.__getitem__, cached_ids)
        ]
        all_token_ids: dict[str, list[int]] = {}
        resumed_ids: set[str] = set()
        if not v2:
            prev = self.prev_step_scheduled_req_ids
            if not prev.issuperset(cached_ids):
                for request_id in cached_ids:
                    if request_id not in prev:
                        all_token_ids[request_id] = list(requests[request_id].all_token_ids)
        for request, block_ids in resumed:
            request_id = request.request_id
            cached_ids.append(request_id)
            resumed_ids.add(request_id)
            new_block_ids.append(block_ids)
            num_computed.append(request.num_computed_tokens)
            num_output.append(request.num_output_tokens + request.num_output_placeholders)
            all_token_ids[request_id] = list(request.all_token_ids)
        new_token_ids: list[list[int]] = []
        if self.use_pp and not self.async_scheduling:
            for request_id, n in zip(cached_ids, num_computed, strict=False):
                request = requests[request_id]
                new_token_ids.append(
                    list(request.all_token_ids[n : n + num_scheduled_tokens[request_id]])
                )
        return CachedRequestData(
            req_ids=cached_ids,
            resumed_req_ids=resumed_ids,
            new_token_ids=new_token_ids,
            all_token_ids=all_token_ids,
            new_block_ids=new_block_ids,
            num_computed_tokens=num_computed,
            num_output_tokens=num_output,
        )

    def _spec_decode_tokens(self, scheduled: dict[Any, Any]) -> dict[str, list[int]]:
        """The drafts verified this step: the request's own (vLLM's ids, -1 placeholders
        included), as many as the core scheduled. A padded admission (rule 2 in
        docs/embedding.md) has no drafts of its own: its k placeholders are vLLM's -1."""
        requests = self.requests
        vllm_ids = self._vllm_ids
        spec_decode_tokens: dict[str, list[int]] = {}
        for core_id, drafts in scheduled.items():
            request_id = vllm_ids[core_id]
            num_drafts = len(drafts)
            own = requests[request_id].spec_token_ids[:num_drafts]
            if len(own) < num_drafts:
                own = list(own) + [-1] * (num_drafts - len(own))
            spec_decode_tokens[request_id] = own
        return spec_decode_tokens

    def _drafts_unused(
        self, request: Request, num_computed_tokens: int, num_new_tokens: int
    ) -> bool:
        """Whether drafts proposed after this step are sure to go unused (vLLM 0.33's rule):
        the step is a non-final prefill chunk, or it samples the request's last output
        token even if every draft is rejected."""
        if num_computed_tokens + num_new_tokens < request.num_tokens:
            return True
        min_num_output_tokens = request.num_output_tokens + 1
        if request.num_output_placeholders > 0:
            min_num_output_tokens += 1
        return bool(min_num_output_tokens >= request.max_tokens)

    def _after_schedule(
        self, num_scheduled_tokens: dict[str, int], spec_decode_tokens: dict[str, list[int]]
    ) -> bool:
        """vLLM's ``_update_after_schedule`` on the vLLM requests: the step is assumed to
        run; under async scheduling each sampling request gets its output placeholders and
        placeholder drafts for the next step."""
        requests = self.requests
        scheduled = zip(
            map(requests.__getitem__, num_scheduled_tokens),
            num_scheduled_tokens.values(),
            strict=True,
        )
        if not self.async_scheduling and not self.can_skip_drafts:
            # The common case, without the branches below.
            for request, n in scheduled:
                num_computed = request.num_computed_tokens + n
                request.num_computed_tokens = num_computed
                request.is_prefill_chunk = num_computed < (
                    len(request._all_token_ids) + request.num_output_placeholders
                )
                if request.spec_token_ids:
                    request.spec_token_ids = []
            return True
        placeholders = self._spec_token_placeholders if self.async_scheduling else None
        drafts_for_core: dict[Any, list[int]] = {}
        core_ids = self._core_ids
        drafts_needed = not self.can_skip_drafts
        for request, n in scheduled:
            if not drafts_needed:
                drafts_needed = not self._drafts_unused(request, request.num_computed_tokens, n)
            num_computed = request.num_computed_tokens + n
            request.num_computed_tokens = num_computed
            prefill_chunk = num_computed < (
                len(request._all_token_ids) + request.num_output_placeholders
            )
            request.is_prefill_chunk = prefill_chunk
            if request.spec_token_ids:
                request.spec_token_ids = []
            if placeholders is not None and not prefill_chunk:
                request_id = request.request_id
                request.num_output_placeholders += 1 + len(spec_decode_tokens.get(request_id, ()))
                if placeholders:
                    request.spec_token_ids = placeholders
                    drafts_for_core[core_ids[request_id]] = [0] * len(placeholders)
        if drafts_for_core:
            with errors_in_vllm_ids(self._vllm_ids):
                self._core.update_from_output({}, spec_token_ids=drafts_for_core)
        return drafts_needed

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: Any
    ) -> dict[int, EngineCoreOutputs]:
        """Applies a step's sampled tokens: appends them to the requests, stops requests
        (EOS, stop ids, ``max_tokens``, ``max_model_len``), rolls back rejected drafts, and
        returns the outputs by client, with the step's stats."""
        kv_output = model_runner_output.kv_connector_output
        if kv_output is not None and self.connector is not None:
            self._update_from_kv_transfers(kv_output)
        live_ids, live, live_tokens, rejected, spec_stats, late = self._sampled(
            scheduler_output, model_runner_output
        )
        live_core_ids = list(map(self._core_ids.__getitem__, live_ids))
        core_ids, core_tokens = live_core_ids, live_tokens
        if late:
            # Outputs of finished requests go to the core too: it expects them (and drops
            # them), as vLLM's update skips a request it no longer holds.
            core_ids = live_core_ids + [core_id for core_id, _ in late]
            core_tokens = live_tokens + [tokens for _, tokens in late]
        vllm_ids = self._vllm_ids
        kept_drafts: dict[Any, list[int]] = {}
        if self.async_scheduling and self.num_spec_tokens:
            # The placeholder drafts of the step scheduled since (vLLM keeps them on the
            # request through this update): the core replaces a request's drafts with those
            # given in the update, so they are given again.
            for core_id, request in zip(live_core_ids, live, strict=True):
                if request.spec_token_ids and request.status == _RUNNING:
                    kept_drafts[core_id] = [0] * len(request.spec_token_ids)
        if self._int_ids and not rejected and not kept_drafts:
            # The bulk path: one list of ids, one of counts, one of all the tokens.
            with errors_in_vllm_ids(vllm_ids):
                finished = self._core.update_from_output_arrays(
                    core_ids,
                    list(itertools.chain.from_iterable(core_tokens)),
                    list(map(len, core_tokens)),
                )
        else:
            with errors_in_vllm_ids(vllm_ids):
                finished = self._core.update_from_output(
                    dict(zip(core_ids, core_tokens, strict=True)),
                    num_rejected_tokens=rejected or None,
                    spec_token_ids=kept_drafts or None,
                )
        if late:
            self._forget_landed(late)
        finished_ids = {vllm_ids[i] for i, _ in finished} if finished else set()
        nans = model_runner_output.num_nans_in_logits
        if nans:
            for request_id, request in zip(live_ids, live, strict=True):
                if request_id in nans:
                    request.num_nans_in_logits = nans[request_id]
        if self._prefill_stats_due:
            self._finish_prefill_stats(live, live_ids)
        outputs = self._outputs_by_client(live, live_ids, live_tokens, finished_ids)
        if self._prefill_stats_ready:
            attach_prefill_stats(outputs, self._prefill_stats_ready)
            self._prefill_stats_ready.clear()
        attach_logprobs(outputs, live, model_runner_output)
        self._publish_kv_events()
        engine_core_outputs = {
            client: EngineCoreOutputs(outputs=outs) for client, outs in outputs.items()
        }
        if self.finished_req_ids_dict:
            for client, finished_set in self.finished_req_ids_dict.items():
                if (eco := engine_core_outputs.get(client)) is not None:
                    eco.finished_requests = finished_set
                else:
                    engine_core_outputs[client] = EngineCoreOutputs(finished_requests=finished_set)
            self.finished_req_ids_dict.clear()
        stats = self._step_stats(model_runner_output, kv_output, spec_stats)
        if stats is not None:
            if (eco := next(iter(engine_core_outputs.values()), None)) is None:
                engine_core_outputs[0] = eco = EngineCoreOutputs()
            eco.scheduler_stats = stats
        return engine_core_outputs

    def _forget_landed(self, late: list[tuple[Any, list[int]]]) -> None:
        """Forgets the core ids of finished requests whose last output has landed."""
        late_core_ids = self._late_core_ids
        for core_id, _ in late:
            if not self._core.num_outputs_in_flight(core_id):
                request_id = self._vllm_ids.pop(core_id, None)
                if request_id is not None and late_core_ids.get(request_id) == core_id:
                    del late_core_ids[request_id]

    def _sampled(
        self, scheduler_output: SchedulerOutput, model_runner_output: Any
    ) -> tuple[
        list[str],
        list[Request],
        list[list[int]],
        dict[Any, int],
        SpecDecodingStats | None,
        list[tuple[Any, list[int]]],
    ]:
        """The step's live requests (those with sampled tokens) as parallel lists: their
        ids, the vLLM requests, their tokens; with the rejected draft counts for the
        core. Rolls the vLLM requests back by their rejected drafts and gathers the
        spec-decode stats. Last, the late outputs of finished requests, by core id: they
        reach no vLLM request, only the core."""
        sampled = model_runner_output.sampled_token_ids
        index = model_runner_output.req_id_to_index
        spec_scheduled = scheduler_output.scheduled_spec_decode_tokens
        requests_get = self.requests.get
        core_ids = self._core_ids
        rejected: dict[Any, int] = {}
        spec_stats: SpecDecodingStats | None = None
        invalid = scheduler_output.num_invalid_spec_tokens
        live_ids: list[str] = []
        live: list[Request] = []
        live_tokens: list[list[int]] = []
        dropped = self._dropped_outputs
        late: list[tuple[Any, list[int]]] = []
        scheduled_ids: Iterable[str] = scheduler_output.num_scheduled_tokens if sampled else ()
        for request_id in scheduled_ids:
            request = requests_get(request_id)
            # Finished while its step ran (a stop or an abort): statuses after PREEMPTED are
            # finished. Its output goes to the core alone.
            if request is None or request.status > _PREEMPTED:
                core_id = (
                    self._late_core_ids.get(request_id)
                    if request is None
                    else core_ids.get(request_id)
                )
                tokens = sampled[index[request_id]]
                if core_id is not None and tokens:
                    late.append((core_id, tokens))
                continue
            if dropped and request_id in dropped and request.status == _PREEMPTED:
                continue
            tokens = sampled[index[request_id]]
            if not tokens:
                continue
            if spec_scheduled and (drafts := spec_scheduled.get(request_id)):
                num_accepted = max(len(tokens) - 1, 0)
                num_rejected = len(drafts) - num_accepted
                if request.status == _RUNNING:
                    if num_rejected:
                        rejected[core_ids[request_id]] = num_rejected
                    request.num_computed_tokens -= num_rejected
                    if request.num_output_placeholders > 0:
                        request.num_output_placeholders -= num_rejected
                num_drafts = len(drafts)
                if invalid:
                    num_drafts -= invalid.get(request_id, 0)
                spec_stats = self._spec_stats(spec_stats, num_drafts, num_accepted)
                if request.spec_decode_metrics is not None:
                    request.spec_decode_metrics.observe(
                        num_draft_tokens=num_drafts,
                        num_accepted=num_accepted,
                        detailed=self.spec_decode_metrics_level == "detailed",
                    )
            live_ids.append(request_id)
            live.append(request)
            live_tokens.append(tokens)
        return live_ids, live, live_tokens, rejected, spec_stats, late

    def _outputs_by_client(
        self,
        live: list[Request],
        live_ids: list[str],
        live_tokens: list[list[int]],
        finished_ids: set[str],
    ) -> dict[int, list[EngineCoreOutput]]:
        """Appends each live request's tokens (up to its stop, for those the core finished),
        frees the finished ones, and builds one ``EngineCoreOutput`` per request."""
        hash_block_size = self.hash_block_size
        always_hash = self._num_hash_lookahead_tokens > 0
        # Every field but the first two at its default, as a decode step's output usually
        # is; the loop replaces those that need more.
        outputs = list(map(EngineCoreOutput, live_ids, live_tokens))
        for i, (request, tokens) in enumerate(zip(live, live_tokens, strict=True)):
            if finished_ids and request.request_id in finished_ids:
                outputs[i] = self._finished_output(request, tokens)
                continue
            # Request.append_output_token_ids, with its block hasher called only when a
            # block fills (it hashes nothing otherwise).
            all_token_ids = request._all_token_ids
            request._output_token_ids.extend(tokens)
            all_token_ids.extend(tokens)
            if request._block_hasher is not None and (
                always_hash or len(all_token_ids) // hash_block_size > len(request.block_hashes)
            ):
                request.update_block_hashes()
            if request.num_output_placeholders > 0:
                request.num_output_placeholders -= len(tokens)
            events = request.events
            if (
                events
                or request.trace_headers is not None
                or request.num_nans_in_logits
                or request.stop_reason is not None
            ):
                if events:
                    request.events = []
                outputs[i] = EngineCoreOutput(
                    request_id=request.request_id,
                    new_token_ids=tokens,
                    stop_reason=request.stop_reason,
                    events=events or None,
                    trace_headers=request.trace_headers,
                    num_nans_in_logits=request.num_nans_in_logits,
                )
        clients = set(map(_client_index, live))
        if len(clients) <= 1:
            return {clients.pop(): outputs} if outputs else {}
        by_client: dict[int, list[EngineCoreOutput]] = defaultdict(list)
        for request, output in zip(live, outputs, strict=True):
            by_client[request.client_index].append(output)
        return by_client

    def _finished_output(self, request: Request, tokens: list[int]) -> EngineCoreOutput:
        """A request the core finished: its tokens up to its stop appended, the request
        freed, and its last ``EngineCoreOutput``."""
        request_id = request.request_id
        tokens = self._append_until_stop(request, tokens)
        finish_reason = request.get_finished_reason()
        self._free_request(request)
        bridge = self._bridge
        transfer_params = bridge.transfer_params.pop(request_id, None) if bridge else None
        events = request.events
        if events:
            request.events = []
        return EngineCoreOutput(
            request_id=request_id,
            new_token_ids=tokens,
            finish_reason=finish_reason,
            stop_reason=request.stop_reason,
            events=events or None,
            spec_decode_metrics=request.spec_decode_metrics,
            trace_headers=request.trace_headers,
            num_nans_in_logits=request.num_nans_in_logits,
            kv_transfer_params=transfer_params,
        )

    def _step_stats(
        self, model_runner_output: Any, kv_output: Any, spec_stats: SpecDecodingStats | None
    ) -> SchedulerStats | None:
        """The step's ``SchedulerStats``, with the connectors' stats aggregated."""
        ec_output = getattr(model_runner_output, "ec_connector_output", None)
        ec_stats = ec_output.ec_connector_stats if ec_output else None
        if self.ec_connector is not None:
            if ec_output:
                self.ec_connector.update_connector_output(ec_output)
            own_ec = self.ec_connector.get_ec_connector_stats()
            if own_ec is not None and not own_ec.is_empty():
                ec_stats = ec_stats.aggregate(own_ec) if ec_stats is not None else own_ec
        kv_stats = kv_output.kv_connector_stats if kv_output else None
        if self.connector is not None:
            own = self.connector.get_kv_connector_stats()
            if own is not None and not own.is_empty():
                kv_stats = kv_stats.aggregate(own) if kv_stats is not None else own
        return self.make_stats(
            spec_stats,
            kv_stats,
            model_runner_output.cudagraph_stats,
            None,
            ec_connector_stats=ec_stats,
        )

    def _update_from_kv_transfers(self, kv_output: Any) -> None:
        """vLLM's ``_update_from_kv_xfer_finished``: the connector sees the workers' report,
        then the loads that landed or failed and the sends that completed go to the core.
        Blocks a failed load wrote (``invalid_block_ids``) fail that load, and the request
        recomputes its prompt (vLLM's ``kv_load_failure_policy="recompute"`` for
        asynchronous loads)."""
        self.connector.update_connector_output(kv_output)
        bridge = self._bridge
        if bridge is None:
            return
        recving = [i for i in kv_output.finished_recving or () if i in bridge.loading]
        sending = [i for i in kv_output.finished_sending or () if i in bridge.sending]
        failed: list[str] = []
        invalid = kv_output.invalid_block_ids
        if invalid:
            for request_id in list(bridge.loading):
                if request_id in self.requests and not invalid.isdisjoint(
                    vllm_block_ids(self._core.block_ids(self._core_ids[request_id]))
                ):
                    failed.append(request_id)
            recving = [i for i in recving if i not in failed]
        if not (recving or sending or failed):
            return
        core_ids = self._core_ids
        with errors_in_vllm_ids(self._vllm_ids):
            self._core.finish_kv_transfers(
                finished_recving=[core_ids[i] for i in recving],
                finished_sending=[core_ids[i] for i in sending],
                failed_recving=[core_ids[i] for i in failed],
            )
        for request_id in itertools.chain(recving, failed):
            bridge.loading.discard(request_id)
        for request_id in recving:
            request = self.requests.get(request_id)
            if request is not None and not request.is_finished():
                self.finished_recving_kv_req_ids.add(request_id)
        for request_id in sending:
            bridge.sending.discard(request_id)
        for request_id in itertools.chain(recving, failed, sending):
            request = self.requests.get(request_id)
            if request is not None and request.is_finished() and request_id not in bridge.sending:
                self._forget(request_id)

    def _append_until_stop(self, request: Request, tokens: list[int]) -> list[int]:
        """Appends tokens up to the one that stopped the request (vLLM's ``check_stop``,
        which also sets its status and ``stop_reason``) and resolves the output placeholders
        of all of them, as vLLM 0.33's ``_update_request_with_output``; returns the tokens
        kept."""
        kept = tokens
        for num_kept, token in enumerate(tokens, 1):
            request.append_output_token_ids(token)
            if check_stop(request, self.max_model_len):
                request.num_computed_tokens -= len(tokens) - num_kept
                kept = tokens[:num_kept]
                break
        else:
            # The core stopped it where vLLM's check would not (never expected): length.
            request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        if request.num_output_placeholders > 0:
            request.num_output_placeholders = max(request.num_output_placeholders - len(tokens), 0)
        return kept

    def _spec_stats(
        self, stats: SpecDecodingStats | None, num_drafts: int, num_accepted: int
    ) -> SpecDecodingStats | None:
        if not self.log_stats or not num_drafts:
            return stats
        if stats is None:
            stats = SpecDecodingStats.new(self.num_spec_tokens)
        stats.observe_draft(num_draft_tokens=num_drafts, num_accepted_tokens=num_accepted)
        return stats

    def _record_prefix_lookup(self, request: Request, num_hits: int) -> None:
        stats = self._prefix_cache_stats
        if stats is None or not self._prefix_caching:
            return
        stats.record(
            num_tokens=request.num_tokens,
            num_hits=num_hits,
            preempted=request.num_preemptions > 0,
        )

    # --- speculative decoding ---------------------------------------------------------------

    def update_draft_token_ids(self, draft_token_ids: Any) -> None:
        """Drafts proposed for the next step (vLLM calls this after ``update_from_output``)."""
        requests = self.requests
        core_ids = self._core_ids
        for_core: dict[Any, list[int]] = {}
        for request_id, drafts in zip(
            draft_token_ids.req_ids, draft_token_ids.draft_token_ids, strict=False
        ):
            request = requests.get(request_id)
            if request is None or request.is_finished():
                continue
            if request.is_prefill_chunk:
                if request.spec_token_ids:
                    request.spec_token_ids = []
                    for_core[core_ids[request_id]] = []
                continue
            drafts = self.structured_output_manager.validate_tokens(request, list(drafts))
            request.spec_token_ids = drafts
            # The core counts drafts; the ids the model verifies are the request's own.
            for_core[core_ids[request_id]] = [0] * len(drafts)
        if for_core:
            with errors_in_vllm_ids(self._vllm_ids):
                self._core.update_from_output({}, spec_token_ids=for_core)

    def update_draft_token_ids_in_output(
        self, draft_token_ids: Any, scheduler_output: SchedulerOutput
    ) -> None:
        """Async scheduling: real drafts replace the step's placeholder drafts in place
        (trimmed to the drafts scheduled, padded back with -1 where the grammar refuses
        them), as vLLM 0.33 does."""
        num_invalid: dict[str, int] = {}
        scheduled = scheduler_output.scheduled_spec_decode_tokens
        for request_id, drafts in zip(
            draft_token_ids.req_ids, draft_token_ids.draft_token_ids, strict=False
        ):
            request = self.requests.get(request_id)
            if request is None or request.is_finished():
                continue
            placeholders = scheduled.get(request_id)
            if not placeholders:
                continue
            num_scheduled = len(placeholders)
            del drafts[num_scheduled:]
            drafts = self.structured_output_manager.validate_tokens(request, drafts)
            if len(drafts) < num_scheduled:
                num_invalid[request_id] = num_scheduled - len(drafts)
                drafts.extend([-1] * (num_scheduled - len(drafts)))
            scheduled[request_id] = drafts
        scheduler_output.num_invalid_spec_tokens = num_invalid

    def get_grammar_bitmask(self, scheduler_output: SchedulerOutput) -> None:
        """Structured output is not supported: never a bitmask."""
        return None

    # --- caches, stats, events --------------------------------------------------------------

    def reset_prefix_cache(
        self, reset_running_requests: bool = False, reset_connector: bool = False
    ) -> bool:
        """Forgets every cached prefix. Only possible when no request holds KV blocks;
        with ``reset_running_requests`` the running requests are preempted first (they
        appear in the next step's ``preempted_req_ids`` and are recomputed)."""
        preempted: list[Request] = []
        if reset_running_requests:
            _, preempted_ids = self._core.reset_prefix_cache(preempt_running=True)
            preempted = self._vllm_requests(preempted_ids)
        for request in preempted:
            request_id = request.request_id
            request.status = _PREEMPTED
            request.num_computed_tokens = 0
            request.num_output_placeholders = 0
            request.num_preemptions += 1
            if request.spec_token_ids:
                request.spec_token_ids = []
            # Their steps in flight are dropped (vLLM's drop_stale_output): the request
            # may resume before they land.
            self._dropped_outputs.add(request_id)
            self.reset_preempted_req_ids.add(request_id)
        if preempted:
            self.prev_step_scheduled_req_ids.clear()
        reset = self.kv_cache_manager.reset_prefix_cache()
        if reset_running_requests and not reset:
            raise RuntimeError(
                "Failed to reset the prefix cache after preempting every running request"
            )
        if reset and self._prefix_cache_stats is not None:
            self._prefix_cache_stats.reset = True
        if reset and self.aux_output_connector is not None:
            self.aux_output_connector.reset()
        return bool(reset)

    def reset_connector_cache(self) -> bool:
        """vLLM's: resets the connector's external cache, if it has one."""
        if self.connector is None:
            return True
        if self.connector.reset_cache() is False:
            return False
        if self.connector_prefix_cache_stats is not None:
            self.connector_prefix_cache_stats.reset = True
        return True

    def reset_encoder_cache(self) -> None:
        """No encoder cache: nothing to reset."""

    def make_stats(
        self,
        spec_decoding_stats: SpecDecodingStats | None = None,
        kv_connector_stats: Any = None,
        cudagraph_stats: Any = None,
        perf_stats: Any = None,
        ec_connector_stats: Any = None,
    ) -> SchedulerStats | None:
        """vLLM's per-step ``SchedulerStats``: queue sizes, KV usage, the prefix-cache
        lookups since the previous call, speculative-decoding counts."""
        if not self.log_stats:
            return None
        prefix_cache_stats = self._prefix_cache_stats
        self._prefix_cache_stats = PrefixCacheStats()
        connector_prefix_cache_stats = self.connector_prefix_cache_stats
        if connector_prefix_cache_stats is not None:
            self.connector_prefix_cache_stats = PrefixCacheStats()
        num_running, num_waiting = self.get_request_counts()
        num_deferred = self._core.stats().num_deferred_waiting
        return SchedulerStats(
            num_running_reqs=num_running,
            num_waiting_reqs=num_waiting - num_deferred,
            num_skipped_waiting_reqs=num_deferred,
            kv_cache_usage=self._core.stats().kv_usage,
            prefix_cache_stats=prefix_cache_stats,
            connector_prefix_cache_stats=connector_prefix_cache_stats,
            spec_decoding_stats=spec_decoding_stats,
            kv_connector_stats=kv_connector_stats.to_dict() if kv_connector_stats else None,
            ec_connector_stats=ec_connector_stats.data if ec_connector_stats else None,
            cudagraph_stats=cudagraph_stats,
            perf_stats=perf_stats,
        )

    def _publish_kv_events(self) -> None:
        events: list[Any] = []
        core_events = self._core.drain_kv_events() if self.enable_kv_cache_events else ()
        for kind, block_hash in core_events:
            if kind == "stored":
                events.append(
                    BlockStored(
                        block_hashes=[block_hash],
                        parent_block_hash=None,
                        token_ids=[],
                        block_size=self.block_size,
                        lora_id=None,
                        medium="GPU",
                    )
                )
            elif kind == "removed":
                events.append(BlockRemoved(block_hashes=[block_hash], medium="GPU"))
            elif kind == "all_cleared":
                events.append(AllBlocksCleared())
        if self.connector is not None:
            events.extend(self.connector.take_events() or ())
        if events:
            self.kv_event_publisher.publish(KVEventBatch(ts=time.time(), events=events))

    def shutdown(self) -> None:
        if self.connector is not None:
            self.connector.shutdown()
        if self.ec_connector is not None:
            self.ec_connector.shutdown()
        if self.kv_event_publisher:
            self.kv_event_publisher.shutdown()

    def get_kv_connector(self) -> Any:
        return self.connector

    def get_ec_connector(self) -> Any:
        return self.ec_connector

    def get_kv_event_publisher_config(self) -> Any:
        return self.kv_event_publisher.get_publisher_config()


class AsyncTokenyardScheduler(TokenyardScheduler):
    """:class:`TokenyardScheduler` with async scheduling on, as vLLM's ``AsyncScheduler`` is
    its ``Scheduler`` with async scheduling (vLLM picks that class from
    ``scheduler_config.async_scheduling``; this one is for callers that pick the class, as
    vLLM's tests do)."""

    _async_scheduling_class = True
