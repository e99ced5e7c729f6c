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
Imported only by that module, so vLLM is installed when this runs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.request import Request, RequestStatus

from tokenyard.errors import InputError
from tokenyard.integrations._vllm_lookahead import follow_hasher
from tokenyard.integrations._vllm_outputs import check_supported
from tokenyard.integrations._vllm_state import AdapterBase

_WAITING_FOR_REMOTE_KVS = RequestStatus.WAITING_FOR_REMOTE_KVS


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

    if TYPE_CHECKING:

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
