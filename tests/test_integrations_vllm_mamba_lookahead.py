"""tokenyard.integrations.vllm over full attention beside a Mamba ``align`` group under an
EAGLE3 drafter's look-ahead hashes (``VllmConfig.num_hash_lookahead_tokens`` = 1, vLLM
0.33's default with prefix caching): the hashes, the Mamba split's last reusable state
(``get_mamba_prefill_checkpoint_position`` with the look-ahead) and the groups' states all
read the scheduler's one look-ahead. Seeded streams with shared prefixes against vLLM's
``Scheduler``, every step's blocks per group and the tables after it compared (the
simulator runs Qwen3.5 / Nemotron-H under MTP and EAGLE this way). Bench venv only (vLLM
0.33); skipped elsewhere.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")
sys.path.insert(0, str(Path(__file__).parents[1] / "benches/peers"))
sys.path.insert(0, str(Path(__file__).parent))

from test_integrations_vllm_mamba_connector import _stream_pair
from vllm_compare import block_digest, compare_stream, seeded_arrivals


@pytest.mark.parametrize(("seed", "num_blocks"), [(0, 160), (1, 40), (2, 160), (3, 40)])
def test_mamba_align_under_lookahead_hashes_matches_vllm(seed: int, num_blocks: int) -> None:
    theirs, ours, peer = _stream_pair(
        num_blocks,
        max_num_batched_tokens=64,
        speculative_method="eagle3",
        num_speculative_tokens=1,
    )
    assert theirs.num_hash_lookahead_tokens == ours.num_hash_lookahead_tokens == 1
    assert ours._core.mamba_align == (16, False, 1)
    arrivals = seeded_arrivals(
        random.Random(seed),
        prefix_tokens=96,
        shared=(0, 16, 48, 96),
        tail_max=120,
        max_tokens=24,
        max_prompt=300,
    )
    stream = compare_stream(
        theirs,
        ours,
        arrivals,
        peer.make_request,
        digest=lambda out: block_digest(out, finished=False),
    )
    assert stream is not None
