"""tokenyard.integrations.vllm: vLLM 0.33's scheduler interface over the step scheduler.

The translation of vLLM's configs runs here without vLLM, on stand-ins with vLLM's
attribute names. The scheduler itself needs vLLM; those tests are skipped where it is not
installed (CI), and run in the bench venv (``.venv-bench``, ``benches/peers/setup.sh``),
where ``benches/peers/vllm_own_tests.sh`` also runs vLLM's own scheduler tests on it.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pytest

from tokenyard.errors import ConfigError
from tokenyard.integrations._vllm_translate import core_config, request_id_list, settings
from tokenyard.sched import Scheduler


class FullAttentionSpec(SimpleNamespace):
    """Stands in for vLLM's spec class: the adapter reads the class name."""


class SlidingWindowSpec(SimpleNamespace):
    pass


class ChunkedLocalAttentionSpec(SimpleNamespace):
    pass


class MambaSpec(SimpleNamespace):
    pass


class SinkFullAttentionSpec(SimpleNamespace):
    pass


class _Unknown(SimpleNamespace):
    pass


class CrossAttentionSpec(SimpleNamespace):
    pass


def vllm_config(**scheduler: Any) -> SimpleNamespace:
    sched = {
        "max_num_seqs": 8,
        "max_num_active_seqs": None,
        "max_num_batched_tokens": 64,
        "max_num_scheduled_tokens": None,
        "long_prefill_token_threshold": 0,
        "long_prefill_token_threshold_adaptive": False,
        "enable_chunked_prefill": True,
        "policy": "fcfs",
        "async_scheduling": False,
        "scheduler_reserve_full_isl": True,
    }
    sched.update(scheduler)
    return SimpleNamespace(
        scheduler_config=SimpleNamespace(**sched),
        cache_config=SimpleNamespace(enable_prefix_caching=True, num_gpu_blocks=33),
        model_config=SimpleNamespace(max_model_len=256),
        lora_config=None,
        num_speculative_tokens=0,
        num_lookahead_tokens=0,
    )


def kv_config(*specs: Any) -> SimpleNamespace:
    groups = [SimpleNamespace(kv_cache_spec=s) for s in specs or (FullAttentionSpec(),)]
    return SimpleNamespace(num_blocks=33, kv_cache_groups=groups)


def test_vllm_names_map_to_the_core_config() -> None:
    config = core_config(vllm_config(policy="priority"), kv_config(), block_size=16)
    assert (config.max_num_seqs, config.max_num_batched_tokens) == (8, 64)
    assert (config.num_blocks, config.block_size, config.policy) == (33, 16, "priority")
    assert config.reserve_null_block
    assert config.scheduler_reserve_full_isl
    assert config.max_model_len == 256  # 32 KV blocks of 16 hold 512 tokens
    Scheduler(config)  # the core accepts it


def test_admission_cap_and_budgets_are_vllms_active_seqs_and_two_budgets() -> None:
    config = core_config(
        vllm_config(max_num_active_seqs=3, max_num_scheduled_tokens=48), kv_config(), 16
    )
    # vLLM's two budgets: input (max_num_batched_tokens) and tokens (max_num_scheduled_tokens).
    budgets = (config.max_num_batched_tokens, config.max_num_scheduled_tokens)
    assert (config.max_num_seqs, budgets) == (3, (64, 48))
    s = settings(vllm_config(max_num_active_seqs=3), kv_config(), 16)
    assert (s.max_num_running_reqs, s.max_num_active_reqs) == (8, 3)


def test_max_model_len_is_the_models_whatever_the_kv_capacity_capped_by_unchunked_budget() -> None:
    small = vllm_config()
    small.cache_config.num_gpu_blocks = 5  # 4 KV blocks of 16: 64 tokens
    kv = kv_config()
    kv.num_blocks = 5
    config = core_config(small, kv, 16)
    # vLLM's Scheduler runs with a cache smaller than max_model_len; so does the core.
    assert config.max_model_len == 256
    Scheduler(config)
    unchunked = core_config(vllm_config(enable_chunked_prefill=False), kv_config(), 16)
    assert (unchunked.max_model_len, unchunked.enable_chunked_prefill) == (64, False)
    Scheduler(unchunked)


def test_kv_cache_groups_become_the_cores_kv_groups_spec_by_spec() -> None:
    from tokenyard import kv as sched

    one = core_config(vllm_config(), kv_config(FullAttentionSpec()), 16)
    assert one.kv_groups == ()  # one full-attention group: the single pool
    mixed = core_config(
        vllm_config(),
        kv_config(
            FullAttentionSpec(),
            SlidingWindowSpec(sliding_window=128),
            ChunkedLocalAttentionSpec(attention_chunk_size=64),
        ),
        16,
    )
    assert [type(g) for g in mixed.kv_groups] == [
        sched.FullAttentionSpec,
        sched.SlidingWindowSpec,
        sched.ChunkedLocalAttentionSpec,
    ]
    assert mixed.kv_groups[1].sliding_window == 128
    assert mixed.kv_groups[2].attention_chunk_size == 64
    assert mixed.num_blocks == 33  # kv_cache_config.num_blocks, as vLLM's block pool
    Scheduler(mixed)
    # A lone sliding-window group is a group table too (group_block_ids).
    (window,) = core_config(
        vllm_config(), kv_config(SlidingWindowSpec(sliding_window=8)), 16
    ).kv_groups
    assert isinstance(window, sched.SlidingWindowSpec)


def test_kv_layouts_the_core_has_no_group_for_are_refused_by_name() -> None:
    # vLLM 0.33's own scheduler cannot build a static sink's manager: refused.
    with pytest.raises(ConfigError) as info:
        core_config(vllm_config(), kv_config(FullAttentionSpec(), SinkFullAttentionSpec()), 16)
    assert (info.value.field, info.value.value) == (
        "kv_cache_groups[1].kv_cache_spec",
        "SinkFullAttentionSpec",
    )
    # vLLM's hybrid manager turned off: a window on a full-attention spec is the kernel's.
    assert (
        core_config(vllm_config(), kv_config(FullAttentionSpec(sliding_window=128)), 16).kv_groups
        == ()
    )
    with pytest.raises(ConfigError) as info:
        core_config(vllm_config(), kv_config(FullAttentionSpec(), _Unknown()), 16)
    assert info.value.field == "kv_cache_groups[1].kv_cache_spec"
    assert info.value.value == "_Unknown"
    spec = MambaSpec(mamba_cache_mode="align", num_prefill_checkpoint_blocks=1)
    with pytest.raises(ConfigError) as info:
        core_config(vllm_config(), kv_config(FullAttentionSpec(), spec), 16)
    assert "checkpoint" in str(info.value)
    with pytest.raises(ConfigError) as info:
        core_config(vllm_config(), kv_config(MambaSpec(mamba_cache_mode="all")), 16)
    assert "mamba_cache_mode" in str(info.value)
    with pytest.raises(ConfigError) as info:
        core_config(vllm_config(), kv_config(FullAttentionSpec(block_size=32)), 16)
    assert "block_size" in str(info.value)


def test_a_cross_attention_group_is_served_with_prefix_caching_off() -> None:
    with pytest.raises(ConfigError) as info:
        core_config(vllm_config(), kv_config(FullAttentionSpec(), CrossAttentionSpec()), 16)
    assert info.value.field == "cache_config.enable_prefix_caching"
    config = vllm_config()
    config.cache_config.enable_prefix_caching = False
    core = core_config(config, kv_config(FullAttentionSpec(), CrossAttentionSpec()), 16)
    from tokenyard import kv

    assert isinstance(core.kv_groups[1], kv.CrossAttentionSpec)
    Scheduler(core)


def test_a_mamba_group_needs_prefix_caching_off_as_vllms_mamba_manager() -> None:
    with pytest.raises(ConfigError) as info:
        core_config(vllm_config(), kv_config(FullAttentionSpec(), MambaSpec()), 16)
    assert info.value.field == "cache_config.enable_prefix_caching"
    config = vllm_config()
    config.cache_config.enable_prefix_caching = False
    core = core_config(config, kv_config(FullAttentionSpec(), MambaSpec()), 16)
    assert len(core.kv_groups) == 2
    Scheduler(core)
    # In align mode its states are prefix-cached, as vLLM's MambaManager caches them.
    align = kv_config(FullAttentionSpec(), MambaSpec(mamba_cache_mode="align"))
    core = core_config(vllm_config(), align, 16)
    assert core.kv_groups[1].mamba_cache_mode == "align"
    Scheduler(core)


def test_sampling_masks_asked_for_at_construction_are_served() -> None:
    """vLLM 0.33's ``Scheduler`` reads ``model_config.return_sampling_mask`` when built."""
    config = vllm_config()
    config.model_config.return_sampling_mask = True
    core_config(config, kv_config(), block_size=16)  # accepted, as vLLM accepts it


def test_speculative_tokens_reach_the_core_with_vllms_padding() -> None:
    config = vllm_config()
    config.num_speculative_tokens = 3
    core = core_config(config, kv_config(), block_size=16)
    assert core.num_speculative_tokens == 3
    assert core.pad_spec_decode
    # k varying with the batch size (not modelled): vLLM does not pad then.
    config.speculative_config = SimpleNamespace(num_speculative_tokens_per_batch_size=[(1, 8, 3)])
    assert not core_config(config, kv_config(), block_size=16).pad_spec_decode
    # Diffusion models sample no token per step: their drafts are not padded either.
    config = vllm_config()
    config.num_speculative_tokens = 3
    config.model_config.is_diffusion = True
    assert not core_config(config, kv_config(), block_size=16).pad_spec_decode


def test_prefix_probe_finds_cached_whole_blocks_and_allocates_nothing() -> None:
    """The probe behind the adapter's kv_cache_manager.get_computed_blocks: two 4-token
    blocks of a finished request are cached; a 9-token prompt sharing them hits 8, a
    prompt of exactly those 8 hits 4 (the last token is recomputed)."""
    scheduler = Scheduler(core_config(vllm_config(), kv_config(), block_size=4))
    scheduler.add_request("a", list(range(8)), max_tokens=1)
    scheduler.schedule()
    scheduler.update_from_output({"a": [99]})
    free = scheduler.num_free_blocks
    assert scheduler.num_cached_prefix_tokens([*range(8), 7]) == 8
    assert scheduler.num_cached_prefix_tokens(list(range(8))) == 4
    assert scheduler.num_cached_prefix_tokens(list(range(8)), lora_id=1) == 0
    assert scheduler.num_free_blocks == free


def test_one_request_id_is_one_id_not_its_characters() -> None:
    every = ["a", "req", "b"]
    assert request_id_list("req", every) == ["req"]
    assert request_id_list(["b", "a", "b"], every) == ["b", "a"]
    assert request_id_list(iter(("a",)), every) == ["a"]
    assert request_id_list(None, every) == every


def test_the_core_abort_takes_a_str_as_one_id() -> None:
    scheduler = Scheduler(core_config(vllm_config(), kv_config(), 16))
    scheduler.add_request("req", [1, 2, 3], max_tokens=2)
    scheduler.add_request("r", [4], max_tokens=2)
    scheduler.abort("req")
    assert scheduler.waiting_ids() == ["r"]


def test_reset_prefix_cache_needs_every_block_free_or_preempts_the_running() -> None:
    scheduler = Scheduler(core_config(vllm_config(), kv_config(), 16))
    scheduler.add_request("a", list(range(40)), max_tokens=4)
    scheduler.schedule()
    assert scheduler.reset_prefix_cache() == (False, [])
    reset, preempted = scheduler.reset_prefix_cache(preempt_running=True)
    assert (reset, preempted) == (True, ["a"])
    assert scheduler.num_computed_tokens("a") == 0
    assert scheduler.waiting_ids() == ["a"]
    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {"a": 40}
    assert out.scheduled_resumed_reqs[0].num_computed_tokens == 0  # nothing cached


def test_module_without_vllm_names_vllm() -> None:
    if "vllm" in sys.modules or _vllm_installed():
        pytest.skip("vLLM is installed here")
    with pytest.raises(ImportError, match="vLLM"):
        import tokenyard.integrations.vllm  # noqa: F401


def _vllm_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


# --- with vLLM ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm_parts() -> Any:
    pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parents[1] / "benches/peers"))
    from vllm_peer import VllmSchedulerPeer

    return VllmSchedulerPeer


def build(peer_cls: Any, **kwargs: Any) -> tuple[Any, Any]:
    from tokenyard.integrations.vllm import TokenyardScheduler

    options = {
        "num_blocks": 64,
        "max_num_seqs": 4,
        "max_num_batched_tokens": 32,
        "max_model_len": 256,
    }
    options.update(kwargs)
    peer = peer_cls(**options)
    scheduler = TokenyardScheduler(
        vllm_config=peer.vllm_config,
        kv_cache_config=peer.scheduler.kv_cache_config,
        structured_output_manager=peer.scheduler.structured_output_manager,
        block_size=16,
        log_stats=True,
    )
    return scheduler, peer


def run_step(scheduler: Any, token: int = 7) -> tuple[Any, dict[int, Any]]:
    from vllm.v1.outputs import ModelRunnerOutput

    out = scheduler.schedule()
    ids = list(out.num_scheduled_tokens)
    sampled = [
        [token]
        if scheduler.requests[i].num_computed_tokens >= scheduler.requests[i].num_tokens
        else []
        for i in ids
    ]
    mro = ModelRunnerOutput(
        req_ids=ids, req_id_to_index={i: n for n, i in enumerate(ids)}, sampled_token_ids=sampled
    )
    return out, scheduler.update_from_output(out, mro)


def test_vllm_requests_run_to_max_tokens_through_vllms_interface(vllm_parts: Any) -> None:
    from vllm.v1.request import RequestStatus

    scheduler, peer = build(vllm_parts)
    requests = [peer.make_request(f"r{i}", list(range(i, i + 20)), max_tokens=3) for i in range(3)]
    for r in requests:
        scheduler.add_request(r)
    out, _ = run_step(scheduler)
    # Budget 32: 20 tokens + 12 of the second prompt; the third waits.
    assert out.num_scheduled_tokens == {"r0": 20, "r1": 12}
    assert [r.req_id for r in out.scheduled_new_reqs] == ["r0", "r1"]
    assert requests[0].status == RequestStatus.RUNNING
    assert list(requests[0].output_token_ids) == [7]
    finished = set()
    for _ in range(20):
        _, outputs = run_step(scheduler)
        for eco in outputs.values():
            finished |= {o.request_id for o in eco.outputs if o.finish_reason is not None}
    assert finished == {"r0", "r1", "r2"}
    assert all(len(r.output_token_ids) == 3 for r in requests)
    assert scheduler.get_num_unfinished_requests() == 0


def test_the_core_knows_requests_by_int_under_fcfs_and_forgets_them(vllm_parts: Any) -> None:
    scheduler, peer = build(vllm_parts)
    for i in range(3):
        scheduler.add_request(peer.make_request(f"r{i}", list(range(i, i + 20)), max_tokens=2))
    assert scheduler._core.waiting_ids() == [0, 1, 2]
    assert [r.request_id for r in scheduler.waiting] == ["r0", "r1", "r2"]
    for _ in range(10):
        run_step(scheduler)
    assert scheduler.get_num_unfinished_requests() == 0
    assert scheduler._core_ids == {}
    assert scheduler._vllm_ids == {}


def test_priority_ties_go_by_vllms_str_ids(vllm_parts: Any) -> None:
    """vLLM's Request.__lt__ breaks (priority, arrival_time) ties by request id: "r10"
    sorts before "r2" and "r9", whatever the order they were added in."""
    scheduler, peer = build(vllm_parts, policy="priority")
    for n, request_id in enumerate(("r9", "r10", "r2")):
        request = peer.make_request(request_id, list(range(n * 20, n * 20 + 20)), max_tokens=2)
        request.arrival_time = 1.0
        scheduler.add_request(request)
    assert scheduler._core.waiting_ids() == ["r10", "r2", "r9"]
    out, _ = run_step(scheduler)
    assert list(out.num_scheduled_tokens) == ["r10", "r2"]


def test_finish_requests_takes_one_id_or_many(vllm_parts: Any) -> None:
    from vllm.v1.request import RequestStatus

    scheduler, peer = build(vllm_parts)
    for i in range(3):
        scheduler.add_request(peer.make_request(f"req{i}", [1, 2, 3], max_tokens=2))
    done = scheduler.finish_requests("req0", RequestStatus.FINISHED_ABORTED)
    assert [r.request_id for r in done] == ["req0"]
    assert scheduler.get_num_unfinished_requests() == 2
    assert scheduler.finish_requests(["req1", "nope"], RequestStatus.FINISHED_ABORTED)
    assert [r.request_id for r in scheduler.waiting] == ["req2"]
    assert scheduler.schedule().finished_req_ids == {"req0", "req1"}


def test_core_errors_name_vllms_request_ids_not_the_cores_ints(vllm_parts: Any) -> None:
    from vllm.v1.outputs import ModelRunnerOutput

    from tokenyard.errors import InputError

    scheduler, peer = build(vllm_parts)
    for name in ("first", "second"):
        scheduler.add_request(peer.make_request(name, list(range(20)), max_tokens=4))
    out = scheduler.schedule()
    ids = list(out.num_scheduled_tokens)
    assert ids == ["first", "second"]
    # Three tokens for "second", scheduled for one: the core refuses them by its own id.
    mro = ModelRunnerOutput(
        req_ids=ids,
        req_id_to_index={i: n for n, i in enumerate(ids)},
        sampled_token_ids=[[1], [1, 2, 3]],
    )
    with pytest.raises(InputError) as info:
        scheduler.update_from_output(out, mro)
    assert info.value.field == "sampled_token_ids"
    assert info.value.value == "3 tokens for 'second'"
    assert "sampled_token_ids=3 tokens for 'second':" in str(info.value)


def test_a_duplicate_id_that_is_no_session_is_refused_by_name(vllm_parts: Any) -> None:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    from tokenyard.errors import InputError

    scheduler, _ = build(vllm_parts)
    sampling = SamplingParams(max_tokens=2)
    # Streaming-input sessions are served (test_integrations_vllm_sessions.py); an id
    # held by a request that is no session is refused.
    scheduler.add_request(Request("s", [1, 2], sampling, None, resumable=True))
    scheduler.add_request(Request("p", [1, 2], sampling, None))
    with pytest.raises(InputError) as info:
        scheduler.add_request(Request("p", [1, 2], sampling, None))
    assert info.value.field == "request_id"


def test_logprobs_prefill_stats_and_nan_counts_reach_the_outputs_as_in_vllm(
    vllm_parts: Any,
) -> None:
    """The runner's logprobs go out as vLLM's own scheduler sends them: sampled logprobs
    to a request that asks for them (cut at its stop), prompt logprobs with the output
    ending its prefill, NaN counts on the request and its output; and each request's
    PrefillStats (prompt, local hits, cache creation) with its first output."""
    import numpy as np
    from vllm.sampling_params import SamplingParams
    from vllm.v1.outputs import LogprobsLists, ModelRunnerOutput
    from vllm.v1.request import Request

    scheduler, peer = build(vllm_parts)
    sides = {"vllm": peer.scheduler, "tokenyard": scheduler}
    asks = SamplingParams(max_tokens=4, logprobs=2, stop_token_ids=[9], ignore_eos=True)
    plain = SamplingParams(max_tokens=3, ignore_eos=True)
    for scheduler_side in sides.values():
        # "again" repeats "lp"'s first 16-token block: a local prefix hit once "lp" ran.
        for request_id, params in (("lp", asks), ("plain", plain), ("again", plain)):
            prompt = {
                "lp": list(range(20)),
                "plain": list(range(50, 70)),
                "again": [*range(16), 90, 91, 92, 93, 94],
            }[request_id]
            request = Request(request_id, prompt, params, None, block_hasher=peer._block_hasher)
            scheduler_side.add_request(request)

    def step(side: Any, n: int) -> list[tuple[Any, ...]]:
        out = side.schedule()
        ids = list(out.num_scheduled_tokens)
        sampled = [
            [9 if n == 2 else 7]
            if side.requests[i].num_computed_tokens >= side.requests[i].num_tokens
            else []
            for i in ids
        ]
        rows = len(ids)
        mro = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={i: k for k, i in enumerate(ids)},
            sampled_token_ids=sampled,
            logprobs=LogprobsLists(
                np.arange(rows * 3).reshape(rows, 3) + 100 * n,
                -np.arange(rows * 3, dtype=np.float32).reshape(rows, 3) - n,
                np.arange(rows) + n,
            ),
            # With the output that ends the prefill (the runner sends none before it).
            prompt_logprobs_dict={
                i: f"prompt-{i}"
                for i, tokens in zip(ids, sampled, strict=True)
                if tokens and side.requests[i].num_output_tokens == 0
            },
            num_nans_in_logits={i: n + 1 for i in ids},
        )
        result = []
        for eco in side.update_from_output(out, mro).values():
            for o in eco.outputs:
                logprobs = (
                    None if o.new_logprobs is None else [a.tolist() for a in o.new_logprobs[:3]]
                )
                stats = o.prefill_stats and vars(o.prefill_stats)
                result.append(
                    (
                        o.request_id,
                        o.new_token_ids,
                        o.finish_reason,
                        logprobs,
                        o.new_prompt_logprobs_tensors,
                        o.num_nans_in_logits,
                        stats,
                    )
                )
        return result

    hit = None
    for n in range(8):
        expected, got = (step(side, n) for side in sides.values())
        assert got == expected, f"step {n}"
        hit = hit or next((o[6] for o in got if o[0] == "again" and o[6]), None)
    assert scheduler.get_num_unfinished_requests() == 0
    assert hit is not None
    assert hit["num_local_cached_tokens"] == 16, hit
