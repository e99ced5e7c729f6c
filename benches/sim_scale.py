"""Replay speed and memory of ``tokenyard.simulation.simulate`` at 10k, 100k and 1M requests.

One job, grown only in length: 8 Llama-2-7B replicas on A100-80GB, round-robin routing,
the linear execution model, Poisson arrivals at a fixed rate, zipf prompt and output
lengths (``JOB`` below). The rate is "loaded but stable": replicas run batches nearly all
the time and hold a fifth of their KV cache, yet nothing queues, so the p99 scheduling
delay stays in tens of milliseconds and the makespan is the last arrival plus the
longest request's lifetime, at every length. (The Vidur-family ``vllm`` policy is the
tighter of the two: it saturates at ~30-35 requests/s here.)

Every (policy, length) runs in a fresh interpreter pinned to one core (``taskset -c 0``),
so its peak RSS (``ru_maxrss``) is its own. Each child reports:

- ``gen_s``: generating the workload alone (iterating ``workload.chunks()``, which
  ``simulate`` also does, lazily, inside the Rust loop);
- ``core_s``: ``simulate``'s own ``wall_s`` (the Rust event loop, pulling the chunks);
- ``loop_s = core_s - gen_s``: the event loop itself;
- ``post_s``: the rest of ``simulate()`` (planning, the per-request table sorted by id
  with derived latencies, the summary);
- peak RSS, the RSS before the run, and the bytes of the per-request table and the
  sampled replica state (the output, which grows with the trace by design).

    .venv/bin/python benches/sim_scale.py --json benches/out/sim_scale.json   # ~5 min
    .venv/bin/python benches/sim_scale.py --sizes 10000 --repeat 1            # ~5 s

``--cli-peak`` instead measures whole ``tokenyard simulate`` commands writing their results
(issue 32's memory cases, ``CLI_CASES``): each command's peak RSS (``wait4``'s
``ru_maxrss``), wall time and the SHA-256 of its ``requests.csv``, so two builds' outputs
can be compared byte for byte. Run it twice on a fresh machine: the first run of a build
also builds the measured predictor (~80 MB more).

    .venv/bin/python benches/sim_scale.py --cli-peak all                      # ~2 min
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import cpu_model, loadavg

HERE = Path(__file__).resolve().parent
QPS = 25.0
NUM_REPLICAS = 8
# Prompt + output <= 4,096 tokens: Llama-2-7B's context, which Vidur enforces
# (benches/sim_vidur.py replays this same job through Vidur).
PROMPT_TOKENS = {"kind": "zipf", "low": 64, "high": 3072, "theta": 0.6}
OUTPUT_TOKENS = {"kind": "zipf", "low": 16, "high": 1024, "theta": 0.6}
MAX_REQUEST_TOKENS = 4096
DERIVED_COLUMNS = ("ttft", "tpot", "e2e", "scheduling_delay")
#: ``tokenyard simulate`` flags of the ``--cli-peak`` cases (the built-in job otherwise).
CLI_CASES = {
    "1000x200": ["--replicas", "1000", "--requests", "200"],
    "1000x20k": ["--replicas", "1000", "--requests", "20000"],
    "default-2M": ["--requests", "2000000"],
}


def workload(num_requests: int, qps: float = QPS) -> dict[str, Any]:
    return {
        "kind": "synthetic",
        "num_requests": num_requests,
        "seed": 0,
        "arrival": {"kind": "poisson", "qps": qps},
        "prompt_tokens": PROMPT_TOKENS,
        "output_tokens": OUTPUT_TOKENS,
    }


def job(policy: str, workload_mapping: dict[str, Any], **scheduler: Any) -> dict[str, Any]:
    """The simulation config (a mapping for ``config_from_mapping``)."""
    return {
        "seed": 0,
        "cluster": {"num_replicas": NUM_REPLICAS, "global_scheduler": {"policy": "round_robin"}},
        "replica": {
            "model": "llama-2-7b",
            "device": "a100-80gb",
            "tensor_parallel_size": 1,
            "num_pipeline_stages": 1,
            "scheduler": {
                "policy": policy,
                "block_size": 16,
                "max_num_batched_tokens": 2048,
                "max_num_seqs": 256,
                "max_request_tokens": MAX_REQUEST_TOKENS,
                **scheduler,
            },
        },
        "execution": {"model": "linear"},
        "workload": workload_mapping,
        "metrics": {"sample_interval_s": 1.0},
    }


def build_fingerprint() -> dict[str, Any]:
    """Which build is measured: other work may rebuild the extension in place mid-run, so
    the parent takes this before and after and flags a change."""
    spec = importlib.util.find_spec("tokenyard._core")
    so = Path(spec.origin) if spec is not None and spec.origin else None
    head = subprocess.run(
        ["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    return {
        "git_head": head or None,
        "core_so": str(so) if so else None,
        "core_so_sha256": hashlib.sha256(so.read_bytes()).hexdigest()[:16] if so else None,
    }


def rss_mib() -> float:
    """Current resident set (not the peak), from /proc."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child(policy: str, num_requests: int, qps: float) -> dict[str, Any]:
    """One measurement, in this (fresh) process."""
    import numpy as np

    import tokenyard
    from tokenyard.simulation import config_from_mapping, simulate
    from tokenyard.workload import load_workload

    config = config_from_mapping(job(policy, workload(num_requests, qps)))

    t0 = time.perf_counter()
    n = 0
    last_arrival = 0.0
    for chunk in load_workload(config.workload).chunks(65536):
        n += len(chunk)
        last_arrival = float(chunk.arrived_at[-1])
    gen_s = time.perf_counter() - t0

    # RSS as the loop goes: the core reports progress every 4,096 completions and once at
    # the end of the loop, before the per-request table is handed to Python.
    marks: list[tuple[int, float]] = []

    def progress(num_completed: int) -> None:
        marks.append((num_completed, rss_mib()))

    rss_before = rss_mib()
    t1 = time.perf_counter()
    result = simulate(config, progress=progress)
    total_s = time.perf_counter() - t1
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    s = result.summary
    lat = s["latency_s"]
    table_bytes = sum(v.nbytes for v in result.columns.values())
    # The core's own columns (the rest are derived in Python after the loop).
    core_table_bytes = sum(v.nbytes for k, v in result.columns.items() if k not in DERIVED_COLUMNS)
    loop_end_rss = marks[-1][1] if marks else float("nan")
    sample_bytes = sum(v.nbytes for v in result.samples.values())
    core_s = s["wall_s"]
    return {
        "tokenyard": tokenyard.__version__,
        "build_profile": tokenyard.build_profile,
        "policy": policy,
        "num_requests": s["num_requests"],
        "generated": n,
        "qps": qps,
        "gen_s": gen_s,
        "core_s": core_s,
        "loop_s": core_s - gen_s,
        "post_s": total_s - core_s,
        "total_s": total_s,
        "requests_per_wall_s": s["num_requests"] / total_s,
        "num_events": s["num_events"],
        "num_batches": s["num_batches"],
        "events_per_s": s["num_events"] / core_s,
        "rss_before_mib": rss_before,
        "peak_rss_mib": peak,
        "rss_loop_end_mib": loop_end_rss,
        "loop_growth_bytes_per_request": (loop_end_rss - rss_before) * 2**20 / n,
        "peak_growth_bytes_per_request": (peak - rss_before) * 2**20 / n,
        "core_table_bytes_per_request": core_table_bytes / n,
        "table_bytes_per_request": table_bytes / n,
        "table_mib": table_bytes / 2**20,
        "samples_mib": sample_bytes / 2**20,
        "makespan_s": s["makespan_s"],
        "last_arrival_s": last_arrival,
        "drain_s": s["makespan_s"] - last_arrival,
        "scheduling_delay_p99_s": lat["scheduling_delay"]["p99"],
        "scheduling_delay_max_s": lat["scheduling_delay"]["max"],
        "ttft_p50_s": lat["ttft"]["p50"],
        "ttft_p99_s": lat["ttft"]["p99"],
        "e2e_p50_s": lat["e2e"]["p50"],
        "busy_fraction": s["replicas"]["mean_busy_fraction"],
        "kv_usage_mean": s["replicas"]["kv_usage"]["mean"],
        "batch_size_mean": s["replicas"]["batch_size"]["mean"],
        "num_restarts": s["preemption"]["num_restarts"],
        "decode_tokens": int(np.sum(result.columns["num_decode_tokens"], dtype=np.int64)),
    }


def cli_peak(flags: list[str]) -> dict[str, Any]:
    """One ``tokenyard simulate`` command writing its results: its peak RSS, wall time and
    the SHA-256 of the ``requests.csv`` it wrote."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        cmd = [sys.executable, "-m", "tokenyard", "simulate", "--no-progress", "-o", str(out)]
        t0 = time.perf_counter()
        proc = subprocess.Popen([*cmd, *flags], stdout=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        wall_s = time.perf_counter() - t0
        if code := os.waitstatus_to_exitcode(status):
            raise RuntimeError(f"{' '.join(flags)}: exit status {code}")
        csv = hashlib.sha256((out / "requests.csv").read_bytes()).hexdigest()
    return {"peak_rss_mb": usage.ru_maxrss / 1000, "wall_s": wall_s, "requests_csv": csv}


def main_cli_peak(names: str) -> int:
    build = build_fingerprint()
    print(f"{cpu_model()}, Python {platform.python_version()}, {build}")
    print(f"{'case':<11} {'flags':<34} {'peak MB':>8} {'wall s':>7}  requests.csv sha256")
    for name in CLI_CASES if names == "all" else names.split(","):
        r = cli_peak(CLI_CASES[name])
        flags = " ".join(CLI_CASES[name])
        print(
            f"{name:<11} {flags:<34} {r['peak_rss_mb']:>8,.0f} {r['wall_s']:>7.1f}  "
            f"{r['requests_csv'][:16]}",
            flush=True,
        )
    return 0


def run_child(policy: str, n: int, qps: float, cpu: str | None) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", policy, str(n), str(qps)]
    if cpu is not None:
        cmd = ["taskset", "-c", cpu, *cmd]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median total time, plus the spread of the repeats."""
    ordered = sorted(runs, key=lambda r: r["total_s"])
    mid = dict(ordered[len(ordered) // 2])
    mid["repeats"] = len(runs)
    mid["total_s_all"] = [r["total_s"] for r in runs]
    mid["total_s_median"] = statistics.median(mid["total_s_all"])
    return mid


def print_table(rows: list[dict[str, Any]]) -> None:
    head = (
        f"{'policy':<8} {'requests':>9} {'gen s':>6} {'loop s':>7} {'post s':>6} "
        f"{'total s':>7} {'req/wall s':>10} {'Mev/s':>5} {'peak MiB':>8} {'table MiB':>9} "
        f"{'sd p99 ms':>9} {'drain s':>7} {'busy':>5} {'batch':>5} {'kv':>4}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['policy']:<8} {r['num_requests']:>9,} {r['gen_s']:>6.2f} {r['loop_s']:>7.2f} "
            f"{r['post_s']:>6.2f} {r['total_s']:>7.2f} {r['requests_per_wall_s']:>10,.0f} "
            f"{r['events_per_s'] / 1e6:>5.2f} {r['peak_rss_mib']:>8.0f} "
            f"{r['table_mib'] + r['samples_mib']:>9.0f} "
            f"{r['scheduling_delay_p99_s'] * 1e3:>9.1f} {r['drain_s']:>7.1f} "
            f"{r['busy_fraction']:>5.3f} {r['batch_size_mean']:>5.1f} {r['kv_usage_mean']:>4.2f}"
        )


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="10000,100000,1000000")
    p.add_argument("--policies", default="vllm_v1,vllm")
    p.add_argument("--qps", type=float, default=QPS)
    p.add_argument("--repeat", type=int, default=3, help="runs per size below 1M (median)")
    p.add_argument("--repeat-large", type=int, default=1, help="runs per size of 1M or more")
    p.add_argument("--cpu", default="0", help="taskset core list; '' to not pin")
    p.add_argument("--json", type=Path, help="write every run here")
    p.add_argument(
        "--cli-peak",
        metavar="CASES",
        help=f"peak RSS of whole commands instead: 'all' or some of {', '.join(CLI_CASES)}",
    )
    args = p.parse_args()
    if args.cli_peak:
        return main_cli_peak(args.cli_peak)
    cpu = args.cpu or None
    if cpu is not None and shutil.which("taskset") is None:
        print("taskset not found: running unpinned", file=sys.stderr)
        cpu = None

    build = build_fingerprint()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    for policy in args.policies.split(","):
        for n in sizes:
            repeats = args.repeat if n < 1_000_000 else args.repeat_large
            runs = [run_child(policy, n, args.qps, cpu) for _ in range(repeats)]
            rows.append(median_run(runs))
            r = rows[-1]
            print(
                f"[sim_scale] {policy} {n:,}: {r['total_s']:.2f} s "
                f"(runs {', '.join(f'{t:.2f}' for t in r['total_s_all'])})",
                file=sys.stderr,
                flush=True,
            )

    build_changed = build_fingerprint() != build
    if build_changed:
        print("WARNING: tokenyard._core changed during the run; re-run", file=sys.stderr)
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "build": build,
        "build_changed_during_run": build_changed,
        "cpu": cpu_model(),
        "pinned_cpus": cpu,
        "loadavg_end": loadavg(),
        "python": platform.python_version(),
        "tokenyard": rows[0]["tokenyard"] if rows else None,
        "build_profile": rows[0]["build_profile"] if rows else None,
        "job": job("<policy>", workload(0, args.qps)),
    }
    print(
        f"\n{meta['cpu']}, pinned to CPU {cpu}, Python {meta['python']}, tokenyard "
        f"{meta['tokenyard']} ({meta['build_profile']}, {build['git_head']}, _core "
        f"{build['core_so_sha256']}); {NUM_REPLICAS} replicas, "
        f"Poisson {args.qps:g} req/s; load average at the end {meta['loadavg_end']}\n"
    )
    print_table(rows)
    print(
        "\nloop = simulate's Rust wall time minus generating the workload alone; post = "
        "the rest of simulate() (table and summary); table = per-request table + samples; "
        "sd = scheduling delay; drain = makespan - last arrival; batch, kv = means over "
        "the 1 s samples"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
