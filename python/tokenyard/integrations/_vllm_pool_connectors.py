"""vLLM 0.33's Mooncake store connector (``MooncakeStoreConnector``,
``vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/``) and UMBP's
(``UMBPStoreConnector``, ``.../v1/umbp/``; ``refuse_umbp_layout``) over the core's pool.

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

Served beside one KV cache group or several attention groups (each group's blocks pinned,
a window's null blocks skipped, as vLLM's ``_reference_save_blocks`` does) or a Mamba
``align`` group beside them (since branch ``storeconn``: vLLM's manager hands each state it
caches to the connector, ``take_boundary_state_offloads``, which the adapter makes from the
core, ``_vllm_boundary_offloads``; the connector stores it as a boundary put pinned with the
store job), prefix caching on or off, with vLLM's ``Scheduler`` and ``AsyncScheduler`` as
``tests/test_integrations_vllm_mooncake_store.py`` checks it. Since branch ``storediff``
the groups are judged by exact class (``_STORE_SERVED_SPECS``: full attention, MLA's, a
sliding window, MLA's sliding window, bounded replay too, which vLLM's store leaves out as
not prefix-cacheable, chunked local attention, Mamba ``align``; before, an ``isinstance``
check let any subclass of the first three through unchecked and refused chunked local
attention), and groups of differing block sizes are served (each group keyed at its own
size, ``chunk_hashes_for_block_size``; hits on the scheduler block size). Refused by name
otherwise: beside a Mamba group in ``none`` mode (vLLM's scheduler half asserts
``align``), beside another kind, and with the connector's own partial hash hits on
(``connector_scheduler.enable_partial_hash_hits``, which the store takes from the engine's
``cache_hit_alignment_tokens``: sub-block hits and finish-time partial tails,
``finalize_partial_tail_offloads`` then ``register_finished_partial_tail``, not modelled;
where vLLM's managers would take fine-grained hits the core refuses the layout first,
``_vllm_block_sizes``). Imported only by
``_vllm_connector_binding``, so vLLM is installed when this runs."""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)

from tokenyard.errors import ConfigError

_FIELD = "kv_transfer_config.kv_connector"
_MOONCAKE_STORE = "MooncakeStoreConnector"
_UMBP = "UMBPStoreConnector"
# The KV cache group kinds the Mooncake store is checked beside against vLLM's
# (tests/test_integrations_vllm_mooncake_store.py); a Mamba group in ``align`` mode only.
_STORE_SERVED_SPECS = (
    FullAttentionSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    SlidingWindowMLASpec,
    ChunkedLocalAttentionSpec,
    MambaSpec,
)


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

    vLLM's ``MooncakeStoreScheduler`` reads a group's kind only to tell Mamba's apart
    (``isinstance(spec, MambaSpec)``: stored from boundary hand-offs, asserted ``align``);
    every other prefix-cacheable kind is stored by its block table, whatever its class.
    The adapter serves the kinds checked against it (``_STORE_SERVED_SPECS``, by exact
    class: a subclass may read differently) and groups of differing block sizes, as long
    as the store's partial hash hits stay off (``enable_partial_hash_hits``, from the
    engine's ``cache_hit_alignment_tokens``), which bring sub-block hits and finish-time
    tails.

    Raises:
        ConfigError (field ``kv_transfer_config.kv_connector``, value the class): a Mamba
            KV cache group in ``none`` mode, a group of a kind not in
            ``_STORE_SERVED_SPECS``, or the store's partial hash hits on beside groups of
            differing block sizes.
    """
    reason = _unserved_store_group(view) or _store_partial_hits(leaf, view)
    if reason is not None:
        raise ConfigError(
            f"{_FIELD}: {type(leaf).__name__}{where} is not served {reason}",
            field=_FIELD,
            value=type(leaf).__name__,
        )


def _unserved_store_group(view: Any) -> str | None:
    """Why a KV cache group is not served beside the Mooncake store, or ``None``."""
    for i, group in enumerate(view.kv_cache_config.kv_cache_groups):
        spec = group.kv_cache_spec
        if isinstance(spec, MambaSpec) and spec.mamba_cache_mode != "align":
            # vLLM's MooncakeStoreScheduler asserts align mode of every Mamba group.
            return (
                f"beside a Mamba KV cache group in mamba_cache_mode "
                f"{spec.mamba_cache_mode!r} (group {i}: vLLM's MooncakeStoreScheduler "
                "requires mamba_cache_mode='align')"
            )
        if type(spec) not in _STORE_SERVED_SPECS:
            return (
                f"beside a {type(spec).__name__} KV cache group (group {i}: served beside "
                f"{', '.join(c.__name__ for c in _STORE_SERVED_SPECS)} groups, the kinds "
                "it is checked with)"
            )
    return None


def _store_partial_hits(leaf: Any, view: Any) -> str | None:
    """Why the groups' block sizes are not served, or ``None``: one group over the hash
    block size (vLLM's ``resolve_kv_cache_block_sizes`` rejects it, so the connector would
    key at another size than the requests' hashes), or the connector's own partial hash
    hits on (``connector_scheduler.enable_partial_hash_hits``: the Mooncake store's from
    ``kv_cache_config.cache_hit_alignment_tokens`` below the scheduler block, which the
    engine sets only where the coordinator's managers take fine-grained hits with prefix
    caching on; UMBP's from its extra config), which hit inside a block and publish
    finish-time partial tails (``register_finished_partial_tail``), not modelled. The
    core's own partial hits are refused before (``_vllm_block_sizes``)."""
    groups = view.kv_cache_config.kv_cache_groups
    hash_block_size = view.block_pool.hash_block_size
    if len(groups) == 1 and groups[0].kv_cache_spec.block_size != hash_block_size:
        return (
            f"with one KV cache group of block_size {groups[0].kv_cache_spec.block_size} "
            f"over hash_block_size {hash_block_size} (vLLM's resolve_kv_cache_block_sizes "
            "rejects a hash block size other than the block size of a single group)"
        )
    sizes = sorted({g.kv_cache_spec.block_size for g in groups})
    if len(sizes) == 1 or not getattr(leaf.connector_scheduler, "enable_partial_hash_hits", False):
        return None
    return (
        f"with its partial hash hits on beside groups of block sizes {sizes} over "
        f"hash_block_size {hash_block_size} (sub-block hits and finish-time partial tails, "
        "register_finished_partial_tail, are not modelled; groups of differing block sizes "
        "are served with them off)"
    )


def umbp_served(cls: type[Any]) -> bool:
    """Whether ``cls`` is vLLM's own ``UMBPStoreConnector`` (not a subclass)."""
    return cls.__name__ == _UMBP and cls.__module__.startswith(
        "vllm.distributed.kv_transfer.kv_connector.v1.umbp."
    )


def refuse_umbp_layout(leaf: Any, where: str, view: Any) -> None:
    """UMBP's scheduler half (``umbp/scheduler.py``, ``UMBPStoreConnectorScheduler``) beside
    what it is not checked with. Served beside the Mooncake store's kinds by exact class
    (``_umbp_served_spec``; MLA's and chunked local attention's since branch ``umbpkinds``:
    it reads a group's class only to tell Mamba ``align`` apart and to skip its lookup
    coordinator for one full-attention group, the rest through vLLM's own managers), several
    groups since branch ``storeconn`` (its lookup coordinator probes the local prefix cache
    per group, ``umbp_probes_local_cache``; beside Mamba it stores the states handed off),
    groups of differing block sizes with its ``enable_partial_hash_hits``
    off (since branch ``storediff``: each group keyed at its own ``group_block_sizes``),
    prefix caching on or off, KV cache events on or off (since branch ``storeconn``): its
    store events pin blocks as the Mooncake store's jobs do (``touch`` in
    ``build_connector_meta``, ``free_blocks`` once every worker reported the event in
    ``UMBPConnectorWorkerMetadata.store_events``).

    Raises:
        ConfigError (field ``kv_transfer_config.kv_connector``, value the class): a group
            of another kind (or a Mamba group in ``none`` mode), or its own
            ``enable_partial_hash_hits`` beside differing block sizes
            (``_store_partial_hits``: sub-block hits and partial tails, not modelled).
    """
    config = view.kv_cache_config
    specs = [group.kv_cache_spec for group in config.kv_cache_groups]
    reason = None
    unserved = next(
        ((i, spec) for i, spec in enumerate(specs) if not _umbp_served_spec(spec)), None
    )
    if unserved is not None:
        i, spec = unserved
        kind = type(spec).__name__
        if isinstance(spec, MambaSpec):
            kind = f"{kind} (mamba_cache_mode {spec.mamba_cache_mode!r})"
        reason = (
            f"beside a {kind} KV cache group (group {i}: served beside "
            f"{', '.join(c.__name__ for c in _STORE_SERVED_SPECS if c is not MambaSpec)} "
            "and align-mode MambaSpec groups, the kinds it is checked with)"
        )
    else:
        reason = _store_partial_hits(leaf, view)
    if reason is not None:
        raise ConfigError(
            f"{_FIELD}: {type(leaf).__name__}{where} is not served {reason}",
            field=_FIELD,
            value=type(leaf).__name__,
        )


def _umbp_served_spec(spec: Any) -> bool:
    """A KV cache group kind UMBP's scheduler half is checked beside: the Mooncake store's
    (``_STORE_SERVED_SPECS``, by exact class), a Mamba group in ``align`` mode only (its
    states stored from vLLM's hand-offs; a ``none`` group would be stored by position)."""
    if isinstance(spec, MambaSpec):
        return bool(spec.mamba_cache_mode == "align")
    return type(spec) in _STORE_SERVED_SPECS


def umbp_probes_local_cache(connector: Any) -> bool:
    """Whether ``connector`` (a leaf) is UMBP's with a lookup coordinator of its own
    (several KV cache groups, or one of another kind than full attention): its lookup then
    probes the local prefix cache per group (``bind_kv_cache_manager``'s
    ``local_cache_hit``: ``coordinator.single_type_managers[g].block_pool
    .get_cached_block``), which the pool view answers from vLLM's hashes the adapter
    indexes."""
    scheduler = getattr(connector, "connector_scheduler", None)
    return (
        umbp_served(type(connector))
        and scheduler is not None
        and getattr(scheduler, "_lookup_coordinator", None) is not None
    )
