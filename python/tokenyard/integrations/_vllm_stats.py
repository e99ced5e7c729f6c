"""The per-step statistics and KV events of ``TokenyardScheduler``
(``tokenyard.integrations.vllm``) as vLLM 0.33's ``Scheduler`` reports them
(``make_stats``: queue sizes, KV usage, prefix-cache lookups; KV cache events to the
publisher), and the resets of the connector's and the encoder's caches. Imported only by
that module, so vLLM is installed when this runs."""

from __future__ import annotations

import logging
import time
from typing import Any

from vllm.distributed.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
)
from vllm.v1.metrics.stats import PrefixCacheStats, SchedulerStats
from vllm.v1.request import Request
from vllm.v1.spec_decode.metrics import SpecDecodingStats

from tokenyard.errors import ConfigError
from tokenyard.integrations._vllm_kv_events import KvEventBuilder
from tokenyard.integrations._vllm_state import AdapterBase

_log = logging.getLogger(__name__)


class StatsAndEvents(AdapterBase):
    """``make_stats``, the KV events and the side caches' resets."""

    connector_prefix_cache_stats: PrefixCacheStats | None
    enable_kv_cache_events: bool
    kv_events_config: Any
    kv_event_publisher: Any
    _kv_events: KvEventBuilder | None

    def get_request_counts(self) -> tuple[int, int]:
        """(running, waiting)."""
        return self._core.num_running, self._core.num_waiting

    def _record_prefix_lookup(self, request: Request, num_hits: int) -> None:
        stats = self._prefix_cache_stats
        if stats is None or not self._prefix_caching:
            return
        stats.record(
            num_tokens=request.num_tokens,
            num_hits=num_hits,
            preempted=request.num_preemptions > 0,
        )

    def reset_connector_cache(self) -> bool:
        """vLLM's: resets the connector's external cache, if it has one."""
        if self.connector is None:
            return True
        if self.connector.reset_cache() is False:
            return False
        if self.connector_prefix_cache_stats is not None:
            self.connector_prefix_cache_stats.reset = True
        return True

    def reset_encoder_cache(self) -> None:
        """Drops the encoder cache's entries (vLLM's ``EncoderCacheManager.reset``) when no
        request references one; otherwise keeps them (vLLM drops those too, and its running
        requests then re-encode on their next use: not modelled)."""
        if not any(refs for _, refs in self._core.encoder_cache_entries()):
            self._core.set_encoder_cache_size(self._core.encoder_cache_usage()[2])

    def make_stats(
        self,
        spec_decoding_stats: SpecDecodingStats | None = None,
        kv_connector_stats: Any = None,
        cudagraph_stats: Any = None,
        perf_stats: Any = None,
        ec_connector_stats: Any = None,
    ) -> SchedulerStats | None:
        """vLLM's per-step ``SchedulerStats``: queue sizes, KV usage, the prefix-cache
        lookups since the previous call, speculative-decoding counts."""
        if not self.log_stats:
            return None
        prefix_cache_stats = self._prefix_cache_stats
        self._prefix_cache_stats = PrefixCacheStats()
        connector_prefix_cache_stats = self.connector_prefix_cache_stats
        if connector_prefix_cache_stats is not None:
            self.connector_prefix_cache_stats = PrefixCacheStats()
        num_running, num_waiting = self.get_request_counts()
        core_stats = self._core.stats()
        num_deferred = core_stats.num_deferred_waiting
        return SchedulerStats(
            num_running_reqs=num_running,
            num_waiting_reqs=num_waiting - num_deferred,
            num_skipped_waiting_reqs=num_deferred,
            num_kv_fetch_reqs_by_stage=self._kv_fetch_counts.copy(),
            kv_cache_usage=core_stats.kv_usage,
            prefix_cache_stats=prefix_cache_stats,
            connector_prefix_cache_stats=connector_prefix_cache_stats,
            spec_decoding_stats=spec_decoding_stats,
            kv_connector_stats=kv_connector_stats.to_dict() if kv_connector_stats else None,
            ec_connector_stats=ec_connector_stats.data if ec_connector_stats else None,
            cudagraph_stats=cudagraph_stats,
            perf_stats=perf_stats,
        )

    def _enable_kv_events(self) -> None:
        """Turns the core's cache events on: with each cache call's request where the core
        records them (the block-hash pool; the coordinator beside full-attention,
        sliding-window, chunked-local and Mamba ``align`` groups, of one block size or
        several), whose events are vLLM's field for field
        (``_vllm_kv_events``). The radix pool (tokenyard's own setting) publishes one
        ``BlockStored`` per block hash, the core's hashes, no tokens. Beside KV cache groups
        whose events the core does not record: with vLLM's ``"null"`` publisher, which
        discards every batch (``NullEventPublisher``), only the connector's events are
        taken, as vLLM's discarded ones would be; any other publisher raises ConfigError
        (``kv_events_config``)."""
        try:
            self._core.enable_kv_cache_calls()
        except ConfigError as err:
            if len(self.kv_cache_config.kv_cache_groups) > 1:
                publisher = getattr(self.kv_events_config, "publisher", None)
                if publisher != "null":
                    self.kv_event_publisher.shutdown()
                    raise ConfigError(
                        f"kv_events_config.publisher={publisher!r}: KV cache events are not "
                        f"published beside these KV cache groups ({err}); the 'null' "
                        f"publisher is served"
                    ) from err
                self._kv_events = None
                return
            _log.warning("KV cache events are not vLLM's here: %s", err)
            self._core.enable_kv_events()
            self._kv_events = None
            return
        self._kv_events = KvEventBuilder(
            block_size=self.block_size,
            hash_block_size=self.hash_block_size,
            num_hash_lookahead_tokens=self._core.num_hash_lookahead_tokens,
            kv_cache_groups=self.kv_cache_config.kv_cache_groups,
        )

    def _keep_for_kv_events(self, request_id: str) -> None:
        """The adapter forgets ``request_id``: its cache calls not yet published still
        need it."""
        builder = getattr(self, "_kv_events", None)
        if builder is not None:
            builder.keep(self._core_ids[request_id], self.requests[request_id])

    def _live_request(self, core_id: Any) -> Request | None:
        request_id = self._vllm_ids.get(core_id)
        return None if request_id is None else self.requests.get(request_id)

    def _publish_kv_events(self) -> None:
        events: list[Any] = []
        builder = getattr(self, "_kv_events", None)
        if self.enable_kv_cache_events and builder is not None:
            core_events, calls = self._core.drain_kv_events_detailed()
            events.extend(builder.build(core_events, calls, self._live_request))
        elif self.enable_kv_cache_events:
            events.extend(self._coarse_kv_events(self._core.drain_kv_events()))
        if self.connector is not None:
            events.extend(self.connector.take_events() or ())
        if events:
            self.kv_event_publisher.publish(KVEventBatch(ts=time.time(), events=events))

    def _coarse_kv_events(self, core_events: list[tuple[str, int]]) -> list[Any]:
        events: list[Any] = []
        for kind, block_hash in core_events:
            if kind == "stored":
                events.append(
                    BlockStored(
                        block_hashes=[block_hash],
                        parent_block_hash=None,
                        token_ids=[],
                        block_size=self.block_size,
                        lora_id=None,
                        medium="GPU",
                        lora_name=None,
                    )
                )
            elif kind == "removed":
                events.append(BlockRemoved(block_hashes=[block_hash], medium="GPU"))
            elif kind == "all_cleared":
                events.append(AllBlocksCleared())
        return events
