"""The state ``TokenyardScheduler`` (``tokenyard.integrations.vllm``) keeps beside the core,
named once for the modules that build a step (``_vllm_schedule``) and apply its results
(``_vllm_update``): vLLM's requests by id, the id maps to and from the core, and what vLLM's
``Scheduler`` carries between steps. ``TokenyardScheduler.__init__`` sets every attribute
named here. Imported only by those modules, so vLLM is installed when this runs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from vllm.v1.metrics.stats import PrefillStats, PrefixCacheStats
from vllm.v1.request import Request

from tokenyard.errors import ConfigError
from tokenyard.integrations._vllm_kv_fetch import KvFetchStages

if TYPE_CHECKING:
    from tokenyard.integrations._vllm_views import _ConnectorBridge


def non_negative(value: Any, field: str) -> int:
    """``value`` as an int for an attribute assigned on a built scheduler (vLLM's tests
    assign budgets and sizes); ConfigError naming ``field`` if it is negative."""
    number = int(value)
    if number < 0:
        raise ConfigError(f"{field}: {value!r} must be >= 0", field=field, value=str(value))
    return number


class Batch:
    """One step's scheduled requests (int core ids), in the order of its
    ``num_scheduled_tokens``: the core's ids (array and list), vLLM's ids, the vLLM requests
    and their clients. ``schedule()`` reuses the previous step's when the core scheduled the
    same ids (a core id is never reused and a live request's object never replaced, so the
    lists stay right), and ``update_from_output`` finds the step's by its ``SchedulerOutput``.
    Read-only once built: the lists are shared between steps."""

    __slots__ = ("clients", "core_ids", "ids", "requests", "vllm_ids")

    def __init__(
        self, ids: Any, core_ids: list[int], vllm_ids: list[str], requests: list[Request]
    ) -> None:
        self.ids = ids
        self.core_ids = core_ids
        self.vllm_ids = vllm_ids
        self.requests = requests
        self.clients: set[int] | None = None
        """The requests' client indices, computed on first use."""


class AdapterBase(KvFetchStages):
    """Attributes and the helpers every part of the adapter calls (typed here; set and
    defined in ``tokenyard.integrations.vllm.TokenyardScheduler``)."""

    requests: dict[str, Request]
    _core: Any
    _core_ids: dict[str, Any]
    _vllm_ids: dict[Any, str]
    _late_core_ids: dict[str, Any]
    _int_ids: bool
    _kv_groups: int
    kv_cache_manager: Any
    """``_vllm_views._KVCacheManagerView``."""
    _hisparse_step: Any
    """``_vllm_hisparse_step.HiSparseStep`` with the HiSparse connector, else None."""
    _pool_view: Any
    """Its ``block_pool`` (``_vllm_coordinator_view.BlockPoolView``): core calls that may
    ask the KV connector run in its ``asking()`` windows."""
    needs_kv_cache_zeroing: bool
    _promoted_loads: set[str]
    prefix_replay_tokens: int
    """vLLM 0.33's SWA bounded replay window (0: no bounded-replay group)."""
    _pending_encoder_input_ids: dict[str, set[int]]
    is_encoder_decoder: bool
    """The core's KV groups: 0 for its single pool, else block ids go per group."""
    _bridge: _ConnectorBridge | None
    kv_cache_config: Any
    connector: Any
    ec_connector: Any
    _ec_frees: list[tuple[Request, int]] | None
    _ec_free_order: dict[str, int]
    _ec_bridge: Any
    """``_vllm_ec.EncoderConnectorBridge`` with an EC connector, else None."""
    structured_output_manager: Any
    block_size: int
    hash_block_size: int
    max_model_len: int
    num_spec_tokens: int
    dynamic_sd_lookup: list[int] | None
    _turn_sampling_params: dict[str, Any]
    async_scheduling: bool
    can_skip_drafts: bool
    use_pp: bool
    use_v2_model_runner: bool
    log_stats: bool
    observability_config: Any
    spec_decode_metrics_level: str
    current_step: int
    _pause_state: Any
    _prefix_caching: bool
    _spec_token_placeholders: list[int]
    finished_req_ids: set[str]
    finished_req_ids_dict: dict[int, set[str]] | None
    reset_preempted_req_ids: set[str]
    _prev_step_ids: set[str] | Batch
    """``prev_step_scheduled_req_ids`` (``_vllm_schedule``'s property): a set, or the
    previous step's batch, its ids, until read."""
    finished_recving_kv_req_ids: set[str]
    _dropped_outputs: set[str]
    _core_preempted: set[str]
    _stale_ids: set[str]
    """Requests with a stale share in flight (``num_stale_output_tokens`` > 0)."""
    aux_output_connector: Any
    is_mm_encoder_only: bool
    _prefill_stats_due: set[str]
    _prefill_stats_ready: dict[str, PrefillStats]
    _prefix_cache_stats: PrefixCacheStats | None
    _blocked_ids: set[str]
    """Requests waiting outside the core for a blocked status (``_vllm_adopt``)."""
    grammar_compile_error_reqs: dict[str, Any]
    _structured_ids: set[str]
    defer_block_free: bool
    requires_kv_delivery: bool
    return_sampling_mask: bool
    """vLLM 0.33's: outputs carry the runner's sampling masks (``update_from_output``)."""
    _adopted: set[str]
    """Requests placed in ``running`` by hand whose steps the core has not formed since
    (``_vllm_adopt``)."""
    _batches: tuple[tuple[Any, Batch], ...] = ()
    """The last steps' ``(SchedulerOutput, Batch)``, newest first (a few, for async
    scheduling's batch queue); set by ``schedule()``, read by ``update_from_output``."""

    if TYPE_CHECKING:

        def _vllm_requests(self, core_ids: Iterable[Any]) -> list[Request]: ...

        def _free_request(
            self, request: Request
        ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]: ...

        def _aux_request_finished(self, request: Request) -> None: ...
        def _park_session(self, request: Request) -> bool: ...

        def _forget(self, request_id: str) -> None: ...

        def _record_prefix_lookup(self, request: Request, num_hits: int) -> None: ...

        def _finish_prefill_stats(self, live: list[Request], live_ids: list[str]) -> None: ...

        def _publish_kv_events(self) -> None: ...

        def _outside_step(self, scheduler_output: Any) -> dict[Any, tuple[int, int]] | None: ...

        def _scheduled_by_core(self, scheduled_ids: Iterable[str]) -> None: ...

        def _take_unheld_reports(self, reported: list[str]) -> list[str]: ...

        def _take_recorded_landings(self) -> None: ...

        def _cache_landed_load(self, request: Request) -> None: ...

        @property
        def running(self) -> Any: ...

        @property
        def waiting(self) -> Any: ...

        @property
        def kv_holding_waiting(self) -> Any: ...

        @property
        def failed_recving_kv_req_ids(self) -> set[str]: ...

        def _note_outside_landings(self, finished_recving: Iterable[str]) -> None: ...

        def finish_requests(self, request_ids: Any, finished_status: Any) -> list[Request]: ...

        def make_stats(
            self,
            spec_decoding_stats: Any = None,
            kv_connector_stats: Any = None,
            cudagraph_stats: Any = None,
            perf_stats: Any = None,
            ec_connector_stats: Any = None,
        ) -> Any: ...
