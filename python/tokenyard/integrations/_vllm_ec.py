"""vLLM 0.33's encoder-cache connector (disaggregated encode) beside ``TokenyardScheduler``
(``tokenyard.integrations.vllm``).

vLLM's ``Scheduler`` asks its ``ECConnectorBase`` (``vllm/distributed/ec_transfer/
ec_connector/base.py``), for each multimodal item that needs its encoder output and fits
the encoder cache, whether it holds that output (``has_cache_item``, in
``_try_schedule_encoder_inputs``): such an item takes cache room but no encoder budget and
is not encoded. It reports each item given cache room (``update_state_after_alloc``, in
``_allocate_encoder_inputs``). Before a request with items is given tokens it asks
whether the outputs it needs from its computed tokens on are at hand
(``ensure_cache_available``, ``_ec_transfer_pending``): one in transit is skipped for the
step, running or waiting (a real connector, vLLM's CPU or Mooncake one, fetches then). An
update that lets a request's passed item go reports it (``update_state_after_free``, in
``_free_encoder_input``, reached from ``_free_encoder_inputs`` in ``update_from_output``
only; vLLM's Mooncake connector cancels its transfer there). The core makes the four
calls (``sched::encoder_connector``) through :class:`EncoderConnectorBridge`; a request
the connector can no longer serve finishes with an error at the next update
(``take_unavailable_requests``, :func:`finish_unavailable`). An encoder-only instance (an
EC producer, ``VllmConfig.is_mm_encoder_only``) publishes embeddings and samples nothing:
a request stops once its whole prompt is consumed (vLLM's ``update_from_output``),
:func:`encoder_instance_stops`. The core asks the connector's ``request_finished`` as it
finishes a request, after the KV connector (vLLM's ``_free_request``): a delay-free ``True``
keeps the request's KV blocks and the request in ``requests`` until a KV connector output
lists it in ``finished_sending`` (:func:`ec_finished`, :func:`ec_sends_done`).
Imported only by that module, so vLLM is installed when this runs."""

from __future__ import annotations

from typing import Any, Protocol

from vllm.v1.engine import EngineCoreOutput
from vllm.v1.request import Request, RequestStatus

from tokenyard.errors import ConfigError
from tokenyard.integrations._vllm_outputs import errors_in_vllm_ids


class EcState(Protocol):
    """What :func:`encoder_instance_stops` and :func:`finish_unavailable` read of
    ``TokenyardScheduler``."""

    requests: dict[str, Request]
    ec_connector: Any
    _core: Any
    _core_ids: dict[str, Any]

    def finish_requests(self, request_ids: Any, finished_status: Any) -> list[Request]: ...

    def _error_output(self, request: Request) -> EngineCoreOutput: ...


class FreesState(Protocol):
    """What :func:`report_ec_frees` reads of ``TokenyardScheduler``."""

    ec_connector: Any
    _ec_frees: list[tuple[Request, int]] | None
    _ec_free_order: dict[str, int]


class BridgeState(FreesState, Protocol):
    """What :class:`EncoderConnectorBridge` reads of ``TokenyardScheduler``."""

    def _request_of(self, core_id: Any) -> Request: ...

    def _append_until_stop(self, request: Request, tokens: list[int]) -> list[int]: ...


class FinishedState(FreesState, Protocol):
    """What :func:`ec_finished` and :func:`ec_sends_done` read of ``TokenyardScheduler``."""

    requests: dict[str, Request]
    _core: Any
    _core_ids: dict[str, Any]
    _vllm_ids: dict[Any, str]
    _ec_bridge: EncoderConnectorBridge | None
    _bridge: Any
    _pool_view: Any

    def _forget(self, request_id: str) -> None: ...


class EncoderConnectorBridge:
    """vLLM's encoder-cache connector as the core's: each call goes to the scheduler's
    ``ec_connector`` as it is then (a method replaced on it is the one called, as in
    vLLM), with the vLLM ``Request``."""

    def __init__(self, scheduler: BridgeState) -> None:
        self._scheduler = scheduler
        # The tokens of the update being applied, by request (set around the core's
        # update), and those appended here when the core finished a request in it.
        self.tokens_in_update: dict[str, list[int]] = {}
        self.appended_at_finish: dict[str, list[int]] = {}
        # request_finished's answers, (delay-free, ec_transfer_params), until the adapter
        # frees the request (ec_finished).
        self.answers: dict[str, tuple[bool, Any]] = {}
        # Finished requests whose KV blocks the core keeps for the connector's delay-free
        # answer, until a KV connector output lists them in finished_sending.
        self.held: set[str] = set()

    def has_cache_item(self, identifier: str) -> bool:
        return bool(self._scheduler.ec_connector.has_cache_item(identifier))

    def update_state_after_alloc(self, view: Any, input_id: int) -> None:
        scheduler = self._scheduler
        request = scheduler._request_of(view.request_id)
        scheduler.ec_connector.update_state_after_alloc(request, input_id)

    def update_state_after_free(self, view: Any, input_id: int) -> None:
        scheduler = self._scheduler
        request = scheduler._request_of(view.request_id)
        if scheduler._ec_frees is not None:
            # In an update: told in vLLM's order by report_ec_frees.
            scheduler._ec_frees.append((request, input_id))
            return
        scheduler.ec_connector.update_state_after_free(request, input_id)

    def ensure_cache_available(self, view: Any, num_computed_tokens: int) -> bool:
        scheduler = self._scheduler
        request = scheduler._request_of(view.request_id)
        return bool(scheduler.ec_connector.ensure_cache_available(request, num_computed_tokens))

    def request_finished(self, view: Any) -> bool:
        """vLLM 0.33's call in ``_free_request``, made by the core as it finishes the
        request (after the KV connector's): the request as vLLM's connector sees it then,
        its items let go in this update told first and, for one the core stopped in an
        update, its tokens appended up to the stop and its status set (``check_stop``).
        Returns the delay-free answer (the core keeps the KV blocks for it)."""
        scheduler = self._scheduler
        request = scheduler._request_of(view.request_id)
        request_id = request.request_id
        if scheduler._ec_frees:
            report_ec_frees(scheduler, request)
        tokens = self.tokens_in_update.get(request_id)
        if tokens is not None and not request.is_finished():
            self.appended_at_finish[request_id] = scheduler._append_until_stop(request, tokens)
        elif request.pooling_params is not None and not request.is_finished():
            # A pooling request stops on its output (vLLM's update_from_output).
            request.status = RequestStatus.FINISHED_STOPPED
        delay_free, params = scheduler.ec_connector.request_finished(request)
        self.answers[request_id] = (bool(delay_free), params)
        if delay_free:
            self.held.add(request_id)
        return bool(delay_free)


def begin_ec_update(
    scheduler: FinishedState, scheduled_ids: Any, live_ids: list[str], tokens: list[list[int]]
) -> None:
    """Before the core applies an update beside an encoder-cache connector: the items it
    lets go are kept to be told in vLLM's order (:func:`report_ec_frees`, the step's
    requests in their scheduled order), and the update's tokens are at hand for the
    requests it finishes (:meth:`EncoderConnectorBridge.request_finished`)."""
    scheduler._ec_frees = []
    scheduler._ec_free_order = {request_id: n for n, request_id in enumerate(scheduled_ids)}
    bridge = scheduler._ec_bridge
    if bridge is not None:
        bridge.tokens_in_update = dict(zip(live_ids, tokens, strict=True))


def end_ec_update(scheduler: FinishedState) -> None:
    """After the core's update (or when it raised): the items it let go not yet told are
    told (:func:`report_ec_frees`), and the update's lists are closed."""
    report_ec_frees(scheduler, None)
    bridge = scheduler._ec_bridge
    if bridge is not None:
        bridge.tokens_in_update = {}


def ec_finished(scheduler: FinishedState, request: Request) -> tuple[bool, Any]:
    """The connector's answer for a request being freed (vLLM's ``_free_request``):
    whether its KV blocks are held for it, and its ``ec_transfer_params``. The core asked
    it as it finished the request (:meth:`EncoderConnectorBridge.request_finished`); one it
    did not finish is asked here, and a delay-free ``True`` for it is refused
    (:func:`delay_free_refused`: its blocks are gone)."""
    bridge = scheduler._ec_bridge
    if bridge is None:
        return False, None
    answer = bridge.answers.pop(request.request_id, None)
    if answer is not None:
        return answer
    delay_free, params = scheduler.ec_connector.request_finished(request)
    if delay_free:
        raise delay_free_refused(scheduler.ec_connector, request)
    return False, params


def ec_sends_done(scheduler: FinishedState, finished_sending: Any) -> None:
    """The requests of a KV connector output's ``finished_sending`` whose blocks are held
    for the encoder-cache connector's delay-free answer: their blocks go back to the pool
    and the requests leave ``requests``, as vLLM's ``_update_from_kv_xfer_finished`` frees
    them (last in the update). One a KV connector's send holds too goes with that send
    (``_release_transfers``)."""
    bridge = scheduler._ec_bridge
    if bridge is None or not bridge.held:
        return
    done = [i for i in finished_sending if i in bridge.held]
    if not done:
        return
    bridge.held.difference_update(done)
    kv_bridge = scheduler._bridge
    ours = [i for i in done if kv_bridge is None or i not in kv_bridge.sending]
    if not ours:
        return
    with errors_in_vllm_ids(scheduler._vllm_ids), scheduler._pool_view.asking():
        scheduler._core.finish_kv_transfers(finished_sending=[scheduler._core_ids[i] for i in ours])
    for request_id in ours:
        scheduler._forget(request_id)


def encoder_instance_stops(
    scheduler: EcState, scheduled_ids: Any, emitted: set[str]
) -> list[Request]:
    """vLLM 0.33's ``update_from_output`` on an encoder-only instance: each running request
    of the step that sampled nothing and pooled nothing stops (``FINISHED_STOPPED``) once its
    computed tokens reach its prompt's end (its items are encoded then: none is scheduled
    past an item the encoder cache could not take). The core drops them (an abort: their
    blocks and encoder-cache entries are freed); returns them, their status set."""
    requests_get = scheduler.requests.get
    stopped = [
        request
        for request_id in scheduled_ids
        if request_id not in emitted
        and (request := requests_get(request_id)) is not None
        and request.status == RequestStatus.RUNNING
        and request.num_computed_tokens >= request.num_prompt_tokens
    ]
    if stopped:
        # Set before the core frees them: its connectors' request_finished read it (vLLM
        # frees a request once its status is set).
        for request in stopped:
            request.status = RequestStatus.FINISHED_STOPPED
        scheduler._core.abort([scheduler._core_ids[r.request_id] for r in stopped])
    return stopped


def finish_unavailable(scheduler: EcState, outputs: dict[int, list[EngineCoreOutput]]) -> None:
    """vLLM 0.33's ``update_from_output``: the requests whose encoder input the connector
    can no longer obtain (``take_unavailable_requests``) finish with ``FINISHED_ERROR``
    ("retryable: re-issuing the request re-runs the encode"), each with an output of no
    tokens added to ``outputs``; those finished already are left out, as vLLM's
    ``finish_requests`` leaves them."""
    request_ids = scheduler.ec_connector.take_unavailable_requests()
    if not request_ids:
        return
    # finish_requests skips ids it does not hold.
    for request in scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ERROR):
        outputs.setdefault(request.client_index, []).append(scheduler._error_output(request))


def delay_free_refused(connector: Any, request: Request) -> ConfigError:
    """The error for an encoder-cache connector whose ``request_finished`` answered
    delay-free ``True`` for ``request``. vLLM 0.33's ``Scheduler._free_request`` ORs that
    answer into the KV connector's: the request's KV blocks stay allocated and the request
    stays in ``requests`` until a KV connector output lists it in ``finished_sending``
    (``_update_from_kv_xfer_finished``), while its encoder-cache entries are freed at once.
    Served when the core finishes the request (it asks the connector then); refused by name
    for a request the adapter frees without the core (:func:`ec_finished`), once it is
    freed as for ``False``."""
    return ConfigError(
        f"ec_transfer_config.ec_connector: {type(connector).__name__}.request_finished "
        f"answered delay_free=True for request {request.request_id!r}; holding a request's "
        f"KV blocks for an encoder-cache connector until a KV connector reports it in "
        f"finished_sending (vLLM 0.33's _free_request) is not modelled for a request the "
        f"core did not finish",
        field="ec_transfer_config.ec_connector",
        value="request_finished -> (True, ...)",
    )


def report_ec_frees(scheduler: FreesState, upto: Request | None) -> None:
    """Tells the connector of the items the core's update let go (kept in
    ``scheduler._ec_frees``, in the update's batch order), in vLLM 0.33's order:
    ``update_from_output`` reports a request's items (``_free_encoder_inputs``) before it
    finishes it (``_free_request`` asks ``request_finished``), request by request. With
    ``upto`` (a request the update finished, about to be freed): those of the requests up to
    it in the batch; with ``None``: the rest, and the update's list is closed."""
    frees = scheduler._ec_frees
    if frees is None:
        return
    if upto is None:
        scheduler._ec_frees = None
        taken = frees
    else:
        order = scheduler._ec_free_order
        last = len(order)
        limit = order.get(upto.request_id, last)
        n = 0
        while n < len(frees) and order.get(frees[n][0].request_id, last) <= limit:
            n += 1
        taken = frees[:n]
        del frees[:n]
    connector = scheduler.ec_connector
    for request, input_id in taken:
        connector.update_state_after_free(request, input_id)
