"""vLLM 0.33's count of the requests with an asynchronous KV load, by stage
(``Scheduler._kv_fetch_stages`` / ``_kv_fetch_counts``, reported as
``SchedulerStats.num_kv_fetch_reqs_by_stage``), kept by ``TokenyardScheduler``
(``tokenyard.integrations.vllm``) at the points vLLM's scheduler moves a request between
stages:

- ``waiting_to_start``: a P/D request arrived (``do_remote_prefill``; counted on arrival,
  as connector matching is skipped while every run slot is taken), or its latest lookup
  offered an asynchronous load not yet begun (``_vllm_views._ConnectorBridge``);
- ``in_progress``: its load began (the request waits in ``WAITING_FOR_REMOTE_KVS``);
- ``completed_waiting``: the load was reported finished and the request is not scheduled yet;
- none: its lookup offered no asynchronous load, it was scheduled, or it finished.

Tracked only with stats on and a KV connector (vLLM's ``None`` otherwise, the counts then
stay 0). Imported only by that module, so vLLM is installed when this runs."""

from __future__ import annotations

from vllm.v1.metrics.stats import KV_FETCH_STAGES
from vllm.v1.request import Request


class KvFetchStages:
    """``_kv_fetch_stages`` and ``_kv_fetch_counts`` with vLLM's ``_set_kv_fetch_stage``."""

    _kv_fetch_stages: dict[Request, str] | None = None
    _kv_fetch_counts: dict[str, int]

    def _init_kv_fetch_stages(self, tracked: bool) -> None:
        """vLLM 0.33's ``Scheduler.__init__``: tracked with stats on and a KV connector."""
        self._kv_fetch_stages = {} if tracked else None
        self._kv_fetch_counts = dict.fromkeys(KV_FETCH_STAGES, 0)

    def _set_kv_fetch_stage(self, request: Request, stage: str | None) -> None:
        """Moves ``request`` to ``stage`` (``None``: untracked), as vLLM 0.33's."""
        kv_fetch_stages = self._kv_fetch_stages
        if kv_fetch_stages is not None:
            prev_stage = kv_fetch_stages.pop(request, None)
            if prev_stage is not None:
                self._kv_fetch_counts[prev_stage] -= 1
            if stage is not None:
                kv_fetch_stages[request] = stage
                self._kv_fetch_counts[stage] += 1

    def _kv_fetch_scheduled(self, scheduled: dict[str, int]) -> None:
        """The requests of a step's ``num_scheduled_tokens`` leave their stage (vLLM sets
        ``None`` as its waiting loop schedules one): only waiting requests have one."""
        stages = self._kv_fetch_stages
        if stages:
            for request in [r for r in stages if r.request_id in scheduled]:
                self._set_kv_fetch_stage(request, None)
