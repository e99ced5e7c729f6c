"""What offering vLLM 0.33's Mamba ``align`` boundary-state hand-offs costs the adapter
(``tokenyard.integrations._vllm_boundary_offloads``): the seeded three-wave stream of
tests/test_integrations_vllm_offloading_groups.py (full attention + Mamba ``align``, vLLM's
``OffloadingConnector``, every job completing with the step's output) run on
``TokenyardScheduler`` with the hand-offs and without them (the adapter before: none
offered), and on vLLM's ``Scheduler`` for scale. The time of ``schedule()`` +
``update_from_output`` over the stream; medians of ``--runs`` runs, the three interleaved.
Needs the bench venv.

    PYTHONPATH=python .venv-bench/bin/python benches/vllm_boundary_offloads_cost.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benches" / "peers")]

from test_integrations_vllm_offloading_groups import _kv_cache_config, _peer, _waves  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (  # noqa: E402
    OffloadingWorkerMetadata,
)
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput  # noqa: E402
from vllm_compare import runner_output  # noqa: E402

from tokenyard.integrations import _vllm_boundary_offloads  # noqa: E402
from tokenyard.integrations.vllm import TokenyardScheduler  # noqa: E402


def run(cls: type, seed: int, num_blocks: int) -> tuple[float, int]:
    """Seconds in the scheduler over the stream, and the store jobs it made."""
    peer = _peer(num_blocks, 800)
    peer.vllm_config.cache_config.mamba_cache_mode = "align"
    scheduler = peer.build(cls, _kv_cache_config(num_blocks, mamba=True))
    arrivals = _waves(seed)
    spent, stores = 0.0, 0
    for step in range(700):
        for at, *args in arrivals:
            if at == step:
                scheduler.add_request(peer.make_request(*args))
        start = time.perf_counter()
        out = scheduler.schedule()
        spent += time.perf_counter() - start
        meta = out.kv_connector_metadata
        stores += len(meta.store_jobs)
        done = OffloadingWorkerMetadata()
        for job_id in (*meta.load_jobs, *meta.store_jobs):
            done.mark_completed(job_id)
        landed = {job.req_id for job in meta.load_jobs.values() if not job.sync}
        output = runner_output(scheduler, out)
        output.kv_connector_output = KVConnectorOutput(
            finished_recving=landed, kv_connector_worker_meta=done
        )
        start = time.perf_counter()
        scheduler.update_from_output(out, output)
        spent += time.perf_counter() - start
        if step > 150 and not scheduler.has_unfinished_requests():
            return spent, stores
    raise AssertionError("the stream did not drain")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--blocks", type=int, default=240)
    args = parser.parse_args()
    take = _vllm_boundary_offloads.BoundaryStateOffers.take
    in_take = [0.0]

    def timed(*a: Any) -> Any:
        start = time.perf_counter()
        offloads = take(*a)
        in_take[0] += time.perf_counter() - start
        return offloads

    taken: list[float] = []
    times: dict[str, list[float]] = {"vllm": [], "offered": [], "none": []}
    stores: dict[str, int] = {}
    for _ in range(args.runs):
        for name in times:
            cls = Scheduler if name == "vllm" else TokenyardScheduler
            patched: Any = (lambda *a: {}) if name == "none" else timed
            _vllm_boundary_offloads.BoundaryStateOffers.take = patched
            in_take[0] = 0.0
            spent, stores[name] = run(cls, 0, args.blocks)
            times[name].append(spent)
            if name == "offered":
                taken.append(in_take[0])
    _vllm_boundary_offloads.BoundaryStateOffers.take = take
    med = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    for name in times:
        print(f"{name:8s} median {med[name]:8.1f} ms  store jobs {stores[name]}")
    print(f"offered/none = {med['offered'] / med['none']:.3f}x (the connector's extra jobs too)")
    in_take_ms = statistics.median(taken) * 1e3
    share = in_take_ms / med["offered"]
    print(f"in take_boundary_state_offloads: {in_take_ms:.1f} ms ({share:.1%})")
    print(f"vLLM/offered = {med['vllm'] / med['offered']:.2f}x")


if __name__ == "__main__":
    main()
