"""The same deployment search on a local Ray instance and on the process pool gives
identical results (the same seeds, one task per simulation either way)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tokenyard.search import deployment_search, search_config_from_mapping

ray = pytest.importorskip("ray")

GRID = {
    "simulation": {
        "workload": {
            "kind": "synthetic",
            "num_requests": 150,
            "arrival": {"kind": "poisson", "qps": 1.0},
            "prompt_tokens": {"kind": "uniform", "low": 100, "high": 600},
            "output_tokens": {"kind": "uniform", "low": 8, "high": 64},
        },
    },
    "slo": {"ttft_p99_s": 1.0, "tbt_p99_s": 0.2},
    "search": {"initial_qps": 4.0, "tolerance": 0.05, "refine_breaks": True},
    "grid": {
        "cluster.num_replicas": [1, 2],
        "replica.scheduler.policy": ["vllm_v1", "sarathi"],
    },
}


@pytest.fixture
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def _without_wall(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_ray_and_the_process_pool_give_identical_results(local_ray: None) -> None:
    config = search_config_from_mapping(GRID)
    on_ray = deployment_search(config, executor="ray")
    on_pool = deployment_search(config, executor="local", workers=2)
    assert on_ray.ran == on_pool.ran > 0
    assert _without_wall(on_ray.rows) == _without_wall(on_pool.rows)
    assert _without_wall(on_ray.probes) == _without_wall(on_pool.probes)
