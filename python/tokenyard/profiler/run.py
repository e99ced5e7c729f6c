"""Time one decoder layer's operations, shape by shape, for the profiled predictor.

Owns the timing loop and what is timed for each op (see ``docs/profiling.md``); the output
rows are tokenyard profile format v1 (:data:`tokenyard.predictor.profiles.OUR_COLUMNS`),
read back by :func:`tokenyard.predictor.profiles.read_profiles`. Invariant: every row's
features are the ones its op is read with, and each time is the median of ``repeats``
timed runs after ``warmup`` untimed ones, in milliseconds.

Weights and activations are random (timing does not depend on their values); one layer is
sharded for ``tensor_parallel_size`` as a TP worker holds it (heads / TP, KV heads
ceil(kv / TP), intermediate and vocab / TP).
"""

from __future__ import annotations

import csv
import datetime
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from tokenyard.errors import ConfigError
from tokenyard.predictor.profiles import OUR_COLUMNS

if TYPE_CHECKING:
    import torch

__all__ = [
    "GRIDS",
    "ModelShape",
    "ProfileGrid",
    "ProfileRow",
    "profile_model",
    "write_profile",
]

ProfileRow = dict[str, Any]
Progress = Callable[[int, int, str], None]

DTYPES = ("bf16", "fp16", "fp32")
BACKENDS = ("torch", "triton")
BLOCK_SIZE = 16  # KV-cache block size for kv_store and the Triton kernels
CPU_MEMORY_CAP_BYTES = 2 << 30


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
class ProfileGrid:
    """The shapes to time. Shapes whose tensors would exceed the memory cap are skipped.

    ``num_tokens`` is for the GEMMs, elementwise ops, ``kv_store`` and the embedding /
    LM head (and, times hidden_size and the dtype's bytes, the all-reduce payloads).
    Prefill: every batch size x chunk size x cached-prefix length; decode: every batch size
    x context length.
    """

    num_tokens: tuple[int, ...]
    prefill_batch_sizes: tuple[int, ...]
    prefill_chunk_sizes: tuple[int, ...]
    prefill_context_lens: tuple[int, ...]
    decode_batch_sizes: tuple[int, ...]
    decode_context_lens: tuple[int, ...]

    @staticmethod
    def preset(name: str) -> ProfileGrid:
        """``tiny`` (seconds on a CPU with a small model; for tests) or ``default``."""
        if name not in GRIDS:
            raise ConfigError(
                f"--grid: unknown grid {name!r}; expected one of {', '.join(GRIDS)}",
                field="grid",
                value=repr(name),
            )
        return GRIDS[name]

    def __post_init__(self) -> None:
        for field in (
            "num_tokens",
            "prefill_batch_sizes",
            "prefill_chunk_sizes",
            "prefill_context_lens",
            "decode_batch_sizes",
            "decode_context_lens",
        ):
            values = getattr(self, field)
            low = 0 if field == "prefill_context_lens" else 1
            if any(isinstance(v, bool) or not isinstance(v, int) or v < low for v in values):
                raise ConfigError(
                    f"ProfileGrid.{field}: expected integers >= {low}, got {values!r}",
                    field=f"grid.{field}",
                    value=repr(values),
                )


def _powers_and_midpoints(high: int) -> tuple[int, ...]:
    out = {1}
    p = 1
    while p < high:
        out.update((p, p + p // 2) if p >= 2 else (p,))
        p *= 2
    out.add(high)
    return tuple(sorted(v for v in out if v <= high))


def _powers(low: int, high: int) -> tuple[int, ...]:
    return tuple(2**k for k in range(int(math.log2(low)), int(math.log2(high)) + 1))


GRIDS: dict[str, ProfileGrid] = {
    "tiny": ProfileGrid(
        num_tokens=(1, 8, 32),
        prefill_batch_sizes=(1, 2),
        prefill_chunk_sizes=(8,),
        prefill_context_lens=(0, 16),
        decode_batch_sizes=(1, 4),
        decode_context_lens=(16, 64),
    ),
    "default": ProfileGrid(
        num_tokens=_powers_and_midpoints(16384),
        prefill_batch_sizes=(1, 4),
        prefill_chunk_sizes=_powers(64, 8192),
        prefill_context_lens=(0, *_powers(512, 32768)),
        decode_batch_sizes=_powers(1, 512),
        decode_context_lens=_powers(128, 32768),
    ),
}


@dataclass(frozen=True)
class _Shard:
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


def _shard(model: ModelShape, tp: int) -> _Shard:
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
    return _Shard(
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
class _Case:
    """One timed shape: ``make()`` allocates the inputs and returns the function to time."""

    op: str
    shape: dict[str, int]
    bytes_needed: int
    make: Callable[[], Callable[[], object]]


def profile_model(
    model: ModelShape,
    *,
    tensor_parallel_size: int = 1,
    dtype: str = "bf16",
    device: str | None = None,
    grid: ProfileGrid | None = None,
    backend: str = "torch",
    repeats: int = 10,
    warmup: int = 3,
    memory_cap_bytes: int | None = None,
    device_label: str | None = None,
    progress: Progress | None = None,
    rounds: int | None = None,
) -> list[ProfileRow]:
    """Time every operation of one decoder layer of ``model`` over ``grid``'s shapes.

    Args:
        model: a catalog ``ModelSpec`` or any object with its shape attributes.
        tensor_parallel_size: time one TP worker's shard.
        dtype: ``bf16``, ``fp16`` or ``fp32``.
        device: ``cuda``, ``cpu`` or None (CUDA when available).
        grid: the shapes (default: ``ProfileGrid.preset("default")``).
        backend: ``torch`` (SDPA over contiguous K/V, index-copy KV store) or ``triton``
            (tokenyard's paged kernels; CUDA only).
        repeats, warmup: timed and untimed runs per shape.
        memory_cap_bytes: skip shapes needing more (default: half the free GPU memory, or
            2 GiB on the CPU).
        device_label: the ``device`` column (default: ``cpu``, or the GPU's name as a slug).
        progress: called as ``progress(done, total, op)`` after each shape.
        rounds: passes through the grid, ``repeats`` split between them (default: 1 on a
            GPU, 3 on a CPU, whose timings suffer bursts of load from other processes).

    Returns:
        One row per timed shape (a dict keyed by the profile format's columns; None where a
        column does not apply). All-reduce and send/recv rows only when torch.distributed
        is initialised with more than one process (see :func:`comms_available`).

    Raises:
        ConfigError: a bad argument (``field`` names it), or the triton backend off CUDA.
    """
    import torch

    tp = _positive("tensor_parallel_size", tensor_parallel_size)
    repeats = _positive("repeats", repeats)
    if rounds is not None:
        rounds = _positive("rounds", rounds)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ConfigError(
            f"--warmup: expected an integer >= 0, got {warmup!r}",
            field="warmup",
            value=repr(warmup),
        )
    if dtype not in DTYPES:
        raise ConfigError(
            f"--dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}",
            field="dtype",
            value=repr(dtype),
        )
    if backend not in BACKENDS:
        raise ConfigError(
            f"--backend: expected one of {', '.join(BACKENDS)}, got {backend!r}",
            field="backend",
            value=repr(backend),
        )
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cuda", "cpu"):
        raise ConfigError(
            f"--device: expected cuda or cpu, got {device!r}", field="device", value=repr(device)
        )
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "--device: cuda asked for but torch sees no CUDA device", field="device", value="cuda"
        )
    if backend == "triton" and device != "cuda":
        raise ConfigError(
            "--backend: the triton backend runs tokenyard's paged-attention kernels, which "
            f"need a CUDA GPU (device is {device!r}); use --backend torch on the CPU",
            field="backend",
            value=repr(backend),
        )
    shard = _shard(model, tp)
    grid = grid if grid is not None else GRIDS["default"]
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    dev = torch.device(device)
    if memory_cap_bytes is None:
        if device == "cuda":
            free, _total = torch.cuda.mem_get_info()
            memory_cap_bytes = free // 2
        else:
            memory_cap_bytes = CPU_MEMORY_CAP_BYTES
    device_name = torch.cuda.get_device_name(dev) if device == "cuda" else _cpu_name()
    label = device_label or ("cpu" if device == "cpu" else _slug(device_name))

    builder = _Builder(shard, torch_dtype, dev, backend)
    cases = [c for c in builder.cases(grid) if c.bytes_needed <= memory_cap_bytes]
    cases += _comm_cases(grid, shard, torch_dtype, dev)
    created_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    common = {
        "device": label,
        "device_name": device_name,
        "dtype": dtype,
        "backend": backend,
        "model": shard.name,
        "tensor_parallel_size": tp,
        "hidden_size": shard.hidden,
        "num_heads": shard.model_heads,
        "num_kv_heads": shard.model_kv_heads,
        "head_dim": shard.head_dim,
        "intermediate_size": shard.model_inter,
        "torch_version": torch.__version__,
        "created_at": created_at,
    }
    rounds = rounds if rounds is not None else (1 if dev.type == "cuda" else 3)
    times_s = _timed_in_rounds(cases, repeats, warmup, dev, rounds, progress)
    rows: list[ProfileRow] = []
    for case, times in zip(cases, times_s, strict=True):
        row: ProfileRow = dict.fromkeys(OUR_COLUMNS)
        row.update(case.shape)
        row.update(common)
        row["op"] = case.op
        row["time_ms"] = float(np.median(times)) * 1e3
        row["time_ms_p90"] = float(np.percentile(times, 90)) * 1e3
        row["repeats"] = len(times)
        rows.append(row)
    return rows


def _timed_in_rounds(
    cases: list[_Case],
    repeats: int,
    warmup: int,
    dev: torch.device,
    rounds: int,
    progress: Progress | None,
) -> list[list[float]]:
    """Each case's times, taken over ``rounds`` passes through the whole grid. A burst of
    load from another process then spoils one pass's runs of a few shapes, not every run
    of one shape, and the median drops it."""
    import torch

    # ``repeats`` runs in all: the first ``repeats % rounds`` rounds take one more.
    per_round = [repeats // rounds + (r < repeats % rounds) for r in range(rounds)]
    per_round = [n for n in per_round if n]
    times: list[list[float]] = [[] for _ in cases]
    done = 0
    with torch.inference_mode():
        for runs in per_round:
            for i, case in enumerate(cases):
                fn = case.make()
                times[i] += _time(fn, runs, warmup, dev)
                del fn
                done += 1
                if progress is not None:
                    progress(done, len(per_round) * len(cases), case.op)
    return times


def comms_available() -> bool:
    """Whether all-reduce / send-recv can be timed: torch.distributed initialised, > 1 rank."""
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)


def write_profile(rows: list[ProfileRow], path: str | os.PathLike[str]) -> Path:
    """Write ``rows`` as a profile CSV, atomically (a temporary file renamed over ``path``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", newline="") as f:
            writer = csv.writer(f, lineterminator="\n")
            writer.writerow(OUR_COLUMNS)
            for row in rows:
                writer.writerow(["" if row.get(c) is None else _cell(row[c]) for c in OUR_COLUMNS])
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


# --- internals ---------------------------------------------------------------------------


def _cell(value: object) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def _positive(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        flag = name.replace("tensor_parallel_size", "tp").replace("_", "-")
        raise ConfigError(
            f"--{flag}: expected an integer >= 1, got {value!r}", field=name, value=repr(value)
        )
    return value


def _slug(name: str) -> str:
    out = "".join(c if c.isalnum() else "-" for c in name.lower())
    return "-".join(p for p in out.split("-") if p) or "gpu"


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "cpu"


def _time(fn: Callable[[], object], repeats: int, warmup: int, dev: torch.device) -> list[float]:
    import torch

    for _ in range(warmup):
        fn()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        new_event = torch.cuda.Event
        events = [
            (new_event(enable_timing=True), new_event(enable_timing=True))  # type: ignore[no-untyped-call]
            for _ in range(repeats)
        ]
        for start, end in events:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(dev)
        return [start.elapsed_time(end) / 1e3 for start, end in events]
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t0) / 1e9)
    return out


class _Builder:
    """Makes the timed closures for one shard; tensors are allocated per shape."""

    def __init__(self, s: _Shard, dtype: torch.dtype, dev: torch.device, backend: str) -> None:
        import torch

        self.s = s
        self.dtype = dtype
        self.dev = dev
        self.backend = backend
        self.esize = torch.empty((), dtype=dtype).element_size()

    def rand(self, *shape: int) -> torch.Tensor:
        import torch

        return torch.empty(shape, dtype=self.dtype, device=self.dev).uniform_(-0.05, 0.05)

    def cases(self, grid: ProfileGrid) -> Iterator[_Case]:
        s, e = self.s, self.esize
        h = s.hidden
        q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
        moe = s.experts > 1
        for n in grid.num_tokens:
            shape = {"num_tokens": n}
            rows = n * s.experts_per_token if moe else n
            yield _Case("embedding", shape, (s.vocab * h + 2 * n * h) * e, self.embedding(n))
            yield _Case("input_norm", shape, 3 * n * h * e, self.norm(n))
            yield _Case(
                "qkv_proj", shape, self.gemm_bytes(n, h, q + 2 * kv), self.gemm(n, h, q + 2 * kv)
            )
            yield _Case("rope", shape, 3 * n * (q + kv) * e, self.rope(n))
            yield _Case("kv_store", shape, 6 * (n + BLOCK_SIZE) * kv * e, self.kv_store(n))
            yield _Case("o_proj", shape, self.gemm_bytes(n, q, h), self.gemm(n, q, h))
            yield _Case("post_attn_norm", shape, 3 * n * h * e, self.norm(n))
            if moe:
                yield _Case(
                    "gate_up_proj",
                    shape,
                    self.moe_bytes(rows, h, 2 * s.inter),
                    self.moe_gemm(rows, h, 2 * s.inter),
                )
            else:
                yield _Case(
                    "gate_up_proj",
                    shape,
                    self.gemm_bytes(n, h, 2 * s.inter),
                    self.gemm(n, h, 2 * s.inter),
                )
            yield _Case("act", shape, 4 * rows * s.inter * e, self.act(rows))
            if moe:
                yield _Case(
                    "down_proj",
                    shape,
                    self.moe_bytes(rows, s.inter, h),
                    self.moe_gemm(rows, s.inter, h),
                )
            else:
                yield _Case(
                    "down_proj", shape, self.gemm_bytes(n, s.inter, h), self.gemm(n, s.inter, h)
                )
            yield _Case("residual_add", shape, 3 * n * h * e, self.add(n))
            yield _Case("lm_head", shape, self.gemm_bytes(n, h, s.vocab), self.gemm(n, h, s.vocab))
        for b in grid.prefill_batch_sizes:
            for c in grid.prefill_chunk_sizes:
                for ctx in grid.prefill_context_lens:
                    shape = {"batch_size": b, "chunk_size": c, "context_len": ctx}
                    yield _Case(
                        "attn_prefill",
                        shape,
                        self.prefill_bytes(b, c, ctx),
                        self.prefill(b, c, ctx),
                    )
        for b in grid.decode_batch_sizes:
            for ctx in grid.decode_context_lens:
                shape = {"batch_size": b, "context_len": ctx}
                yield _Case("attn_decode", shape, self.decode_bytes(b, ctx), self.decode(b, ctx))

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


def _comm_cases(grid: ProfileGrid, s: _Shard, dtype: torch.dtype, dev: torch.device) -> list[_Case]:
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
            _Case("all_reduce", {"num_bytes": num_bytes, "num_workers": world}, 0, make_all_reduce)
        )
        cases.append(
            _Case("send_recv", {"num_bytes": num_bytes, "num_workers": 2}, 0, make_send_recv)
        )
    return cases
