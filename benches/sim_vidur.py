"""tokenyard's simulator against Vidur (0.0.26) on one trace, in one run on one core.

The job is ``benches/sim_scale.py``'s at 10,000 requests (8 Llama-2-7B replicas on A100,
round-robin routing, Poisson 25 req/s, zipf prompts of 64-3,072 and outputs of
16-1,024 tokens). It is written once as a CSV trace that both simulators read:

- tokenyard's Vidur reader (``{"kind": "trace", "format": "vidur"}``) takes the columns
  ``arrived_at,num_prefill_tokens,num_decode_tokens`` (microsoft/vidur's trace format);
- Vidur 0.0.26's ``trace_replay`` generator takes ``Date,Time,PromptTokenCount,
  CompletionTokenCount`` (its Splitwise-style format, every scale factor set to 1).

The file carries both column sets, with the same numbers, so each reads the same requests
from the same file (each ignores the other's columns).

Sides, each run in a fresh interpreter pinned to one core (``taskset -c 0``), interleaved
(Vidur, tokenyard vllm, tokenyard vllm_v1, repeat), medians of ``--repeat`` runs:

- **Vidur**: ``benches/peers/vidur_peer.py`` in ``.venv-vidur`` (``vidur_setup.sh``):
  its vLLM replica scheduler (batch_size_cap 128, max_tokens_in_batch 4,096), the
  random-forest predictor trained once on synthesised profiles and cached; the timed
  figure is its event loop alone (``loop_s``), excluding reading the trace, building the
  predictor and writing metrics. Chrome trace and plots off (tokenyard records neither by
  default); Vidur's metrics store on ("as shipped"). ``--lean`` adds runs with its C++
  predictor and the metrics store off, Vidur's fastest configuration.
- **tokenyard**: ``simulate()`` as a user calls it (wall time of the whole call: reading
  the CSV, the Rust loop, the per-request table and summary), with the Vidur-family
  ``vllm`` policy (like for like: the same caps and the same number of KV blocks as
  Vidur) and with ``vllm_v1``.

The headline ratio is Vidur's loop time over tokenyard's whole ``simulate()`` time.

    bash benches/peers/vidur_setup.sh                                  # once, ~1 min
    .venv/bin/python benches/sim_vidur.py --lean --json benches/out/sim_vidur.json  # ~4.5 min
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import cpu_model, loadavg
from sim_scale import QPS, build_fingerprint, job, workload

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
VIDUR_VENV = Path(os.environ.get("VIDUR_VENV", REPO / ".venv-vidur"))
PEER = HERE / "peers" / "vidur_peer.py"
TRACE_DATE = "2026-11-22"  # the Date column Vidur's trace_replay filters on


def write_trace(path: Path, num_requests: int, qps: float) -> dict[str, Any]:
    from tokenyard.workload import load_workload

    path.parent.mkdir(parents=True, exist_ok=True)
    n = prompt = output = longest = 0
    last = 0.0
    with path.open("w") as f:
        f.write(
            "arrived_at,num_prefill_tokens,num_decode_tokens,"
            "Date,Time,PromptTokenCount,CompletionTokenCount\n"
        )
        for chunk in load_workload(workload(num_requests, qps)).chunks(65536):
            rows = zip(
                chunk.arrived_at.tolist(),
                chunk.num_prefill_tokens.tolist(),
                chunk.num_decode_tokens.tolist(),
                strict=True,
            )
            for t, p, d in rows:
                f.write(f"{t!r},{p},{d},{TRACE_DATE},{t!r},{p},{d}\n")
                n, prompt, output = n + 1, prompt + p, output + d
                longest, last = max(longest, p + d), t
    return {
        "path": str(path),
        "num_requests": n,
        "mean_prompt_tokens": prompt / n,
        "mean_output_tokens": output / n,
        "longest_request_tokens": longest,
        "last_arrival_s": last,
    }


def tokenyard_child(policy: str, trace: str, num_blocks: int) -> dict[str, Any]:
    import resource

    import tokenyard
    from tokenyard.simulation import config_from_mapping, simulate
    from tokenyard.workload import load_workload

    spec = {"kind": "trace", "format": "vidur", "path": trace}
    # Vidur's vLLM defaults; num_blocks as Vidur's memory planner gives them.
    config = config_from_mapping(
        job(policy, spec, batch_size_cap=128, max_tokens_in_batch=4096, num_blocks=num_blocks)
    )
    t0 = time.perf_counter()
    for _ in load_workload(config.workload).chunks(65536):
        pass
    read_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    result = simulate(config)
    total_s = time.perf_counter() - t1
    s = result.summary
    lat = s["latency_s"]

    def pick(stats: dict[str, float]) -> dict[str, float]:
        return {k: stats[k] for k in ("mean", "p50", "p90", "p99")}

    return {
        "tool": "tokenyard",
        "tokenyard": tokenyard.__version__,
        "build_profile": tokenyard.build_profile,
        "policy": policy,
        "num_blocks": num_blocks,
        "num_requests": s["num_requests"],
        "num_completed": int((result.columns["completed_at"] > 0).sum()),
        "num_events": s["num_events"],
        "read_s": read_s,
        "core_s": s["wall_s"],
        "total_s": total_s,
        "makespan_s": s["makespan_s"],
        "ttft_s": pick(lat["ttft"]),
        "e2e_s": pick(lat["e2e"]),
        "scheduling_delay_s": pick(lat["scheduling_delay"]),
        "num_restarts": s["preemption"]["num_restarts"],
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def pinned(cmd: list[str], cpu: str | None) -> list[str]:
    return ["taskset", "-c", cpu, *cmd] if cpu is not None else cmd


def run_json(cmd: list[str], out: Path | None = None) -> dict[str, Any]:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"failed: {' '.join(cmd)}")
    text = out.read_text() if out is not None else proc.stdout.strip().splitlines()[-1]
    result: dict[str, Any] = json.loads(text)
    return result


def run_vidur(
    trace: Path, scheduler: str, cpu: str | None, extra: list[str], cache_dir: Path
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "vidur.json"
        cmd = [
            str(VIDUR_VENV / "bin" / "python"),
            str(PEER),
            "--trace",
            str(trace),
            "--date",
            TRACE_DATE,
            "--scheduler",
            scheduler,
            "--cache-dir",
            str(cache_dir),
            "--json",
            str(out),
            *extra,
        ]
        return run_json(pinned(cmd, cpu), out)


def run_tokenyard(policy: str, trace: Path, num_blocks: int, cpu: str | None) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", policy, str(trace)]
    return run_json(pinned([*cmd, str(num_blocks)], cpu))


def log(message: str) -> None:
    print(f"[sim_vidur] {message}", file=sys.stderr, flush=True)


def med(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        print(json.dumps(tokenyard_child(sys.argv[2], sys.argv[3], int(sys.argv[4]))))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-requests", type=int, default=10_000)
    p.add_argument("--qps", type=float, default=QPS)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--scheduler", choices=("vllm", "sarathi"), default="vllm")
    p.add_argument("--lean", action="store_true", help="also time Vidur's fastest config")
    p.add_argument("--cpu", default="0", help="taskset core list; '' to not pin")
    p.add_argument(
        "--reuse-cache", action="store_true", help="keep Vidur's trained predictor (no cold run)"
    )
    p.add_argument("--trace", type=Path, default=HERE / "out" / "sim_vidur_trace.csv")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    cpu = args.cpu or None
    if cpu is not None and shutil.which("taskset") is None:
        cpu = None
    if not (VIDUR_VENV / "bin" / "python").exists():
        raise SystemExit(f"no Vidur venv at {VIDUR_VENV}: run bash benches/peers/vidur_setup.sh")
    build = build_fingerprint()
    trace = write_trace(args.trace, args.num_requests, args.qps)
    log(f"trace: {trace}")

    # Predictor set-up, cold: train the random forests on a short prefix of the trace (the
    # predictor does not depend on it) into an emptied cache, which the timed runs reuse.
    # This run also tells the number of KV blocks Vidur's memory planner gives a replica.
    cache_dir = VIDUR_VENV / "vidur_cache"
    if not args.reuse_cache:
        shutil.rmtree(cache_dir, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        prefix = Path(tmp) / "prefix.csv"
        with args.trace.open() as src, prefix.open("w") as dst:
            dst.writelines(line for _, line in zip(range(201), src, strict=False))
        cold = run_vidur(prefix, args.scheduler, cpu, [], cache_dir)
    num_blocks = int(cold["num_blocks"])
    log(f"Vidur first set-up {cold['setup_s']:.1f} s (predictor {cold['predictor_s']:.1f} s)")

    vidur_configs: dict[str, list[str]] = {"vidur": []}
    if args.lean:
        vidur_configs["vidur_lean"] = ["--native-predictor", "--no-metrics"]
    policies = (args.scheduler, "vllm_v1")
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in vidur_configs}
    runs |= {f"tokenyard_{policy}": [] for policy in policies}
    for i in range(args.repeat):
        for name, extra in vidur_configs.items():
            r = run_vidur(args.trace, args.scheduler, cpu, extra, cache_dir)
            runs[name].append(r)
            log(f"run {i + 1}: {name} loop {r['loop_s']:.2f} s (set-up {r['setup_s']:.2f} s)")
        for policy in policies:
            r = run_tokenyard(policy, args.trace, num_blocks, cpu)
            runs[f"tokenyard_{policy}"].append(r)
            log(f"run {i + 1}: tokenyard {policy} {r['total_s']:.3f} s")

    n = trace["num_requests"]
    summary: dict[str, Any] = {}
    for name, rs in runs.items():
        timed = "loop_s" if name.startswith("vidur") else "total_s"
        summary[name] = {
            "wall_s_median": med(rs, timed),
            "wall_s_all": [r[timed] for r in rs],
            "requests_per_wall_s": n / med(rs, timed),
            "setup_s_median": med(rs, "setup_s") if "setup_s" in rs[0] else None,
            "num_completed": rs[0]["num_completed"],
            "makespan_s": rs[0]["makespan_s"],
            "ttft_s": rs[0]["ttft_s"],
            "e2e_s": rs[0]["e2e_s"],
            "scheduling_delay_s": rs[0]["scheduling_delay_s"],
            "num_restarts": rs[0]["num_restarts"],
            "num_events": rs[0]["num_events"],
            # tokenyard's loop alone: its Rust wall time minus reading the CSV in Python.
            "loop_s_median": (
                med(rs, "loop_s")
                if "loop_s" in rs[0]
                else statistics.median(r["core_s"] - r["read_s"] for r in rs)
            ),
            "peak_rss_mib": max(r["peak_rss_mib"] for r in rs),
        }
    ratios = {
        f"{v}/{t}": summary[v]["wall_s_median"] / summary[t]["wall_s_median"]
        for v in summary
        if v.startswith("vidur")
        for t in summary
        if t.startswith("tokenyard")
    }

    build_changed = build_fingerprint() != build
    if build_changed:
        print("WARNING: tokenyard._core changed during the run; re-run", file=sys.stderr)
    loop_ratios = {
        f"{v}/{t}": summary[v]["loop_s_median"] / summary[t]["loop_s_median"]
        for v in summary
        if v.startswith("vidur")
        for t in summary
        if t.startswith("tokenyard")
    }
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "build": build,
        "build_changed_during_run": build_changed,
        "cpu": cpu_model(),
        "pinned_cpus": cpu,
        "loadavg_end": loadavg(),
        "python": platform.python_version(),
        "tokenyard": runs[f"tokenyard_{args.scheduler}"][0]["tokenyard"],
        "build_profile": runs[f"tokenyard_{args.scheduler}"][0]["build_profile"],
        "vidur": cold["vidur_version"],
        "vidur_python": cold["python"],
        "vidur_scheduler": args.scheduler,
        "num_blocks": num_blocks,
        "vidur_first_setup_s": cold["setup_s"],
        "vidur_first_predictor_s": cold["predictor_s"],
        "vidur_predictor_cache_reused": args.reuse_cache,
        "trace": trace,
    }
    print(
        f"\n{meta['cpu']}, pinned to CPU {cpu}; tokenyard {meta['tokenyard']} "
        f"({meta['build_profile']}, {build['git_head']}, _core {build['core_so_sha256']}), "
        f"Vidur {meta['vidur']}; {n:,} requests, 8 replicas, "
        f"{num_blocks} KV blocks each; load average at the end {meta['loadavg_end']}\n"
        f"Vidur predictor set-up, first run ({'cached' if args.reuse_cache else 'cold: training'}"
        f" the random forests): {cold['predictor_s']:.1f} s\n"
    )
    head = (
        f"{'side':<18} {'wall s':>7} {'req/wall s':>10} {'setup s':>7} {'done':>6} "
        f"{'makespan':>8} {'ttft p50/p99 s':>15} {'e2e p50/p99 s':>14} {'restarts':>8} "
        f"{'peak MiB':>8}"
    )
    print(head)
    print("-" * len(head))
    for name, s in summary.items():
        setup = f"{s['setup_s_median']:.2f}" if s["setup_s_median"] is not None else "-"
        print(
            f"{name:<18} {s['wall_s_median']:>7.3f} {s['requests_per_wall_s']:>10,.0f} "
            f"{setup:>7} {s['num_completed']:>6} {s['makespan_s']:>8.1f} "
            f"{s['ttft_s']['p50']:>7.3f}/{s['ttft_s']['p99']:<7.3f} "
            f"{s['e2e_s']['p50']:>6.2f}/{s['e2e_s']['p99']:<7.2f} {s['num_restarts']:>8} "
            f"{s['peak_rss_mib']:>8.0f}"
        )
    print("\nwall: Vidur = its event loop only; tokenyard = the whole simulate() call")
    for k, v in ratios.items():
        print(f"ratio {k}: {v:.0f}x (loop to loop: {loop_ratios[k]:.0f}x)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "meta": meta,
            "summary": summary,
            "ratios": ratios,
            "loop_ratios": loop_ratios,
            "runs": runs,
            "cold": cold,
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
