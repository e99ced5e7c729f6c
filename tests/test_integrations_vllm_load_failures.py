"""tokenyard.integrations.vllm's failed KV loads against vLLM 0.33's own ``Scheduler``, step
by step on seeded streams: loads that fail whole (``failed_recving``) and blocks a load left
invalid (``invalid_block_ids``), of asynchronous loads (the request still waits) and of
synchronous ones (the request runs on them), under ``kv_load_failure_policy`` "recompute"
(each affected request keeps the computed prefix before its first invalid block, vLLM's
``_update_requests_with_invalid_blocks``) and "fail" (it finishes with ``FINISHED_ERROR``,
``update_from_output``'s ``error_req_ids``). One KV cache group (vLLM raises for block-level
failures beside several: ``test_integrations_vllm_block_sizes_connectors``).

Every step is compared: scheduled tokens and block ids, the requests waiting for loads,
KV usage, every request's block table, computed tokens and status, the failed loads still
waiting (``failed_recving_kv_req_ids``), each update's outputs (ids, tokens, finish
reasons), and the calls reaching ``kv_cache_manager.cache_blocks`` (a landed load's valid
tokens, ``_update_waiting_for_remote_kv``) and ``evict_blocks`` (``_handle_invalid_blocks``
under "fail") with their arguments, as a test spying on them sees them. Needs vLLM (the
bench venv); skipped elsewhere.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

from test_integrations_vllm_block_sizes_connectors import _loading, build_pair
from vllm.v1.engine import FinishReason
from vllm.v1.outputs import KVConnectorOutput
from vllm_compare import block_digest, runner_output, sampling, seeded_arrivals

ONE = [("full", 16, 0)]


def _outputs(engine_outputs: dict[int, Any]) -> list[tuple[str, list[int], Any]]:
    return sorted(
        (o.request_id, list(o.new_token_ids), o.finish_reason)
        for eco in engine_outputs.values()
        for o in eco.outputs
    )


def _state(scheduler: Any) -> dict[str, Any]:
    """Every request's status and computed tokens, and the block table of each live one (a
    finished request kept for its load in flight has no table in the adapter's view)."""
    return {
        r.request_id: (
            r.status,
            r.num_computed_tokens,
            None if r.is_finished() else scheduler.kv_cache_manager.get_block_ids(r.request_id),
        )
        for r in scheduler.requests.values()
    }


def _invalid_blocks(
    rng: random.Random, theirs: Any, out: Any, share: float, *, one: bool
) -> set[int]:
    """Blocks reported invalid with this step's output: for a ``share`` of the requests
    loading or scheduled in the step, one block of its table (the first ones more often:
    the loaded prefix). With ``one``, a block of one request at most, held by no other:
    vLLM 0.33 finishes the requests a step fails in the order of a ``set`` of their ids
    (``error_req_ids``), which string hashing varies from run to run, so two failed in one
    step free their blocks in no fixed order."""
    candidates = sorted(_loading(theirs) | set(out.num_scheduled_tokens))
    tables = {r: theirs.kv_cache_manager.get_block_ids(r)[0] for r in theirs.requests}
    invalid = set()
    for request_id in candidates:
        table = tables.get(request_id)
        if not table or rng.random() >= share:
            continue
        block = table[min(rng.randrange(len(table)), rng.randrange(len(table)))]
        if one:
            if any(block in t for r, t in tables.items() if r != request_id):
                continue
            return {block}
        invalid.add(block)
    return invalid


def _spy_manager_calls(scheduler: Any) -> list[tuple[Any, ...]]:
    """The calls reaching ``scheduler.kv_cache_manager``'s ``cache_blocks`` and
    ``evict_blocks`` from now on, recorded in order (each still made), as a test patching
    them on the manager records them."""
    manager = scheduler.kv_cache_manager
    calls: list[tuple[Any, ...]] = []
    cache_blocks, evict_blocks = manager.cache_blocks, manager.evict_blocks

    def cache_spy(request: Any, num_computed_tokens: int) -> None:
        calls.append(("cache_blocks", request.request_id, num_computed_tokens))
        cache_blocks(request, num_computed_tokens)

    def evict_spy(block_ids: set[int]) -> None:
        calls.append(("evict_blocks", tuple(sorted(block_ids))))
        evict_blocks(block_ids)

    manager.cache_blocks, manager.evict_blocks = cache_spy, evict_spy
    return calls


def run_failures(
    seed: int, policy: str, *, invalid_share: float, fail_share: float
) -> dict[str, int]:
    """A seeded stream on both schedulers (see the module doc); returns what it exercised."""
    pair, peer = build_pair(ONE, seed=seed, policy=policy, num_blocks=200)
    theirs, ours = pair
    calls = [_spy_manager_calls(s) for s in pair]
    rng = random.Random(seed)
    arrivals = seeded_arrivals(
        rng,
        count=10,
        prefix_tokens=160,
        shared=(0, 16, 48, 100, 160),
        tail_max=100,
        arrive_by=12,
        max_tokens=12,
        lowest_token=1,
        max_prompt=300,
    )
    seen = {"loads": 0, "failed": 0, "invalid": 0, "errors": 0, "cut": 0, "calls": 0}
    started: set[str] = set()
    for step in range(400):
        for at, *args in arrivals:
            if at == step:
                for scheduler in pair:
                    scheduler.add_request(peer.make_request(*args))
        outs = [scheduler.schedule() for scheduler in pair]
        assert block_digest(outs[1]) == block_digest(outs[0]), f"step {step}"
        assert calls[1] == calls[0], f"manager calls, step {step}"
        now_loading = [_loading(s) for s in pair]
        assert now_loading[1] == now_loading[0], f"step {step}"
        told = sorted(theirs.connector.allocs, key=lambda a: a[0])
        for s in pair:
            s.connector.allocs.clear()
        landing = started & now_loading[0]
        started = {r for r, _, n in told if n and r in now_loading[0]}
        seen["loads"] += len(started)
        failed = {r for r in sorted(landing) if rng.random() < fail_share}
        # Under "fail", one request failed per step at most (see _invalid_blocks).
        one = policy == "fail"
        if one and len(failed) > 1:
            failed = {min(failed)}
        invalid = set()
        if not (one and failed):
            invalid = _invalid_blocks(rng, theirs, outs[0], invalid_share, one=one)
        seen["failed"] += len(failed)
        seen["invalid"] += len(invalid)
        computed = {r.request_id: r.num_computed_tokens for r in theirs.requests.values()}
        samples = [sampling(s, out) for s, out in zip(pair, outs, strict=True)]
        results = []
        for scheduler, out, sample in zip(pair, outs, samples, strict=True):
            output = runner_output(scheduler, out, sample)
            output.kv_connector_output = KVConnectorOutput(
                finished_recving=set(landing),
                failed_recving=set(failed),
                invalid_block_ids=set(invalid),
            )
            results.append(_outputs(scheduler.update_from_output(out, output)))
        assert results[1] == results[0], f"step {step}"
        assert calls[1] == calls[0], f"manager calls, step {step}"
        seen["calls"] += len(calls[0])
        for c in calls:
            c.clear()
        seen["errors"] += sum(reason == FinishReason.ERROR for *_, reason in results[0])
        seen["cut"] += sum(
            r.num_computed_tokens < computed.get(r.request_id, 0) for r in theirs.requests.values()
        )
        assert _state(ours) == _state(theirs), f"step {step}"
        assert ours.failed_recving_kv_req_ids == theirs.failed_recving_kv_req_ids, step
        assert ours.get_kv_cache_usage() == pytest.approx(theirs.get_kv_cache_usage()), step
        if step > 12 and not theirs.has_unfinished_requests():
            assert not ours.has_unfinished_requests()
            return seen
    raise AssertionError(f"every step agreed, and after 400 {sorted(theirs.requests)} wait")


@pytest.mark.parametrize("seed", range(4))
def test_invalid_blocks_under_recompute_match_vllm(seed: int) -> None:
    seen = run_failures(seed, "recompute", invalid_share=0.3, fail_share=0.0)
    assert seen["invalid"] > 0


@pytest.mark.parametrize("seed", range(4))
def test_invalid_blocks_and_failed_loads_under_fail_match_vllm(seed: int) -> None:
    seen = run_failures(seed, "fail", invalid_share=0.15, fail_share=0.3)
    assert seen["invalid"] > 0


@pytest.mark.parametrize("seed", range(3))
def test_failed_loads_and_invalid_blocks_under_recompute_match_vllm(seed: int) -> None:
    run_failures(seed, "recompute", invalid_share=0.2, fail_share=0.3)


def test_the_streams_cut_and_fail_requests() -> None:
    # The streams above exercise what they compare: computed tokens cut back, requests
    # finished with FINISHED_ERROR, and the manager calls vLLM makes.
    cut = [run_failures(s, "recompute", invalid_share=0.3, fail_share=0.0) for s in range(2)]
    assert sum(s["cut"] for s in cut) > 0
    assert sum(s["calls"] for s in cut) > 0
    failed = [run_failures(s, "fail", invalid_share=0.15, fail_share=0.3) for s in range(2)]
    assert sum(s["errors"] for s in failed) > 0
    assert sum(s["calls"] for s in failed) > 0


def test_the_manager_call_check_catches_a_missing_call(monkeypatch: pytest.MonkeyPatch) -> None:
    # The adapter left to cache a landed load without calling the manager (as before these
    # calls were made): the comparison names the first step where vLLM's call is missing.
    from tokenyard.integrations.vllm import TokenyardScheduler

    monkeypatch.setattr(TokenyardScheduler, "_cache_landed_load", lambda self, request: None)
    with pytest.raises(AssertionError, match="manager calls"):
        run_failures(0, "recompute", invalid_share=0.3, fail_share=0.0)
