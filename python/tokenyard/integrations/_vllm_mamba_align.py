"""vLLM 0.33's Mamba ``align`` split on the adapter: the attributes vLLM's ``Scheduler``
reads in ``_mamba_block_aligned_split`` (``need_mamba_block_aligned_split``,
``use_eagle_block_drop``), kept in step with the core's split (``set_mamba_align``).

vLLM 0.33 sets ``need_mamba_block_aligned_split`` from the model (Mamba layers and
``cache_config.mamba_cache_mode == "align"``); its tests also assign it on a built scheduler
over a full-attention model, and the split then clips chunks alone. Both reach the core.
"""

from __future__ import annotations

from typing import Any

from tokenyard.integrations._vllm_lookahead_config import eagle_block_drop
from tokenyard.integrations._vllm_state import AdapterBase, non_negative


def needs_mamba_split(vllm_config: Any, kv_cache_config: Any) -> bool:
    """vLLM 0.33's ``Scheduler.need_mamba_block_aligned_split``: Mamba layers in the KV cache
    config and ``cache_config.mamba_cache_mode == "align"``."""
    has_mamba = bool(getattr(kv_cache_config, "has_mamba_layers", False))
    mode = getattr(vllm_config.cache_config, "mamba_cache_mode", "none")
    return has_mamba and mode == "align"


class MambaAlign(AdapterBase):
    """The split's two switches, as properties over the core's ``set_mamba_align``."""

    cache_config: Any
    _need_mamba_split: bool = False
    _use_eagle_block_drop: bool = False

    def _init_prefill_stops(self, vllm_config: Any, kv_cache_config: Any) -> None:
        """vLLM 0.33's values at ``Scheduler.__init__``, given to the core."""
        self._use_eagle_block_drop = eagle_block_drop(vllm_config)
        self._need_mamba_split = needs_mamba_split(vllm_config, kv_cache_config)
        self._sync_mamba_align()
        self.num_prefill_lookahead = getattr(vllm_config, "num_prefill_lookahead_tokens", 0)

    @property
    def need_mamba_block_aligned_split(self) -> bool:
        """Whether prefill chunks are clipped as vLLM 0.33's Mamba ``align`` mode clips them
        (``Scheduler._mamba_block_aligned_split``); assignable, from the next step on."""
        return self._need_mamba_split

    @need_mamba_block_aligned_split.setter
    def need_mamba_block_aligned_split(self, value: bool) -> None:
        self._need_mamba_split = bool(value)
        self._sync_mamba_align()

    @property
    def use_eagle_block_drop(self) -> bool:
        """EAGLE's prefix-hit block drop, which moves the split's last reusable state one
        block back; assignable, from the next step on."""
        return self._use_eagle_block_drop

    @use_eagle_block_drop.setter
    def use_eagle_block_drop(self, value: bool) -> None:
        self._use_eagle_block_drop = bool(value)
        self._sync_mamba_align()

    @property
    def num_prefill_lookahead(self) -> int:
        """The drafter's prefill look-ahead (vLLM 0.33's, from
        ``vllm_config.num_prefill_lookahead_tokens``): the encoder window's shift and
        ``_reserve_prefill_lookahead``; assignable, from the next step on."""
        lookahead: int = self._core.num_prefill_lookahead
        return lookahead

    @num_prefill_lookahead.setter
    def num_prefill_lookahead(self, value: int) -> None:
        self._core.num_prefill_lookahead = non_negative(value, "num_prefill_lookahead")

    def _sync_mamba_align(self) -> None:
        """Gives the core the split now in force (on ``cache_config.block_size``, as vLLM's;
        its hash look-ahead is the core's ``num_hash_lookahead_tokens``)."""
        block_size = int(self.cache_config.block_size) if self._need_mamba_split else 0
        self._core.set_mamba_align(block_size, self._use_eagle_block_drop)
