"""What the execution-time predictor costs inside a replay: the ``sim_scale.py`` job at 1M
requests (8 Llama-2-7B replicas on A100-80GB) with the linear, roofline and profiled
models, each in a fresh process pinned to one core.

Two figures per model:

- the replay's wall time (``summary["wall_s"]``). Models price batches differently, so the
  runs schedule differently too; the walls are context, not the predictor's cost;
- the predictor's own share: its per-call cost, timed on the same core with
  ``_core.evaluate_ops`` over 200k batch shapes of the job's mix (the simulator's code,
  called in a loop without the event loop) less the same loop over a model without
  operations (converting the shapes and storing the results, which the simulator does not
  do), times the replay's number of batch stages, over the replay's wall time.

The profiled model is trained on a synthetic profile with our profiler's default grid
(tables of 30-50 points per axis: the size a real profile gives).

    .venv/bin/python benches/predictor_cost.py --json benches/out/predictor_cost.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from sim_scale import job, workload

HERE = Path(__file__).resolve().parent
MODELS = ("linear", "roofline", "profiled")
POLICIES = ("vllm", "vllm_v1")


def synthetic_profile(path: Path) -> None:
    """A profile of the default grid's shapes with plausible A100-like times."""
    from tokenyard.profiler.run import ProfileGrid, write_profile

    grid = ProfileGrid.preset("default")
    common = {"device": "synthetic", "model": "llama-2-7b", "tensor_parallel_size": 1}
    rows: list[dict[str, Any]] = []
    for op in ("input_norm", "qkv_proj", "rope", "kv_store", "o_proj", "post_attn_norm"):
        rows += [
            {**common, "op": op, "num_tokens": n, "time_ms": 0.01 + 3e-5 * n}
            for n in grid.num_tokens
        ]
    for op in ("gate_up_proj", "act", "down_proj", "residual_add", "embedding", "lm_head"):
        rows += [
            {**common, "op": op, "num_tokens": n, "time_ms": 0.02 + 8e-5 * n}
            for n in grid.num_tokens
        ]
    for b in grid.prefill_batch_sizes:
        for c in grid.prefill_chunk_sizes:
            for p in grid.prefill_context_lens:
                ms = 0.01 + 2e-8 * b * c * (p + c / 2)
                rows.append(
                    {
                        **common,
                        "op": "attn_prefill",
                        "batch_size": b,
                        "chunk_size": c,
                        "context_len": p,
                        "time_ms": ms,
                    }
                )
    for b in grid.decode_batch_sizes:
        for ctx in grid.decode_context_lens:
            ms = 0.005 + 1e-7 * b * ctx
            rows.append(
                {**common, "op": "attn_decode", "batch_size": b, "context_len": ctx, "time_ms": ms}
            )
    write_profile(rows, path)


def config(
    policy: str, model: str, num_requests: int, profile: Path, cache: Path
) -> dict[str, Any]:
    knobs = {"batch_size_cap": 128, "max_tokens_in_batch": 4096} if policy == "vllm" else {}
    mapping = job(policy, workload(num_requests), **knobs)
    mapping["execution"] = {"model": model}
    if model == "profiled":
        mapping["execution"]["profiled"] = {"profiles": [str(profile)], "cache_dir": str(cache)}
    return mapping


def shape_mix(n: int) -> dict[str, np.ndarray]:
    """Batches like the job's: mostly decodes (1-128 requests, contexts to 4k), one in ten
    with a prefill chunk."""
    rng = np.random.default_rng(0)
    decodes = rng.integers(1, 129, n)
    context = rng.integers(64, 4096, n)
    chunk = np.where(rng.random(n) < 0.1, rng.integers(64, 3072, n), 0)
    return {
        "num_requests": (decodes + (chunk > 0)).astype(np.uint64),
        "num_prefill_tokens": chunk.astype(np.uint64),
        "num_decode_tokens": decodes.astype(np.uint64),
        "sum_decode_context": (decodes * context).astype(np.uint64),
        "sum_prefill_context": (chunk * chunk).astype(np.uint64),
        "sum_prefill_squared": (chunk * chunk).astype(np.uint64),
        "num_padding_rows": np.zeros(n, dtype=np.uint64),
    }


def child(policy: str, model: str, num_requests: int, profile: Path, cache: Path) -> dict[str, Any]:
    from tokenyard import _core
    from tokenyard.simulation import config_from_mapping, simulate
    from tokenyard.simulation.execution import build_predictor

    cfg = config_from_mapping(config(policy, model, num_requests, profile, cache))
    result = simulate(cfg)
    out: dict[str, Any] = {
        "policy": policy,
        "model": model,
        "num_requests": num_requests,
        "wall_s": result.summary["wall_s"],
        "num_batches": result.summary["num_batches"],
    }
    predictor = build_predictor(cfg)
    if predictor is not None:
        shapes = shape_mix(200_000)
        spec = predictor.fused().to_core()  # what simulate() hands to Rust

        def per_call(spec: dict[str, Any]) -> float:
            runs = []
            for _ in range(7):
                start = time.perf_counter()
                _core.evaluate_ops(spec, shapes)
                runs.append((time.perf_counter() - start) / 200_000)
            return statistics.median(runs)

        loop_s = per_call({**spec, "ops": []})
        out["per_call_s"] = per_call(spec) - loop_s
        out["loop_per_call_s"] = loop_s
        out["predictor_share"] = out["per_call_s"] * out["num_batches"] / out["wall_s"]
        out["num_ops"] = len(spec["ops"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--policies", default=",".join(POLICIES), help="replica policies")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--profile", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        policy, model = args.child.split("/")
        result = child(policy, model, args.requests, Path(args.profile), Path(args.cache))
        print(json.dumps(result))
        return
    with tempfile.TemporaryDirectory() as tmp:
        profile, cache = Path(tmp) / "profile.csv", Path(tmp) / "cache"
        synthetic_profile(profile)
        results = []
        runs = [(p, m) for p in args.policies.split(",") for m in MODELS]
        for policy, model in runs:
            child_args = ["--child", f"{policy}/{model}", "--requests", str(args.requests)]
            child_args += ["--profile", str(profile), "--cache", str(cache)]
            command = ["taskset", "-c", "0", sys.executable, str(Path(__file__)), *child_args]
            line = subprocess.run(command, capture_output=True, text=True, check=True).stdout
            results.append(json.loads(line.strip().splitlines()[-1]))
            r = results[-1]
            share = r.get("predictor_share")
            print(
                f"{policy:<8} {model:<9} wall {r['wall_s']:7.2f} s  batches {r['num_batches']:>9,}"
                + (
                    f"  per call {1e9 * r['per_call_s']:6.0f} ns  share {100 * share:5.2f}%"
                    if share
                    else ""
                )
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
