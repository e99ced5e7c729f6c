"""Time one decoder layer's operations, shape by shape, for the profiled predictor.

Owns the timing loop (what is timed for each op is in ``cases.py``, the shapes in
``grid.py``; see ``docs/profiling.md``); the output rows are tokenyard profile format v1
(:data:`tokenyard.predictor.profiles.OUR_COLUMNS`), read back by
:func:`tokenyard.predictor.profiles.read_profiles`. Invariant: every row's features are
the ones its op is read with, and each time is the median of ``repeats`` timed runs, spread
over ``rounds`` passes through the grid, after ``warmup`` untimed ones, in milliseconds.
"""

from __future__ import annotations

import csv
import datetime
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tokenyard.errors import ConfigError
from tokenyard.predictor.profiles import OUR_COLUMNS
from tokenyard.profiler.cases import (
    Case,
    CaseBuilder,
    ModelShape,
    comm_cases,
    comms_available,
    shard_model,
)
from tokenyard.profiler.grid import GRIDS, ProfileGrid

if TYPE_CHECKING:
    import torch

__all__ = [
    "GRIDS",
    "ModelShape",
    "ProfileGrid",
    "ProfileRow",
    "comms_available",
    "profile_model",
    "write_profile",
]

ProfileRow = dict[str, Any]
Progress = Callable[[int, int, str], None]

DTYPES = ("bf16", "fp16", "fp32")
BACKENDS = ("torch", "triton")
CPU_MEMORY_CAP_BYTES = 2 << 30


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
    shard = shard_model(model, tp)
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

    builder = CaseBuilder(shard, torch_dtype, dev, backend)
    cases = [c for c in builder.cases(grid) if c.bytes_needed <= memory_cap_bytes]
    cases += comm_cases(grid, shard, torch_dtype, dev)
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
    cases: list[Case],
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
