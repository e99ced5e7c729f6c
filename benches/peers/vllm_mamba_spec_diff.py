"""Differential fuzz of tokenyard's vLLM adapter against vLLM 0.33's ``Scheduler`` with
Mamba speculative state blocks and the align prefill checkpoint block: seeded streams
(``tests/test_integrations_vllm_mamba_spec.py``'s ``run_stream``: full attention beside a
``MambaSpec`` group, n-gram speculative decoding with a fake drafter whose drafts the fake
model accepts at a seeded rate) over mode, draft count, checkpoint block, cache size and
budget; every step's scheduled tokens, drafts, new blocks, preemptions, KV usage and block
tables compared. Prints how many streams agree and, for each that does not, its first
differing step.

``--adapter-scenarios N`` runs instead ``vllm_adapter_diff.py``'s scenarios (sync, or async
with ``--mode async``: arrivals, aborts, stop tokens, speculative decoding with its drafter,
``AsyncScheduler``) over full attention beside a Mamba align group whose
``num_speculative_blocks`` is the scenario's draft count (with ``--checkpoint``, a prefill
checkpoint block too); scenarios with prefix caching off are skipped (``none`` mode would
need every group on blocks of ``max_model_len``).

    PYTHONPATH=python .venv-bench/bin/python benches/peers/vllm_mamba_spec_diff.py [--streams 120]
    PYTHONPATH=python .venv-bench/bin/python benches/peers/vllm_mamba_spec_diff.py \
        --adapter-scenarios 200 --mode async [--checkpoint]
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benches" / "peers")]

from test_integrations_vllm_mamba_spec import Case, run_stream  # noqa: E402


def cases(count: int, first_seed: int) -> list[Case]:
    out = []
    for i in range(count):
        seed = first_seed + i
        mode = "none" if seed % 5 == 4 else "align"
        out.append(
            Case(
                seed=seed,
                mode=mode,
                k=1 + seed % 4,
                checkpoint=mode == "align" and seed % 2 == 0,
                num_blocks=[20, 30, 48, 160][seed % 4]
                if mode == "align"
                else [9, 13, 40][seed % 3],
                budget=[32, 64, 100][seed % 3],
                accept=[0.3, 0.6, 0.9][seed % 3],
            )
        )
    return out


def adapter_scenarios(count: int, is_async: bool, checkpoint: bool) -> int:
    """``vllm_adapter_diff``'s scenarios over FA + Mamba align (see the module doc)."""
    import torch
    import vllm_adapter_diff
    import vllm_peer
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        MambaSpec,
    )

    build = vllm_peer.VllmSchedulerPeer.build

    def mamba_build(self: Any, cls: type, kv_cache_config: Any, **kw: Any) -> Any:
        self.vllm_config.cache_config.mamba_cache_mode = "align"
        bs = self.vllm_config.cache_config.block_size
        common = {"block_size": bs, "dtype": torch.float32}
        mamba = MambaSpec(
            shapes=((1, 1),),
            mamba_cache_mode="align",
            num_speculative_blocks=self.vllm_config.num_speculative_tokens or 0,
            num_prefill_checkpoint_blocks=int(checkpoint),
            prefill_checkpoint_alignment=1 if checkpoint else None,
            block_size=bs,
            dtypes=(torch.float32,),
        )
        groups = [
            KVCacheGroupSpec(["fa"], FullAttentionSpec(num_kv_heads=1, head_size=1, **common)),
            KVCacheGroupSpec(["mamba"], mamba),
        ]
        config = KVCacheConfig(
            num_blocks=kv_cache_config.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups
        )
        return build(self, cls, config, **kw)

    vllm_peer.VllmSchedulerPeer.build = mamba_build  # type: ignore[method-assign]
    agree = ran = spec = agree_spec = 0
    first = None
    for seed in range(count):
        scenario = vllm_adapter_diff.draw(seed, 200)
        if not scenario.config.enable_prefix_caching:
            continue
        ran += 1
        k = scenario.config.num_speculative_tokens
        spec += k > 0
        try:
            diff = vllm_adapter_diff.run_scenario(scenario, 200, is_async)
        except Exception as err:  # a crash on either side is a difference
            diff = (-1, f"raised {type(err).__name__}: {err}")
        if diff is None:
            agree += 1
            agree_spec += k > 0
        elif first is None:
            first = (seed, *diff)
    mode = "async" if is_async else "sync"
    print(
        f"{mode}{' + checkpoint' if checkpoint else ''}: {agree}/{ran} scenarios agree at every "
        f"step, {agree_spec}/{spec} with speculative decoding"
    )
    if first is not None:
        print(f"  first difference: seed {first[0]} step {first[1]}: {first[2][:300]}")
    return 0 if agree == ran else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=120)
    parser.add_argument("--first-seed", type=int, default=1000)
    parser.add_argument("--adapter-scenarios", type=int, default=0)
    parser.add_argument("--mode", choices=["sync", "async"], default="sync")
    parser.add_argument("--checkpoint", action="store_true")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    if args.adapter_scenarios:
        return adapter_scenarios(args.adapter_scenarios, args.mode == "async", args.checkpoint)
    agree, differ, stuck, steps, drafts, preempted = 0, [], 0, 0, 0, 0
    for case in cases(args.streams, args.first_seed):
        try:
            seen = run_stream(case)
        except AssertionError as e:
            if "did not drain" in str(e):
                stuck += 1  # both sides agreed at every step but never finished
                continue
            differ.append((case, str(e).splitlines()[0]))
            continue
        agree += 1
        steps += seen.steps
        drafts += seen.drafts
        preempted += seen.preempted
    print(
        f"{agree} of {args.streams} streams agree at every step ({steps} steps, {drafts} "
        f"drafts scheduled, {preempted} preemptions); {stuck} agreed but stalled "
        f"(a prompt larger than the cache); {len(differ)} differ"
    )
    for case, first in differ:
        print(f"  {case}: first difference at {first}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
