"""Differential fuzz of tokenyard's vLLM adapter against vLLM 0.33's ``Scheduler`` with
Mamba speculative state blocks and the align prefill checkpoint block: seeded streams
(``tests/test_integrations_vllm_mamba_spec.py``'s ``run_stream``: full attention beside a
``MambaSpec`` group, n-gram speculative decoding with a fake drafter whose drafts the fake
model accepts at a seeded rate) over mode, draft count, checkpoint block, cache size and
budget; every step's scheduled tokens, drafts, new blocks, preemptions, KV usage and block
tables compared. Prints how many streams agree and, for each that does not, its first
differing step.

    PYTHONPATH=python .venv-bench/bin/python benches/peers/vllm_mamba_spec_diff.py [--streams 120]
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=120)
    parser.add_argument("--first-seed", type=int, default=1000)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
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
