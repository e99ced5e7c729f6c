"""tokenyard.integrations.vllm with SWA bounded replay beside a Mamba ``align`` group (full
attention, ``SlidingWindowMLASpec(bounded_replay=True)``, ``MambaSpec(mamba_cache_mode=
"align")``): seeded streams against vLLM 0.33's ``Scheduler``, every step compared
(``benches/peers/vllm_replay_mamba_diff.py`` runs more). vLLM measures an admission's Mamba
split from the hit's end, before ``_mark_prefix_replay`` rewinds it, and keeps the request's
``shared_prefix_boundary`` when a hit no longer than the window is dropped. Bench venv only
(vLLM 0.33); skipped elsewhere.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")
sys.path.insert(0, str(Path(__file__).parents[1] / "benches/peers"))

from vllm_replay_mamba_diff import run


# Seed 31: a running request recomputes (replays) a Mamba state another request cached a
# step before, under the same hash; vLLM keys MambaManager.cached_blocks_this_step by hash,
# so a third request hitting the older block waits a step (the core keyed it by block id).
@pytest.mark.parametrize("seed", [*range(6), 31])
def test_replay_beside_mamba_align_matches_vllm_step_by_step(seed: int) -> None:
    seen = run(seed)
    assert seen["replays"] > 0 or seen["junction kept"] > 0
