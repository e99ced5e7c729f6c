"""Reading launch lines back: ``parse_vllm_command`` and ``parse_sglang_command`` turn a
command that ``tokenyard.recommend.launch`` wrote into the dotted config keys it came from
(as ``apply_overrides`` takes them), so a test can check that every flag round-trips.

Invariant: each flag ``launch`` writes is read here to exactly one key (or, for flags that
only restate a fixed choice such as ``--schedule-policy fcfs``, to none); any other flag is
refused, never skipped.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from tokenyard.errors import ConfigError
from tokenyard.recommend.launch import SGLANG_KV_DTYPES, SGLANG_SPEC, VLLM_KV_DTYPES, WEIGHT_DTYPES

__all__ = ["parse_sglang_command", "parse_vllm_command"]

#: vLLM flags that take a value -> the scheduler / replica key they set.
_VLLM_VALUE_FLAGS = {
    "--tensor-parallel-size": ("tensor_parallel_size", int),
    "--pipeline-parallel-size": ("num_pipeline_stages", int),
    "--data-parallel-size": ("data_parallel_size", int),
    "--max-num-seqs": ("vllm_v1.max_num_seqs", int),
    "--max-num-batched-tokens": ("vllm_v1.max_num_batched_tokens", int),
    "--block-size": ("vllm_v1.block_size", int),
    "--num-gpu-blocks-override": ("vllm_v1.num_blocks", int),
    "--long-prefill-token-threshold": ("vllm_v1.long_prefill_token_threshold", int),
    "--scheduling-policy": ("vllm_v1.policy", str),
    "--max-model-len": ("vllm_v1.max_model_len", int),
}
_VLLM_BOOL_FLAGS = {
    "--enable-chunked-prefill": ("vllm_v1.enable_chunked_prefill", True),
    "--no-enable-chunked-prefill": ("vllm_v1.enable_chunked_prefill", False),
    "--enable-prefix-caching": ("vllm_v1.enable_prefix_caching", True),
    "--no-enable-prefix-caching": ("vllm_v1.enable_prefix_caching", False),
    "--long-prefill-token-threshold-adaptive": (
        "vllm_v1.long_prefill_token_threshold_adaptive",
        True,
    ),
}


def _command_argv(text: str, program: Sequence[str]) -> list[str]:
    """The one command in ``text`` (comment lines skipped), after its program words."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if len(lines) != 1:
        raise ConfigError(
            f"command: expected one command line, got {len(lines)}", field="command", value=text
        )
    argv = shlex.split(lines[0])
    if argv[: len(program)] != list(program):
        raise ConfigError(
            f"command: must start with {' '.join(program)!r}, got {' '.join(argv[:3])!r}",
            field="command",
            value=lines[0],
        )
    return argv[len(program) :]


def _take(argv: list[str], i: int, flag: str) -> str:
    if i + 1 >= len(argv):
        raise ConfigError(f"{flag}: needs a value", field=flag, value=None)
    return argv[i + 1]


def _reverse(table: Mapping[str, str], value: str, flag: str) -> str:
    """The tokenyard name of an engine value; its own name where both spell it alike
    (``fp8_e4m3``, not the ``fp8`` that also maps there)."""
    if table.get(value) == value:
        return value
    for key, engine in table.items():
        if engine == value:
            return key
    raise ConfigError(f"{flag}: no tokenyard equivalent of {value!r}", field=flag, value=value)


def _weight_key(flag: str, value: str, kv_dtypes: Mapping[str, str]) -> tuple[str, str] | None:
    """``--dtype``, ``--quantization`` and ``--kv-cache-dtype`` (both engines spell them
    alike; ``kv_dtypes`` is the engine's KV table) as (config key, value); None for
    another flag."""
    if flag == "--dtype":
        return "replica.dtype", _reverse(WEIGHT_DTYPES, value, flag)
    if flag == "--quantization":
        return "replica.quantization", value
    if flag == "--kv-cache-dtype":
        return "replica.kv_cache_dtype", _reverse(kv_dtypes, value, flag)
    return None


def parse_vllm_command(text: str) -> dict[str, Any]:
    """The config keys (dotted, as ``apply_overrides`` takes them) a ``vllm serve`` line
    sets: ``replica.*`` for an aggregated or prefill server, the scheduler and layout under
    ``cluster.decode.*`` for a ``kv_consumer`` one. ``#`` lines are skipped.

    Raises:
        ConfigError: not one ``vllm serve`` line, or a flag without a tokenyard key.
    """
    argv = _command_argv(text, ("vllm", "serve"))
    model, rest = argv[0], argv[1:]
    found: dict[str, Any] = {"replica.model": model}
    role = "aggregated"
    i = 0
    while i < len(rest):
        flag = rest[i]
        if flag in _VLLM_BOOL_FLAGS:
            key, on = _VLLM_BOOL_FLAGS[flag]
            found[f"@{key}"] = on
        elif flag == "--enable-expert-parallel":
            found["@expert_parallel"] = True
        elif flag == "--enable-lora":
            pass  # implied by --max-loras
        elif flag in _VLLM_VALUE_FLAGS:
            key, kind = _VLLM_VALUE_FLAGS[flag]
            found[f"@{key}"] = kind(_take(rest, i, flag))
            i += 1
        else:
            value = _take(rest, i, flag)
            i += 1
            if (weight := _weight_key(flag, value, VLLM_KV_DTYPES)) is not None:
                found[weight[0]] = weight[1]
            elif flag == "--gpu-memory-utilization":
                found["@memory_margin_fraction"] = round(1 - float(value), 9)
            elif flag == "--speculative-config":
                body = json.loads(value)
                found["replica.speculative.method"] = body["method"]
                found["replica.speculative.num_speculative_tokens"] = body["num_speculative_tokens"]
                if "model" in body:
                    found["replica.speculative.draft_model"] = body["model"]
            elif flag == "--kv-transfer-config":
                body = json.loads(value)
                role = "decode" if body.get("kv_role") == "kv_consumer" else "prefill"
            elif flag in ("--max-loras", "--max-lora-rank", "--max-cpu-loras"):
                found[f"replica.lora.{flag[2:].replace('-', '_')}"] = int(value)
            else:
                raise ConfigError(f"{flag}: not a flag tokenyard writes", field=flag, value=value)
        i += 1
    return _place(found, role, "vllm_v1")


def _place(found: dict[str, Any], role: str, section: str) -> dict[str, Any]:
    """Turns ``@key`` (a pool's own setting) into its full key for the server's role."""
    out: dict[str, Any] = {}
    tp = found.get("@tensor_parallel_size", 1)
    dp = found.pop("@data_parallel_size", 1)
    expert = found.pop("@expert_parallel", False)
    for key, value in found.items():
        if not key.startswith("@"):
            out[key] = value
            continue
        name = key[1:]
        if name == "vllm_v1.max_model_len" and section == "vllm_v1":
            out[f"replica.scheduler.{name}"] = value
            continue
        if role == "decode":
            pool = "cluster.decode"
            if name.startswith(("vllm_v1.", "sglang.")):
                out[f"{pool}.scheduler.{name}"] = value
            else:
                out[f"{pool}.{name}"] = value
        elif name.startswith(("vllm_v1.", "sglang.")):
            out[f"replica.scheduler.{name}"] = value
        else:
            out[f"replica.{name}"] = value
    pool = "cluster.decode" if role == "decode" else "replica"
    out[f"{pool}.data_parallel_size"] = dp
    out[f"{pool}.expert_parallel_size"] = tp * dp if expert else 1
    return out


_SGLANG_INT_FLAGS = {
    "--pp-size": "@pp",
    "--ep-size": "@ep",
    "--attn-dp-size": "@dp",
    "--tp-size": "@tp",
    "--max-running-requests": "@max_running_requests",
    "--chunked-prefill-size": "@chunked_prefill_size",
    "--max-prefill-tokens": "@max_prefill_tokens",
    "--page-size": "@page_size",
    "--max-total-tokens": "@max_total_tokens",
    "--context-length": "@context_length",
    "--speculative-num-steps": "replica.speculative.num_speculative_tokens",
    "--speculative-eagle-topk": "@topk",
    "--speculative-num-draft-tokens": "@draft_tokens",
    "--max-loras-per-batch": "replica.lora.max_loras",
    "--max-lora-rank": "replica.lora.max_lora_rank",
}


def parse_sglang_command(text: str, *, policy: str = "sglang") -> dict[str, Any]:
    """The config keys a ``python -m sglang.launch_server`` line sets, in the scheduler
    section of ``policy`` (``sglang``: SGLang's own words; ``vllm_v1``: the vLLM
    equivalents ``sglang_commands`` mapped from). Per-rank caps are the flags divided by
    the attention DP size, as SGLang divides them.

    Raises:
        ConfigError: not one launch_server line, an unknown ``policy``, or a flag without
            a tokenyard key.
    """
    if policy not in ("sglang", "vllm_v1"):
        raise ConfigError(
            f"policy: must be sglang or vllm_v1, got {policy!r}", field="policy", value=policy
        )
    argv = _command_argv(text, ("python", "-m", "sglang.launch_server"))
    raw: dict[str, Any] = {}
    found: dict[str, Any] = {}
    role = "aggregated"
    i = 0
    while i < len(argv):
        flag = argv[i]
        if flag in ("--disable-radix-cache", "--enable-priority-scheduling", "--enable-lora"):
            raw[flag] = True
        elif flag == "--schedule-low-priority-values-first":
            pass  # always beside --enable-priority-scheduling in what tokenyard writes
        elif flag == "--cuda-graph-bs-decode":
            sizes = []
            while i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                sizes.append(int(argv[i + 1]))
                i += 1
            raw["@cuda_graph_bs"] = tuple(sizes)
        else:
            value = _take(argv, i, flag)
            i += 1
            if flag in _SGLANG_INT_FLAGS:
                target = _SGLANG_INT_FLAGS[flag]
                (raw if target.startswith("@") else found)[target] = int(value)
            elif flag == "--model-path":
                found["replica.model"] = value
            elif (weight := _weight_key(flag, value, SGLANG_KV_DTYPES)) is not None:
                found[weight[0]] = weight[1]
            elif flag == "--mem-fraction-static":
                raw["@margin"] = round(1 - float(value), 9)
            elif flag == "--speculative-algorithm":
                found["replica.speculative.method"] = _reverse(SGLANG_SPEC, value, flag)
            elif flag == "--speculative-draft-model-path":
                found["replica.speculative.draft_model"] = value
            elif flag == "--disaggregation-mode":
                role = value
            elif flag in ("--disaggregation-transfer-backend", "--schedule-policy"):
                pass  # always nixl / fcfs in what tokenyard writes
            else:
                raise ConfigError(f"{flag}: not a flag tokenyard writes", field=flag, value=value)
        i += 1
    return _place_sglang(found, raw, role, policy)


def _place_sglang(
    found: dict[str, Any], raw: dict[str, Any], role: str, policy: str
) -> dict[str, Any]:
    dp = raw.get("@dp", 1)
    tp = raw.get("@tp", 1) // dp
    pool = "cluster.decode" if role == "decode" else "replica"
    sched = f"{pool}.scheduler"
    out = dict(found)
    steps = "replica.speculative.num_speculative_tokens"
    if "replica.speculative.method" in out and steps not in out and "@draft_tokens" in raw:
        out[steps] = raw["@draft_tokens"] - 1  # NGRAM: no --speculative-num-steps
    out[f"{pool}.tensor_parallel_size"] = tp
    out[f"{pool}.num_pipeline_stages"] = raw.get("@pp", 1)
    if "@margin" in raw:
        out[f"{pool}.memory_margin_fraction"] = raw["@margin"]
    out[f"{pool}.data_parallel_size"] = dp
    out[f"{pool}.expert_parallel_size"] = raw.get("@ep", 1)
    if "@context_length" in raw:
        key = (
            "scheduler.vllm_v1.max_model_len"
            if policy == "vllm_v1"
            else "scheduler.max_request_tokens"
        )
        out[f"replica.{key}"] = raw["@context_length"]
    page = raw.get("@page_size", 16)
    if policy == "sglang":
        out[f"{sched}.sglang.page_size"] = page
        if "@max_running_requests" in raw:
            out[f"{sched}.sglang.max_running_requests"] = raw["@max_running_requests"] // dp
        if "@chunked_prefill_size" in raw:
            out[f"{sched}.sglang.chunked_prefill_size"] = raw["@chunked_prefill_size"] // dp
        if "@max_total_tokens" in raw:
            out[f"{sched}.sglang.num_pages"] = raw["@max_total_tokens"] // page
        if "@cuda_graph_bs" in raw:
            out[f"{sched}.sglang.cuda_graph_bs"] = raw["@cuda_graph_bs"]
        return out
    v = f"{sched}.vllm_v1"
    out[f"{v}.block_size"] = page
    if "@max_running_requests" in raw:
        out[f"{v}.max_num_seqs"] = raw["@max_running_requests"] // dp
    chunk = raw.get("@chunked_prefill_size")
    out[f"{v}.enable_chunked_prefill"] = chunk != -1
    if "@max_prefill_tokens" in raw:
        out[f"{v}.max_num_batched_tokens"] = raw["@max_prefill_tokens"]
    if "@max_total_tokens" in raw:
        out[f"{v}.num_blocks"] = raw["@max_total_tokens"] // page
    out[f"{v}.enable_prefix_caching"] = not raw.get("--disable-radix-cache", False)
    out[f"{v}.policy"] = "priority" if raw.get("--enable-priority-scheduling") else "fcfs"
    return out
