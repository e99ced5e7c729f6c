"""Vidur timeline fidelity: tokenyard's Vidur policies against Vidur's own code.

Both simulators replay the same small traces with the SAME execution times: Vidur 0.0.26
(``benches/peers/vidur_timeline_peer.py``, in the bench-only ``.venv-vidur`` of
``benches/peers/vidur_setup.sh``) with its predictor replaced by a closed form, tokenyard
with its ``linear`` execution model set to that closed form
(``(constant + a * prefill tokens + b * decode tokens) / stages`` per batch stage). Then
every request's timeline is compared: scheduled (first time), first token (Vidur's
``prefill_completed_at``) and completed. A scenario agrees when every request's three
marks agree within 1e-9 s; for the others the first differing event (earliest in
simulated time) is printed.

    bash benches/peers/vidur_setup.sh                        # once
    .venv/bin/python benches/vidur_timeline.py               # ~1 min (Vidur start-up)
    .venv/bin/python benches/vidur_timeline.py --restart vidur --json out.json
    # diagnosis: Vidur with microsoft/vidur's pipeline admission, no token limit
    .venv/bin/python benches/vidur_timeline.py --vidur-pipeline github --max-tokens-in-batch 1000000

vidur 0.0.26 (the PyPI release) ships the vllm, sarathi and orca replica schedulers only;
lightllm and faster_transformer scenarios are listed as "no peer".
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
VIDUR_PY = Path(os.environ.get("VIDUR_VENV", REPO / ".venv-vidur")) / "bin" / "python"
TOL_S = 1e-9
MAX_TOKENS = 4096

#: Llama-2-7B on an A100 per iteration: 6 ms + 0.15 ms per prefill token + 0.3 ms per
#: decode token (round numbers; only agreement matters here, not realism).
EXEC = {"constant_s": 0.006, "per_prefill_token_s": 0.00015, "per_decode_token_s": 0.0003}


def requests(seed: int, n: int, qps: float, prompt: tuple[int, int], out: tuple[int, int]):
    """Poisson arrivals, uniform prompt and output lengths (prompt + output <= 4096)."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0 / qps, n))
    t -= t[0]  # tokenyard's trace reader starts the first arrival at 0
    p = rng.integers(prompt[0], prompt[1] + 1, n)
    d = rng.integers(out[0], out[1] + 1, n)
    d = np.minimum(d, MAX_TOKENS - p)
    return [[round(float(a), 6), int(x), int(y)] for a, x, y in zip(t, p, d, strict=True)]


def scenarios() -> list[dict[str, Any]]:
    """About fifteen: each policy, light and heavy load (> 29 running), 1, 2 and 4 stages,
    and memory tight enough to preempt."""
    base = {
        "block_size": 16,
        "watermark_blocks_fraction": 0.01,
        "max_tokens_in_batch": 4096,
        "chunk_size": 512,
        "max_tokens": MAX_TOKENS,
        "batch_size_cap": 128,
        "num_stages": 1,
        "num_blocks": 7424,
        "exec": EXEC,
    }
    light = requests(1, 60, 4.0, (32, 512), (16, 256))
    heavy = requests(2, 200, 40.0, (32, 384), (64, 512))
    long = requests(3, 120, 30.0, (256, 1536), (64, 512))
    # Memory so tight that Sarathi preempts requests in the middle of a chunked prefill.
    midchunk_a = requests(1, 80, 40.0, (32, 512), (16, 256))
    midchunk_b = requests(2, 80, 40.0, (32, 512), (300, 1000))
    s = [
        {"name": "vllm-light", "scheduler": "vllm", "requests": light},
        {"name": "vllm-heavy (>29 running)", "scheduler": "vllm", "requests": heavy},
        {"name": "vllm-heavy-pp2", "scheduler": "vllm", "num_stages": 2, "requests": heavy},
        {"name": "vllm-preempt", "scheduler": "vllm", "num_blocks": 600, "requests": heavy},
        {"name": "sarathi-light", "scheduler": "sarathi", "requests": light},
        {"name": "sarathi-heavy (>29 running)", "scheduler": "sarathi", "requests": long},
        {"name": "sarathi-heavy-pp2", "scheduler": "sarathi", "num_stages": 2, "requests": long},
        {"name": "sarathi-preempt", "scheduler": "sarathi", "num_blocks": 700, "requests": long},
        {
            "name": "sarathi-preempt-midchunk-a",
            "scheduler": "sarathi",
            "num_blocks": 200,
            "chunk_size": 128,
            "requests": midchunk_a,
        },
        {
            "name": "sarathi-preempt-midchunk-b",
            "scheduler": "sarathi",
            "num_blocks": 600,
            "chunk_size": 128,
            "requests": midchunk_b,
        },
        # Four stages under memory pressure: restart victims come from the running list in
        # Vidur's order (issue 32 item 12).
        {
            "name": "sarathi-preempt-pp4",
            "scheduler": "sarathi",
            "num_stages": 4,
            "num_blocks": 900,
            "requests": long,
        },
        {
            "name": "sarathi-preempt-midchunk-pp4",
            "scheduler": "sarathi",
            "num_stages": 4,
            "num_blocks": 200,
            "chunk_size": 128,
            "requests": midchunk_a,
        },
        # sarathi.rs's regression test, as Vidur runs it: B, the last request of the batch
        # that just ended, is the victim, not C, the latest arrival.
        {
            "name": "sarathi-victim-pp2 (unit test)",
            "scheduler": "sarathi",
            "num_stages": 2,
            "block_size": 4,
            "num_blocks": 4,
            "watermark_blocks_fraction": 0.0,
            "chunk_size": 4,
            "batch_size_cap": 4,
            "max_tokens": 64,
            "exec": {"constant_s": 1.0, "per_prefill_token_s": 0.0, "per_decode_token_s": 0.0},
            "requests": [[0.0, 6, 2], [0.5, 4, 4], [1.0, 4, 4]],
        },
        {
            "name": "vllm-preempt-pp4",
            "scheduler": "vllm",
            "num_stages": 4,
            "num_blocks": 600,
            "requests": heavy,
        },
        {"name": "orca-heavy", "scheduler": "orca", "batch_size_cap": 16, "requests": heavy},
        {
            "name": "orca-pp2",
            "scheduler": "orca",
            "batch_size_cap": 16,
            "num_stages": 2,
            "requests": light,
        },
        {
            "name": "lightllm-light",
            "scheduler": "lightllm",
            "block_size": 1,
            "num_blocks": 7424 * 16,
            "requests": light,
        },
        {"name": "faster_transformer-light", "scheduler": "faster_transformer", "requests": light},
    ]
    return [base | x for x in s]


def run_vidur(scens: list[dict[str, Any]], pipeline: str) -> dict[str, Any]:
    peer = [s for s in scens if s["scheduler"] in ("vllm", "sarathi", "orca")]
    with tempfile.TemporaryDirectory(prefix="vidur-timeline-") as tmp:
        src, dst = Path(tmp) / "in.json", Path(tmp) / "out.json"
        src.write_text(json.dumps({"scenarios": peer}))
        subprocess.run(
            [str(VIDUR_PY), str(HERE / "peers" / "vidur_timeline_peer.py"), str(src), str(dst)]
            + (["github"] if pipeline == "github" else []),
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        out = json.loads(dst.read_text())
    return {"vidur_version": out["vidur_version"], **{r["name"]: r for r in out["scenarios"]}}


def run_tokenyard(s: dict[str, Any], restart: str) -> list[dict[str, Any]]:
    from tokenyard.simulation import config_from_mapping, simulate

    with tempfile.TemporaryDirectory(prefix="ty-timeline-") as tmp:
        trace = Path(tmp) / "trace.csv"
        with trace.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["arrived_at", "num_prefill_tokens", "num_decode_tokens"])
            w.writerows(s["requests"])
        scheduler = {
            "policy": s["scheduler"],
            "block_size": s["block_size"],
            "num_blocks": s["num_blocks"],
            "batch_size_cap": s["batch_size_cap"],
            "watermark_blocks_fraction": s["watermark_blocks_fraction"],
            "max_tokens_in_batch": s["max_tokens_in_batch"],
            "chunk_size": s["chunk_size"],
            "max_request_tokens": s["max_tokens"],
        }
        # The restart mode applies to the policies that preempt (others refuse it).
        if restart != "default" and s["scheduler"] in ("vllm", "sarathi"):
            scheduler["restart"] = restart
        config = config_from_mapping(
            {
                "seed": 0,
                "cluster": {"num_replicas": 1, "global_scheduler": {"policy": "round_robin"}},
                "replica": {
                    "model": "llama-2-7b",
                    "device": "a100-80gb",
                    "tensor_parallel_size": 1,
                    "num_pipeline_stages": s["num_stages"],
                    "scheduler": scheduler,
                },
                "execution": {
                    "model": "linear",
                    **s["exec"],
                    "per_decode_context_token_s": 0.0,
                    "per_prefill_context_token_s": 0.0,
                    "cpu_overhead_s": 0.0,
                },
                "workload": {"kind": "trace", "format": "vidur", "path": str(trace)},
            }
        )
        c = simulate(config).columns
    order = np.argsort(c["request_id"])

    def value(name: str, i: int) -> float | None:
        v = float(c[name][i])
        return None if np.isnan(v) else v

    return [
        {
            "scheduled_at": value("scheduled_at", i),
            "first_token_at": value("first_token_at", i),
            "completed_at": value("completed_at", i),
            "num_restarts": int(c["num_restarts"][i]),
        }
        for i in order
    ]


EVENTS = ("scheduled_at", "first_token_at", "completed_at")


def compare(vidur: list[dict[str, Any]], ours: list[dict[str, Any]]) -> dict[str, Any]:
    diffs = []
    for i, (v, t) in enumerate(zip(vidur, ours, strict=True)):
        for e in EVENTS:
            a, b = v[e], t[e]
            if (a is None) != (b is None) or (a is not None and abs(a - b) > TOL_S):
                diffs.append((min(x for x in (a, b) if x is not None), i, e, a, b))
    bad = {d[1] for d in diffs}
    result: dict[str, Any] = {
        "requests": len(vidur),
        "requests_agreeing": len(vidur) - len(bad),
        "max_e2e_diff_s": max(
            (
                abs(v["completed_at"] - t["completed_at"])
                for v, t in zip(vidur, ours, strict=True)
                if v["completed_at"] is not None and t["completed_at"] is not None
            ),
            default=0.0,
        ),
        "restarts": [sum(r["num_restarts"] for r in vidur), sum(r["num_restarts"] for r in ours)],
    }
    if diffs:
        _, i, e, a, b = min(diffs)
        result["first_difference"] = {"request": i, "event": e, "vidur": a, "tokenyard": b}
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--restart", default="default", help="tokenyard's replica.scheduler.restart")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.add_argument("--only", help="comma-separated scenario names")
    p.add_argument(
        "--vidur-cache",
        type=Path,
        help="Vidur's timelines: reused from this file if it holds them for the same "
        "scenarios and --vidur-pipeline, else Vidur runs and the file is (re)written",
    )
    p.add_argument("--vidur-only", action="store_true", help="run Vidur's side and stop")
    p.add_argument(
        "--vidur-pipeline",
        choices=("0.0.26", "github"),
        default="0.0.26",
        help="github: patch Vidur to microsoft/vidur's pipeline admission (diagnosis only)",
    )
    p.add_argument(
        "--max-tokens-in-batch", type=int, help="override every scenario's (diagnosis only)"
    )
    args = p.parse_args()
    scens = scenarios()
    if args.max_tokens_in_batch:
        scens = [s | {"max_tokens_in_batch": args.max_tokens_in_batch} for s in scens]
    if args.only:
        keep = set(args.only.split(","))
        scens = [s for s in scens if s["name"] in keep]
    # The cache holds Vidur's answer to exactly these inputs, or is ignored.
    key = hashlib.sha256(json.dumps([scens, args.vidur_pipeline]).encode()).hexdigest()
    cached = None
    if args.vidur_cache and args.vidur_cache.exists():
        cached = json.loads(args.vidur_cache.read_text())
    if cached is not None and cached.get("key") == key:
        vidur = cached
    else:
        vidur = run_vidur(scens, args.vidur_pipeline) | {"key": key}
        if args.vidur_cache:
            args.vidur_cache.write_text(json.dumps(vidur) + "\n")
    if args.vidur_only:
        return
    rows = []
    for s in scens:
        ours = run_tokenyard(s, args.restart)
        theirs = vidur.get(s["name"])
        row: dict[str, Any] = {"scenario": s["name"], "scheduler": s["scheduler"]}
        if theirs is None:
            row["status"] = "no peer"
        elif theirs["error"]:
            row["status"] = f"vidur failed: {theirs['error']}"
        else:
            row |= compare(theirs["requests"], ours)
            row["vidur_max_batch_size"] = theirs["vidur_max_batch_size"]
            row["status"] = "agree" if "first_difference" not in row else "differ"
        rows.append(row)
        print(json.dumps(row), flush=True)
    compared = [r for r in rows if r["status"] in ("agree", "differ")]
    summary = {
        "vidur_version": vidur["vidur_version"],
        "restart": args.restart,
        "vidur_pipeline": args.vidur_pipeline,
        "max_tokens_in_batch": args.max_tokens_in_batch,
        "scenarios_agreeing": sum(r["status"] == "agree" for r in compared),
        "scenarios_compared": len(compared),
        "requests_agreeing": sum(r["requests_agreeing"] for r in compared),
        "requests_compared": sum(r["requests"] for r in compared),
    }
    print(json.dumps(summary))
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
