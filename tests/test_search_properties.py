"""Properties of the capacity search (hypothesis, small workloads, few examples): more
replicas never lower the capacity; a looser SLO never lowers it."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenyard.search import capacity_search

SETTINGS = settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)
SEARCH = {"initial_qps": 2.0, "tolerance": 0.05, "max_scheduling_delay_p99_s": 1.0}


@st.composite
def deployments(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "seed": draw(st.integers(0, 3)),
        "cluster": {"num_replicas": draw(st.integers(1, 3))},
        "replica": {"scheduler": {"policy": draw(st.sampled_from(["vllm_v1", "sarathi", "vllm"]))}},
        "workload": {
            "kind": "synthetic",
            "num_requests": 120,
            "seed": draw(st.integers(0, 3)),
            "arrival": {"kind": draw(st.sampled_from(["poisson", "constant"])), "qps": 1.0},
            "prompt_tokens": {"kind": "uniform", "low": 64, "high": draw(st.integers(64, 1024))},
            "output_tokens": {"kind": "uniform", "low": 4, "high": draw(st.integers(4, 64))},
        },
    }


@SETTINGS
@given(deployments(), st.floats(0.2, 2.0))
def test_more_replicas_never_lower_capacity(sim: dict[str, Any], ttft_s: float) -> None:
    slo = {"ttft_p99_s": ttft_s, "tbt_p99_s": 0.2}
    fewer = capacity_search(sim, slo, search=SEARCH).capacity_qps
    more_sim = {**sim, "cluster": {"num_replicas": sim["cluster"]["num_replicas"] + 1}}
    more = capacity_search(more_sim, slo, search=SEARCH).capacity_qps
    assert more >= fewer


@SETTINGS
@given(deployments(), st.floats(0.1, 2.0), st.floats(1.0, 4.0), st.floats(0.02, 0.2))
def test_a_looser_slo_never_lowers_capacity(
    sim: dict[str, Any], ttft_s: float, looser: float, tbt_s: float
) -> None:
    tight = capacity_search(sim, {"ttft_p99_s": ttft_s, "tbt_p99_s": tbt_s}, search=SEARCH)
    loose = capacity_search(
        sim, {"ttft_p99_s": ttft_s * looser, "tbt_p99_s": tbt_s * looser}, search=SEARCH
    )
    assert loose.capacity_qps >= tight.capacity_qps
