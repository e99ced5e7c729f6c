"""Writes the table of vLLM 0.33's Mamba ``align`` split with fine-grained partial hash hits
on (``Scheduler._mamba_block_aligned_split`` with ``mamba_partial_cache_hit``,
vllm/v1/core/sched/scheduler.py) that ``rust/core/src/sched/mamba_partial_tests.rs``
checks the core's split against (``MambaSplitRule::with_partial_hits``).

Seeded; each row is (block, hash, drop_eagle, lookahead, checkpoint_alignment or 0, prompt,
num_tokens, start, num_new_tokens, max_prefill_tokens, junction, vLLM's answer). vLLM's
method is called on a stand-in ``self`` as vLLM's own tests call it
(tests/v1/core/prefix_cache/test_partial_prefix_cache_hits.py,
``test_mamba_align_split_partial_tail_schedule``).

Run (the bench venv): python benches/peers/vllm_mamba_partial_split_cases.py > rows.rs
"""

from __future__ import annotations

import random
from types import SimpleNamespace

from vllm.v1.core.sched.scheduler import Scheduler


def _case(rng: random.Random) -> tuple[int, ...]:
    block = rng.choice((8, 16, 32, 64))
    hash_block = rng.choice([h for h in (1, 2, 4, 8, 16) if h < block and block % h == 0])
    drop = rng.random() < 0.25
    lookahead = rng.choice((0, 0, 0, 1, 3))
    alignment = rng.choice((0, 0, hash_block, block))
    prompt = rng.randrange(1, 6 * block)
    num_tokens = prompt + (rng.randrange(0, 2 * block) if rng.random() < 0.2 else 0)
    prefill_end = max(prompt, num_tokens - 1)
    start = rng.randrange(0, prefill_end + 2)
    if rng.random() < 0.5:
        # Near the prompt's end, where its last hash boundary stops a chunk.
        start = rng.randrange(max(0, prompt - 2 * block), prefill_end + 1)
    if rng.random() < 0.4:
        start = start // hash_block * hash_block
    num_new = rng.randrange(1, max(2, num_tokens - start + 1)) if start < num_tokens else 1
    max_prefill = rng.choice((block // 2, block, 2 * block, 4 * block, 1000))
    junction = rng.randrange(0, num_tokens + 1) if rng.random() < 0.25 else 0
    mock = SimpleNamespace(
        block_size=block,
        cache_config=SimpleNamespace(block_size=block),
        max_num_scheduled_tokens=max_prefill,
        scheduler_config=SimpleNamespace(long_prefill_token_threshold=0),
        use_eagle_block_drop=drop,
        num_hash_lookahead_tokens=lookahead,
        hash_block_size=hash_block,
        mamba_partial_cache_hit=True,
        mamba_shared_prefix_checkpoint=False,
        mamba_has_prefill_checkpoint_blocks=alignment > 0,
        mamba_prefill_checkpoint_alignment=alignment or None,
    )
    request = SimpleNamespace(
        num_computed_tokens=start,
        num_prompt_tokens=prompt,
        num_tokens=num_tokens,
        shared_prefix_boundary=junction,
    )
    got = Scheduler._mamba_block_aligned_split(mock, request, num_new)  # type: ignore[arg-type]
    return (
        block,
        hash_block,
        int(drop),
        lookahead,
        alignment,
        prompt,
        num_tokens,
        start,
        num_new,
        max_prefill,
        junction,
        got,
    )


def main() -> None:
    rng = random.Random(20261128)
    rows = [_case(rng) for _ in range(600)]
    print(f"// {len(rows)} rows from benches/peers/vllm_mamba_partial_split_cases.py (vLLM 0.33.0)")
    print(f"pub(super) static ROWS: [[usize; 12]; {len(rows)}] = [")
    for row in rows:
        print("    [" + ", ".join(str(v) for v in row) + "],")
    print("];")


if __name__ == "__main__":
    main()
