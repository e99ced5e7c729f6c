"""Requests put in place by hand for ``TokenyardScheduler`` (``tokenyard.integrations.vllm``):
vLLM 0.33's ``Scheduler`` keeps plain containers, so an engine author's model-runner harness
(and vLLM's own tests) puts a ``Request`` into ``scheduler.requests`` and
``scheduler.running`` and hands ``update_from_output`` a ``SchedulerOutput`` it built; vLLM
reads those containers as they are (``update_from_output`` looks each scheduled id up in
``self.requests`` and takes ``num_scheduled_tokens`` and ``scheduled_spec_decode_tokens``
from the output). Here ``running`` is a list read from the core each time; its ``append``
hands the request to the core as a running request (``Scheduler.adopt_running``: its tokens,
its ``num_computed_tokens``, blocks for those), and ``update_from_output`` of a step the core
did not form applies it as such a step (``Scheduler.update_from_outside_step``). A remote-KV
wait set by hand on a waiting request (``status = WAITING_FOR_REMOTE_KVS``) is read as vLLM's
``finish_requests`` reads it: the aborted request stays in ``requests`` until the connector
reports its load; a finished request placed in ``requests`` by hand leaves when a transfer
of it is reported (vLLM's ``_update_from_kv_xfer_finished`` frees whatever it names).

Requests whose ``status`` says a wait vLLM 0.33's ``Scheduler`` reads as blocked
(``_is_blocked_waiting_status``: a grammar compiling, ``WAITING_FOR_STREAMING_REQ`` set by
hand, ``WAITING_FOR_REMOTE_KVS`` with no load started) when they are queued (``add_request``,
a queue view's ``add_request``) wait outside the core (``Scheduler.wait_outside``): vLLM's
``_enqueue_waiting_request`` queues them where they arrive, a remote-KV wait in
``kv_holding_waiting`` by its status alone, and ``schedule()`` asks
``_handle_blocked_waiting_request`` each time its admission loop reaches one; the core asks
``_waiting_ready`` at that point (its ``waiting_ready`` step hook), which reads the request
as vLLM's does and, for a remote-KV wait recorded in ``finished_recving_kv_req_ids``, calls
``self._update_waiting_for_remote_kv`` (so a replacement is called, as vLLM's tests patch
it). A status assigned on a request already queued is read only where the adapter is told:
at ``finish_requests``, or at a queue view's ``add_request``.
Imported only by that module, so vLLM is installed when this runs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from vllm.outputs import RequestError
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.request import Request, RequestStatus

from tokenyard.errors import InputError
from tokenyard.integrations._vllm_lookahead import follow_hasher
from tokenyard.integrations._vllm_outputs import check_supported, errors_in_vllm_ids
from tokenyard.integrations._vllm_state import AdapterBase
from tokenyard.integrations._vllm_views import _WaitingView

_WAITING = RequestStatus.WAITING
_RUNNING = RequestStatus.RUNNING
_PREEMPTED = RequestStatus.PREEMPTED
_WAITING_FOR_REMOTE_KVS = RequestStatus.WAITING_FOR_REMOTE_KVS
_WAITING_FOR_GRAMMAR = RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
_WAITING_FOR_STREAMING_REQ = RequestStatus.WAITING_FOR_STREAMING_REQ
# vLLM 0.33's Scheduler._is_blocked_waiting_status.
BLOCKED_STATUSES = (_WAITING_FOR_GRAMMAR, _WAITING_FOR_REMOTE_KVS, _WAITING_FOR_STREAMING_REQ)


class QueueView(_WaitingView):
    """``scheduler.waiting`` or ``scheduler.kv_holding_waiting`` (``holding``): a snapshot
    in scheduling order whose ``add_request`` and ``remove_requests`` move requests in the
    core's queue as vLLM's ``RequestQueue`` methods move them in its own: removed, a
    request is skipped (never admitted) until a queue's ``add_request`` puts it back, at
    the back of that queue (a blocked ``status`` read then)."""

    __slots__ = ("_holding", "_scheduler")

    def __init__(
        self, requests: list[Request], scheduler: AdoptedRequests, *, holding: bool
    ) -> None:
        super().__init__(requests)
        self._scheduler = scheduler
        self._holding = holding

    def add_request(self, request: Request) -> None:
        self._scheduler._requeue(request, self._holding)

    def remove_request(self, request: Request) -> None:
        self.remove_requests((request,))

    def remove_requests(self, requests: Iterable[Request]) -> None:
        for request in requests:
            self._scheduler._take_out_of_queue(request)


class RunningView(list[Request]):
    """``scheduler.running``: the running requests in running order, a new list on each
    read. ``append`` (and ``extend``) of a request in ``scheduler.requests`` that the core
    does not hold yet adopts it as running, as vLLM's scheduler runs whatever its
    ``running`` list holds; the list itself is a snapshot."""

    __slots__ = ("_scheduler",)

    def __init__(self, requests: Iterable[Request], scheduler: AdoptedRequests) -> None:
        super().__init__(requests)
        self._scheduler = scheduler

    def append(self, request: Request) -> None:
        self._scheduler._adopt_running(request)
        super().append(request)

    def extend(self, requests: Iterable[Request]) -> None:
        for request in requests:
            self.append(request)


class AdoptedRequests(AdapterBase):
    """The adoption of hand-placed running requests, and the update of a step formed
    outside the core."""

    _adopted: set[str]
    """Requests adopted whose steps the core has not formed since (a step naming them that
    is not the core's is applied as formed outside)."""
    _taken_out: set[str]
    """Requests a queue view's ``remove_requests`` took out and no ``add_request`` put
    back: skipped, as vLLM never reaches a request in no queue."""

    if TYPE_CHECKING:

        def _request_of(self, core_id: Any) -> Request: ...

        def _add_to_core(
            self, request: Request, num_computed_tokens: int | None = None
        ) -> None: ...

    @property
    def running(self) -> RunningView:
        """The running requests in running order (a new list on each read; its ``append``
        adopts a request placed in ``requests`` by hand)."""
        return RunningView(self._vllm_requests(self._core.running_ids()), self)

    def _adopt_running(self, request: Request) -> None:
        """vLLM's ``scheduler.running.append(request)`` of a request put in
        ``scheduler.requests`` by hand: the core queues it and moves it to its running
        list with its output tokens and ``num_computed_tokens`` (blocks allocated for those
        at once; vLLM's would get them at its next ``schedule()``). Its ``status`` is left
        as the caller set it, as vLLM leaves it.

        Raises:
            InputError: the request is not the one in ``scheduler.requests`` under its id,
                the core already holds it, a kind the adapter never schedules
                (``check_supported``: no sampling params, ...), or one
                the core refuses (a multimodal request, a resumable session, computed
                tokens past its tokens).
            CapacityError: the KV pool cannot hold its computed tokens.
        """
        request_id = request.request_id
        if request_id not in self.requests or self.requests[request_id] is not request:
            raise InputError(
                f"running.append: {request_id!r} is not in scheduler.requests (put it there "
                "first: vLLM's update_from_output looks requests up in it)",
                field="request_id",
                value=str(request_id),
            )
        if request_id in self._core_ids:
            raise InputError(
                f"running.append: {request_id!r} is already the scheduler's (queued or "
                "running); only a request placed by hand is adopted",
                field="request_id",
                value=str(request_id),
            )
        if request.mm_features or request.resumable:
            field = "mm_features" if request.mm_features else "resumable"
            raise InputError(
                f"running.append: {request_id!r} has {field}; a multimodal request or a "
                "streaming session placed by hand is not adopted (its encoder or session "
                "state would be missing)",
                field=field,
                value=str(request_id),
            )
        check_supported(request)
        follow_hasher(self._core, request)
        self._add_to_core(request, num_computed_tokens=0)
        core_id = self._core_ids[request_id]
        try:
            self._core.adopt_running(
                core_id, list(request.output_token_ids), request.num_computed_tokens
            )
        except Exception:
            self._core.abort([core_id])
            del self._core_ids[request_id]
            del self._vllm_ids[core_id]
            raise
        self._adopted.add(request_id)

    def _outside_step(self, scheduler_output: SchedulerOutput) -> dict[Any, tuple[int, int]] | None:
        """The step of ``scheduler_output`` as the core's ``update_from_outside_step`` takes
        it (core id -> scheduled tokens, drafts) when it names adopted requests and is not
        a step the core formed; else ``None``."""
        adopted = self._adopted
        if any(out is scheduler_output for out, _ in self._batches):
            return None
        adopted.intersection_update(self._core_ids)
        counts = scheduler_output.num_scheduled_tokens
        if not adopted.intersection(counts):
            return None
        spec = scheduler_output.scheduled_spec_decode_tokens
        core_ids = self._core_ids
        return {
            core_ids[request_id]: (n, len(spec.get(request_id) or ()))
            for request_id, n in counts.items()
            if request_id in core_ids
        }

    def _keep_hand_set_loads(self, request_ids: list[str]) -> None:
        """vLLM 0.33's ``finish_requests`` keeps a request whose status is
        ``WAITING_FOR_REMOTE_KVS`` (and whose load has not landed) until the connector
        reports the load. Requests whose status says so though the core started no load
        for them (set by hand) are kept so too, for ``_take_unheld_reports``."""
        bridge = self._bridge
        if bridge is None:
            return
        landed = self.finished_recving_kv_req_ids
        for request_id in request_ids:
            request = self.requests[request_id]
            if (
                request.status == _WAITING_FOR_REMOTE_KVS
                and request_id not in bridge.loading
                and request_id not in landed
            ):
                bridge.unheld.add(request_id)

    def _take_unheld_reports(self, reported: list[str]) -> list[str]:
        """The transfer reports (``finished_recving`` and ``finished_sending`` ids) that
        name finished requests the core holds nothing for: those kept by
        ``_keep_hand_set_loads`` and those placed in ``requests`` by hand already finished.
        vLLM's ``_update_from_kv_xfer_finished`` frees each (no blocks here) and drops it
        from ``requests``. Returns the other ids, for the core."""
        bridge = self._bridge
        if bridge is None:
            return reported
        requests = self.requests
        core_ids = self._core_ids
        rest = []
        for request_id in reported:
            request = requests.get(request_id)
            if request_id in bridge.unheld:
                bridge.unheld.discard(request_id)
                self._forget(request_id)
            elif request is not None and request_id not in core_ids and request.is_finished():
                del requests[request_id]
            else:
                rest.append(request_id)
        return rest

    def _scheduled_by_core(self, scheduled_ids: Iterable[str]) -> None:
        """Adopted requests the core scheduled: their steps are the core's from now on."""
        self._adopted.difference_update(scheduled_ids)

    # --- blocked waits --------------------------------------------------------------------

    def _wait_if_blocked(self, request: Request) -> None:
        """A request just queued in the core whose ``status`` is a blocked one waits outside
        it, a remote-KV wait with the block holders (vLLM 0.33's
        ``_enqueue_waiting_request``: ``deferred_waiting``, and ``kv_holding_waiting`` when
        ``_holds_kv_blocks``, which ``WAITING_FOR_REMOTE_KVS`` is alone)."""
        status = request.status
        if status not in BLOCKED_STATUSES:
            return
        request_id = request.request_id
        core_id = self._core_ids[request_id]
        remote = status == _WAITING_FOR_REMOTE_KVS
        self._core.wait_outside(core_id, remote)
        if remote:
            self._core.requeue_waiting(core_id, True)
        self._blocked_ids.add(request_id)

    def _waiting_ready(self, core_id: Any) -> bool:
        """The core's ``waiting_ready`` step hook: vLLM 0.33's
        ``_handle_blocked_waiting_request`` for a request waiting outside, asked when the
        admission loop reaches it. A remote-KV wait recorded in
        ``finished_recving_kv_req_ids`` goes through ``_update_waiting_for_remote_kv`` and
        becomes ``WAITING`` (``PREEMPTED`` after a preemption); a compiled grammar makes it
        ``WAITING``, a failed one is kept for ``update_from_output`` to finish with a
        ``validation_error``; a streaming wait stays until its status is set otherwise.
        Returns whether admission goes on with it."""
        request = self._request_of(core_id)
        request_id = request.request_id
        if request_id in self._taken_out:
            return False
        status = request.status
        if status == _WAITING_FOR_REMOTE_KVS:
            if request_id not in self.finished_recving_kv_req_ids:
                return False
            self._update_waiting_for_remote_kv(request)
            request.status = _PREEMPTED if request.num_preemptions else _WAITING
        elif status == _WAITING_FOR_GRAMMAR:
            structured = request.structured_output_request
            grammar = structured.grammar if structured is not None else None
            if grammar is None:
                return False
            if isinstance(grammar, Exception):
                self.grammar_compile_error_reqs[request_id] = RequestError(
                    code="validation_error",
                    message=f"Invalid structured outputs: {grammar}",
                )
                return False
            request.status = _WAITING
        elif status == _WAITING_FOR_STREAMING_REQ:
            return False
        self._blocked_ids.discard(request_id)
        return True

    def _update_waiting_for_remote_kv(self, request: Request) -> None:
        """vLLM 0.33's ``_update_waiting_for_remote_kv`` for a remote-KV wait outside the
        core, whose load no blocks hold: nothing to cache; the record of its landing goes.
        (A load the core started is taken by the core.)"""
        self.finished_recving_kv_req_ids.discard(request.request_id)

    def _note_outside_landings(self, finished_recving: Iterable[str]) -> None:
        """vLLM 0.33's ``_update_from_kv_xfer_finished`` records a reported load of a
        request whose status is ``WAITING_FOR_REMOTE_KVS`` in
        ``finished_recving_kv_req_ids``, whether or not it started one."""
        requests = self.requests
        blocked = self._blocked_ids
        for request_id in finished_recving:
            if request_id in blocked and requests[request_id].status == _WAITING_FOR_REMOTE_KVS:
                self.finished_recving_kv_req_ids.add(request_id)

    def _queued_core_id(self, request: Request, what: str) -> Any:
        """The core id of a request the core holds waiting; InputError otherwise."""
        request_id = request.request_id
        core_id = self._core_ids.get(request_id)
        if core_id is None or self.requests.get(request_id) is not request:
            raise InputError(
                f"{what}: {request_id!r} is not a request of this scheduler (add_request "
                "queues a new one)",
                field="request_id",
                value=str(request_id),
            )
        return core_id

    def _take_out_of_queue(self, request: Request) -> None:
        """A queue's ``remove_requests``: the request is skipped until a queue's
        ``add_request`` puts it back (the core keeps it queued, waiting outside). A request
        in no queue (running, finished) is passed over, as vLLM's filter passes it over.

        Raises:
            InputError: the request is not this scheduler's, or its KV is loading (the
                core's load holds blocks for it).
        """
        core_id = self._queued_core_id(request, "remove_requests")
        if request.status == _RUNNING or request.is_finished():
            return
        request_id = request.request_id
        if not self._core.waits_outside(core_id):
            with errors_in_vllm_ids(self._vllm_ids):
                self._core.wait_outside(core_id, False, defer=False)
        self._blocked_ids.add(request_id)
        self._taken_out.add(request_id)

    def _requeue(self, request: Request, holding: bool) -> None:
        """A queue's ``add_request`` of a request this scheduler holds waiting: it goes to
        the back of that queue (``holding``: ``kv_holding_waiting``), waiting outside the
        core if its status is a blocked one (vLLM reads it when its loop reaches it).

        Raises:
            InputError: the request is not this scheduler's, or is not waiting without
                blocks (running, or its KV loading).
        """
        core_id = self._queued_core_id(request, "add_request")
        request_id = request.request_id
        with errors_in_vllm_ids(self._vllm_ids):
            self._core.requeue_waiting(core_id, holding)
        self._taken_out.discard(request_id)
        status = request.status
        if status in BLOCKED_STATUSES:
            with errors_in_vllm_ids(self._vllm_ids):
                remote = status == _WAITING_FOR_REMOTE_KVS
                self._core.wait_outside(core_id, remote, defer=False)
            self._blocked_ids.add(request_id)
        elif request_id in self._blocked_ids:
            self._core.end_outside_wait(core_id)
            self._blocked_ids.discard(request_id)

    def _forget_blocked(self, request_id: str) -> None:
        """A finished request waits no longer."""
        if request_id in self._blocked_ids:
            self._blocked_ids.discard(request_id)
            self._taken_out.discard(request_id)
            self.grammar_compile_error_reqs.pop(request_id, None)
