"""Launch lines (tokenyard.recommend.launch): every flag a ``vllm serve`` or SGLang
``launch_server`` line carries reads back into the config it came from (hypothesis over
layouts, dtypes, schedulers, speculative decoding and P/D pools); settings with no flag
are notes naming their key; the TOML config reproduces the simulation; and, where the
bench venv has vLLM 0.33, vLLM's own parser accepts the lines with the same values."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import tomllib
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenyard.errors import ConfigError
from tokenyard.recommend.launch import (
    LaunchCommand,
    config_toml,
    hf_model_id,
    launch_script,
    sglang_commands,
    vllm_commands,
)
from tokenyard.recommend.launch_parse import parse_sglang_command, parse_vllm_command
from tokenyard.simulation.config import (
    SimulationConfig,
    apply_overrides,
    config_document,
    config_from_mapping,
)

REPO = Path(__file__).resolve().parents[1]

#: The keys a vLLM line carries as flags (the rest are notes or not the server's).
VLLM_REPLICA_KEYS = (
    "replica.tensor_parallel_size",
    "replica.num_pipeline_stages",
    "replica.data_parallel_size",
    "replica.expert_parallel_size",
    "replica.memory_margin_fraction",
    "replica.dtype",
    "replica.kv_cache_dtype",
    "replica.speculative.method",
    "replica.speculative.num_speculative_tokens",
    "replica.scheduler.vllm_v1.max_model_len",
)
VLLM_SCHEDULER_KEYS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "block_size",
    "num_blocks",
    "long_prefill_token_threshold",
    "long_prefill_token_threshold_adaptive",
    "policy",
)
SGLANG_SCHEDULER_KEYS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "block_size",
    "num_blocks",
    "policy",
)
DECODE_KEYS = (
    "cluster.decode.tensor_parallel_size",
    "cluster.decode.num_pipeline_stages",
    "cluster.decode.data_parallel_size",
    "cluster.decode.expert_parallel_size",
    "cluster.decode.memory_margin_fraction",
)


def _scheduler(draw: st.DrawFn) -> dict[str, Any]:
    seqs = draw(st.integers(1, 1024))
    threshold = draw(st.sampled_from([0, 256, 1024]))
    return {
        "max_num_seqs": seqs,
        "max_num_batched_tokens": draw(st.integers(seqs, 16384)),
        "enable_chunked_prefill": draw(st.booleans()),
        "enable_prefix_caching": draw(st.booleans()),
        "block_size": draw(st.sampled_from([16, 32, 64])),
        "num_blocks": draw(st.sampled_from([0, 2000, 50_000])),
        "long_prefill_token_threshold": threshold,
        "long_prefill_token_threshold_adaptive": threshold > 0 and draw(st.booleans()),
        "policy": draw(st.sampled_from(["fcfs", "priority"])),
    }


@st.composite
def configs(draw: st.DrawFn) -> SimulationConfig:
    """Configs a server can realise: vllm_v1 replicas, any layout, dtype and scheduler;
    speculative decoding or P/D pools (not both, as the simulator requires)."""
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    dp = draw(st.sampled_from([1, 1, 2, 4]))
    ep = tp * dp if dp > 1 or draw(st.booleans()) else 1
    disaggregated = draw(st.booleans())
    replica: dict[str, Any] = {
        "model": draw(st.sampled_from(["llama-3.1-70b", "qwen2.5-32b", "Qwen/Qwen3-32B"])),
        "device": draw(st.sampled_from(["h100-sxm", "h200", "b200"])),
        "tensor_parallel_size": tp,
        "num_pipeline_stages": draw(st.sampled_from([1, 2])),
        "data_parallel_size": dp,
        "expert_parallel_size": ep,
        "memory_margin_fraction": draw(st.sampled_from([0.05, 0.1, 0.15, 0.25])),
        "dtype": draw(st.sampled_from(["auto", "bf16", "fp16", "fp32"])),
        "quantization": draw(st.sampled_from(["auto", "fp8"])),
        "kv_cache_dtype": draw(st.sampled_from(["auto", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2"])),
        "scheduler": {
            "policy": "vllm_v1",
            "vllm_v1": {
                **_scheduler(draw),
                "max_model_len": draw(st.sampled_from([0, 4096, 8192])),
            },
        },
    }
    if not disaggregated and draw(st.booleans()):
        method = draw(st.sampled_from(["ngram", "mtp", "draft_model"]))
        replica["speculative"] = {
            "method": method,
            "num_speculative_tokens": draw(st.integers(1, 6)),
            "acceptance_rate": 0.7,
            **({"draft_model": "llama-3.1-8b"} if method == "draft_model" else {}),
        }
    cluster: dict[str, Any] = {"num_replicas": draw(st.integers(1, 4))}
    if disaggregated:
        # The decode pool's own layout: wide-EP decode (DP ranks, EP over all of them) too.
        decode_tp = draw(st.sampled_from([tp, 2 * tp]))
        decode_dp = draw(st.sampled_from([1, 1, 2, 8]))
        cluster["decode"] = {
            "num_replicas": draw(st.integers(1, 3)),
            "tensor_parallel_size": decode_tp,
            "data_parallel_size": decode_dp,
            "expert_parallel_size": (
                decode_tp * decode_dp if decode_dp > 1 or draw(st.booleans()) else 1
            ),
            "num_pipeline_stages": draw(st.sampled_from([1, 2])),
            "memory_margin_fraction": draw(st.sampled_from([0.05, 0.2])),
            "scheduler": {"policy": "vllm_v1", "vllm_v1": _scheduler(draw)},
        }
    return config_from_mapping({"replica": replica, "cluster": cluster})


def _delete(document: dict[str, Any], dotted: str) -> None:
    keys = dotted.split(".")
    table: Any = document
    for key in keys[:-1]:
        table = table.get(key) if isinstance(table, dict) else None
        if table is None:
            return
    table.pop(keys[-1], None)


def _rebuilt(config: SimulationConfig, carried: list[str], parsed: dict[str, Any]) -> Any:
    """``config`` with every carried key reset to its default, then the parsed flags set:
    equal to ``config`` only if each carried key came back with its value."""
    document = config_document(config)
    document.pop("base_dir")
    for key in carried:
        _delete(document, key)
    return config_from_mapping(apply_overrides(document, parsed))


def _vllm_carried(config: SimulationConfig) -> list[str]:
    keys = list(VLLM_REPLICA_KEYS)
    keys += [f"replica.scheduler.vllm_v1.{k}" for k in VLLM_SCHEDULER_KEYS]
    if config.cluster.decode is not None:
        keys += list(DECODE_KEYS)
        keys += [f"cluster.decode.scheduler.vllm_v1.{k}" for k in VLLM_SCHEDULER_KEYS]
    if config.replica.quantization == "fp8":
        keys.append("replica.quantization")
    return keys


def _merged(commands: list[LaunchCommand], parse: Any, config: SimulationConfig) -> dict[str, Any]:
    parsed: dict[str, Any] = {}
    for command in commands:
        found = parse(command.text())
        for key, value in found.items():
            if key in parsed and key.startswith("replica.") and parsed[key] != value:
                raise AssertionError(f"the pools' commands disagree on {key}")
            parsed[key] = value
    # The server loads a checkpoint, the config names a catalog entry: swap them back.
    assert parsed.pop("replica.model") == hf_model_id(config.replica.model)
    draft = config.replica.speculative.draft_model
    if draft is not None:
        assert parsed.pop("replica.speculative.draft_model") == hf_model_id(draft)
    return parsed


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs())
def test_every_vllm_flag_reads_back_into_the_config_it_came_from(
    config: SimulationConfig,
) -> None:
    commands = vllm_commands(config)
    assert [c.role for c in commands] == (
        ["aggregated"] if config.cluster.decode is None else ["prefill", "decode"]
    )
    parsed = _merged(commands, parse_vllm_command, config)
    assert _rebuilt(config, _vllm_carried(config), parsed) == config


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs())
def test_every_sglang_flag_reads_back_into_the_config_it_came_from(
    config: SimulationConfig,
) -> None:
    """A vllm_v1 config on SGLang: the scheduler keys SGLang has flags for come back;
    SGLang's FP8 KV is e4m3, so ``fp8`` reads back as ``fp8_e4m3`` (the same bytes)."""
    commands = sglang_commands(config)
    parsed = _merged(commands, lambda t: parse_sglang_command(t, policy="vllm_v1"), config)
    keys = [k for k in _vllm_carried(config) if "long_prefill" not in k]
    keys = [
        k
        for k in keys
        if not k.endswith(("speculative.method", "speculative.num_speculative_tokens"))
    ]
    keys = [k for k in keys if not k.endswith("max_model_len") or "cluster" not in k]
    expected = config
    if config.replica.kv_cache_dtype == "fp8":
        expected = dataclasses.replace(
            config, replica=dataclasses.replace(config.replica, kv_cache_dtype="fp8_e4m3")
        )
    spec = config.replica.speculative
    if spec.enabled:
        keys += ["replica.speculative.method", "replica.speculative.num_speculative_tokens"]
    assert _rebuilt(config, keys, parsed) == expected


@settings(max_examples=60, deadline=None)
@given(
    page=st.sampled_from([1, 16, 64]),
    running=st.integers(1, 512),
    chunk=st.integers(64, 16384),
    pages=st.sampled_from([0, 1000]),
    graphs=st.sampled_from([(1, 2, 4, 8), (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 256)]),
    limit=st.sampled_from([None, 4096]),
    tp=st.sampled_from([1, 2, 8]),
)
def test_an_sglang_scheduler_reads_back_in_sglangs_own_words(
    page: int,
    running: int,
    chunk: int,
    pages: int,
    graphs: tuple[int, ...],
    limit: int | None,
    tp: int,
) -> None:
    section = {
        "page_size": page,
        "max_running_requests": running,
        "chunked_prefill_size": chunk,
        "num_pages": pages,
        "cuda_graph_bs": list(graphs),
    }
    scheduler: dict[str, Any] = {"policy": "sglang", "sglang": section}
    if limit is not None:
        scheduler["max_request_tokens"] = limit
    config = config_from_mapping(
        {"replica": {"model": "llama-3.1-70b", "tensor_parallel_size": tp, "scheduler": scheduler}}
    )
    (command,) = sglang_commands(config)
    parsed = parse_sglang_command(command.text())
    parsed.pop("replica.model")
    keys = [f"replica.scheduler.sglang.{k}" for k in section]
    keys += ["replica.scheduler.max_request_tokens", "replica.tensor_parallel_size"]
    assert _rebuilt(config, keys, parsed) == config


def test_attention_dp_multiplies_sglangs_whole_server_caps() -> None:
    """SGLang 0.5.23 divides --max-running-requests and --chunked-prefill-size by the
    attention DP size, and its --tp-size counts every GPU of the group."""
    config = config_from_mapping(
        {
            "replica": {
                "model": "deepseek-ai/DeepSeek-V3",
                "device": "h200",
                "tensor_parallel_size": 1,
                "data_parallel_size": 8,
                "expert_parallel_size": 8,
                "scheduler": {"vllm_v1": {"max_num_seqs": 64, "max_num_batched_tokens": 4096}},
            }
        }
    )
    (command,) = sglang_commands(config)
    argv = list(command.argv)
    assert argv[argv.index("--tp-size") + 1] == "8"
    assert argv[argv.index("--attn-dp-size") + 1] == "8"
    assert argv[argv.index("--ep-size") + 1] == "8"
    assert argv[argv.index("--max-running-requests") + 1] == str(64 * 8)
    assert argv[argv.index("--chunked-prefill-size") + 1] == str(4096 * 8)
    (vllm,) = vllm_commands(config)
    assert "--enable-expert-parallel" in vllm.argv
    assert vllm.argv[vllm.argv.index("--data-parallel-size") + 1] == "8"
    assert vllm.argv[vllm.argv.index("--max-num-seqs") + 1] == "64"
    assert command.gpus_per_instance == vllm.gpus_per_instance == 8


def test_a_wide_ep_decode_pool_gets_its_own_dp_and_ep_flags() -> None:
    """Prefill TP 8 with EP 8, decode TP 1 x DP 16 with EP 16 (docs/disaggregation.md):
    each pool's command carries its own layout, the decode one 16 GPUs an instance."""
    config = config_from_mapping(
        {
            "replica": {
                "model": "deepseek-ai/DeepSeek-V3",
                "device": "h200",
                "tensor_parallel_size": 8,
                "expert_parallel_size": 8,
            },
            "cluster": {
                "decode": {
                    "tensor_parallel_size": 1,
                    "data_parallel_size": 16,
                    "expert_parallel_size": 16,
                }
            },
        }
    )
    prefill, decode = vllm_commands(config)
    assert "--data-parallel-size" not in prefill.argv
    assert "--enable-expert-parallel" in prefill.argv
    assert decode.argv[decode.argv.index("--tensor-parallel-size") + 1] == "1"
    assert decode.argv[decode.argv.index("--data-parallel-size") + 1] == "16"
    assert "--enable-expert-parallel" in decode.argv
    assert (prefill.gpus_per_instance, decode.gpus_per_instance) == (8, 16)
    assert "each of the 16 data-parallel ranks has its own scheduler" in " ".join(decode.notes)
    _, sg_decode = sglang_commands(config)
    argv = sg_decode.argv
    assert argv[argv.index("--tp-size") + 1] == "16"
    assert argv[argv.index("--attn-dp-size") + 1] == "16"
    assert argv[argv.index("--ep-size") + 1] == "16"
    assert parse_vllm_command(decode.text())["cluster.decode.data_parallel_size"] == 16
    parsed = parse_sglang_command(sg_decode.text(), policy="vllm_v1")
    assert parsed["cluster.decode.expert_parallel_size"] == 16


def test_pd_pools_use_nixl_with_producer_and_consumer_roles() -> None:
    config = config_from_mapping(
        {
            "replica": {"model": "llama-3.1-70b", "device": "h200", "tensor_parallel_size": 4},
            "cluster": {
                "num_replicas": 2,
                "decode": {"num_replicas": 3, "tensor_parallel_size": 8},
            },
        }
    )
    prefill, decode = vllm_commands(config)
    roles = [
        json.loads(c.argv[c.argv.index("--kv-transfer-config") + 1]) for c in (prefill, decode)
    ]
    assert roles == [
        {"kv_connector": "NixlConnector", "kv_role": "kv_producer"},
        {"kv_connector": "NixlConnector", "kv_role": "kv_consumer"},
    ]
    assert (prefill.num_instances, prefill.gpus_per_instance) == (2, 4)
    assert (decode.num_instances, decode.gpus_per_instance) == (3, 8)
    sg_prefill, sg_decode = sglang_commands(config)
    assert sg_prefill.argv[sg_prefill.argv.index("--disaggregation-mode") + 1] == "prefill"
    assert sg_decode.argv[sg_decode.argv.index("--disaggregation-mode") + 1] == "decode"
    script = launch_script(config, "vllm")
    assert "# prefill: 2 instance(s) of 4 x h200 GPU(s)" in script
    assert "# decode: 3 instance(s) of 8 x h200 GPU(s)" in script


@pytest.mark.parametrize(
    ("replica", "key"),
    [
        ({"kv_cache_dtype": "int8"}, "replica.kv_cache_dtype"),
        ({"quantization": "fp8_block"}, "replica.quantization"),
        ({"quantization": "none"}, "replica.quantization"),
        ({"over_length": "skip"}, "replica.over_length"),
        ({"scheduler": {"vllm_v1": {"max_num_seqs": 0}}}, "max_num_seqs = 0"),
        ({"scheduler": {"vllm_v1": {"prefix_cache": "radix"}}}, "prefix_cache"),
        ({"scheduler": {"vllm_v1": {"prioritize_prefill": True}}}, "prioritize_prefill"),
        ({"scheduler": {"vllm_v1": {"scheduler_reserve_full_isl": False}}}, "reserve_full_isl"),
        (
            {
                "speculative": {
                    "method": "ngram",
                    "num_speculative_tokens": 2,
                    "acceptance_rate": 0.6,
                }
            },
            "acceptance 0.6",
        ),
    ],
)
def test_a_setting_without_a_flag_is_a_note_naming_its_key(
    replica: dict[str, Any], key: str
) -> None:
    config = config_from_mapping({"replica": {"model": "llama-3.1-70b", **replica}})
    (command,) = vllm_commands(config)
    assert any(key in note for note in command.notes), command.notes
    assert any(key in line for line in launch_script(config, "vllm").splitlines() if line[0] == "#")


@pytest.mark.parametrize(
    ("document", "key"),
    [
        (
            {"cluster": {"global_scheduler": {"policy": "prefix_affinity", "balance": 2.0}}},
            "cluster.global_scheduler.balance",
        ),
        (
            {"cluster": {"decode": {"num_replicas": 1}, "kv_transfer": {"network_gbps": 25.0}}},
            "cluster.kv_transfer",
        ),
        ({"replica": {"scheduler": {"policy_plugin": "my.mod:Order"}}}, "policy_plugin"),
    ],
)
def test_cluster_settings_without_a_flag_are_notes(document: dict[str, Any], key: str) -> None:
    replica = {"model": "llama-3.1-70b", **document.get("replica", {})}
    config = config_from_mapping({**document, "replica": replica})
    for render in (vllm_commands, sglang_commands):
        notes = [note for command in render(config) for note in command.notes]
        assert any(key in note for note in notes), notes


def test_settings_every_command_names() -> None:
    config = config_from_mapping({"replica": {"model": "llama-3.1-70b"}})
    (command,) = vllm_commands(config)
    notes = "\n".join(command.notes)
    assert "cluster.global_scheduler.policy" in notes
    assert "execution.model" in notes


def test_a_scheduler_no_engine_runs_is_refused_by_its_key() -> None:
    config = config_from_mapping(
        {"replica": {"model": "llama-3.1-70b", "scheduler": {"policy": "sarathi"}}}
    )
    for render in (vllm_commands, sglang_commands):
        with pytest.raises(ConfigError, match=r"replica\.scheduler\.policy"):
            render(config)
    sglang = config_from_mapping({"replica": {"scheduler": {"policy": "sglang"}}})
    with pytest.raises(ConfigError, match="vllm"):
        vllm_commands(sglang)
    with pytest.raises(ConfigError, match="framework"):
        launch_script(config, "trtllm")


def test_model_names_become_checkpoints() -> None:
    assert hf_model_id("llama-3.1-70b") == "meta-llama/Llama-3.1-70B"
    assert hf_model_id("Qwen/Qwen3-32B") == "Qwen/Qwen3-32B"
    assert hf_model_id("/models/my-llama/config.json") == "/models/my-llama"


def test_parsers_refuse_lines_they_did_not_write() -> None:
    with pytest.raises(ConfigError, match="--trust-remote-code"):
        parse_vllm_command("vllm serve m --trust-remote-code x")
    with pytest.raises(ConfigError, match="command"):
        parse_vllm_command("python -m vllm.entrypoints.openai.api_server --model m")
    with pytest.raises(ConfigError, match="one command"):
        parse_vllm_command("vllm serve a\nvllm serve b")
    with pytest.raises(ConfigError, match="--foo"):
        parse_sglang_command("python -m sglang.launch_server --model-path m --foo 1")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs())
def test_the_toml_config_reproduces_the_simulation(config: SimulationConfig) -> None:
    rebuilt = config_from_mapping(tomllib.loads(config_toml(config)))
    assert dataclasses.replace(rebuilt, base_dir=None) == config


VLLM_PEER = REPO / ".venv-bench" / "bin" / "python"


def _peer_parse(
    script: str, commands: list[Any], tmp_path: Path, env: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """The values an engine's own parser (``benches/peers/<script>``, run in the bench
    venv) reads from each command line of ``commands`` (their ``#`` notes left out)."""
    lines = [line for c in commands for line in c.text().splitlines() if not line.startswith("#")]
    done = subprocess.run(
        [str(VLLM_PEER), str(REPO / "benches" / "peers" / script)],
        input=json.dumps(lines),
        capture_output=True,
        text=True,
        cwd=tmp_path,  # away from the repository's kernels/ package
        env=env,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(done.stderr[-3000:])
    parsed: list[dict[str, Any]] = json.loads(done.stdout)
    return parsed


@pytest.mark.skipif(not VLLM_PEER.exists(), reason="needs the bench venv with vLLM 0.33")
def test_vllms_own_parser_reads_the_same_values(tmp_path: Path) -> None:
    """vLLM 0.33's ``vllm serve`` argument parser (benches/peers/vllm_launch_args.py)
    accepts every flag and reads the values the config holds."""
    samples = [
        {
            "replica": {
                "model": "deepseek-ai/DeepSeek-V3",
                "device": "h200",
                "tensor_parallel_size": 2,
                "data_parallel_size": 4,
                "expert_parallel_size": 8,
                "dtype": "bf16",
                "kv_cache_dtype": "fp8",
                "quantization": "fp8",
                "memory_margin_fraction": 0.15,
                "scheduler": {
                    "vllm_v1": {
                        "max_num_seqs": 96,
                        "max_num_batched_tokens": 3000,
                        "enable_chunked_prefill": False,
                        "enable_prefix_caching": False,
                        "block_size": 64,
                        "num_blocks": 1234,
                        "long_prefill_token_threshold": 512,
                        "long_prefill_token_threshold_adaptive": True,
                        "policy": "priority",
                        "max_model_len": 8192,
                    }
                },
                "speculative": {
                    "method": "mtp",
                    "num_speculative_tokens": 2,
                    "acceptance_rate": 0.8,
                },
            }
        },
        {
            "replica": {"model": "llama-3.1-70b", "device": "h100-sxm", "tensor_parallel_size": 4},
            "cluster": {
                "num_replicas": 2,
                "decode": {"num_replicas": 1, "tensor_parallel_size": 8},
            },
        },
    ]
    commands = [c for s in samples for c in vllm_commands(config_from_mapping(s))]
    first, prefill, decode = _peer_parse("vllm_launch_args.py", commands, tmp_path)
    assert first["model"] == "deepseek-ai/DeepSeek-V3"
    assert (first["tensor_parallel_size"], first["data_parallel_size"]) == (2, 4)
    assert first["enable_expert_parallel"] is True
    assert (first["max_num_seqs"], first["max_num_batched_tokens"]) == (96, 3000)
    assert (first["enable_chunked_prefill"], first["enable_prefix_caching"]) == (False, False)
    assert (first["block_size"], first["num_gpu_blocks_override"]) == (64, 1234)
    assert first["long_prefill_token_threshold"] == 512
    assert first["long_prefill_token_threshold_adaptive"] is True
    assert first["scheduling_policy"] == "priority"
    assert first["max_model_len"] == 8192
    assert (first["kv_cache_dtype"], first["dtype"], first["quantization"]) == (
        "fp8",
        "bfloat16",
        "fp8",
    )
    assert first["gpu_memory_utilization"] == pytest.approx(0.85)
    assert first["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 2}
    assert (prefill["kv_connector"], prefill["kv_role"]) == ("NixlConnector", "kv_producer")
    assert (decode["kv_role"], decode["tensor_parallel_size"]) == ("kv_consumer", 8)


SGLANG_SRC = REPO / ".venv-bench" / "sglang_src"


@pytest.mark.skipif(
    not (VLLM_PEER.exists() and (SGLANG_SRC / "sglang").is_dir()),
    reason="needs the bench venv with SGLang 0.5.23's sources",
)
def test_sglangs_own_parser_reads_the_same_values(tmp_path: Path) -> None:
    """SGLang 0.5.23's ``ServerArgs`` parser (benches/peers/sglang_launch_args.py) accepts
    every flag and reads the values the config holds, the whole-server caps x DP."""
    aggregated = config_from_mapping(
        {
            "replica": {
                "model": "deepseek-ai/DeepSeek-V3",
                "device": "h200",
                "tensor_parallel_size": 2,
                "data_parallel_size": 4,
                "expert_parallel_size": 8,
                "dtype": "bf16",
                "kv_cache_dtype": "fp8",
                "quantization": "fp8",
                "memory_margin_fraction": 0.15,
                "scheduler": {
                    "vllm_v1": {
                        "max_num_seqs": 96,
                        "max_num_batched_tokens": 3000,
                        "enable_prefix_caching": False,
                        "block_size": 64,
                        "num_blocks": 1000,
                        "policy": "priority",
                        "max_model_len": 8192,
                    }
                },
                "speculative": {
                    "method": "mtp",
                    "num_speculative_tokens": 2,
                    "acceptance_rate": 0.8,
                },
            }
        }
    )
    own = config_from_mapping(
        {
            "replica": {
                "model": "llama-3.1-70b",
                "scheduler": {"policy": "sglang", "sglang": {"cuda_graph_bs": [1, 2, 4]}},
            }
        }
    )
    pd = config_from_mapping(
        {
            "replica": {"model": "llama-3.1-70b", "tensor_parallel_size": 4},
            "cluster": {"decode": {"num_replicas": 1, "tensor_parallel_size": 8}},
        }
    )
    commands = [c for config in (aggregated, own, pd) for c in sglang_commands(config)]
    env = {"PYTHONPATH": str(SGLANG_SRC), "PATH": "/usr/bin:/bin"}
    first, graphs, prefill, decode = _peer_parse("sglang_launch_args.py", commands, tmp_path, env)
    assert first["model_path"] == "deepseek-ai/DeepSeek-V3"
    assert (first["tp_size"], first["attn_dp_size"], first["ep_size"]) == (8, 4, 8)
    assert (first["max_running_requests"], first["chunked_prefill_size"]) == (96 * 4, 3000 * 4)
    assert (first["max_prefill_tokens"], first["page_size"]) == (3000, 64)
    assert (first["max_total_tokens"], first["disable_radix_cache"]) == (64_000, True)
    assert (first["kv_cache_dtype"], first["dtype"], first["quantization"]) == (
        "fp8_e4m3",
        "bfloat16",
        "fp8",
    )
    assert first["mem_fraction_static"] == pytest.approx(0.85)
    assert first["context_length"] == 8192
    assert first["enable_priority_scheduling"] is True
    assert first["schedule_low_priority_values_first"] is True
    assert (first["speculative_algorithm"], first["speculative_num_draft_tokens"]) == ("NEXTN", 3)
    assert (prefill["disaggregation_mode"], prefill["disaggregation_transfer_backend"]) == (
        "prefill",
        "nixl",
    )
    assert graphs["cuda_graph_bs_decode"] == [1, 2, 4]
    assert (decode["disaggregation_mode"], decode["tp_size"]) == ("decode", 8)
