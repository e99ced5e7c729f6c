"""Simulator plugins: the shipped examples run, their decisions take effect, and bad answers
or a plugin's own exception come back as documented."""

from __future__ import annotations

from typing import Any

import pytest

from tokenyard.errors import PolicyError
from tokenyard.simulation import config_from_mapping, simulate


def run(global_policy: str = "round_robin", replica_policy: str = "vllm", n: int = 200) -> Any:
    return simulate(
        config_from_mapping(
            {
                "cluster": {"num_replicas": 2, "global_scheduler": {"policy": global_policy}},
                "replica": {"scheduler": {"policy": replica_policy}},
                "workload": {
                    "kind": "synthetic",
                    "num_requests": n,
                    "arrival": {"kind": "poisson", "qps": 4.0},
                    "prompt_tokens": {"kind": "uniform", "low": 64, "high": 1024},
                    "output_tokens": {"kind": "fixed", "value": 16},
                },
            }
        )
    )


def test_the_shipped_example_plugins_run_every_request() -> None:
    result = run(
        "tokenyard.simulation.plugins:LeastQueuedPromptTokens",
        "tokenyard.simulation.plugins:TokenBudgetFcfs",
    )
    assert result.summary["num_requests"] == 200
    assert list(result.columns["num_decode_tokens"]) == [16] * 200


def test_a_routing_plugin_decides_the_replica() -> None:
    result = run("tests.sim_plugins:AlwaysLast")
    assert set(result.columns["replica"]) == {1}


def test_a_replica_plugin_answer_out_of_range_is_a_policy_error() -> None:
    with pytest.raises(PolicyError, match="request 0"):
        run(replica_policy="tests.sim_plugins:WholeRequestAtOnce", n=3)


def test_a_plugins_own_exception_comes_back_unchanged() -> None:
    with pytest.raises(ZeroDivisionError):
        run("tests.sim_plugins:Broken", n=3)
