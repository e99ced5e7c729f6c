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
error naming it, never silently different) is listed in ``docs/integrations.md``: KV
cache group kinds the core has none for, the HiSparse connector with prefix caching on
(served with it off: ``_vllm_hisparse_step``), vLLM's fine-grained
partial hash hits (Mamba ``align`` beside a smaller ``prefix_match_unit``), connectors
that keep vLLM's own pool or manager beyond what the pool view serves (the Mooncake store
and UMBP beside a group of a kind not checked with them, or with their own partial hash hits
over groups of different block sizes; ``SimpleCPUOffloadConnector``
beside a group other than full attention, a sliding window, chunked local attention or
Mamba ``align``, or over groups of different block sizes in lazy mode or with KV cache
events), KV cache events with a real publisher beside HiSparse or bounded-replay groups, a
Mamba ``align`` group with a checkpoint block, or differing block sizes under EAGLE's drop
or a hash look-ahead, and any vLLM ``KVCacheManager`` object but HiSparse's assigned one (the
block pool lives in Rust here).
Structured output, pooling requests, prompt embeddings, hybrid KV cache groups (full
attention, sliding window with or without retained tokens, chunked local, Mamba in ``none``
or ``align`` mode with draft and checkpoint blocks, cross-attention, HiSparse's layout; of
different block sizes, Mamba ``align`` and chunked local among them, with EAGLE/MTP and KV
connectors), EAGLE/MTP prefix caching (hash look-ahead or the trailing-block drop), KV load
failures under either policy, CPU offloading
(``OffloadingConnector``, ``SimpleCPUOffloadConnector``), the Mooncake store and UMBP
connectors (their store jobs' pins), vLLM's KV cache events (one KV group, or full
attention beside sliding windows; ``kv_cache_report_mode="full"`` too), multimodal
requests (beside KV connectors too: the items a load leaves to compute are encoded as vLLM
schedules them), streaming-input sessions and requests that arrive computed (a P/D decode
side's, also over several KV groups but HiSparse's, cross-attention and bounded-replay
windows) are served.
"""

from __future__ import annotations

import itertools
import operator
import time
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

try:
    from vllm.distributed.aux_output_connector.connector import AuxOutputSchedulerConnector
    from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole
    from vllm.distributed.ec_transfer.ec_connector.factory import ECConnectorFactory
    from vllm.distributed.kv_events import EventPublisherFactory
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.multimodal import MULTIMODAL_REGISTRY
    from vllm.multimodal.encoder_budget import MultiModalBudget
    from vllm.v1.core.sched.interface import PauseState, SchedulerInterface
    from vllm.v1.core.sched.request_queue import SchedulingPolicy
    from vllm.v1.engine import EngineCoreEventType
    from vllm.v1.metrics.stats import (
        KV_FETCH_WAITING_TO_START,
        PrefillStats,
        PrefixCacheStats,
        RequestSpecDecodeMetrics,
    )
    from vllm.v1.request import Request, RequestStatus
except ImportError as err:  # pragma: no cover - exercised only without vLLM
    raise ImportError(
        "tokenyard.integrations.vllm needs vLLM 0.33 (pip install vllm==0.33.0); the rest "
        "of tokenyard works without it"
    ) from err

from tokenyard.errors import InputError
from tokenyard.integrations._vllm_adopt import AdoptedRequests, QueueView
from tokenyard.integrations._vllm_aux_outputs import BlockHashIndex
from tokenyard.integrations._vllm_connector_binding import (
    bind_kv_cache_manager,
    binds_gpu_block_pool,
)
from tokenyard.integrations._vllm_core_attributes import CoreAttributes
from tokenyard.integrations._vllm_dynamic_sd import dynamic_sd_lookup_of
from tokenyard.integrations._vllm_ec import ec_finished
from tokenyard.integrations._vllm_encoder_cache import EncoderCacheView
from tokenyard.integrations._vllm_hisparse import (
    HiSparseTier,
    refuse_unmodelled_hisparse,
)
from tokenyard.integrations._vllm_hisparse_step import (
    hisparse_connector_configured,
    start_hisparse_connector,
)
from tokenyard.integrations._vllm_hooks import draft_slots_per_request
from tokenyard.integrations._vllm_lookahead import HashLookahead, follow_hasher
from tokenyard.integrations._vllm_mamba_align import MambaAlign
from tokenyard.integrations._vllm_outputs import check_supported, keyed_prompt
from tokenyard.integrations._vllm_schedule import ScheduleStep
from tokenyard.integrations._vllm_sessions import Sessions
from tokenyard.integrations._vllm_side_connectors import SideConnectors
from tokenyard.integrations._vllm_stats import StatsAndEvents
from tokenyard.integrations._vllm_translate import (
    core_config,
    hisparse_source_group,
    local_prefill_interval,
    request_id_list,
    settings,
    stop_rules,
    vllm_block_ids,
)
from tokenyard.integrations._vllm_update import UpdateFromOutput
from tokenyard.integrations._vllm_views import (
    _ConnectorBridge,
    _KVCacheManagerView,
    computed_block_tables,
)
from tokenyard.sched import Scheduler as _CoreScheduler

__all__ = ["AsyncTokenyardScheduler", "TokenyardScheduler"]

_RUNNING = RequestStatus.RUNNING
_PREEMPTED = RequestStatus.PREEMPTED
_WAITING = RequestStatus.WAITING
_WAITING_FOR_REMOTE_KVS = RequestStatus.WAITING_FOR_REMOTE_KVS
_client_index = operator.attrgetter("client_index")


class TokenyardScheduler(
    AdoptedRequests,
    ScheduleStep,
    UpdateFromOutput,
    MambaAlign,
    HashLookahead,
    SideConnectors,
    Sessions,
    CoreAttributes,
    HiSparseTier,
    StatsAndEvents,
    SchedulerInterface,  # type: ignore[misc]
):
    """vLLM 0.33's ``SchedulerInterface`` over :class:`tokenyard.sched.Scheduler`.

    Built by vLLM with the arguments it gives its own ``Scheduler``.

    Raises:
        ConfigError: a setting this scheduler does not serve (a KV cache group kind the
            core has none for, named), or one the core refuses.
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
        # The HiSparse connector's step (started below); _adopt_host_pool reads it first.
        self._hisparse_step = None
        self.kv_cache_config = kv_cache_config
        self.kv_events_config = vllm_config.kv_events_config
        self.parallel_config = vllm_config.parallel_config
        self.observability_config = vllm_config.observability_config
        self.structured_output_manager = structured_output_manager
        self.log_stats = log_stats
        self.block_size = block_size
        self.hash_block_size = hash_block_size or block_size
        force_async = self._async_scheduling_class
        refuse_unmodelled_hisparse(kv_cache_config, vllm_config)
        s = settings(
            vllm_config,
            kv_cache_config,
            block_size,
            async_scheduling=force_async,
            hash_block_size=hash_block_size,
        )
        self.max_num_running_reqs = s.max_num_running_reqs
        self.max_num_active_reqs = s.max_num_active_reqs
        self.max_num_scheduled_tokens = s.max_num_scheduled_tokens
        self.max_model_len = s.max_model_len
        self.num_spec_tokens = s.num_spec_tokens
        # vLLM 0.33's dynamic speculative decoding (_vllm_dynamic_sd); raises on a bad one.
        self.dynamic_sd_lookup = dynamic_sd_lookup_of(vllm_config, self.num_spec_tokens)
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
        # Landed loads an admission pass took without scheduling them (WAITING, holding
        # their blocks; vLLM's _update_waiting_for_remote_kv ran for them).
        self._promoted_loads: set[str] = set()
        if vllm_config.kv_transfer_config is not None:
            self.connector = KVConnectorFactory.create_connector(
                config=vllm_config, role=KVConnectorRole.SCHEDULER, kv_cache_config=kv_cache_config
            )
            self._bridge = _ConnectorBridge(self, self.connector)
            if log_stats:
                self.connector_prefix_cache_stats = PrefixCacheStats()
        self._init_kv_fetch_stages(log_stats and self.connector is not None)
        # vLLM 0.33's encoder budget and cache size (Scheduler.__init__: MultiModalBudget
        # for a model that takes multimodal inputs, else 0 and 0).
        model_config = vllm_config.model_config
        encoder_decoder = bool(getattr(model_config, "is_encoder_decoder", False))
        supports_mm = bool(getattr(model_config, "supports_multimodal_inputs", False))
        mm_budget = MultiModalBudget(vllm_config, mm_registry) if supports_mm else None
        # vLLM's values, as given (0 and 0 for a text-only model; its tests set them on a
        # built scheduler: the properties below pass them to the core).
        self._max_num_encoder_input_tokens = mm_budget.encoder_compute_budget if mm_budget else 0
        self._encoder_cache_size = mm_budget.encoder_cache_size if mm_budget else 0
        self._core: Any = _CoreScheduler(
            core_config(
                vllm_config,
                kv_cache_config,
                block_size,
                async_scheduling=force_async,
                max_num_encoder_input_tokens=self._max_num_encoder_input_tokens,
                encoder_cache_size=self._encoder_cache_size,
                hash_block_size=hash_block_size,
            ),
            connector=self._bridge,
        )
        if mm_budget is None:
            # vLLM's scheduler has no encoder budget or cache then (the core's 0s stand for
            # its defaults at construction).
            self._core.encoder_budget = 0
            self._core.set_encoder_cache_size(0)
        self._core.num_draft_slots_per_request = draft_slots_per_request(vllm_config)
        # vLLM's EncoderDecoderCacheManager and cross-attention blocks (see the property).
        self._core.set_encoder_decoder(encoder_decoder)
        self._num_kv_blocks = s.num_blocks - 1
        # The block the core hashes: vLLM's hash block beside groups of differing sizes.
        self._core_block_size = s.block_size
        # vLLM's groups: the core's, and HiSparse's source group (the core's host pages,
        # whose tables the outputs carry at its place).
        placed = bool(s.kv_groups) and hisparse_source_group(kv_cache_config) is not None
        self._kv_groups = len(s.kv_groups) + int(placed)
        self._hisparse_placed = placed
        # vLLM 0.33 zeroes new blocks before use with Mamba layers or mixed-precision KV
        # groups (SchedulerOutput.new_block_ids_to_zero); both come with several groups.
        self.needs_kv_cache_zeroing = bool(getattr(kv_cache_config, "needs_kv_cache_zeroing", 0))
        if self.needs_kv_cache_zeroing and self._kv_groups:
            self._core.set_kv_cache_zeroing(True)
        # vLLM 0.33's SWA bounded replay: the groups rebuilt by recomputing a hit's tail,
        # and that tail's length (their window; the core refuses windows that disagree).
        self.prefix_replay_group_ids = tuple(
            i for i, g in enumerate(s.kv_groups) if getattr(g, "bounded_replay", False)
        )
        self.prefix_replay_tokens = max(
            (s.kv_groups[i].sliding_window for i in self.prefix_replay_group_ids), default=0
        )
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
        # vLLM's encoder-cache connector: built and driven as vLLM does; the core asks it
        # while it forms a step (_vllm_ec.EncoderConnectorBridge). An encoder-only
        # instance (an EC producer) stops a request once its prompt is consumed.
        if getattr(vllm_config, "ec_transfer_config", None) is not None:
            self.ec_connector = ECConnectorFactory.create_connector(
                config=vllm_config, role=ECConnectorRole.SCHEDULER
            )
        self.is_mm_encoder_only = bool(getattr(vllm_config, "is_mm_encoder_only", False))
        # The V2 runner's encoder inputs sent and not yet released, per request (vLLM's;
        # _get_encoder_input_updates keeps it).
        self._pending_encoder_input_ids: dict[str, set[int]] = {}
        # Why multimodal items are refused here whatever the encoder budget (None: served
        # under it; a text-only model's items once a budget and a cache are set: _mm_refusal).
        # Beside a KV connector they are served: the core schedules the items past a loaded
        # prefix as vLLM 0.33's schedule() does (an encoder-decoder model's only with nothing
        # computed: a loaded prefix skips them).
        self._mm_refused: str | None = None
        self._mm_model = mm_budget is not None
        self._encoder_cache_view = EncoderCacheView(self)
        self.kv_cache_manager = _KVCacheManagerView(self)
        self.spec_decode_metrics_level = self.observability_config.per_request_spec_decode_metrics
        self._init_prefill_stops(vllm_config, kv_cache_config)
        # vLLM 0.33's auxiliary-output connector (routed experts), as its Scheduler builds
        # it; assignable on a built scheduler (the property below).
        self._block_hash_index = BlockHashIndex(self)
        aux_config = getattr(vllm_config, "aux_output_config", None)
        if aux_config is not None and aux_config.enabled:
            self.aux_output_connector = AuxOutputSchedulerConnector(
                self.kv_cache_manager, self.connector
            )
        # vLLM 0.33 binds the cache manager into the KV connector once built
        # (Scheduler.__init__, after _spec_decode_step_blocks); connectors that would change
        # vLLM's pool are refused here.
        # HiSparse's is bound to the core instead (_vllm_hisparse_step, below).
        if self.connector is not None and not hisparse_connector_configured(
            vllm_config.kv_transfer_config
        ):
            bind_kv_cache_manager(self.connector, self.kv_cache_manager)
        # Core calls that may ask the connector run in its windows (a no-op unless a
        # served connector keeps the pool: _vllm_coordinator_view.BlockPoolView.asking).
        self._pool_view = self.kv_cache_manager.block_pool
        self.current_step = 0
        self._pause_state = PauseState.UNPAUSED
        self._spec_token_placeholders = [-1] * self.num_spec_tokens
        # Requests waiting outside the core for a blocked status (a grammar compiling, a
        # wait set by hand; _vllm_adopt) and those a queue view took out; structured output:
        # requests whose grammar failed to compile (finished by the next update, vLLM's),
        # and the live requests with a grammar.
        self._blocked_ids: set[str] = set()
        self._taken_out: set[str] = set()
        self.grammar_compile_error_reqs: dict[str, Any] = {}
        self._structured_ids: set[str] = set()
        # vLLM 0.33's connector flags: whether a preempted request's in-flight output is
        # dropped (a KV producer hands KV off when a request completes), and whether a
        # finished request's blocks wait for its steps in flight (a KV consumer with
        # overlapping batches, whose loads are not ordered against those steps' writes).
        self.requires_kv_delivery = bool(
            self.connector is not None and self.connector.requires_kv_delivery
        )
        self._core.drop_stale_output = self.requires_kv_delivery
        self._core.wait_for_stale_outputs = True  # vLLM's engine updates every step
        transfer = vllm_config.kv_transfer_config
        self._core.defer_block_free = bool(
            self.connector is not None
            and vllm_config.max_concurrent_batches > 1
            and transfer.is_kv_consumer
        )
        # vLLM 0.33's HiSparse host pages (_vllm_hisparse), if the config has them; this
        # also sets defer_async_loads, so it comes after defer_block_free.
        self._adopt_host_pool(kv_cache_config)
        self._hisparse_step = start_hisparse_connector(self, vllm_config, kv_cache_config)
        # vLLM 0.33's kv_load_failure_policy (the core's; _vllm_kv_transfers).
        self.recompute_kv_load_failures = (
            transfer is None or transfer.kv_load_failure_policy == "recompute"
        )
        # A failed load (failed_recving) under vLLM's "recompute" policy: the request asks
        # the connector again once promoted (_vllm_kv_transfers).
        self._core.ask_again_after_failed_load = bool(
            transfer is not None and transfer.kv_load_failure_policy == "recompute"
        )
        # vLLM's update_from_output appends what the runner returns for a prefill chunk.
        self._core.append_prefill_chunk_outputs = True
        # Requests preempted by reset_prefix_cache: outputs of their steps then in flight
        # are dropped, not delivered.
        self._dropped_outputs: set[str] = set()
        # The requests the core preempted whose vLLM side _preempt_request is mirroring.
        self._core_preempted: set[str] = set()
        # Requests whose output in flight predates their preemption (vLLM's
        # num_stale_output_tokens > 0): their share drains as those steps land.
        self._stale_ids: set[str] = set()
        # Requests placed in `running` by hand, until the core schedules them (_vllm_adopt).
        self._adopted: set[str] = set()
        # vLLM 0.33's (the model config's); assignable on a built scheduler.
        self.return_sampling_mask = bool(getattr(model_config, "return_sampling_mask", False))
        # Streaming-input sessions (_vllm_sessions): the live ones, and those parked.
        self._session_ids: set[str] = set()
        self._parked: dict[str, Request] = {}
        self._unparked: set[str] = set()
        # The sampling settings of the turns that stopped this update and resumed with a
        # queued chunk: their outputs' logprobs follow them (vLLM slices them first).
        self._turn_sampling_params: dict[str, Any] = {}
        # Admitted requests whose PrefillStats go out with their first output, and the
        # stats of this step's first outputs.
        self._prefill_stats_due: set[str] = set()
        self._prefill_stats_ready: dict[str, PrefillStats] = {}
        self._prefix_cache_stats = PrefixCacheStats() if log_stats else None
        self._prefix_caching = s.enable_prefix_caching
        # With a Mamba `align` group, vLLM's block hashes of each request are indexed for
        # the coordinator view's per-group lookup (vLLM's tests drive it with a request's).
        # Beside a connector keeping vLLM's GPU block pool too: the pool view's blocks
        # answer with vLLM's hashes (_vllm_connector_binding.binds_gpu_block_pool).
        self._index_hashes = self._prefix_caching and (
            any(getattr(g, "mamba_cache_mode", "none") == "align" for g in s.kv_groups)
            or binds_gpu_block_pool(self.connector)
        )
        self.enable_kv_cache_events = bool(
            self.kv_events_config is not None and self.kv_events_config.enable_kv_cache_events
        )
        self.kv_event_publisher = EventPublisherFactory.create(
            self.kv_events_config, self.parallel_config.data_parallel_index
        )
        if self.enable_kv_cache_events:
            self._enable_kv_events()

    # --- queues -----------------------------------------------------------------------------

    def _vllm_requests(self, core_ids: Iterable[Any]) -> list[Request]:
        """The vLLM requests of core ids, in their order."""
        return list(map(self.requests.__getitem__, map(self._vllm_ids.__getitem__, core_ids)))

    @property
    def waiting(self) -> QueueView:
        """The waiting requests in scheduling order (a snapshot), those whose KV a
        connector is loading excepted (vLLM keeps them in ``kv_holding_waiting``); its
        ``add_request`` and ``remove_requests`` move requests (``_vllm_adopt``)."""
        holding = self._holding_kv()
        waiting = self._vllm_requests(self._core.waiting_ids())
        taken_out = self._taken_out
        if holding or taken_out:
            waiting = [
                r for r in waiting if r.request_id not in holding and r.request_id not in taken_out
            ]
        return QueueView(waiting, self, holding=False)

    @property
    def kv_holding_waiting(self) -> QueueView:
        """The waiting requests that hold KV blocks: those whose KV a connector is loading
        or has loaded, and remote-KV waits given by status (a snapshot, in scheduling
        order)."""
        holding = self._holding_kv()
        if not holding:
            return QueueView([], self, holding=True)
        waiting = self._vllm_requests(self._core.waiting_ids())
        taken_out = self._taken_out
        return QueueView(
            [r for r in waiting if r.request_id in holding and r.request_id not in taken_out],
            self,
            holding=True,
        )

    def _holding_kv(self) -> set[str]:
        """Waiting requests holding KV blocks: loads in flight, loads that landed whose
        request has not been scheduled since, sessions parked or resumed, and those the
        core serves with them while they wait outside it (a remote-KV wait given by
        status) or since (their wait just ended)."""
        holding = self._sessions_holding_kv() if self._session_ids else set()
        holding.update(map(self._vllm_ids.__getitem__, self._core.holding_waiting_ids()))
        if self._bridge is None:
            return holding
        return (
            holding | self._bridge.loading | self.finished_recving_kv_req_ids | self._promoted_loads
        )

    # vLLM 0.33's prefill cadence state, read from the core.
    num_executed_steps = property(lambda self: self._core.num_executed_steps)
    last_prefill_step = property(lambda self: self._core.last_prefill_step)
    prefill_capacity_bound = property(lambda self: self._core.prefill_capacity_bound)

    @property
    def deferred_waiting(self) -> set[Request]:
        """Waiting requests the admission scan skipped, not admitted since (a snapshot)."""
        return set(self._vllm_requests(self._core.deferred_waiting_ids()))

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
            num_waiting = len(self.kv_holding_waiting)
        # Parked sessions cannot progress until their next input (vLLM 0.33's counter).
        return num_running + num_waiting - self.num_waiting_for_streaming_input

    def has_finished_requests(self) -> bool:
        if self.finished_req_ids:
            return True
        # Finished requests whose blocks a KV transfer holds stay in `requests` (vLLM's).
        if self.connector is None:
            return False
        num_running, num_waiting = self.get_request_counts()
        return len(self.requests) > num_running + num_waiting

    def has_requests(self) -> bool:
        """vLLM 0.33's: requests left, or a connector's push work still pending (e.g. a
        HiSparse connector's host spills after the last request finished)."""
        return (
            self.has_unfinished_requests()
            or self.has_finished_requests()
            or (self.connector is not None and self.connector.has_pending_push_work())
            or (self.ec_connector is not None and self.ec_connector.has_pending_push_work())
        )

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
        """Queues a vLLM ``Request``; one with a streaming-input session's id is its next
        input chunk (or, not resumable, its end), as in vLLM 0.33.

        Raises:
            InputError: a request kind tokenyard does not schedule (multimodal inputs,
                prompt embeddings), a duplicate id that is no session's, or one the core
                refuses (e.g. a prompt with no room for an output token under
                ``max_model_len``).
        """
        request_id = request.request_id
        if request_id in self.requests:
            # A streaming-input session's next chunk (or a duplicate: refused there).
            self._add_session_update(self.requests[request_id], request)
            return
        check_supported(request, self._mm_refusal)
        follow_hasher(self._core, request)
        self._start_session(request)
        self.requests[request_id] = request
        if self.connector is not None:
            # Before the core takes the prompt: a P/D producer truncates it here (vLLM's
            # NixlConnector drops the tokens its decoder recomputes, max_tokens 1), which
            # vLLM's scheduler reads only once it schedules the request.
            self.connector.on_new_request(request)
        if self._index_hashes:
            # vLLM's hashes of its blocks, for find_longest_cache_hit_per_group (a view).
            self._block_hash_index.index(request)
        if request.use_structured_output:
            self._structured_ids.add(request_id)
        try:
            self._add_to_core(request)
        except Exception:
            # Refused by the core (e.g. computed tokens not below the prompt): not kept.
            del self.requests[request_id]
            self._structured_ids.discard(request_id)
            raise
        # A grammar compiling, or a wait set by hand: vLLM queues it where it arrives and
        # skips it at each step until it is ready (_vllm_adopt).
        self._wait_if_blocked(request)
        if self.spec_decode_metrics_level != "none":
            request.spec_decode_metrics = RequestSpecDecodeMetrics.new(self.num_spec_tokens)
        if self.connector is not None:
            transfer = request.kv_transfer_params
            if transfer and transfer.get("do_remote_prefill"):
                # vLLM counts P/D requests on arrival (its add_request).
                self._set_kv_fetch_stage(request, KV_FETCH_WAITING_TO_START)
        if self.log_stats:
            request.record_event(EngineCoreEventType.QUEUED)

    def _add_to_core(self, request: Request, num_computed_tokens: int | None = None) -> None:
        request_id = request.request_id
        params = request.sampling_params
        lora = request.lora_request
        core_id = next(self._next_core_id) if self._int_ids else request_id
        mm_features = request.mm_features or None
        prompt = request.prompt_token_ids
        if request.prompt_embeds is not None:
            # vLLM's own tokens: 0 where embeddings stand (Request.__init__).
            prompt = request._all_token_ids[: request.num_prompt_tokens]
        if self._prefix_caching:
            prompt = keyed_prompt(
                request,
                list(prompt),
                self.hash_block_size,
                lookahead=self.num_hash_lookahead_tokens,
            )
        self._core.add_request(
            core_id,
            prompt,
            request.max_tokens,
            priority=request.priority,
            arrival_time=request.arrival_time,
            # A pooling request (no sampling params) stops at its pooler output.
            eos_token_id=params.eos_token_id if params is not None else None,
            stop_token_ids=(params.stop_token_ids or None) if params is not None else None,
            lora_id=lora.lora_int_id if lora is not None and lora.lora_int_id > 0 else None,
            mm_features=mm_features,
            # A P/D decode side's request arrives with its prompt computed (vLLM's).
            num_computed_tokens=(
                request.num_computed_tokens if num_computed_tokens is None else num_computed_tokens
            ),
            resumable=bool(request.resumable),
            **stop_rules(params),
        )
        self._core_ids[request_id] = core_id
        self._vllm_ids[core_id] = request_id

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
        bridge = self._bridge
        if bridge is not None:
            # Before a deferred load is let go below: it is the core's, not by hand.
            self._keep_hand_set_loads(ids)
        if bridge is not None and self._core.defer_async_loads:
            # A deferred load never started: nothing will report it, so its request is
            # not kept for one (vLLM's finish_requests).
            aborted = set(ids)
            for core_id in self._core.deferred_load_ids():
                if self._vllm_ids[core_id] in aborted:
                    bridge.loading.discard(self._vllm_ids[core_id])
        # vLLM sets the status before _free_request asks the connector, which reads it.
        finished = [self.requests[request_id] for request_id in ids]
        for request in finished:
            request.status = finished_status
        with self._pool_view.asking():
            self._core.abort([self._core_ids[i] for i in ids])
        for request in finished:
            self._free_request(request)
        return finished

    def _free_request(
        self, request: Request
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """vLLM 0.33's ``Scheduler._free_request`` for a request the core finished: returns
        its KV connector's and its encoder-cache connector's transfer params (the EC
        connector's ``request_finished``, asked before the encoder cache is freed)."""
        if self._aux_output_connector is not None:
            self._aux_request_finished(request)
        # Asked by the core as it finished the request; True holds its KV blocks (_vllm_ec).
        ec_held, ec_transfer_params = ec_finished(self, request)
        request_id = request.request_id
        self._set_kv_fetch_stage(request, None)
        self.finished_recving_kv_req_ids.discard(request_id)
        self._structured_ids.discard(request_id)
        self._session_ids.discard(request_id)
        self._parked.pop(request_id, None)
        self._unparked.discard(request_id)
        if self._blocked_ids:
            self._forget_blocked(request_id)
        # Finished before its first output (an abort): its PrefillStats never go out.
        self._prefill_stats_due.discard(request_id)
        self.finished_req_ids.add(request_id)
        if self.finished_req_ids_dict is not None:
            self.finished_req_ids_dict[request.client_index].add(request_id)
        bridge = self._bridge
        # As vLLM's: a request whose blocks a KV send (or an aborted load) holds stays in
        # `requests` until the transfer is reported.
        if not ec_held and (
            bridge is None
            or (
                request_id not in bridge.sending
                and request_id not in bridge.loading
                and request_id not in bridge.unheld
            )
        ):
            self._forget(request_id)
        kv_transfer_params = bridge.transfer_params.pop(request_id, None) if bridge else None
        return kv_transfer_params, ec_transfer_params

    def _build_kv_connector_meta(self, connector: Any, scheduler_output: Any) -> Any:
        """vLLM 0.33's hook for the KV connector's metadata of a step (``schedule()`` calls
        it through ``_vllm_views.connector_meta``; a plugin may replace it). HiSparse's is
        built from the core's tables (``_vllm_hisparse_step``)."""
        if self._hisparse_step is not None:
            return self._hisparse_step.build(scheduler_output)
        return connector.build_connector_meta(scheduler_output)

    def _connector_finished(self, request: Request) -> tuple[bool, dict[str, Any] | None]:
        """vLLM 0.33's ``Scheduler._connector_finished``: the blocks the request's KV groups
        no longer attend to on the processed-token basis are freed, then the connector gets
        its block tables, clipped to the computed tokens' blocks (``computed_block_tables``);
        returns the connector's ``(delay_free, kv_transfer_params)``."""
        if self._bridge is None:
            return False, None
        core_id = self._core_ids[request.request_id]
        if self._kv_groups:
            tables = tuple(g.tolist() for g in self._core.prune_skipped_blocks(core_id))
        else:
            tables = (vllm_block_ids(self._core.block_ids(core_id)),)
        tables = computed_block_tables(tables, self.kv_cache_config, request.num_computed_tokens)
        return self._bridge.finished(request, tables)

    def _request_of(self, core_id: Any) -> Request:
        """The vLLM request of a core id."""
        return self.requests[self._vllm_ids[core_id]]

    def _forget(self, request_id: str) -> None:
        """Drops a request the core no longer holds. One with outputs in flight keeps its
        core id until they land (``_late_core_ids``)."""
        self._keep_for_kv_events(request_id)
        del self.requests[request_id]
        self._pending_encoder_input_ids.pop(request_id, None)
        self._promoted_loads.discard(request_id)
        core_id = self._core_ids.pop(request_id)
        if self.async_scheduling and self._core.num_outputs_in_flight(core_id):
            self._late_core_ids[request_id] = core_id
        else:
            del self._vllm_ids[core_id]

    # --- caches, stats, events --------------------------------------------------------------

    def reset_prefix_cache(
        self, reset_running_requests: bool = False, reset_connector: bool = False
    ) -> bool:
        """Forgets every cached prefix. Only possible when no request holds KV blocks;
        with ``reset_running_requests`` the running requests are preempted first (they
        appear in the next step's ``preempted_req_ids`` and are recomputed); with
        ``reset_connector`` the KV connector's cache too (vLLM's ``reset_connector_cache``;
        False if it refuses)."""
        preempted: list[Request] = []
        if reset_running_requests:
            _, preempted_ids = self._core.reset_prefix_cache(preempt_running=True)
            preempted = self._vllm_requests(preempted_ids)
        now = time.monotonic()
        self._core_preempted.update(r.request_id for r in preempted)
        try:
            for request in preempted:
                # Their steps in flight are dropped (vLLM's drop_stale_output): the
                # request may resume before they land.
                self._preempt_request(request, now, drop_stale_output=True)
                self._dropped_outputs.add(request.request_id)
        finally:
            self._core_preempted.clear()
        if preempted:
            self.prev_step_scheduled_req_ids.clear()
        reset = self.kv_cache_manager.reset_prefix_cache()
        if reset_running_requests and not reset:
            raise RuntimeError(
                "Failed to reset the prefix cache after preempting every running request"
            )
        if reset and self._prefix_cache_stats is not None:
            self._prefix_cache_stats.reset = True
        if reset_connector:  # vLLM 0.33's order: the connector's after the GPU cache
            reset = self.reset_connector_cache() and reset
        if reset and self.aux_output_connector is not None:
            self.aux_output_connector.reset()
        return bool(reset)

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
