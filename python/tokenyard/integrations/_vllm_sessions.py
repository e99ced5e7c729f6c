"""Streaming-input sessions for ``TokenyardScheduler`` (``tokenyard.integrations.vllm``):
vLLM 0.33's resumable requests (``Request.resumable``). A session's turn that stops is
reported with its finish reason but not freed: the core parks it with its blocks
(``sched::session``) and the vLLM request waits in ``WAITING_FOR_STREAMING_REQ``, unless an
input chunk was queued meanwhile (``streaming_queue``), which resumes it at once. A new
request with the session's id is its next chunk (``add_request``); one that is not
resumable ends the session. vLLM's ``Scheduler._handle_stopped_request``,
``_update_request_as_session`` and ``add_request`` (``vllm/v1/core/sched/scheduler.py``),
mirrored on the vLLM requests. Imported only by that module, so vLLM is installed."""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from typing import Any

from vllm.v1.engine import EngineCoreEventType
from vllm.v1.request import Request, RequestStatus, StreamingUpdate

from tokenyard.errors import InputError
from tokenyard.integrations._vllm_outputs import errors_in_vllm_ids
from tokenyard.integrations._vllm_state import AdapterBase
from tokenyard.integrations._vllm_translate import core_prompt, stop_rules

_WAITING_FOR_STREAMING_REQ = RequestStatus.WAITING_FOR_STREAMING_REQ


class Sessions(AdapterBase):
    """Parking and resuming streaming-input sessions."""

    # The live sessions' ids, and the parked ones by id in the order they parked.
    _session_ids: set[str]
    _parked: dict[str, Request]
    # Sessions given a chunk on a wait set by hand, not scheduled since: they wait where
    # they were queued, with computed tokens but no blocks (_resume_unparked).
    _unparked: set[str]
    _turn_sampling_params: dict[str, Any]

    @property
    def num_waiting_for_streaming_input(self) -> int:
        """Sessions parked until their next input chunk (vLLM 0.33's counter: less the
        chunks taken by sessions whose wait was set by hand, which it never counted)."""
        num_unparked: int = self._core.num_unparked_resumes
        return len(self._parked) - num_unparked

    def _add_session_update(self, existing: Request, request: Request) -> None:
        """vLLM 0.33's ``add_request`` for an id it holds: the session's next input chunk
        (queued while the session runs), or its end (a request that is not resumable).

        Raises:
            InputError: the id is held by a request that is not a session (a duplicate),
                or by a session that began with prompt embeddings alone (naming
                ``prompt_token_ids``: vLLM extends only a prompt of ids).
        """
        request_id = existing.request_id
        update = StreamingUpdate.from_request(request)
        if update is not None and existing.prompt_token_ids is None:
            # vLLM 0.33's _update_request_as_session asserts the session has prompt ids
            # (an embeddings-only first chunk has none), when it takes the chunk.
            raise InputError(
                f"prompt_token_ids: streaming-input session {request_id!r} began with "
                "prompt embeddings alone, and vLLM 0.33 extends only a prompt of ids (its "
                "_update_request_as_session asserts one); no further chunk is served",
                field="prompt_token_ids",
                value=request_id,
            )
        if existing.status != _WAITING_FOR_STREAMING_REQ:
            if existing.streaming_queue is None:
                raise InputError(
                    f"request_id: {request_id!r} is already queued or running (and is not a "
                    "streaming-input session)",
                    field="request_id",
                    value=request_id,
                )
            existing.streaming_queue.append(update)
            self._end_at_next_stop(existing)
        elif update is not None and request_id in self._parked:
            self._resume_session(existing, update)
        elif update is not None:
            self._resume_unparked(existing, update)
        else:
            self.finish_requests(request_id, RequestStatus.FINISHED_ABORTED)

    def _park_session(self, request: Request) -> bool:
        """vLLM 0.33's ``_handle_stopped_request`` for a resumable request the core parked:
        the turn's in-flight work is dropped (its outputs are stale, dropped as they land)
        and the request resumes from its materialized frontier, now with the next queued
        chunk if there is one. Returns whether the session ended instead (its queued end
        marker): the core finished it then, and the caller frees it."""
        request.num_computed_tokens -= request.num_output_placeholders
        request.spec_token_ids = []
        request.drop_stale_output = True
        request.num_stale_output_tokens = request.num_in_flight_tokens
        request.num_output_placeholders = 0
        if request.num_stale_output_tokens > 0:
            self._stale_ids.add(request.request_id)
        self._unparked.discard(request.request_id)
        queue = request.streaming_queue
        if not queue:
            request.status = _WAITING_FOR_STREAMING_REQ
            self._parked[request.request_id] = request
            return False
        update = queue.popleft()
        if update is None:
            # The core finished it already (_end_at_next_stop), in the update's order.
            return True
        # vLLM 0.33's update_from_output slices the turn's logprobs before the chunk's
        # settings replace its own (attach_logprobs reads these).
        self._turn_sampling_params[request.request_id] = request.sampling_params
        self._resume_session(request, update, at_stop=True)
        self._end_at_next_stop(request)
        return False

    def _end_at_next_stop(self, session: Request) -> None:
        """With the end marker next in the session's queue, its next stop finishes it: the
        core is told now, so that it frees the blocks in the update's order, as vLLM
        frees them."""
        queue = session.streaming_queue
        if queue and queue[0] is None:
            self._core.end_session(self._core_ids[session.request_id])

    def _resume_session(
        self, session: Request, update: StreamingUpdate, *, at_stop: bool = False
    ) -> None:
        """vLLM 0.33's ``_update_request_as_session``: the last sampled token is dropped,
        the other outputs and the chunk's tokens become the prompt, the chunk's settings
        replace the session's, and it waits with its blocks (the core's
        ``resume_session``; ``at_stop``: the chunk queued while it ran, taken as its turn
        stops, so it was never skipped as a blocked wait).

        The chunk's multimodal items go to the core with their offsets counted from the
        chunk (it places them after the kept tokens, as ``extend_session`` then does on
        the vLLM request), and under prefix caching their placeholder tokens are keyed by
        the items (``core_prompt``), as ``add_request`` keys a prompt's.

        Raises:
            InputError: the core refuses the chunk (no room for an output token under
                ``max_model_len``, items ``add_request`` would refuse, naming
                ``mm_features``).
        """
        request_id = session.request_id
        tokens, max_tokens = _chunk_args(update)
        if update.mm_features and self._prefix_caching:
            tokens = core_prompt(tokens, update.mm_features)
        with errors_in_vllm_ids(self._vllm_ids):
            self._core.resume_session(
                self._core_ids[request_id],
                tokens,
                max_tokens,
                at_stop=at_stop,
                mm_features=update.mm_features or None,
                **_chunk_settings(update),
            )
        extend_session(session, update, self.hash_block_size)
        self._parked.pop(request_id, None)
        session.status = RequestStatus.WAITING
        if self.log_stats:
            session.record_event(EngineCoreEventType.QUEUED)

    def _resume_unparked(self, session: Request, update: StreamingUpdate) -> None:
        """vLLM 0.33's ``_update_request_as_session`` for a session whose
        ``WAITING_FOR_STREAMING_REQ`` status was set by hand on a request the core holds
        queued and never scheduled: the core takes the outputs appended by hand, the chunk
        and the ``num_computed_tokens`` set by hand (``resume_unparked_session``), and the
        request waits where it is, to be admitted from those computed tokens; vLLM's
        parked-session counter, which never counted it, goes one lower. The chunk's
        multimodal items go to the core as for a parked session (:meth:`_resume_session`);
        admission schedules them past the computed tokens.

        Raises:
            InputError: the core refuses it (the session was scheduled, its last token
                counted computed, items ``add_request`` would refuse, ...).
        """
        request_id = session.request_id
        tokens, max_tokens = _chunk_args(update)
        if update.mm_features and self._prefix_caching:
            tokens = core_prompt(tokens, update.mm_features)
        with errors_in_vllm_ids(self._vllm_ids):
            self._core.resume_unparked_session(
                self._core_ids[request_id],
                list(session.output_token_ids),
                session.num_computed_tokens,
                tokens,
                max_tokens,
                mm_features=update.mm_features or None,
                **_chunk_settings(update),
            )
        extend_session(session, update, self.hash_block_size)
        session.status = RequestStatus.WAITING
        self._unparked.add(request_id)
        if self.log_stats:
            session.record_event(EngineCoreEventType.QUEUED)

    def _update_request_as_session(self, session: Request, update: StreamingUpdate) -> None:
        """vLLM 0.33's ``Scheduler._update_request_as_session``, callable as vLLM's tests
        call it: a session this scheduler holds (the request under its id) resumes in the
        core as well (:meth:`_resume_session`); a request it does not hold has no core state
        to keep in step and gets vLLM's edit alone (:func:`extend_session`), multimodal
        items included, and the status ``WAITING``.

        Raises:
            InputError: as :meth:`_resume_session` for a held session; for another, its
                last token is computed already (vLLM asserts it is not) or it has no
                prompt ids (naming ``num_computed_tokens`` or ``prompt_token_ids``).
        """
        if self.requests.get(session.request_id) is session:
            self._resume_session(session, update)
            return
        extend_session(session, update, self.hash_block_size)
        session.status = RequestStatus.WAITING
        if self.log_stats:
            session.record_event(EngineCoreEventType.QUEUED)

    def _start_session(self, request: Request) -> None:
        """A new resumable request gets its queue of input chunks (vLLM's)."""
        if request.resumable:
            request.streaming_queue = deque()
            self._session_ids.add(request.request_id)

    def _sessions_holding_kv(self) -> set[str]:
        """Sessions waiting with computed tokens, so holding blocks (vLLM's
        ``_holds_kv_blocks``): parked, or resumed and not admitted since. A session given
        a chunk on a wait set by hand holds none: vLLM keeps it in the queue it was in."""
        requests = self.requests
        waiting = (RequestStatus.WAITING, _WAITING_FOR_STREAMING_REQ)
        unparked = self._unparked
        return {
            i
            for i in self._session_ids
            if requests[i].status in waiting
            and requests[i].num_computed_tokens > 0
            and i not in unparked
        }


def _chunk_args(update: StreamingUpdate) -> tuple[list[int], int]:
    """The chunk's tokens and ``max_tokens``, as the core's resume calls take them."""
    return list(update.prompt_token_ids or ()), update.max_tokens


def _chunk_settings(update: StreamingUpdate) -> dict[str, Any]:
    """The chunk's arrival time and stop rules, as the core's resume calls take them."""
    params = update.sampling_params
    return {
        "arrival_time": update.arrival_time,
        "eos_token_id": params.eos_token_id if params is not None else None,
        "stop_token_ids": (params.stop_token_ids or None) if params is not None else None,
        **stop_rules(params),
    }


def extend_session(session: Request, update: StreamingUpdate, hash_block_size: int) -> None:
    """vLLM 0.33's edit of a session's ``Request`` in ``_update_request_as_session``: the
    last sampled token (never computed) is dropped with the block hashes it completed, the
    other outputs and the chunk's tokens become the prompt, the chunk's multimodal items
    are placed after the kept tokens (their offsets moved by that many), and the chunk's
    settings and arrival time replace the session's.

    Raises:
        InputError: the session's last token is computed (``num_computed_tokens``), or it
            has no prompt ids (``prompt_token_ids``: a prompt of embeddings alone).
    """
    prompt = session.prompt_token_ids
    if prompt is None:
        raise InputError(
            f"prompt_token_ids: session {session.request_id!r} has none (prompt embeddings "
            "alone); vLLM 0.33 extends only a prompt of ids",
            field="prompt_token_ids",
            value=session.request_id,
        )
    keep_end = session.num_tokens - 1
    if keep_end < session.num_computed_tokens:
        raise InputError(
            f"num_computed_tokens: {session.num_computed_tokens} of session "
            f"{session.request_id!r} covers its last sampled token (at most {keep_end}; "
            "vLLM 0.33's _update_request_as_session asserts it)",
            field="num_computed_tokens",
            value=session.num_computed_tokens,
        )
    kept_output_tokens = session._all_token_ids[session.num_prompt_tokens : keep_end]
    del session._all_token_ids[keep_end:]
    del session.block_hashes[keep_end // hash_block_size :]
    session._output_token_ids.clear()
    prompt.extend(kept_output_tokens)
    if update.mm_features:
        base = session.num_tokens
        for feature in update.mm_features:
            feature.mm_position = replace(
                feature.mm_position, offset=feature.mm_position.offset + base
            )
        session.mm_features.extend(update.mm_features)
    new_tokens = update.prompt_token_ids or ()
    session._all_token_ids.extend(new_tokens)
    prompt.extend(new_tokens)
    session.update_block_hashes()
    session.num_prompt_tokens = len(prompt)
    session.arrival_time = update.arrival_time
    session.sampling_params = update.sampling_params
    session.max_tokens = update.max_tokens
