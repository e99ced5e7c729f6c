"""Seconds per stream of vLLM 0.33's ``Scheduler`` and of tokenyard's ``TokenyardScheduler``
with the CPU ``OffloadingConnector`` beside a full-attention and a sliding-window group: the
seeded streams of ``tests/test_integrations_vllm_offloading_groups.py`` (three waves, a small
GPU pool), each scheduler timed alone on the same stream (``schedule`` and
``update_from_output``, the synthesized worker reports included), medians over the seeds.

    PYTHONPATH=python /work/main/.venv-bench/bin/python \
        benches/peers/vllm_offloading_groups_bench.py --seeds 6
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[2] / "tests")]

from test_integrations_vllm_offloading_groups import (  # noqa: E402
    _kv_cache_config,
    _peer,
    _waves,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (  # noqa: E402
    OffloadingWorkerMetadata,
)
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput  # noqa: E402
from vllm_compare import runner_output  # noqa: E402

from tokenyard.integrations.vllm import TokenyardScheduler  # noqa: E402


def _stream_s(cls: type, seed: int, num_blocks: int) -> tuple[float, int]:
    """Seconds to drain one seeded stream on ``cls``, and its steps."""
    peer = _peer(num_blocks, 800)
    scheduler: Any = peer.build(cls, _kv_cache_config(num_blocks))
    arrivals = _waves(seed)
    requests = {a[1]: peer.make_request(*a[1:]) for a in arrivals}
    elapsed = 0.0
    for step in range(2000):
        started = time.perf_counter()
        for at, request_id, *_ in arrivals:
            if at == step:
                scheduler.add_request(requests[request_id])
        out = scheduler.schedule()
        meta = out.kv_connector_metadata
        done = OffloadingWorkerMetadata()
        for job_id in (*meta.load_jobs, *meta.store_jobs):
            done.mark_completed(job_id)
        landed = {job.req_id for job in meta.load_jobs.values() if not job.sync}
        output = runner_output(scheduler, out)
        output.kv_connector_output = KVConnectorOutput(
            finished_recving=landed, kv_connector_worker_meta=done
        )
        scheduler.update_from_output(out, output)
        elapsed += time.perf_counter() - started
        if step > 150 and not scheduler.has_unfinished_requests():
            return elapsed, step + 1
    raise AssertionError("the stream did not drain")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--num-blocks", type=int, default=60)
    args = parser.parse_args()
    ratios, theirs, ours = [], [], []
    for seed in range(args.seeds):
        vllm_s, steps = _stream_s(Scheduler, seed, args.num_blocks)
        ty_s, ty_steps = _stream_s(TokenyardScheduler, seed, args.num_blocks)
        assert steps == ty_steps, (seed, steps, ty_steps)
        theirs.append(vllm_s)
        ours.append(ty_s)
        ratios.append(vllm_s / ty_s)
        print(f"seed {seed}: {steps} steps, vLLM {vllm_s:.3f} s, tokenyard {ty_s:.3f} s")
    print(
        f"median: vLLM {statistics.median(theirs):.3f} s, tokenyard "
        f"{statistics.median(ours):.3f} s, vLLM/tokenyard {statistics.median(ratios):.2f}x"
    )


if __name__ == "__main__":
    main()
