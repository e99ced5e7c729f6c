"""Encoder-decoder streams (Whisper's layout: full attention beside a ``CrossAttentionSpec``
group) on vLLM 0.33's own ``Scheduler`` and ``TokenyardScheduler``, both patched as vLLM's
``_create_encoder_decoder_scheduler`` patches them (``is_encoder_decoder``, the encoder
budget, an ``EncoderDecoderCacheManager``): every step's decisions, block tables of both
groups, encoder inputs, freed identifiers and the encoder counter must agree
(tests/test_integrations_vllm_encdec.py's ``_run``). A third of the streams are roomy, the
rest tight (a 400-embedding budget and 50 blocks: waits and preemptions). Prints how many
agree.

    PYTHONPATH=python .venv-bench/bin/python benches/peers/vllm_encdec_diff.py --streams 60
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from test_integrations_vllm_encdec import _run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=60)
    args = parser.parse_args()
    agree = encoded = preempted = 0
    for seed in range(args.streams):
        roomy = seed % 3 == 0
        blocks, budget, cache = (400, 2048, 2048) if roomy else (50, 400, 500)
        try:
            e, p = _run(1000 + seed, num_blocks=blocks, budget=budget, cache=cache)
        except AssertionError as err:
            print(f"stream {seed}: differs: {str(err).splitlines()[0]}")
            continue
        agree += 1
        encoded += e
        preempted += p
    print(
        f"{agree}/{args.streams} streams agree; {encoded} encoder inputs scheduled, "
        f"{preempted} preemptions (vLLM's)"
    )


if __name__ == "__main__":
    main()
