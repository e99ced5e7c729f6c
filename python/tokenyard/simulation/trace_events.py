"""A Chrome / Perfetto trace-event file of one simulated run (docs/simulate.md, "Trace
events"), built from the result's batch-stage records, replica samples and request table.

Tracks: process 0 is the cluster (each arrival as an instant event, with the replica it was
routed to); process ``1 + r`` is replica ``r`` (in a P/D cluster named ``prefill replica i``
/ ``decode replica j``), with one thread per pipeline stage holding each batch stage as a
complete ("X") slice, and a ``requests`` thread holding each completion as an instant
event. Timestamps are microseconds of simulated time. Invariants: on every track the
events are in time order and a stage's slices never overlap; a trace cut by
``max_events`` keeps the earliest events and says so in ``otherData`` and in a global
instant event where it stops.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from tokenyard._checks import fail
from tokenyard._output import write_text
from tokenyard.simulation.config import MetricsConfig, check_trace_options
from tokenyard.simulation.disagg_config import decode_schedulers

__all__ = [
    "DEFAULT_MAX_EVENTS",
    "TraceInfo",
    "check_trace_options",
    "trace_events",
    "write_trace_events",
]

#: The default cap on slices and instant events (about 220 MB of JSON): the config's.
DEFAULT_MAX_EVENTS: int = MetricsConfig.trace_max_events
#: The thread of a replica's completions (above any pipeline stage's).
REQUESTS_TID = 1000
CLUSTER_PID = 0


class _Result(Protocol):
    """What a trace reads of a ``SimulationResult`` (``results.py``, which writes its trace
    through this module): the summary, request table, replica samples and stages."""

    summary: dict[str, Any]
    columns: dict[str, np.ndarray]
    samples: dict[str, np.ndarray]
    stages: dict[str, np.ndarray] | None


@dataclasses.dataclass(frozen=True)
class TraceInfo:
    """What a trace holds: its slices and instant events (``num_events``, metadata events
    aside), how many the window or request range selected (``num_selected``), whether
    the cap cut it (``truncated``), and whether each slice's KV figures are its batch's
    own sample (``kv_exact``) rather than the replica's latest one."""

    num_events: int
    num_selected: int
    truncated: bool
    kv_exact: bool


def _us(seconds: np.ndarray) -> np.ndarray:
    """Simulated seconds as microseconds, rounded to the nanosecond (a monotone map, so the
    order of the times, and a stage's end before the next start, survive it)."""
    rounded: np.ndarray = np.round(np.asarray(seconds, dtype=np.float64) * 1e6, 3)
    return rounded


def _pools(result: _Result) -> tuple[int, list[str], list[int]]:
    """(replicas the core ran, each one's name, each one's KV blocks)."""
    config = result.summary["config"]
    total = len(result.summary["replicas"]["busy_fraction"])
    decode = config.get("decode")
    num_prefill = total - (decode_schedulers(decode) if decode else 0)
    dp = int(config.get("data_parallel_size", 1))
    names, blocks = [], []
    for r in range(total):
        if decode:
            prefill = r < num_prefill
            pool = "prefill" if prefill else "decode"
            names.append(f"{pool} replica {r if prefill else r - num_prefill}")
            blocks.append(int(config["num_blocks"] if prefill else decode["num_blocks"]))
        else:
            names.append(f"replica {r // dp} DP rank {r % dp}" if dp > 1 else f"replica {r}")
            blocks.append(int(config["num_blocks"]))
    return total, names, blocks


def _batch_kv(result: _Result, stages: dict[str, np.ndarray]) -> tuple[np.ndarray, bool]:
    """Each stage record's KV use fraction at its batch's formation, and whether that is
    each batch's own sample (``metrics.sample_interval_s = 0`` samples every batch, in
    batch-id order) or else the replica's latest sample at or before the stage's start."""
    samples = result.samples
    time, replica, usage = samples["time"], samples["replica"], samples["kv_usage"]
    batch = stages["batch_id"].astype(np.int64)
    if time.size == int(result.summary["num_batches"]) and (
        batch.size == 0
        or (
            np.array_equal(replica[batch], stages["replica"])
            and bool((time[batch] <= stages["start"]).all())
        )
    ):
        return np.asarray(usage[batch], dtype=np.float64), True
    out = np.zeros(batch.size)
    for r in np.unique(stages["replica"]):
        mine = replica == r
        at, values = time[mine], usage[mine]
        rows = stages["replica"] == r
        index = np.searchsorted(at, stages["start"][rows], side="right") - 1
        out[rows] = np.where(index >= 0, values[np.maximum(index, 0)], 0.0)
    return out, False


def _window(
    result: _Result, window_s: tuple[float, ...], requests: tuple[int, ...]
) -> tuple[float, float, np.ndarray]:
    """The time window and the requests whose instants are shown: the request range's
    arrivals to completions (within ``window_s`` if given too)."""
    c = result.columns
    ids = c["request_id"]
    chosen = np.ones(ids.size, dtype=bool)
    start, end = (window_s[0], window_s[1]) if window_s else (0.0, math.inf)
    if requests:
        chosen = (ids >= requests[0]) & (ids < requests[1])
        if chosen.any():
            done = c["completed_at"][chosen]
            start = max(start, float(c["arrived_at"][chosen].min()))
            end = min(end, float(done[np.isfinite(done)].max(initial=start)))
        else:
            end = start
    return start, end, chosen


def trace_events(
    result: _Result,
    *,
    window_s: tuple[float, ...] = (),
    requests: tuple[int, ...] = (),
    max_events: int = DEFAULT_MAX_EVENTS,
    stages: dict[str, np.ndarray] | None = None,
) -> tuple[dict[str, Any], TraceInfo]:
    """The trace-event document of ``result`` and what it holds.

    Args:
        result: a run with its batch stages recorded (``metrics.record_stages`` or
            ``metrics.trace_events``).
        window_s: ``(start, end)`` simulated seconds: the slices overlapping it and the
            instants inside it (empty: the whole run).
        requests: ``(first, end)`` request ids: their arrivals and completions, and the
            slices from the first arrival to the last completion among them.
        max_events: the most slices and instants kept (the earliest).
        stages: the batch-stage records (default ``result.stages``).

    Raises:
        ConfigError: the run did not record its batch stages.
    """
    stages = result.stages if stages is None else stages
    if stages is None:
        raise fail(
            "metrics.trace_events",
            "the run recorded no batch stages; set metrics.record_stages (or trace_events)",
            None,
        )
    start, end, chosen = _window(result, window_s, requests)
    total, names, blocks = _pools(result)
    kv, kv_exact = _batch_kv(result, stages)
    begin = stages["start"]
    finish = begin + stages["duration"]
    keep = (begin <= end) & (finish >= start)
    arrived, done = result.columns["arrived_at"], result.columns["completed_at"]
    show_arrival = chosen & (arrived >= start) & (arrived <= end)
    show_done = chosen & np.isfinite(done) & (done >= start) & (done <= end)
    # Every kept event as (time, kind, index): kinds sort slices before instants at a tie.
    slices = np.flatnonzero(keep)
    arrivals = np.flatnonzero(show_arrival)
    completions = np.flatnonzero(show_done)
    times = np.concatenate([begin[slices], arrived[arrivals], done[completions]])
    kinds = np.concatenate(
        [np.zeros(slices.size), np.ones(arrivals.size), np.full(completions.size, 2)]
    ).astype(np.int8)
    index = np.concatenate([slices, arrivals, completions])
    order = np.lexsort((index, kinds, times))
    selected = int(order.size)
    truncated = selected > max_events
    order = order[:max_events]
    # Each kind's events built in the order kept, then interleaved: only the kept rows are
    # read, and from plain lists (several times faster than numpy scalars).
    kept_kinds, kept_rows = kinds[order], index[order]
    built = (
        _slices(stages, kv, np.asarray(blocks), kept_rows[kept_kinds == 0]),
        _arrivals(result.columns, names, kept_rows[kept_kinds == 1]),
        _completions(result.columns, kept_rows[kept_kinds == 2]),
    )
    streams = [iter(b) for b in built]
    events = [next(streams[k]) for k in kept_kinds.tolist()]
    other: dict[str, Any] = {
        "source": "tokenyard simulate",
        "time_unit": "microseconds of simulated time",
        "window_s": [start, None if math.isinf(end) else end],
        "requests": list(requests) or None,
        "num_events": len(events),
        "num_selected": selected,
        "max_events": max_events,
        "truncated": truncated,
        "kv_use": "each batch's own, at its formation"
        if kv_exact
        else "the replica's latest sample at or before the stage's start "
        "(metrics.sample_interval_s > 0; set it to 0 for each batch's own)",
    }
    if truncated:
        last = events[-1]["ts"] if events else 0.0
        note = (
            f"TRUNCATED: {len(events):,} of {selected:,} events kept (trace_max_events = "
            f"{max_events:,}); nothing after {last / 1e6:.6f} s is shown. Narrow the window "
            "(--trace-window) or the request range (--trace-requests), or raise the cap."
        )
        other["note"] = note
        events.append(
            {"name": note, "cat": "note", "ph": "i", "s": "g", "ts": last, "pid": 0, "tid": 0}
        )
    meta = _metadata(total, names, stages)
    return (
        {"traceEvents": meta + events, "displayTimeUnit": "ms", "otherData": other},
        TraceInfo(len(events) - int(truncated), selected, truncated, kv_exact),
    )


def _slices(
    stages: dict[str, np.ndarray], kv: np.ndarray, blocks: np.ndarray, rows: np.ndarray
) -> list[dict[str, Any]]:
    """Batch stages ``rows`` as complete ("X") slices on their replica's stage thread."""
    begin = stages["start"][rows]
    ts_begin, ts_end = _us(begin), _us(begin + stages["duration"][rows])
    replica = stages["replica"][rows]
    used = np.round(kv[rows] * blocks[replica.astype(np.int64)]).astype(np.int64)
    columns = zip(
        ts_begin.tolist(),
        np.round(ts_end - ts_begin, 3).tolist(),
        replica.tolist(),
        stages["stage"][rows].tolist(),
        stages["batch_id"][rows].tolist(),
        stages["num_requests"][rows].tolist(),
        stages["num_prefill_tokens"][rows].tolist(),
        stages["num_decode_tokens"][rows].tolist(),
        used.tolist(),
        np.round(kv[rows], 6).tolist(),
        strict=True,
    )
    return [
        {
            "name": "mixed" if prefill and decode else ("prefill" if prefill else "decode"),
            "cat": "batch",
            "ph": "X",
            "ts": ts,
            "dur": dur,
            "pid": 1 + r,
            "tid": stage,
            "args": {
                "batch_id": batch,
                "num_requests": n,
                "prefill_tokens": prefill,
                "decode_tokens": decode,
                "kv_blocks_used": blocks_used,
                "kv_use_fraction": fraction,
            },
        }
        for ts, dur, r, stage, batch, n, prefill, decode, blocks_used, fraction in columns
    ]


def _arrivals(c: dict[str, np.ndarray], names: list[str], rows: np.ndarray) -> list[dict[str, Any]]:
    """Requests ``rows``' arrivals as instants on the cluster track, with the replica each
    was routed to (a P/D request's prefill replica)."""
    routed = np.where(c["prefill_replica"] >= 0, c["prefill_replica"], c["replica"])[rows]
    columns = zip(
        _us(c["arrived_at"][rows]).tolist(),
        c["request_id"][rows].tolist(),
        c["num_prefill_tokens"][rows].tolist(),
        c["num_decode_tokens"][rows].tolist(),
        routed.tolist(),
        strict=True,
    )
    return [
        {
            "name": "arrival",
            "cat": "request",
            "ph": "i",
            "s": "t",
            "ts": ts,
            "pid": CLUSTER_PID,
            "tid": 0,
            "args": {
                "request_id": request,
                "prompt_tokens": prompt,
                "output_tokens": output,
                "routed_to": names[r],
            },
        }
        for ts, request, prompt, output, r in columns
    ]


def _completions(c: dict[str, np.ndarray], rows: np.ndarray) -> list[dict[str, Any]]:
    """Requests ``rows``' completions as instants on the ``requests`` thread of the replica
    that finished each."""
    columns = zip(
        _us(c["completed_at"][rows]).tolist(),
        c["replica"][rows].tolist(),
        c["request_id"][rows].tolist(),
        np.round(c["ttft"][rows] * 1e3, 3).tolist(),
        np.round(c["e2e"][rows] * 1e3, 3).tolist(),
        strict=True,
    )
    return [
        {
            "name": "completion",
            "cat": "request",
            "ph": "i",
            "s": "t",
            "ts": ts,
            "pid": 1 + r,
            "tid": REQUESTS_TID,
            "args": {"request_id": request, "ttft_ms": ttft, "e2e_ms": e2e},
        }
        for ts, r, request, ttft, e2e in columns
    ]


def _metadata(total: int, names: list[str], stages: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """Metadata events naming (and ordering) the processes and threads."""
    num_stages = int(stages["stage"].max()) + 1 if stages["stage"].size else 1
    meta: list[dict[str, Any]] = []

    def name(pid: int, tid: int | None, text: str, sort: int) -> None:
        kind = "process" if tid is None else "thread"
        base = {"ph": "M", "pid": pid, "tid": tid or 0, "ts": 0}
        meta.append({**base, "name": f"{kind}_name", "args": {"name": text}})
        meta.append({**base, "name": f"{kind}_sort_index", "args": {"sort_index": sort}})

    name(CLUSTER_PID, None, "cluster", 0)
    name(CLUSTER_PID, 0, "arrivals (routing)", 0)
    for r in range(total):
        name(1 + r, None, names[r], 1 + r)
        for s in range(num_stages):
            name(1 + r, s, f"stage {s}" if num_stages > 1 else "batches", s)
        name(1 + r, REQUESTS_TID, "requests", REQUESTS_TID)
    return meta


def write_trace_events(
    result: _Result,
    path: str | os.PathLike[str],
    *,
    window_s: tuple[float, ...] = (),
    requests: tuple[int, ...] = (),
    max_events: int = DEFAULT_MAX_EVENTS,
    stages: dict[str, np.ndarray] | None = None,
) -> TraceInfo:
    """Writes ``trace_events(result, ...)`` to ``path`` (renamed in whole over what had that
    name, a link replaced rather than written through: ``tokenyard._output``).

    Raises:
        ConfigError: the run recorded no batch stages, or ``path``'s folder is a file.
        OSError: the file could not be written.
    """
    document, info = trace_events(
        result, window_s=window_s, requests=requests, max_events=max_events, stages=stages
    )
    target = Path(path)
    write_text(target.parent, target.name, json.dumps(document, separators=(",", ":")))
    return info
