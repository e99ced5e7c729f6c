"""tokenyard.integrations.vllm with Mamba speculative state blocks and the prefill
checkpoint block, against vLLM 0.33's own ``Scheduler`` step by step.

vLLM's ``MambaManager`` (``vllm/v1/core/single_type_kv_cache_manager.py``) holds
``num_speculative_blocks`` more state blocks per request under speculative decoding (both
``mamba_cache_mode`` "none" and "align"), and in align mode with
``num_prefill_checkpoint_blocks`` one more block a prompt's final chunk writes its last
reusable state into (``_needs_internal_checkpoint``), so the scheduler does not stop that
chunk there (``Scheduler._mamba_block_aligned_split``). Each stream runs a full-attention
group beside such a Mamba group with n-gram speculative decoding (drafts from a seeded fake
drafter, accepted where they match a seeded fake model) and compares every step: scheduled
tokens, drafts, new blocks per group, preemptions, then KV usage and every request's block
tables. Needs vLLM (the bench venv); skipped elsewhere.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

import torch
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
)
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
from vllm_compare import block_digest, seeded_arrivals
from vllm_peer import VllmSchedulerPeer

from tokenyard.errors import ConfigError
from tokenyard.integrations._vllm_translate import core_config
from tokenyard.integrations.vllm import TokenyardScheduler
from tokenyard.kv import MambaSpec as CoreMambaSpec

BLOCK = 16
MAX_MODEL_LEN = 512


@dataclass(frozen=True)
class Case:
    """One stream's settings."""

    seed: int
    mode: str = "align"
    k: int = 2
    checkpoint: bool = False
    num_blocks: int = 160
    budget: int = 64
    accept: float = 0.6


def _block_size(case: Case) -> int:
    """vLLM's ``mamba_block_size``: the cache's block in align mode, ``max_model_len`` in
    "none" mode (``model_executor/models/config.py``); vLLM's coordinator needs the
    scheduler's block to be a multiple of every group's, so a "none" stream runs every group
    on blocks of ``max_model_len`` tokens."""
    return BLOCK if case.mode == "align" else MAX_MODEL_LEN


def _groups(case: Case) -> list[Any]:
    block = _block_size(case)
    fa = FullAttentionSpec(block_size=block, num_kv_heads=1, head_size=1, dtype=torch.float32)
    mamba = MambaSpec(
        block_size=block,
        shapes=((1, 1),),
        dtypes=(torch.float32,),
        mamba_cache_mode=case.mode,
        num_speculative_blocks=case.k,
        num_prefill_checkpoint_blocks=int(case.checkpoint),
        prefill_checkpoint_alignment=1 if case.checkpoint else None,
    )
    return [KVCacheGroupSpec(["fa"], fa), KVCacheGroupSpec(["mamba"], mamba)]


def _pair(case: Case) -> tuple[Any, Any, Any]:
    peer = VllmSchedulerPeer(
        num_blocks=case.num_blocks,
        max_num_seqs=4,
        max_model_len=MAX_MODEL_LEN,
        max_num_batched_tokens=case.budget,
        num_speculative_tokens=case.k,
        enable_prefix_caching=case.mode == "align",
        block_size=_block_size(case),
    )
    peer.vllm_config.cache_config.mamba_cache_mode = case.mode
    config = KVCacheConfig(
        num_blocks=case.num_blocks, kv_cache_tensors=[], kv_cache_groups=_groups(case)
    )
    theirs, ours = (peer.build(cls, config) for cls in (Scheduler, TokenyardScheduler))
    return theirs, ours, peer


def _token(case: Case, request_id: str, position: int) -> int:
    """The fake model's token at ``position``."""
    return random.Random(f"{case.seed}/model/{request_id}/{position}").randrange(1000, 30000)


def _draft(case: Case, request_id: str, position: int) -> int:
    """The fake drafter's guess: the model's token with probability ``accept``."""
    if random.Random(f"{case.seed}/draft/{request_id}/{position}").random() < case.accept:
        return _token(case, request_id, position)
    return 999


def _digest(out: Any) -> dict[str, Any]:
    digest = block_digest(out, finished=False)
    digest["drafts"] = {r: list(d) for r, d in out.scheduled_spec_decode_tokens.items()}
    return digest


def _runner_output(case: Case, scheduler: Any, out: Any) -> ModelRunnerOutput:
    """Each request that reached its known tokens samples the drafts the model agrees with
    (up to the first it does not) and its own next token; a prefill chunk samples none."""
    ids = list(out.num_scheduled_tokens)
    sampled = []
    for r in ids:
        request = scheduler.requests.get(r)
        if request is None or request.num_computed_tokens < request.num_tokens:
            sampled.append([])
            continue
        drafts = list(out.scheduled_spec_decode_tokens.get(r, ()))
        position = request.num_tokens - len(drafts)
        tokens = []
        for i, draft in enumerate(drafts):
            tokens.append(_token(case, r, position + i))
            if draft != tokens[-1]:
                break
        else:
            tokens.append(_token(case, r, position + len(drafts)))
        sampled.append(tokens)
    return ModelRunnerOutput(
        req_ids=ids, req_id_to_index={r: n for n, r in enumerate(ids)}, sampled_token_ids=sampled
    )


def _drafts(case: Case, scheduler: Any, ids: list[str]) -> DraftTokenIds:
    live = [r for r in ids if r in scheduler.requests and not scheduler.requests[r].is_finished()]
    drafts = [
        [_draft(case, r, scheduler.requests[r].num_tokens + i) for i in range(case.k)] for r in live
    ]
    return DraftTokenIds(live, drafts)


@dataclass
class Seen:
    """What a stream exercised: steps run, drafts scheduled, steps with a Mamba table
    holding more than ``2`` live blocks, and preemptions."""

    steps: int = 0
    drafts: int = 0
    wide_tables: int = 0
    preempted: int = 0


def run_stream(case: Case, max_steps: int = 3000) -> Seen:
    """Runs ``case`` on both schedulers; raises AssertionError naming the first step that
    differs."""
    theirs, ours, peer = _pair(case)
    arrivals = seeded_arrivals(
        random.Random(case.seed),
        prefix_tokens=96,
        shared=(0, 16, 48, 96),
        tail_max=120,
        max_tokens=24,
        max_prompt=300,
    )
    seen = Seen()
    for step in range(max_steps):
        for at, *args in arrivals:
            if at == step:
                for scheduler in (theirs, ours):
                    scheduler.add_request(peer.make_request(*args))
        outs = [s.schedule() for s in (theirs, ours)]
        assert _digest(outs[1]) == _digest(outs[0]), f"step {step}"
        seen.drafts += sum(len(d) for d in outs[0].scheduled_spec_decode_tokens.values())
        seen.preempted += len(outs[0].preempted_req_ids)
        mro = _runner_output(case, theirs, outs[0])
        for scheduler, out in zip((theirs, ours), outs, strict=True):
            scheduler.update_from_output(out, mro)
        ids = list(outs[0].num_scheduled_tokens)
        for scheduler in (theirs, ours):
            scheduler.update_draft_token_ids(_drafts(case, theirs, ids))
        assert ours.get_kv_cache_usage() == pytest.approx(theirs.get_kv_cache_usage()), step
        for request_id in theirs.requests:
            table = theirs.kv_cache_manager.get_block_ids(request_id)
            assert ours.kv_cache_manager.get_block_ids(request_id) == table, f"step {step}"
            seen.wide_tables += sum(b != 0 for b in table[1]) > 2
        if step > 6 and not theirs.has_unfinished_requests():
            assert not ours.has_unfinished_requests()
            seen.steps = step
            return seen
    raise AssertionError("the stream did not drain")


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("k", [1, 3])
def test_align_speculative_state_blocks_match_vllm_step_by_step(seed: int, k: int) -> None:
    seen = run_stream(Case(seed=seed, k=k, num_blocks=(160, 48)[seed % 2]))
    assert seen.drafts > 0
    assert seen.wide_tables > 0


@pytest.mark.parametrize("seed", range(3))
def test_none_mode_speculative_state_blocks_match_vllm(seed: int) -> None:
    # 1 + 2 state blocks and one KV block a request: 9 blocks hold 2 requests.
    seen = run_stream(Case(seed=seed, mode="none", k=2, num_blocks=(9, 13, 40)[seed]))
    assert seen.drafts > 0


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("k", [0, 2])
def test_the_prefill_checkpoint_block_matches_vllm_step_by_step(seed: int, k: int) -> None:
    seen = run_stream(Case(seed=seed, k=k, checkpoint=True, num_blocks=(160, 48)[seed % 2]))
    assert seen.steps > 0


def test_a_tight_cache_with_drafts_preempts_as_vllm_does() -> None:
    seen = run_stream(Case(seed=7, k=3, checkpoint=True, num_blocks=20, budget=32))
    assert seen.preempted > 0


def test_the_spec_fields_reach_the_core() -> None:
    for case in (Case(seed=0, k=3, checkpoint=True), Case(seed=0, mode="none", k=2)):
        theirs, _, peer = _pair(case)
        core = core_config(peer.vllm_config, theirs.kv_cache_config, _block_size(case))
        mamba = core.kv_groups[1]
        assert (mamba.mamba_cache_mode, mamba.num_speculative_blocks) == (case.mode, case.k)
        checkpoint = (int(case.checkpoint), 1 if case.checkpoint else None)
        assert (mamba.num_prefill_checkpoint_blocks, mamba.prefill_checkpoint_alignment) == (
            checkpoint
        )


def test_core_mamba_spec_fields_are_checked() -> None:
    spec = CoreMambaSpec(
        mamba_cache_mode="align",
        num_speculative_blocks=2,
        num_prefill_checkpoint_blocks=1,
        prefill_checkpoint_alignment=16,
    )
    assert spec.prefill_checkpoint_alignment == 16
    bad = [
        ({"num_speculative_blocks": -1}, "num_speculative_blocks"),
        ({"mamba_cache_mode": "align", "num_prefill_checkpoint_blocks": 2}, "checkpoint_blocks"),
        ({"num_prefill_checkpoint_blocks": 1, "prefill_checkpoint_alignment": 1}, "align"),
        ({"mamba_cache_mode": "align", "num_prefill_checkpoint_blocks": 1}, "alignment"),
        ({"mamba_cache_mode": "align", "prefill_checkpoint_alignment": 4}, "alignment"),
        (
            {
                "mamba_cache_mode": "align",
                "num_prefill_checkpoint_blocks": 1,
                "prefill_checkpoint_alignment": 0,
            },
            "alignment",
        ),
    ]
    for kwargs, field in bad:
        with pytest.raises(ConfigError, match=field):
            CoreMambaSpec(**kwargs)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize(("k", "checkpoint"), [(2, False), (3, True)])
def test_connector_loads_beside_speculative_blocks_match_vllm(
    seed: int, k: int, checkpoint: bool, monkeypatch: Any
) -> None:
    # The seeded SupportsHMA connector of test_integrations_vllm_hybrid_connectors (loads
    # part of each request, asynchronously or not) beside FA + a Mamba align group with
    # speculative blocks: a load takes the loaded state (allocate_external_computed_blocks)
    # then the speculative blocks (allocate_new_blocks, even with nothing to compute), and
    # vLLM's count leaves the loaded state block out. Every step and table agree.
    from test_integrations_vllm_hybrid_connectors import _run

    build = VllmSchedulerPeer.build

    def align_build(self: Any, cls: type, config: Any, **kw: Any) -> Any:
        self.vllm_config.cache_config.mamba_cache_mode = "align"
        return build(self, cls, config, **kw)

    monkeypatch.setattr(VllmSchedulerPeer, "build", align_build)
    case = Case(seed=seed, k=k, checkpoint=checkpoint)
    seen = _run(
        _groups(case), seed, num_blocks=(40, 160)[seed % 2], loads_every_group=seed % 3 == 0
    )
    assert seen["loads"] > 0
