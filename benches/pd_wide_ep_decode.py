"""DeepSeek-V3 P/D on H200s with a wide-EP decode pool against TP 8 decode replicas, the
same 16 decode GPUs (docs/disaggregation.md, "Expert and data parallel pools").

    .venv/bin/python benches/pd_wide_ep_decode.py QPS PREFILL_REPLICAS

Prints per decode layout: KV tokens per rank and in the pool, schedulers, TPOT, TTFT, the
decode pool's busy fraction, the KV transfer, and the median wall time of 3 runs.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from synthetic_jobs import one_replica, synthetic_workload

from tokenyard.simulation import simulate
from tokenyard.simulation.run import decode_config, plan_for

PREFILL = {
    "model": "deepseek-ai/DeepSeek-V3",
    "device": "h200",
    "tensor_parallel_size": 8,
    "expert_parallel_size": 8,
    "kv_cache_dtype": "fp8",
}
DECODE_POOLS: dict[str, dict[str, Any]] = {
    "2 x TP8 EP8": {"num_replicas": 2, "tensor_parallel_size": 8, "expert_parallel_size": 8},
    "1 x TP1 x DP16 EP16": {
        "num_replicas": 1,
        "tensor_parallel_size": 1,
        "expert_parallel_size": 16,
        "data_parallel_size": 16,
    },
}


def main(qps: float, prefill_replicas: int) -> None:
    workload = synthetic_workload(
        1500, qps=qps, prompt_tokens=(1000, 3000), output_tokens=(200, 800), seed=7
    )
    for name, pool in DECODE_POOLS.items():
        config = one_replica(
            PREFILL, workload, cluster={"num_replicas": prefill_replicas, "decode": pool}
        )
        plan = plan_for(decode_config(config))
        walls = []
        for _ in range(3):
            start = time.perf_counter()
            result = simulate(config)
            walls.append(time.perf_counter() - start)
        s = result.summary
        latency, disagg = s["latency_s"], s["disaggregation"]
        ranks = pool["num_replicas"] * pool.get("data_parallel_size", 1)
        print(
            f"{name}: {s['config']['decode']['layout']}; KV tokens per rank "
            f"{plan.max_kv_tokens:,} x {ranks} = {plan.max_kv_tokens * ranks:,}; schedulers "
            f"{len(s['replicas']['busy_fraction'])}; TPOT p50 "
            f"{latency['tpot']['p50'] * 1e3:.2f} ms, p90 {latency['tpot']['p90'] * 1e3:.2f} ms; "
            f"TTFT p50 {latency['ttft']['p50']:.3f} s; decode busy "
            f"{disagg['decode_busy_fraction']:.3f}; transfer p50 "
            f"{disagg['transfer_s']['p50'] * 1e3:.2f} ms; makespan {s['makespan_s']:.1f} s; "
            f"wall median {statistics.median(walls):.2f} s"
        )


if __name__ == "__main__":
    main(float(sys.argv[1]), int(sys.argv[2]))
