"""Vidur's own rules where tokenyard once differed (issue 14, item 6), through `simulate`:
the batch cap of vllm/sarathi/lightllm, and `replica.scheduler.restart`."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tokenyard.errors import ConfigError
from tokenyard.simulation import config_from_mapping, simulate

#: One second per iteration, whatever the batch.
ONE_SECOND = {
    "model": "linear",
    "constant_s": 1.0,
    "per_prefill_token_s": 0.0,
    "per_decode_token_s": 0.0,
    "per_decode_context_token_s": 0.0,
    "per_prefill_context_token_s": 0.0,
    "cpu_overhead_s": 0.0,
}


def run(tmp_path: Path, rows: list[tuple[float, int, int]], stages: int = 1, **scheduler: Any):
    trace = tmp_path / "trace.csv"
    with open(trace, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["arrived_at", "num_prefill_tokens", "num_decode_tokens"])
        writer.writerows(rows)
    config = config_from_mapping(
        {
            "cluster": {"num_replicas": 1},
            "replica": {
                "model": "llama-2-7b",
                "device": "a100-80gb",
                "num_pipeline_stages": stages,
                "scheduler": scheduler,
            },
            "execution": ONE_SECOND,
            "workload": {"kind": "trace", "format": "vidur", "path": str(trace)},
        }
    )
    c = simulate(config).columns
    order = np.argsort(c["request_id"])
    return {name: c[name][order] for name in ("first_token_at", "completed_at", "num_restarts")}


def test_vllm_batch_holds_batch_size_cap_over_stages_not_the_planners_batch(tmp_path):
    # Llama-2-7B on an A100 with 4,096-token requests: the memory planner's batch is 65 on
    # each of 2 stages, but Vidur caps a vllm batch at batch_size_cap // stages = 64 only
    # (memory is limited by the blocks). 100 tiny requests at once: the first batch holds 64.
    out = run(
        tmp_path,
        [(0.0, 2, 3)] * 100,
        stages=2,
        policy="vllm",
        batch_size_cap=128,
        num_blocks=1000,
        max_request_tokens=4096,
    )
    first = out["first_token_at"]
    assert int((first == first.min()).sum()) == 64


def test_restart_vidur_folds_a_partial_prefill_into_a_shorter_prompt(tmp_path):
    # Sarathi, 7 blocks of 4 tokens, chunk 8. A (4, 8) prefills 0-1; at 1.0 A decodes and B
    # (20, 2) takes a 7-token chunk (5 blocks). At 2.0 no block is free for A: B, the latest
    # arrival, restarts with 7 of its 20 prompt tokens processed.
    rows = [(0.0, 4, 8), (0.5, 20, 2)]
    knobs = {
        "policy": "sarathi",
        "block_size": 4,
        "num_blocks": 7,
        "watermark_blocks_fraction": 0.0,
        "chunk_size": 8,
        "max_request_tokens": 64,
    }
    vidur = run(tmp_path, rows, restart="vidur", **knobs)
    default = run(tmp_path, rows, **knobs)
    # Vidur: B's prompt becomes those 7 tokens, re-prefilled 2-3: its first token at 3.0.
    assert vidur["first_token_at"][1] == 3.0
    # Default ("recompute"): B re-prefills its whole 20-token prompt, so later.
    assert default["first_token_at"][1] > 3.0
    assert vidur["num_restarts"][1] >= 1
    assert default["num_restarts"][1] >= 1
    assert np.all(vidur["completed_at"] > 0)
    assert np.all(default["completed_at"] > 0)


def test_restart_recompute_is_the_default_and_can_be_named(tmp_path):
    rows = [(0.0, 4, 8), (0.5, 20, 2)]
    knobs = {"policy": "sarathi", "block_size": 4, "num_blocks": 7, "chunk_size": 8}
    knobs |= {"watermark_blocks_fraction": 0.0, "max_request_tokens": 64}
    named = run(tmp_path, rows, restart="recompute", **knobs)
    default = run(tmp_path, rows, **knobs)
    for name in named:
        assert np.array_equal(named[name], default[name])


@pytest.mark.parametrize("value", ["Vidur", "restart", ""])
def test_bad_restart_value_is_a_config_error_naming_the_key(tmp_path, value):
    with pytest.raises(ConfigError) as info:
        run(tmp_path, [(0.0, 4, 2)], policy="vllm", restart=value)
    message = str(info.value)
    assert "replica.scheduler.vidur.restart" in message
    assert repr(value) in message or f'"{value}"' in message
