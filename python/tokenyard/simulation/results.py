"""What a simulation returns: the per-request table, the summary users of Vidur look at,
the sampled replica state, and the files written for them.

Per request: arrival, first scheduling, first token and completion times; ``ttft`` (first
token - arrival), ``tpot`` (mean time per output token after the first), ``e2e``,
``scheduling_delay`` (first scheduling - arrival), the largest gap between two tokens,
restarts (preemptions), prefix-cache hit tokens, the replica, and the session and turn
(``session_id`` -1 outside any session). The summary adds mean and
p50/p90/p99 of each, the token-gap (TBT) distribution over every output token, prompt and
decode throughput, goodput under the TTFT/TPOT SLOs, KV usage and batch sizes over time and
each replica's busy fraction, and, for a workload with sessions, a ``sessions`` section
(session completion times; TTFT and prefix hits per turn).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tokenyard._checks import fail
from tokenyard._output import staged_output
from tokenyard.simulation.disagg_config import decode_schedulers

__all__ = ["SimulationResult"]

FloatArray = npt.NDArray[np.float64]


@dataclass
class SimulationResult:
    """``summary`` (JSON-able dict), ``columns`` (the per-request table as numpy arrays),
    ``samples`` (replica state over time), ``stages`` (every batch stage, if recorded),
    ``token_gaps`` (the histogram of gaps between consecutive output tokens: ``low_s``,
    ``high_s``, ``count``) and ``config`` (the resolved config, a mapping that
    ``tokenyard simulate`` reads back)."""

    summary: dict[str, Any]
    columns: dict[str, np.ndarray]
    samples: dict[str, np.ndarray]
    stages: dict[str, np.ndarray] | None
    token_gaps: dict[str, np.ndarray] | None = None
    config: dict[str, Any] | None = None

    def table(self) -> Any:
        """The per-request table as a ``pyarrow.Table``, in request-id order."""
        import pyarrow as pa  # type: ignore[import-untyped]

        return pa.table(self.columns)

    def to_pandas(self) -> Any:
        """The per-request table as a ``pandas.DataFrame`` (needs pandas)."""
        return self.table().to_pandas()

    def write(self, directory: str | os.PathLike[str]) -> Path:
        """Writes ``requests.parquet``, ``requests.csv``, ``summary.json``,
        ``samples.parquet``, ``token_gaps.parquet`` and ``config.json`` (where known) and, if
        stages were recorded, ``trace.json``: the run's Chrome/Perfetto trace events
        (``tokenyard.simulation.trace_events``, the whole run up to
        ``metrics.trace_max_events``). The files appear together or not at all: they are
        written to a temporary folder and renamed in at the end, over a link already in
        ``directory`` rather than through it (``tokenyard._output``). What an earlier run
        left that describes it (``STALE_OUTPUTS``: its command, report and plots, a stage
        trace this run did not record) is removed. The run's own ``metrics.trace_events``
        file (``simulate`` wrote it) is never removed or written over: named
        ``trace.json`` in ``directory``, it stands for the stage trace.

        Raises:
            ConfigError: ``directory`` exists and is not a folder, or
                ``metrics.trace_events`` names one of the other files written here.
            OSError: a file could not be written.
        """
        import pyarrow as pa
        import pyarrow.csv as pacsv  # type: ignore[import-untyped]
        import pyarrow.parquet as pq  # type: ignore[import-untyped]

        own_trace = trace_events_in(directory, self._trace_events_path())
        with staged_output(directory) as staging:
            table = self.table()
            pq.write_table(table, staging / "requests.parquet")
            pacsv.write_csv(table, staging / "requests.csv")
            pq.write_table(pa.table(self.samples), staging / "samples.parquet")
            (staging / "summary.json").write_text(json.dumps(self.summary, indent=2) + "\n")
            if self.token_gaps is not None:
                pq.write_table(pa.table(self.token_gaps), staging / "token_gaps.parquet")
            if self.config is not None:
                (staging / "config.json").write_text(json.dumps(self.config, indent=2) + "\n")
            if self.stages is not None and own_trace != "trace.json":
                (staging / "trace.json").write_text(self._stage_trace())
            written = {path.name for path in staging.iterdir()}
            _remove_stale(Path(directory), written | {own_trace} if own_trace else written)
        return Path(directory)

    def _trace_events_path(self) -> Path | None:
        """This run's ``metrics.trace_events`` file as the config resolves it (from
        ``base_dir``), if it wrote one."""
        config = self.config or {}
        name = (config.get("metrics") or {}).get("trace_events")
        return Path(config.get("base_dir") or Path.cwd()) / name if name else None

    def _stage_trace(self) -> str:
        """The whole run's trace events as ``trace.json`` holds them."""
        from tokenyard.simulation.trace_events import DEFAULT_MAX_EVENTS, trace_events

        metrics = (self.config or {}).get("metrics") or {}
        cap = int(metrics.get("trace_max_events") or DEFAULT_MAX_EVENTS)
        document, _ = trace_events(self, max_events=cap)
        return json.dumps(document, separators=(",", ":"))


def trace_events_in(directory: str | os.PathLike[str], path: Path | None) -> str | None:
    """The name of the trace-events file ``path`` if it lies in the results folder
    ``directory`` (``write`` keeps it), else ``None``.

    Raises:
        ConfigError: it has the name of one of the results (``OUTPUTS``), naming
            ``metrics.trace_events``.
    """
    if path is None or path.parent.resolve() != Path(directory).resolve():
        return None
    if path.name in OUTPUTS:
        raise fail(
            "metrics.trace_events",
            f"names {path}, where the results' {path.name} is written; choose another name",
            str(path),
        )
    return path.name


#: The files ``write`` writes (``trace.json`` aside).
OUTPUTS = (
    "requests.parquet",
    "requests.csv",
    "samples.parquet",
    "summary.json",
    "token_gaps.parquet",
    "config.json",
)

#: What an earlier run may have left beside its results that describes that run, not this
#: one, unless this run writes it too: the command line, the report and its plots (the CLI
#: writes this run's after ``write``), and a stage trace, token gaps or config this run
#: did not have.
STALE_OUTPUTS = (
    "command.txt",
    "report.html",
    "plots",
    "trace.json",
    "token_gaps.parquet",
    "config.json",
)


def _remove_stale(directory: Path, written: set[str]) -> None:
    """Removes the ``STALE_OUTPUTS`` not in ``written`` from ``directory`` (a link is
    removed, never what it points to; ``plots/`` as a whole, as ``tokenyard report``
    replaces it)."""
    import shutil

    for name in STALE_OUTPUTS:
        path = directory / name
        if name in written:
            continue
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path)


def request_columns(raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The core's columns in request-id order, plus the derived latencies (``raw`` is
    emptied)."""
    order = np.argsort(raw["request_id"], kind="stable")
    # Column by column, dropping each unsorted original: the peak stays near one table.
    c = {name: _reordered(raw.pop(name), order) for name in list(raw)}
    decode = c["num_decode_tokens"].astype(np.float64)
    c["ttft"] = c["first_token_at"] - c["arrived_at"]
    with np.errstate(invalid="ignore", divide="ignore"):
        c["tpot"] = np.where(
            decode > 1, (c["completed_at"] - c["first_token_at"]) / (decode - 1), 0.0
        )
    c["e2e"] = c["completed_at"] - c["arrived_at"]
    c["second_token_gap"] = c["second_token_at"] - c["first_token_at"]
    c["scheduling_delay"] = c["scheduled_at"] - c["arrived_at"]
    return c


def _reordered(column: np.ndarray, order: np.ndarray) -> np.ndarray:
    """``column[order]``. A column of one value (bit for bit: the columns of features a run
    did not use) is its own reordering and is kept, not copied: the core allocates its
    columns of zeros zeroed, and they stay out of memory until something writes them."""
    bits = column.view(f"u{column.itemsize}")
    if bits.size and bool((bits == bits[0]).all()):
        return column
    reordered: np.ndarray = column[order]
    return reordered


def token_gap_table(raw: dict[str, Any]) -> dict[str, np.ndarray]:
    """The core's token-gap histogram as columns: each bucket's bounds and its count."""
    edges = np.asarray(raw["token_gap_edges"], dtype=np.float64)
    counts = np.asarray(raw["token_gap_counts"], dtype=np.uint64)
    return {"low_s": edges[:-1], "high_s": edges[1:], "count": counts}


def _stats(values: FloatArray) -> dict[str, float]:
    if values.size == 0:
        return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {
        "mean": float(values.mean()),
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "max": float(values.max()),
    }


def _histogram_stats(counts: np.ndarray, edges: FloatArray) -> dict[str, float]:
    """Quantiles of the token gaps from their log histogram (each bucket's geometric
    middle; buckets are 2.3% wide)."""
    total = int(counts.sum())
    if total == 0:
        return {"count": 0, "mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}
    middles = np.sqrt(edges[:-1] * edges[1:])
    cumulative = np.cumsum(counts)
    quantile = {
        name: float(middles[int(np.searchsorted(cumulative, q * total))])
        for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
    }
    return {"count": total, "mean": float((middles * counts).sum() / total), **quantile}


def summarize(
    columns: dict[str, np.ndarray],
    raw: dict[str, Any],
    *,
    num_stages: int,
    slo_ttft_s: float,
    slo_tpot_s: float,
    wall_s: float,
    description: dict[str, Any],
) -> dict[str, Any]:
    makespan = float(raw["makespan"]) or 1e-12
    n = int(columns["request_id"].size)
    prompt = columns["num_prefill_tokens"].astype(np.int64)
    decode = columns["num_decode_tokens"].astype(np.int64)
    hits = columns["prefix_hit_tokens"].astype(np.int64)
    good = (columns["ttft"] <= slo_ttft_s) & (columns["tpot"] <= slo_tpot_s)
    replicas = raw["replicas"]
    decode_pool = description.get("decode")
    num_prefill = len(replicas["busy_time"]) - (
        decode_schedulers(decode_pool) if decode_pool else 0
    )
    stages = np.full(len(replicas["busy_time"]), num_stages, dtype=np.float64)
    if decode_pool:
        stages[num_prefill:] = decode_pool["num_pipeline_stages"]
    busy = replicas["busy_time"] / (stages * makespan)
    samples = raw["samples"]
    batches = np.maximum(replicas["num_batches"], 1)
    lora = _lora_summary(replicas) if "lora" in description else {}
    found: dict[str, Any] = {
        "config": description,
        "num_requests": n,
        "makespan_s": float(raw["makespan"]),
        "wall_s": wall_s,
        "requests_per_wall_s": n / wall_s if wall_s > 0 else None,
        "num_events": int(raw["num_events"]),
        "num_batches": int(raw["num_batches"]),
        "num_skipped_over_length": int(raw.get("num_skipped_over_length", 0)),
        "latency_s": {
            "ttft": _stats(columns["ttft"]),
            "tpot": _stats(columns["tpot"]),
            "e2e": _stats(columns["e2e"]),
            "scheduling_delay": _stats(columns["scheduling_delay"]),
            "max_token_gap": _stats(columns["max_token_gap"]),
            "tbt": _histogram_stats(raw["token_gap_counts"], raw["token_gap_edges"]),
        },
        "throughput": {
            "requests_per_s": n / makespan,
            "prompt_tokens_per_s": float(prompt.sum()) / makespan,
            "decode_tokens_per_s": float(decode.sum()) / makespan,
            "prefix_hit_rate": float(hits.sum() / max(prompt.sum(), 1)),
        },
        "goodput": {
            "slo_ttft_s": slo_ttft_s,
            "slo_tpot_s": slo_tpot_s,
            "requests_per_s": float(good.sum()) / makespan,
            "fraction": float(good.mean()) if n else 0.0,
        },
        "preemption": {
            "num_restarts": int(columns["num_restarts"].sum()),
            "requests_restarted": int((columns["num_restarts"] > 0).sum()),
        },
        "replicas": {
            "busy_fraction": [float(b) for b in busy],
            "mean_busy_fraction": float(busy.mean()),
            "mean_batch_size": [float(s) for s in replicas["sum_batch_size"] / batches],
            "kv_usage": _stats(samples["kv_usage"]),
            "batch_size": _stats(samples["batch_size"].astype(np.float64)),
        },
        **lora,
    }
    if "session_id" in columns and (columns["session_id"] >= 0).any():
        found["sessions"] = session_summary(columns)
    if "speculative" in description:
        found["speculative"] = speculative_summary(columns)
    if decode_pool:
        found["disaggregation"] = disaggregation_summary(columns, busy, num_prefill)
    decode_tier = decode_pool.get("kv_offload") if decode_pool else None
    if "kv_offload" in description or decode_tier:
        # Each pool's blocks hold its own layout's bytes.
        block_bytes = np.zeros(len(replicas["busy_time"]))
        block_bytes[:num_prefill] = description.get("kv_offload", {}).get("kv_bytes_per_block", 0)
        block_bytes[num_prefill:] = (decode_tier or {}).get("kv_bytes_per_block", 0)
        found["kv_offload"] = kv_offload_summary(columns, replicas, block_bytes)
    return found


def kv_offload_summary(
    columns: dict[str, np.ndarray], replicas: dict[str, Any], kv_bytes_per_block: np.ndarray
) -> dict[str, Any]:
    """The host-memory tier: prompt tokens hit on the GPUs and in host memory, blocks and
    bytes offloaded and loaded back (each replica's blocks at its ``kv_bytes_per_block``),
    and the loads' times (requests that loaded)."""
    prompt = max(int(columns["num_prefill_tokens"].astype(np.int64).sum()), 1)
    host = int(columns["host_hit_tokens"].astype(np.int64).sum())
    hits = int(columns["prefix_hit_tokens"].astype(np.int64).sum())
    loaded = columns["host_load_tokens"] > 0
    offloaded_per_replica = replicas["host_offloaded_blocks"]
    loaded_per_replica = replicas["host_loaded_blocks"]
    offloaded = int(offloaded_per_replica.sum())
    loaded_blocks = int(loaded_per_replica.sum())
    return {
        "gpu_hit_rate": (hits - host) / prompt,
        "host_hit_rate": host / prompt,
        "offloaded_blocks": offloaded,
        "loaded_blocks": loaded_blocks,
        "offloaded_gb": float((offloaded_per_replica * kv_bytes_per_block).sum()) / 1e9,
        "loaded_gb": float((loaded_per_replica * kv_bytes_per_block).sum()) / 1e9,
        "num_requests_loading": int(loaded.sum()),
        "load_s": _stats(columns["host_load_s"][loaded]),
        "load_wait_s": _stats(columns["host_load_wait_s"][loaded]),
    }


def disaggregation_summary(
    columns: dict[str, np.ndarray], busy: np.ndarray, num_prefill: int
) -> dict[str, Any]:
    """Per pool: busy fraction; per handed-over request: KV moved, the wait for the link,
    the transfer and the gap before the second token (which holds both)."""
    moved = columns["prefill_replica"] >= 0
    gap = columns["second_token_gap"][moved]
    return {
        "prefill_busy_fraction": float(busy[:num_prefill].mean()),
        "decode_busy_fraction": float(busy[num_prefill:].mean()),
        "num_transferred": int(moved.sum()),
        "transfer_tokens": int(columns["kv_transfer_tokens"].sum()),
        "transfer_s": _stats(columns["kv_transfer_s"][moved]),
        "transfer_wait_s": _stats(columns["kv_transfer_wait_s"][moved]),
        "second_token_gap_s": _stats(gap[np.isfinite(gap)]),
    }


def _lora_summary(replicas: dict[str, Any]) -> dict[str, Any]:
    """Adapter loads over all replicas (``[replica.lora]`` runs only)."""
    load_s = float(replicas["lora_load_s"].sum())
    busy = float(replicas["busy_time"].sum())
    return {
        "lora": {
            "adapter_loads": int(replicas["lora_loads"].sum()),
            "disk_loads": int(replicas["lora_disk_loads"].sum()),
            "load_time_s": load_s,
            "load_fraction_of_busy": load_s / busy if busy > 0 else 0.0,
        }
    }


#: Turns reported one by one in ``sessions.per_turn``; later turns are pooled.
PER_TURN = 8


def session_summary(columns: dict[str, np.ndarray]) -> dict[str, Any]:
    """Per session: completion time (last turn's completion - first turn's arrival) and turn
    count; per turn position: TTFT and prefix hit rate (turn ``PER_TURN`` and later pooled as
    ``"8+"``)."""
    in_session = columns["session_id"] >= 0
    sessions = columns["session_id"][in_session]
    ids, num_turns = np.unique(sessions, return_counts=True)
    order = np.argsort(sessions, kind="stable")
    arrived = columns["arrived_at"][in_session][order]
    completed = columns["completed_at"][in_session][order]
    starts = np.concatenate([[0], np.cumsum(num_turns)[:-1]])
    session_time = np.maximum.reduceat(completed, starts) - np.minimum.reduceat(arrived, starts)
    turn = columns["turn"][in_session]
    ttft = columns["ttft"][in_session]
    prompt = columns["num_prefill_tokens"][in_session].astype(np.int64)
    hits = columns["prefix_hit_tokens"][in_session].astype(np.int64)
    per_turn: dict[str, dict[str, float]] = {}
    for k in range(int(turn.max()) + 1 if turn.size else 0):
        if k > PER_TURN:
            break
        chosen = turn == k if k < PER_TURN else turn >= k
        if not chosen.any():
            continue  # e.g. every turn at this position was skipped as over-length
        per_turn[str(k) if k < PER_TURN else f"{k}+"] = {
            "count": int(chosen.sum()),
            "ttft_mean": float(ttft[chosen].mean()),
            "ttft_p90": float(np.percentile(ttft[chosen], 90)),
            "prefix_hit_rate": float(hits[chosen].sum() / max(int(prompt[chosen].sum()), 1)),
        }
    return {
        "num_sessions": int(ids.size),
        "num_turns": _stats(num_turns.astype(np.float64)),
        "session_time_s": _stats(session_time),
        "per_turn": per_turn,
    }


def speculative_summary(columns: dict[str, np.ndarray]) -> dict[str, Any]:
    """Speculative decoding's counts: drafts verified and accepted (as drawn, before a
    request's last step trims its output, as vLLM counts them), the acceptance rate, and
    tokens per verify step (accepted + 1; pooled, and the mean of the requests' own)."""
    steps = columns["spec_steps"].astype(np.int64)
    drafts = columns["spec_draft_tokens"].astype(np.int64)
    accepted = columns["spec_accepted_tokens"].astype(np.int64)
    num_steps = int(steps.sum())
    with_steps = steps > 0
    per_request = (steps[with_steps] + accepted[with_steps]) / steps[with_steps]
    return {
        "num_steps": num_steps,
        "num_draft_tokens": int(drafts.sum()),
        "num_accepted_tokens": int(accepted.sum()),
        "acceptance_rate": float(accepted.sum() / drafts.sum()) if drafts.sum() else 0.0,
        "mean_tokens_per_step": float((num_steps + accepted.sum()) / num_steps)
        if num_steps
        else 0.0,
        "mean_tokens_per_step_per_request": float(per_request.mean()) if per_request.size else 0.0,
        "tpot_mean_s": float(columns["tpot"].mean()) if columns["tpot"].size else 0.0,
    }
