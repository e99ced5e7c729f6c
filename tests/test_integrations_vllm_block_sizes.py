"""tokenyard.integrations.vllm over KV cache groups with different block sizes (vLLM 0.33's
layouts for a model whose layer kinds have different page sizes, e.g. Gemma 4), against
vLLM's own ``Scheduler``: the engine passes the scheduler block size (the groups' lcm) as
``block_size`` and the hash block size (their gcd, or ``prefix_match_unit``) as
``hash_block_size`` (``resolve_kv_cache_block_sizes``); each group allocates blocks of its
own size and prefix hits land on the lcm (``HybridKVCacheCoordinator``). Needs vLLM (the
bench venv); skipped elsewhere.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request, RequestStatus
from vllm_compare import block_digest  # noqa: F401  (puts benches/peers on the path)
from vllm_peer import VllmSchedulerPeer

from tokenyard.errors import ConfigError
from tokenyard.integrations.vllm import TokenyardScheduler


def _spec(kind: str, block_size: int, window: int = 0) -> Any:
    common = {"block_size": block_size, "num_kv_heads": 1, "head_size": 1}
    if kind == "full":
        return FullAttentionSpec(dtype=torch.float16, **common)
    if kind == "window":
        return SlidingWindowSpec(sliding_window=window, dtype=torch.float16, **common)
    return MambaSpec(
        block_size=block_size,
        shapes=((1, 1),),
        dtypes=(torch.float32,),
        mamba_cache_mode="align",
    )


def _config(specs: list[Any], num_blocks: int = 64) -> KVCacheConfig:
    groups = [KVCacheGroupSpec([f"layers.{i}"], s) for i, s in enumerate(specs)]
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


GEMMA = [("full", 32, 0), ("window", 16, 64)]


def _pair(
    layout: list[tuple[str, int, int]] = GEMMA,
    *,
    block_size: int = 32,
    hash_block_size: int = 16,
    **kw: Any,
) -> tuple[Any, Any, Any]:
    peer = VllmSchedulerPeer(
        num_blocks=64,
        max_num_seqs=8,
        max_num_batched_tokens=256,
        max_model_len=512,
        block_size=16,
        enable_prefix_caching=True,
        **kw,
    )
    config = _config([_spec(*g) for g in layout])
    schedulers = [
        cls(
            vllm_config=peer.vllm_config,
            kv_cache_config=config,
            structured_output_manager=peer.scheduler.structured_output_manager,
            block_size=block_size,
            hash_block_size=hash_block_size,
        )
        for cls in (Scheduler, TokenyardScheduler)
    ]
    hash_fn = get_hash_fn_by_name(peer.vllm_config.cache_config.prefix_caching_hash_algo)
    kv_cache_utils.init_none_hash(hash_fn)
    lookahead = peer.vllm_config.num_hash_lookahead_tokens
    hasher = kv_cache_utils.get_request_block_hasher(hash_block_size, hash_fn, lookahead)
    return schedulers[0], schedulers[1], hasher


def _request(request_id: str, prompt: list[int], hasher: Any) -> Request:
    return Request(
        request_id=request_id,
        prompt_token_ids=prompt,
        sampling_params=SamplingParams(max_tokens=4),
        pooling_params=None,
        block_hasher=hasher,
    )


def _admit(schedulers: tuple[Any, Any], hasher: Any, request_id: str, prompt: list[int]) -> Any:
    """Adds the request to both, schedules a step on each, and returns both outputs' view of
    its new request (block ids per group, computed tokens) after checking they agree."""
    seen = []
    for s in schedulers:
        s.add_request(_request(request_id, prompt, hasher))
        out = s.schedule()
        new = {r.req_id: (r.block_ids, r.num_computed_tokens) for r in out.scheduled_new_reqs}
        seen.append(new[request_id])
        s.update_from_output(out, _empty_output(out))
    assert seen[0] == seen[1]
    return seen[1]


def _empty_output(out: Any) -> Any:
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(out.num_scheduled_tokens)
    return ModelRunnerOutput(
        req_ids=ids,
        req_id_to_index={r: i for i, r in enumerate(ids)},
        sampled_token_ids=[[7] for _ in ids],
        logprobs=None,
        prompt_logprobs_dict={},
        pooler_output=[],
    )


def test_each_group_takes_blocks_of_its_own_size_as_vllm() -> None:
    theirs, ours, hasher = _pair()
    block_ids, computed = _admit((theirs, ours), hasher, "a", list(range(50)))
    # 50 tokens: ceil(50 / 32) = 2 blocks of 32, ceil(50 / 16) = 4 of 16.
    assert [len(t) for t in block_ids] == [2, 4]
    assert computed == 0


def test_a_prefix_hit_lands_on_the_scheduler_block_size() -> None:
    # Request "a" computed 50 tokens: the 48 below hash boundaries are hashed, but only the
    # 32 below the scheduler block size (lcm 32) are cached and can hit.
    theirs, ours, hasher = _pair()
    _admit((theirs, ours), hasher, "a", list(range(50)))
    _, computed = _admit((theirs, ours), hasher, "b", [*range(50), 999])
    assert computed == 32


def test_a_finer_prefix_match_unit_still_hits_on_the_lcm() -> None:
    # prefix_match_unit=8 (hash_block_size 8): a group block of 32 is keyed by the hash of
    # its fourth hash block; hits still land on the lcm.
    theirs, ours, hasher = _pair(hash_block_size=8)
    _admit((theirs, ours), hasher, "a", list(range(70)))
    _, computed = _admit((theirs, ours), hasher, "b", [*range(70), 5])
    assert computed == 64


def test_three_groups_of_three_block_sizes_agree_with_vllm() -> None:
    layout = [("full", 64, 0), ("window", 16, 48), ("window", 32, 100)]
    theirs, ours, hasher = _pair(layout, block_size=64, hash_block_size=16)
    block_ids, _ = _admit((theirs, ours), hasher, "a", list(range(150)))
    assert [len(t) for t in block_ids] == [3, 10, 5]
    _, computed = _admit((theirs, ours), hasher, "b", list(range(150)))
    assert computed == 128


def _build(layout: list[Any], **kw: Any) -> Any:
    peer = VllmSchedulerPeer(
        num_blocks=64,
        max_num_seqs=8,
        max_num_batched_tokens=256,
        max_model_len=512,
        block_size=16,
        enable_prefix_caching=True,
        **kw,
    )
    args = {"block_size": 32, "hash_block_size": 16}
    return lambda config, **over: TokenyardScheduler(
        vllm_config=peer.vllm_config,
        kv_cache_config=config,
        structured_output_manager=peer.scheduler.structured_output_manager,
        **{**args, **over},
    )


def test_sizes_vllms_coordinator_rejects_are_refused() -> None:
    build = _build(GEMMA)
    config = _config([_spec("full", 32), _spec("window", 16, 64)])
    # KVCacheCoordinator asserts the scheduler block size is a multiple of every group's.
    with pytest.raises(ConfigError, match=r"kv_cache_groups\[0\]\.kv_cache_spec\.block_size"):
        build(config, block_size=16)
    # HybridKVCacheCoordinator: every prefix-cacheable group's is a multiple of the hash's
    # (vLLM's resolve_kv_cache_block_sizes raises ValueError for such a prefix_match_unit).
    with pytest.raises(ValueError, match="hash_block_size=32"):
        build(config, hash_block_size=32)


def test_unmodelled_kinds_beside_differing_sizes_are_refused_by_name() -> None:
    build = _build(GEMMA)
    # A Mamba align prefill checkpoint block (an align group without one is served since
    # branch mambadiff: tests/test_integrations_vllm_block_sizes_kinds.py).
    checkpoint = MambaSpec(
        block_size=16,
        shapes=((1, 1),),
        dtypes=(torch.float32,),
        mamba_cache_mode="align",
        num_prefill_checkpoint_blocks=1,
        prefill_checkpoint_alignment=1,
    )
    config = _config([_spec("full", 32), checkpoint])
    with pytest.raises(ConfigError, match=r"kv_cache_groups\[1\]\.kv_cache_spec: MambaSpec"):
        build(config)
    layout = _config([_spec("full", 32), _spec("window", 16, 64)])
    # n-gram steps of any length: 1 + 2 slots, and 1 + 20, more than the hash block of 16
    # (vLLM's _spec_decode_step_blocks counts them per group, on each group's size).
    _build(GEMMA, num_speculative_tokens=2)(layout)
    _build(GEMMA, num_speculative_tokens=20)(layout)
    # EAGLE's look-ahead hashes or block drop beside differing sizes: served, with vLLM's
    # partial tail-block entries (test_eagles_prompt_tail_block_is_freed_as_vllm_frees_it).
    _build(GEMMA, num_speculative_tokens=2, speculative_method="eagle")(layout)
    _build(
        GEMMA,
        num_speculative_tokens=2,
        speculative_method="eagle",
        disable_lookahead_block_hashes=True,
    )(layout)


def test_the_bench_streams_agree_with_vllm_at_every_step(monkeypatch: Any) -> None:
    import vllm_adapter_diff
    import vllm_block_sizes_diff
    import vllm_peer

    peer = vllm_peer.VllmSchedulerPeer
    monkeypatch.setattr(peer, "build", peer.build)
    monkeypatch.setattr(peer, "__init__", peer.__init__)
    vllm_block_sizes_diff.install("gemma", None)
    ran = 0
    for seed in (6, 11, 23, 31):
        scenario = vllm_adapter_diff.draw(seed, 120)
        ran += 1
        assert vllm_adapter_diff.run_scenario(scenario, 120, False) is None
    assert ran == 4


@pytest.mark.parametrize("eagle", ["lookahead", "drop"])
def test_eagle_bench_streams_agree_with_vllm_at_every_step(monkeypatch: Any, eagle: str) -> None:
    # EAGLE with prefix caching beside blocks of 32 and 16: look-ahead hashes or the drop,
    # with vLLM's partial tail-block entries (vllm_block_sizes_diff.py --eagle, 120/120).
    import vllm_adapter_diff
    import vllm_block_sizes_diff
    import vllm_peer

    peer = vllm_peer.VllmSchedulerPeer
    monkeypatch.setattr(peer, "build", peer.build)
    monkeypatch.setattr(peer, "__init__", peer.__init__)
    vllm_block_sizes_diff.install("gemma", None)
    for seed in (0, 5):
        scenario = vllm_adapter_diff.draw(seed, 120, eagle)
        for is_async in (False, True):
            assert vllm_adapter_diff.run_scenario(scenario, 120, is_async) is None


def test_speculative_steps_longer_than_the_hash_block_agree_with_vllm(monkeypatch: Any) -> None:
    # k of 17 to 40 n-gram drafts: one step's slots exceed the hash block of 16.
    import vllm_adapter_diff
    import vllm_block_sizes_diff
    import vllm_peer

    peer = vllm_peer.VllmSchedulerPeer
    monkeypatch.setattr(peer, "build", peer.build)
    monkeypatch.setattr(peer, "__init__", peer.__init__)
    vllm_block_sizes_diff.install("gemma", None)
    for seed in (0, 3, 7):
        scenario = vllm_adapter_diff.draw(seed, 120)
        vllm_block_sizes_diff.long_steps(scenario, seed, 120)
        assert scenario.config.num_speculative_tokens > 16
        for is_async in (False, True):
            assert vllm_adapter_diff.run_scenario(scenario, 120, is_async) is None


@pytest.mark.parametrize(("drop", "prompt_len"), [(True, 50), (False, 64)])
def test_eagles_prompt_tail_block_is_freed_as_vllm_frees_it(drop: bool, prompt_len: int) -> None:
    # EAGLE beside blocks of 32 and 16 (hash 16): the prompt's last hash boundary, 48, lies
    # inside its second full-attention block, which vLLM's
    # FullAttentionManager._cache_partial_tail_block keys under the hash at 48 when the
    # block is not yet hashed in full. With the drop a 50-token prompt (the group caches
    # min(50, 32 + 32) tokens, hashed to 48); with a look-ahead of 1 a 64-token one (its
    # boundary is that of its first 63 tokens, 48; 64 are cached, but the hashes reach 48,
    # the last block's waiting for the token after it). Aborted before its step's output
    # lands, "a" frees that block as a cached one, to the back of the free queue, not the
    # front: "b" does not get it.
    kw = {"disable_lookahead_block_hashes": True} if drop else {}
    theirs, ours, hasher = _pair(num_speculative_tokens=2, speculative_method="eagle", **kw)
    assert ours.vllm_config.num_hash_lookahead_tokens == (0 if drop else 1)
    seen = []
    for s in (theirs, ours):
        s.add_request(_request("a", list(range(prompt_len)), hasher))
        out = s.schedule()
        seen.append(out.scheduled_new_reqs[0].block_ids)
        s.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    assert seen[0] == seen[1]
    (b_full, _), _ = _admit((theirs, ours), hasher, "b", list(range(1000, 1064)))
    assert seen[0][0][1] not in b_full


def _flagged_config(flags: tuple[bool, bool]) -> KVCacheConfig:
    groups = [
        KVCacheGroupSpec([f"layers.{i}"], _spec(*g), is_eagle_group=flag)
        for i, (g, flag) in enumerate(zip(GEMMA, flags, strict=True))
    ]
    return KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=groups)


@pytest.mark.parametrize(
    ("flags", "lengths", "computed", "freed_cached"),
    [
        ((True, True), (32, 64), 0, {3, 8}),
        ((True, False), (32, 64), 32, {3}),
        ((False, True), (64, 64), 64, {8}),
    ],
)
def test_partial_eagle_flags_drop_only_in_their_groups_as_vllm(
    flags: tuple[bool, bool], lengths: tuple[int, int], computed: int, freed_cached: set[int]
) -> None:
    # EAGLE's drop beside blocks of 32 (full attention: blocks 1-3) and 16 (a window of 64:
    # blocks 4-9), with the groups flagged is_eagle_group as a drafter's layers would flag
    # them (vLLM drops only in drop_eagle_group_ids). An 82-token prompt: a group that drops
    # caches a block past the aligned 64 (get_num_cacheable_tokens: full attention its
    # partial tail block 3 at the hash boundary 80, _cache_partial_tail_block with the
    # manager's use_eagle; the window its 5th block, 8) and its hit drops a block
    # (find_longest_cache_hit_per_group); one that does not caches 64 tokens and hits them.
    # Aborted, "a" frees its cached blocks to the back of the free queue and the rest (the
    # tail blocks of groups that do not drop) to the front, right after the untouched 9.
    from tokenyard.kv import block_hashes

    peer = VllmSchedulerPeer(
        num_blocks=64,
        max_num_seqs=8,
        max_num_batched_tokens=256,
        max_model_len=512,
        block_size=16,
        enable_prefix_caching=True,
        num_speculative_tokens=2,
        speculative_method="eagle",
        disable_lookahead_block_hashes=True,
    )
    hash_fn = get_hash_fn_by_name(peer.vllm_config.cache_config.prefix_caching_hash_algo)
    kv_cache_utils.init_none_hash(hash_fn)
    hasher = kv_cache_utils.get_request_block_hasher(16, hash_fn, 0)
    config = _flagged_config(flags)
    prompt = list(range(3000, 3082))
    seen = []
    for cls in (Scheduler, TokenyardScheduler):
        s = cls(
            vllm_config=peer.vllm_config,
            kv_cache_config=config,
            structured_output_manager=peer.scheduler.structured_output_manager,
            block_size=32,
            hash_block_size=16,
        )
        s.add_request(_request("a", prompt, hasher))
        out = s.schedule()
        s.update_from_output(out, _empty_output(out))
        s.finish_requests("a", RequestStatus.FINISHED_ABORTED)
        probe = _request("b", [*prompt, 1, 2, 3], hasher)
        if cls is Scheduler:
            pool = s.kv_cache_manager.block_pool
            free = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
            coordinator = s.kv_cache_manager.coordinator
            _, found = coordinator.find_longest_cache_hit_per_group(probe.block_hashes, 84)
        else:
            free = [int(b) for b in s._core.free_block_ids()]
            hashes = block_hashes(probe.all_token_ids, block_size=16)
            _, found = s._core.kv_hits_per_group(hashes, 84)
        seen.append((tuple(found), s.kv_cache_manager.get_computed_blocks(probe)[1], free))
    assert seen[0] == seen[1]
    found, hit, free = seen[1]
    assert (found, hit) == (lengths, computed)
    # The 6 cached blocks of a's 9 (1, 2 and 4-7 in every case) and those of freed_cached
    # are at the back; the uncached ones come first.
    back = free[-(6 + len(freed_cached)) :]
    assert set(back) == {1, 2, 4, 5, 6, 7} | freed_cached
    assert set(free[: 3 - len(freed_cached)]) == {9} | ({3, 8} - freed_cached)


@pytest.mark.parametrize("eagle_groups", ["full", "window"])
def test_bench_streams_with_partial_eagle_flags_agree_with_vllm(
    monkeypatch: Any, eagle_groups: str
) -> None:
    # vllm_block_sizes_diff.py --eagle drop --eagle-groups full|window (120/120 each).
    import vllm_adapter_diff
    import vllm_block_sizes_diff
    import vllm_peer

    assert vllm_block_sizes_diff.eagle_flags("three", "window") == [False, True, True]
    assert vllm_block_sizes_diff.eagle_flags("three", "0,2") == [True, False, True]
    with pytest.raises(ValueError, match="--eagle-groups '3'"):
        vllm_block_sizes_diff.eagle_flags("three", "3")
    peer = vllm_peer.VllmSchedulerPeer
    monkeypatch.setattr(peer, "build", peer.build)
    monkeypatch.setattr(peer, "__init__", peer.__init__)
    vllm_block_sizes_diff.install("gemma", None, eagle_groups)
    for seed in (0, 5):
        scenario = vllm_adapter_diff.draw(seed, 120, "drop")
        for is_async in (False, True):
            assert vllm_adapter_diff.run_scenario(scenario, 120, is_async) is None


def _mamba_none_kwargs(mamba_block: int, full_block: int = 16) -> dict[str, Any]:
    """Both schedulers' arguments: full attention beside a none-mode Mamba group, prefix
    caching off, ``max_model_len`` 512, the scheduler block size the groups' lcm."""
    peer = VllmSchedulerPeer(
        num_blocks=64,
        max_num_seqs=8,
        max_num_batched_tokens=256,
        max_model_len=512,
        block_size=16,
        enable_prefix_caching=False,
    )
    mamba = MambaSpec(
        block_size=mamba_block, shapes=((1, 1),), dtypes=(torch.float32,), mamba_cache_mode="none"
    )
    lcm = math.lcm(full_block, mamba_block)
    return {
        "vllm_config": peer.vllm_config,
        "kv_cache_config": _config([_spec("full", full_block), mamba]),
        "structured_output_manager": peer.scheduler.structured_output_manager,
        "block_size": lcm,
        "hash_block_size": lcm,
    }


def _first_steps(cls: type, kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """A 40-token prompt's first step (its new block ids per group) and its tables after the
    second step's allocation."""
    scheduler = cls(**kwargs)
    scheduler.add_request(_request("a", list(range(40)), None))
    out = scheduler.schedule()
    new = out.scheduled_new_reqs[0].block_ids
    scheduler.update_from_output(out, _empty_output(out))
    scheduler.schedule()
    return new, scheduler.kv_cache_manager.get_block_ids("a")


@pytest.mark.parametrize("mamba_block", [16, 32])
def test_a_none_mode_mamba_block_shorter_than_max_model_len_is_served_as_vllm(
    mamba_block: int,
) -> None:
    """vLLM's none-mode MambaManager allocates cdiv(num_tokens, block_size) slots and nulls
    all but the last computed token's state: a 40-token prompt over 16-token blocks holds
    three slots, then [null, null, state] (over 32-token blocks two, then [null, state])."""
    kwargs = _mamba_none_kwargs(mamba_block)
    theirs = _first_steps(Scheduler, kwargs)
    assert theirs == _first_steps(TokenyardScheduler, kwargs)
    slots = -(-40 // mamba_block)
    assert len(theirs[0][1]) == slots
    assert theirs[1][1][: slots - 1] == [0] * (slots - 1)


def _one_state_block(monkeypatch: Any) -> None:
    """The adapter as before branch mambanone: every none-mode Mamba group one state block
    (``block_covers_request=True``) whatever its size."""
    from tokenyard.integrations import _vllm_translate
    from tokenyard.kv import MambaSpec as CoreMambaSpec

    real = _vllm_translate.kv_groups_of

    def one_state_block(*args: Any, **kwargs: Any) -> tuple[Any, ...]:
        return tuple(
            CoreMambaSpec(num_speculative_blocks=g.num_speculative_blocks)
            if isinstance(g, CoreMambaSpec) and not g.block_covers_request
            else g
            for g in real(*args, **kwargs)
        )

    monkeypatch.setattr(_vllm_translate, "kv_groups_of", one_state_block)


def test_one_state_block_for_a_shorter_none_mode_block_disagrees(monkeypatch: Any) -> None:
    """The variant that fails: the adapter's Mamba group holding one state block (the core
    before branch mambanone, block_covers_request=True) gives one slot where vLLM gives 3."""
    _one_state_block(monkeypatch)
    kwargs = _mamba_none_kwargs(16)
    ours = _first_steps(TokenyardScheduler, kwargs)
    assert len(ours[0][1]) == 1
    assert ours != _first_steps(Scheduler, kwargs)
    # With the block covering max_model_len (vLLM's default there) the two agree.
    whole = _mamba_none_kwargs(512)
    assert _first_steps(TokenyardScheduler, whole) == _first_steps(Scheduler, whole)


def _mamba_none_streams(layout: str, seeds: range, is_async: bool) -> list[int]:
    """The seeds of ``vllm_adapter_diff``'s scenarios, prefix caching off, over
    ``vllm_block_sizes_diff``'s ``layout`` whose run differs from vLLM's at some step."""
    import vllm_adapter_diff
    import vllm_block_sizes_diff

    vllm_block_sizes_diff.install(layout, None)
    differ = []
    for seed in seeds:
        scenario = vllm_adapter_diff.draw(seed, 120)
        scenario.config.enable_prefix_caching = False
        try:
            diff = vllm_adapter_diff.run_scenario(scenario, 120, is_async)
        except Exception as err:  # a crash on either side is a difference
            diff = (-1, repr(err))
        if diff is not None:
            differ.append(seed)
    return differ


@pytest.mark.parametrize("layout", ["mambanone16", "mambanone64"])
@pytest.mark.parametrize("is_async", [False, True])
def test_none_mode_mamba_streams_agree_with_vllm_at_every_step(
    monkeypatch: Any, layout: str, is_async: bool
) -> None:
    # vllm_block_sizes_diff.py --layout mambanone16|64 (arrivals, aborts, preemption under
    # small caches, n-gram drafts with num_speculative_blocks = k; RESULTS for the counts).
    import vllm_peer

    peer = vllm_peer.VllmSchedulerPeer
    monkeypatch.setattr(peer, "build", peer.build)
    monkeypatch.setattr(peer, "__init__", peer.__init__)
    assert _mamba_none_streams(layout, range(6), is_async) == []


def test_none_mode_mamba_streams_disagree_with_one_state_block(monkeypatch: Any) -> None:
    import vllm_peer

    peer = vllm_peer.VllmSchedulerPeer
    monkeypatch.setattr(peer, "build", peer.build)
    monkeypatch.setattr(peer, "__init__", peer.__init__)
    _one_state_block(monkeypatch)
    assert _mamba_none_streams("mambanone16", range(6), False) != []
