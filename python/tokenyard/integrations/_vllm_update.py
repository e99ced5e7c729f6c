"""Applying one step's results for ``TokenyardScheduler`` (``tokenyard.integrations.vllm``):
vLLM's ``update_from_output`` (sampled tokens appended up to a stop, rejected drafts rolled
back, finished requests freed, ``EngineCoreOutputs`` by client with the step's stats), the KV
connector's finished transfers, and the drafts proposed for the next step. Imported only by
that module, so vLLM is installed when this runs. The KV connector's transfer reports are
``_vllm_kv_transfers``'s."""

from __future__ import annotations

import itertools
import operator
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
from vllm.v1.core.sched.utils import check_stop
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
from vllm.v1.metrics.stats import SchedulerStats
from vllm.v1.request import Request, RequestStatus
from vllm.v1.spec_decode.metrics import SpecDecodingStats
from vllm.v1.structured_output.utils import strip_speculative_padding

from tokenyard.integrations._vllm_aux_outputs import take_aux_outputs
from tokenyard.integrations._vllm_ec import (
    begin_ec_update,
    ec_sends_done,
    encoder_instance_stops,
    end_ec_update,
    finish_unavailable,
    report_ec_frees,
)
from tokenyard.integrations._vllm_kv_transfers import KvTransfers
from tokenyard.integrations._vllm_outputs import (
    attach_logprobs,
    attach_prefill_stats,
    attach_sampling_masks,
    errors_in_vllm_ids,
)
from tokenyard.integrations._vllm_state import Batch

_RUNNING = RequestStatus.RUNNING
_PREEMPTED = RequestStatus.PREEMPTED
_client_index = operator.attrgetter("client_index")


def _land_live_batch(batch: Batch, counts: dict[str, int]) -> bool:
    """The usual step's in-flight accounting, in one pass over the batch (its requests in
    the order of ``counts``, the step's ``num_scheduled_tokens``): each request takes its
    scheduled tokens off ``num_in_flight_tokens``. Returns whether every request is still
    live (none finished meanwhile: statuses after PREEMPTED are finished); if one is not,
    nothing is changed (the tokens are given back) and the caller lands the step request by
    request."""
    requests = batch.requests
    dead = False
    for request, n in zip(requests, counts.values(), strict=True):
        request.num_in_flight_tokens -= n
        if request.status > _PREEMPTED:
            dead = True
    if not dead:
        return True
    for request, n in zip(requests, counts.values(), strict=True):
        request.num_in_flight_tokens += n
    return False


class UpdateFromOutput(KvTransfers):
    """``update_from_output`` and the drafts' updates."""

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: Any
    ) -> dict[int, EngineCoreOutputs]:
        """Applies a step's sampled tokens: appends them to the requests, stops requests
        (EOS, stop ids, ``max_tokens``, ``max_model_len``), rolls back rejected drafts, and
        returns the outputs by client, with the step's stats."""
        try:
            return self._update_from_output(scheduler_output, model_runner_output)
        finally:
            if self._ec_frees is not None:
                # An update that raised: the EC connector still hears of the items the
                # core let go, and the update's lists are closed (_vllm_ec.end_ec_update).
                end_ec_update(self)
            if self._bridge is not None and self._bridge.tokens_in_update:
                # Nor does a later finish (an abort) append this update's tokens.
                self._bridge.tokens_in_update = {}

    def _update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: Any
    ) -> dict[int, EngineCoreOutputs]:
        if self.defer_block_free and scheduler_output.total_num_scheduled_tokens > 0:
            # Every write of this and earlier steps has completed (vLLM's fence).
            self._core.step_processed()
        kv_output = model_runner_output.kv_connector_output
        skip: set[str] | None = None
        if (
            kv_output is not None
            and self._bridge is not None
            and (kv_output.failed_recving or kv_output.invalid_block_ids)
        ):
            # vLLM 0.33 takes failed loads before the step's outputs (_vllm_kv_transfers).
            skip = self._handle_kv_load_failures(
                kv_output.failed_recving,
                kv_output.invalid_block_ids,
                scheduler_output.num_scheduled_tokens,
            )
        # vLLM takes the workers' report after the step's outputs, its finished requests
        # freed first; beside a connector keeping vLLM's pool (whose frees then order the
        # free queue) it is taken there, below.
        report_late = self._pool_view.kept_by_connector or self._hisparse_step is not None
        released = None
        if (
            kv_output is not None
            and (self.connector is not None or self._blocked_ids)
            and not report_late
        ):
            # vLLM's _update_from_kv_xfer_finished runs whatever the connector: a remote-KV
            # wait set by hand lands on the report alone.
            released = self._update_from_kv_transfers(kv_output)
        batch = self._batch_of(scheduler_output)
        counts = scheduler_output.num_scheduled_tokens
        # Whether every request of the batch is still live (none finished meanwhile); if
        # so, its in-flight tokens landed in the same pass.
        batch_live = batch is not None and _land_live_batch(batch, counts)
        stale = self._land_in_flight(scheduler_output, landed=batch_live)
        live_ids, live, live_tokens, rejected, spec_stats, late = self._sampled(
            scheduler_output, model_runner_output, batch, stale, batch_live, skip
        )
        pooled = self._pooled(scheduler_output, model_runner_output)
        if batch is not None and live_ids is batch.vllm_ids:
            live_core_ids = batch.core_ids
        else:
            live_core_ids = list(map(self._core_ids.__getitem__, live_ids))
        core_ids, core_tokens = live_core_ids, live_tokens
        if late:
            # Outputs of finished requests go to the core too: it expects them (and drops
            # them), as vLLM's update skips a request it no longer holds.
            core_ids = live_core_ids + [core_id for core_id, _ in late]
            core_tokens = live_tokens + [tokens for _, tokens in late]
        if pooled:
            # The core finishes a pooling request (max_tokens 1) on one token.
            core_ids = core_ids + [self._core_ids[r.request_id] for r, _ in pooled]
            core_tokens = core_tokens + [[0]] * len(pooled)
        vllm_ids = self._vllm_ids
        kept_drafts: dict[Any, list[int]] = {}
        if self.async_scheduling and self.num_spec_tokens:
            # The placeholder drafts of the step scheduled since (vLLM keeps them on the
            # request through this update): the core replaces a request's drafts with those
            # given in the update, so they are given again.
            for core_id, request in zip(live_core_ids, live, strict=True):
                if request.spec_token_ids and request.status == _RUNNING:
                    kept_drafts[core_id] = [0] * len(request.spec_token_ids)
        bridge = self._bridge
        if bridge is not None:
            # The connector is asked while the core finishes a request, before the tokens
            # are appended here: it appends them then (_ConnectorBridge.request_finished).
            bridge.tokens_in_update = dict(zip(live_ids, live_tokens, strict=True))
        outside = self._outside_step(scheduler_output) if self._adopted else None
        # The items the core's update lets go are told to the EC connector in vLLM's order,
        # interleaved with the finishes (_vllm_ec.report_ec_frees).
        if self.ec_connector is not None:
            begin_ec_update(self, scheduler_output.num_scheduled_tokens, live_ids, live_tokens)
        # Requests failed loads finish in the core's update below, which asks their
        # connector: vLLM sets FINISHED_ERROR before (finish_requests of error_req_ids).
        marked = self._mark_load_errors() if self._load_errors else []
        with self._pool_view.asking():
            if outside is not None:
                # A step the core did not form, over requests placed by hand (_vllm_adopt).
                with errors_in_vllm_ids(vllm_ids):
                    finished = self._core.update_from_outside_step(
                        outside,
                        dict(zip(core_ids, core_tokens, strict=True)),
                        num_rejected_tokens=rejected or None,
                        spec_token_ids=kept_drafts or None,
                    )
            elif self._int_ids and not rejected and not kept_drafts:
                # The bulk path: one list of ids, one of counts, one of all the tokens.
                flat_tokens = list(itertools.chain.from_iterable(core_tokens))
                # Every list holds a token (_sampled keeps none empty): as many tokens as
                # requests is one each, the core's default, without a list of counts.
                num_sampled = (
                    None if len(flat_tokens) == len(core_ids) else list(map(len, core_tokens))
                )
                with errors_in_vllm_ids(vllm_ids):
                    finished = self._core.update_from_output_arrays(
                        core_ids, flat_tokens, num_sampled
                    )
            else:
                with errors_in_vllm_ids(vllm_ids):
                    finished = self._core.update_from_output(
                        dict(zip(core_ids, core_tokens, strict=True)),
                        num_rejected_tokens=rejected or None,
                        spec_token_ids=kept_drafts or None,
                    )
        if bridge is not None:
            bridge.tokens_in_update = {}
        if late:
            self._forget_landed(late)
        if pooled:
            self._finish_pooled(pooled)
        finished_ids = {vllm_ids[i] for i, _ in finished} if finished else set()
        # The core finished them after the step's outputs (vLLM's error_req_ids).
        errored = self._finish_load_errors(marked) if marked else []
        nans = model_runner_output.num_nans_in_logits
        if nans:
            for request_id, request in zip(live_ids, live, strict=True):
                if request_id in nans:
                    request.num_nans_in_logits = nans[request_id]
        if self._prefill_stats_due:
            self._finish_prefill_stats(live, live_ids)
        outputs = self._outputs_by_client(
            live,
            live_ids,
            live_tokens,
            finished_ids,
            batch if batch is not None and live is batch.requests else None,
        )
        if self._ec_frees is not None:
            end_ec_update(self)
        if self._prefill_stats_ready:
            attach_prefill_stats(outputs, self._prefill_stats_ready)
            self._prefill_stats_ready.clear()
        attach_logprobs(outputs, live, model_runner_output, self._turn_sampling_params)
        if self.return_sampling_mask:
            attach_sampling_masks(outputs, model_runner_output)
        for request, pooler_output in pooled:
            outputs.setdefault(request.client_index, []).append(
                self._pooled_output(request, pooler_output)
            )
        if self.is_mm_encoder_only:
            emitted = set(live_ids).union(r.request_id for r, _ in pooled)
            counts = scheduler_output.num_scheduled_tokens
            for request in encoder_instance_stops(self, counts, emitted):
                # vLLM emits the stop with no tokens (the instance publishes embeddings).
                outputs.setdefault(request.client_index, []).append(
                    self._finished_output(request, [])
                )
        if self.aux_output_connector is not None and (live or pooled):
            emitting = dict(zip(live_ids, live, strict=True))
            emitting.update((r.request_id, r) for r, _ in pooled)
            take_aux_outputs(self.aux_output_connector, outputs, emitting, model_runner_output)
        if self._structured_ids or self.grammar_compile_error_reqs:
            self._grammar_updates(outputs)
        if self.ec_connector is not None:
            finish_unavailable(self, outputs)
        if report_late and kv_output is not None:
            released = self._update_from_kv_transfers(kv_output)
        if released:
            # Blocks of finished requests whose transfers ended go back after the step's
            # outputs and its errors (grammar, encoder-cache, failed loads): vLLM frees its
            # error_req_ids first and runs _update_from_kv_xfer_finished last, on either path.
            self._release_transfers(*released)
        if kv_output is not None and kv_output.finished_sending and self._ec_bridge is not None:
            # Sends done of requests held for the EC connector's delay-free answer.
            ec_sends_done(self, kv_output.finished_sending)
        for request in errored:
            # vLLM 0.33 emits these after the step's outputs (its error_req_ids).
            outputs.setdefault(request.client_index, []).append(self._error_output(request))
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

    def _land_in_flight(self, scheduler_output: SchedulerOutput, landed: bool) -> set[str] | None:
        """vLLM 0.33's in-flight accounting as the step lands: each scheduled request still
        held takes its scheduled tokens off ``num_in_flight_tokens``, and a preempted one's
        stale share (``num_stale_output_tokens``, set by ``_preempt_request``) drains in
        lockstep. ``landed``: the step's batch, all live, already took its tokens off
        (``_land_live_batch``). Returns the requests whose output in this step is stale (it
        predates their preemption), or ``None`` if none is."""
        counts = scheduler_output.num_scheduled_tokens
        if not landed:
            requests_get = self.requests.get
            for request_id, n in counts.items():
                request = requests_get(request_id)
                if request is not None:
                    request.num_in_flight_tokens -= n
        stale_ids = self._stale_ids
        if not stale_ids:
            return None
        stale = set()
        for request_id in list(stale_ids):
            n = counts.get(request_id)
            request = self.requests.get(request_id)
            if request is None or request.num_stale_output_tokens <= 0:
                stale_ids.discard(request_id)
                continue
            if n is None:
                continue
            request.num_stale_output_tokens -= n
            stale.add(request_id)
            if request.num_stale_output_tokens <= 0:
                stale_ids.discard(request_id)
        return stale or None

    def _pooled(
        self, scheduler_output: SchedulerOutput, model_runner_output: Any
    ) -> list[tuple[Request, Any]]:
        """The pooling requests the step gave a pooler output (their last prefill chunk),
        with it."""
        pooler_outputs = model_runner_output.pooler_output
        if not pooler_outputs:
            return []
        index = model_runner_output.req_id_to_index
        requests = self.requests
        pooled = []
        for request_id in scheduler_output.num_scheduled_tokens:
            request = requests.get(request_id)
            if request is None or request.pooling_params is None or request.is_finished():
                continue
            pooler_output = pooler_outputs[index[request_id]]
            if pooler_output is not None:
                pooled.append((request, pooler_output))
        return pooled

    def _finish_pooled(self, pooled: list[tuple[Request, Any]]) -> None:
        """vLLM's: a pooling request stops as soon as it has its output."""
        for request, _ in pooled:
            request.status = RequestStatus.FINISHED_STOPPED

    def _pooled_output(self, request: Request, pooler_output: Any) -> EngineCoreOutput:
        """A pooling request's last ``EngineCoreOutput``, its blocks freed."""
        transfer_params, ec_transfer_params = self._free_request(request)
        events = request.events
        if events:
            request.events = []
        return EngineCoreOutput(
            request_id=request.request_id,
            new_token_ids=[],
            finish_reason=request.get_finished_reason(),
            pooling_output=pooler_output,
            stop_reason=request.stop_reason,
            events=events or None,
            trace_headers=request.trace_headers,
            num_nans_in_logits=request.num_nans_in_logits,
            kv_transfer_params=transfer_params,
            ec_transfer_params=ec_transfer_params,
        )

    def _forget_landed(self, late: list[tuple[Any, list[int]]]) -> None:
        """Forgets the core ids of finished requests whose last output has landed."""
        late_core_ids = self._late_core_ids
        for core_id, _ in late:
            if not self._core.num_outputs_in_flight(core_id):
                request_id = self._vllm_ids.pop(core_id, None)
                if request_id is not None and late_core_ids.get(request_id) == core_id:
                    del late_core_ids[request_id]

    def _batch_of(self, scheduler_output: SchedulerOutput) -> Batch | None:
        """The ``Batch`` ``schedule()`` formed ``scheduler_output`` with, if it is one of
        the last few and its ``num_scheduled_tokens`` still names the batch's requests in
        the batch's order; else ``None`` (the requests are looked up by id then)."""
        for out, batch in self._batches:
            if out is scheduler_output:
                if list(scheduler_output.num_scheduled_tokens) == batch.vllm_ids:
                    return batch
                return None
        return None

    def _sampled_whole_batch(
        self, batch: Batch, sampled: Any, index: dict[str, int]
    ) -> tuple[list[str], list[Request], list[list[int]]]:
        """``_sampled``'s usual case in bulk: no drafts scheduled, no dropped or stale
        outputs, and every request of the batch still live (none finished meanwhile): the
        requests with sampled tokens, their ids and tokens (the batch's own lists where
        all sampled)."""
        requests = batch.requests
        vllm_ids = batch.vllm_ids
        tokens = list(map(sampled.__getitem__, map(index.__getitem__, vllm_ids)))
        if all(tokens):
            return vllm_ids, requests, tokens
        keep = list(map(bool, tokens))
        return (
            list(itertools.compress(vllm_ids, keep)),
            list(itertools.compress(requests, keep)),
            list(itertools.compress(tokens, keep)),
        )

    def _sampled(
        self,
        scheduler_output: SchedulerOutput,
        model_runner_output: Any,
        batch: Batch | None = None,
        stale: set[str] | None = None,
        batch_live: bool = False,
        skip: set[str] | None = None,
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
        reach no vLLM request, only the core. ``batch``: the step's scheduled requests,
        where at hand (``_batch_of``). ``stale``: the requests whose output predates their
        preemption (``_land_in_flight``): dropped where vLLM drops it
        (``drop_stale_output``), and their rejected drafts not rolled back (vLLM's
        rollback of a stale output predates the preemption's). ``skip``: requests whose
        output vLLM skips after a failed KV load (``_handle_kv_load_failures``)."""
        sampled = model_runner_output.sampled_token_ids
        index = model_runner_output.req_id_to_index
        spec_scheduled = scheduler_output.scheduled_spec_decode_tokens
        if (
            batch is not None
            and batch_live
            and sampled
            and not spec_scheduled
            and not self._dropped_outputs
            and not stale
            and not skip
        ):
            return *self._sampled_whole_batch(batch, sampled, index), {}, None, []
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
            if skip and request_id in skip:
                continue
            is_stale = stale is not None and request_id in stale
            if is_stale and request.drop_stale_output:
                continue
            tokens = sampled[index[request_id]]
            if not tokens:
                continue
            if spec_scheduled and (drafts := spec_scheduled.get(request_id)):
                num_accepted = max(len(tokens) - 1, 0)
                num_rejected = len(drafts) - num_accepted
                if request.status == _RUNNING and not is_stale:
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
        batch: Batch | None = None,
    ) -> dict[int, list[EngineCoreOutput]]:
        """Appends each live request's tokens (up to its stop, for those the core finished),
        frees the finished ones, and builds one ``EngineCoreOutput`` per request.
        ``batch``: the step's batch where ``live`` is its requests (their clients are kept
        there)."""
        hash_block_size = self.hash_block_size
        # Under a hash look-ahead (the core's, which follows the requests' hashers) a token
        # can complete an earlier block's hash.
        always_hash = self._core.num_hash_lookahead_tokens > 0
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
        if batch is not None:
            if batch.clients is None:
                batch.clients = set(map(_client_index, live))
            clients = batch.clients
        else:
            clients = set(map(_client_index, live))
        if len(clients) <= 1:
            return {next(iter(clients)): outputs} if outputs else {}
        by_client: dict[int, list[EngineCoreOutput]] = defaultdict(list)
        for request, output in zip(live, outputs, strict=True):
            by_client[request.client_index].append(output)
        return by_client

    def _finished_output(self, request: Request, tokens: list[int]) -> EngineCoreOutput:
        """A request the core finished: its tokens up to its stop appended, the request
        freed, and its last ``EngineCoreOutput``."""
        request_id = request.request_id
        if self._ec_frees:
            report_ec_frees(self, request)
        bridge = self._bridge
        kept = bridge.appended_at_finish.pop(request_id, None) if bridge else None
        if kept is None and self._ec_bridge is not None:
            kept = self._ec_bridge.appended_at_finish.pop(request_id, None)
        if kept is not None:  # appended when the core asked the connector
            tokens = kept
        elif tokens:  # none: an encoder instance's stop (its status set)
            tokens = self._append_until_stop(request, tokens)
        finish_reason = request.get_finished_reason()
        if request.resumable and not self._park_session(request):
            # A session's turn: parked (or resumed), not freed (vLLM 0.33).
            return EngineCoreOutput(
                request_id=request_id,
                new_token_ids=tokens,
                finish_reason=finish_reason,
                stop_reason=request.stop_reason,
                events=request.take_events(),
                spec_decode_metrics=request.spec_decode_metrics,
                trace_headers=request.trace_headers,
                num_nans_in_logits=request.num_nans_in_logits,
            )
        transfer_params, ec_transfer_params = self._free_request(request)
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
            ec_transfer_params=ec_transfer_params,
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

    def _append_until_stop(self, request: Request, tokens: list[int]) -> list[int]:
        """Appends tokens up to the one that stopped the request (vLLM's ``check_stop``,
        which also sets its status and ``stop_reason``) and resolves the output placeholders
        of all of them, as vLLM 0.33's ``_update_request_with_output``; returns the tokens
        kept."""
        kept = tokens
        # A preempted request's output predates its preemption: its counters were reset
        # (vLLM's is_stale; the core rewinds only a running request too).
        running = request.status == _RUNNING
        for num_kept, token in enumerate(tokens, 1):
            request.append_output_token_ids(token)
            if check_stop(request, self.max_model_len):
                if running:
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
                self._core.update_draft_token_ids(for_core)

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

    def get_grammar_bitmask(self, scheduler_output: SchedulerOutput) -> GrammarOutput | None:
        """vLLM 0.33's: the grammar bitmask of the step's structured-output requests past
        their prefill, from the structured output manager, in the step's order, with the
        drafts each may accept (its scheduled drafts less -1 padding)."""
        if not scheduler_output.has_structured_output_requests:
            return None
        requests = self.requests
        ids = [
            request_id
            for request_id in scheduler_output.num_scheduled_tokens
            if (request := requests.get(request_id)) is not None
            and request.use_structured_output
            and not request.is_prefill_chunk
        ]
        if not ids:
            return None
        spec_tokens = scheduler_output.scheduled_spec_decode_tokens
        bitmask = self.structured_output_manager.grammar_bitmask(requests, ids, spec_tokens)
        num_acceptable_drafts = [
            len(strip_speculative_padding(spec_tokens.get(request_id, []))) for request_id in ids
        ]
        return GrammarOutput(ids, bitmask, num_acceptable_drafts)

    def _grammar_updates(self, outputs: dict[int, list[EngineCoreOutput]]) -> None:
        """vLLM's grammar steps in ``update_from_output``: each structured-output request's
        new tokens advance its grammar; one the grammar rejects finishes with an error
        (``FINISHED_ERROR``), and a request whose grammar failed to compile finishes with a
        ``validation_error``."""
        manager = self.structured_output_manager
        rejected: list[str] = []
        structured = self._structured_ids
        if structured:
            # Those still live (a finished request's grammar has nothing left to check).
            for output in itertools.chain.from_iterable(outputs.values()):
                request_id = output.request_id
                if request_id in structured and not manager.accept_tokens(
                    self.requests[request_id], output.new_token_ids
                ):
                    rejected.append(request_id)
        for request in self.finish_requests(rejected, RequestStatus.FINISHED_ERROR):
            for output in outputs[request.client_index]:
                if output.request_id == request.request_id:
                    output.finish_reason = request.get_finished_reason()
        errors = self.grammar_compile_error_reqs
        if not errors:
            return
        self.grammar_compile_error_reqs = {}
        for request in self.finish_requests(list(errors), RequestStatus.FINISHED_ERROR):
            events = request.events
            request.events = []
            outputs.setdefault(request.client_index, []).append(
                EngineCoreOutput(
                    request_id=request.request_id,
                    new_token_ids=[],
                    finish_reason=request.get_finished_reason(),
                    events=events or None,
                    trace_headers=request.trace_headers,
                    error=errors.get(request.request_id),
                )
            )
