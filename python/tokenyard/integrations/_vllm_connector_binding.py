"""vLLM 0.33's ``Scheduler.__init__`` (``v1/core/sched/scheduler.py``), once its KV cache
manager is built: ``self.connector.bind_kv_cache_manager(self.kv_cache_manager)``, whose base method
(``kv_connector/v1/base.py``) keeps the manager as ``_kv_cache_manager`` and passes its
``block_pool`` to ``bind_gpu_block_pool``. ``TokenyardScheduler`` binds its
``_KVCacheManagerView`` the same way, after refusing by name the connectors whose scheduler
side would use what the view does not offer:

- a class overriding ``bind_gpu_block_pool`` keeps vLLM's GPU ``BlockPool`` object and
  changes it (``SimpleCPUOffloadConnector``'s scheduler manager ``touch``-es and frees its
  blocks; the Mooncake store and UMBP schedulers pin theirs); the core's pool view is
  read-only;
- a class overriding ``bind_kv_cache_manager`` builds on vLLM's manager object itself
  (UMBP's; HiSparse's is refused before, ``_vllm_hisparse.refuse_unmodelled_hisparse``).

``MultiConnector`` forwards both to each connector it holds (``multi_connector.py``), so
those are judged one by one. A class reading ``_kv_cache_manager`` through the base method
(``OffloadingConnector._max_loadable_tokens``: ``coordinator
.find_longest_cache_hit_per_group``, answered by the coordinator view) is bound, beside
one KV cache group or several: the blocks the adapter hands its ``update_state_after_alloc``
are vLLM's ``get_blocks`` (null blocks where a sliding window no longer attends, the prefix
hit hashed: ``_vllm_views._allocated_blocks``), which its per-group load planning reads.
Imported only by ``tokenyard.integrations.vllm``, so vLLM is installed when this runs."""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiConnector

from tokenyard.errors import ConfigError

_FIELD = "kv_transfer_config.kv_connector"
_BINDS = ("bind_gpu_block_pool", "bind_kv_cache_manager")


def _leaves(connector: Any) -> list[Any]:
    """The connectors ``bind_kv_cache_manager`` reaches: a ``MultiConnector``'s own, each
    judged by itself (nested ones opened too), else the connector."""
    if isinstance(connector, MultiConnector):
        return [leaf for inner in connector._connectors for leaf in _leaves(inner)]
    return [connector]


def _overridden_bind(cls: type) -> str | None:
    """The first of vLLM's bind methods ``cls`` defines over ``KVConnectorBase_V1``'s."""
    for name in _BINDS:
        if getattr(cls, name, None) is not getattr(KVConnectorBase_V1, name):
            return name
    return None


def bind_kv_cache_manager(connector: Any, view: Any) -> None:
    """vLLM's bind of ``view`` (the adapter's ``kv_cache_manager``) into ``connector``.

    Raises:
        ConfigError (field ``kv_transfer_config.kv_connector``): a connector (alone or in
            a ``MultiConnector``) whose class overrides ``bind_gpu_block_pool`` or
            ``bind_kv_cache_manager``: it would keep and change vLLM's own block pool or
            manager, which the core's KV is not. Nothing is bound then.
    """
    for leaf in _leaves(connector):
        cls = type(leaf)
        where = "" if leaf is connector else f" (inside {type(connector).__name__})"
        method = _overridden_bind(cls)
        if method is not None:
            raise ConfigError(
                f"{_FIELD}: {cls.__name__}{where} is not served: its scheduler side "
                f"overrides {method} and would keep and change vLLM's GPU BlockPool or "
                "KVCacheManager object itself, which tokenyard's scheduler does not have "
                "(its KV blocks are the core's; the pool view it binds is read-only)",
                field=_FIELD,
                value=cls.__name__,
            )
    connector.bind_kv_cache_manager(view)
