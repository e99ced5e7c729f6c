"""Golden scenarios: one small, fixed scenario per replica policy, whose per-request timeline
is checked in as ``tests/golden/<policy>.json``.

The behaviour tests check what they name; these catch everything else. Any change in how a
policy batches, preempts, restarts, routes or hits the prefix cache moves some request's
scheduling, first-token or completion time (or its restart or hit count), and the test fails
with the first event that differs, in simulated-time order, and the number of requests that
differ in all. Each golden file also holds the scenario that produced it (the config mapping
and, for trace scenarios, the trace rows), so a reader sees where the numbers come from.

Updating. When a change of behaviour is intended, regenerate the files and review their diff:

    TOKENYARD_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_golden.py

The commit that changes a golden file must say in its message which policy's timeline moved
and why (the behaviour that changed). A missing file fails, naming that command.

Exactness. Times are compared with ``==``. That is robust across machines here because every
input is dyadic: the linear model's coefficients are powers of two, arrivals are multiples of
1/64 s and token counts are integers, so every time the simulator computes is a multiple of
2**-40 s and under a few seconds: it fits a double's 53 significant bits, every sum and
product is exact, and the results depend neither on the order of the additions nor on the
compiler or CPU. The test
checks that this still holds (``_off_grid``) before comparing, so a scenario that stops being
exact fails with that reason instead of a last-digit mismatch on another machine.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import tokenyard._core
from tokenyard.simulation import config_from_mapping, simulate

GOLDEN_DIR = Path(__file__).parent / "golden"
UPDATE_ENV = "TOKENYARD_UPDATE_GOLDEN"
UPDATE_COMMAND = f"{UPDATE_ENV}=1 .venv/bin/python -m pytest tests/test_golden.py"

#: The per-request timeline, in this column order in the golden files.
COLUMNS = (
    "request_id",
    "replica",
    "arrived_at",
    "scheduled_at",
    "first_token_at",
    "completed_at",
    "num_restarts",
    "prefix_hit_tokens",
)
TIME_COLUMNS = ("arrived_at", "scheduled_at", "first_token_at", "completed_at")
#: When each non-time column is known: the replica at arrival, the counts at completion.
EVENT_TIME = {
    "replica": "arrived_at",
    "num_restarts": "completed_at",
    "prefix_hit_tokens": "completed_at",
}
#: Every time in these scenarios is a multiple of this (see the module docstring).
TIME_GRID_S = 2.0**-40

#: Dyadic coefficients near the linear model's defaults (Llama-2-7B on an A100).
LINEAR = {
    "model": "linear",
    "constant_s": 2.0**-7,
    "per_prefill_token_s": 2.0**-14,
    "per_decode_token_s": 2.0**-15,
    "per_decode_context_token_s": 2.0**-22,
    "per_prefill_context_token_s": 2.0**-35,
    "cpu_overhead_s": 2.0**-10,
}
TRACE = {"kind": "trace", "format": "vidur", "path": "trace.csv"}
#: 40 requests, 32 per second: 3 shared system prompts of 128 tokens open 3 in 4 prompts.
SHARED_PREFIX_WORKLOAD = {
    "kind": "synthetic",
    "num_requests": 40,
    "seed": 0,
    "arrival": {"kind": "constant", "qps": 32},
    "prompt_tokens": {"kind": "uniform", "low": 32, "high": 192},
    "output_tokens": {"kind": "uniform", "low": 8, "high": 64},
    "shared_prefix": {"num_groups": 3, "prefix_tokens": 128, "share_ratio": 0.75},
}


def trace_rows(num_requests: int = 40) -> list[list[float | int]]:
    """A fixed, spread trace without randomness: 64 arrivals per second, prompts of 32 to
    191 tokens, outputs of 16 to 79 (4,340 prompt tokens in all)."""
    return [[i / 64, 32 + (i * 37 + 11) % 160, 16 + (i * 53 + 7) % 64] for i in range(num_requests)]


@dataclass(frozen=True)
class Scenario:
    exercises: str
    config: dict[str, Any]
    trace: list[list[float | int]] | None = None


def _vidur(
    policy: str,
    *,
    replicas: int = 1,
    router: str = "round_robin",
    stages: int = 1,
    max_request_tokens: int = 4096,  # llama-2-7b's context
    **knobs: Any,
) -> dict[str, Any]:
    """A trace scenario under one of Vidur's policies, ``knobs`` its ``vidur`` section."""
    return {
        "cluster": {"num_replicas": replicas, "global_scheduler": {"policy": router}},
        "replica": {
            "num_pipeline_stages": stages,
            "scheduler": {
                "policy": policy,
                "max_request_tokens": max_request_tokens,
                "vidur": knobs,
            },
        },
        "execution": LINEAR,
        "workload": TRACE,
    }


SCENARIOS: dict[str, Scenario] = {
    "vllm": Scenario(
        "whole prefills under the padded token limit, 128 blocks for 40 requests: preemption "
        "and restart (LIFO), on 2 pipeline stages",
        _vidur(
            "vllm",
            stages=2,
            block_size=16,
            num_blocks=128,
            max_tokens_in_batch=512,
            batch_size_cap=16,
        ),
        trace_rows(),
    ),
    "sarathi": Scenario(
        "prompts chunked under a 96-token budget beside running decodes; 48 blocks: "
        "preemption and restart (recompute)",
        _vidur("sarathi", block_size=16, num_blocks=48, chunk_size=96, batch_size_cap=16),
        trace_rows(),
    ),
    "orca": Scenario(
        "iteration-level batches of at most 8 with a full 256-token reservation each, on 2 "
        "replicas under the least-outstanding-requests router (lor)",
        _vidur(
            "orca",
            replicas=2,
            router="lor",
            max_request_tokens=256,
            block_size=16,
            num_blocks=128,
            batch_size_cap=8,
        ),
        trace_rows(),
    ),
    "lightllm": Scenario(
        "token-level memory (1,000 one-token blocks): admission by worst-case peak, prefill "
        "and decode batches apart, a waiting prompt's turn after 2 decode iterations",
        _vidur(
            "lightllm",
            block_size=1,
            num_blocks=1000,
            max_waiting_iters=2,
            max_tokens_in_batch=512,
            batch_size_cap=16,
        ),
        trace_rows(),
    ),
    "faster_transformer": Scenario(
        "static batches of 4 run until all 4 finish; a 256-token reservation per request",
        _vidur(
            "faster_transformer",
            max_request_tokens=256,
            block_size=16,
            num_blocks=256,
            batch_size_cap=4,
        ),
        trace_rows(),
    ),
    "vllm_v1": Scenario(
        "shared system prompts: prefix hits, routed by prefix_affinity over 2 replicas; "
        "chunked prefill under a 128-token budget; 48 blocks: preemption (recompute)",
        {
            "cluster": {"num_replicas": 2, "global_scheduler": {"policy": "prefix_affinity"}},
            "replica": {
                "scheduler": {
                    "policy": "vllm_v1",
                    "vllm_v1": {
                        "block_size": 16,
                        "num_blocks": 48,
                        "max_num_batched_tokens": 128,
                        "max_num_seqs": 16,
                    },
                }
            },
            "execution": LINEAR,
            "workload": SHARED_PREFIX_WORKLOAD,
        },
    ),
    "sglang": Scenario(
        "shared system prompts: radix-cache prefix hits; prompts chunked under 128 extend "
        "tokens; admission by reserved output pages (96 pages); decode batches padded to "
        "CUDA-graph sizes 1, 2, 4, 8, 16",
        {
            "cluster": {"num_replicas": 1},
            "replica": {
                "scheduler": {
                    "policy": "sglang",
                    "sglang": {
                        "page_size": 16,
                        "num_pages": 96,
                        "chunked_prefill_size": 128,
                        "max_running_requests": 16,
                        "cuda_graph_bs": [1, 2, 4, 8, 16],
                    },
                }
            },
            "execution": LINEAR,
            "workload": SHARED_PREFIX_WORKLOAD,
        },
    ),
}

Row = dict[str, Any]


def run_scenario(scenario: Scenario, tmp_path: Path) -> list[Row]:
    """The scenario's timeline: one row per request, in request-id order."""
    if scenario.trace is not None:
        with open(tmp_path / "trace.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["arrived_at", "num_prefill_tokens", "num_decode_tokens"])
            writer.writerows(scenario.trace)
    result = simulate(config_from_mapping({**scenario.config, "base_dir": str(tmp_path)}))
    columns = result.columns
    return [
        {
            name: float(columns[name][i]) if name in TIME_COLUMNS else int(columns[name][i])
            for name in COLUMNS
        }
        for i in range(len(columns["request_id"]))
    ]


def _off_grid(rows: Sequence[Row]) -> str | None:
    for row in rows:
        for name in TIME_COLUMNS:
            if not math.isfinite(row[name]) or (row[name] / TIME_GRID_S) % 1 != 0:
                return f"request {row['request_id']} {name} = {row[name]!r}"
    return None


def _events(rows: Sequence[Row]) -> dict[tuple[int, str], tuple[float, Any]]:
    """Each request's row as events ``(request id, column) -> (time, value)``: a time
    column happens at its value, the replica at arrival, the counts at completion."""
    events: dict[tuple[int, str], tuple[float, Any]] = {}
    for row in rows:
        rid = row["request_id"]
        for name in COLUMNS[1:]:
            events[rid, name] = (row[EVENT_TIME.get(name, name)], row[name])
    return events


def compare_timelines(expected: Sequence[Row], got: Sequence[Row]) -> str | None:
    """None if the timelines are equal, else a message naming the first differing event in
    simulated-time order (ties: request id, then column order) and how many requests
    differ."""
    want, have = _events(expected), _events(got)
    order = {name: i for i, name in enumerate(COLUMNS)}
    differing = []
    for key in want.keys() | have.keys():
        a, b = want.get(key), have.get(key)
        if a is None or b is None or a[1] != b[1]:
            times = [event[0] for event in (a, b) if event is not None]
            differing.append((min(times), key[0], order[key[1]], key, a, b))
    if not differing:
        return None
    differing.sort(key=lambda d: d[:3])
    when, _, _, (rid, name), a, b = differing[0]
    expected_value = "no such request" if a is None else repr(a[1])
    got_value = "no such request" if b is None else repr(b[1])
    num_rows = len({d[1] for d in differing})
    num_all = len({row["request_id"] for row in (*expected, *got)})
    return (
        f"first differing event: request {rid} {name}: expected {expected_value}, "
        f"got {got_value} (at t = {when!r} s); {num_rows} of {num_all} requests differ"
    )


def _document(policy: str, scenario: Scenario, rows: Sequence[Row]) -> dict[str, Any]:
    return {
        "policy": policy,
        "exercises": scenario.exercises,
        "config": scenario.config,
        "trace": scenario.trace,
        "columns": list(COLUMNS),
        "requests": [[row[name] for name in COLUMNS] for row in rows],
    }


def write_golden(path: Path, document: Mapping[str, Any]) -> None:
    """One request (and one trace row) per line; floats as ``repr`` writes them, which
    reads back to the same double."""

    def block(rows: Sequence[Sequence[Any]] | None) -> str:
        if rows is None:
            return "null"
        return "[\n" + ",\n".join("    " + json.dumps(list(r)) for r in rows) + "\n  ]"

    config = json.dumps(document["config"], indent=2).replace("\n", "\n  ")
    text = (
        "{\n"
        f'  "policy": {json.dumps(document["policy"])},\n'
        f'  "exercises": {json.dumps(document["exercises"])},\n'
        f'  "config": {config},\n'
        f'  "trace": {block(document["trace"])},\n'
        f'  "columns": {json.dumps(document["columns"])},\n'
        f'  "requests": {block(document["requests"])}\n'
        "}\n"
    )
    if json.loads(text) != json.loads(json.dumps(document)):
        raise RuntimeError(f"{path}: the golden file does not read back as written")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def read_golden(path: Path) -> tuple[dict[str, Any], list[Row]]:
    document = json.loads(path.read_text())
    rows = [dict(zip(document["columns"], r, strict=True)) for r in document["requests"]]
    return document, rows


def test_every_replica_policy_has_a_scenario() -> None:
    assert sorted(SCENARIOS) == sorted(tokenyard._core.REPLICA_POLICIES)


@pytest.mark.parametrize("policy", sorted(SCENARIOS))
def test_timeline_matches_the_golden_file(policy: str, tmp_path: Path) -> None:
    scenario = SCENARIOS[policy]
    rows = run_scenario(scenario, tmp_path)
    off_grid = _off_grid(rows)
    if off_grid is not None:
        pytest.fail(
            f"{policy}: {off_grid} is not a multiple of 2**-40 s, so exact comparison would "
            "depend on the machine; keep the scenario's inputs dyadic (module docstring)"
        )
    path = GOLDEN_DIR / f"{policy}.json"
    document = _document(policy, scenario, rows)
    if os.environ.get(UPDATE_ENV) == "1":
        write_golden(path, document)
        return
    if not path.exists():
        pytest.fail(f"{path} is missing; create it with: {UPDATE_COMMAND}")
    golden, expected = read_golden(path)
    stored = {key: golden[key] for key in ("config", "trace", "columns")}
    current = json.loads(json.dumps({key: document[key] for key in stored}))
    if stored != current:
        pytest.fail(
            f"{path}: the scenario in the test (config, trace or columns) is not the one the "
            f"golden file was made from; regenerate with: {UPDATE_COMMAND}"
        )
    mismatch = compare_timelines(expected, rows)
    if mismatch is not None:
        pytest.fail(
            f"{policy}: the timeline differs from {path.name}: {mismatch}. If the change "
            f"is intended, regenerate with {UPDATE_COMMAND} and explain it in the commit "
            "message."
        )


def _golden_rows(policy: str) -> list[Row]:
    path = GOLDEN_DIR / f"{policy}.json"
    if not path.exists():
        pytest.fail(f"{path} is missing; create it with: {UPDATE_COMMAND}")
    return read_golden(path)[1]


def test_the_comparator_names_the_perturbed_request_and_event() -> None:
    expected = _golden_rows("sarathi")
    got = [dict(row) for row in expected]
    victim = got[len(got) // 2]
    victim["first_token_at"] += 2.0**-10
    message = compare_timelines(expected, got)
    assert message is not None
    assert message.startswith(
        f"first differing event: request {victim['request_id']} first_token_at: "
        f"expected {expected[len(got) // 2]['first_token_at']!r}, "
        f"got {victim['first_token_at']!r}"
    )
    assert message.endswith(f"1 of {len(expected)} requests differ")
    assert compare_timelines(expected, expected) is None


def test_the_comparator_reports_the_earliest_difference_first() -> None:
    expected = _golden_rows("vllm_v1")
    got = [dict(row) for row in expected]
    last = max(got, key=lambda row: row["completed_at"])
    first = min((row for row in got if row is not last), key=lambda row: row["scheduled_at"])
    last["completed_at"] += 1.0
    first["num_restarts"] += 1  # an event at its completion
    first["scheduled_at"] += 2.0**-20
    message = compare_timelines(expected, got)
    assert message is not None
    assert message.startswith(f"first differing event: request {first['request_id']} scheduled_at:")
    assert message.endswith(f"2 of {len(expected)} requests differ")
    missing = compare_timelines(expected, expected[:-1])
    assert missing is not None
    assert f"request {expected[-1]['request_id']} replica: expected" in missing
    assert "got no such request" in missing
