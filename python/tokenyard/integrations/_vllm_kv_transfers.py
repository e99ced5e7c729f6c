"""The KV connector's transfer reports for ``TokenyardScheduler``
(``tokenyard.integrations.vllm``), as vLLM 0.33's ``Scheduler.update_from_output`` takes
them from ``KVConnectorOutput``: failed loads first (``_handle_failed_recving``,
``_handle_invalid_blocks``: the rule is the core's ``handle_kv_load_failures``), then the
loads that landed and the sends that completed (``_update_from_kv_xfer_finished``). Imported
only by that module, so vLLM is installed when this runs."""

from __future__ import annotations

import itertools
from typing import Any

from vllm.v1.engine import EngineCoreOutput
from vllm.v1.metrics.stats import KV_FETCH_COMPLETED_WAITING
from vllm.v1.request import Request, RequestStatus

from tokenyard.integrations._vllm_outputs import errors_in_vllm_ids
from tokenyard.integrations._vllm_state import AdapterBase

_WAITING_FOR_REMOTE_KVS = RequestStatus.WAITING_FOR_REMOTE_KVS

# vLLM 0.33's message (``Scheduler._handle_invalid_blocks``), which its tests match.
_SEVERAL_GROUPS = (
    "A KV connector reported block-level load failures (invalid_block_ids) which is not "
    "supported for models with multiple KV cache groups. Connectors must report failed "
    "requests via KVConnectorTransferResults.failed_recving instead."
)


class KvTransfers(AdapterBase):
    """The KV connector attribute; failed loads, landed loads and completed sends, from
    the workers' reports."""

    _kv_connector: Any = None
    # Requests the core finishes with an error at its next update (_handle_kv_load_failures).
    _load_errors: tuple[str, ...] = ()

    @property
    def connector(self) -> Any:
        """vLLM's scheduler-side KV connector (or ``None``). vLLM's callers and tests
        assign one on a built scheduler (a mock, say); the core then asks the new one
        through the same bridge. Assigning ``None`` keeps the bridge's connector (vLLM
        then makes no connector call; the core's bridge still would)."""
        return self._kv_connector

    @connector.setter
    def connector(self, connector: Any) -> None:
        bridge = getattr(self, "_bridge", None)
        if bridge is not None and connector is not None:
            bridge.connector = connector
        self._kv_connector = connector

    @property
    def recompute_kv_load_failures(self) -> bool:
        """vLLM 0.33's: ``kv_load_failure_policy == "recompute"`` (True without a KV
        transfer config). Setting it sets the core's policy."""
        return bool(self._core.kv_load_failure_policy == "recompute")

    @recompute_kv_load_failures.setter
    def recompute_kv_load_failures(self, recompute: bool) -> None:
        self._core.kv_load_failure_policy = "recompute" if recompute else "fail"

    @property
    def failed_recving_kv_req_ids(self) -> set[str]:
        """vLLM 0.33's: loading requests whose load failed (whole, or some of its blocks)
        under ``"recompute"``, until they are promoted; a snapshot."""
        vllm_ids = self._vllm_ids
        return {vllm_ids[core_id] for core_id in self._core.failed_load_ids()}

    def _handle_invalid_blocks(
        self, invalid_block_ids: set[int], num_scheduled_tokens: dict[str, int]
    ) -> set[str]:
        """vLLM 0.33's ``_handle_invalid_blocks``: the requests whose computed blocks hold
        one of ``invalid_block_ids`` (vLLM's ids) are cut back to their valid prefix; under
        ``"fail"`` they finish with ``FINISHED_ERROR`` at the next update. Returns the ids
        whose output in this step is dropped (under ``"recompute"`` the running ones, else
        every one).

        Raises:
            RuntimeError: several KV cache groups (vLLM's message).
        """
        return self._handle_kv_load_failures((), invalid_block_ids, num_scheduled_tokens)

    def _handle_kv_load_failures(
        self,
        failed_recving: Any,
        invalid_block_ids: Any,
        num_scheduled_tokens: dict[str, int],
    ) -> set[str]:
        """The core's ``handle_kv_load_failures`` over vLLM's report, mirrored on the vLLM
        requests' ``num_computed_tokens``; the requests it fails are finished by the core's
        next update, and by ``_finish_load_errors`` here. Returns the ids whose output in
        this step is dropped.

        Raises:
            RuntimeError: ``invalid_block_ids`` beside several KV cache groups.
        """
        if invalid_block_ids and len(self.kv_cache_config.kv_cache_groups) > 1:
            raise RuntimeError(_SEVERAL_GROUPS)
        core_ids = self._core_ids
        failed_ids = [core_ids[i] for i in failed_recving or () if i in core_ids]
        # vLLM's block 0 is its null block; the core numbers the others from 0.
        invalid = [b - 1 for b in invalid_block_ids or () if b > 0]
        scheduled = {core_ids[i]: n for i, n in num_scheduled_tokens.items() if i in core_ids}
        # vLLM evicts, under "fail", each running request's blocks from the first invalid
        # block it marked on; the core evicts them itself, the tables are read before.
        evicting = bool(invalid) and not self.recompute_kv_load_failures
        before = self._running_tables(num_scheduled_tokens) if evicting else {}
        with errors_in_vllm_ids(self._vllm_ids):
            truncated, rescheduled, failed, _ = self._core.handle_kv_load_failures(
                failed_recving=failed_ids,
                invalid_block_ids=invalid,
                num_scheduled_tokens=scheduled,
            )
        vllm_ids = self._vllm_ids
        blocks_to_evict: set[int] = set()
        for core_id, num_computed_tokens in truncated:
            request_id = vllm_ids[core_id]
            self.requests[request_id].num_computed_tokens = num_computed_tokens
            found = before.get(request_id)
            # A request cut below its computed tokens marked an invalid block (vLLM's
            # `marked_invalid_block`); one sharing only marked blocks keeps its count.
            if found is not None and num_computed_tokens < found[0]:
                blocks_to_evict.update(found[1][num_computed_tokens // self.block_size :])
        if blocks_to_evict:
            # vLLM's _handle_invalid_blocks call (the blocks are already out of the cache).
            self.kv_cache_manager.evict_blocks(blocks_to_evict)
        errors = [vllm_ids[core_id] for core_id in failed]
        if errors:
            self._load_errors = (*self._load_errors, *errors)
        return {vllm_ids[core_id] for core_id in rescheduled}.union(errors)

    def _running_tables(self, num_scheduled_tokens: dict[str, int]) -> dict[str, Any]:
        """Each running request's computed tokens before the step being updated and its
        block table (one KV group: block-level failures refuse several), as vLLM's
        ``_update_requests_with_invalid_blocks`` scans them."""
        get_block_ids = self.kv_cache_manager.get_block_ids
        return {
            r.request_id: (
                r.num_computed_tokens - num_scheduled_tokens.get(r.request_id, 0),
                get_block_ids(r.request_id)[0],
            )
            for r in self.running
        }

    def _cache_landed_load(self, request: Request) -> None:
        """vLLM 0.33's ``_update_waiting_for_remote_kv`` call caching a landed load's valid
        tokens (the request's ``num_computed_tokens`` as the load left them: all of a
        whole load, the valid prefix of a failed one; a failed load with none is freed
        instead, which the core did). The core cached them when it promoted the load; the
        call reaches ``kv_cache_manager.cache_blocks`` as vLLM's does."""
        if request.num_computed_tokens > 0:
            self.kv_cache_manager.cache_blocks(request, request.num_computed_tokens)

    def _mark_load_errors(self) -> list[Request]:
        """The requests failed loads finish with an error in the core's update about to
        run (vLLM's ``error_req_ids``), marked ``FINISHED_ERROR`` before it, as vLLM's
        ``finish_requests`` sets the status before ``_free_request`` asks the connector."""
        marked = []
        for request_id in self._load_errors:
            request = self.requests.get(request_id)
            if request is not None and not request.is_finished():
                request.status = RequestStatus.FINISHED_ERROR
                marked.append(request)
        self._load_errors = ()
        return marked

    def _finish_load_errors(self, marked: list[Request]) -> list[Request]:
        """The requests ``_mark_load_errors`` marked, freed once the core's update finished
        them (one whose load is still in flight stays in ``requests`` until it reports).
        Returns them, for their outputs; vLLM's error output carries no transfer
        parameters."""
        for request in marked:
            self._free_request(request)
        return marked

    @staticmethod
    def _error_output(request: Request) -> EngineCoreOutput:
        """vLLM 0.33's output for a request finished with ``FINISHED_ERROR`` in
        ``update_from_output``: no tokens, the finish reason, its events."""
        return EngineCoreOutput(
            request_id=request.request_id,
            new_token_ids=[],
            finish_reason=request.get_finished_reason(),
            events=request.take_events(),
            trace_headers=request.trace_headers,
        )

    def _update_from_kv_transfers(self, kv_output: Any) -> tuple[list[str], list[str]] | None:
        """vLLM's ``_update_from_kv_xfer_finished``: the connector sees the workers' report,
        then the loads that landed go to the core (failed loads were taken before,
        ``_handle_kv_load_failures``; a load that failed lands as any other and the core
        keeps its valid prefix). Returns the finished requests whose load ended and the
        sends that completed, for ``_release_transfers`` once the step's outputs are
        applied (vLLM frees their blocks last); ``None`` if none."""
        if self.connector is not None:
            # A reading stretch: a store's completion reads its blocks' hashes (twice each,
            # SimpleCPUOffloadScheduler._process_store_completion), which its frees keep.
            with self._pool_view.reading():
                self.connector.update_connector_output(kv_output)
        finished_recving = kv_output.finished_recving or ()
        if self._blocked_ids and finished_recving:
            # Remote-KV waits outside the core (_vllm_adopt), recorded as vLLM's are.
            self._note_outside_landings(finished_recving)
        bridge = self._bridge
        if bridge is None:
            return None
        finished_sending = kv_output.finished_sending or ()
        if bridge.unheld or (
            (finished_recving or finished_sending) and len(self.requests) > len(self._core_ids)
        ):
            # Reports of finished requests the core holds nothing for (_vllm_adopt).
            finished_recving = self._take_unheld_reports(list(finished_recving))
            finished_sending = self._take_unheld_reports(list(finished_sending))
        recving = [i for i in finished_recving if i in bridge.loading]
        sending = [i for i in finished_sending if i in bridge.sending]
        # Loads of finished requests (aborted, or failed under "fail") free blocks: later.
        requests_get = self.requests.get
        landed = [i for i in recving if (r := requests_get(i)) is not None and not r.is_finished()]
        held = [i for i in recving if i not in landed]
        if landed:
            core_ids = self._core_ids
            with errors_in_vllm_ids(self._vllm_ids), self._pool_view.asking():
                self._core.finish_kv_transfers(finished_recving=[core_ids[i] for i in landed])
            for request_id in landed:
                bridge.loading.discard(request_id)
                self.finished_recving_kv_req_ids.add(request_id)
                # vLLM 0.33's _update_from_kv_xfer_finished (_kv_fetch_stages).
                self._set_kv_fetch_stage(self.requests[request_id], KV_FETCH_COMPLETED_WAITING)
        return (held, sending) if held or sending else None

    def _release_transfers(self, recving: list[str], sending: list[str]) -> None:
        """The second half of ``_update_from_kv_transfers``: the blocks finished requests
        kept for a load or a send go back to the pool, and the requests are forgotten."""
        bridge = self._bridge
        if bridge is None:
            return
        core_ids = self._core_ids
        with errors_in_vllm_ids(self._vllm_ids), self._pool_view.asking():
            self._core.finish_kv_transfers(
                finished_recving=[core_ids[i] for i in recving],
                finished_sending=[core_ids[i] for i in sending],
            )
        for request_id in recving:
            bridge.loading.discard(request_id)
        for request_id in sending:
            bridge.sending.discard(request_id)
        for request_id in itertools.chain(recving, sending):
            request = self.requests.get(request_id)
            if request is not None and request.is_finished() and request_id not in bridge.sending:
                self._forget(request_id)
