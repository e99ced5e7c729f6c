"""``tokenyard profile``: time a catalog model's operations here and write a profile CSV."""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from typing import Any

from tokenyard.errors import ConfigError, TokenyardError

__all__ = ["add_parser", "run_command"]


def add_parser(commands: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = commands.add_parser(
        "profile",
        help="time one decoder layer's operations on this machine",
        description="Time every operation of one decoder layer of a catalog model (GEMMs, "
        "norms, RoPE, KV store, prefill and decode attention, embedding, LM head) over a "
        "grid of shapes and write the profile CSV that the profiled predictor trains on. "
        "All-reduce and send/recv are timed only under torchrun with more than one GPU. "
        "See docs/profiling.md.",
    )
    p.add_argument("--model", required=True, help="a catalog model name, e.g. llama-2-7b")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default: 1)")
    p.add_argument("--dtype", default="bf16", help="bf16, fp16 or fp32 (default: bf16)")
    p.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    p.add_argument("--grid", default="default", help="shape grid: tiny or default")
    p.add_argument("--backend", default="torch", help="torch (SDPA) or triton (paged kernels)")
    p.add_argument("--repeats", type=int, default=10, help="timed runs per shape (default: 10)")
    p.add_argument(
        "--rounds",
        type=int,
        help="passes through the grid, the repeats split between them (default: 1 on a GPU, "
        "3 on a CPU)",
    )
    p.add_argument("--warmup", type=int, default=3, help="untimed runs first (default: 3)")
    p.add_argument("--out", "-o", default="profile.csv", help="output CSV (default: profile.csv)")
    p.add_argument("--no-progress", action="store_true", help="no progress line")
    return p


def _model(name: str) -> Any:
    from tokenyard.catalog import model

    try:
        return model(name, field="model")
    except TokenyardError as exc:
        raise ConfigError(f"--model: {exc}", field="model", value=repr(name)) from exc


def _init_distributed() -> int:
    """Under torchrun (WORLD_SIZE > 1) join the process group; return this rank."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl")
    return int(dist.get_rank())


def run_command(args: argparse.Namespace) -> int:
    from tokenyard.profiler.run import ProfileGrid, comms_available, profile_model, write_profile

    try:
        import torch
    except ImportError:
        print("tokenyard profile: error: needs torch (pip install torch)", file=sys.stderr)
        return 2
    show = not args.no_progress and sys.stderr.isatty()

    def progress(done: int, total: int, op: str) -> None:
        if show:
            end = "\n" if done == total else ""
            print(f"\rprofiling {done}/{total} {op:<16}", end=end, file=sys.stderr, flush=True)

    on_cpu = args.device == "cpu" or (args.device is None and not torch.cuda.is_available())
    if on_cpu and args.dtype in ("bf16", "fp16"):
        # Most CPUs emulate 16-bit matmuls: hundreds of times slower than fp32 (measured
        # 0.3 against 84 GFLOP/s on an AVX2 core), which would time the emulation.
        print(
            f"tokenyard profile: note: {args.dtype} on a CPU is usually emulated and very "
            "slow; --dtype fp32 times what a CPU really does",
            file=sys.stderr,
        )
    try:
        model = _model(args.model)
        grid = ProfileGrid.preset(args.grid)
        rank = _init_distributed()
        rows = profile_model(
            model,
            tensor_parallel_size=args.tp,
            dtype=args.dtype,
            device=args.device,
            grid=grid,
            backend=args.backend,
            repeats=args.repeats,
            rounds=args.rounds,
            warmup=args.warmup,
            progress=progress if rank == 0 else None,
        )
        if rank != 0:
            return 0
        path = write_profile(rows, args.out)
    except TokenyardError as exc:
        print(f"tokenyard profile: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"tokenyard profile: error: --out: {exc}", file=sys.stderr)
        return 2
    by_op: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        by_op[row["op"]].append(row["time_ms"])
    first = rows[0] if rows else {}
    print(
        f"tokenyard profile: {args.model} (TP {args.tp}, {args.dtype}, {args.backend}) on "
        f"{first.get('device_name', '?')}"
    )
    for op, times in by_op.items():
        print(f"  {op:<16}{len(times):>5} shapes  {min(times):.4g} - {max(times):.4g} ms")
    if not comms_available():
        print(
            "  all_reduce, send_recv: skipped (need torch.distributed with more than one GPU: "
            "run under torchrun --nproc-per-node N)"
        )
    print(f"wrote {path} ({len(rows)} rows)")
    return 0
