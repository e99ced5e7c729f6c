"""The limits one simulation holds to: a model's context length is every policy's longest
request, counts and KV blocks are bounded at config time, and a skipped request is seen.

Each test here reproduces a case that once ran silently, aborted the process or named the
wrong key (issue 32, items 1, 3, 8 and 9).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tokenyard.cli import main
from tokenyard.errors import ConfigError, InputError
from tokenyard.simulation import config_from_mapping, simulate
from tokenyard.simulation.config import default_workload

POLICIES = ("vllm_v1", "vllm", "sarathi", "orca", "sglang")
LINEAR = {"model": "linear"}


def _trace(path: Path, rows: list[tuple[float, int, int]]) -> str:
    lines = ["arrived_at,num_prefill_tokens,num_decode_tokens"]
    lines += [f"{at},{prefill},{decode}" for at, prefill, decode in rows]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _config(path: str, policy: str, **replica: Any) -> Any:
    return config_from_mapping(
        {
            "cluster": {"num_replicas": 2},
            "replica": {"scheduler": {"policy": policy}, **replica},
            "execution": LINEAR,
            "workload": {"kind": "trace", "format": "vidur", "path": path},
        }
    )


@pytest.mark.parametrize("policy", POLICIES)
def test_the_model_context_is_every_policys_limit_by_default(tmp_path: Path, policy: str) -> None:
    # llama-3.1-8b serves 131,072 tokens: an 8,500-token request runs under every policy
    # (it once stopped vllm_v1, vllm and orca at the old 8,192-token default). Vidur's
    # vllm also runs whole prompts within max_tokens_in_batch, its own knob.
    fits = _trace(tmp_path / "fits.csv", [(0.0, 8400, 100)])
    scheduler = {"policy": policy, "vidur": {"max_tokens_in_batch": 16384}}
    result = simulate(_config(fits, policy, model="llama-3.1-8b", scheduler=scheduler))
    assert result.summary["num_requests"] == 1
    # llama-2-7b serves 4,096: a 4,097-token request is refused by every policy, for the
    # same reason, without the binding's "invalid argument" prefix.
    over = _trace(tmp_path / "over.csv", [(0.0, 4000, 97)])
    with pytest.raises(InputError) as err:
        simulate(_config(over, policy))
    message = str(err.value)
    assert message.startswith("request 0 (4000 prompt + 97 output tokens) can never run")
    assert "llama-2-7b's context length of 4096 tokens" in message
    assert "replica.scheduler.max_request_tokens" in message
    assert err.value.field == "request"


@pytest.mark.parametrize("policy", POLICIES)
def test_a_setting_below_the_context_is_the_limit_it_names(tmp_path: Path, policy: str) -> None:
    path = _trace(tmp_path / "t.csv", [(0.0, 100, 10), (1.0, 1000, 10), (2.0, 100, 10)])
    scheduler = {"policy": policy, "max_request_tokens": 1000}
    with pytest.raises(InputError, match=r"replica\.scheduler\.max_request_tokens = 1000"):
        simulate(_config(path, policy, scheduler=scheduler))
    skipping = _config(path, policy, scheduler=scheduler, over_length="skip")
    assert simulate(skipping).summary["num_skipped_over_length"] == 1


def test_a_limit_above_the_model_context_is_refused_naming_both() -> None:
    for key, scheduler in (
        ("replica.scheduler.max_request_tokens", {"max_request_tokens": 200_000}),
        ("replica.scheduler.vllm_v1.max_model_len", {"vllm_v1": {"max_model_len": 200_000}}),
    ):
        config = config_from_mapping(
            {
                "replica": {"model": "llama-3.1-8b", "scheduler": scheduler},
                "workload": {**default_workload(), "num_requests": 5},
            }
        )
        with pytest.raises(ConfigError) as err:
            simulate(config)
        assert err.value.field == key
        assert "llama-3.1-8b's context length of 131072 tokens" in str(err.value)


def test_every_builtin_model_has_its_context_length() -> None:
    from tokenyard import catalog

    contexts = {name: catalog.model(name).context_length for name in catalog.models()}
    assert contexts["llama-2-7b"] == 4096
    assert contexts["llama-3.1-70b"] == 131072
    assert contexts["mixtral-8x7b"] == 32768
    assert all(value >= 2048 for value in contexts.values())


def test_the_decode_pool_counts_in_the_block_budget() -> None:
    # Each pool alone is within the 2**26-block budget; together they were accepted and
    # then aborted the process allocating 268 MB.
    mapping = {
        "replica": {"scheduler": {"vllm_v1": {"num_blocks": 2**26}}},
        "cluster": {"num_replicas": 1, "decode": {"num_replicas": 2}},
    }
    with pytest.raises(ConfigError) as err:
        config_from_mapping(mapping)
    assert err.value.field == "cluster.num_replicas"
    assert "2 replicas of 67108864 KV blocks" in str(err.value)


@pytest.mark.parametrize(
    ("workload", "key"),
    [
        ({"kind": "synthetic", "num_requests": 10**20}, "workload.num_requests"),
        ({"kind": "synthetic", "closed_loop": {"concurrency": 2**70}}, "workload.closed_loop"),
        ({"kind": "sessions", "num_sessions": 10**9}, "workload.num_sessions"),
        ({"kind": "trace", "format": "vidur", "path": "x.csv", "limit": 10**9}, "workload.limit"),
    ],
)
def test_counts_are_bounded_when_the_config_is_built(workload: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_mapping({"workload": workload})
    assert (err.value.field or "").startswith(key)
    assert "100000000" in str(err.value)


def test_an_unbounded_request_count_on_the_command_line_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["simulate", "--requests", "99999999999999999999", "--no-progress"]) == 2
    assert "workload.num_requests: must be an int in [1, 100000000]" in capsys.readouterr().err


def test_skipped_requests_show_in_the_text_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _trace(tmp_path / "t.csv", [(0.0, 100, 10), (1.0, 5000, 10), (2.0, 100, 10)])
    config = tmp_path / "c.toml"
    config.write_text(
        f'[replica]\nover_length = "skip"\n[execution]\nmodel = "linear"\n'
        f'[workload]\nkind = "trace"\nformat = "vidur"\npath = "{path}"\n'
    )
    assert main(["simulate", str(config), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "2 requests" in printed
    assert "skipped 1 requests longer than a replica serves" in printed


def test_vidur_batches_sized_for_the_whole_context_say_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Vidur's planner divides KV memory by the longest request; unset, that is the model's
    # context, which caps sarathi at 3 requests per batch on Llama-3.1-8B: the banner says.
    argv = ["simulate", "--requests", "50", "--no-progress", "--replica-policy", "sarathi"]
    assert main([*argv, "--set", "replica.model=llama-3.1-8b"]) == 0
    printed = capsys.readouterr().out
    assert "note: sarathi batches hold at most 3 requests" in printed
    assert "replica.scheduler.max_request_tokens" in printed
    setting = "replica.scheduler.max_request_tokens=8192"
    assert main([*argv, "--set", "replica.model=llama-3.1-8b", "--set", setting]) == 0
    assert "note:" not in capsys.readouterr().out
