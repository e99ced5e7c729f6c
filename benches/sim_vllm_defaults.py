"""What following vLLM 0.33's defaults changes in the simulator (branch ``simla``), each run
under an older build (``--old``, a folder with the ``tokenyard`` package, e.g. the main
tree's ``python/``) and this one, in fresh interpreters pinned to core 1:

(a) EAGLE look-ahead hashing (``VllmConfig.num_hash_lookahead_tokens`` = 1, and
    ``num_prefill_lookahead_tokens``): the real Mooncake conversation trace (skipped when
    ``../shared/data/traces/mooncake/conversation_trace.jsonl`` is absent) on 4 x
    Llama-3.1-8B / H100 SXM with prefix caching and an EAGLE drafter (k = 3, acceptance
    0.7): prefix hit tokens, hit rate, TTFT median and p99.
(b) Mamba ``align`` for a workload without prefix identity (vLLM runs it whenever prefix
    caching is on): Qwen3.5-35B-A3B (TP 2, H200) and Nemotron-3-Nano (TP 1, H100 SXM) on a
    synthetic workload (400 requests at 40 per second, prompts 2,000-8,000 tokens, outputs
    100-400): requests held at once (the plan's, vLLM's max concurrency), peak batch,
    preemptions, output throughput.

    PYTHONPATH=python .venv/bin/python benches/sim_vllm_defaults.py --old /work/main/python
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MOONCAKE = HERE.parents[1] / "shared/data/traces/mooncake/conversation_trace.jsonl"

CHILD = """
import json, re, sys
import numpy as np
from tokenyard.simulation import config_from_mapping, simulate
from tokenyard.simulation.cli import format_summary
r = simulate(config_from_mapping(json.loads(sys.argv[1])))
s = r.summary
ttft = np.asarray(r.columns["ttft"])
held = re.search(r"so ([0-9,]+) run at once", format_summary(r))
print(json.dumps({
    "hit_tokens": int(np.asarray(r.columns["prefix_hit_tokens"]).sum()),
    "hit_rate": s["throughput"]["prefix_hit_rate"],
    "ttft_p50": float(np.median(ttft)), "ttft_p99": float(np.percentile(ttft, 99)),
    "held": held.group(1) if held else None,
    "batch_max": s["replicas"]["batch_size"]["max"],
    "restarts": s["preemption"]["num_restarts"],
    "decode_tok_s": s["throughput"]["decode_tokens_per_s"],
    "wall_s": s["wall_s"],
}))
"""


def run_side(path: str, config: dict[str, object]) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": path}
    res = subprocess.run(
        ["taskset", "-c", "1", sys.executable, "-c", CHILD, json.dumps(config)],
        env=env,
        capture_output=True,
        text=True,
        cwd="/tmp",
        check=True,
    )
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


def eagle_mooncake() -> dict[str, object]:
    return {
        "cluster": {"num_replicas": 4},
        "replica": {
            "model": "llama-3.1-8b",
            "device": "h100-sxm",
            "scheduler": {
                "policy": "vllm_v1",
                "enable_prefix_caching": True,
                "max_request_tokens": 131072,
            },
            "speculative": {"method": "eagle", "num_speculative_tokens": 3, "acceptance_rate": 0.7},
        },
        "workload": {"kind": "trace", "format": "mooncake", "path": str(MOONCAKE)},
    }


def linear_state(model: str, device: str, tp: int) -> dict[str, object]:
    return {
        "cluster": {"num_replicas": 1},
        "replica": {
            "model": model,
            "device": device,
            "tensor_parallel_size": tp,
            "scheduler": {"max_request_tokens": 8448},
        },
        "workload": {
            "kind": "synthetic",
            "num_requests": 400,
            "seed": 1,
            "arrival": {"kind": "poisson", "qps": 40.0},
            "prompt_tokens": {"kind": "uniform", "low": 2000, "high": 8000},
            "output_tokens": {"kind": "uniform", "low": 100, "high": 400},
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True, help="the older build's package folder")
    args = parser.parse_args()
    new = str(HERE.parent / "python")
    jobs = []
    if MOONCAKE.exists():
        jobs.append(("mooncake, EAGLE k=3", eagle_mooncake()))
    jobs += [
        ("Qwen3.5-35B-A3B TP2 H200, synthetic", linear_state("Qwen/Qwen3.5-35B-A3B", "h200", 2)),
        (
            "Nemotron-3-Nano TP1 H100, synthetic",
            linear_state("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "h100-sxm", 1),
        ),
    ]
    for name, config in jobs:
        old, ours = run_side(args.old, config), run_side(new, config)
        print(f"{name}\n  old {old}\n  new {ours}")


if __name__ == "__main__":
    main()
