"""Sessions (multi-turn conversations and agents) and closed-loop load: the workload's
shape (prompts grow by the previous output, shared ids), the simulator's rules (a turn is
sent a think time after the previous one completes, turns never overlap, at most N users in
flight), the summary's session metrics, determinism and typed errors."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from exec_models import FAST_LINEAR
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenyard.cli import main
from tokenyard.errors import ConfigError, InputError
from tokenyard.simulation import config_from_mapping, simulate
from tokenyard.workload import (
    NO_SESSION,
    ClosedLoop,
    LengthDistribution,
    RequestChunk,
    SessionWorkload,
    ThinkTime,
    TraceError,
    load_workload,
)

STEP_MODEL = FAST_LINEAR
REPLICA_POLICIES = [
    "vllm",
    "sarathi",
    "orca",
    "lightllm",
    "faster_transformer",
    "vllm_v1",
    "sglang",
]


def sessions_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "kind": "sessions",
        "num_sessions": 12,
        "seed": 3,
        "hash_block_size": 4,
        "turns": {"kind": "uniform", "low": 1, "high": 5},
        "first_prompt_tokens": {"kind": "uniform", "low": 8, "high": 40},
        "input_tokens": {"kind": "uniform", "low": 1, "high": 12},
        "output_tokens": {"kind": "uniform", "low": 1, "high": 10},
        "think_time": {"kind": "exponential", "mean_s": 0.5},
        "arrival": {"kind": "poisson", "qps": 4.0},
    }
    spec.update(overrides)
    return spec


def sim_config(workload: dict[str, Any], *, policy: str = "vllm_v1", **extra: Any) -> Any:
    scheduler: dict[str, Any] = {"policy": policy}
    if policy == "lightllm":
        scheduler["vidur"] = {"block_size": 1}
    mapping = {
        "cluster": {
            "num_replicas": extra.pop("replicas", 1),
            "global_scheduler": {"policy": extra.pop("router", "round_robin")},
        },
        "replica": {"scheduler": scheduler},
        "execution": STEP_MODEL,
        "workload": workload,
        "metrics": {"sample_interval_s": 0.0},
    }
    return config_from_mapping(mapping)


def turns_of(workload: SessionWorkload) -> list[tuple[int, int, int, list[int], float]]:
    """(session, prompt, output, ids, delay) per turn, in stream order."""
    rows = []
    for chunk in workload.chunks(7):
        assert chunk.session_ids is not None
        assert chunk.delay_s is not None
        assert chunk.hash_offsets is not None
        assert chunk.hash_ids is not None
        for i in range(len(chunk)):
            ids = chunk.hash_ids[int(chunk.hash_offsets[i]) : int(chunk.hash_offsets[i + 1])]
            rows.append(
                (
                    int(chunk.session_ids[i]),
                    int(chunk.num_prefill_tokens[i]),
                    int(chunk.num_decode_tokens[i]),
                    [int(x) for x in ids],
                    float(chunk.delay_s[i]),
                )
            )
    return rows


def test_a_turns_prompt_is_the_previous_prompt_and_output_plus_new_input_with_shared_ids() -> None:
    workload = load_workload(sessions_spec())
    assert isinstance(workload, SessionWorkload)
    rows = turns_of(workload)
    block = 4
    by_session: dict[int, list[tuple[int, int, int, list[int], float]]] = {}
    for row in rows:
        by_session.setdefault(row[0], []).append(row)
    assert sorted(by_session) == list(range(12))
    for turns in by_session.values():
        assert 1 <= len(turns) <= 5
        for (_, p0, d0, ids0, _), (_, p1, _d1, ids1, _) in itertools.pairwise(turns):
            assert 1 <= p1 - (p0 + d0) <= 12, "new input between 1 and 12 tokens"
            assert ids1[: len(ids0)] == ids0, "the next turn repeats this turn's ids"
        for _, p, d, ids, _ in turns:
            assert len(ids) == -(-(p + d) // block), "ids cover the prompt and the output"
    all_ids = [i for turns in by_session.values() for i in turns[-1][3]]
    assert len(all_ids) == len(set(all_ids)), "sessions share no ids"


def test_the_stream_is_the_same_whatever_the_chunk_size_and_describe_round_trips() -> None:
    workload = load_workload(sessions_spec())
    again = load_workload(workload.describe())
    first = [c for c in workload.chunks(5)]
    whole = next(iter(again.chunks(10_000)))
    assert np.array_equal(
        np.concatenate([c.num_prefill_tokens for c in first]), whole.num_prefill_tokens
    )
    assert np.array_equal(np.concatenate([c.delay_s for c in first]), whole.delay_s)


def test_max_context_tokens_ends_a_session_before_it_outgrows_the_window() -> None:
    spec = sessions_spec(max_context_tokens=60, turns={"kind": "fixed", "value": 20})
    for _, p, d, _, _ in turns_of(load_workload(spec)):
        assert p + d <= 60


def test_turns_are_sent_a_think_time_after_the_previous_completes_and_never_overlap() -> None:
    result = simulate(sim_config(sessions_spec()))
    c = result.columns
    rows = turns_of(load_workload(sessions_spec()))
    assert len(c["request_id"]) == len(rows)
    assert list(c["request_id"]) == list(range(len(rows)))
    delays = np.array([r[4] for r in rows])
    for s in range(12):
        chosen = np.flatnonzero(c["session_id"] == s)
        assert list(c["turn"][chosen]) == list(range(len(chosen)))
        for a, b in itertools.pairwise(chosen):
            assert c["arrived_at"][b] == pytest.approx(c["completed_at"][a] + delays[b])


def test_the_summary_reports_session_times_and_ttft_and_hits_per_turn() -> None:
    result = simulate(sim_config(sessions_spec()))
    c, sessions = result.columns, result.summary["sessions"]
    assert sessions["num_sessions"] == 12
    times = [
        c["completed_at"][c["session_id"] == s].max() - c["arrived_at"][c["session_id"] == s].min()
        for s in range(12)
    ]
    assert sessions["session_time_s"]["mean"] == pytest.approx(np.mean(times))
    first = sessions["per_turn"]["0"]
    assert first["count"] == 12
    assert first["ttft_mean"] == pytest.approx(c["ttft"][c["turn"] == 0].mean())
    assert first["prefix_hit_rate"] == 0.0, "a first turn shares nothing"
    later = [v["prefix_hit_rate"] for k, v in sessions["per_turn"].items() if k != "0"]
    assert min(later) > 0.5, "one replica: every later turn hits its conversation so far"


def test_prefix_affinity_keeps_a_conversation_on_its_replica() -> None:
    spec = sessions_spec(num_sessions=40)
    spread = simulate(sim_config(spec, replicas=4, router="round_robin"))
    kept = simulate(sim_config(spec, replicas=4, router="prefix_affinity"))
    hit = lambda r: r.summary["throughput"]["prefix_hit_rate"]  # noqa: E731
    assert hit(kept) > hit(spread) + 0.2


@settings(max_examples=20, deadline=None)
@given(
    policy=st.sampled_from(REPLICA_POLICIES),
    seed=st.integers(0, 2**16),
    concurrency=st.one_of(st.none(), st.integers(1, 4)),
    replicas=st.integers(1, 3),
)
def test_every_turn_completes_once_turns_never_overlap_and_runs_repeat(
    policy: str, seed: int, concurrency: int | None, replicas: int
) -> None:
    spec = sessions_spec(seed=seed, num_sessions=8)
    if concurrency is not None:
        spec["closed_loop"] = {"concurrency": concurrency}
    config = sim_config(spec, policy=policy, replicas=replicas)
    first, second = simulate(config), simulate(config)
    c = first.columns
    num_turns = len(turns_of(load_workload(sessions_spec(seed=seed, num_sessions=8))))
    assert sorted(c["request_id"]) == list(range(num_turns))
    for name in ("arrived_at", "first_token_at", "completed_at", "replica", "turn"):
        assert np.array_equal(c[name], second.columns[name]), name
    for s in np.unique(c["session_id"]):
        chosen = np.flatnonzero(c["session_id"] == s)
        chosen = chosen[np.argsort(c["turn"][chosen])]
        assert (c["arrived_at"][chosen[1:]] >= c["completed_at"][chosen[:-1]] - 1e-12).all()
    if concurrency is not None:
        assert max_in_flight(c) <= concurrency


def max_in_flight(c: dict[str, np.ndarray]) -> int:
    starts = np.stack([c["arrived_at"], np.ones_like(c["arrived_at"])], axis=1)
    ends = np.stack([c["completed_at"], -np.ones_like(c["completed_at"])], axis=1)
    events = np.concatenate([starts, ends])
    # Completions first at equal times: a user sends its next request as the last completes.
    order = np.lexsort((events[:, 1], events[:, 0]))
    return int(np.cumsum(events[order, 1]).max())


@settings(max_examples=15, deadline=None)
@given(concurrency=st.integers(1, 6), seed=st.integers(0, 1000))
def test_closed_loop_never_exceeds_n_in_flight_and_is_saturated(
    concurrency: int, seed: int
) -> None:
    workload = {
        "kind": "synthetic",
        "num_requests": 30,
        "seed": seed,
        "arrival": {"kind": "poisson", "qps": 1000.0},
        "prompt_tokens": {"kind": "uniform", "low": 4, "high": 60},
        "output_tokens": {"kind": "uniform", "low": 1, "high": 20},
        "closed_loop": {"concurrency": concurrency},
    }
    result = simulate(sim_config(workload, replicas=2))
    assert max_in_flight(result.columns) == min(concurrency, 30)


def test_closed_loop_think_time_delays_each_users_next_request() -> None:
    workload = {
        "kind": "synthetic",
        "num_requests": 6,
        "arrival": {"kind": "constant", "qps": 1000.0},
        "prompt_tokens": {"kind": "fixed", "value": 10},
        "output_tokens": {"kind": "fixed", "value": 2},
        "closed_loop": {"concurrency": 1, "think_time": {"kind": "fixed", "value_s": 2.5}},
    }
    c = simulate(sim_config(workload)).columns
    assert c["arrived_at"][0] == 0.0, "the first request of each user starts at once"
    assert np.allclose(c["arrived_at"][1:], c["completed_at"][:-1] + 2.5)


def test_closed_loop_round_trips_through_describe() -> None:
    workload = load_workload(
        {
            **sessions_spec(),
            "closed_loop": {"concurrency": 3, "think_time": {"kind": "fixed", "value_s": 1.0}},
        }
    )
    assert isinstance(workload, ClosedLoop)
    assert workload.concurrency == 3
    again = load_workload(workload.describe())
    assert isinstance(again, ClosedLoop)
    assert again.describe() == workload.describe()


@pytest.mark.parametrize(
    ("spec", "key"),
    [
        ({"think_time": {"kind": "exponential"}}, "workload.think_time.mean_s"),
        ({"think_time": {"kind": "fixed", "value_s": -1}}, "workload.think_time.value_s"),
        ({"think_time": {"kind": "fixed", "value_s": 1, "sigma": 2}}, "workload.think_time.sigma"),
        ({"num_sessions": 0}, "workload.num_sessions"),
        ({"max_context_tokens": 1}, "workload.max_context_tokens"),
        ({"turns": {"kind": "fixed"}}, "workload.turns.value"),
        ({"closed_loop": {"concurrency": 0}}, "workload.closed_loop.concurrency"),
        ({"closed_loop": {}}, "workload.closed_loop.concurrency"),
        ({"closed_loop": {"concurrency": 2, "users": 3}}, "workload.closed_loop.users"),
    ],
)
def test_bad_session_and_closed_loop_configs_name_the_key(spec: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_workload(sessions_spec(**spec))
    assert caught.value.field == key, caught.value.message
    assert key in caught.value.message


def test_a_chunk_checks_its_session_columns() -> None:
    base = RequestChunk(np.zeros(2), np.ones(2, dtype=np.uint32), np.ones(2, dtype=np.uint32))
    with pytest.raises(InputError, match="go together"):
        dataclasses.replace(base, session_ids=np.zeros(2, dtype=np.uint64))
    with pytest.raises(InputError, match="delay_s"):
        dataclasses.replace(
            base, session_ids=np.zeros(2, dtype=np.uint64), delay_s=np.array([0.0, -1.0])
        )
    with pytest.raises(InputError, match="2\\*\\*63"):
        dataclasses.replace(
            base, session_ids=np.array([2**63, 0], dtype=np.uint64), delay_s=np.zeros(2)
        )
    fine = dataclasses.replace(
        base, session_ids=np.array([NO_SESSION, 0], dtype=np.uint64), delay_s=np.zeros(2)
    )
    assert len(fine) == 2


def test_the_cli_prints_the_session_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "sessions.toml"
    config.write_text(
        """
[workload]
kind = "sessions"
num_sessions = 20
turns = {kind = "uniform", low = 2, high = 4}
first_prompt_tokens = {kind = "fixed", value = 300}
input_tokens = {kind = "fixed", value = 50}
output_tokens = {kind = "fixed", value = 40}
think_time = {kind = "fixed", value_s = 1.0}
arrival = {kind = "poisson", qps = 2.0}
"""
    )
    assert main(["simulate", str(config)]) == 0
    out = capsys.readouterr().out
    assert "sessions: 20 of" in out
    assert "TTFT by turn: 0:" in out


def test_think_time_draws_are_seeded_and_capped() -> None:
    rng = np.random.default_rng(0)
    draws = ThinkTime(kind="lognormal", median_s=10.0, sigma=5.0).draw(rng, 1000)
    assert draws.max() <= 86400.0
    assert draws.min() >= 0.0
    again = ThinkTime(kind="lognormal", median_s=10.0, sigma=5.0).draw(
        np.random.default_rng(0), 1000
    )
    assert np.array_equal(draws, again)
    assert LengthDistribution(kind="fixed", value=3).describe() == {
        "kind": "fixed",
        "value": 3,
        "min_tokens": 1,
    }


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def trace_config(path: Path, trace_format: str, **options: Any) -> Any:
    return sim_config({"kind": "trace", "format": trace_format, "path": str(path), **options})


def test_a_session_trace_with_delays_sends_each_turn_after_the_previous_completes(
    tmp_path: Path,
) -> None:
    rows = [
        {"session_id": "a", "timestamp": 10.0, "input_length": 40, "output_length": 8},
        {"session_id": "b", "timestamp": 11.0, "input_length": 30, "output_length": 4},
        {"session_id": "a", "delay": 2.0, "input_length": 60, "output_length": 8},
        {"session_id": "b", "timestamp": 11.5, "input_length": 44, "output_length": 4},
    ]
    result = simulate(trace_config(write_jsonl(tmp_path / "s.jsonl", rows), "sessions"))
    c = result.columns
    assert list(c["session_id"]) == [0, 1, 0, 1]
    assert list(c["turn"]) == [0, 0, 1, 1]
    assert list(c["arrived_at"][:2]) == [0.0, 1.0], "shifted to start at 0"
    assert c["arrived_at"][2] == pytest.approx(c["completed_at"][0] + 2.0)
    # Stamped 1.5 s but sent only when its previous turn completes, if that is later.
    assert c["arrived_at"][3] == pytest.approx(max(1.5, c["completed_at"][1]))
    # No ids in the trace: each conversation gets its own run, so later turns hit.
    assert c["prefix_hit_tokens"][2] > 0
    assert c["prefix_hit_tokens"][3] > 0


def test_a_bailian_trace_chains_chats_into_sessions(tmp_path: Path) -> None:
    rows = [
        {
            "chat_id": 5,
            "parent_chat_id": -1,
            "timestamp": 100.0,
            "input_length": 20,
            "output_length": 4,
            "type": "text",
            "turn": 1,
            "hash_ids": [1, 2],
        },
        {
            "chat_id": 6,
            "parent_chat_id": 99,
            "timestamp": 100.5,
            "input_length": 20,
            "output_length": 4,
            "type": "text",
            "turn": 3,
            "hash_ids": [7, 8],
        },
        {
            "chat_id": 7,
            "parent_chat_id": 5,
            "timestamp": 101.0,
            "input_length": 40,
            "output_length": 4,
            "type": "text",
            "turn": 2,
            "hash_ids": [1, 2, 3],
        },
        {
            "chat_id": 8,
            "parent_chat_id": 7,
            "timestamp": 200.0,
            "input_length": 50,
            "output_length": 4,
            "type": "text",
            "turn": 3,
            "hash_ids": [1, 2, 3, 4],
        },
    ]
    path = write_jsonl(tmp_path / "bailian.jsonl", rows)
    c = simulate(trace_config(path, "bailian")).columns
    assert list(c["session_id"]) == [0, 1, 0, 0], "an unknown parent starts a session"
    assert list(c["turn"]) == [0, 0, 1, 2]
    assert c["arrived_at"][3] == pytest.approx(100.0)
    assert c["prefix_hit_tokens"][2] == 16, "the parent's first full 16-token block"


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ({"session_id": "a", "timestamp": 0, "output_length": 3}, "input_length"),
        ({"session_id": "a", "delay": 1, "input_length": 3, "output_length": 3}, "timestamp"),
        ({"session_id": None, "timestamp": 0, "input_length": 3, "output_length": 3}, "session_id"),
        ({"session_id": "a", "timestamp": -1, "input_length": 3, "output_length": 3}, "timestamp"),
        (
            {
                "session_id": "a",
                "timestamp": 0,
                "input_length": 3,
                "output_length": 3,
                "hash_ids": [1, 2, 3],
            },
            "hash_ids",
        ),
        (
            {"session_id": "a", "timestamp": 0, "input_length": 0, "output_length": 3},
            "input_length",
        ),
    ],
)
def test_a_bad_session_trace_row_names_the_file_line_and_field(
    tmp_path: Path, row: dict[str, Any], field: str
) -> None:
    first = {"session_id": "z", "timestamp": 0, "input_length": 5, "output_length": 1}
    path = write_jsonl(tmp_path / "bad.jsonl", [first, row])
    with pytest.raises(TraceError) as caught:
        list(load_workload({"kind": "trace", "format": "sessions", "path": str(path)}).chunks())
    assert (caught.value.line, caught.value.field) == (2, field), caught.value.message
    assert "bad.jsonl:2" in caught.value.message


def test_session_trace_timestamps_must_not_go_back_and_describe_round_trips(tmp_path: Path) -> None:
    rows = [
        {"session_id": 1, "timestamp": 5, "input_length": 5, "output_length": 1},
        {"session_id": 2, "timestamp": 4, "input_length": 5, "output_length": 1},
    ]
    path = write_jsonl(tmp_path / "back.jsonl", rows)
    workload = load_workload({"kind": "trace", "format": "sessions", "path": str(path)})
    with pytest.raises(TraceError, match="must not decrease"):
        list(workload.chunks())
    assert load_workload(workload.describe()).describe() == workload.describe()


def reference_send_times(
    chunk: RequestChunk, completed: np.ndarray, concurrency: int | None
) -> np.ndarray:
    """A pure-Python model of the sending rules (docs/sessions.md), given when each request
    completed. A later turn is sent at max(arrival, previous turn's completion + delay).
    Open loop: a lead (a session's first turn) at its arrival. Closed loop (a session is a
    run of consecutive turns): the first N leads at their arrival, lead k >= N when the
    (k - N)-th session to end, in time order, frees its user, plus its delay."""
    arrived = chunk.arrived_at
    if chunk.session_ids is None or chunk.delay_s is None:  # requests on their own
        sessions, delays = [NO_SESSION] * len(chunk), np.zeros(len(chunk))
    else:
        sessions, delays = chunk.session_ids.tolist(), chunk.delay_s
    sent = np.empty(len(chunk))
    previous: dict[int, int] = {}
    leads: list[int] = []
    for i, s in enumerate(sessions):
        p = None if s == NO_SESSION else previous.get(s)
        closed_lead = concurrency is not None and p != i - 1
        if p is None or closed_lead:
            leads.append(i)
            sent[i] = arrived[i]
        else:
            sent[i] = max(arrived[i], completed[p] + delays[i])
        previous[s] = i
    if concurrency is not None:
        bounds = [*leads, len(chunk)]
        ends = sorted(completed[bounds[k + 1] - 1] for k in range(len(leads)))
        for k, lead in enumerate(leads[concurrency:]):
            sent[lead] = max(arrived[lead], ends[k] + delays[lead])
    return sent


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    concurrency=st.one_of(st.none(), st.integers(1, 5)),
    policy=st.sampled_from(["vllm_v1", "sglang", "sarathi"]),
    lone=st.booleans(),
)
def test_send_times_match_the_python_reference_model(
    seed: int, concurrency: int | None, policy: str, lone: bool
) -> None:
    spec = sessions_spec(seed=seed, num_sessions=10)
    if lone:
        spec = {
            "kind": "synthetic",
            "num_requests": 30,
            "seed": seed,
            "arrival": {"kind": "poisson", "qps": 5.0},
            "prompt_tokens": {"kind": "uniform", "low": 4, "high": 60},
            "output_tokens": {"kind": "uniform", "low": 1, "high": 20},
        }
    if concurrency is not None:
        spec["closed_loop"] = {
            "concurrency": concurrency,
            "think_time": {"kind": "exponential", "mean_s": 0.3},
            "seed": seed,
        }
    workload = load_workload(spec)
    chunk = next(iter(workload.chunks(100_000)))
    c = simulate(sim_config(spec, policy=policy, replicas=2)).columns
    expected = reference_send_times(chunk, c["completed_at"], concurrency)
    assert np.array_equal(c["arrived_at"], expected)


def test_the_cli_names_closed_loop_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "closed.toml"
    config.write_text(
        """
[workload]
kind = "synthetic"
num_requests = 50
arrival = {kind = "poisson", qps = 1e6}
prompt_tokens = {kind = "fixed", value = 200}
output_tokens = {kind = "fixed", value = 20}
closed_loop = {concurrency = 8}
"""
    )
    assert main(["simulate", str(config)]) == 0
    assert "closed-loop load: 8 users" in capsys.readouterr().out


def test_sessions_closed_loop_speculative_decoding_and_lora_run_together() -> None:
    lengths = {
        "first_prompt_tokens": {"kind": "uniform", "low": 200, "high": 400},
        "input_tokens": {"kind": "uniform", "low": 20, "high": 50},
        "output_tokens": {"kind": "uniform", "low": 20, "high": 60},
    }
    workload = {
        **sessions_spec(num_sessions=30, seed=11, **lengths),
        "closed_loop": {"concurrency": 6},
        "lora": {"num_adapters": 3, "popularity": "uniform", "seed": 1},
    }
    mapping = {
        "cluster": {"num_replicas": 2, "global_scheduler": {"policy": "prefix_affinity"}},
        "replica": {
            "lora": {"max_loras": 2},
            "speculative": {"method": "ngram", "num_speculative_tokens": 3, "acceptance_rate": 0.7},
        },
        "workload": workload,
    }
    result = simulate(config_from_mapping(mapping))
    c = result.columns
    rows = turns_of(load_workload(sessions_spec(num_sessions=30, seed=11, **lengths)))
    assert sorted(c["request_id"]) == list(range(len(rows)))
    assert max_in_flight(c) <= 6
    assert result.summary["speculative"]["acceptance_rate"] > 0.5
    assert result.summary["lora"]["adapter_loads"] > 0
    # A session keeps its adapter (an adapter's KV is its own), so later turns still hit.
    chunk = next(iter(load_workload(workload).chunks(100_000)))
    assert chunk.session_ids is not None
    assert chunk.lora_ids is not None
    for session in np.unique(chunk.session_ids):
        assert len(set(chunk.lora_ids[chunk.session_ids == session])) == 1
    later = c["turn"] > 0
    assert c["prefix_hit_tokens"][later].sum() > 0.8 * c["num_prefill_tokens"][later].sum()


def test_a_turn_position_with_no_requests_left_does_not_break_the_summary(
    tmp_path: Path,
) -> None:
    rows = [
        {"session_id": "a", "timestamp": 0, "input_length": 10, "output_length": 2},
        {"session_id": "a", "delay": 0.1, "input_length": 5000, "output_length": 2},
        {"session_id": "a", "delay": 0.1, "input_length": 20, "output_length": 2},
    ]
    path = write_jsonl(tmp_path / "skip.jsonl", rows)
    mapping = {
        "replica": {"over_length": "skip", "scheduler": {"max_request_tokens": 1000}},
        "workload": {"kind": "trace", "format": "sessions", "path": str(path)},
    }
    summary = simulate(config_from_mapping(mapping)).summary
    assert summary["num_skipped_over_length"] == 1
    assert set(summary["sessions"]["per_turn"]) == {"0", "2"}


def test_closed_loop_think_times_do_not_depend_on_the_chunk_size() -> None:
    spec = {
        **sessions_spec(),
        "closed_loop": {"concurrency": 2, "think_time": {"kind": "fixed", "value_s": 99.0}},
    }
    workload = load_workload(spec)
    small = np.concatenate([c.delay_s for c in workload.chunks(7) if c.delay_s is not None])
    whole = next(iter(workload.chunks(100_000))).delay_s
    assert whole is not None
    assert np.array_equal(small, whole)


def test_a_sessions_workload_where_nothing_fits_the_context_is_an_error() -> None:
    spec = sessions_spec(max_context_tokens=4)
    with pytest.raises(InputError, match="max_context_tokens"):
        list(load_workload(spec).chunks())


def test_trace_on_the_command_line_keeps_closed_loop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        """
[workload]
kind = "synthetic"
num_requests = 10
arrival = {kind = "poisson", qps = 1.0}
prompt_tokens = {kind = "fixed", value = 10}
output_tokens = {kind = "fixed", value = 2}
closed_loop = {concurrency = 3}
"""
    )
    trace = tmp_path / "t.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,2\n1,10,2\n")
    assert main(["simulate", str(config), "--trace", str(trace)]) == 0
    assert "closed-loop load: 3 users" in capsys.readouterr().out


def test_a_closed_loop_seed_without_a_think_time_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        load_workload({**sessions_spec(), "closed_loop": {"concurrency": 2, "seed": 5}})
    assert caught.value.field == "workload.closed_loop.seed"
