"""Vidur's own per-request timeline for given scenarios; run by benches/vidur_timeline.py.

Runs in the bench-only venv made by ``benches/peers/vidur_setup.sh`` (vidur 0.0.26 from
PyPI), never in the project's own::

    .venv-vidur/bin/python benches/peers/vidur_timeline_peer.py IN.json OUT.json [github]

``IN.json`` holds ``{"scenarios": [...]}``; each scenario names Vidur's replica scheduler
(``vllm``, ``sarathi``, ``orca``: the ones vidur 0.0.26 ships), its knobs, one replica's
pipeline stages, the KV blocks, a closed-form execution time and the requests
(``[arrived_at, num_prefill_tokens, num_decode_tokens]``).

Two things are replaced, and one bug of 0.0.26 is mended (``patch_restart_stage_counters``);
nothing else in the scheduling path changes:

- the execution-time predictor: every (batch, stage) takes
  ``(constant_s + per_prefill_token_s * prefill + per_decode_token_s * decode) / stages``
  seconds, the same expression tokenyard's ``linear`` model evaluates with its context and
  CPU terms at 0 (prefill/decode: Vidur's ``Batch.num_prefill_tokens`` /
  ``num_decode_tokens``). No profiling data is read and no model is trained;
- the request generator: it returns the scenario's requests.

The event loop is ``Simulator.run``'s, unchanged. ``OUT.json`` has, per scenario and request
(in input order), Vidur's ``scheduled_at``, ``prefill_completed_at`` (its first token),
``completed_at`` and ``num_restarts``, plus the replica's ``_max_batch_size`` (from Vidur's
memory planner) so the harness can give tokenyard the same.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import sys
import tempfile
from pathlib import Path
from typing import Any


class ClosedFormTime:
    """What Vidur's stage scheduler and BatchStage read of an ExecutionTime."""

    def __init__(self, seconds: float) -> None:
        self.total_time = seconds
        self.model_time = seconds

    def to_dict(self) -> dict[str, float]:
        return {"total_time": self.total_time, "model_time": self.model_time}


class ClosedFormPredictor:
    def __init__(self, exec_spec: dict[str, float], num_stages: int) -> None:
        self._c = float(exec_spec["constant_s"])
        self._a = float(exec_spec["per_prefill_token_s"])
        self._b = float(exec_spec["per_decode_token_s"])
        self._stages = num_stages

    def get_execution_time(self, batch: Any, stage_id: int) -> ClosedFormTime:
        prefill = batch.num_prefill_tokens
        decode = batch.num_decode_tokens
        # Term by term in tokenyard's order (LinearModel::stage_time), so both round alike.
        whole = self._c + self._a * prefill + self._b * decode + 0.0 * 0 + 0.0 * 0
        return ClosedFormTime(whole / self._stages + 0.0)


class ListGenerator:
    def __init__(self, requests: list[Any]) -> None:
        self._requests = requests

    def generate(self) -> list[Any]:
        return self._requests


def patch_restart_stage_counters() -> None:
    """vidur 0.0.26's ``Request.restart`` resets ``_num_processed_tokens`` but not its
    pipeline-stage twin ``_num_stage_processed_tokens`` (nor ``_is_prefill_stage_complete``),
    so the first re-run of a restarted request trips ``assert _num_stage_processed_tokens <=
    total_tokens`` in ``on_batch_stage_end``: no run with a preemption completes. This
    resets the two after Vidur's own restart, which is all that changes; without sequence
    pipeline parallelism (off here) they feed nothing else."""
    from vidur.entities import Request

    original = Request.restart

    def restart(self: Any) -> None:
        original(self)
        self._num_stage_processed_tokens = 0
        self._is_prefill_stage_complete = False

    Request.restart = restart


def patch_github_pipeline() -> None:
    """Optional (``--pipeline github``), to locate differences, not to compare as shipped:
    microsoft/vidur's (and seed 000's) pipeline admission instead of 0.0.26's. 0.0.26 forms
    at most one batch per replica-schedule event and only while stage 0 runs none of this
    replica's batches; microsoft/vidur forms batches while fewer than ``num_stages`` are
    in flight. 0.0.26's Sarathi also returns no batch from ``_get_next_batch`` while stage 0
    runs one, a check microsoft/vidur's Sarathi does not have: it is skipped too (the rest
    of that method, restart order included, runs unchanged)."""
    import vidur.events.replica_schedule_event as rse
    from vidur.events.batch_stage_arrival_event import BatchStageArrivalEvent
    from vidur.scheduler.replica_scheduler.base_replica_scheduler import (
        BaseReplicaScheduler,
    )

    def on_schedule(self: Any, time: float) -> Any:
        if not self._num_running_batches < self._num_stages:
            return None
        batch = self._get_next_batch(time)
        if not batch:
            return None
        self._num_running_batches += 1
        self._num_running_stages += 1
        return batch

    def handle_event(self: Any, scheduler: Any, metrics_store: Any) -> list[Any]:
        replica_scheduler = scheduler.get_replica_scheduler(self._replica_id)
        events = []
        while batch := replica_scheduler.on_schedule(self._time):
            batch.on_schedule(self.time)
            events.append(BatchStageArrivalEvent(self.time, self._replica_id, 0, batch))
        return events

    BaseReplicaScheduler.on_schedule = on_schedule
    rse.ReplicaScheduleEvent.handle_event = handle_event

    from vidur.scheduler.replica_scheduler.sarathi_replica_scheduler import (
        SarathiReplicaScheduler,
    )

    sarathi_next_batch = SarathiReplicaScheduler._get_next_batch

    def next_batch_whatever_stage_0_runs(self: Any, time: float) -> Any:
        running_stages, self._num_running_stages = self._num_running_stages, 0
        try:
            return sarathi_next_batch(self, time)
        finally:
            self._num_running_stages = running_stages

    SarathiReplicaScheduler._get_next_batch = next_batch_whatever_stage_0_runs


def reset_entity_ids() -> None:
    """Vidur numbers replicas, requests and batches with class counters, and routes by
    replica id from 0: each scenario starts them afresh, as a new process would."""
    from vidur.entities.base_entity import BaseEntity

    todo = [BaseEntity]
    while todo:
        cls = todo.pop()
        if "_id" in cls.__dict__:
            cls._id = -1
        todo.extend(cls.__subclasses__())


def run_scenario(s: dict[str, Any]) -> dict[str, Any]:
    import vidur.scheduler.global_scheduler.base_global_scheduler as gs
    import vidur.simulator as simulator_module
    from vidur.config import (
        CacheConfig,
        ClusterConfig,
        MetricsConfig,
        OrcaSchedulerConfig,
        ReplicaConfig,
        RoundRobinGlobalSchedulerConfig,
        SarathiSchedulerConfig,
        SimulationConfig,
        SyntheticRequestGeneratorConfig,
        VllmSchedulerConfig,
    )
    from vidur.config.config import FixedRequestLengthGeneratorConfig
    from vidur.entities import Request

    stages = int(s["num_stages"])
    if s["scheduler"] == "vllm":
        sched = VllmSchedulerConfig(
            batch_size_cap=s["batch_size_cap"], max_tokens_in_batch=s["max_tokens_in_batch"]
        )
    elif s["scheduler"] == "sarathi":
        sched = SarathiSchedulerConfig(
            batch_size_cap=s["batch_size_cap"], chunk_size=s["chunk_size"]
        )
    elif s["scheduler"] == "orca":
        sched = OrcaSchedulerConfig(batch_size_cap=s["batch_size_cap"])
    else:
        raise SystemExit(f"vidur {md.version('vidur')} has no {s['scheduler']} scheduler")

    requests = [Request(float(a), int(p), int(d)) for a, p, d in s["requests"]]
    predictor = ClosedFormPredictor(s["exec"], stages)
    gs.ExecutionTimePredictorRegistry = type(
        "Fixed", (), {"get": staticmethod(lambda *a, **k: predictor)}
    )
    simulator_module.RequestGeneratorRegistry = type(
        "Fixed", (), {"get": staticmethod(lambda *a, **k: ListGenerator(requests))}
    )

    with tempfile.TemporaryDirectory(prefix="vidur-timeline-") as out:
        config = SimulationConfig(
            seed=0,
            log_level="warning",
            cluster_config=ClusterConfig(
                num_replicas=1,
                replica_config=ReplicaConfig(
                    model_name="meta-llama/Llama-2-7b-hf",
                    device="a100",
                    network_device="a100_pairwise_nvlink",
                    tensor_parallel_size=1,
                    num_pipeline_stages=stages,
                ),
                cache_config=CacheConfig(
                    block_size=s["block_size"],
                    num_blocks=s["num_blocks"],
                    watermark_blocks_fraction=s["watermark_blocks_fraction"],
                ),
                global_scheduler_config=RoundRobinGlobalSchedulerConfig(),
                replica_scheduler_config=sched,
            ),
            request_generator_config=SyntheticRequestGeneratorConfig(
                length_generator_config=FixedRequestLengthGeneratorConfig(
                    max_tokens=s["max_tokens"]
                ),
            ),
            metrics_config=MetricsConfig(
                write_metrics=False,
                enable_chrome_trace=False,
                write_json_trace=False,
                store_plots=False,
                output_dir=out,
            ),
        )
        sim = simulator_module.Simulator(config)
        (replica_scheduler,) = sim._scheduler._replica_schedulers.values()
        max_batch_size = int(replica_scheduler._max_batch_size)
        error = None
        try:
            sim.run()
        except (AssertionError, RuntimeError, KeyError) as e:  # Vidur's own failures
            error = f"{type(e).__name__}: {e}"

    def mark(r: Any, name: str) -> float | None:
        value = getattr(r, name)
        return float(value) if value else None

    return {
        "name": s["name"],
        "vidur_max_batch_size": max_batch_size,
        "error": error,
        "requests": [
            {
                "scheduled_at": float(r._scheduled_at) if r.completed else None,
                "first_token_at": mark(r, "_prefill_completed_at"),
                "completed_at": mark(r, "_completed_at") if r.completed else None,
                "num_restarts": int(r._num_restarts),
            }
            for r in requests
        ],
    }


def main() -> None:
    src, dst = Path(sys.argv[1]), Path(sys.argv[2])
    scenarios = json.loads(src.read_text())["scenarios"]
    patch_restart_stage_counters()
    if sys.argv[3:] == ["github"]:
        patch_github_pipeline()
    results = []
    for s in scenarios:
        reset_entity_ids()
        results.append(run_scenario(s))
    dst.write_text(
        json.dumps({"vidur_version": md.version("vidur"), "scenarios": results}, indent=1) + "\n"
    )


if __name__ == "__main__":
    main()
