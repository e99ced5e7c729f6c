"""vLLM 0.33's ``HiSparseConnector`` served by ``TokenyardScheduler`` with prefix caching
off: the core runs the connector's scheduler-side rules in the step (``sched::hisparse_step``
over ``kv::HiSparseConnectorKv``: write-backs, their acknowledgements, GPU residency, hot
regions, the free order), and the adapter keeps vLLM's connector object as vLLM's
``Scheduler`` does, with its coordinator answered by the core:

- the connector is built by vLLM's factory as for any connector (its
  ``get_num_new_matched_tokens`` answers no load); instead of
  ``bind_kv_cache_manager`` (which builds vLLM's ``HiSparseCoordinator`` on vLLM's own
  ``KVCacheManager``), its scheduler half is bound to :class:`CoreHiSparseCoordinator`;
- each step's ``HiSparseConnectorMetadata`` is built from the core's tables and planned
  write-backs (``_vllm_hisparse_meta.build_hisparse_metadata``), after the core ran
  ``advance_scheduled`` for the scheduled requests in ``schedule()``;
- ``update_from_output`` hands ``kv_connector_output`` to the connector after the step's
  finished requests are freed (as vLLM's does); its ``update_spills`` passes the workers'
  counts to the core (``hisparse_acknowledge``);
- ``has_pending_block_frees`` and ``has_pending_push_work`` are the core's
  (``hisparse_pending_reclamation``, ``hisparse_pending_work``); the core asks the former
  itself when a running request's allocation finds no room.

Refused by name (:func:`refuse_unserved_hisparse_connector`): the connector inside a
``MultiConnector``, with prefix caching on (the step does not run the host publication,
hits adopting GPU copies of published host pages, nor imports: written down as
``tests/hisparse_caching_model.py``), with speculative decoding (its
row mirrors reach past the scheduled tokens), and beside a layout other than one resident
and one hot group. Imported only by ``tokenyard.integrations.vllm``, so vLLM is installed
when this runs."""

from __future__ import annotations

import weakref
from typing import Any

from tokenyard.errors import ConfigError
from tokenyard.integrations._vllm_hisparse_meta import ResidencySync, build_hisparse_metadata
from tokenyard.integrations._vllm_translate import hisparse_source_group

_NAME = "HiSparseConnector"
_FIELD = "kv_transfer_config.kv_connector"


def hisparse_connector_configured(kv_transfer_config: Any) -> bool:
    """Whether ``kv_transfer_config`` names the HiSparse connector, alone or inside a
    ``MultiConnector`` (vLLM's ``has_connector``)."""
    has_connector = getattr(kv_transfer_config, "has_connector", None)
    return has_connector is not None and bool(has_connector(_NAME))


def _refuse(reason: str, *, field: str = _FIELD, value: str = _NAME) -> ConfigError:
    return ConfigError(f"{field}: {reason}", field=field, value=value)


def refuse_unserved_hisparse_connector(vllm_config: Any, kv_cache_config: Any) -> None:
    """Raises ConfigError for a HiSparse connector the core does not run (see the module
    docs); nothing when none is configured."""
    transfer = vllm_config.kv_transfer_config
    if not hisparse_connector_configured(transfer):
        return
    if getattr(transfer, "kv_connector", None) != _NAME:
        raise _refuse(
            f"{_NAME} inside {transfer.kv_connector} is not served (the core runs it as "
            "the scheduler's only KV connector)",
            value=str(transfer.kv_connector),
        )
    if vllm_config.cache_config.enable_prefix_caching:
        raise _refuse(
            f"{_NAME} with prefix caching on is not served: the step does not run the host "
            "publication, hits on published host pages and their GPU copies, nor imports "
            "(prefix caching off is)",
            field="cache_config.enable_prefix_caching",
            value="True",
        )
    if vllm_config.speculative_config is not None:
        raise _refuse(
            f"{_NAME} with speculative decoding is not served (its row mirrors reach past "
            "the scheduled tokens by the draft lookahead)",
            field="speculative_config",
            value=type(vllm_config.speculative_config).__name__,
        )
    kinds = [
        type(getattr(g, "kv_cache_spec", None)).__name__
        for g in getattr(kv_cache_config, "kv_cache_groups", ()) or ()
    ]
    counts = (kinds.count("HiSparseResidentSpec"), kinds.count("HiSparseHotSpec"))
    if counts != (1, 1) or hisparse_source_group(kv_cache_config) is None:
        raise _refuse(
            f"{_NAME} is served on vLLM's HiSparse layout with a HISPARSE_SOURCE group, one "
            f"HiSparseResidentSpec and one HiSparseHotSpec group (this one has {counts[0]} "
            f"and {counts[1]})",
            field="kv_cache_config.kv_cache_groups",
            value=",".join(kinds),
        )


class _HostPoolUsage:
    """The host ``BlockPool`` as the connector's stats read it (``get_usage``)."""

    metrics_collector = None

    def __init__(self, core: Any) -> None:
        self._core = core

    def get_usage(self) -> float:
        num_blocks, _, num_free = self._core.hisparse_host_pages
        return 1.0 - float(num_free) / max(int(num_blocks) - 1, 1)


class CoreHiSparseCoordinator:
    """What vLLM's ``HiSparseConnectorScheduler`` asks its ``HiSparseCoordinator`` outside
    ``build_connector_meta`` (which the adapter builds itself), answered by the core."""

    def __init__(self, core: Any, source_group: int) -> None:
        self._core = core
        self.host_group_id = source_group

    def update_spills(self, enqueued: dict[int, int], completed: dict[int, int]) -> None:
        self._core.hisparse_acknowledge(dict(enqueued), dict(completed))

    def release_completed_host_copies(self, dst_ids: Any) -> None:
        # Host copies come only with prefix hits (caching on, refused): none is planned,
        # and vLLM passes ids it does not know by.
        return None

    def finish_host_import(self, request_id: str, failed: bool = False) -> None:
        # Imports come only with a load into host pages, which this connector never
        # starts (its get_num_new_matched_tokens answers 0).
        return None

    def has_pending_work(self) -> bool:
        return bool(self._core.hisparse_pending_work)

    def has_pending_reclamation(self) -> bool:
        return bool(self._core.hisparse_pending_reclamation)

    @property
    def pending_spills(self) -> range:
        """Sized as vLLM's (write-backs not yet acknowledged); the stats read its length."""
        return range(self._core.hisparse_num_pending_transfers)

    def get_host_block_pool(self) -> _HostPoolUsage:
        return _HostPoolUsage(self._core)


class HiSparseStep:
    """The adapter's side of the connector for one scheduler: what each request's worker
    was told of its resident row, and the step's metadata."""

    def __init__(self, scheduler: Any, source_group: int) -> None:
        self._scheduler = weakref.ref(scheduler)
        self.source_group = source_group
        self.sync = ResidencySync()

    def build(self, out: Any) -> Any:
        """``HiSparseConnectorMetadata`` for the step ``out`` (see the module docs)."""
        scheduler = self._scheduler()
        if scheduler is None:
            raise ReferenceError("the scheduler of this HiSparse step is gone")
        core, core_ids = scheduler._core, scheduler._core_ids
        # vLLM's HiSparseCoordinator.free drops a freed request's state (finished, aborted
        # or preempted since the last step).
        for request_id in (*out.finished_req_ids, *out.preempted_req_ids):
            self.sync.forget(request_id)
        # The pages lost to reuse show in the rows (null); the log is drained every step.
        core.take_hisparse_lost_pages()

        def tables(request_id: str) -> Any:
            core_id = core_ids.get(request_id)
            return None if core_id is None else core.hisparse_tables(core_id)

        return build_hisparse_metadata(
            out,
            tables,
            core.take_hisparse_transfers(),
            source_group=self.source_group,
            block_size=scheduler.block_size,
            sync=self.sync,
        )


def start_hisparse_connector(scheduler: Any, vllm_config: Any, kv_cache_config: Any) -> Any:
    """Turns the core's HiSparse connector on for ``scheduler`` (its host pool adopted
    already) and binds the connector's scheduler half to the core; returns the
    :class:`HiSparseStep`, or None without the connector."""
    if not hisparse_connector_configured(vllm_config.kv_transfer_config):
        return None
    source = hisparse_source_group(kv_cache_config)
    # refuse_unserved_hisparse_connector ran first (TokenyardScheduler.__init__), so the
    # layout has a source group.
    assert source is not None
    block_size = scheduler.block_size
    max_model_len = vllm_config.model_config.max_model_len
    # vLLM's HiSparseCoordinator: max_spill_pages = max_model_len // block_size.
    scheduler._core.set_hisparse_connector(max_spill_pages=max_model_len // block_size)
    coordinator = CoreHiSparseCoordinator(scheduler._core, source)
    scheduler.connector.connector_scheduler.bind_coordinator(coordinator)
    return HiSparseStep(scheduler, source)
