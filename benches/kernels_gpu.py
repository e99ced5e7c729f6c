"""The paged-attention kernels on a GPU: bandwidth (decode), TFLOP/s (prefill), vs torch SDPA.

Decode: batch {1, 16, 64, 256} x context {512, 2048, 8192}, Llama-3-8B heads (32 query
heads, 8 KV heads, head_dim 128), bf16, block_size 16, shuffled block tables. Reported:
the kernel's GPU time (median of CUDA-graph replays, cycling over enough distinct inputs
to exceed 4x L2, so small shapes are not served from cache), its achieved bandwidth (KV
bytes read + query + output, over the time) as a fraction of the device's peak, the host
time of an eager call (Python launch overhead included), torch SDPA over the same K/V
already contiguous (the best of ``enable_gqa=True`` and K/V pre-expanded to 32 heads), and
gather-from-the-paged-cache + SDPA (what an engine without a paged kernel would pay), the
last two timed the same way.

Prefill: chunks of {512, 2048} tokens after a cached prefix of {0, 2048} tokens, 8,192
new tokens per batch. FLOPs are counted for the causal shape only: ``4 * head_dim *
num_heads * sum over queries of the keys each attends to``; reported as TFLOP/s and as a
fraction of the device's dense bf16 peak, against SDPA on the contiguous equivalent
(``is_causal`` without a prefix; an explicit bottom-right causal mask with one); medians of
``triton.testing.do_bench`` (which flushes L2 before each call).

Peaks come from a table keyed by the device name (H100 SXM/PCIe, H200, A100 80GB), else
from a measured device-to-device copy and bf16 matmul.

Correctness against ``tokenyard.kernels.reference`` is checked at one shape of each before
any timing. ``--sweep`` also times a few launch configurations (for tuning).

    python benches/kernels_gpu.py [--json out.json] [--sweep] [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:
    import torch
    import triton
    import triton.testing
except ImportError as exc:  # pragma: no cover
    raise SystemExit(f"kernels_gpu.py needs torch and triton: {exc}") from exc

if not torch.cuda.is_available():
    raise SystemExit("kernels_gpu.py needs a CUDA GPU (torch.cuda.is_available() is False)")
if os.environ.get("TRITON_INTERPRET") == "1":
    raise SystemExit("unset TRITON_INTERPRET: this benchmark times the compiled kernels")

import torch.nn.functional as F

from tokenyard.kernels import (
    _decode,
    _prefill,
    paged_decode_attention,
    paged_prefill_attention,
    reference,
)

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 16
DTYPE = torch.bfloat16
BYTES = 2

# name substring(s) -> (peak memory bandwidth B/s, dense bf16 FLOP/s), datasheet figures.
PEAKS: list[tuple[tuple[str, ...], float, float]] = [
    (("H200",), 4.8e12, 989e12),
    (("H100", "PCIe"), 2.0e12, 756e12),
    (("H100",), 3.35e12, 989e12),  # SXM (reports as "H100 80GB HBM3")
    (("A100", "80GB"), 2.0e12, 312e12),
]


def do_bench(fn: Callable[[], Any]) -> float:
    """Median milliseconds."""
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def eager_ms(fn: Callable[[], Any], calls: int = 200) -> float:
    """Host wall milliseconds per call of back-to-back Python calls (launch overhead
    included; what an engine that does not capture CUDA graphs pays)."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3 / calls


def measured_copy_bandwidth() -> float:
    """Device-to-device copy, bytes read + written per second."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src))
    return 2 * src.numel() / (ms * 1e-3)


def measured_matmul_flops() -> float:
    a = torch.randn(8192, 8192, dtype=DTYPE, device="cuda")
    b = torch.randn(8192, 8192, dtype=DTYPE, device="cuda")
    ms = do_bench(lambda: a @ b)
    return 2 * 8192**3 / (ms * 1e-3)


def device_peaks(name: str) -> tuple[float, float, str]:
    for keys, bandwidth, flops in PEAKS:
        if all(k in name for k in keys):
            return bandwidth, flops, "datasheet"
    return measured_copy_bandwidth(), measured_matmul_flops(), "measured"


class PagedKV:
    """A bf16 paged cache holding ``batch`` sequences, with a shuffled block table."""

    def __init__(self, context_lens: list[int], seed: int = 0) -> None:
        gen = torch.Generator(device="cuda").manual_seed(seed)
        need = [-(-n // BLOCK_SIZE) for n in context_lens]
        num_blocks = sum(need)
        shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
        self.k_cache = torch.randn(shape, generator=gen, device="cuda", dtype=DTYPE)
        self.v_cache = torch.randn(shape, generator=gen, device="cuda", dtype=DTYPE)
        ids = torch.randperm(num_blocks, generator=gen, device="cuda").to(torch.int32)
        self.block_tables = torch.zeros((len(context_lens), max(need)), dtype=torch.int32)
        taken = 0
        for s, k in enumerate(need):
            self.block_tables[s, :k] = ids[taken : taken + k].cpu()
            taken += k
        self.block_tables = self.block_tables.cuda()
        self.context_lens = torch.tensor(context_lens, dtype=torch.int32, device="cuda")

    def gather_all(self, n: int, rows: slice = slice(None)) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``n`` keys/values of sequences ``rows``, ``[seqs, kv_heads, n,
        head_dim]``, by one index through the block table."""
        blocks = self.block_tables[rows, : -(-n // BLOCK_SIZE)].long()
        k = self.k_cache[blocks].flatten(1, 2)[:, :n].transpose(1, 2)
        v = self.v_cache[blocks].flatten(1, 2)[:, :n].transpose(1, 2)
        return k, v


def graph_ms(calls: list[Callable[[], Any]], min_calls: int = 24) -> float:
    """Median milliseconds per call when ``calls`` (cycled to >= ``min_calls``) are replayed
    as one CUDA graph: GPU time without Python launch overhead, as an engine that captures
    its decode step sees it. Distinct inputs per call keep small shapes from living in L2."""
    seq = calls * -(-min_calls // len(calls))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for f in calls:  # compile and warm the allocator outside the capture
            f()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for f in seq:
            f()
    graph.replay()
    times = []
    for _ in range(30):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / len(seq))
    return statistics.median(times)


def sdpa_best(
    variants: dict[str, list[Callable[[], Any]]], timer: Callable[[list[Callable[[], Any]]], float]
) -> tuple[float, str]:
    """Time each SDPA variant with ``timer``; keep the fastest."""
    best: tuple[float, str] | None = None
    for label, calls in variants.items():
        try:
            ms = timer(calls)
        except (RuntimeError, torch.OutOfMemoryError) as exc:
            print(f"  sdpa {label} failed: {str(exc).splitlines()[0]}")
            continue
        if best is None or ms < best[0]:
            best = (ms, label)
    if best is None:
        raise SystemExit("every SDPA variant failed")
    return best


def sdpa_variants(
    qs: list[torch.Tensor], ks: list[torch.Tensor], vs: list[torch.Tensor], **kw: Any
) -> dict[str, list[Callable[[], Any]]]:
    """SDPA with ``enable_gqa``, and over K/V pre-expanded to num_heads when that fits."""
    group = NUM_HEADS // NUM_KV_HEADS
    variants: dict[str, list[Callable[[], Any]]] = {
        "enable_gqa": [
            functools.partial(F.scaled_dot_product_attention, q, k, v, enable_gqa=True, **kw)
            for q, k, v in zip(qs, ks, vs, strict=True)
        ]
    }
    if sum(k.numel() for k in ks) * group * BYTES * 2 < 16 * 2**30:
        variants["expanded"] = [
            functools.partial(
                F.scaled_dot_product_attention,
                q,
                k.repeat_interleave(group, dim=1),
                v.repeat_interleave(group, dim=1),
                **kw,
            )
            for q, k, v in zip(qs, ks, vs, strict=True)
        ]
    return variants


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def check_correctness() -> dict[str, float]:
    torch.manual_seed(0)
    errors = {}
    lens = [int(x) for x in torch.randint(1, 3000, (16,))]
    lens[3] = 0
    paged = PagedKV(lens)
    q = torch.randn(len(lens), NUM_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    args = (q, paged.k_cache, paged.v_cache, paged.block_tables, paged.context_lens)
    errors["decode"] = rel_error(
        paged_decode_attention(*args), reference.paged_decode_attention(*args)
    )
    errors["decode_split8"] = rel_error(
        paged_decode_attention(*args, num_splits=8), reference.paged_decode_attention(*args)
    )
    chunks = [(512, 2560), (300, 300), (1, 1000), (1024, 1500)]
    paged = PagedKV([n for _, n in chunks], seed=1)
    starts = [0]
    for q_len, _ in chunks:
        starts.append(starts[-1] + q_len)
    q = torch.randn(starts[-1], NUM_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    qsl = torch.tensor(starts, dtype=torch.int32, device="cuda")
    args_p = (q, paged.k_cache, paged.v_cache, paged.block_tables, qsl, paged.context_lens)
    errors["prefill"] = rel_error(
        paged_prefill_attention(*args_p), reference.paged_prefill_attention(*args_p)
    )
    for name, err in errors.items():
        print(f"correctness {name}: relative error {err:.2e}")
        if not err < 1e-2:
            raise SystemExit(f"{name} is wrong (relative error {err:.2e})")
    return errors


def bench_decode(
    batch: int, context: int, peak_bw: float, with_sdpa: bool = True
) -> dict[str, Any]:
    kv_bytes = 2 * batch * context * NUM_KV_HEADS * HEAD_DIM * BYTES
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)
    copies = min(64, max(1, -(-4 * l2 // kv_bytes)))  # >= 4x L2 of distinct K/V
    paged = PagedKV([context] * (batch * copies), seed=batch + context)
    rows = [slice(i * batch, (i + 1) * batch) for i in range(copies)]
    qs = [torch.randn(batch, NUM_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE) for _ in rows]
    outs = [torch.empty_like(q) for q in qs]
    calls = [
        functools.partial(
            paged_decode_attention, q, paged.k_cache, paged.v_cache,
            paged.block_tables[r], paged.context_lens[r], out=o,
        )
        for q, r, o in zip(qs, rows, outs, strict=True)
    ]  # fmt: skip
    ms = graph_ms(calls)
    total_bytes = kv_bytes + 2 * qs[0].numel() * BYTES
    row: dict[str, Any] = {
        "batch": batch,
        "context": context,
        "input_copies": copies,
        "kernel_ms": ms,
        "eager_ms": eager_ms(calls[0]),
        "bytes": total_bytes,
        "bandwidth_Bps": total_bytes / (ms * 1e-3),
        "fraction_of_peak": total_bytes / (ms * 1e-3) / peak_bw,
        "num_splits": _decode.choose_num_splits(
            batch * NUM_KV_HEADS, paged.block_tables.shape[1] * BLOCK_SIZE,
            qs[0].device, _decode.GPU_CONFIG,
        ),
    }  # fmt: skip
    if with_sdpa:
        q4s = [q.unsqueeze(2) for q in qs]  # [batch, heads, 1, head_dim]
        k, v = paged.gather_all(context)
        ks, vs = [k[r].contiguous() for r in rows], [v[r].contiguous() for r in rows]
        del k, v
        sdpa_ms, label = sdpa_best(sdpa_variants(q4s, ks, vs), graph_ms)
        del ks, vs

        def gather_sdpa(q4: torch.Tensor, r: slice) -> torch.Tensor:
            kk, vv = paged.gather_all(context, r)
            return F.scaled_dot_product_attention(q4, kk, vv, enable_gqa=True)

        gather_calls = [
            functools.partial(gather_sdpa, q4, r) for q4, r in zip(q4s, rows, strict=True)
        ]
        row |= {
            "sdpa_ms": sdpa_ms,
            "sdpa_variant": label,
            "gather_sdpa_ms": graph_ms(gather_calls, min_calls=len(gather_calls)),
        }
    return row


def bench_prefill(
    chunk: int, prefix: int, peak_flops: float, with_sdpa: bool = True
) -> dict[str, Any]:
    batch = max(1, 8192 // chunk)
    seq_len = prefix + chunk
    paged = PagedKV([seq_len] * batch, seed=chunk + prefix)
    q = torch.randn(batch * chunk, NUM_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    out = torch.empty_like(q)
    qsl = torch.arange(0, batch * chunk + 1, chunk, dtype=torch.int32, device="cuda")
    args = (q, paged.k_cache, paged.v_cache, paged.block_tables, qsl, paged.context_lens)
    ms = do_bench(lambda: paged_prefill_attention(*args, out=out))
    attended = batch * sum(prefix + i + 1 for i in range(chunk))
    flops = 4 * HEAD_DIM * NUM_HEADS * attended
    row: dict[str, Any] = {
        "chunk": chunk,
        "prefix": prefix,
        "batch": batch,
        "kernel_ms": ms,
        "flops": flops,
        "tflops": flops / (ms * 1e-3) / 1e12,
        "fraction_of_peak": flops / (ms * 1e-3) / peak_flops,
    }
    if with_sdpa:
        k, v = paged.gather_all(seq_len)
        k, v = k.contiguous(), v.contiguous()
        q4 = q.view(batch, chunk, NUM_HEADS, HEAD_DIM).transpose(1, 2)
        if prefix == 0:
            variants = sdpa_variants([q4], [k], [v], is_causal=True)
        else:
            pos = torch.arange(prefix, seq_len, device="cuda")
            mask = torch.arange(seq_len, device="cuda")[None, :] <= pos[:, None]
            variants = sdpa_variants([q4], [k], [v], attn_mask=mask)
        sdpa_ms, label = sdpa_best(variants, lambda calls: do_bench(calls[0]))
        row |= {"sdpa_ms": sdpa_ms, "sdpa_variant": label}
    return row


DECODE_SWEEP = [
    _decode.DecodeConfig(block_n=64, num_warps=4, num_stages=2),
    _decode.DecodeConfig(block_n=64, num_warps=4, num_stages=3),
    _decode.DecodeConfig(block_n=32, num_warps=4, num_stages=2),
    _decode.DecodeConfig(block_n=128, num_warps=4, num_stages=2),
    _decode.DecodeConfig(block_n=64, num_warps=4, num_stages=2, min_keys_per_split=128),
    _decode.DecodeConfig(block_n=64, num_warps=4, num_stages=2, split_below_programs_per_sm=4),
]
PREFILL_SWEEP = [
    _prefill.PrefillConfig(block_m=128, block_n=64, num_warps=8, num_stages=2),
    _prefill.PrefillConfig(block_m=128, block_n=64, num_warps=8, num_stages=3),
    _prefill.PrefillConfig(block_m=128, block_n=128, num_warps=8, num_stages=2),
    _prefill.PrefillConfig(block_m=64, block_n=64, num_warps=4, num_stages=3),
    _prefill.PrefillConfig(block_m=128, block_n=32, num_warps=4, num_stages=3),
]


def sweep(peak_bw: float, peak_flops: float) -> list[dict[str, Any]]:
    rows = []
    default_decode, default_prefill = _decode.GPU_CONFIG, _prefill.GPU_CONFIG
    for config in DECODE_SWEEP:
        _decode.GPU_CONFIG = config
        for batch, context in [(1, 8192), (16, 512), (16, 2048), (64, 2048), (256, 2048)]:
            r = bench_decode(batch, context, peak_bw, with_sdpa=False)
            rows.append({"kind": "decode", "config": dataclasses.asdict(config)} | r)
            print(f"sweep decode {config} b={batch} ctx={context}: {r['kernel_ms']:.4f} ms "
                  f"{r['fraction_of_peak']:.0%}")  # fmt: skip
    _decode.GPU_CONFIG = default_decode
    for pconfig in PREFILL_SWEEP:
        _prefill.GPU_CONFIG = pconfig
        for chunk, prefix in [(512, 0), (512, 2048), (2048, 0)]:
            r = bench_prefill(chunk, prefix, peak_flops, with_sdpa=False)
            rows.append({"kind": "prefill", "config": dataclasses.asdict(pconfig)} | r)
            print(f"sweep prefill {pconfig} chunk={chunk} prefix={prefix}: "
                  f"{r['kernel_ms']:.4f} ms {r['tflops']:.0f} TFLOP/s")  # fmt: skip
    _prefill.GPU_CONFIG = default_prefill
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--sweep", action="store_true", help="also time launch configs")
    parser.add_argument("--quick", action="store_true", help="fewer shapes")
    opts = parser.parse_args()

    name = torch.cuda.get_device_name()
    peak_bw, peak_flops, peak_source = device_peaks(name)
    copy_bw = measured_copy_bandwidth()
    print(f"device: {name}; torch {torch.__version__}, triton {triton.__version__}")
    print(f"peaks ({peak_source}): {peak_bw / 1e12:.2f} TB/s, {peak_flops / 1e12:.0f} TFLOP/s "
          f"bf16; measured d2d copy {copy_bw / 1e12:.2f} TB/s")  # fmt: skip
    errors = check_correctness()
    started = time.perf_counter()

    sweep_rows = sweep(peak_bw, peak_flops) if opts.sweep else []
    batches = [1, 64] if opts.quick else [1, 16, 64, 256]
    contexts = [2048] if opts.quick else [512, 2048, 8192]
    decode = []
    for b in batches:
        for c in contexts:
            decode.append(bench_decode(b, c, peak_bw))
            torch.cuda.empty_cache()
    chunks = [(512, 2048)] if opts.quick else [(512, 0), (512, 2048), (2048, 0), (2048, 2048)]
    prefill = [bench_prefill(c, p, peak_flops) for c, p in chunks]

    print()
    print("decode: Llama-3-8B heads (32 q / 8 kv, d=128), bf16, block 16, shuffled tables;")
    print("times are CUDA-graph replays (GPU time); 'eager' is one Python call, launch included")
    print(f"{'batch':>5} {'ctx':>5} {'splits':>6} {'kernel us':>9} {'TB/s':>5} {'of peak':>7} "
          f"{'eager us':>8} {'SDPA us':>7} {'SDPA/ours':>9} {'gather+SDPA us':>14} "
          f"{'g+S/ours':>8}")  # fmt: skip
    for r in decode:
        print(
            f"{r['batch']:>5} {r['context']:>5} {r['num_splits']:>6} "
            f"{r['kernel_ms'] * 1e3:>9.1f} {r['bandwidth_Bps'] / 1e12:>5.2f} "
            f"{r['fraction_of_peak']:>7.0%} {r['eager_ms'] * 1e3:>8.1f} "
            f"{r['sdpa_ms'] * 1e3:>7.1f} {r['sdpa_ms'] / r['kernel_ms']:>8.2f}x "
            f"{r['gather_sdpa_ms'] * 1e3:>14.1f} {r['gather_sdpa_ms'] / r['kernel_ms']:>7.2f}x"
        )
    print()
    print("prefill: 8,192 new tokens per batch, causal FLOPs only")
    print(f"{'chunk':>5} {'prefix':>6} {'batch':>5} {'kernel ms':>9} {'TFLOP/s':>7} "
          f"{'of peak':>7} {'SDPA ms':>8} {'SDPA TFLOP/s':>12} {'SDPA/ours':>9}")  # fmt: skip
    for r in prefill:
        sdpa_tflops = r["flops"] / (r["sdpa_ms"] * 1e-3) / 1e12
        print(
            f"{r['chunk']:>5} {r['prefix']:>6} {r['batch']:>5} {r['kernel_ms']:>9.3f} "
            f"{r['tflops']:>7.0f} {r['fraction_of_peak']:>7.0%} {r['sdpa_ms']:>8.3f} "
            f"{sdpa_tflops:>12.0f} {r['sdpa_ms'] / r['kernel_ms']:>8.2f}x"
        )
    print(f"\n(timed in {time.perf_counter() - started:.0f} s; 'X/ours' columns: X's time / ours)")

    if opts.json:
        report = {
            "device": name,
            "torch": torch.__version__,
            "triton": triton.__version__,
            "python": platform.python_version(),
            "peak_bandwidth_Bps": peak_bw,
            "peak_bf16_flops": peak_flops,
            "peak_source": peak_source,
            "measured_copy_Bps": copy_bw,
            "correctness_rel_error": errors,
            "decode_config": dataclasses.asdict(_decode.GPU_CONFIG),
            "prefill_config": dataclasses.asdict(_prefill.GPU_CONFIG),
            "decode": decode,
            "prefill": prefill,
            "sweep": sweep_rows,
        }
        opts.json.parent.mkdir(parents=True, exist_ok=True)
        opts.json.write_text(json.dumps(report, indent=1))
        print(f"wrote {opts.json}")


if __name__ == "__main__":
    main()
