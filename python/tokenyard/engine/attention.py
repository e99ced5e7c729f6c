"""Paged attention for one engine step: the metadata the kernels need and the backend that
calls them.

A step's tokens are flattened with the decode rows first (one query token each, run through
``paged_decode_attention``) and then the prefill chunks (ragged, run through
``paged_prefill_attention``), so each kernel gets one contiguous slice of the queries.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Literal

import torch

from tokenyard.errors import ConfigError

__all__ = ["AttentionBackend", "AttentionMetadata", "BackendName"]

BackendName = Literal["triton", "torch"]


@dataclass
class AttentionMetadata:
    """Where each token's K/V goes and what each query attends to, on the model's device.

    ``slot_mapping[t]`` is ``block_id * block_size + offset`` for token ``t`` (-1 for padding
    rows, which write nothing). The first ``num_decode_tokens`` rows are decodes: row ``i``
    attends to ``decode_context_lens[i]`` tokens through ``decode_block_tables[i]`` (0 for a
    padding row). The rest are prefill chunks delimited by ``prefill_query_start_loc``; chunk
    ``j`` ends at position ``prefill_seq_lens[j] - 1`` of its sequence.
    """

    slot_mapping: torch.Tensor
    num_decode_tokens: int
    decode_block_tables: torch.Tensor
    decode_context_lens: torch.Tensor
    prefill_block_tables: torch.Tensor
    prefill_query_start_loc: torch.Tensor
    prefill_seq_lens: torch.Tensor

    @property
    def num_prefills(self) -> int:
        return int(self.prefill_seq_lens.shape[0])


class AttentionBackend:
    """Runs the three paged-attention operations with the Triton kernels (``"triton"``) or
    their plain torch references (``"torch"``); both take the same arguments."""

    def __init__(self, name: BackendName):
        self.name = name
        self._ops = _load_ops(name)

    def store_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        self._ops.store_kv(key, value, k_cache, v_cache, slot_mapping)

    def attend(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """Attention output ``[num_tokens, num_heads, head_dim]`` for every query row."""
        num_decode = metadata.num_decode_tokens
        parts = []
        if num_decode:
            parts.append(
                self._ops.paged_decode_attention(
                    query[:num_decode],
                    k_cache,
                    v_cache,
                    metadata.decode_block_tables,
                    metadata.decode_context_lens,
                )
            )
        if metadata.num_prefills:
            parts.append(
                self._ops.paged_prefill_attention(
                    query[num_decode:],
                    k_cache,
                    v_cache,
                    metadata.prefill_block_tables,
                    metadata.prefill_query_start_loc,
                    metadata.prefill_seq_lens,
                )
            )
        return parts[0] if len(parts) == 1 else torch.cat(parts)


def _load_ops(name: str) -> ModuleType:
    if name == "triton":
        import tokenyard.kernels as kernels

        return kernels
    if name == "torch":
        import tokenyard.kernels.reference as reference

        return reference
    raise ConfigError(
        f"attention_backend must be 'triton', 'torch' or 'auto', got {name!r}",
        field="attention_backend",
        value=repr(name),
    )
