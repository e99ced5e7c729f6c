"""What the execution-time predictor costs inside a replay: the ``sim_scale.py`` job at 1M
requests (8 Llama-2-7B replicas on A100-80GB) with the linear, roofline and profiled
models, under the ``vllm`` and ``vllm_v1`` replica policies, each run in a fresh process
pinned to one core.

Each (policy, model) runs twice: as is, and with the model evaluated ``REPEAT`` times per
batch stage (``_core.simulate(exec_repeat=...)``: same answers, so the same schedule,
batch for batch). The
difference of the two walls over ``REPEAT - 1`` is exactly what the model costs inside the
event loop; its share is that over the plain run's wall (``summary["wall_s"]``, the Rust
loop). Models price batches differently, so the runs of different models schedule
differently; compare shares, not walls.

The profiled model is trained on a synthetic profile with our profiler's default grid
(tables of 30-50 points per axis: the size a real profile gives).

    .venv/bin/python benches/predictor_cost.py --json benches/out/predictor_cost.json  # ~15 min
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from sim_scale import job, workload

HERE = Path(__file__).resolve().parent
MODELS = ("linear", "roofline", "measured", "profiled")
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


REPEAT = 5


def child(
    policy: str, model: str, num_requests: int, profile: Path, cache: Path, repeat: int
) -> dict[str, Any]:
    from tokenyard import _core
    from tokenyard.simulation import config_from_mapping, simulate

    cfg = config_from_mapping(config(policy, model, num_requests, profile, cache))
    core_simulate = _core.simulate

    def with_repeat(*args: Any, **kwargs: Any) -> dict[str, Any]:
        return core_simulate(*args, exec_repeat=repeat, **kwargs)

    _core.simulate = with_repeat  # type: ignore[assignment]
    result = simulate(cfg)
    return {
        "policy": policy,
        "model": model,
        "repeat": repeat,
        "num_requests": num_requests,
        "wall_s": result.summary["wall_s"],
        "num_batches": result.summary["num_batches"],
    }


def _run(
    policy: str, model: str, repeat: int, args: argparse.Namespace, profile: Path, cache: Path
) -> dict[str, Any]:
    child_args = ["--child", f"{policy}/{model}/{repeat}", "--requests", str(args.requests)]
    child_args += ["--profile", str(profile), "--cache", str(cache)]
    command = ["taskset", "-c", "0", sys.executable, str(Path(__file__)), *child_args]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


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
        policy, model, repeat = args.child.split("/")
        result = child(
            policy, model, args.requests, Path(args.profile), Path(args.cache), int(repeat)
        )
        print(json.dumps(result))
        return
    with tempfile.TemporaryDirectory() as tmp:
        profile, cache = Path(tmp) / "profile.csv", Path(tmp) / "cache"
        synthetic_profile(profile)
        results = []
        results = []
        for policy in args.policies.split(","):
            for model in MODELS:
                plain, repeated = (
                    _run(policy, model, r, args, profile, cache) for r in (1, REPEAT)
                )
                assert plain["num_batches"] == repeated["num_batches"]  # the same schedule
                per_call = (repeated["wall_s"] - plain["wall_s"]) / (REPEAT - 1)
                per_call /= plain["num_batches"]
                share = per_call * plain["num_batches"] / plain["wall_s"]
                results.append({**plain, "per_call_s": per_call, "share": share})
                print(
                    f"{policy:<8} {model:<9} wall {plain['wall_s']:7.2f} s "
                    f"(x{REPEAT}: {repeated['wall_s']:7.2f} s)  batches "
                    f"{plain['num_batches']:>11,}  per call {1e9 * per_call:5.0f} ns  "
                    f"share {100 * share:5.2f}%"
                )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
