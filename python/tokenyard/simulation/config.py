"""The simulation's configuration: frozen dataclasses, built from a TOML/YAML file or a
mapping, with every unknown key and bad value reported by its full key path.

Layout (every section and key optional; see ``docs/simulate.md``)::

    seed = 0
    catalog = ["my_gpus.toml"]  # extra models and GPUs (docs/catalog.md)
    [cluster]                 num_replicas, global_scheduler = {policy, balance}
    [replica]                 model, device, tensor_parallel_size, num_pipeline_stages,
                              memory_margin_fraction, scheduler = {...}
    [execution]               model = "auto" | "measured" | "roofline" | "linear" | "profiled"
                              | "module:callable", linear coefficients, efficiency = {...},
                              cpu = {...}, measured = {system, framework, version, data_dir},
                              profiled = {profiles, regressor, ...}
    [workload]                see tokenyard.workload.load_workload
    [metrics]                 sample_interval_s, record_stages, slo_ttft_s, slo_tpot_s
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tokenyard._checks import (
    build_dataclass,
    check_key_choice,
    check_key_int,
    check_key_number,
    fail,
    read_document,
    toml_module,
)
from tokenyard.errors import ConfigError
from tokenyard.predictor.profiled import TrainingOptions
from tokenyard.predictor.roofline import CpuOverheads, Efficiencies
from tokenyard.sched import SchedulerConfig
from tokenyard.simulation.planner import dtype_bytes

__all__ = [
    "ClusterConfig",
    "ExecutionConfig",
    "GlobalSchedulerConfig",
    "MeasuredConfig",
    "MetricsConfig",
    "PluginSchedulerConfig",
    "ProfiledConfig",
    "ReplicaConfig",
    "ReplicaSchedulerConfig",
    "SglangSchedulerConfig",
    "SimulationConfig",
    "VidurSchedulerConfig",
    "apply_overrides",
    "config_document",
    "config_from_mapping",
    "default_workload",
    "load_config",
    "parse_set_options",
    "read_config_file",
]

from tokenyard import _core

#: The built-in policies, from the registry in the Rust core.
GLOBAL_POLICIES: tuple[str, ...] = tuple(_core.GLOBAL_POLICIES)
REPLICA_POLICIES: tuple[str, ...] = tuple(_core.REPLICA_POLICIES)

#: Size limits: nothing the simulator allocates grows past these.
MAX_REPLICAS = 4096
MAX_TOKENS = 2**24  # one request's tokens, a batch's token budget
MAX_BLOCKS = 2**26  # KV blocks of one replica
MAX_BLOCK_SIZE = 2**16


def _fail(where: str, message: str, value: object) -> ConfigError:
    return fail(where, message, value)


@dataclasses.dataclass(frozen=True, kw_only=True)
class GlobalSchedulerConfig:
    """``policy``: one of the built-in routers or ``"module:Class"`` (a plugin, built with
    ``options`` as keyword arguments)."""

    policy: str = "round_robin"
    #: prefix_affinity: queued prefill tokens one cached token is worth.
    balance: float = 1.0
    #: A plugin's own options (``module:Class`` policies only).
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def check(self, where: str) -> None:
        _check_policy(f"{where}.policy", self.policy, GLOBAL_POLICIES)
        check_key_number(f"{where}.balance", self.balance, low=0, high=1e9)
        if self.options and ":" not in self.policy:
            raise _fail(
                f"{where}.options",
                f"applies to plugin policies ('module:Class'), not {self.policy!r}",
                dict(self.options),
            )


def _check_policy(where: str, policy: str, names: tuple[str, ...]) -> None:
    if policy not in names and ":" not in policy:
        raise _fail(
            where,
            f"must be one of {', '.join(names)} or 'module:Class', got {policy!r}",
            policy,
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    num_replicas: int = 4
    global_scheduler: GlobalSchedulerConfig = dataclasses.field(
        default_factory=GlobalSchedulerConfig
    )

    def check(self, where: str) -> None:
        check_key_int(f"{where}.num_replicas", self.num_replicas, low=1, high=MAX_REPLICAS)
        self.global_scheduler.check(f"{where}.global_scheduler")


@dataclasses.dataclass(frozen=True, kw_only=True)
class VidurSchedulerConfig:
    """Vidur's knobs, shared by its five schedulers (``vllm``, ``sarathi``, ``orca``,
    ``lightllm``, ``faster_transformer``) under Vidur's names."""

    block_size: int = 16
    #: KV blocks per replica; 0 = from the memory planner.
    num_blocks: int = 0
    #: Requests holding memory at once.
    batch_size_cap: int = 128
    watermark_blocks_fraction: float = 0.01
    #: vllm / lightllm: (padded) tokens in a prefill batch.
    max_tokens_in_batch: int = 4096
    #: sarathi: token budget per batch.
    chunk_size: int = 512
    #: lightllm: decode batches before a waiting prefill runs.
    max_waiting_iters: int = 10
    #: vllm / sarathi: a preempted request restarts as "recompute" (its whole prompt) or as
    #: "vidur" (Vidur 0.0.26: only the prompt tokens processed so far; docs/simulate.md).
    restart: str = "recompute"

    def check(self, where: str) -> None:
        check_key_choice(f"{where}.restart", self.restart, ("recompute", "vidur"))
        check_key_int(f"{where}.block_size", self.block_size, low=1, high=MAX_BLOCK_SIZE)
        check_key_int(f"{where}.num_blocks", self.num_blocks, low=0, high=MAX_BLOCKS)
        for name in ("batch_size_cap", "max_tokens_in_batch", "chunk_size"):
            check_key_int(f"{where}.{name}", getattr(self, name), low=1, high=MAX_TOKENS)
        check_key_int(f"{where}.max_waiting_iters", self.max_waiting_iters, low=0, high=MAX_TOKENS)
        check_key_number(
            f"{where}.watermark_blocks_fraction", self.watermark_blocks_fraction, low=0, high=0.99
        )


#: SGLang's default CUDA-graph batch sizes (decode batches are padded up to one).
SGLANG_GRAPH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 256)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SglangSchedulerConfig:
    """SGLang's knobs, under SGLang's names."""

    page_size: int = 16
    #: KV pages per replica; 0 = from the memory planner.
    num_pages: int = 0
    max_running_requests: int = 256
    #: Extend (prefill) tokens per prefill batch.
    chunked_prefill_size: int = 2048
    #: Decode batches are padded up to these sizes for their cost.
    cuda_graph_bs: tuple[int, ...] = SGLANG_GRAPH_SIZES

    def check(self, where: str) -> None:
        check_key_int(f"{where}.page_size", self.page_size, low=1, high=MAX_BLOCK_SIZE)
        check_key_int(f"{where}.num_pages", self.num_pages, low=0, high=MAX_BLOCKS)
        for name in ("max_running_requests", "chunked_prefill_size"):
            check_key_int(f"{where}.{name}", getattr(self, name), low=1, high=MAX_TOKENS)
        sizes = self.cuda_graph_bs
        if any(s < 1 or s > MAX_TOKENS for s in sizes) or list(sizes) != sorted(set(sizes)):
            raise _fail(
                f"{where}.cuda_graph_bs",
                f"must be increasing ints in [1, {MAX_TOKENS}], got {list(sizes)}",
                sizes,
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class PluginSchedulerConfig:
    """A ``module:Class`` replica policy: the memory it is told it has, and its own
    options (keyword arguments of its constructor)."""

    block_size: int = 16
    #: 0 = from the memory planner.
    num_blocks: int = 0
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def check(self, where: str) -> None:
        check_key_int(f"{where}.block_size", self.block_size, low=1, high=MAX_BLOCK_SIZE)
        check_key_int(f"{where}.num_blocks", self.num_blocks, low=0, high=MAX_BLOCKS)


def default_vllm_v1() -> SchedulerConfig:
    """The simulator's ``vllm_v1`` section: vLLM's defaults for online serving, with the KV
    blocks (``num_blocks = 0``) and ``max_model_len = 0`` (``max_request_tokens``) taken
    from the replica."""
    return SchedulerConfig(max_num_batched_tokens=2048, num_blocks=0, max_model_len=0)


#: The one-level (legacy) keys of ``[replica.scheduler]`` and, per section, the key each
#: becomes. A key the selected policy's section lacks is refused, never ignored.
LEGACY_KEYS: dict[str, dict[str, str]] = {
    "block_size": {
        "vidur": "block_size",
        "vllm_v1": "block_size",
        "sglang": "page_size",
        "plugin": "block_size",
    },
    "num_blocks": {
        "vidur": "num_blocks",
        "vllm_v1": "num_blocks",
        "sglang": "num_pages",
        "plugin": "num_blocks",
    },
    "batch_size_cap": {"vidur": "batch_size_cap"},
    "watermark_blocks_fraction": {"vidur": "watermark_blocks_fraction"},
    "max_tokens_in_batch": {"vidur": "max_tokens_in_batch"},
    "chunk_size": {"vidur": "chunk_size"},
    "max_waiting_iters": {"vidur": "max_waiting_iters"},
    "restart": {"vidur": "restart"},
    "max_num_batched_tokens": {
        "vllm_v1": "max_num_batched_tokens",
        "sglang": "chunked_prefill_size",
    },
    "max_num_seqs": {"vllm_v1": "max_num_seqs", "sglang": "max_running_requests"},
    "long_prefill_token_threshold": {"vllm_v1": "long_prefill_token_threshold"},
    "enable_chunked_prefill": {"vllm_v1": "enable_chunked_prefill"},
    "enable_prefix_caching": {"vllm_v1": "enable_prefix_caching"},
    "prefix_cache": {"vllm_v1": "prefix_cache"},
    "scheduling_policy": {"vllm_v1": "policy"},
    "graph_batch_sizes": {"sglang": "cuda_graph_bs"},
}


def policy_section(policy: str) -> str:
    """The config section of a replica policy: ``vllm_v1``, ``vidur``, ``sglang`` or
    ``plugin``."""
    if ":" in policy:
        return "plugin"
    return str(_core.REPLICA_POLICIES[policy]["section"])


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReplicaSchedulerConfig:
    """The replica scheduler: ``policy`` (a name in the core's registry, or
    ``"module:Class"``), the longest request, and one section per engine in that engine's
    own words. Only the selected policy's section is used; the others are inert."""

    policy: str = "vllm_v1"
    #: Longest request (prompt + output): the planner sizes batches for it, orca and
    #: faster_transformer reserve it, vllm_v1 uses it as max_model_len unless set.
    max_request_tokens: int = 8192
    #: ``tokenyard.sched.SchedulerConfig`` itself (``docs/embedding.md``).
    vllm_v1: SchedulerConfig = dataclasses.field(default_factory=default_vllm_v1)
    #: vllm_v1: a ``"module:Class"`` step-scheduler policy plugin (``order_waiting``,
    #: ``preemption_order``): the same class ``tokenyard.sched.Scheduler(plugin=...)``
    #: takes, built per replica with ``policy_plugin_options``.
    policy_plugin: str | None = None
    policy_plugin_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    vidur: VidurSchedulerConfig = dataclasses.field(default_factory=VidurSchedulerConfig)
    sglang: SglangSchedulerConfig = dataclasses.field(default_factory=SglangSchedulerConfig)
    plugin: PluginSchedulerConfig = dataclasses.field(default_factory=PluginSchedulerConfig)

    @property
    def section(self) -> str:
        return policy_section(self.policy)

    @property
    def block_size(self) -> int:
        """The selected policy's KV block (page) size."""
        section = self.section
        if section == "vllm_v1":
            return self.vllm_v1.block_size
        if section == "sglang":
            return self.sglang.page_size
        return int(getattr(self, section).block_size)

    @property
    def num_blocks(self) -> int:
        """The selected policy's KV blocks per replica (0: from the planner)."""
        section = self.section
        if section == "sglang":
            return self.sglang.num_pages
        return int(getattr(self, section).num_blocks)

    def check(self, where: str) -> None:
        _check_policy(f"{where}.policy", self.policy, REPLICA_POLICIES)
        check_key_int(
            f"{where}.max_request_tokens", self.max_request_tokens, low=2, high=MAX_TOKENS
        )
        self.vidur.check(f"{where}.vidur")
        self.sglang.check(f"{where}.sglang")
        self.plugin.check(f"{where}.plugin")
        self._check_vllm_v1(f"{where}.vllm_v1")
        if self.policy_plugin is not None and (
            self.policy != "vllm_v1" or ":" not in self.policy_plugin
        ):
            raise _fail(
                f"{where}.policy_plugin",
                f"must be 'module:Class' with policy = 'vllm_v1' (the step scheduler's plugin), "
                f"got {self.policy_plugin!r} with policy {self.policy!r}",
                self.policy_plugin,
            )
        if self.policy_plugin_options and self.policy_plugin is None:
            raise _fail(
                f"{where}.policy_plugin_options",
                "applies to a policy_plugin, and none is set",
                dict(self.policy_plugin_options),
            )
        if self.vidur.restart != "recompute" and self.policy in (
            "orca",
            "lightllm",
            "faster_transformer",
        ):
            raise _fail(
                f"{where}.vidur.restart",
                f"applies to vllm and sarathi (the policies that preempt), not {self.policy}, "
                f"which would ignore it",
                self.vidur.restart,
            )
        if self.policy == "lightllm" and self.vidur.block_size != 1:
            raise _fail(
                f"{where}.vidur.block_size",
                f"must be 1 for lightllm (it manages memory per token), "
                f"got {self.vidur.block_size}",
                self.vidur.block_size,
            )

    def _check_vllm_v1(self, where: str) -> None:
        c = self.vllm_v1
        check_key_int(f"{where}.block_size", c.block_size, low=1, high=MAX_BLOCK_SIZE)
        check_key_int(f"{where}.num_blocks", c.num_blocks, low=0, high=MAX_BLOCKS)
        check_key_int(f"{where}.max_model_len", c.max_model_len, low=0, high=MAX_TOKENS)
        check_key_int(
            f"{where}.max_num_batched_tokens", c.max_num_batched_tokens, low=1, high=MAX_TOKENS
        )
        check_key_int(f"{where}.max_num_seqs", c.max_num_seqs, low=0, high=MAX_TOKENS)
        unsupported = (
            ("async_scheduling", c.async_scheduling, False),
            ("max_loras", c.max_loras, 0),
            ("num_lookahead_tokens", c.num_lookahead_tokens, 0),
        )
        for name, value, default in unsupported:
            if value != default:
                raise _fail(
                    f"{where}.{name}",
                    f"is not simulated yet (it would change nothing); leave it at {default!r}, "
                    f"got {value!r}",
                    value,
                )


def translate_legacy_scheduler(mapping: Any, where: str) -> Any:
    """``[replica.scheduler]`` with its one-level keys (``max_num_seqs = 64``) moved into
    the selected policy's section (``vllm_v1.max_num_seqs = 64``). A key that section does
    not have would be ignored, so it is refused, saying where it belongs."""
    if not isinstance(mapping, Mapping):
        return mapping  # the typed reader reports it
    table = dict(mapping)
    policy = table.get("policy", ReplicaSchedulerConfig.policy)
    if not isinstance(policy, str):
        return table
    _check_policy(f"{where}.policy", policy, REPLICA_POLICIES)
    section = policy_section(policy)
    for key in [k for k in table if k in LEGACY_KEYS]:
        value = table.pop(key)
        target = LEGACY_KEYS[key].get(section)
        if target is None:
            owners = ", ".join(f"{where}.{s}.{k}" for s, k in LEGACY_KEYS[key].items())
            raise _fail(
                f"{where}.{key}",
                f"does not apply to the {policy} scheduler, which would ignore it; it is {owners}",
                value,
            )
        nested = table.setdefault(section, {})
        if not isinstance(nested, Mapping):
            continue  # the typed reader reports the bad section
        nested = table[section] = dict(nested)
        if target in nested:
            raise _fail(
                f"{where}.{key}",
                f"is given twice: here and as {where}.{section}.{target}; keep one",
                value,
            )
        nested[target] = value
    return table


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReplicaConfig:
    model: str = "llama-2-7b"
    device: str = "a100-80gb"
    tensor_parallel_size: int = 1
    num_pipeline_stages: int = 1
    memory_margin_fraction: float = 0.1
    #: Weights' data type (``bf16``, ``fp16``, ``fp32``, ``fp8``, ``int8``, ``int4``).
    dtype: str = "bf16"
    #: The KV cache's data type; ``auto`` is the compute dtype (the weights' if 16 or 32
    #: bits, else bf16).
    kv_cache_dtype: str = "auto"
    scheduler: ReplicaSchedulerConfig = dataclasses.field(default_factory=ReplicaSchedulerConfig)
    #: A request longer than a replica can ever serve: ``error`` stops the run naming it
    #: and the limiting setting; ``skip`` leaves it out and counts it in the summary.
    over_length: str = "error"

    def check(self, where: str) -> None:
        check_key_int(f"{where}.tensor_parallel_size", self.tensor_parallel_size, low=1, high=512)
        check_key_int(f"{where}.num_pipeline_stages", self.num_pipeline_stages, low=1, high=512)
        if not 0 <= self.memory_margin_fraction < 1:
            raise _fail(
                f"{where}.memory_margin_fraction",
                f"must be in [0, 1), got {self.memory_margin_fraction}",
                self.memory_margin_fraction,
            )
        dtype_bytes(self.dtype, self.kv_cache_dtype)  # names replica.dtype / .kv_cache_dtype
        self.scheduler.check(f"{where}.scheduler")
        check_key_choice(f"{where}.over_length", self.over_length, ("error", "skip"))
        policy = self.scheduler.policy
        pipelined = ":" in policy or _core.REPLICA_POLICIES[policy]["pipeline_parallel"]
        if self.num_pipeline_stages > 1 and not pipelined:
            raise _fail(
                f"{where}.num_pipeline_stages",
                f"the {policy} scheduler does not support pipeline parallelism "
                f"(num_pipeline_stages must be 1, got {self.num_pipeline_stages})",
                self.num_pipeline_stages,
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProfiledConfig:
    """The profiled predictor's inputs (``docs/predictor.md``): profile files or folders (our
    CSV format or Vidur's), relative to the config file; the regressor (``auto`` picks the
    lowest cross-validated error); where trained models are cached."""

    profiles: tuple[str, ...] = ()
    regressor: str = "auto"
    grid_points: int = 48
    folds: int = 5
    #: Folds and trees; apart from the simulation's seed, so a seed sweep keeps one model.
    seed: int = 0
    cache_dir: str | None = None

    def options(self) -> TrainingOptions:
        return TrainingOptions(
            regressor=self.regressor,
            grid_points=self.grid_points,
            folds=self.folds,
            seed=self.seed,
        )

    def check(self, where: str) -> None:
        self.options().check(where)


EXECUTION_MODELS = ("auto", "measured", "roofline", "linear", "profiled")
_LINEAR_FIELDS = (
    "constant_s",
    "per_prefill_token_s",
    "per_decode_token_s",
    "per_decode_context_token_s",
    "per_prefill_context_token_s",
    "cpu_overhead_s",
)
#: The linear model's coefficients when unset: rough figures for Llama-2-7B in fp16 on one
#: A100-80GB, whatever the replica's model and GPU (which is why it is never a default).
LINEAR_DEFAULTS = {
    "constant_s": 7e-3,
    "per_prefill_token_s": 7e-5,
    "per_decode_token_s": 3e-5,
    "per_decode_context_token_s": 2.5e-7,
    "per_prefill_context_token_s": 3e-11,
    "cpu_overhead_s": 1e-3,
}
MEASURED_FRAMEWORKS = ("vllm", "sglang", "trtllm")


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeasuredConfig:
    """Which measured tables price the batches (``docs/predictor.md#measured``): a system
    (empty: the one measured on ``replica.device``), a framework (empty: ``sglang`` for the
    sglang replica policy, else ``vllm``), a version (``latest``: the package's current one)
    and, for tables of your own in the same layout, their folder."""

    system: str = ""
    framework: str = ""
    version: str = "latest"
    data_dir: str | None = None
    #: MoE models: the measured expert routing (``balanced``, ``power_law_1.01``,
    #: ``power_law_1.2``); real traffic loads experts unevenly.
    moe_distribution: str = "power_law_1.2"

    def check(self, where: str) -> None:
        if self.framework and self.framework not in MEASURED_FRAMEWORKS:
            raise _fail(
                f"{where}.framework",
                f"must be one of {', '.join(MEASURED_FRAMEWORKS)}, got {self.framework!r}",
                self.framework,
            )
        if not self.version:
            raise _fail(f"{where}.version", "must be a version or 'latest', got ''", self.version)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExecutionConfig:
    """How long a batch stage takes (``docs/predictor.md``).

    - ``auto`` (default): ``measured`` when measured tables cover the replica's model, GPU
      and dtypes (the ``tokenyard[measured]`` extra installs them), else ``roofline``.
    - ``measured``: GEMMs, attention, all-reduce and MoE from measured kernel tables; the
      calibrated roofline for the rest.
    - ``roofline``: every operation priced from the GPU's datasheet, at efficiency curves
      fitted to measured tables (or at the constant ``efficiency`` fractions, if given).
    - ``linear``: ``(constant + a*prefill tokens + b*decode tokens + c*Σ decode context +
      d*Σ prefill tokens x context) / num_stages + cpu_overhead`` seconds. It ignores the
      replica's model, GPU and parallelism (its defaults are rough Llama-2-7B / A100 figures).
    - ``profiled``: operations trained on the ``profiled.profiles`` files; the roofline
      prices any operation they lack.
    - ``"module:callable"``: a Python function (the slow path) called with the batch shape
      as keywords, returning seconds or ``(total_s, model_s)``.

    A setting that does not apply to the chosen model is refused (a ConfigError naming it),
    so no setting is silently ignored.
    """

    model: str = "auto"
    constant_s: float | None = None
    per_prefill_token_s: float | None = None
    per_decode_token_s: float | None = None
    per_decode_context_token_s: float | None = None
    per_prefill_context_token_s: float | None = None
    cpu_overhead_s: float | None = None
    efficiency: Efficiencies | None = None
    #: Host time per batch stage (every model but ``linear``, whose ``cpu_overhead_s`` is
    #: its own); unset: ``CpuOverheads()``'s documented defaults.
    cpu: CpuOverheads | None = None
    measured: MeasuredConfig | None = None
    profiled: ProfiledConfig | None = None

    def check(self, where: str) -> None:
        if self.model not in EXECUTION_MODELS and ":" not in self.model:
            raise _fail(
                f"{where}.model",
                f"must be one of {', '.join(EXECUTION_MODELS)} or 'module:callable', "
                f"got {self.model!r}",
                self.model,
            )
        for name in _LINEAR_FIELDS:
            if getattr(self, name) is not None:
                check_key_number(f"{where}.{name}", getattr(self, name), low=0, high=1e6)
        if self.efficiency is not None:
            self.efficiency.check(f"{where}.efficiency")
        if self.cpu is not None:
            self.cpu.check(f"{where}.cpu")
        if self.measured is not None:
            self.measured.check(f"{where}.measured")
        if self.profiled is not None:
            self.profiled.check(f"{where}.profiled")
        self._check_applies(where)

    def _check_applies(self, where: str) -> None:
        """Refuses settings the chosen model would ignore."""
        model = self.model
        given_linear = [n for n in _LINEAR_FIELDS if getattr(self, n) is not None]
        sections = (
            (given_linear[0] if given_linear else None, ("linear",)),
            ("efficiency" if self.efficiency is not None else None, ("roofline", "profiled")),
            ("cpu" if self.cpu is not None else None, ("auto", "measured", "roofline", "profiled")),
            ("measured" if self.measured is not None else None, ("measured", "auto")),
            ("profiled" if self.profiled is not None else None, ("profiled",)),
        )
        for key, models in sections:
            if key is not None and model not in models:
                raise _fail(
                    f"{where}.{key}",
                    f"applies to execution.model = {' or '.join(map(repr, models))}, not "
                    f"{model!r}; remove it or set execution.model",
                    getattr(self, key),
                )
        if model == "profiled" and (self.profiled is None or not self.profiled.profiles):
            raise _fail(
                f"{where}.profiled.profiles",
                "the profiled model needs at least one profile file or folder",
                self.profiled.profiles if self.profiled else (),
            )

    def linear_coefficients(self) -> dict[str, float]:
        return {
            name: value if (value := getattr(self, name)) is not None else LINEAR_DEFAULTS[name]
            for name in _LINEAR_FIELDS
        }


@dataclasses.dataclass(frozen=True, kw_only=True)
class MetricsConfig:
    #: Minimum simulated seconds between two samples of a replica's state.
    sample_interval_s: float = 1.0
    #: Keep every batch stage (for the Chrome/Perfetto trace).
    record_stages: bool = False
    #: Goodput counts requests meeting both SLOs.
    slo_ttft_s: float = 2.0
    slo_tpot_s: float = 0.2

    def check(self, where: str) -> None:
        for name in ("sample_interval_s", "slo_ttft_s", "slo_tpot_s"):
            check_key_number(f"{where}.{name}", getattr(self, name), low=0, high=1e9)


def default_workload() -> dict[str, Any]:
    """The built-in job's workload: 10,000 Poisson requests at 20 QPS, lognormal lengths,
    half the prompts opening with one of 16 shared system prompts."""
    return {
        "kind": "synthetic",
        "num_requests": 10_000,
        "seed": 0,
        "arrival": {"kind": "poisson", "qps": 20.0},
        "prompt_tokens": {"kind": "lognormal", "median": 512, "sigma": 0.8, "max_tokens": 4096},
        "output_tokens": {"kind": "lognormal", "median": 128, "sigma": 0.8, "max_tokens": 1024},
        "shared_prefix": {"num_groups": 16, "prefix_tokens": 256, "share_ratio": 0.5},
    }


@dataclasses.dataclass(frozen=True, kw_only=True)
class SimulationConfig:
    """A whole simulation. The defaults are the built-in job of ``tokenyard simulate``: four
    Llama-2-7B replicas on A100-80GB under vLLM V1 scheduling, 10,000 synthetic requests."""

    seed: int = 0
    #: Catalog files (docs/catalog.md) adding models and GPUs, relative to ``base_dir``.
    catalog: tuple[str, ...] = ()
    cluster: ClusterConfig = dataclasses.field(default_factory=ClusterConfig)
    replica: ReplicaConfig = dataclasses.field(default_factory=ReplicaConfig)
    execution: ExecutionConfig = dataclasses.field(default_factory=ExecutionConfig)
    workload: Mapping[str, Any] = dataclasses.field(default_factory=default_workload)
    metrics: MetricsConfig = dataclasses.field(default_factory=MetricsConfig)
    #: Relative trace paths in ``workload`` are taken from here (the config file's folder).
    base_dir: str | None = None

    def path(self, name: str) -> Path:
        """A file the config names, relative to ``base_dir`` (the working directory if
        unset); absolute names stay as they are."""
        return (Path(self.base_dir) if self.base_dir else Path.cwd()) / name

    def model_name(self) -> str:
        """``replica.model``, with a relative ``config.json`` path taken from ``base_dir``
        (like every other file the config names)."""
        name = self.replica.model
        if name.endswith(".json") and not Path(name).is_absolute() and self.base_dir:
            return str(self.path(name))
        return name

    def __post_init__(self) -> None:
        check_key_int("seed", self.seed, low=0, high=2**64 - 1)
        self.cluster.check("cluster")
        self.replica.check("replica")
        self.execution.check("execution")
        self.metrics.check("metrics")


def config_document(config: SimulationConfig) -> dict[str, Any]:
    """``config`` as the mapping it was built from, every default filled in and
    ``base_dir`` absolute: ``config_from_mapping`` (or ``tokenyard simulate config.json``)
    rebuilds the same config from it."""
    document: dict[str, Any] = json.loads(json.dumps(dataclasses.asdict(config)))
    document["base_dir"] = str(Path(config.base_dir or Path.cwd()).resolve())
    return document


def config_from_mapping(mapping: Mapping[str, Any]) -> SimulationConfig:
    """Builds a config from nested mappings (a parsed TOML or YAML document)."""
    if isinstance(mapping, Mapping):
        mapping = _with_sections(mapping)
    config: SimulationConfig = build_dataclass(SimulationConfig, mapping, "")
    return config


def _with_sections(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """``mapping`` with ``replica.scheduler``'s one-level keys moved into sections."""
    data = dict(mapping)
    replica = data.get("replica")
    if isinstance(replica, Mapping) and "scheduler" in replica:
        replica = dict(replica)
        replica["scheduler"] = translate_legacy_scheduler(replica["scheduler"], "replica.scheduler")
        data["replica"] = replica
    return data


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The document of a ``.toml``, ``.yaml``, ``.yml`` or ``.json`` file, with ``base_dir``
    set to its folder (unless the document sets it) and the default workload if it has
    none."""
    path = Path(path)
    data = read_document(path)
    data.setdefault("base_dir", str(path.parent))
    data.setdefault("workload", default_workload())
    return data


def load_config(path: str | Path, overrides: Mapping[str, Any] | None = None) -> SimulationConfig:
    """Reads a ``.toml``, ``.yaml`` or ``.yml`` file; ``overrides`` (dotted keys) win."""
    return config_from_mapping(apply_overrides(read_config_file(path), overrides or {}))


def parse_set_options(items: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` options as overrides: each VALUE is read as TOML (``4``, ``0.5``,
    ``true``, ``"x"``, ``[1, 2]``), a bare word as a string."""
    toml = toml_module()
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects KEY=VALUE, got {item!r}", field="--set", value=item)
        try:
            out[key.strip()] = toml.loads(f"v = {text.strip()}")["v"]
        except toml.TOMLDecodeError:
            out[key.strip()] = text.strip()
    return out


def apply_overrides(data: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``data`` with each ``"a.b.c": value`` set (tables created as needed).

    One-level scheduler keys, in ``data`` or in an override (``replica.scheduler.max_num_seqs``,
    also under a prefix such as ``simulation.``), are first moved into the selected policy's
    section, so an override always wins over the file whichever form each uses."""
    result: dict[str, Any] = _deep_copy(data)
    _move_legacy_keys(result)
    policy_overrides = {
        d[: -len(".policy")]: v for d, v in overrides.items() if d.endswith("scheduler.policy")
    }
    for dotted, value in overrides.items():
        keys = _section_path(result, dotted.split("."), policy_overrides)
        table = result
        for i, key in enumerate(keys[:-1]):
            nested = table.get(key)
            if nested is None:
                nested = table[key] = {}
            if not isinstance(nested, dict):
                where = ".".join(keys[: i + 1])
                raise _fail(where, "is not a table, so it has no keys to set", nested)
            table = nested
        table[keys[-1]] = value
    return result


def _move_legacy_keys(document: dict[str, Any]) -> None:
    """Moves ``[replica.scheduler]``'s one-level keys into their sections, in place, in a
    simulation document (or one nested under ``simulation``); others are left alone."""
    for holder in (document, document.get("simulation")):
        replica = holder.get("replica") if isinstance(holder, dict) else None
        if isinstance(replica, dict) and isinstance(replica.get("scheduler"), Mapping):
            replica["scheduler"] = translate_legacy_scheduler(
                replica["scheduler"], "replica.scheduler"
            )


def _section_path(
    document: Mapping[str, Any], keys: list[str], policy_overrides: Mapping[str, Any]
) -> list[str]:
    """``[..., "replica", "scheduler", legacy]`` as the path in the selected policy's
    section (the policy from the overrides, else the document); other paths unchanged."""
    if len(keys) < 3 or keys[-3:-1] != ["replica", "scheduler"] or keys[-1] not in LEGACY_KEYS:
        return keys
    table: Any = document
    for key in keys[:-1]:
        table = table.get(key) if isinstance(table, Mapping) else None
    policy = policy_overrides.get(".".join(keys[:-1]))
    if policy is None:
        policy = table.get("policy") if isinstance(table, Mapping) else None
    policy = policy if isinstance(policy, str) else ReplicaSchedulerConfig.policy
    if policy not in REPLICA_POLICIES and ":" not in policy:
        return keys  # the typed reader names the bad policy
    target = LEGACY_KEYS[keys[-1]].get(policy_section(policy))
    return keys if target is None else [*keys[:-1], policy_section(policy), target]


def _deep_copy(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in data.items()}
