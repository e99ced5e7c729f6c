"""vLLM 0.33's encoder-cache connector (disaggregated encode) beside ``TokenyardScheduler``
(``tokenyard.integrations.vllm``).

vLLM's ``Scheduler`` asks its ``ECConnectorBase`` (``vllm/distributed/ec_transfer/
ec_connector/base.py``), for each multimodal item that needs its encoder output and fits
the encoder cache, whether it holds that output (``has_cache_item``, in
``_try_schedule_encoder_inputs``): such an item takes cache room but no encoder budget and
is not encoded. It reports each item given cache room (``update_state_after_alloc``, in
``_allocate_encoder_inputs``). The core makes both calls (``sched::encoder_connector``)
through :class:`EncoderConnectorBridge`. An encoder-only instance (an EC producer,
``VllmConfig.is_mm_encoder_only``) publishes embeddings and samples nothing: a request stops
once its whole prompt is consumed (vLLM's ``update_from_output``), :func:`encoder_instance_stops`.
Imported only by that module, so vLLM is installed when this runs."""

from __future__ import annotations

from typing import Any, Protocol

from vllm.v1.request import Request, RequestStatus


class EcState(Protocol):
    """What :func:`encoder_instance_stops` reads of ``TokenyardScheduler``."""

    requests: dict[str, Request]
    _core: Any
    _core_ids: dict[str, Any]


class BridgeState(Protocol):
    """What :class:`EncoderConnectorBridge` reads of ``TokenyardScheduler``."""

    ec_connector: Any

    def _request_of(self, core_id: Any) -> Request: ...


class EncoderConnectorBridge:
    """vLLM's encoder-cache connector as the core's: each call goes to the scheduler's
    ``ec_connector`` as it is then (a method replaced on it is the one called, as in
    vLLM), with the vLLM ``Request``."""

    def __init__(self, scheduler: BridgeState) -> None:
        self._scheduler = scheduler

    def has_cache_item(self, identifier: str) -> bool:
        return bool(self._scheduler.ec_connector.has_cache_item(identifier))

    def update_state_after_alloc(self, view: Any, input_id: int) -> None:
        scheduler = self._scheduler
        request = scheduler._request_of(view.request_id)
        scheduler.ec_connector.update_state_after_alloc(request, input_id)


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
        scheduler._core.abort([scheduler._core_ids[r.request_id] for r in stopped])
        for request in stopped:
            request.status = RequestStatus.FINISHED_STOPPED
    return stopped
