"""Reads ``vllm serve`` command lines through vLLM 0.33's own argument parser
(``vllm.entrypoints.common.cli_args.make_arg_parser``, the parser ``vllm serve`` builds)
and prints what it understood, so tests can check tokenyard's launch lines against the
real flags (tests/test_recommend_launch.py).

    echo '["vllm serve m --tensor-parallel-size 2"]' | .venv-bench/bin/python \
        benches/peers/vllm_launch_args.py

Run it outside the repository root: vLLM imports a top-level ``kernels`` package, which
the repository's own ``kernels/`` folder would shadow.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys

# CPU platform (no GPU probe), no model hub, warnings only.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
for _name in ("torch._opaque_base", "torch._library.opaque_object"):
    logging.getLogger(_name).setLevel(logging.ERROR)

from vllm.entrypoints.common.cli_args import make_arg_parser  # noqa: E402
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402

FIELDS = (
    "model",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "enable_expert_parallel",
    "max_num_seqs",
    "max_num_batched_tokens",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "block_size",
    "num_gpu_blocks_override",
    "long_prefill_token_threshold",
    "long_prefill_token_threshold_adaptive",
    "scheduling_policy",
    "max_model_len",
    "kv_cache_dtype",
    "dtype",
    "quantization",
    "gpu_memory_utilization",
    "speculative_config",
    "max_loras",
    "max_lora_rank",
    "max_cpu_loras",
)


def main() -> None:
    lines = json.load(sys.stdin)
    out = []
    for line in lines:
        argv = shlex.split(line)
        if argv[:2] != ["vllm", "serve"]:
            raise SystemExit(f"not a vllm serve line: {line!r}")
        # `vllm serve MODEL` puts MODEL in model_tag and copies it to --model.
        args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", *argv[2:]])
        found = {k: getattr(args, k, None) for k in FIELDS}
        transfer = getattr(args, "kv_transfer_config", None)
        found["kv_role"] = None if transfer is None else transfer.kv_role
        found["kv_connector"] = None if transfer is None else transfer.kv_connector
        out.append(found)
    json.dump(out, sys.stdout, default=str)


if __name__ == "__main__":
    main()
