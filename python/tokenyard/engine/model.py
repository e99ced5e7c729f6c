"""A small Llama-shaped decoder (RMSNorm, RoPE, GQA attention, SwiGLU MLP) with deterministic
random weights: nothing is downloaded, and the same seed gives the same model everywhere.

Two forward passes share the weights:
- ``forward`` runs a flattened batch against the paged KV cache through an attention backend
  (the Triton kernels, or their torch references), as a serving engine does;
- ``dense_logits`` runs one sequence with plain causal attention and no cache at all: the
  reference the paged path must agree with token for token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tokenyard.engine.attention import AttentionBackend, AttentionMetadata
from tokenyard.errors import ConfigError

__all__ = ["KvCache", "LlamaModel", "ModelConfig"]


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """The shape of the model. Defaults are tiny, for tests on a CPU."""

    vocab_size: int = 256
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    intermediate_size: int = 128
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    seed: int = 0

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(
                    f"ModelConfig.{name} must be a positive integer, got {value!r}",
                    field=name,
                    value=repr(value),
                )
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"ModelConfig.num_heads={self.num_heads} must be a multiple of "
                f"num_kv_heads={self.num_kv_heads} (grouped-query attention)",
                field="num_heads",
                value=str(self.num_heads),
            )
        if self.head_dim % 2:
            raise ConfigError(
                f"ModelConfig.head_dim must be even for RoPE, got {self.head_dim}",
                field="head_dim",
                value=str(self.head_dim),
            )


@dataclass
class KvCache:
    """One layer's paged KV cache: ``[num_blocks, block_size, num_kv_heads, head_dim]`` each."""

    key: torch.Tensor
    value: torch.Tensor


@dataclass
class _Layer:
    input_norm: torch.Tensor
    qkv_proj: torch.Tensor  # [hidden, (heads + 2 * kv_heads) * head_dim]
    o_proj: torch.Tensor  # [heads * head_dim, hidden]
    post_norm: torch.Tensor
    gate_up_proj: torch.Tensor  # [hidden, 2 * intermediate]
    down_proj: torch.Tensor  # [intermediate, hidden]


class LlamaModel:
    """The decoder's weights and its two forward passes (inference only)."""

    def __init__(self, config: ModelConfig, *, device: torch.device, dtype: torch.dtype):
        self.config = config
        self.device = device
        self.dtype = dtype
        # Weights are drawn in fp32 on the CPU from one generator, so every device and dtype
        # starts from the same numbers.
        gen = torch.Generator().manual_seed(config.seed)
        c = config
        q_size = c.num_heads * c.head_dim
        kv_size = c.num_kv_heads * c.head_dim

        def weight(fan_in: int, fan_out: int) -> torch.Tensor:
            w: torch.Tensor = torch.randn(fan_in, fan_out, generator=gen) / math.sqrt(fan_in)
            return w.to(device=device, dtype=dtype)

        def norm() -> torch.Tensor:
            w = 1.0 + 0.1 * torch.randn(c.hidden_size, generator=gen)
            return w.to(device=device, dtype=dtype)

        self.embed = (torch.randn(c.vocab_size, c.hidden_size, generator=gen)).to(device, dtype)
        self.layers = [
            _Layer(
                input_norm=norm(),
                qkv_proj=weight(c.hidden_size, q_size + 2 * kv_size),
                o_proj=weight(q_size, c.hidden_size),
                post_norm=norm(),
                gate_up_proj=weight(c.hidden_size, 2 * c.intermediate_size),
                down_proj=weight(c.intermediate_size, c.hidden_size),
            )
            for _ in range(c.num_layers)
        ]
        self.final_norm = norm()
        self.lm_head = weight(c.hidden_size, c.vocab_size)
        inv_freq = 1.0 / (
            c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim)
        )
        self._inv_freq = inv_freq.to(device=device, dtype=torch.float32)

    def new_kv_caches(self, num_blocks: int, block_size: int) -> list[KvCache]:
        """Zeroed paged caches for every layer."""
        shape = (num_blocks, block_size, self.config.num_kv_heads, self.config.head_dim)
        return [
            KvCache(
                key=torch.zeros(shape, device=self.device, dtype=self.dtype),
                value=torch.zeros(shape, device=self.device, dtype=self.dtype),
            )
            for _ in range(self.config.num_layers)
        ]

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        metadata: AttentionMetadata,
        kv_caches: list[KvCache],
        backend: AttentionBackend,
    ) -> torch.Tensor:
        """Hidden states ``[num_tokens, hidden]`` of a flattened batch; writes its K/V into
        the paged caches by ``metadata.slot_mapping`` and reads the prefixes from them."""
        hidden = self.embed[input_ids]
        cos, sin = self._rope(positions)
        for layer, cache in zip(self.layers, kv_caches, strict=True):
            q, k, v = self._qkv(layer, hidden, cos, sin)
            backend.store_kv(k, v, cache.key, cache.value, metadata.slot_mapping)
            attn = backend.attend(q, cache.key, cache.value, metadata)
            hidden = self._finish_layer(layer, hidden, attn)
        return _rms_norm(hidden, self.final_norm, self.config.rms_norm_eps)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits for the given hidden states."""
        logits: torch.Tensor = hidden.float() @ self.lm_head.float()
        return logits

    @torch.inference_mode()
    def dense_logits(self, token_ids: list[int]) -> torch.Tensor:
        """Logits ``[len, vocab]`` of one sequence with plain causal attention, no KV cache."""
        input_ids = torch.tensor(token_ids, device=self.device)
        positions = torch.arange(len(token_ids), device=self.device)
        hidden = self.embed[input_ids]
        cos, sin = self._rope(positions)
        group = self.config.num_heads // self.config.num_kv_heads
        for layer in self.layers:
            q, k, v = self._qkv(layer, hidden, cos, sin)
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
            scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * self.config.head_dim**-0.5
            causal = torch.ones(len(token_ids), len(token_ids), device=self.device).tril().bool()
            scores = scores.masked_fill(~causal, float("-inf"))
            attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v.float()).to(self.dtype)
            hidden = self._finish_layer(layer, hidden, attn)
        return self.logits(_rms_norm(hidden, self.final_norm, self.config.rms_norm_eps))

    def _qkv(
        self, layer: _Layer, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        c = self.config
        x = _rms_norm(hidden, layer.input_norm, c.rms_norm_eps)
        qkv = x @ layer.qkv_proj
        q_size, kv_size = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        q = qkv[:, :q_size].view(-1, c.num_heads, c.head_dim)
        k = qkv[:, q_size : q_size + kv_size].view(-1, c.num_kv_heads, c.head_dim)
        v = qkv[:, q_size + kv_size :].reshape(-1, c.num_kv_heads, c.head_dim)
        return _apply_rope(q, cos, sin), _apply_rope(k, cos, sin), v

    def _finish_layer(
        self, layer: _Layer, hidden: torch.Tensor, attn: torch.Tensor
    ) -> torch.Tensor:
        c = self.config
        hidden = hidden + attn.reshape(-1, c.num_heads * c.head_dim) @ layer.o_proj
        x = _rms_norm(hidden, layer.post_norm, c.rms_norm_eps)
        gate, up = (x @ layer.gate_up_proj).chunk(2, dim=-1)
        return hidden + (torch.nn.functional.silu(gate) * up) @ layer.down_proj

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = positions.float()[:, None] * self._inv_freq[None, :]
        return angles.cos(), angles.sin()


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * weight.float()).to(x.dtype)


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, rotate-half convention (Llama/NeoX)."""
    half = x.shape[-1] // 2
    x32 = x.float()
    x1, x2 = x32[..., :half], x32[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)
