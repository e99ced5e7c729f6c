"""The simulation's configuration: frozen dataclasses, built from a TOML/YAML file or a
mapping, with every unknown key and bad value reported by its full key path.

The ``cluster`` and ``replica`` sections are ``cluster_config.py``'s (``ReplicaConfig``
defined in ``replica_config.py``); the others, and reading and overriding a whole config,
are here.

Layout (every section and key optional; see ``docs/simulate.md``)::

    seed = 0
    catalog = ["my_gpus.toml"]  # extra models and GPUs (docs/catalog.md)
    [cluster]                 num_replicas, global_scheduler = {policy, balance, options}
    [replica]                 model, device, tensor_parallel_size, num_pipeline_stages,
                              expert_parallel_size, data_parallel_size, memory_margin_fraction,
                              dtype, quantization, kv_cache_dtype, over_length,
                              lora = {max_loras, max_cpu_loras, max_lora_rank, ...}
                              (``lora_config.py``),
                              kv_offload = {host_memory_gb, host_to_device_gbps, latency_us,
                              host_hit_weight} (``kv_offload_config.py``),
                              scheduler = {policy, max_request_tokens, vllm_v1 | vidur |
                              sglang | plugin = {...}} (``scheduler_config.py``),
                              speculative = {method, num_speculative_tokens, draft_model,
                              acceptance_rate | acceptance_rates | accepted_distribution}
                              (``speculative.py``)
    [execution]               model = "auto" | "measured" | "roofline" | "linear" | "profiled"
                              | "module:callable", linear coefficients, efficiency = {...},
                              cpu = {...}, measured = {system, framework, version, data_dir},
                              profiled = {profiles, regressor, ...}
    [workload]                see tokenyard.workload.load_workload
    [metrics]                 sample_interval_s, record_stages, slo_ttft_s, slo_tpot_s,
                              trace_events, trace_window_s, trace_requests, trace_max_events
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tokenyard import _core
from tokenyard._checks import (
    build_dataclass,
    check_key_int,
    check_key_number,
    fail,
    read_document,
    toml_module,
)
from tokenyard.errors import ConfigError
from tokenyard.predictor.measured.data import MOE_DISTRIBUTIONS
from tokenyard.predictor.profiled import TrainingOptions
from tokenyard.predictor.roofline import CpuOverheads, Efficiencies
from tokenyard.simulation.cluster_config import (
    ClusterConfig,
    GlobalSchedulerConfig,
    ReplicaConfig,
)
from tokenyard.simulation.disagg_config import DecodePoolConfig
from tokenyard.simulation.kv_offload_config import KvOffloadConfig
from tokenyard.simulation.lora_config import LoraConfig
from tokenyard.simulation.scheduler_config import (
    MAX_REPLICAS,
    PluginSchedulerConfig,
    ReplicaSchedulerConfig,
    SglangSchedulerConfig,
    VidurSchedulerConfig,
    move_legacy_keys,
    section_path,
    translate_legacy_scheduler,
)
from tokenyard.simulation.speculative import SpeculativeConfig
from tokenyard.workload.config import check_workload_sizes

__all__ = [
    "ClusterConfig",
    "ExecutionConfig",
    "GlobalSchedulerConfig",
    "KvOffloadConfig",
    "LoraConfig",
    "MeasuredConfig",
    "MetricsConfig",
    "PluginSchedulerConfig",
    "ProfiledConfig",
    "ReplicaConfig",
    "ReplicaSchedulerConfig",
    "SglangSchedulerConfig",
    "SimulationConfig",
    "SpeculativeConfig",
    "VidurSchedulerConfig",
    "apply_overrides",
    "config_document",
    "config_from_mapping",
    "default_workload",
    "load_config",
    "parse_set_options",
    "read_config_file",
]


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
    (unset: the one measured on ``replica.device``), a framework (unset: ``sglang`` for the
    sglang replica policy, else ``vllm``), a version (``latest``: the package's current one)
    and, for tables of your own in the same layout, their folder. A key that is set must
    not be empty: an empty string is refused, never read as "the default"."""

    system: str | None = None
    framework: str | None = None
    version: str = "latest"
    data_dir: str | None = None
    #: MoE models: the measured expert routing (one of ``MOE_DISTRIBUTIONS``: ``balanced``,
    #: ``power_law_1.01``, ``power_law_1.2``); real traffic loads experts unevenly.
    moe_distribution: str = "power_law_1.2"

    def check(self, where: str) -> None:
        for key in ("system", "framework", "version", "data_dir"):
            value = getattr(self, key)
            if value is not None and not value.strip():
                hint = (
                    "name one, or 'latest'" if key == "version" else "leave it out for the default"
                )
                raise fail(f"{where}.{key}", f"must not be empty ({hint}), got {value!r}", value)
        if self.framework is not None and self.framework not in MEASURED_FRAMEWORKS:
            raise fail(
                f"{where}.framework",
                f"must be one of {', '.join(MEASURED_FRAMEWORKS)}, got {self.framework!r}",
                self.framework,
            )
        if self.moe_distribution not in MOE_DISTRIBUTIONS:
            raise fail(
                f"{where}.moe_distribution",
                f"must be one of {', '.join(MOE_DISTRIBUTIONS)} (the routings the MoE "
                f"tables measure), got {self.moe_distribution!r}",
                self.moe_distribution,
            )


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
            raise fail(
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
                raise fail(
                    f"{where}.{key}",
                    f"applies to execution.model = {' or '.join(map(repr, models))}, not "
                    f"{model!r}; remove it or set execution.model",
                    getattr(self, key),
                )
        if model == "profiled" and (self.profiled is None or not self.profiled.profiles):
            raise fail(
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
    #: Write a Chrome / Perfetto trace-event JSON of the run to this file, relative to
    #: ``base_dir`` (records every batch stage; ``tokenyard.simulation.trace_events``).
    trace_events: str | None = None
    #: The trace's window ``[start, end]`` in simulated seconds (empty: the whole run).
    trace_window_s: tuple[float, ...] = ()
    #: The trace's requests ``[first, end)`` by request id (empty: all of them).
    trace_requests: tuple[int, ...] = ()
    #: At most this many trace events; past it the trace is cut and says so.
    trace_max_events: int = 1_000_000

    def check(self, where: str) -> None:
        for name in ("sample_interval_s", "slo_ttft_s", "slo_tpot_s"):
            check_key_number(f"{where}.{name}", getattr(self, name), low=0, high=1e9)
        check_trace_options(self, where)


def check_trace_options(metrics: MetricsConfig, where: str) -> None:
    """Raises ``ConfigError`` naming the key when a trace option is malformed."""
    window = metrics.trace_window_s
    if window:
        if len(window) != 2 or not all(math.isfinite(v) for v in window):
            raise fail(f"{where}.trace_window_s", f"must be [start, end], got {window!r}", window)
        if not 0 <= window[0] < window[1]:
            raise fail(
                f"{where}.trace_window_s",
                f"must have 0 <= start < end, got {list(window)!r}",
                window,
            )
    requests = metrics.trace_requests
    if requests and (len(requests) != 2 or not 0 <= requests[0] < requests[1]):
        raise fail(
            f"{where}.trace_requests",
            f"must be [first, end) with 0 <= first < end, got {list(requests)!r}",
            requests,
        )
    check_key_int(f"{where}.trace_max_events", metrics.trace_max_events, low=1, high=10**9)
    if metrics.trace_events is not None and not metrics.trace_events:
        raise fail(f"{where}.trace_events", "must be a file name, got ''", metrics.trace_events)


#: Workload kinds drawn from a seed (``SimulationConfig.seeded_workload`` fills it in).
SEEDED_WORKLOAD_KINDS = ("synthetic", "sessions")


def default_workload() -> dict[str, Any]:
    """The built-in job's workload: 10,000 Poisson requests at 20 QPS, lognormal lengths,
    half the prompts opening with one of 16 shared system prompts. Its draws follow the
    simulation's ``seed``. The longest request (3,072 prompt + 1,024 output tokens) fits
    the default model's 4,096-token context."""
    return {
        "kind": "synthetic",
        "num_requests": 10_000,
        "arrival": {"kind": "poisson", "qps": 20.0},
        "prompt_tokens": {"kind": "lognormal", "median": 512, "sigma": 0.8, "max_tokens": 3072},
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

    def seeded_workload(self) -> dict[str, Any]:
        """``workload`` with the simulation's ``seed`` in each of its random parts that sets
        no seed of its own (a synthetic or session stream, ``lora`` draws, a closed loop's
        think times), so the one seed drives every random choice; an explicit seed there
        pins that part."""
        spec = dict(self.workload)
        if spec.get("kind") in SEEDED_WORKLOAD_KINDS and "seed" not in spec:
            spec["seed"] = self.seed
        lora = spec.get("lora")
        if isinstance(lora, Mapping):
            spec["lora"] = {"seed": self.seed, **lora}
        closed = spec.get("closed_loop")
        # A closed loop draws only think times; without them it takes no seed.
        if isinstance(closed, Mapping) and closed.get("think_time") is not None:
            spec["closed_loop"] = {"seed": self.seed, **closed}
        return spec

    def __post_init__(self) -> None:
        check_key_int("seed", self.seed, low=0, high=2**64 - 1)
        self.cluster.check("cluster")
        self.replica.check("replica")
        self.execution.check("execution")
        self.metrics.check("metrics")
        check_workload_sizes(self.workload)
        self._check_lora()
        self._check_data_parallel_ranks()
        self._check_disaggregation()
        self._check_host_hit_weight()
        self._check_cluster_blocks()

    def _check_data_parallel_ranks(self) -> None:
        """The simulator runs one scheduler per attention DP rank: replicas x DP of them
        in each pool, bounded as replicas are."""
        pools = [("cluster.num_replicas", self.cluster.num_replicas, self.replica)]
        decode = self.cluster.decode
        if decode is not None:
            pools.append(
                ("cluster.decode.num_replicas", decode.num_replicas, decode.resolve(self.replica))
            )
        for key, replicas, layout in pools:
            dp = layout.data_parallel_size
            ranks = replicas * dp
            if ranks > MAX_REPLICAS:
                raise fail(
                    key,
                    f"{replicas} replicas of {dp} data-parallel ranks make {ranks} "
                    f"schedulers, over the simulator's limit of {MAX_REPLICAS}",
                    replicas,
                )

    def _check_cluster_blocks(self) -> None:
        """One budget for the KV blocks a run tracks one by one, across both pools, checked
        here for the sizes the config gives (the core checks it again once the planner has
        sized the rest, before allocating anything)."""
        prefill = self.replica.scheduler
        # Each attention DP rank of a replica has its own scheduler and KV pool.
        pools = [(self.cluster.num_replicas * self.replica.data_parallel_size, prefill)]
        decode = self.cluster.decode
        if decode is not None:
            ranks = decode.num_replicas * decode.resolve(self.replica).data_parallel_size
            pools.append((ranks, decode.scheduler or prefill))
        per_replica = [(n, _tracked_blocks(s)) for n, s in pools]
        total = sum(n * blocks for n, blocks in per_replica)
        if total > _core.MAX_CLUSTER_BLOCKS:
            sizes = " and ".join(f"{n} replicas of {b} KV blocks" for n, b in per_replica)
            raise fail(
                "cluster.num_replicas",
                f"{sizes} make {total} blocks, over the simulator's limit of "
                f"{_core.MAX_CLUSTER_BLOCKS} in all (each block is tracked one by one); use "
                "fewer replicas or a larger block size",
                self.cluster.num_replicas,
            )

    def _check_host_hit_weight(self) -> None:
        """``host_hit_weight`` weighs host-held tokens in prefix_affinity routing: with
        another router it would change nothing."""
        offload = self.replica.kv_offload
        policy = self.cluster.global_scheduler.policy
        if offload is None or offload.host_hit_weight is None or policy == "prefix_affinity":
            return
        raise fail(
            "replica.kv_offload.host_hit_weight",
            f"weighs host-held tokens for the prefix_affinity router only; the {policy!r} "
            "router (cluster.global_scheduler.policy) would ignore it",
            offload.host_hit_weight,
        )

    def _check_disaggregation(self) -> None:
        """Both pools run vllm_v1 (their KV connectors); other features are not simulated
        across pools yet, and are refused rather than ignored."""
        decode = self.cluster.decode
        if decode is None:
            return
        self._check_decode_layout(decode)
        policies = [("replica.scheduler.policy", self.replica.scheduler.policy)]
        if decode.scheduler is not None:
            policies.append(("cluster.decode.scheduler.policy", decode.scheduler.policy))
        for key, policy in policies:
            if policy != "vllm_v1":
                raise fail(
                    key, "prefill and decode pools run vllm_v1 replicas (KV connectors)", policy
                )
        if self.replica.speculative.enabled:
            raise fail(
                "replica.speculative.method",
                "speculative decoding is not simulated in disaggregated pools yet",
                self.replica.speculative.method,
            )
        if self.replica.lora is not None:
            raise fail(
                "replica.lora", "LoRA adapters are not simulated in disaggregated pools yet", "set"
            )
        if ":" in self.cluster.global_scheduler.policy:
            raise fail(
                "cluster.global_scheduler.policy",
                "routing plugins are not supported with a decode pool yet",
                self.cluster.global_scheduler.policy,
            )

    def _check_decode_layout(self, decode: DecodePoolConfig) -> None:
        """The decode pool's EP and attention DP obey the replica's rules (DP needs EP =
        TP x DP), checked on its resolved layout: a key the pool leaves unset is the
        replica's, which the message says, as the contradiction may come from there."""
        try:
            decode.resolve(self.replica)._check_expert_layout("cluster.decode")
        except ConfigError as exc:
            inherited = [
                key
                for key in ("tensor_parallel_size", "expert_parallel_size", "data_parallel_size")
                if getattr(decode, key) is None
            ]
            if not inherited:
                raise
            taken = ", ".join(inherited)
            raise ConfigError(
                f"{exc} (unset in [cluster.decode], taken from [replica]: {taken})",
                field=exc.field,
                value=exc.value,
            ) from None

    def _check_lora(self) -> None:
        """Adapters in the workload need ``[replica.lora]`` and a model that prices them;
        ``[replica.lora]`` without adapters in the workload would change nothing."""
        workload_lora = _names_adapters(self.workload)
        if workload_lora and self.replica.lora is None:
            policy = self.replica.scheduler.policy
            where = "replica.lora" if policy == "vllm_v1" else "replica.scheduler.policy"
            raise fail(
                where,
                f"the workload gives requests LoRA adapters ({_adapter_key(self.workload)}); "
                f"they are "
                f"simulated on vllm_v1 replicas with a [replica.lora] section, got policy "
                f"{policy!r} without one",
                policy,
            )
        if self.replica.lora is not None and not workload_lora:
            raise fail(
                "replica.lora",
                "the workload names no adapters (add [workload.lora]), so it would change nothing",
                "set",
            )
        if self.replica.lora is not None and self.execution.model == "linear":
            raise fail(
                "execution.model",
                "the linear model has no LoRA terms; use roofline, measured or profiled "
                "with replica.lora",
                self.execution.model,
            )


def _tracked_blocks(scheduler: ReplicaSchedulerConfig) -> int:
    """KV blocks a replica tracks one by one as the config gives them (GPU blocks and host
    tier; 0 where the planner sizes them, or where Vidur's policies only count them)."""
    if scheduler.section == "vllm_v1":
        return scheduler.vllm_v1.num_blocks + scheduler.vllm_v1.host_num_blocks
    if scheduler.section == "sglang":
        return scheduler.sglang.num_pages
    return 0


def _names_adapters(workload: object) -> bool:
    """Whether the workload's requests carry LoRA adapters: a ``lora`` popularity table, a
    mapped ``columns.lora`` trace column."""
    if not isinstance(workload, Mapping):
        return False
    if "lora" in workload:
        return True
    columns = workload.get("columns")
    return isinstance(columns, Mapping) and columns.get("lora") is not None


def _adapter_key(workload: Mapping[str, Any]) -> str:
    """The key that gives the workload's requests adapters, for messages."""
    return "workload.lora" if "lora" in workload else "workload.columns.lora"


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
    move_legacy_keys(result)
    policy_overrides = {
        d[: -len(".policy")]: v for d, v in overrides.items() if d.endswith("scheduler.policy")
    }
    for dotted, value in overrides.items():
        keys = section_path(result, dotted.split("."), policy_overrides)
        table = result
        for i, key in enumerate(keys[:-1]):
            nested = table.get(key)
            if nested is None:
                nested = table[key] = {}
            if not isinstance(nested, dict):
                where = ".".join(keys[: i + 1])
                raise fail(where, "is not a table, so it has no keys to set", nested)
            table = nested
        table[keys[-1]] = value
    return result


def _deep_copy(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in data.items()}
