"""Synthetic workloads, the chunk type and load_workload (tokenyard.workload).

Statistical checks use fixed seeds and tolerances of several standard errors, so they are
deterministic and not flaky; each names the expected value it checks.
"""

from __future__ import annotations

import json
import math
import tracemalloc
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tokenyard.errors import ConfigError, InputError
from tokenyard.workload import (
    SHARED_ID_BIT,
    ArrivalProcess,
    LengthDistribution,
    RequestChunk,
    SharedPrefix,
    SyntheticWorkload,
    VidurTrace,
    load_workload,
    sample_path,
    summarize,
)
from tokenyard.workload.chunk import concat

FIXED_8 = LengthDistribution(kind="fixed", value=8)


def workload(**changes: object) -> SyntheticWorkload:
    base = SyntheticWorkload(
        num_requests=10_000,
        arrival=ArrivalProcess(kind="poisson", qps=20.0),
        prompt_tokens=LengthDistribution(kind="lognormal", median=300, sigma=0.8, max_tokens=2000),
        output_tokens=LengthDistribution(kind="zipf", low=10, high=500, theta=1.1),
        shared_prefix=SharedPrefix(num_groups=4, prefix_tokens=100, share_ratio=0.5),
        seed=7,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def collect(w: SyntheticWorkload, chunk_size: int = 65536) -> RequestChunk:
    return concat(list(w.chunks(chunk_size)))


def arrivals(process: ArrivalProcess, n: int = 20_000, seed: int = 1) -> np.ndarray:
    w = SyntheticWorkload(
        num_requests=n, arrival=process, prompt_tokens=FIXED_8, output_tokens=FIXED_8, seed=seed
    )
    return collect(w).arrived_at


def lengths(dist: LengthDistribution, n: int = 20_000, seed: int = 3) -> np.ndarray:
    w = SyntheticWorkload(
        num_requests=n,
        arrival=ArrivalProcess(kind="constant", qps=1.0),
        prompt_tokens=dist,
        output_tokens=FIXED_8,
        seed=seed,
    )
    return collect(w).num_prefill_tokens.astype(np.int64)


def assert_same(a: RequestChunk, b: RequestChunk) -> None:
    np.testing.assert_array_equal(a.arrived_at, b.arrived_at)
    np.testing.assert_array_equal(a.num_prefill_tokens, b.num_prefill_tokens)
    np.testing.assert_array_equal(a.num_decode_tokens, b.num_decode_tokens)
    assert (a.hash_ids is None) == (b.hash_ids is None)
    if a.hash_ids is not None:
        np.testing.assert_array_equal(a.hash_offsets, b.hash_offsets)
        np.testing.assert_array_equal(a.hash_ids, b.hash_ids)


# --- streaming and determinism ---------------------------------------------------------


@pytest.mark.parametrize("kind", ["poisson", "gamma", "constant", "bursty"])
def test_output_does_not_depend_on_chunk_size(kind: str) -> None:
    extra: dict[str, object] = {
        "gamma": {"cv": 2.5},
        "bursty": {"burst_qps": 100.0, "burst_duration_s": 2.0, "burst_interval_s": 10.0},
    }.get(kind, {})  # type: ignore[assignment]
    w = workload(num_requests=9000, arrival=ArrivalProcess(kind=kind, qps=5.0, **extra))  # type: ignore[arg-type]
    reference = collect(w, 65536)
    for chunk_size in (1000, 4096, 4097, 7):
        assert_same(collect(w, chunk_size), reference)


def test_chunk_size_one() -> None:
    w = workload(num_requests=300)
    chunks = list(w.chunks(1))
    assert [len(c) for c in chunks] == [1] * 300
    assert_same(concat(chunks), collect(w))


def test_chunks_have_exactly_chunk_size_requests_but_the_last() -> None:
    sizes = [len(c) for c in workload(num_requests=10_000).chunks(3000)]
    assert sizes == [3000, 3000, 3000, 1000]


def test_same_seed_same_requests_other_seed_other_requests() -> None:
    assert_same(collect(workload()), collect(workload()))
    other = collect(workload(seed=8))
    assert not np.array_equal(other.arrived_at, collect(workload()).arrived_at)


def test_first_requests_do_not_depend_on_num_requests() -> None:
    short, long = collect(workload(num_requests=5000)), collect(workload(num_requests=12_000))
    assert_same(short, long._slice(0, 5000))


def test_changing_one_component_keeps_the_other_draws() -> None:
    base = collect(workload())
    other = collect(workload(output_tokens=LengthDistribution(kind="uniform", low=1, high=9)))
    np.testing.assert_array_equal(base.arrived_at, other.arrived_at)
    np.testing.assert_array_equal(base.num_prefill_tokens, other.num_prefill_tokens)


def test_chunk_size_is_checked_at_once() -> None:
    with pytest.raises(InputError, match="chunk_size must be an int >= 1, got 0"):
        workload().chunks(0)


def test_a_million_requests_stream_in_bounded_memory() -> None:
    w = SyntheticWorkload(
        num_requests=1_000_000,
        arrival=ArrivalProcess(qps=1000.0),
        prompt_tokens=LengthDistribution(kind="uniform", low=1, high=100),
        output_tokens=FIXED_8,
    )
    tracemalloc.start()
    try:
        count = 0
        last = -1.0
        for chunk in w.chunks(8192):
            assert len(chunk) <= 8192
            assert chunk.arrived_at[0] >= last
            last = float(chunk.arrived_at[-1])
            count += len(chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 1_000_000
    # The whole workload's arrays would take 16 MB; one block and one chunk take < 1 MB.
    assert peak < 4_000_000


# --- arrivals ---------------------------------------------------------------------------


def rate(times: np.ndarray) -> float:
    return (len(times) - 1) / float(times[-1] - times[0])


def test_poisson_mean_rate_and_exponential_gaps() -> None:
    times = arrivals(ArrivalProcess(kind="poisson", qps=50.0))
    assert times[0] == 0.0
    assert (np.diff(times) >= 0).all()
    assert rate(times) == pytest.approx(50.0, rel=0.03)
    gaps = np.diff(times)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_mean_rate_and_cv(cv: float) -> None:
    times = arrivals(ArrivalProcess(kind="gamma", qps=10.0, cv=cv))
    gaps = np.diff(times)
    assert rate(times) == pytest.approx(10.0, rel=0.03 * max(1.0, cv / 2))
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.05 * max(1.0, cv / 2))


def test_gamma_with_cv_1_is_the_poisson_stream() -> None:
    poisson = arrivals(ArrivalProcess(kind="poisson", qps=3.0), n=5000)
    gamma = arrivals(ArrivalProcess(kind="gamma", qps=3.0, cv=1.0), n=5000)
    np.testing.assert_array_equal(poisson, gamma)


def test_constant_arrivals_are_exact() -> None:
    times = arrivals(ArrivalProcess(kind="constant", qps=4.0), n=10_000)
    np.testing.assert_array_equal(times, np.arange(10_000) / 4.0)


def test_bursty_rate_inside_and_outside_bursts() -> None:
    process = ArrivalProcess(
        kind="bursty", qps=5.0, burst_qps=80.0, burst_duration_s=2.0, burst_interval_s=10.0
    )
    assert process.mean_qps == pytest.approx((80 * 2 + 5 * 8) / 10)  # 20 requests/s
    times = arrivals(process, n=40_000)
    assert rate(times) == pytest.approx(20.0, rel=0.03)
    cycles = math.floor(times[-1] / 10.0)
    kept = times[times < cycles * 10.0]
    in_burst = np.mod(kept, 10.0) < 2.0
    assert in_burst.sum() / (cycles * 2.0) == pytest.approx(80.0, rel=0.03)
    assert (~in_burst).sum() / (cycles * 8.0) == pytest.approx(5.0, rel=0.05)


def test_bursty_with_no_arrivals_between_bursts() -> None:
    process = ArrivalProcess(
        kind="bursty", qps=0.0, burst_qps=50.0, burst_duration_s=1.0, burst_interval_s=4.0
    )
    times = arrivals(process, n=10_000)
    assert (np.mod(times, 4.0) <= 1.0 + 1e-9).all()
    assert rate(times) == pytest.approx(process.mean_qps, rel=0.03)


# --- lengths ----------------------------------------------------------------------------


def test_fixed_length() -> None:
    assert set(lengths(LengthDistribution(kind="fixed", value=77), n=100)) == {77}


def test_uniform_length_covers_its_range() -> None:
    values = lengths(LengthDistribution(kind="uniform", low=10, high=20))
    assert set(values) == set(range(10, 21))
    assert values.mean() == pytest.approx(15.0, rel=0.01)


def test_zipf_length_matches_its_pmf() -> None:
    values = lengths(LengthDistribution(kind="zipf", low=100, high=109, theta=1.5), n=40_000)
    weights = np.arange(1, 11, dtype=np.float64) ** -1.5
    expected = weights / weights.sum()
    observed = np.bincount(values - 100, minlength=10) / len(values)
    np.testing.assert_allclose(observed, expected, atol=0.01)


def test_zipf_theta_0_is_uniform() -> None:
    values = lengths(LengthDistribution(kind="zipf", low=1, high=4, theta=0.0))
    np.testing.assert_allclose(np.bincount(values)[1:] / len(values), 0.25, atol=0.01)


def test_lognormal_median_and_sigma() -> None:
    values = lengths(LengthDistribution(kind="lognormal", median=1000.0, sigma=0.5))
    assert np.median(values) == pytest.approx(1000.0, rel=0.03)
    assert np.log(values).std() == pytest.approx(0.5, rel=0.03)
    assert values.mean() == pytest.approx(1000.0 * math.exp(0.5**2 / 2), rel=0.03)


@pytest.mark.parametrize(
    "dist",
    [
        LengthDistribution(kind="fixed", value=5000, max_tokens=4096),
        LengthDistribution(kind="uniform", low=1, high=100, min_tokens=20, max_tokens=80),
        LengthDistribution(kind="zipf", low=1, high=1000, theta=0.5, min_tokens=3, max_tokens=9),
        LengthDistribution(kind="lognormal", median=500, sigma=3.0, min_tokens=50, max_tokens=900),
    ],
    ids=["fixed", "uniform", "zipf", "lognormal"],
)
def test_caps_are_respected(dist: LengthDistribution) -> None:
    values = lengths(dist, n=5000)
    high = dist.max_tokens or 2**32 - 1
    assert values.min() >= dist.min_tokens
    assert values.max() <= high
    assert values.max() == high  # every case above reaches its upper cap


def test_huge_lognormal_stays_under_the_request_length_bound() -> None:
    values = lengths(LengthDistribution(kind="lognormal", median=1e6, sigma=10.0), n=4096)
    assert values.min() >= 1
    assert values.max() == 2**24  # MAX_REQUEST_TOKENS


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"kind": "lognormal", "median": 512, "sigma": 100.0}, "sigma"),
        ({"kind": "fixed", "value": 2**32 - 1}, "value"),
        ({"kind": "lognormal", "median": 512, "sigma": 1.0, "max_tokens": 2**25}, "max_tokens"),
    ],
)
def test_lengths_past_the_bounds_are_refused(fields: dict[str, Any], name: str) -> None:
    with pytest.raises(ConfigError) as err:
        LengthDistribution(**fields)
    assert err.value.field == name


def test_shared_prefixes_past_the_hash_id_bound_are_refused() -> None:
    with pytest.raises(ConfigError, match="hash ids"):
        SharedPrefix(num_groups=1024, prefix_tokens=2**20, share_ratio=0.5)


# --- shared prefixes --------------------------------------------------------------------


def shared_view(chunk: RequestChunk, block: int, prefix_tokens: int) -> tuple[np.ndarray, ...]:
    """Per request: is it shared, its group, and its own (unshared) ids."""
    assert chunk.hash_offsets is not None
    assert chunk.hash_ids is not None
    offsets, ids = chunk.hash_offsets.astype(np.int64), chunk.hash_ids
    first = ids[offsets[:-1]]
    shared = (first & np.uint64(SHARED_ID_BIT)) != 0
    group = np.where(shared, (first >> np.uint64(32)) & np.uint64(2**31 - 1), 0)
    return shared, group, offsets, ids


def test_share_ratio_and_group_ids() -> None:
    w = workload(
        num_requests=20_000,
        shared_prefix=SharedPrefix(num_groups=3, prefix_tokens=64, share_ratio=0.3),
    )
    chunk = collect(w)
    shared, group, offsets, ids = shared_view(chunk, 16, 64)
    assert shared.mean() == pytest.approx(0.3, abs=0.01)
    # Every shared request starts with its group's 4 ids (64 / 16), the same for the group.
    for i in np.flatnonzero(shared)[:500]:
        g = int(group[i])
        expected = [SHARED_ID_BIT | g << 32 | j for j in range(4)]
        assert list(ids[offsets[i] : offsets[i] + 4]) == expected
        assert not (ids[offsets[i] + 4 : offsets[i + 1]] & np.uint64(SHARED_ID_BIT)).any()
    assert np.bincount(group[shared].astype(np.int64)) / shared.sum() == pytest.approx(
        [1 / 3] * 3, abs=0.02
    )
    # One id per 16 tokens, rounded up; shared prompts are longer than the prefix.
    blocks = np.diff(offsets)
    np.testing.assert_array_equal(blocks, -(-chunk.num_prefill_tokens.astype(np.int64) // 16))
    assert (chunk.num_prefill_tokens[shared] >= 65).all()


def test_request_own_ids_never_collide() -> None:
    chunk = collect(workload(num_requests=20_000))
    assert chunk.hash_ids is not None
    own = chunk.hash_ids[(chunk.hash_ids & np.uint64(SHARED_ID_BIT)) == 0]
    assert len(np.unique(own)) == len(own)
    np.testing.assert_array_equal(own, np.arange(len(own), dtype=np.uint64))


def test_group_popularity_follows_zipf() -> None:
    prefix = SharedPrefix(num_groups=5, prefix_tokens=32, share_ratio=1.0, zipf_theta=1.0)
    shared, group, _, _ = shared_view(collect(workload(shared_prefix=prefix)), 16, 32)
    assert shared.all()
    weights = 1 / np.arange(1, 6)
    np.testing.assert_allclose(np.bincount(group) / len(group), weights / weights.sum(), atol=0.02)


def test_partial_prefix_block_is_not_shared() -> None:
    prefix = SharedPrefix(num_groups=1, prefix_tokens=40, share_ratio=1.0, hash_block_size=16)
    chunk = collect(workload(num_requests=100, shared_prefix=prefix))
    assert chunk.hash_offsets is not None
    assert chunk.hash_ids is not None
    first_blocks = chunk.hash_ids[chunk.hash_offsets[:-1].astype(np.int64) + 2]
    assert not (first_blocks & np.uint64(SHARED_ID_BIT)).any()  # tokens 32..47 mix content
    assert chunk.hash_ids[1] == SHARED_ID_BIT | 1


def test_prompt_length_is_at_least_prefix_plus_one() -> None:
    prefix = SharedPrefix(num_groups=2, prefix_tokens=500, share_ratio=1.0)
    chunk = collect(
        workload(prompt_tokens=LengthDistribution(kind="fixed", value=10), shared_prefix=prefix)
    )
    assert set(chunk.num_prefill_tokens.tolist()) == {501}


def test_no_prefix_identity_without_shared_prefix() -> None:
    w = workload(shared_prefix=None)
    assert w.hash_block_size is None
    chunk = next(w.chunks())
    assert chunk.hash_offsets is None
    assert chunk.hash_ids is None
    assert workload().hash_block_size == 16


# --- config validation ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "field", "message"),
    [
        (lambda: ArrivalProcess(kind="poison", qps=1.0), "kind", "unknown value 'poison'"),  # type: ignore[arg-type]
        (
            lambda: ArrivalProcess(qps=0.0),
            "qps",
            "must be a finite number > 0 and <= 1e+09, got 0.0",
        ),
        (lambda: ArrivalProcess(qps=math.inf), "qps", "got inf"),
        (lambda: ArrivalProcess(qps=True), "qps", "got True"),
        (lambda: ArrivalProcess(qps=1.0, cv=2.0), "cv", "does not apply to kind='poisson'"),
        (lambda: ArrivalProcess(kind="gamma", qps=1.0, cv=0.0), "cv", "> 0"),
        (lambda: ArrivalProcess(qps=1.0, burst_qps=3.0), "burst_qps", "does not apply"),
        (
            lambda: ArrivalProcess(kind="bursty", qps=1.0, burst_qps=3.0, burst_duration_s=1.0),
            "burst_interval_s",
            "required when kind='bursty'",
        ),
        (
            lambda: ArrivalProcess(
                kind="bursty", qps=1.0, burst_qps=3.0, burst_duration_s=5.0, burst_interval_s=5.0
            ),
            "burst_duration_s",
            "must be < burst_interval_s=5.0",
        ),
        (lambda: LengthDistribution(kind="fixed"), "value", "required when kind='fixed'"),
        (lambda: LengthDistribution(kind="fixed", value=0), "value", "got 0"),
        (lambda: LengthDistribution(kind="fixed", value=2.5), "value", "must be an int"),  # type: ignore[arg-type]
        (lambda: LengthDistribution(kind="fixed", value=3, low=2), "low", "does not apply"),
        (lambda: LengthDistribution(kind="uniform", low=9, high=3), "high", "in [9, 16777216]"),
        (lambda: LengthDistribution(kind="zipf", low=1, high=2**23, theta=1.0), "high", "support"),
        (lambda: LengthDistribution(kind="zipf", low=1, high=9, theta=-1), "theta", ">= 0"),
        (lambda: LengthDistribution(kind="lognormal", median=0, sigma=1.0), "median", "> 0"),
        (
            lambda: LengthDistribution(kind="fixed", value=3, min_tokens=10, max_tokens=5),
            "max_tokens",
            "in [10,",
        ),
        (
            lambda: SharedPrefix(num_groups=0, prefix_tokens=5, share_ratio=0.5),
            "num_groups",
            "in [1, 4194304], got 0",
        ),
        (
            lambda: SharedPrefix(num_groups=1, prefix_tokens=5, share_ratio=1.5),
            "share_ratio",
            "<= 1",
        ),
        (
            lambda: SharedPrefix(num_groups=1, prefix_tokens=5, share_ratio=1, hash_block_size=0),
            "hash_block_size",
            "in [1, 16777216], got 0",
        ),
        (lambda: workload(num_requests=0), "num_requests", "in [1, 100000000]"),
        (lambda: workload(seed=-1), "seed", "in [0,"),
        (lambda: workload(arrival={"qps": 1}), "arrival", "must be a ArrivalProcess, got dict"),
        (lambda: workload(shared_prefix=3), "shared_prefix", "must be a SharedPrefix or None"),
    ],
    ids=lambda case: case if isinstance(case, str) and case.isidentifier() else "",
)
def test_invalid_config_names_the_field(build: object, field: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        build()  # type: ignore[operator]
    assert caught.value.field == field
    assert f".{field}: " in str(caught.value)
    assert message in str(caught.value)


# --- the chunk type -----------------------------------------------------------------------


def make_chunk(**changes: object) -> RequestChunk:
    arrays: dict[str, object] = {
        "arrived_at": np.array([0.0, 1.0]),
        "num_prefill_tokens": np.array([3, 4], dtype=np.uint32),
        "num_decode_tokens": np.array([1, 2], dtype=np.uint32),
        "hash_offsets": np.array([0, 1, 3], dtype=np.uint64),
        "hash_ids": np.array([7, 8, 9], dtype=np.uint64),
    }
    arrays.update(changes)
    return RequestChunk(**arrays)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"arrived_at": np.array([0.0, 1.0], dtype=np.float32)}, "arrived_at", "float64"),
        ({"arrived_at": [0.0, 1.0]}, "arrived_at", "got list"),
        ({"arrived_at": np.array([1.0, 0.5])}, "arrived_at", "non-decreasing"),
        ({"arrived_at": np.array([0.0, np.nan])}, "arrived_at", "finite"),
        ({"num_prefill_tokens": np.array([3], dtype=np.uint32)}, "num_prefill_tokens", "length 2"),
        ({"num_decode_tokens": np.array([0, 1], dtype=np.uint32)}, "num_decode_tokens", ">= 1"),
        ({"hash_ids": None}, "hash_offsets", "go together"),
        ({"hash_offsets": np.array([0, 2, 1], dtype=np.uint64)}, "hash_offsets", "len(hash_ids)=3"),
        ({"hash_offsets": np.array([1, 2, 3], dtype=np.uint64)}, "hash_offsets", "from 0"),
        ({"hash_offsets": np.array([0, 3], dtype=np.uint64)}, "hash_offsets", "length 3"),
    ],
)
def test_invalid_chunk_names_the_field(
    changes: dict[str, object], field: str, message: str
) -> None:
    with pytest.raises(InputError, match=r"RequestChunk\." + field) as caught:
        make_chunk(**changes)
    assert caught.value.field == field
    assert message in str(caught.value)


def test_chunk_slice_rebases_offsets() -> None:
    part = make_chunk()._slice(1, 2)
    assert len(part) == 1
    assert part.hash_offsets is not None
    assert part.hash_ids is not None
    assert part.hash_offsets.tolist() == [0, 2]
    assert part.hash_ids.tolist() == [8, 9]


def test_summarize() -> None:
    w = SyntheticWorkload(
        num_requests=101,
        arrival=ArrivalProcess(kind="constant", qps=2.0),
        prompt_tokens=LengthDistribution(kind="fixed", value=10),
        output_tokens=LengthDistribution(kind="fixed", value=3),
    )
    stats = summarize(w, chunk_size=7)
    assert (stats.num_requests, stats.duration_s, stats.mean_qps) == (101, 50.0, 2.0)
    assert (stats.mean_prefill_tokens, stats.max_decode_tokens, stats.num_hash_ids) == (10, 3, None)


# --- load_workload ----------------------------------------------------------------------

SPEC: dict[str, object] = {
    "kind": "synthetic",
    "num_requests": 1000,
    "seed": 3,
    "arrival": {"kind": "gamma", "qps": 8, "cv": 2.0},
    "prompt_tokens": {"kind": "uniform", "low": 100, "high": 200},
    "output_tokens": {"kind": "lognormal", "median": 50.0, "sigma": 0.5, "max_tokens": 400},
    "shared_prefix": {"num_groups": 2, "prefix_tokens": 64, "share_ratio": 0.25},
}


def with_changes(spec: dict[str, object], path: str, value: object) -> dict[str, object]:
    """A deep copy of ``spec`` with ``path`` ("a.b") set to ``value`` (or removed if None)."""
    copy = json.loads(json.dumps(spec))
    *parents, key = path.split(".")
    target = copy
    for parent in parents:
        target = target[parent]
    if value is None:
        del target[key]
    else:
        target[key] = value
    return copy  # type: ignore[no-any-return]


def test_load_synthetic_and_round_trip_describe() -> None:
    w = load_workload(SPEC)
    assert isinstance(w, SyntheticWorkload)
    assert w.arrival == ArrivalProcess(kind="gamma", qps=8, cv=2.0)
    assert w.shared_prefix == SharedPrefix(num_groups=2, prefix_tokens=64, share_ratio=0.25)
    described = w.describe()
    json.dumps(described)
    assert load_workload(described) == w
    assert described["arrival"] == {"kind": "gamma", "qps": 8, "cv": 2.0}


def test_load_trace_relative_to_base_dir_and_round_trip() -> None:
    path = sample_path("vidur")
    spec = {"kind": "trace", "format": "vidur", "path": path.name, "limit": 10}
    w = load_workload(spec, base_dir=path.parent)
    assert isinstance(w, VidurTrace)
    assert w.limit == 10
    assert Path(w.path) == path
    assert load_workload(w.describe()).describe() == w.describe()


@pytest.mark.parametrize(
    ("path", "value", "field", "message"),
    [
        (
            "kind",
            "synth",
            "workload.kind",
            "unknown value 'synth'; expected one of 'sessions', 'synthetic'",
        ),
        (
            "kind",
            None,
            "workload.kind",
            "missing; expected one of 'sessions', 'synthetic', 'trace'",
        ),
        (
            "arrival.kind",
            "poison",
            "workload.arrival.kind",
            "unknown value 'poison'; expected one of 'bursty', 'constant', 'gamma', 'poisson'",
        ),
        ("arrival.qpss", 3, "workload.arrival.qpss", "unknown key; expected one of"),
        (
            "arrival.qps",
            -1,
            "workload.arrival.qps",
            "must be a finite number > 0 and <= 1e+09, got -1",
        ),
        ("arrival.qps", None, "workload.arrival.qps", "missing (required)"),
        ("prompt_tokens.kind", None, "workload.prompt_tokens.kind", "missing (required)"),
        ("prompt_tokens", 5, "workload.prompt_tokens", "must be a table (mapping), got int"),
        ("output_tokens.theta", 1.0, "workload.output_tokens.theta", "does not apply"),
        ("shared_prefix.share_ratio", 2, "workload.shared_prefix.share_ratio", "<= 1"),
        ("seeds", 1, "workload.seeds", "unknown key"),
        ("num_requests", "10", "workload.num_requests", "must be an int in [1, 100000000]"),
        ("num_requests", None, "workload.num_requests", "missing (required)"),
    ],
)
def test_load_errors_name_the_key_path(path: str, value: object, field: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_workload(with_changes(SPEC, path, value))
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ")
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("spec", "field", "message"),
    [
        ({"kind": "trace", "path": "x.csv"}, "workload.format", "missing; expected one of"),
        ({"kind": "trace", "format": "csv", "path": "x"}, "workload.format", "unknown value 'csv'"),
        ({"kind": "trace", "format": "vidur"}, "workload.path", "missing (required)"),
        (
            {"kind": "trace", "format": "vidur", "path": "x", "hash_block_size": 16},
            "workload.hash_block_size",
            "unknown key for format='vidur'",
        ),
        (
            {"kind": "trace", "format": "azure", "path": "/no/such/trace.csv"},
            "workload.path",
            "no such file: '/no/such/trace.csv'",
        ),
        (
            {"kind": "trace", "format": "vidur", "path": str(sample_path("vidur")), "limit": 0},
            "workload.limit",
            "must be an int in [1, 100000000], got 0",
        ),
        (
            {
                "kind": "trace",
                "format": "vidur",
                "path": str(sample_path("vidur")),
                "zero_output": "drop",
            },
            "workload.zero_output",
            "expected one of 'clamp', 'error', 'skip'",
        ),
        ([1, 2], "workload", "must be a table"),
        ({1: "x"}, "workload", "keys must be strings"),
    ],
)
def test_load_trace_errors(spec: object, field: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_workload(spec)  # type: ignore[arg-type]
    assert caught.value.field == field
    assert message in str(caught.value)


def test_load_uses_where_in_messages() -> None:
    with pytest.raises(ConfigError, match=r"^cluster\.workload\.arrival\.qps: "):
        load_workload(with_changes(SPEC, "arrival.qps", 0), where="cluster.workload")
