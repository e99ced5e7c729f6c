"""Simulation jobs for the tests: a synthetic workload, and one replica serving it."""

from __future__ import annotations

from typing import Any

from tokenyard.simulation import config_from_mapping
from tokenyard.simulation.config import SimulationConfig

#: A token count: an int is ``fixed``, a (low, high) pair ``uniform``.
Tokens = int | tuple[int, int]


def _tokens(tokens: Tokens) -> dict[str, Any]:
    if isinstance(tokens, int):
        return {"kind": "fixed", "value": tokens}
    low, high = tokens
    return {"kind": "uniform", "low": low, "high": high}


def synthetic_workload(
    num_requests: int, *, qps: float, prompt_tokens: Tokens, output_tokens: Tokens, **extra: Any
) -> dict[str, Any]:
    """A ``synthetic`` workload table: ``num_requests`` Poisson arrivals at ``qps``, and
    ``extra`` keys (``seed``, ``images``) as given."""
    return {
        "kind": "synthetic",
        "num_requests": num_requests,
        "arrival": {"kind": "poisson", "qps": qps},
        "prompt_tokens": _tokens(prompt_tokens),
        "output_tokens": _tokens(output_tokens),
        **extra,
    }


def one_replica(
    replica: dict[str, Any], workload: dict[str, Any], **sections: Any
) -> SimulationConfig:
    """The job of one ``replica`` serving ``workload``, with other top-level ``sections``
    (``execution``, more ``cluster`` keys) as given."""
    cluster = {"num_replicas": 1, **sections.pop("cluster", {})}
    return config_from_mapping(
        {"cluster": cluster, "replica": replica, "workload": workload, **sections}
    )


#: 200 requests of 100-2,000 prompt and 10-100 output tokens at 10 a second.
SMALL_WORKLOAD = synthetic_workload(
    200, qps=10.0, prompt_tokens=(100, 2000), output_tokens=(10, 100)
)
