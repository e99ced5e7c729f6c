"""Reads ``python -m sglang.launch_server`` command lines through SGLang 0.5.23's own
argument parser (``ServerArgs.add_cli_args``, from the sources ``setup.sh`` unpacks into
``.venv-bench/sglang_src``) and prints what it understood, so tests can check tokenyard's
launch lines against the real flags (tests/test_recommend_launch.py).

    echo '["python -m sglang.launch_server --model-path m --tp-size 2"]' | \
        PYTHONPATH=.venv-bench/sglang_src .venv-bench/bin/python \
        benches/peers/sglang_launch_args.py

Parsing only: no resolution hooks run (they would probe the GPU and read the model), so
what is printed is what the flags say, before SGLang derives anything from them.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys

for _name in ("torch._opaque_base", "torch._library.opaque_object"):
    logging.getLogger(_name).setLevel(logging.ERROR)

from sglang.srt.server_args import ServerArgs  # noqa: E402

FIELDS = (
    "model_path",
    "tp_size",
    "pp_size",
    "attn_dp_size",
    "ep_size",
    "mem_fraction_static",
    "dtype",
    "quantization",
    "kv_cache_dtype",
    "context_length",
    "max_running_requests",
    "chunked_prefill_size",
    "max_prefill_tokens",
    "page_size",
    "max_total_tokens",
    "disable_radix_cache",
    "schedule_policy",
    "enable_priority_scheduling",
    "schedule_low_priority_values_first",
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "speculative_draft_model_path",
    "disaggregation_mode",
    "disaggregation_transfer_backend",
    "cuda_graph_bs_decode",
    "enable_lora",
    "max_loras_per_batch",
    "max_lora_rank",
)


def main() -> None:
    out = []
    for line in json.load(sys.stdin):
        argv = shlex.split(line)
        if argv[:3] != ["python", "-m", "sglang.launch_server"]:
            raise SystemExit(f"not a launch_server line: {line!r}")
        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        args = parser.parse_args(argv[3:])
        out.append({k: getattr(args, k, None) for k in FIELDS})
    json.dump(out, sys.stdout, default=str)


if __name__ == "__main__":
    main()
