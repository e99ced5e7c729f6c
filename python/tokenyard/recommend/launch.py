"""Launch lines for a simulated deployment: the ``vllm serve`` (vLLM 0.33) and
``python -m sglang.launch_server`` (SGLang 0.5.23) commands that realise a tokenyard
simulation config, the parsers that read them back into the config keys they came from,
and the TOML file that reproduces the simulation (``launch_parse`` reads the commands back).

Invariant: every setting of the config is either a flag of the command, which
``parse_vllm_command`` / ``parse_sglang_command`` read back to the same value, or a
``#`` note above the command naming the key (settings with no flag are never dropped
silently). Flag names are the engines' own, checked against vLLM 0.33's
``vllm/engine/arg_utils.py`` (``EngineArgs.add_cli_args``) and SGLang 0.5.23's
``sglang/srt/arg_groups/fields/*.py`` (one dataclass field per flag).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shlex
from collections.abc import Mapping
from typing import Any

from tokenyard._checks import fail
from tokenyard.errors import ConfigError
from tokenyard.simulation.config import SimulationConfig, config_document
from tokenyard.simulation.scheduler_config import SGLANG_GRAPH_SIZES, default_vllm_v1

__all__ = [
    "LaunchCommand",
    "config_toml",
    "hf_model_id",
    "launch_script",
    "sglang_commands",
    "vllm_commands",
]

FRAMEWORKS = ("vllm", "sglang")

#: tokenyard KV dtype -> vLLM ``--kv-cache-dtype`` (``vllm/config/cache.py``, ``CacheDType``).
VLLM_KV_DTYPES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp8": "fp8",
    "fp8_e4m3": "fp8_e4m3",
    "fp8_e5m2": "fp8_e5m2",
}
#: tokenyard KV dtype -> SGLang ``--kv-cache-dtype`` (``fields/model.py``: no plain
#: ``fp8`` and no fp16 choice; SGLang's FP8 KV is e4m3 unless told e5m2).
SGLANG_KV_DTYPES = {
    "bf16": "bf16",
    "fp8": "fp8_e4m3",
    "fp8_e4m3": "fp8_e4m3",
    "fp8_e5m2": "fp8_e5m2",
}
#: tokenyard weight dtype -> ``--dtype`` (the same choices in both engines).
WEIGHT_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
#: Speculative methods: tokenyard -> SGLang's ``--speculative-algorithm``. SGLang runs an
#: MTP head as NEXTN and a separate draft model as STANDALONE.
SGLANG_SPEC = {"mtp": "NEXTN", "eagle": "EAGLE", "draft_model": "STANDALONE", "ngram": "NGRAM"}
_HF_SOURCE = re.compile(r"huggingface\.co/([^/]+/[^/]+)/")


@dataclasses.dataclass(frozen=True)
class LaunchCommand:
    """One server command and how many to run: ``role`` is ``aggregated``, ``prefill``
    or ``decode``; ``notes`` the settings no flag carries (each names its config key)."""

    framework: str
    role: str
    num_instances: int
    gpus_per_instance: int
    device: str
    argv: tuple[str, ...]
    notes: tuple[str, ...]

    def text(self) -> str:
        """The notes as ``#`` lines, then the command (one shell line)."""
        head = (
            f"# {self.role}: {self.num_instances} instance(s) of {self.gpus_per_instance} x "
            f"{self.device} GPU(s)"
        )
        return "\n".join([head, *(f"# {n}" for n in self.notes), shlex.join(self.argv)])


def hf_model_id(name: str) -> str:
    """The checkpoint a server loads for ``replica.model``: an HF id stays as it is, a
    ``config.json`` path becomes its folder, a catalog name the HF id its ``source`` names.

    Raises:
        ConfigError: a catalog model without a Hugging Face source (field ``replica.model``).
    """
    if name.endswith(".json"):
        return name.rsplit("/", 1)[0] if "/" in name else "."
    if "/" in name:
        return name
    from tokenyard import catalog

    spec = catalog.model(name, field="replica.model")
    match = _HF_SOURCE.search(spec.source)
    if match is None:
        raise fail(
            "replica.model",
            f"the catalog entry names no Hugging Face checkpoint (source {spec.source!r}); "
            "give replica.model as an HF id or a config.json path",
            name,
        )
    return match.group(1)


def _gpus(tp: int, pp: int, dp: int) -> int:
    return tp * pp * dp


def _scheduler_check(config: SimulationConfig, framework: str) -> None:
    policy = config.replica.scheduler.policy
    allowed = ("vllm_v1",) if framework == "vllm" else ("vllm_v1", "sglang")
    if policy not in allowed:
        raise fail(
            "replica.scheduler.policy",
            f"a {framework} launch line realises the {' or '.join(allowed)} scheduler; the "
            f"simulated {policy!r} scheduler is not what {framework} runs",
            policy,
        )


def _shared_notes(config: SimulationConfig) -> list[str]:
    """Settings of the whole simulation that no server flag carries."""
    r, c = config.replica, config.cluster
    notes = [
        f"cluster.global_scheduler.policy = {c.global_scheduler.policy!r}: route requests "
        "over the instances with a router of that policy (no server flag)",
        f"execution.model = {config.execution.model!r}: how the simulation priced batches",
    ]
    router = c.global_scheduler
    if router.balance is not None or router.options:
        notes.append(
            f"cluster.global_scheduler.balance / options ({router.balance}, "
            f"{dict(router.options)}): the router's own settings"
        )
    if c.kv_transfer is not None:
        notes.append(
            "cluster.kv_transfer: the link figures the simulation assumed between the pools "
            "(the cluster's network, not a flag)"
        )
    if r.scheduler.policy_plugin is not None:
        notes.append(
            f"replica.scheduler.policy_plugin = {r.scheduler.policy_plugin!r}: a simulated "
            "ordering plugin; no engine flag runs it"
        )
    if r.lora is not None:
        notes.append(
            f"replica.lora (rank {r.lora.rank or r.lora.max_lora_rank}, lora_dtype "
            f"{r.lora.lora_dtype!r}, links {r.lora.host_to_device_gbps} / {r.lora.disk_gbps} "
            "GB/s): the adapters' and the host's own, not flags"
        )
    if r.over_length != "error":
        notes.append(f"replica.over_length = {r.over_length!r}: no server flag")
    if r.kv_offload is not None:
        notes.append(
            f"replica.kv_offload (host_memory_gb = {r.kv_offload.host_memory_gb}): a host KV "
            "tier; configure the engine's offloading connector by hand"
        )
    if r.quantization == "none":
        notes.append("replica.quantization = 'none': serve the unquantized checkpoint")
    elif r.quantization not in ("auto", "fp8"):
        notes.append(
            f"replica.quantization = {r.quantization!r}: serve a {r.quantization} checkpoint "
            "(the engine reads its quantization_config; no flag needed)"
        )
    if r.dtype not in ("auto", *WEIGHT_DTYPES):
        notes.append(
            f"replica.dtype = {r.dtype!r}: no --dtype choice; it comes from the checkpoint"
        )
    spec = r.speculative
    if spec.enabled:
        acceptance = spec.acceptance_rate or spec.acceptance_rates or spec.accepted_distribution
        notes.append(
            f"replica.speculative acceptance {acceptance}: a property of the drafter and the "
            "traffic, not a flag"
        )
    return notes


def _vllm_scheduler(argv: list[str], notes: list[str], s: Any, where: str, dp: int) -> None:
    """vLLM's scheduler flags for a ``vllm_v1`` section (``tokenyard.sched.SchedulerConfig``)."""
    default = default_vllm_v1()
    if s.max_num_seqs == 0:
        notes.append(f"{where}.max_num_seqs = 0 (unbounded): vLLM needs a cap; none is passed")
    else:
        argv += ["--max-num-seqs", str(s.max_num_seqs)]
    argv += ["--max-num-batched-tokens", str(s.max_num_batched_tokens)]
    argv.append(
        "--enable-chunked-prefill" if s.enable_chunked_prefill else "--no-enable-chunked-prefill"
    )
    argv.append(
        "--enable-prefix-caching" if s.enable_prefix_caching else "--no-enable-prefix-caching"
    )
    argv += ["--block-size", str(s.block_size)]
    if s.num_blocks:
        argv += ["--num-gpu-blocks-override", str(s.num_blocks)]
    if s.long_prefill_token_threshold:
        argv += ["--long-prefill-token-threshold", str(s.long_prefill_token_threshold)]
    if s.long_prefill_token_threshold_adaptive:
        argv.append("--long-prefill-token-threshold-adaptive")
    if s.policy == "priority":
        argv += ["--scheduling-policy", "priority"]
    if s.enable_prefix_caching and s.prefix_cache != "block_hash":
        notes.append(f"{where}.prefix_cache = {s.prefix_cache!r}: vLLM caches by block hash only")
    for name in (
        "prioritize_prefill",
        "priority_ties",
        "pad_spec_decode",
        "cache_accepted_drafts",
        "scheduler_reserve_full_isl",
        "reserve_null_block",
        "prefill_schedule_interval",
    ):
        if getattr(s, name) != getattr(default, name):
            notes.append(
                f"{where}.{name} = {getattr(s, name)!r}: simulated behaviour that differs from "
                "vLLM 0.33's; no flag makes vLLM do it"
            )
    if dp > 1:
        notes.append(f"each of the {dp} data-parallel ranks has its own scheduler with these caps")


def vllm_commands(config: SimulationConfig) -> list[LaunchCommand]:
    """The ``vllm serve`` command(s): one aggregated, or a prefill and a decode pool
    joined by NixlConnector (``kv_producer`` / ``kv_consumer``, as vLLM 0.33's
    ``NixlConnector.__init__`` asks; ``kv_both`` is deprecated there).

    Raises:
        ConfigError: the simulated scheduler is not vLLM's (``replica.scheduler.policy``),
            or the model has no HF checkpoint to name.
    """
    _scheduler_check(config, "vllm")
    r, c = config.replica, config.cluster
    model = hf_model_id(config.model_name())
    base = ["vllm", "serve", model, *_weight_flags(r)]
    notes = _shared_notes(config)
    if r.kv_cache_dtype in VLLM_KV_DTYPES:
        base += ["--kv-cache-dtype", VLLM_KV_DTYPES[r.kv_cache_dtype]]
    elif r.kv_cache_dtype != "auto":
        notes.append(f"replica.kv_cache_dtype = {r.kv_cache_dtype!r}: vLLM has no such KV dtype")
    limit = r.scheduler.vllm_v1.max_model_len or r.scheduler.max_request_tokens
    if limit:
        base += ["--max-model-len", str(limit)]
    spec = r.speculative
    if spec.enabled:
        body: dict[str, Any] = {
            "method": spec.method,
            "num_speculative_tokens": spec.num_speculative_tokens,
        }
        if spec.method == "draft_model" and spec.draft_model:
            body["model"] = hf_model_id(spec.draft_model)
        if spec.method == "eagle":
            notes.append(
                "replica.speculative.method = 'eagle': add the EAGLE head's checkpoint as \"model\""
            )
        base += ["--speculative-config", json.dumps(body, separators=(",", ":"))]
    if r.lora is not None:
        base += _lora_flags(r.lora, "--max-loras")
        if r.lora.max_cpu_loras:
            base += ["--max-cpu-loras", str(r.lora.max_cpu_loras)]
    out: list[LaunchCommand] = []
    prefill = [*base, *_vllm_layout_flags(r)]
    first_notes = list(notes)
    dp = r.data_parallel_size
    _vllm_scheduler(prefill, first_notes, r.scheduler.vllm_v1, "replica.scheduler.vllm_v1", dp)
    decode = c.decode
    role = "aggregated" if decode is None else "prefill"
    if decode is not None:
        prefill += ["--kv-transfer-config", _nixl("kv_producer")]
    out.append(_command("vllm", role, c.num_replicas, r, prefill, first_notes))
    if decode is not None:
        d = decode.resolve(r)  # the decode pool's layout, unset keys the replica's
        argv = [*base, *_vllm_layout_flags(d)]
        ddp = d.data_parallel_size
        dnotes = _decode_notes(decode, [])
        sched = decode.scheduler.vllm_v1 if decode.scheduler is not None else r.scheduler.vllm_v1
        _vllm_scheduler(argv, dnotes, sched, "cluster.decode.scheduler.vllm_v1", ddp)
        argv += ["--kv-transfer-config", _nixl("kv_consumer")]
        out.append(_command("vllm", "decode", decode.num_replicas, d, argv, dnotes))
    return out


def _command(
    framework: str, role: str, num_replicas: int, pool: Any, argv: list[str], notes: list[str]
) -> LaunchCommand:
    """One pool's command; ``pool`` is its layout (the replica, or the resolved decode pool)."""
    gpus = _gpus(pool.tensor_parallel_size, pool.num_pipeline_stages, pool.data_parallel_size)
    return LaunchCommand(
        framework, role, num_replicas, gpus, pool.device, tuple(argv), tuple(notes)
    )


def _weight_flags(r: Any) -> list[str]:
    """``--dtype`` and ``--quantization``, spelled alike by vLLM and SGLang; ``fp8`` is the
    engine's online FP8 of a 16-bit checkpoint."""
    flags: list[str] = []
    if r.dtype in WEIGHT_DTYPES:
        flags += ["--dtype", WEIGHT_DTYPES[r.dtype]]
    if r.quantization == "fp8":
        flags += ["--quantization", "fp8"]
    return flags


def _lora_flags(lora: Any, max_loras_flag: str) -> list[str]:
    """LoRA on, with the adapters per batch under ``max_loras_flag`` (vLLM ``--max-loras``,
    SGLang ``--max-loras-per-batch``) and ``--max-lora-rank``."""
    return [
        "--enable-lora",
        max_loras_flag,
        str(lora.max_loras),
        "--max-lora-rank",
        str(lora.max_lora_rank),
    ]


def _layout(pool: Any) -> tuple[int, int, int, int]:
    """A pool's (TP, PP, DP, EP) sizes."""
    return (
        pool.tensor_parallel_size,
        pool.num_pipeline_stages,
        pool.data_parallel_size,
        pool.expert_parallel_size,
    )


def _vllm_layout_flags(pool: Any) -> list[str]:
    """A pool's (the replica's, or the resolved decode pool's) parallel layout and memory
    share as vLLM flags."""
    tp, pp, dp, ep = _layout(pool)
    flags = ["--tensor-parallel-size", str(tp), "--pipeline-parallel-size", str(pp)]
    if dp > 1:
        flags += ["--data-parallel-size", str(dp)]
    if ep > 1:
        flags.append("--enable-expert-parallel")
    return [*flags, "--gpu-memory-utilization", _fraction(1 - pool.memory_margin_fraction)]


def _sglang_layout_flags(pool: Any) -> list[str]:
    """As ``_vllm_layout_flags`` for SGLang: ``--tp-size`` counts every GPU of the attention
    DP group."""
    tp, pp, dp, ep = _layout(pool)
    flags = ["--tp-size", str(tp * dp), "--pp-size", str(pp)]
    if dp > 1:
        flags += ["--attn-dp-size", str(dp)]
    if ep > 1:
        flags += ["--ep-size", str(ep)]
    return [*flags, "--mem-fraction-static", _fraction(1 - pool.memory_margin_fraction)]


def _decode_notes(decode: Any, layout_notes: list[str]) -> list[str]:
    """A decode pool's notes: its router, ``layout_notes``, then its host KV tier if any."""
    notes = [
        f"cluster.decode.global_scheduler.policy = {decode.global_scheduler.policy!r}: "
        "route prefilled requests to decode instances with it",
        *layout_notes,
    ]
    if decode.kv_offload is not None:
        notes.append(
            "cluster.decode.kv_offload: a host KV tier; configure the engine's offloading "
            "connector by hand"
        )
    return notes


def _nixl(role: str) -> str:
    return json.dumps({"kv_connector": "NixlConnector", "kv_role": role}, separators=(",", ":"))


def _fraction(value: float) -> str:
    return f"{value:.6g}"


def _sglang_scheduler(
    argv: list[str], notes: list[str], config: SimulationConfig, sched: Any, where: str, dp: int
) -> None:
    """SGLang's scheduler flags. Under attention DP SGLang divides ``--max-running-requests``
    and ``--chunked-prefill-size`` by the DP size (``model_executor/pool_configurator.py``,
    ``arg_groups/parallel_hook.py``'s ``_handle_data_parallelism``), so they are given
    times DP for each rank to get the simulated cap."""
    if sched.policy == "sglang":
        s = sched.sglang
        argv += ["--max-running-requests", str(s.max_running_requests * dp)]
        argv += ["--chunked-prefill-size", str(s.chunked_prefill_size * dp)]
        argv += ["--page-size", str(s.page_size)]
        if s.num_pages:
            argv += ["--max-total-tokens", str(s.num_pages * s.page_size)]
        if tuple(s.cuda_graph_bs) != SGLANG_GRAPH_SIZES:
            argv += ["--cuda-graph-bs-decode", *map(str, s.cuda_graph_bs)]
        argv += ["--schedule-policy", "fcfs"]
        return
    v = sched.vllm_v1
    notes.append(
        f"{where}: simulated with vLLM's scheduler (vllm_v1); SGLang schedules prefill and "
        "decode batches apart, so its figures will differ"
    )
    if v.max_num_seqs == 0:
        notes.append(f"{where}.max_num_seqs = 0 (unbounded): no --max-running-requests passed")
    else:
        argv += ["--max-running-requests", str(v.max_num_seqs * dp)]
    if v.enable_chunked_prefill:
        argv += ["--chunked-prefill-size", str(v.max_num_batched_tokens * dp)]
    else:
        argv += ["--chunked-prefill-size", "-1"]
    argv += ["--max-prefill-tokens", str(v.max_num_batched_tokens)]
    argv += ["--page-size", str(v.block_size)]
    if v.num_blocks:
        argv += ["--max-total-tokens", str(v.num_blocks * v.block_size)]
    if not v.enable_prefix_caching:
        argv.append("--disable-radix-cache")
    elif v.prefix_cache != "radix":
        notes.append(f"{where}.prefix_cache = 'block_hash': SGLang caches prefixes in a radix tree")
    if v.policy == "priority":
        # vLLM (and the simulation) serve the lowest priority value first; SGLang the
        # highest unless told (fields/schedule.py, schedule_low_priority_values_first).
        argv += ["--enable-priority-scheduling", "--schedule-low-priority-values-first"]
    argv += ["--schedule-policy", "fcfs"]


def _sglang_dp_without_ep_note(where: str, dp: int) -> str:
    """Attention DP without ``--ep-size``: SGLang runs the experts TP over every GPU, as
    simulated, but gathers the DP ranks' tokens with its own collectives."""
    return (
        f"{where}.data_parallel_size = {dp} without expert parallelism: SGLang runs the "
        "experts as TP over all --tp-size GPUs, as simulated, but gathers the DP ranks' "
        "tokens its own way (sglang/srt/layers/dp_attention.py: dp_gather, an all-reduce or "
        "a reduce-scatter and all-gather over the whole TP group); the simulation priced "
        "vLLM 0.33's all-gather and reduce-scatter over the DP ranks"
    )


def sglang_commands(config: SimulationConfig) -> list[LaunchCommand]:
    """The ``python -m sglang.launch_server`` command(s). Attention DP is SGLang 0.5.23's
    ``--attn-dp-size`` (``--dp-size N --enable-dp-attention`` is its deprecated spelling),
    whose ``--tp-size`` counts every GPU of the group (``tp_size % attn_dp_size == 0``).
    P/D: ``--disaggregation-mode prefill|decode`` over NIXL.

    Raises:
        ConfigError: the simulated scheduler is neither ``vllm_v1`` nor ``sglang``.
    """
    _scheduler_check(config, "sglang")
    r, c = config.replica, config.cluster
    notes = _shared_notes(config)
    base = [
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        hf_model_id(config.model_name()),
    ]
    base += _weight_flags(r)
    if r.kv_cache_dtype in SGLANG_KV_DTYPES:
        base += ["--kv-cache-dtype", SGLANG_KV_DTYPES[r.kv_cache_dtype]]
        if r.kv_cache_dtype == "fp8":
            notes.append("replica.kv_cache_dtype = 'fp8': SGLang's FP8 KV is fp8_e4m3")
    elif r.kv_cache_dtype != "auto":
        notes.append(f"replica.kv_cache_dtype = {r.kv_cache_dtype!r}: SGLang has no such KV dtype")
    limit = (
        r.scheduler.vllm_v1.max_model_len if r.scheduler.policy == "vllm_v1" else 0
    ) or r.scheduler.max_request_tokens
    if limit:
        base += ["--context-length", str(limit)]
    spec = r.speculative
    if spec.enabled and spec.method is not None and spec.num_speculative_tokens is not None:
        k = spec.num_speculative_tokens
        base += ["--speculative-algorithm", SGLANG_SPEC[spec.method]]
        if spec.method != "ngram":
            # A chain of k drafts: k steps of top-1, k + 1 tokens verified.
            base += ["--speculative-num-steps", str(k), "--speculative-eagle-topk", "1"]
        else:
            # SGLang's NGRAM derives steps and top-k itself (speculative_hook.py,
            # _handle_ngram: top-k is --speculative-ngram-max-bfs-breadth).
            notes.append(
                "replica.speculative.method = 'ngram': SGLang verifies a tree of "
                "--speculative-num-draft-tokens; the simulation's chain of k drafts is k + 1"
            )
        base += ["--speculative-num-draft-tokens", str(k + 1)]
        if spec.method == "draft_model" and spec.draft_model:
            base += ["--speculative-draft-model-path", hf_model_id(spec.draft_model)]
        if spec.method == "eagle":
            notes.append("replica.speculative.method = 'eagle': add --speculative-draft-model-path")
    if r.lora is not None:
        base += _lora_flags(r.lora, "--max-loras-per-batch")
        if r.lora.max_cpu_loras:
            notes.append(
                f"replica.lora.max_cpu_loras = {r.lora.max_cpu_loras}: SGLang has no cap on "
                "adapters cached on the host"
            )
    dp, ep = r.data_parallel_size, r.expert_parallel_size
    first = [*base, *_sglang_layout_flags(r)]
    first_notes = list(notes)
    if dp > 1 and ep == 1:
        first_notes.append(_sglang_dp_without_ep_note("replica", dp))
    _sglang_scheduler(first, first_notes, config, r.scheduler, "replica.scheduler", dp)
    decode = c.decode
    if decode is not None:
        first += ["--disaggregation-mode", "prefill", "--disaggregation-transfer-backend", "nixl"]
    role = "aggregated" if decode is None else "prefill"
    out = [_command("sglang", role, c.num_replicas, r, first, first_notes)]
    if decode is not None:
        d = decode.resolve(r)  # the decode pool's layout, unset keys the replica's
        ddp = d.data_parallel_size
        argv = [*base, *_sglang_layout_flags(d)]
        dp_note = ddp > 1 and d.expert_parallel_size == 1
        dnotes = _decode_notes(
            decode, [_sglang_dp_without_ep_note("cluster.decode", ddp)] if dp_note else []
        )
        sched = decode.scheduler if decode.scheduler is not None else r.scheduler
        _sglang_scheduler(argv, dnotes, config, sched, "cluster.decode.scheduler", ddp)
        argv += ["--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "nixl"]
        out.append(_command("sglang", "decode", decode.num_replicas, d, argv, dnotes))
    return out


def launch_script(config: SimulationConfig, framework: str) -> str:
    """A shell script: a header, then each pool's notes and command.

    Raises:
        ConfigError: ``framework`` is not ``vllm`` or ``sglang``, or the config cannot be
            launched on it (see ``vllm_commands`` / ``sglang_commands``).
    """
    if framework not in FRAMEWORKS:
        raise ConfigError(
            f"framework: must be one of {', '.join(FRAMEWORKS)}, got {framework!r}",
            field="framework",
            value=framework,
        )
    commands = vllm_commands(config) if framework == "vllm" else sglang_commands(config)
    version = "vLLM 0.33" if framework == "vllm" else "SGLang 0.5.23"
    header = [
        "#!/usr/bin/env bash",
        f"# {version} launch lines for a tokenyard-simulated deployment (tokenyard recommend).",
        "# Lines starting with '#' are settings no flag carries; run each command on its own GPUs.",
    ]
    return "\n".join(header + [cmd.text() for cmd in commands]) + "\n"


# ---- the tokenyard config ------------------------------------------------------------


def config_toml(config: SimulationConfig) -> str:
    """``config`` as a TOML document (every default filled in, ``base_dir`` absolute):
    ``tokenyard simulate`` on it reruns the same simulation. Unset (``None``) keys are left
    out, which reads back as unset."""
    document = config_document(config)
    lines: list[str] = ["# tokenyard simulation config (written by tokenyard recommend)"]
    _toml_table(lines, [], document)
    return "\n".join(lines) + "\n"


def _toml_table(lines: list[str], path: list[str], table: Mapping[str, Any]) -> None:
    scalars = [(k, v) for k, v in table.items() if v is not None and not isinstance(v, Mapping)]
    tables = [(k, v) for k, v in table.items() if isinstance(v, Mapping)]
    if path and (scalars or not tables):
        lines.append("")
        lines.append(f"[{'.'.join(_toml_key(p) for p in path)}]")
    for key, value in scalars:
        lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    for key, value in tables:
        _toml_table(lines, [*path, key], value)


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, Mapping):
        inner = ", ".join(
            f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items() if v is not None
        )
        return "{" + inner + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise ConfigError(
        f"config: {type(value).__name__} has no TOML form", field="config", value=repr(value)
    )
