"""Paged-attention kernels against the plain-torch references, and their input errors.

Without a GPU the kernels run in Triton's interpreter (``conftest.py`` sets
``TRITON_INTERPRET=1``), so shapes stay small; with one, the same tests run on "cuda"
and a few longer-context tests join them. Cache memory outside every sequence's context
is NaN, so a kernel reading a key it should not (past a context, an unused block-table
entry, a padding row) turns its output NaN instead of slightly wrong.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tokenyard.errors import InputError  # noqa: E402
from tokenyard.kernels import (  # noqa: E402
    paged_decode_attention,
    paged_prefill_attention,
    reference,
    store_kv,
)
from tokenyard.kv import BlockPool  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICES = ["cuda"] if CUDA else ["cpu"]
ROOT = Path(__file__).resolve().parent.parent

# (block_size, num_heads, num_kv_heads, head_dim): GQA ratios 1, 2, 4, 8; head_dim 80 is
# not a power of two; block size 4 is small and odd-looking.
HEADS = [
    pytest.param(16, 4, 4, 64, id="bs16-h4kv4-d64"),
    pytest.param(8, 4, 2, 80, id="bs8-h4kv2-d80"),
    pytest.param(32, 8, 2, 64, id="bs32-h8kv2-d64"),
    pytest.param(4, 8, 1, 80, id="bs4-h8kv1-d80"),
]
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]
TOLERANCE = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
    torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2},
    torch.float16: {"rtol": 2e-3, "atol": 2e-3},
}


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> Any:
    return torch.device(request.param)


class Paged:
    """A NaN-filled paged cache holding random K/V for sequences of given lengths.

    Each sequence gets a random, disjoint set of block ids (as a pool hands them out);
    unused block-table entries point at a block no sequence owns.
    """

    def __init__(
        self,
        seq_lens: Sequence[int],
        *,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: Any,
        device: Any,
        seed: int = 0,
        extra_blocks: int = 0,
    ) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.block_size = block_size
        need = [-(-n // block_size) for n in seq_lens]
        width = max([*need, 1]) + extra_blocks
        num_blocks = sum(need) + 3
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.k_cache = torch.full(shape, float("nan"), dtype=dtype)
        self.v_cache = torch.full(shape, float("nan"), dtype=dtype)
        ids = torch.randperm(num_blocks, generator=gen).to(torch.int32)
        poison = int(ids[-1])  # owned by nobody, still NaN
        self.block_tables = torch.full((len(seq_lens), width), poison, dtype=torch.int32)
        taken = 0
        for s, (n, k) in enumerate(zip(seq_lens, need, strict=True)):
            self.block_tables[s, :k] = ids[taken : taken + k]
            taken += k
            slots = self.slots(s, 0, n)
            keys = torch.randn((n, num_kv_heads, head_dim), generator=gen).to(dtype)
            values = torch.randn((n, num_kv_heads, head_dim), generator=gen).to(dtype)
            reference.store_kv(keys, values, self.k_cache, self.v_cache, slots)
        self.k_cache = self.k_cache.to(device)
        self.v_cache = self.v_cache.to(device)
        self.block_tables = self.block_tables.to(device)

    def slots(self, seq: int, start: int, end: int) -> Any:
        """Slots of positions ``start..end`` of sequence ``seq`` (int64, on the CPU)."""
        pos = torch.arange(start, end)
        blocks = self.block_tables[seq].cpu().long()[pos // self.block_size]
        return blocks * self.block_size + pos % self.block_size


def randn(shape: Sequence[int], dtype: Any, device: Any, seed: int) -> Any:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(tuple(shape), generator=gen).to(dtype).to(device)


def assert_matches(out: Any, ref: Any, dtype: Any) -> None:
    assert out.dtype == ref.dtype == dtype
    assert not out.isnan().any(), "kernel output has NaN: it read memory outside a context"
    torch.testing.assert_close(out.float(), ref.float(), **TOLERANCE[dtype])


def i32(values: Sequence[int], device: Any) -> Any:
    return torch.tensor(list(values), dtype=torch.int32, device=device)


# --- store_kv ---------------------------------------------------------------------------


@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", DTYPES)
def test_store_kv_writes_slots_and_skips_padding(device: Any, dtype: Any, slot_dtype: Any) -> None:
    num_blocks, block_size, num_kv_heads, head_dim = 6, 4, 2, 80
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = randn(shape, dtype, device, seed=1)
    v_cache = randn(shape, dtype, device, seed=2)
    slots = torch.tensor([5, -1, 23, 0, -1, 9, 12], dtype=slot_dtype, device=device)
    key = randn((7, num_kv_heads, head_dim), dtype, device, seed=3)
    value = randn((7, num_kv_heads, head_dim), dtype, device, seed=4)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()

    store_kv(key, value, k_cache, v_cache, slots)
    reference.store_kv(key, value, k_ref, v_ref, slots)

    assert torch.equal(k_cache, k_ref)
    assert torch.equal(v_cache, v_ref)
    # Slot 23 is the last one: block 5, offset 3. Padding rows wrote nothing.
    assert torch.equal(k_cache[5, 3], key[2])
    assert torch.equal(v_cache[0, 0], value[3])


def test_store_kv_skips_slots_past_the_cache(device: Any) -> None:
    k_cache = randn((2, 4, 1, 64), torch.float32, device, seed=1)
    v_cache = randn((2, 4, 1, 64), torch.float32, device, seed=2)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    key = randn((2, 1, 64), torch.float32, device, seed=3)
    store_kv(key, key, k_cache, v_cache, torch.tensor([8, 1000], device=device))
    assert torch.equal(k_cache, before_k)
    assert torch.equal(v_cache, before_v)


def test_store_kv_takes_strided_views(device: Any) -> None:
    """key/value as slices of a fused qkv projection; caches as halves of one kv tensor."""
    num_tokens, num_heads, num_kv_heads, head_dim = 5, 4, 2, 64
    qkv = randn((num_tokens, num_heads + 2 * num_kv_heads, head_dim), torch.float32, device, 1)
    key, value = qkv[:, num_heads : num_heads + 2], qkv[:, num_heads + 2 :]
    kv_cache = torch.zeros((3, 2, 4, num_kv_heads, head_dim), device=device)
    k_cache, v_cache = kv_cache[:, 0], kv_cache[:, 1]
    slots = torch.tensor([11, 0, -1, 4, 7], device=device)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    store_kv(key, value, k_cache, v_cache, slots)
    reference.store_kv(key, value, k_ref, v_ref, slots)
    assert torch.equal(k_cache, k_ref)
    assert torch.equal(v_cache, v_ref)


def test_store_kv_empty_is_a_no_op(device: Any) -> None:
    cache = randn((2, 4, 1, 64), torch.float32, device, seed=1)
    before = cache.clone()
    empty = torch.empty((0, 1, 64), device=device)
    store_kv(empty, empty, cache, cache, torch.empty((0,), dtype=torch.int64, device=device))
    assert torch.equal(cache, before)


# --- decode -----------------------------------------------------------------------------

# Ragged: a padding row (0), one token, shorter than a block, exactly a block, many blocks.
DECODE_LENS = [0, 1, 5, 16, 43, 70]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("block_size", "num_heads", "num_kv_heads", "head_dim"), HEADS)
def test_decode_matches_reference(
    device: Any, dtype: Any, block_size: int, num_heads: int, num_kv_heads: int, head_dim: int
) -> None:
    paged = Paged(
        DECODE_LENS,
        block_size=block_size,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        device=device,
        extra_blocks=2,
    )
    query = randn((len(DECODE_LENS), num_heads, head_dim), dtype, device, seed=7)
    lens = i32(DECODE_LENS, device)
    args = (query, paged.k_cache, paged.v_cache, paged.block_tables, lens)

    out = paged_decode_attention(*args)

    assert_matches(out, reference.paged_decode_attention(*args), dtype)
    assert torch.equal(out[0], torch.zeros_like(out[0])), "padding row must be zeros"


@pytest.mark.parametrize("num_splits", [2, 5])
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_split_kv_matches_reference(device: Any, dtype: Any, num_splits: int) -> None:
    """Flash-decoding: ranges of the context combined by the second kernel."""
    lens = [0, 3, 40, 90]
    paged = Paged(lens, block_size=8, num_kv_heads=2, head_dim=64, dtype=dtype, device=device)
    query = randn((len(lens), 8, 64), dtype, device, seed=3)
    args = (query, paged.k_cache, paged.v_cache, paged.block_tables, i32(lens, device))
    out = paged_decode_attention(*args, num_splits=num_splits)
    assert_matches(out, reference.paged_decode_attention(*args), dtype)
    assert torch.equal(out[0], torch.zeros_like(out[0]))


def test_decode_writes_out_with_scale_and_strided_query(device: Any) -> None:
    """``out=`` is filled (poisoned first), ``scale`` is honoured, query may be a view."""
    lens = [9, 33]
    paged = Paged(
        lens, block_size=16, num_kv_heads=2, head_dim=64, dtype=torch.float32, device=device
    )
    qkv = randn((2, 4 + 2 * 2, 64), torch.float32, device, seed=5)
    query = qkv[:, :4]
    out = torch.full((2, 4, 64), float("nan"), device=device)
    args = (query, paged.k_cache, paged.v_cache, paged.block_tables, i32(lens, device))
    result = paged_decode_attention(*args, scale=0.3, out=out)
    assert result is out
    assert_matches(out, reference.paged_decode_attention(*args, scale=0.3), torch.float32)


def test_decode_fp16(device: Any) -> None:
    lens = [21, 50]
    paged = Paged(
        lens, block_size=16, num_kv_heads=2, head_dim=64, dtype=torch.float16, device=device
    )
    query = randn((2, 8, 64), torch.float16, device, seed=5)
    args = (query, paged.k_cache, paged.v_cache, paged.block_tables, i32(lens, device))
    out = paged_decode_attention(*args)
    assert_matches(out, reference.paged_decode_attention(*args), torch.float16)


def test_decode_no_sequences(device: Any) -> None:
    paged = Paged(
        [], block_size=16, num_kv_heads=1, head_dim=64, dtype=torch.float32, device=device
    )
    query = torch.empty((0, 2, 64), device=device)
    out = paged_decode_attention(
        query, paged.k_cache, paged.v_cache, paged.block_tables, i32([], device)
    )
    assert out.shape == (0, 2, 64)


@pytest.mark.skipif(not CUDA, reason="long contexts are too slow in the interpreter")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lens", [[4000], [1, 2500, 8000, 0], list(range(1, 3000, 37))])
def test_decode_long_contexts_gpu(dtype: Any, lens: list[int]) -> None:
    """The default split choice at lengths where it kicks in (few sequences, long)."""
    paged = Paged(lens, block_size=16, num_kv_heads=8, head_dim=128, dtype=dtype, device="cuda")
    query = randn((len(lens), 32, 128), dtype, "cuda", seed=1)
    args = (query, paged.k_cache, paged.v_cache, paged.block_tables, i32(lens, "cuda"))
    assert_matches(paged_decode_attention(*args), reference.paged_decode_attention(*args), dtype)


# --- prefill ----------------------------------------------------------------------------

# (q_len, seq_len): whole prompt; chunk after a cached prefix; one token; exactly one query
# tile of the interpreter (16); a chunk with a prefix ending mid-block.
PREFILL_CHUNKS = [(23, 23), (19, 60), (1, 37), (16, 16), (5, 13)]


def prefill_inputs(
    chunks: Sequence[tuple[int, int]],
    *,
    block_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: Any,
    device: Any,
    seed: int = 0,
) -> tuple[Any, ...]:
    seq_lens = [seq_len for _, seq_len in chunks]
    paged = Paged(
        seq_lens,
        block_size=block_size,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        device=device,
        seed=seed,
    )
    q_lens = [q_len for q_len, _ in chunks]
    starts = np.concatenate([[0], np.cumsum(q_lens)]).tolist()
    query = randn((starts[-1], num_heads, head_dim), dtype, device, seed=seed + 1)
    return (
        query,
        paged.k_cache,
        paged.v_cache,
        paged.block_tables,
        i32(starts, device),
        i32(seq_lens, device),
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("block_size", "num_heads", "num_kv_heads", "head_dim"), HEADS)
def test_prefill_matches_reference(
    device: Any, dtype: Any, block_size: int, num_heads: int, num_kv_heads: int, head_dim: int
) -> None:
    args = prefill_inputs(
        PREFILL_CHUNKS,
        block_size=block_size,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        device=device,
    )
    out = paged_prefill_attention(*args)
    assert_matches(out, reference.paged_prefill_attention(*args), dtype)


@pytest.mark.parametrize(
    "chunks",
    [
        pytest.param([(1, 1)], id="one-token-prompt"),
        pytest.param([(1, 50), (1, 9), (1, 1)], id="decode-shaped"),
        pytest.param([(40, 40)], id="one-long-prompt"),
        pytest.param([(3, 3), (0, 20), (17, 17)], id="empty-chunk-in-batch"),
    ],
)
def test_prefill_edge_batches(device: Any, chunks: list[tuple[int, int]]) -> None:
    args = prefill_inputs(
        chunks,
        block_size=8,
        num_heads=2,
        num_kv_heads=1,
        head_dim=64,
        dtype=torch.float32,
        device=device,
    )
    out = torch.full_like(args[0], float("nan"))
    paged_prefill_attention(*args, out=out, scale=0.2)
    assert_matches(out, reference.paged_prefill_attention(*args, scale=0.2), torch.float32)


def test_prefill_last_row_equals_decode(device: Any) -> None:
    """The last query of a chunk is a decode step over the same context."""
    chunks = [(12, 30), (7, 7), (20, 52)]
    query, k_cache, v_cache, tables, starts, seq_lens = prefill_inputs(
        chunks,
        block_size=8,
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        dtype=torch.float32,
        device=device,
    )
    prefill = paged_prefill_attention(query, k_cache, v_cache, tables, starts, seq_lens)
    last = starts[1:].long() - 1
    decode = paged_decode_attention(query[last], k_cache, v_cache, tables, seq_lens)
    torch.testing.assert_close(prefill[last], decode, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not CUDA, reason="long contexts are too slow in the interpreter")
@pytest.mark.parametrize("dtype", DTYPES)
def test_prefill_long_chunks_gpu(dtype: Any) -> None:
    chunks = [(700, 700), (333, 2100), (1, 900), (129, 129), (1000, 3000)]
    args = prefill_inputs(
        chunks,
        block_size=16,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        dtype=dtype,
        device="cuda",
    )
    out = paged_prefill_attention(*args)
    assert_matches(out, reference.paged_prefill_attention(*args), dtype)


# --- with tokenyard's block pool --------------------------------------------------------


def test_pool_prefix_hit_prefill_then_decode(device: Any) -> None:
    """Block ids from BlockPool; B reuses A's cached prefix blocks; compared with dense
    attention over contiguous K/V (no block table at all)."""
    block_size, num_heads, num_kv_heads, head_dim = 4, 4, 2, 64
    gen = torch.Generator().manual_seed(0)
    vocab_k = torch.randn((100, num_kv_heads, head_dim), generator=gen)
    vocab_v = torch.randn((100, num_kv_heads, head_dim), generator=gen)
    shape = (16, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), device=device)
    v_cache = torch.full(shape, float("nan"), device=device)
    pool = BlockPool(num_blocks=16, block_size=block_size)

    def table(request: str) -> Any:
        return torch.from_numpy(pool.block_ids(request).astype(np.int32)).to(device)

    def store(tokens: list[int], request: str, start: int) -> None:
        pos = torch.arange(start, len(tokens))
        blocks = table(request).cpu().long()[pos // block_size]
        slots = (blocks * block_size + pos % block_size).to(device)
        ids = torch.tensor(tokens[start:])
        store_kv(vocab_k[ids].to(device), vocab_v[ids].to(device), k_cache, v_cache, slots)

    def dense(tokens: list[int], query: Any) -> Any:
        """Causal attention of the last len(query) tokens over contiguous K/V."""
        ids = torch.tensor(tokens)
        k = vocab_k[ids].repeat_interleave(2, dim=1).to(device)
        v = vocab_v[ids].repeat_interleave(2, dim=1).to(device)
        n, q_len = len(tokens), query.shape[0]
        scores = torch.einsum("qhd,khd->hqk", query, k) * head_dim**-0.5
        mask = torch.arange(n)[None, :] > torch.arange(n - q_len, n)[:, None]
        scores = scores.masked_fill(mask.to(device), float("-inf"))
        return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)

    prompt_a = list(range(1, 15))  # 14 tokens: 3 full blocks + 2
    assert pool.allocate_slots("a", 14, token_ids=np.array(prompt_a)) is not None
    store(prompt_a, "a", 0)
    prompt_b = [*prompt_a[:12], 50, 51, 52, 53, 54]  # shares 3 full blocks
    hit = pool.get_computed_blocks(np.array(prompt_b))
    assert hit.num_computed_tokens == 12
    new_blocks = pool.allocate_slots("b", 5, token_ids=np.array(prompt_b), new_computed_blocks=hit)
    assert new_blocks is not None
    assert torch.equal(table("b")[:3], table("a")[:3])
    store(prompt_b, "b", 12)  # only B's new tokens; its prefix is A's blocks

    query = randn((5, num_heads, head_dim), torch.float32, device, seed=9)
    tables = torch.stack([table("b")])
    out = paged_prefill_attention(
        query, k_cache, v_cache, tables, i32([0, 5], device), i32([17], device)
    )
    torch.testing.assert_close(out, dense(prompt_b, query), rtol=1e-5, atol=1e-5)

    # One decode step for B: a slot for token 18, then attention over all 18.
    tokens_b = [*prompt_b, 60]
    assert pool.allocate_slots("b", 1, token_ids=np.array([60])) is not None
    store(tokens_b, "b", 17)
    query = randn((1, num_heads, head_dim), torch.float32, device, seed=10)
    out = paged_decode_attention(
        query, k_cache, v_cache, torch.stack([table("b")]), i32([18], device)
    )
    torch.testing.assert_close(out, dense(tokens_b, query), rtol=1e-5, atol=1e-5)


# --- input errors -----------------------------------------------------------------------


def decode_args(**change: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "query": torch.zeros((2, 4, 64)),
        "k_cache": torch.zeros((4, 8, 2, 64)),
        "v_cache": torch.zeros((4, 8, 2, 64)),
        "block_tables": torch.zeros((2, 3), dtype=torch.int32),
        "context_lens": torch.zeros((2,), dtype=torch.int32),
    }
    return args | change


def prefill_args(**change: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "query": torch.zeros((5, 4, 64)),
        "k_cache": torch.zeros((4, 8, 2, 64)),
        "v_cache": torch.zeros((4, 8, 2, 64)),
        "block_tables": torch.zeros((2, 3), dtype=torch.int32),
        "query_start_loc": torch.tensor([0, 2, 5], dtype=torch.int32),
        "seq_lens": torch.tensor([2, 3], dtype=torch.int32),
    }
    return args | change


def store_args(**change: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "key": torch.zeros((3, 2, 64)),
        "value": torch.zeros((3, 2, 64)),
        "k_cache": torch.zeros((4, 8, 2, 64)),
        "v_cache": torch.zeros((4, 8, 2, 64)),
        "slot_mapping": torch.zeros((3,), dtype=torch.int64),
    }
    return args | change


BAD_INPUTS: list[Any] = [
    # decode
    (paged_decode_attention, decode_args(query=torch.zeros((2, 64))), "query", "shape (2, 64)"),
    (paged_decode_attention, decode_args(query=np.zeros((2, 4, 64))), "query", "ndarray"),
    (
        paged_decode_attention,
        decode_args(query=torch.zeros((2, 4, 64), dtype=torch.int32)),
        "query",
        "torch.int32",
    ),
    (paged_decode_attention, decode_args(query=torch.zeros((2, 3, 64))), "query", "3"),
    (paged_decode_attention, decode_args(query=torch.zeros((2, 4, 32))), "query", "32"),
    (
        paged_decode_attention,
        decode_args(
            k_cache=torch.zeros((4, 8, 2, 64), dtype=torch.bfloat16),
            v_cache=torch.zeros((4, 8, 2, 64), dtype=torch.bfloat16),
        ),
        "k_cache",
        "torch.bfloat16",
    ),
    (
        paged_decode_attention,
        decode_args(v_cache=torch.zeros((4, 8, 1, 64))),
        "v_cache",
        "(4, 8, 1, 64)",
    ),
    (
        paged_decode_attention,
        decode_args(k_cache=torch.zeros((4, 8, 2, 300)), v_cache=torch.zeros((4, 8, 2, 300))),
        "k_cache",
        "300",
    ),
    (
        paged_decode_attention,
        decode_args(block_tables=torch.zeros((2, 3), dtype=torch.int64)),
        "block_tables",
        "torch.int64",
    ),
    (
        paged_decode_attention,
        decode_args(block_tables=torch.zeros((3, 3), dtype=torch.int32)),
        "block_tables",
        "shape (3, 3)",
    ),
    (
        paged_decode_attention,
        decode_args(context_lens=torch.zeros((2, 1), dtype=torch.int32)),
        "context_lens",
        "shape (2, 1)",
    ),
    (
        paged_decode_attention,
        decode_args(context_lens=torch.zeros((3,), dtype=torch.int32)),
        "context_lens",
        "shape (3,)",
    ),
    (paged_decode_attention, decode_args(scale=-1.0), "scale", "-1.0"),
    (paged_decode_attention, decode_args(scale=float("nan")), "scale", "nan"),
    (paged_decode_attention, decode_args(num_splits=0), "num_splits", "0"),
    (paged_decode_attention, decode_args(out=torch.zeros((2, 4, 63))), "out", "(2, 4, 63)"),
    (
        paged_decode_attention,
        decode_args(out=torch.zeros((2, 4, 64), dtype=torch.float16)),
        "out",
        "torch.float16",
    ),
    # prefill
    (
        paged_prefill_attention,
        prefill_args(query_start_loc=torch.tensor([0, 5], dtype=torch.int32)),
        "query_start_loc",
        "shape (2,)",
    ),
    (
        paged_prefill_attention,
        prefill_args(seq_lens=torch.tensor([2, 3], dtype=torch.int64)),
        "seq_lens",
        "torch.int64",
    ),
    (
        paged_prefill_attention,
        prefill_args(seq_lens=torch.tensor([2], dtype=torch.int32)),
        "seq_lens",
        "shape (1,)",
    ),
    (paged_prefill_attention, prefill_args(query=torch.zeros((5, 5, 64))), "query", "5"),
    # store_kv
    (store_kv, store_args(key=torch.zeros((3, 1, 64))), "key", "shape (3, 1, 64)"),
    (store_kv, store_args(value=torch.zeros((2, 2, 64))), "value", "(2, 2, 64)"),
    (
        store_kv,
        store_args(value=torch.zeros((3, 2, 64), dtype=torch.bfloat16)),
        "value",
        "torch.bfloat16",
    ),
    (
        store_kv,
        store_args(
            key=torch.zeros((3, 2, 64), dtype=torch.float16),
            value=torch.zeros((3, 2, 64), dtype=torch.float16),
        ),
        "key",
        "torch.float16",
    ),
    (
        store_kv,
        store_args(slot_mapping=torch.zeros((3,), dtype=torch.float32)),
        "slot_mapping",
        "torch.float32",
    ),
    (
        store_kv,
        store_args(slot_mapping=torch.zeros((4,), dtype=torch.int32)),
        "slot_mapping",
        "shape (4,)",
    ),
    (store_kv, store_args(k_cache=torch.zeros((4, 8, 2))), "k_cache", "shape (4, 8, 2)"),
]


@pytest.mark.parametrize(("fn", "kwargs", "field", "value"), BAD_INPUTS)
def test_bad_input_names_argument_and_value(
    device: Any, fn: Callable[..., Any], kwargs: dict[str, Any], field: str, value: str
) -> None:
    kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    with pytest.raises(InputError) as info:
        fn(**kwargs)
    assert info.value.field == field
    assert value in str(info.value)
    assert value in (info.value.value or "")


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
def test_mixed_devices_are_refused() -> None:
    args = decode_args()
    args = {k: v.cuda() for k, v in args.items()} | {"context_lens": args["context_lens"]}
    with pytest.raises(InputError, match="context_lens must be on cuda"):
        paged_decode_attention(**args)


# --- the docs' example ------------------------------------------------------------------


def test_docs_example_runs() -> None:
    """docs/kernels.md's ```py blocks (kept out of test_docs.py, which has no torch skip)."""
    blocks = re.findall(r"```py\n(.*?)```", (ROOT / "docs" / "kernels.md").read_text(), re.S)
    assert blocks
    for i, code in enumerate(blocks):
        exec(compile(code, f"kernels.md:{i}", "exec"), {})
