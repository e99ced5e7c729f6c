"""Forming one step for ``TokenyardScheduler`` (``tokenyard.integrations.vllm``): the core's
batch decision turned into vLLM's ``SchedulerOutput`` (new and cached requests with vLLM's
block ids, scheduled tokens and drafts), and the vLLM ``Request`` objects brought up to date
as vLLM's ``schedule()`` leaves them (status, ``num_computed_tokens``, preemptions, output
placeholders under async scheduling). Imported only by that module, so vLLM is installed
when this runs."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable
from typing import Any

import numpy as np
from vllm.v1.core.kv_cache_utils import KVCacheBlockCopy
from vllm.v1.core.sched.interface import PauseState
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler as _VllmScheduler
from vllm.v1.engine import EngineCoreEventType
from vllm.v1.metrics.stats import KV_FETCH_IN_PROGRESS
from vllm.v1.request import Request, RequestStatus

from tokenyard.errors import InputError
from tokenyard.integrations._vllm_dynamic_sd import num_spec_tokens_to_schedule
from tokenyard.integrations._vllm_hooks import ReplacedMethods
from tokenyard.integrations._vllm_outputs import errors_in_vllm_ids
from tokenyard.integrations._vllm_state import AdapterBase, Batch
from tokenyard.integrations._vllm_translate import vllm_block_ids
from tokenyard.integrations._vllm_views import connector_meta

_RUNNING = RequestStatus.RUNNING
_PREEMPTED = RequestStatus.PREEMPTED
_WAITING = RequestStatus.WAITING
_WAITING_FOR_REMOTE_KVS = RequestStatus.WAITING_FOR_REMOTE_KVS


class ScheduleStep(ReplacedMethods, AdapterBase):
    """``schedule()`` and what it does to the vLLM requests."""

    # The step's encoder-input stats (with iteration logging): vLLM 0.33's own, which reads
    # `requests` (each request's mm_features) only.
    _make_scheduled_encoder_input_stats = _VllmScheduler._make_scheduled_encoder_input_stats

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        """Forms the next batch (``throttle_prefills``: vLLM's DP prefill balancing)."""
        self.current_step += 1
        requests = self.requests
        vllm_ids = self._vllm_ids
        if self._pause_state == PauseState.PAUSED_ALL:
            out = SchedulerOutput.make_empty()
            # vLLM 0.33's paused step schedules nothing but still drains the copies.
            self.kv_cache_manager.coordinator.queue_pending_copies()
            if copies := self._core.take_pending_block_copies():
                out.kv_cache_block_copies = self._block_copies(copies)
            out.finished_req_ids = self.finished_req_ids
            out.preempted_req_ids = self.reset_preempted_req_ids
            self.finished_req_ids = set()
            self.reset_preempted_req_ids = set()
            return out
        self._route_replaced_methods()
        if self.finished_recving_kv_req_ids:
            self._take_recorded_landings()
        self.kv_cache_manager.coordinator.queue_pending_copies()
        offers = self.kv_cache_manager._boundary_offers
        if offers.groups and self.connector is not None:
            # The hand-offs' order: vLLM's waiting pass caches a landed load as it reaches it.
            offers.waiting_order = [
                r.request_id for queue in (self.kv_holding_waiting, self.waiting) for r in queue
            ]
        if self.finished_recving_kv_req_ids and self._pool_view.kept_by_connector:
            self._expect_landings()
        with self._pool_view.asking():
            core = self._core.schedule(throttle_prefills=throttle_prefills)
        bridge = self._bridge
        if bridge is not None:
            for load in core.kv_loads:
                request_id = vllm_ids[load.request_id]
                requests[request_id].status = _WAITING_FOR_REMOTE_KVS
                self._set_kv_fetch_stage(requests[request_id], KV_FETCH_IN_PROGRESS)
                bridge.loading.add(request_id)
                # A failed load's report was taken by the core, which loads anew.
                self.finished_recving_kv_req_ids.discard(request_id)
        now = time.monotonic()
        self._apply_preemptions(core.preempted_req_ids, now)
        new_reqs_data, resumed = self._new_and_resumed(core, now)
        if self.finished_recving_kv_req_ids:
            self._promote_landed_loads()
        batch: Batch | None = None
        if self._int_ids:
            ids, counts = core.num_scheduled_tokens_arrays()
            batch = self._batch(ids)
            if counts.min(initial=1) == 1 == counts.max(initial=1):
                # A decode step: one token each (no tuple per request).
                num_scheduled_tokens = dict.fromkeys(batch.vllm_ids, 1)
            else:
                num_scheduled_tokens = dict(zip(batch.vllm_ids, counts.tolist(), strict=True))
        else:
            num_scheduled_tokens = {vllm_ids[i]: n for i, n in core.num_scheduled_tokens.items()}
        if self._adopted:
            self._scheduled_by_core(num_scheduled_tokens)
        self._kv_fetch_scheduled(num_scheduled_tokens)
        cached_data, num_counts_due = self._cached_request_data(
            core, resumed, num_scheduled_tokens, batch
        )
        spec_decode_tokens = {}
        if scheduled_drafts := core.scheduled_spec_decode_tokens:
            admitted = {d.req_id for d in new_reqs_data}
            admitted.update(r.request_id for r, _ in resumed)
            spec_decode_tokens = self._spec_decode_tokens(scheduled_drafts, admitted)
        encoder_inputs = core.scheduled_encoder_inputs
        out = SchedulerOutput(
            scheduled_new_reqs=new_reqs_data,
            scheduled_cached_reqs=cached_data,
            num_scheduled_tokens=num_scheduled_tokens,
            total_num_scheduled_tokens=core.total_num_scheduled_tokens,
            scheduled_spec_decode_tokens=spec_decode_tokens,
            scheduled_encoder_inputs=(
                {vllm_ids[i]: list(items) for i, items in encoder_inputs.items()}
                if encoder_inputs
                else {}
            ),
            preempted_req_ids=self.reset_preempted_req_ids,
            finished_req_ids=self.finished_req_ids,
            free_encoder_mm_hashes=list(core.free_encoder_mm_hashes),
            num_spec_tokens_to_schedule=num_spec_tokens_to_schedule(
                self.dynamic_sd_lookup, self.num_spec_tokens, len(num_scheduled_tokens)
            ),
        )
        if copies := core.kv_cache_block_copies:
            out.kv_cache_block_copies = self._block_copies(copies)
        if self.needs_kv_cache_zeroing and self._kv_groups:
            # vLLM 0.33's _get_new_block_ids_to_zero: the blocks handed out this step.
            out.new_block_ids_to_zero = self._core.take_new_block_ids().tolist() or None
        if self.log_stats and self.observability_config.enable_logging_iteration_details:
            out.scheduled_encoder_input_stats = self._make_scheduled_encoder_input_stats(
                out.scheduled_encoder_inputs
            )
        if not self.use_v2_model_runner:
            if batch is not None and not self._adopted:
                # The step's ids are the batch's: made a set where read (the property).
                self._prev_step_ids = batch
            else:
                self.prev_step_scheduled_req_ids = set(num_scheduled_tokens)
        elif (
            self._pending_encoder_input_ids
            or out.scheduled_encoder_inputs
            or any(r.mm_features for r in new_reqs_data)
        ):
            # The V2 runner's multimodal data, sent with an item's first encoding and
            # released once the request's computed tokens pass it: vLLM 0.33's own
            # Scheduler._get_encoder_input_updates (it reads requests,
            # _pending_encoder_input_ids, use_v2_model_runner and is_encoder_decoder).
            # A new request's items are pending from its installation even when none is
            # encoded that step (all found in the encoder cache).
            out.encoder_input_updates = _VllmScheduler._get_encoder_input_updates(
                self, num_scheduled_tokens, new_reqs_data, out.scheduled_encoder_inputs
            )
        if self.can_skip_drafts:
            out.skip_drafts = not self._drafts_needed(num_scheduled_tokens)
        if bridge is not None:
            out.has_sync_kv_loads = bridge.has_sync_kv_loads
            bridge.has_sync_kv_loads = False
        # As vLLM 0.33's schedule(): the connectors see the requests before this step's
        # update (computed tokens, output placeholders) is applied to them.
        if self.connector is not None:
            out.kv_connector_metadata = connector_meta(self, out)
        if self.aux_output_connector is not None:
            out.aux_output_connector_metadata = self.aux_output_connector.build_connector_meta(
                out, self.requests
            )
        if self.ec_connector is not None:
            out.ec_connector_metadata = self.ec_connector.build_connector_meta(out)
        if self.defer_block_free and out.total_num_scheduled_tokens > 0:
            # The core numbered this step (vLLM's last_sched_seq, mirrored on the requests).
            seq = self._core.sched_step_seq
            for request_id in num_scheduled_tokens:
                self.requests[request_id].last_sched_seq = seq
        if batch is not None:
            self._batches = ((out, batch), *self._batches[:3])
            if self.connector is not None or self.ec_connector is not None:
                batch = None  # the connectors saw the output; it is read afresh below
        self._after_schedule(out, spec_decode_tokens, batch, num_counts_due)
        self.finished_req_ids = set()
        self.reset_preempted_req_ids = set()
        return out

    @property
    def prev_step_scheduled_req_ids(self) -> set[str]:
        """vLLM's: the requests the previous step scheduled (V1 runner). Kept as that
        step's ``Batch`` (read-only ids) until read, then as the set made of them, which a
        caller may change in place as vLLM's own methods do."""
        prev = self._prev_step_ids
        if isinstance(prev, Batch):
            prev = self._prev_step_ids = set(prev.vllm_ids)
        return prev

    @prev_step_scheduled_req_ids.setter
    def prev_step_scheduled_req_ids(self, value: set[str]) -> None:
        self._prev_step_ids = value

    def _batch(self, ids: Any) -> Batch:
        """The step's ``Batch`` for the core's scheduled ids: the previous step's when they
        are the same ids in the same order (the usual decode step), else a new one."""
        if self._batches:
            last = self._batches[0][1]
            if np.array_equal(ids, last.ids):
                return last
        core_ids = ids.tolist()
        vllm_ids = list(map(self._vllm_ids.__getitem__, core_ids))
        return Batch(ids, core_ids, vllm_ids, list(map(self.requests.__getitem__, vllm_ids)))

    def _apply_preemptions(self, preempted_ids: list[Any], now: float) -> None:
        """The core's preemptions on the vLLM requests, each through ``_preempt_request``
        (looked up on the scheduler, so a wrapped one sees every preemption, as vLLM's
        ``schedule()`` calls its own)."""
        if not preempted_ids:
            return
        preempted = self._vllm_requests(preempted_ids)
        self._core_preempted.update(r.request_id for r in preempted)
        # A landed load let go (the core's release_landed_loads) holds no blocks any more.
        self._promoted_loads.difference_update(self._core_preempted)
        try:
            for request in preempted:
                # A KV producer's in-flight output is dropped (vLLM 0.33's
                # drop_stale_output=self.requires_kv_delivery).
                self._preempt_request(request, now, drop_stale_output=self.requires_kv_delivery)
        finally:
            self._core_preempted.clear()

    def _preempt_request(
        self, request: Request, timestamp: float, drop_stale_output: bool = False
    ) -> None:
        """vLLM 0.33's ``_preempt_request`` on the vLLM side of a preemption: status,
        computed tokens, drafts, placeholders, the in-flight tokens that become stale
        (``num_stale_output_tokens``), the preemption count and event. For a preemption the
        core made (in a step, or ``reset_prefix_cache``) it only mirrors it; called from
        outside on a running request (as vLLM's tests do), it has the core preempt it first
        (``Scheduler.preempt_request``: blocks freed, back at the head of the waiting queue,
        its steps in flight still delivering).

        Raises:
            InputError: the request is not running (vLLM asserts it).
        """
        request_id = request.request_id
        if request_id not in self._core_preempted:
            if request.status != _RUNNING or request_id not in self._core_ids:
                raise InputError(
                    f"request_id: {request_id!r} is not running (status {request.status!s}); "
                    "only a running request can be preempted",
                    field="request_id",
                    value=request_id,
                )
            with errors_in_vllm_ids(self._vllm_ids):
                self._core.preempt_request(self._core_ids[request_id])
        if self.aux_output_connector is not None:
            self._aux_request_finished(request)
        self._pending_encoder_input_ids.pop(request_id, None)
        request.status = _PREEMPTED
        request.num_computed_tokens = 0
        if request.spec_token_ids:
            request.spec_token_ids = []
        request.drop_stale_output = drop_stale_output or (
            request.drop_stale_output and request.num_stale_output_tokens > 0
        )
        request.num_stale_output_tokens = request.num_in_flight_tokens
        if request.num_stale_output_tokens > 0:
            self._stale_ids.add(request_id)
        request.num_output_placeholders = 0
        request.num_preemptions += 1
        if self.log_stats:
            request.record_event(EngineCoreEventType.PREEMPTED, timestamp)
        self.reset_preempted_req_ids.add(request_id)

    def _block_copies(self, copies: list[tuple[int, int]]) -> list[KVCacheBlockCopy]:
        """The core's copies as vLLM 0.33's ``take_kv_cache_block_copies`` gives them (the
        single pool's ids renumbered)."""
        shift = 0 if self._kv_groups else 1
        return [KVCacheBlockCopy(s + shift, d + shift) for s, d in copies]

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
        # vLLM lists the admitted PREEMPTED requests after the WAITING ones, in admission
        # order; the core lists a preempted request whose load landed among its new ones.
        resumed_data: list[tuple[Any, Any]] = []
        loaded_resumed = False
        for data in itertools.chain(core.scheduled_new_reqs, core.scheduled_resumed_reqs):
            request_id = vllm_ids[data.req_id]
            request = requests[request_id]
            # A preempted request whose KV a connector loaded resumes too (vLLM promotes it
            # to PREEMPTED when its load lands).
            was_preempted = request.status == _PREEMPTED or (
                request.status == _WAITING_FOR_REMOTE_KVS and request.num_preemptions > 0
            )
            loaded_resumed |= request.status == _WAITING_FOR_REMOTE_KVS and was_preempted
            if was_preempted:
                self._dropped_outputs.discard(request_id)
            if bridge is not None:
                if request.status == _WAITING_FOR_REMOTE_KVS:
                    self._cache_landed_load(request)
                self.finished_recving_kv_req_ids.discard(request_id)
                self._promoted_loads.discard(request_id)
            request.status = _RUNNING
            # vLLM 0.33 looks a waiting request up (and counts the lookup at admission,
            # `did_prefix_cache_lookup`) only when none of its tokens are computed: not a
            # resumed session, nor an arrival with computed tokens.
            looked_up = request.num_computed_tokens == 0
            request.num_computed_tokens = data.num_computed_tokens
            # SWA bounded replay: the hit's last window is recomputed this step; the hit
            # (what the cache served) is the computed tokens plus the replayed ones.
            replay_start = data.replay_start
            request.replay_start = replay_start
            hit = data.num_computed_tokens + (self.prefix_replay_tokens if replay_start else 0)
            external = bridge.external_hits.pop(request_id, 0) if bridge is not None else 0
            if log_stats:
                request.record_event(EngineCoreEventType.SCHEDULED, now)
                if bridge is not None and request_id in bridge.lookups_recorded:
                    bridge.lookups_recorded.discard(request_id)
                elif looked_up:
                    self._record_prefix_lookup(request, hit - external)
            if not was_preempted and request.num_preemptions <= 0:
                self._set_prefill_stats(request, hit, external)
            block_ids = (
                tuple(g.tolist() for g in data.group_block_ids)
                if self._kv_groups
                else (vllm_block_ids(data.block_ids),)
            )
            if was_preempted and not v2:
                resumed_data.append((data.req_id, (request, block_ids)))
                continue
            item = NewRequestData.from_request(
                request, block_ids, request._all_token_ids if v2 else None
            )
            if was_preempted:
                resumed_data.append((data.req_id, item))
            else:
                new_reqs_data.append(item)
        if not resumed_data:
            return new_reqs_data, resumed
        if loaded_resumed:
            # The step's admissions are in admission order in its scheduled tokens.
            order = {core_id: i for i, core_id in enumerate(core.num_scheduled_tokens)}
            resumed_data.sort(key=lambda entry: order[entry[0]])
        if v2:
            new_reqs_data += [item for _, item in resumed_data]
        else:
            resumed = [item for _, item in resumed_data]
        return new_reqs_data, resumed

    def _expect_landings(self) -> None:
        """The landed loads this step's waiting pass caches as it reaches them, for a
        connector that reads the pool meanwhile (``BlockPoolView.expect_landings``).

        A failed load is left out, though vLLM 0.33's ``_update_waiting_for_remote_kv``
        caches the valid prefix of one cut back by ``invalid_block_ids`` (computed tokens
        above 0; a load failed whole keeps none). No layout tells: vLLM takes
        ``invalid_block_ids`` beside one KV cache group alone; over one full-attention
        group UMBP's lookup reads the local hit vLLM hands it and probes the pool for
        nothing; over one group of another kind (a sliding window, chunked local
        attention, where UMBP's own coordinator probes it) the core marks no async load
        failed for its invalid blocks in the first place (a gap of its own, pinned by
        ``test_partial_load_failures_beside_a_lone_window_group``). Once the core marks
        those, such loads belong here (``cached_by_update`` caps a request at its
        computed tokens)."""
        failed = self.failed_recving_kv_req_ids
        landed = [
            request
            for request_id in self.finished_recving_kv_req_ids
            if request_id not in failed and request_id not in self._blocked_ids
            if (request := self.requests.get(request_id)) is not None
            and request.status == _WAITING_FOR_REMOTE_KVS
        ]
        order = [r.request_id for queue in (self.kv_holding_waiting, self.waiting) for r in queue]
        self._pool_view.expect_landings(order, landed)

    def _promote_landed_loads(self) -> None:
        """vLLM 0.33's ``_update_waiting_for_remote_kv`` for the landed loads an admission
        pass took this step without scheduling them (memory or the budget stopped it): the
        request waits as WAITING (PREEMPTED after a preemption), its computed tokens those
        the load left (less a bounded-replay window)."""
        core = self._core
        for request_id in list(self.finished_recving_kv_req_ids):
            request = self.requests.get(request_id)
            if request is None or request.status != _WAITING_FOR_REMOTE_KVS:
                continue
            if request_id in self._blocked_ids:
                # A remote-KV wait outside the core: promoted when admission reaches it.
                continue
            core_id = self._core_ids[request_id]
            if core.waiting_for_remote_kvs(core_id):
                continue
            self._cache_landed_load(request)
            self.finished_recving_kv_req_ids.discard(request_id)
            self._promoted_loads.add(request_id)
            request.status = _PREEMPTED if request.num_preemptions else _WAITING
            request.num_computed_tokens = core.num_computed_tokens(core_id)

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
        self, core: Any, batch: Batch | None
    ) -> tuple[list[str], list[int], list[Any], list[Request] | None]:
        """The core's running requests this step: their vLLM ids, computed tokens, new
        block ids (``None`` where none), and the vLLM requests where ``batch`` had them at
        hand (else ``None``). ``batch``: the step's scheduled requests (int ids only), which
        the running requests usually begin with."""
        vllm_ids = self._vllm_ids
        if self._kv_groups:
            # Several KV groups: each group's new blocks, already in vLLM's numbering (the
            # coordinator's block 0 is vLLM's null block); None where no group got one.
            cached = core.scheduled_cached_reqs
            return (
                [vllm_ids[i] for i in cached.req_ids],
                cached.num_computed_tokens.tolist(),
                [
                    tuple(g.tolist() for g in groups) if any(len(g) for g in groups) else None
                    for groups in cached.new_group_block_ids
                ],
                None,
            )
        if not self._int_ids:
            cached = core.scheduled_cached_reqs
            return (
                [vllm_ids[i] for i in cached.req_ids],
                cached.num_computed_tokens.tolist(),
                [(vllm_block_ids(b),) if len(b) else None for b in cached.new_block_ids],
                None,
            )
        ids, computed, num_new, blocks = core.scheduled_cached_reqs_arrays()
        num = len(ids)
        cached_requests = None
        if batch is not None and np.array_equal(ids, batch.ids[:num]):
            cached_ids = batch.vllm_ids[:num]
            cached_requests = batch.requests[:num]
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
        return cached_ids, computed.tolist(), new_block_ids, cached_requests

    def _cached_request_data(
        self,
        core: Any,
        resumed: list[tuple[Request, tuple[list[int], ...]]],
        num_scheduled_tokens: dict[str, int],
        batch: Batch | None,
    ) -> tuple[CachedRequestData, int]:
        """``CachedRequestData`` for the requests that ran before, and (V1 runner) the
        resumed ones with their whole token lists; with the number of leading
        ``num_output_tokens`` entries left for ``_after_schedule`` to read (0: none), the
        batch's first requests, where its pass over them reads them unchanged (sync, no
        structured output, no connector reading the output before it)."""
        requests = self.requests
        v2 = self.use_v2_model_runner
        cached_ids, num_computed, new_block_ids, cached = self._cached_blocks(core, batch)
        num_counts_due = 0
        if cached is not None and self._counts_read_after():
            # One pass over the batch's requests instead of two (their counts are read
            # before _after_schedule changes anything of them).
            num_counts_due = len(cached)
            num_output = [0] * num_counts_due
        else:
            num_output = [
                len(r._output_token_ids) + r.num_output_placeholders
                for r in (cached if cached is not None else map(requests.__getitem__, cached_ids))
            ]
        all_token_ids: dict[str, list[int]] = {}
        resumed_ids: set[str] = set()
        # Ran in the previous step too, the usual decode step: the batch's leading
        # requests, as that step scheduled this same batch (prev_step_scheduled_req_ids).
        all_ran_before = cached is not None and self._prev_step_ids is batch
        if not v2 and not all_ran_before:
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
        data = CachedRequestData(
            req_ids=cached_ids,
            resumed_req_ids=resumed_ids,
            new_token_ids=new_token_ids,
            all_token_ids=all_token_ids,
            new_block_ids=new_block_ids,
            num_computed_tokens=num_computed,
            num_output_tokens=num_output,
        )
        return data, num_counts_due

    def _counts_read_after(self) -> bool:
        """Whether ``_after_schedule`` may read the cached requests' output counts: its
        plain pass (sync, no structured output) runs, and nothing reads the step's output
        before it (the KV, auxiliary-output and EC connectors do)."""
        return (
            not self.async_scheduling
            and not self._structured_ids
            and self.connector is None
            and self.aux_output_connector is None
            and self.ec_connector is None
        )

    def _make_cached_request_data(
        self,
        running_reqs: list[Request],
        resumed_reqs: list[Request],
        num_scheduled_tokens: dict[str, int],
        spec_decode_tokens: dict[str, list[int]],
        req_to_new_blocks: dict[str, Any],
    ) -> CachedRequestData:
        """vLLM 0.33's own ``Scheduler._make_cached_request_data``, run on this scheduler's
        state (``use_pp``, ``use_v2_model_runner``, ``prev_step_scheduled_req_ids``) for
        callers that form one from vLLM requests and ``KVCacheBlocks``. ``schedule()``
        forms the same data from the core's arrays (``_cached_request_data``)."""
        data: CachedRequestData = _VllmScheduler._make_cached_request_data(
            self,
            running_reqs,
            resumed_reqs,
            num_scheduled_tokens,
            spec_decode_tokens,
            req_to_new_blocks,
        )
        return data

    def _spec_decode_tokens(
        self, scheduled: dict[Any, Any], admitted: set[str]
    ) -> dict[str, list[int]]:
        """The drafts verified this step: the request's own (vLLM's ids, -1 placeholders
        included), as many as the core scheduled. A padded admission (rule 2 in
        docs/embedding.md; ``admitted``: the requests admitted this step) verifies vLLM's
        -1 placeholders, never drafts of its own (a parked session gets drafts from
        ``update_draft_token_ids`` as vLLM's does, whose waiting path ignores them)."""
        requests = self.requests
        vllm_ids = self._vllm_ids
        spec_decode_tokens: dict[str, list[int]] = {}
        for core_id, drafts in scheduled.items():
            request_id = vllm_ids[core_id]
            num_drafts = len(drafts)
            if request_id in admitted:
                spec_decode_tokens[request_id] = [-1] * num_drafts
                continue
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

    def _drafts_needed(self, num_scheduled_tokens: dict[str, int]) -> bool:
        """vLLM 0.33's ``drafts_needed`` (only asked where drafts may be skipped): some
        scheduled request may use drafts proposed after this step."""
        requests = self.requests
        return not all(
            self._drafts_unused(requests[request_id], requests[request_id].num_computed_tokens, n)
            for request_id, n in num_scheduled_tokens.items()
        )

    def _after_schedule(
        self,
        out: SchedulerOutput,
        spec_decode_tokens: dict[str, list[int]],
        batch: Batch | None = None,
        num_counts_due: int = 0,
    ) -> None:
        """vLLM's ``_update_after_schedule`` on the vLLM requests: the step is assumed to
        run; under async scheduling each sampling request gets its output placeholders and
        placeholder drafts for the next step. ``batch``: the requests of
        ``out.num_scheduled_tokens``, in its order, where at hand. ``num_counts_due``: the
        leading ``num_output_tokens`` entries of ``out.scheduled_cached_reqs`` still to read
        off the batch's first requests (``_cached_request_data``; the plain pass only)."""
        num_scheduled_tokens = out.num_scheduled_tokens
        scheduled = zip(
            batch.requests
            if batch is not None
            else map(self.requests.__getitem__, num_scheduled_tokens),
            num_scheduled_tokens.values(),
            strict=True,
        )
        structured = bool(self._structured_ids)
        if not self.async_scheduling and not structured:
            # The common case, without the branches below.
            if num_counts_due:
                _update_counting_outputs(
                    scheduled, out.scheduled_cached_reqs.num_output_tokens, num_counts_due
                )
                return
            for request, n in scheduled:
                num_computed = request.num_computed_tokens + n
                request.num_computed_tokens = num_computed
                request.num_in_flight_tokens += n
                request.is_prefill_chunk = num_computed < (
                    len(request._all_token_ids) + request.num_output_placeholders
                )
                if request.spec_token_ids:
                    request.spec_token_ids = []
            return
        if self.dynamic_sd_lookup is not None and self.async_scheduling:
            # vLLM 0.33's AsyncScheduler: the step's k drafts as the next placeholders.
            self._spec_token_placeholders = [-1] * out.num_spec_tokens_to_schedule
        placeholders = self._spec_token_placeholders if self.async_scheduling else None
        drafts_for_core: dict[Any, list[int]] = {}
        core_ids = self._core_ids
        has_structured = False
        for request, n in scheduled:
            num_computed = request.num_computed_tokens + n
            request.num_computed_tokens = num_computed
            request.num_in_flight_tokens += n
            prefill_chunk = num_computed < (
                len(request._all_token_ids) + request.num_output_placeholders
            )
            request.is_prefill_chunk = prefill_chunk
            if structured and not prefill_chunk and request.use_structured_output:
                has_structured = True
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
                self._core.update_draft_token_ids(drafts_for_core)
        out.has_structured_output_requests = has_structured


def _update_counting_outputs(
    scheduled: Iterable[tuple[Request, int]], num_output: list[int], num_due: int
) -> None:
    """``_after_schedule``'s plain pass (sync, no structured output) over the scheduled
    requests and their token counts, reading on the way each one's output count as vLLM's
    ``_make_cached_request_data`` does (``num_output_tokens + num_output_placeholders``,
    before the update) into the first ``num_due`` entries of ``num_output``: the batch's
    first ``num_due`` requests are the cached ones."""
    counts = []
    for request, n in scheduled:
        placeholders = request.num_output_placeholders
        counts.append(len(request._output_token_ids) + placeholders)
        num_computed = request.num_computed_tokens + n
        request.num_computed_tokens = num_computed
        request.num_in_flight_tokens += n
        request.is_prefill_chunk = num_computed < len(request._all_token_ids) + placeholders
        if request.spec_token_ids:
            request.spec_token_ids = []
    num_output[:num_due] = counts[:num_due]
