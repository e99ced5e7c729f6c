"""The connectors vLLM 0.33's ``Scheduler`` keeps beside its KV connector, as
``TokenyardScheduler`` (``tokenyard.integrations.vllm``) holds them: the auxiliary-output
connector (``_vllm_aux_outputs``) and the encoder-cache connector (``_vllm_ec``). Each is an
attribute vLLM's callers and tests assign on a built scheduler; assigning one attaches (or
with ``None`` detaches) its bridge in the core, which asks it while it forms a step.
Imported only by that module, so vLLM is installed when this runs."""

from __future__ import annotations

from typing import Any

from vllm.v1.request import Request

from tokenyard.integrations._vllm_aux_outputs import AuxOutputBridge, BlockHashIndex
from tokenyard.integrations._vllm_ec import EncoderConnectorBridge


class SideConnectors:
    """``aux_output_connector`` and ``ec_connector`` as properties over the core."""

    _core: Any
    _block_hash_index: BlockHashIndex
    _aux_output_connector: Any = None
    _ec_connector: Any = None
    # The bridge the core asks (None without an EC connector).
    _ec_bridge: EncoderConnectorBridge | None = None
    # The items an update let go, until told to the EC connector (_vllm_ec.report_ec_frees);
    # None outside an update.
    _ec_frees: list[tuple[Request, int]] | None = None
    _ec_free_order: dict[str, int] = {}  # noqa: RUF012 (replaced, never mutated)

    @property
    def aux_output_connector(self) -> Any:
        """vLLM 0.33's ``AuxOutputSchedulerConnector`` (or ``None``): asked at admission
        through the core (``_vllm_aux_outputs.AuxOutputBridge``), building each step's
        metadata, taking each output's rows, told of finished and preempted requests."""
        return self._aux_output_connector

    @aux_output_connector.setter
    def aux_output_connector(self, connector: Any) -> None:
        bridge = None
        if connector is not None:
            bridge = AuxOutputBridge(self, connector, self._block_hash_index)  # type: ignore[arg-type]
        self._core.set_aux_output_connector(bridge)
        self._aux_output_connector = connector

    @property
    def ec_connector(self) -> Any:
        """vLLM 0.33's encoder-cache connector (or ``None``), asked by the core while it
        forms a step (``_vllm_ec.EncoderConnectorBridge``); assignable on a built
        scheduler."""
        return self._ec_connector

    @ec_connector.setter
    def ec_connector(self, connector: Any) -> None:
        bridge = EncoderConnectorBridge(self) if connector is not None else None  # type: ignore[arg-type]
        self._core.set_encoder_connector(bridge)
        self._ec_connector = connector
        self._ec_bridge = bridge

    def _aux_request_finished(self, request: Request) -> None:
        """vLLM's ``aux_output_connector.request_finished`` (a finish or a preemption), its
        blocks' hashes entered first so that the connector's pool lookups are answered."""
        self._block_hash_index.index(request)
        self._aux_output_connector.request_finished(request)
