"""One Vidur simulation of a trace, timed by phase; run by benches/sim_vidur.py.

Runs in the bench-only venv made by ``benches/peers/vidur_setup.sh`` (vidur 0.0.26 from
PyPI), never in the project's own::

    .venv-vidur/bin/python benches/peers/vidur_peer.py --trace T.csv --json out.json

Phases, each timed on its own (``time.perf_counter``):

- ``setup_s``: ``Simulator(config)``: reads the trace, builds the cluster and the
  execution-time predictor (``predictor_s`` of it: training the random forests on the
  first run, loading their cached predictions afterwards);
- ``loop_s``: the event loop, ``while event_queue: pop, handle, push`` as in
  ``Simulator.run``; this is the figure compared with tokenyard;
- ``output_s``: ``Simulator._write_output`` (metrics CSVs), reported, not compared.

Offline: Vidur fetches its profiling data with ``huggingface_hub.snapshot_download``; the
two profiling "datasets" named below resolve to the synthesised folders written by the
setup script, and every other repository (Vidur first tries to download ready-made
predictions) raises, so Vidur trains its predictor locally, as it does when the hub has
none.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

COMPUTE_DATASET = "local/synthetic-llama-2-7b-hf-a100"
NETWORK_DATASET = "local/synthetic-a100-pairwise-nvlink"


def patch_hub(data_dir: Path) -> None:
    import vidur.execution_time_predictor.sklearn_execution_time_predictor as sk

    folders = {COMPUTE_DATASET: data_dir / "compute", NETWORK_DATASET: data_dir / "network"}

    def snapshot_download(repo_id: str, **_: object) -> str:
        if repo_id in folders:
            return str(folders[repo_id])
        raise OSError(f"offline benchmark: no hub, and no local copy of {repo_id}")

    sk.snapshot_download = snapshot_download


def build_config(args: argparse.Namespace, output_dir: str):  # -> vidur SimulationConfig
    from vidur.config import (
        CacheConfig,
        ClusterConfig,
        MetricsConfig,
        RandomForrestExecutionTimePredictorConfig,
        ReplicaConfig,
        RoundRobinGlobalSchedulerConfig,
        SarathiSchedulerConfig,
        SimulationConfig,
        TraceRequestGeneratorConfig,
        VllmSchedulerConfig,
    )

    if args.scheduler == "vllm":
        scheduler = VllmSchedulerConfig(
            batch_size_cap=args.batch_size_cap, max_tokens_in_batch=args.max_tokens_in_batch
        )
    else:
        scheduler = SarathiSchedulerConfig(
            batch_size_cap=args.batch_size_cap, chunk_size=args.chunk_size
        )
    cluster = ClusterConfig(
        num_replicas=args.num_replicas,
        replica_config=ReplicaConfig(
            model_name="meta-llama/Llama-2-7b-hf",
            device="a100",
            network_device="a100_pairwise_nvlink",
            tensor_parallel_size=1,
            num_pipeline_stages=1,
        ),
        cache_config=CacheConfig(block_size=16, num_blocks=args.num_blocks or None),
        global_scheduler_config=RoundRobinGlobalSchedulerConfig(),
        replica_scheduler_config=scheduler,
    )
    # Vidur 0.0.26's trace_replay reads Date/Time/PromptTokenCount/CompletionTokenCount
    # and by default scales prompts by 0.3 and time by 0.04: every factor is 1 here.
    requests = TraceRequestGeneratorConfig(
        trace_file=args.trace,
        date=args.date,
        prefill_scale_factor=1.0,
        decode_scale_factor=1.0,
        time_scale_factor=1.0,
        max_tokens=args.max_tokens,
    )
    # The NOTES.md small grid: one random-forest combination and a prediction range
    # of 16k tokens (the default grid search takes over 15 minutes on 2 cores).
    predictor = RandomForrestExecutionTimePredictorConfig(
        model_profiling_dataset=COMPUTE_DATASET,
        network_profiling_dataset=NETWORK_DATASET,
        num_estimators=[args.rf_estimators],
        max_depth=[8],
        min_samples_split=[2],
        prediction_max_tokens_per_request=16384,
        prediction_max_prefill_chunk_size=4096,
        prediction_max_batch_size=args.batch_size_cap,
        num_training_job_threads=1,
        cache_dir=args.cache_dir,
        use_native_execution_time_predictor=args.native_predictor,
    )
    # tokenyard records no stage trace and draws no plots unless asked: neither does this.
    metrics = MetricsConfig(
        write_metrics=not args.no_metrics,
        enable_chrome_trace=False,
        write_json_trace=False,
        store_plots=False,
        output_dir=output_dir,
    )
    return SimulationConfig(
        seed=args.seed,
        log_level="warning",
        cluster_config=cluster,
        request_generator_config=requests,
        execution_time_predictor_config=predictor,
        metrics_config=metrics,
    )


def percentiles(values: list[float]) -> dict[str, float]:
    import numpy as np

    if not values:
        return {}
    a = np.asarray(values, dtype=np.float64)
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"mean": float(a.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def run(args: argparse.Namespace) -> dict:
    patch_hub(Path(args.data))
    import heapq

    from vidur.execution_time_predictor import sklearn_execution_time_predictor as sk
    from vidur.simulator import Simulator
    from vidur.utils.random import set_seeds

    predictor_s = 0.0
    original_init = sk.SklearnExecutionTimePredictor.__init__

    def timed_init(self, *a, **k):  # type: ignore[no-untyped-def]
        nonlocal predictor_s
        t = time.perf_counter()
        original_init(self, *a, **k)
        predictor_s += time.perf_counter() - t

    sk.SklearnExecutionTimePredictor.__init__ = timed_init

    with tempfile.TemporaryDirectory(prefix="vidur-out-") as output_dir:
        config = build_config(args, output_dir)
        set_seeds(config.seed)

        t0 = time.perf_counter()
        sim = Simulator(config)
        setup_s = time.perf_counter() - t0
        requests = [event._request for _, event in sim._event_queue]

        # Simulator.run()'s loop, verbatim in behaviour, so that the output phase can be
        # timed apart from it (run() calls _write_output itself).
        t1 = time.perf_counter()
        queue = sim._event_queue
        scheduler, store = sim._scheduler, sim._metric_store
        num_events = 0
        while queue and not sim._terminate:
            _, event = heapq.heappop(queue)
            sim._set_time(event._time)
            for new_event in event.handle_event(scheduler, store):
                heapq.heappush(queue, (new_event._priority_number, new_event))
            num_events += 1
        loop_s = time.perf_counter() - t1
        if not scheduler.is_empty():
            raise RuntimeError("Vidur ended with pending requests")

        t2 = time.perf_counter()
        if not args.no_output:
            sim._write_output()
        output_s = time.perf_counter() - t2

    done = [r for r in requests if r.completed]
    num_blocks = int(config.cluster_config.cache_config.num_blocks)
    return {
        "tool": "vidur",
        "vidur_version": md.version("vidur"),
        "python": platform.python_version(),
        "scheduler": args.scheduler,
        "num_replicas": args.num_replicas,
        "num_blocks": num_blocks,
        "native_predictor": args.native_predictor,
        "write_metrics": not args.no_metrics,
        "num_requests": len(requests),
        "num_completed": len(done),
        "num_events": num_events,
        "setup_s": setup_s,
        "predictor_s": predictor_s,
        "loop_s": loop_s,
        "output_s": output_s,
        "requests_per_loop_s": len(requests) / loop_s,
        "makespan_s": float(sim._time),
        "last_arrival_s": max(r.arrived_at for r in requests),
        "ttft_s": percentiles([r.prefill_completed_at - r.arrived_at for r in done]),
        "e2e_s": percentiles([r.completed_at - r.arrived_at for r in done]),
        "scheduling_delay_s": percentiles([r.scheduling_delay for r in done]),
        "num_restarts": int(sum(r.num_restarts for r in done)),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    repo = Path(__file__).resolve().parents[2]
    venv = Path(os.environ.get("VIDUR_VENV", repo / ".venv-vidur"))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", required=True, help="CSV with Date,Time,PromptTokenCount,...")
    p.add_argument("--date", default="2026-11-22", help="the trace's Date column value")
    p.add_argument("--scheduler", choices=("vllm", "sarathi"), default="vllm")
    p.add_argument("--num-replicas", type=int, default=8)
    p.add_argument("--num-blocks", type=int, default=0, help="KV blocks per replica; 0: Vidur's")
    p.add_argument("--batch-size-cap", type=int, default=128)
    p.add_argument("--max-tokens-in-batch", type=int, default=4096)
    p.add_argument("--chunk-size", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=4096, help="longest request (prompt+output)")
    p.add_argument("--rf-estimators", type=int, default=250)
    p.add_argument("--native-predictor", action="store_true", help="Vidur's C++ predictor")
    p.add_argument("--no-metrics", action="store_true", help="MetricsConfig.write_metrics off")
    p.add_argument("--no-output", action="store_true", help="skip _write_output")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default=str(venv / "vidur_profiling"))
    p.add_argument("--cache-dir", default=str(venv / "vidur_cache"))
    p.add_argument("--json", help="write the result here (else stdout)")
    args = p.parse_args()
    result = run(args)
    text = json.dumps(result, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n")
    else:
        sys.stdout.write(text + "\n")


if __name__ == "__main__":
    main()
