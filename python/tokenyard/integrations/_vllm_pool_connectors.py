"""vLLM 0.33's Mooncake store connector (``MooncakeStoreConnector``,
``vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/``) over the core's pool.

Its scheduler half (``scheduler.py``, ``MooncakeStoreScheduler``) keeps vLLM's GPU
``BlockPool`` (``bind_gpu_block_pool``) for one thing: every store job it emits pins the
GPU blocks the worker copies out of. ``_reference_save_blocks`` (in
``build_connector_meta``) and ``register_finished_partial_tail`` take one reference on
each (``pool.touch([pool.blocks[i] ...])``), and ``update_connector_output`` drops them,
tail first (``pool.free_blocks``), once every rank reported the job in
``MooncakeStoreWorkerMetadata.completed_saves``; ``has_pending_push_work`` keeps the
engine stepping meanwhile. It reads nothing else of the pool (no block hashes: its store
keys come from the request's ``block_hashes``), and its block tables from
``SchedulerOutput.kv_connector_block_state``. The pool view
(``_vllm_coordinator_view.BlockPoolView``) answers ``blocks[i]``, ``touch`` and
``free_blocks`` with the core's loose-block references, as for
``SimpleCPUOffloadConnector`` (``_vllm_connector_binding``).

Served with one KV cache group, the block size equal to the hash block size and prefix
caching on, as ``tests/test_integrations_vllm_mooncake_store.py`` checks it against vLLM's
``Scheduler``. Refused by name otherwise: several groups (its per-group store projection
and a Mamba group's boundary-state hand-offs, ``take_boundary_state_offloads``, and
finish-time partial tails, ``finalize_partial_tail_offloads``, are not modelled), a
block size over the hash block size (its partial hash hits) and prefix caching off (not
checked). Imported only by ``_vllm_connector_binding``, so vLLM is installed when this
runs."""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

from tokenyard.errors import ConfigError

_FIELD = "kv_transfer_config.kv_connector"
_MOONCAKE_STORE = "MooncakeStoreConnector"


def mooncake_store_served(cls: type[Any]) -> bool:
    """Whether ``cls`` is vLLM's own ``MooncakeStoreConnector`` (not a subclass, which may
    read more of the pool), overriding only ``bind_gpu_block_pool`` of vLLM's binds."""
    return (
        cls.__name__ == _MOONCAKE_STORE
        and cls.__module__.startswith("vllm.distributed.kv_transfer.kv_connector.v1.mooncake.")
        and cls.bind_kv_cache_manager is KVConnectorBase_V1.bind_kv_cache_manager
    )


def refuse_mooncake_store_layout(leaf: Any, where: str, view: Any) -> None:
    """The Mooncake store connector beside what its pinning is not checked with.

    Raises:
        ConfigError (field ``kv_transfer_config.kv_connector``, value the class): several
            KV cache groups, a block size other than the hash block size, or prefix
            caching off.
    """
    config = view.kv_cache_config
    groups = len(config.kv_cache_groups)
    block_size = config.kv_cache_groups[0].kv_cache_spec.block_size if groups else 0
    hash_block_size = view.block_pool.hash_block_size
    reason = None
    if groups != 1:
        reason = (
            f"beside {groups} KV cache groups (served with one: its per-group store "
            "projection, a Mamba group's boundary-state hand-offs and finish-time partial "
            "tails are not modelled)"
        )
    elif block_size != hash_block_size:
        reason = (
            f"with block_size {block_size} over hash_block_size {hash_block_size} (its "
            "partial hash hits are not modelled; served with them equal)"
        )
    elif not leaf._vllm_config.cache_config.enable_prefix_caching:
        reason = "without prefix caching (not checked against vLLM's scheduler)"
    if reason is not None:
        raise ConfigError(
            f"{_FIELD}: {type(leaf).__name__}{where} is not served {reason}",
            field=_FIELD,
            value=type(leaf).__name__,
        )
