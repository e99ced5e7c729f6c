"""What ``tokenyard profile`` times for each operation: one decoder layer sharded as a TP
worker holds it (heads / TP, KV heads ceil(kv / TP), intermediate and vocab / TP), with
random weights and activations (timing does not depend on their values), one closure per
(operation, shape)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from tokenyard.errors import ConfigError
from tokenyard.profiler.grid import ProfileGrid

if TYPE_CHECKING:
    import torch

__all__ = [
    "BLOCK_SIZE",
    "Case",
    "CaseBuilder",
    "ModelShape",
    "Shard",
    "comm_cases",
    "comms_available",
    "shard_model",
]

BLOCK_SIZE = 16  # KV-cache block size for kv_store and the Triton kernels


class ModelShape(Protocol):
    """What the profiler reads from a model (a catalog ``ModelSpec`` or any look-alike).

    ``head_dim`` (default hidden_size // num_heads), ``num_experts`` and
    ``experts_per_token`` (default 1) and ``name`` are read when present.
    """

    @property
    def hidden_size(self) -> int: ...
    @property
    def num_heads(self) -> int: ...
    @property
    def num_kv_heads(self) -> int: ...
    @property
    def intermediate_size(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...


@dataclass(frozen=True)
class Shard:
    """One TP worker's slice of a layer."""

    name: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    vocab: int
    experts: int
    experts_per_token: int
    model_heads: int
    model_kv_heads: int
    model_inter: int


def shard_model(model: ModelShape, tp: int) -> Shard:
    name = str(getattr(model, "name", "custom"))
    values = {
        "hidden_size": model.hidden_size,
        "num_heads": model.num_heads,
        "num_kv_heads": model.num_kv_heads,
        "intermediate_size": model.intermediate_size,
        "vocab_size": model.vocab_size,
    }
    for key, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(
                f"model.{key}: expected a positive integer, got {v!r}",
                field=f"model.{key}",
                value=repr(v),
            )
    if model.num_heads % tp:
        raise ConfigError(
            f"--tp: {model.num_heads} attention heads of {name} do not split over "
            f"tensor_parallel_size {tp}",
            field="tensor_parallel_size",
            value=str(tp),
        )
    head_dim = int(getattr(model, "head_dim", 0) or model.hidden_size // model.num_heads)
    experts = int(getattr(model, "num_experts", 1) or 1)
    return Shard(
        name=name,
        hidden=model.hidden_size,
        heads=model.num_heads // tp,
        kv_heads=-(-model.num_kv_heads // tp),
        head_dim=head_dim,
        inter=-(-model.intermediate_size // tp),
        vocab=-(-model.vocab_size // tp),
        experts=experts,
        experts_per_token=int(getattr(model, "experts_per_token", 1) or 1),
        model_heads=model.num_heads,
        model_kv_heads=model.num_kv_heads,
        model_inter=model.intermediate_size,
    )


@dataclass(frozen=True)
class Case:
    """One timed shape: ``make()`` allocates the inputs and returns the function to time."""

    op: str
    shape: dict[str, int]
    bytes_needed: int
    make: Callable[[], Callable[[], object]]


class CaseBuilder:
    """Makes the timed closures for one shard; tensors are allocated per shape."""

    def __init__(self, s: Shard, dtype: torch.dtype, dev: torch.device, backend: str) -> None:
        import torch

        self.s = s
        self.dtype = dtype
        self.dev = dev
        self.backend = backend
        self.esize = torch.empty((), dtype=dtype).element_size()

    def rand(self, *shape: int) -> torch.Tensor:
        import torch

        return torch.empty(shape, dtype=self.dtype, device=self.dev).uniform_(-0.05, 0.05)

    def cases(self, grid: ProfileGrid) -> Iterator[Case]:
        s, e = self.s, self.esize
        h = s.hidden
        q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
        moe = s.experts > 1
        for n in grid.num_tokens:
            shape = {"num_tokens": n}
            rows = n * s.experts_per_token if moe else n
            yield Case("embedding", shape, (s.vocab * h + 2 * n * h) * e, self.embedding(n))
            yield Case("input_norm", shape, 3 * n * h * e, self.norm(n))
            yield Case(
                "qkv_proj", shape, self.gemm_bytes(n, h, q + 2 * kv), self.gemm(n, h, q + 2 * kv)
            )
            yield Case("rope", shape, 3 * n * (q + kv) * e, self.rope(n))
            yield Case("kv_store", shape, 6 * (n + BLOCK_SIZE) * kv * e, self.kv_store(n))
            yield Case("o_proj", shape, self.gemm_bytes(n, q, h), self.gemm(n, q, h))
            yield Case("post_attn_norm", shape, 3 * n * h * e, self.norm(n))
            if moe:
                yield Case(
                    "gate_up_proj",
                    shape,
                    self.moe_bytes(rows, h, 2 * s.inter),
                    self.moe_gemm(rows, h, 2 * s.inter),
                )
            else:
                yield Case(
                    "gate_up_proj",
                    shape,
                    self.gemm_bytes(n, h, 2 * s.inter),
                    self.gemm(n, h, 2 * s.inter),
                )
            yield Case("act", shape, 4 * rows * s.inter * e, self.act(rows))
            if moe:
                yield Case(
                    "down_proj",
                    shape,
                    self.moe_bytes(rows, s.inter, h),
                    self.moe_gemm(rows, s.inter, h),
                )
            else:
                yield Case(
                    "down_proj", shape, self.gemm_bytes(n, s.inter, h), self.gemm(n, s.inter, h)
                )
            yield Case("residual_add", shape, 3 * n * h * e, self.add(n))
            yield Case("lm_head", shape, self.gemm_bytes(n, h, s.vocab), self.gemm(n, h, s.vocab))
        for b in grid.prefill_batch_sizes:
            for c in grid.prefill_chunk_sizes:
                for ctx in grid.prefill_context_lens:
                    shape = {"batch_size": b, "chunk_size": c, "context_len": ctx}
                    yield Case(
                        "attn_prefill",
                        shape,
                        self.prefill_bytes(b, c, ctx),
                        self.prefill(b, c, ctx),
                    )
        for b in grid.decode_batch_sizes:
            for ctx in grid.decode_context_lens:
                shape = {"batch_size": b, "context_len": ctx}
                yield Case("attn_decode", shape, self.decode_bytes(b, ctx), self.decode(b, ctx))

    # -- sizes --

    def gemm_bytes(self, n: int, k: int, m: int) -> int:
        return (n * k + k * m + n * m) * self.esize

    def moe_bytes(self, rows: int, k: int, m: int) -> int:
        active = min(self.s.experts, rows)
        per = -(-rows // active)
        return (active * (per * k + k * m + per * m)) * self.esize

    def kv_bytes(self, b: int, tokens: int) -> int:
        s = self.s
        expand = 1 if self.backend == "triton" else s.heads // max(s.kv_heads, 1) + 1
        return 2 * b * (tokens + BLOCK_SIZE) * s.kv_heads * s.head_dim * self.esize * expand

    def prefill_bytes(self, b: int, c: int, ctx: int) -> int:
        s = self.s
        total = self.kv_bytes(b, ctx + c) + 2 * b * c * s.heads * s.head_dim * self.esize
        if self.backend == "torch" and (self.dev.type == "cpu" or ctx > 0):
            # The math path materialises scores; a mask is c x (ctx + c) either way.
            total += b * s.heads * c * (ctx + c) * 4 + c * (ctx + c)
        return total

    def decode_bytes(self, b: int, ctx: int) -> int:
        s = self.s
        total = self.kv_bytes(b, ctx) + 2 * b * s.heads * s.head_dim * self.esize
        if self.dev.type == "cpu":
            total += b * s.heads * ctx * 4
        return total

    # -- closures --

    def gemm(self, n: int, k: int, m: int) -> Callable[[], Callable[[], object]]:
        def make() -> Callable[[], object]:
            import torch

            x, w = self.rand(n, k), self.rand(m, k)
            out = torch.empty(n, m, dtype=self.dtype, device=self.dev)
            return lambda: torch.matmul(x, w.t(), out=out)

        return make

    def moe_gemm(self, rows: int, k: int, m: int) -> Callable[[], Callable[[], object]]:
        # Approximation: the routed rows split evenly over min(experts, rows) active experts,
        # one batched GEMM; the router and the token permutation are not timed.
        def make() -> Callable[[], object]:
            import torch

            active = min(self.s.experts, rows)
            per = -(-rows // active)
            x, w = self.rand(active, per, k), self.rand(active, k, m)
            out = torch.empty(active, per, m, dtype=self.dtype, device=self.dev)
            return lambda: torch.bmm(x, w, out=out)

        return make

    def embedding(self, n: int) -> Callable[[], Callable[[], object]]:
        def make() -> Callable[[], object]:
            import torch

            w = self.rand(self.s.vocab, self.s.hidden)
            ids = torch.randint(0, self.s.vocab, (n,), device=self.dev)
            return lambda: torch.index_select(w, 0, ids)

        return make

    def norm(self, n: int) -> Callable[[], Callable[[], object]]:
        def make() -> Callable[[], object]:
            import torch

            x, w = self.rand(n, self.s.hidden), self.rand(self.s.hidden)
            dtype = self.dtype

            def rms_norm() -> object:
                xf = x.float()
                var = xf.pow(2).mean(-1, keepdim=True)
                return (xf * torch.rsqrt(var + 1e-6)).to(dtype) * w

            return rms_norm

        return make

    def rope(self, n: int) -> Callable[[], Callable[[], object]]:
        def make() -> Callable[[], object]:
            import torch

            s = self.s
            half = s.head_dim // 2
            q, k = self.rand(n, s.heads, s.head_dim), self.rand(n, s.kv_heads, s.head_dim)
            cos, sin = self.rand(max(n, 4096), half), self.rand(max(n, 4096), half)
            pos = torch.randint(0, cos.shape[0], (n,), device=self.dev)

            def rotate(x: torch.Tensor, c: torch.Tensor, s_: torch.Tensor) -> torch.Tensor:
                x1, x2 = x[..., :half], x[..., half : 2 * half]
                return torch.cat((x1 * c - x2 * s_, x2 * c + x1 * s_), dim=-1)

            def apply() -> object:
                c, s_ = cos[pos].unsqueeze(1), sin[pos].unsqueeze(1)
                return rotate(q, c, s_), rotate(k, c, s_)

            return apply

        return make

    def act(self, rows: int) -> Callable[[], Callable[[], object]]:
        def make() -> Callable[[], object]:
            import torch

            gu = self.rand(rows, 2 * self.s.inter)
            g, u = gu[:, : self.s.inter], gu[:, self.s.inter :]
            return lambda: torch.nn.functional.silu(g) * u

        return make

    def add(self, n: int) -> Callable[[], Callable[[], object]]:
        def make() -> Callable[[], object]:
            x, y = self.rand(n, self.s.hidden), self.rand(n, self.s.hidden)
            return lambda: x + y

        return make

    def _paged_cache(self, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        s = self.s
        num_blocks = -(-num_tokens // BLOCK_SIZE) + 1
        k = self.rand(num_blocks, BLOCK_SIZE, s.kv_heads, s.head_dim)
        return k, self.rand(num_blocks, BLOCK_SIZE, s.kv_heads, s.head_dim), num_blocks

    def kv_store(self, n: int) -> Callable[[], Callable[[], object]]:
        def make() -> Callable[[], object]:
            import torch

            s = self.s
            k_cache, v_cache, num_blocks = self._paged_cache(n)
            key, value = self.rand(n, s.kv_heads, s.head_dim), self.rand(n, s.kv_heads, s.head_dim)
            slots = torch.randperm(num_blocks * BLOCK_SIZE, device=self.dev)[:n]
            if self.backend == "triton":
                from tokenyard.kernels import store_kv

                return lambda: store_kv(key, value, k_cache, v_cache, slots)
            k_flat = k_cache.view(-1, s.kv_heads, s.head_dim)
            v_flat = v_cache.view(-1, s.kv_heads, s.head_dim)

            def store() -> object:
                k_flat.index_copy_(0, slots, key)
                return v_flat.index_copy_(0, slots, value)

            return store

        return make

    def _block_tables(self, b: int, tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        import torch

        per_seq = -(-tokens // BLOCK_SIZE)
        k_cache, v_cache, num_blocks = self._paged_cache(b * per_seq * BLOCK_SIZE)
        perm = torch.randperm(num_blocks, device=self.dev)[: b * per_seq]
        return k_cache, v_cache, perm.view(b, per_seq).to(torch.int32)

    def prefill(self, b: int, c: int, ctx: int) -> Callable[[], Callable[[], object]]:
        def make() -> Callable[[], object]:
            import torch

            s = self.s
            if self.backend == "triton":
                from tokenyard.kernels import paged_prefill_attention

                k_cache, v_cache, tables = self._block_tables(b, ctx + c)
                query = self.rand(b * c, s.heads, s.head_dim)
                starts = torch.arange(0, b * c + 1, c, dtype=torch.int32, device=self.dev)
                seq_lens = torch.full((b,), ctx + c, dtype=torch.int32, device=self.dev)
                return lambda: paged_prefill_attention(
                    query, k_cache, v_cache, tables, starts, seq_lens
                )
            q = self.rand(b, s.heads, c, s.head_dim)
            k = self.rand(b, s.kv_heads, ctx + c, s.head_dim)
            v = self.rand(b, s.kv_heads, ctx + c, s.head_dim)
            if ctx == 0:
                return lambda: _sdpa(q, k, v, is_causal=True)
            # Query i sits at position ctx + i and sees keys 0..ctx + i.
            keys = torch.arange(ctx + c, device=self.dev)
            mask = keys[None, :] <= (ctx + torch.arange(c, device=self.dev))[:, None]
            return lambda: _sdpa(q, k, v, attn_mask=mask)

        return make

    def decode(self, b: int, ctx: int) -> Callable[[], Callable[[], object]]:
        def make() -> Callable[[], object]:
            import torch

            s = self.s
            if self.backend == "triton":
                from tokenyard.kernels import paged_decode_attention

                k_cache, v_cache, tables = self._block_tables(b, ctx)
                query = self.rand(b, s.heads, s.head_dim)
                lens = torch.full((b,), ctx, dtype=torch.int32, device=self.dev)
                return lambda: paged_decode_attention(query, k_cache, v_cache, tables, lens)
            q = self.rand(b, s.heads, 1, s.head_dim)
            k = self.rand(b, s.kv_heads, ctx, s.head_dim)
            v = self.rand(b, s.kv_heads, ctx, s.head_dim)
            return lambda: _sdpa(q, k, v)

        return make


def _sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
) -> torch.Tensor:
    import torch.nn.functional as F

    gqa = q.shape[1] != k.shape[1]
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, is_causal=is_causal, enable_gqa=gqa
    )


def comms_available() -> bool:
    """Whether all-reduce / send-recv can be timed: torch.distributed initialised, > 1 rank."""
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)


def comm_cases(grid: ProfileGrid, s: Shard, dtype: torch.dtype, dev: torch.device) -> list[Case]:
    """All-reduce over every rank and send/recv rank 0 -> 1 of activation-sized payloads."""
    if not comms_available():
        return []
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    rank = dist.get_rank()
    esize = torch.empty((), dtype=dtype).element_size()
    cases = []
    for n in grid.num_tokens:
        num_bytes = n * s.hidden * esize

        def make_all_reduce(n: int = n) -> Callable[[], object]:
            buf = torch.empty(n * s.hidden, dtype=dtype, device=dev)
            return lambda: dist.all_reduce(buf)

        def make_send_recv(n: int = n) -> Callable[[], object]:
            buf = torch.empty(n * s.hidden, dtype=dtype, device=dev)
            if rank == 0:
                return lambda: dist.send(buf, 1)
            if rank == 1:
                return lambda: dist.recv(buf, 0)
            return lambda: None

        cases.append(
            Case("all_reduce", {"num_bytes": num_bytes, "num_workers": world}, 0, make_all_reduce)
        )
        cases.append(
            Case("send_recv", {"num_bytes": num_bytes, "num_workers": 2}, 0, make_send_recv)
        )
    return cases
