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
import math
import sys
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

from tokenyard.errors import ConfigError
from tokenyard.predictor.profiled import TrainingOptions
from tokenyard.predictor.roofline import CpuOverheads, Efficiencies
from tokenyard.simulation.planner import dtype_bytes

__all__ = [
    "ClusterConfig",
    "ExecutionConfig",
    "GlobalSchedulerConfig",
    "MeasuredConfig",
    "MetricsConfig",
    "ProfiledConfig",
    "ReplicaConfig",
    "ReplicaSchedulerConfig",
    "SimulationConfig",
    "apply_overrides",
    "config_document",
    "config_from_mapping",
    "default_workload",
    "load_config",
    "parse_set_options",
    "read_config_file",
]

GLOBAL_POLICIES = (
    "round_robin",
    "lor",
    "random",
    "least_kv_load",
    "power_of_two",
    "prefix_affinity",
)
REPLICA_POLICIES = (
    "vllm",
    "sarathi",
    "orca",
    "lightllm",
    "faster_transformer",
    "vllm_v1",
    "sglang",
)


def _fail(where: str, message: str, value: object) -> ConfigError:
    return ConfigError(f"{where}: {message}", field=where, value=repr(value))


@dataclasses.dataclass(frozen=True, kw_only=True)
class GlobalSchedulerConfig:
    """``policy``: one of the built-in routers or ``"module:Class"`` (a plugin)."""

    policy: str = "round_robin"
    #: prefix_affinity: queued prefill tokens one cached token is worth.
    balance: float = 1.0

    def check(self, where: str) -> None:
        if self.policy not in GLOBAL_POLICIES and ":" not in self.policy:
            raise _fail(
                f"{where}.policy",
                f"unknown policy {self.policy!r}; expected one of "
                f"{', '.join(GLOBAL_POLICIES)} or 'module:Class'",
                self.policy,
            )
        _non_negative(f"{where}.balance", self.balance)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    num_replicas: int = 4
    global_scheduler: GlobalSchedulerConfig = dataclasses.field(
        default_factory=GlobalSchedulerConfig
    )

    def check(self, where: str) -> None:
        _at_least(f"{where}.num_replicas", self.num_replicas, 1)
        self.global_scheduler.check(f"{where}.global_scheduler")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReplicaSchedulerConfig:
    """The replica scheduler and its knobs; each policy reads the ones it uses."""

    policy: str = "vllm_v1"
    block_size: int = 16
    #: KV blocks per replica; 0 = from the memory planner.
    num_blocks: int = 0
    #: Requests holding memory at once (Vidur's policies).
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
    #: Longest request (prompt + output): orca/faster_transformer reserve it, the planner
    #: sizes batches for it, vllm_v1 uses it as max_model_len.
    max_request_tokens: int = 8192
    #: vllm_v1: step token budget; sglang: extend tokens per prefill batch.
    max_num_batched_tokens: int = 2048
    #: vllm_v1: running requests; sglang: max running requests.
    max_num_seqs: int = 256
    long_prefill_token_threshold: int = 0
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    prefix_cache: str = "block_hash"
    scheduling_policy: str = "fcfs"
    #: sglang: decode batches are padded up to these sizes for their cost.
    graph_batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 256)

    def check(self, where: str) -> None:
        if self.policy not in REPLICA_POLICIES and ":" not in self.policy:
            raise _fail(
                f"{where}.policy",
                f"unknown policy {self.policy!r}; expected one of "
                f"{', '.join(REPLICA_POLICIES)} or 'module:Class'",
                self.policy,
            )
        for name in (
            "block_size",
            "batch_size_cap",
            "max_tokens_in_batch",
            "chunk_size",
            "max_request_tokens",
            "max_num_batched_tokens",
        ):
            _at_least(f"{where}.{name}", getattr(self, name), 1)
        for name in ("num_blocks", "max_waiting_iters", "max_num_seqs"):
            _at_least(f"{where}.{name}", getattr(self, name), 0)
        _at_least(f"{where}.long_prefill_token_threshold", self.long_prefill_token_threshold, 0)
        if not 0 <= self.watermark_blocks_fraction < 1:
            raise _fail(
                f"{where}.watermark_blocks_fraction",
                f"must be in [0, 1), got {self.watermark_blocks_fraction}",
                self.watermark_blocks_fraction,
            )
        if self.policy == "lightllm" and self.block_size != 1:
            raise _fail(
                f"{where}.block_size",
                f"the lightllm scheduler manages memory per token: block_size must be 1, "
                f"got {self.block_size}",
                self.block_size,
            )
        if self.prefix_cache not in ("block_hash", "radix"):
            raise _fail(
                f"{where}.prefix_cache",
                f"must be 'block_hash' or 'radix', got {self.prefix_cache!r}",
                self.prefix_cache,
            )
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise _fail(
                f"{where}.scheduling_policy",
                f"must be 'fcfs' or 'priority', got {self.scheduling_policy!r}",
                self.scheduling_policy,
            )
        sizes = self.graph_batch_sizes
        if any(s < 1 for s in sizes) or list(sizes) != sorted(set(sizes)):
            raise _fail(
                f"{where}.graph_batch_sizes",
                f"must be increasing positive integers, got {list(sizes)}",
                sizes,
            )


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

    def check(self, where: str) -> None:
        _at_least(f"{where}.tensor_parallel_size", self.tensor_parallel_size, 1)
        _at_least(f"{where}.num_pipeline_stages", self.num_pipeline_stages, 1)
        if not 0 <= self.memory_margin_fraction < 1:
            raise _fail(
                f"{where}.memory_margin_fraction",
                f"must be in [0, 1), got {self.memory_margin_fraction}",
                self.memory_margin_fraction,
            )
        dtype_bytes(self.dtype, self.kv_cache_dtype)  # names replica.dtype / .kv_cache_dtype
        self.scheduler.check(f"{where}.scheduler")
        policy = self.scheduler.policy
        if self.num_pipeline_stages > 1 and policy in ("lightllm", "sglang"):
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
                _non_negative(f"{where}.{name}", getattr(self, name))
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
            _non_negative(f"{where}.{name}", getattr(self, name))


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
        _at_least("seed", self.seed, 0)
        self.cluster.check("cluster")
        self.replica.check("replica")
        self.execution.check("execution")
        self.metrics.check("metrics")


def _at_least(where: str, value: int, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise _fail(where, f"must be an integer >= {low}, got {value!r}", value)


def _non_negative(where: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _fail(where, f"must be a finite number, got {value!r}", value)
    if value < 0:
        raise _fail(where, f"must be >= 0, got {value!r}", value)


def _convert(where: str, hint: Any, value: Any) -> Any:
    """Checks one value against its field's type; nested dataclasses recurse."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return _build(hint, value, where)
    origin = get_origin(hint)
    if origin is tuple:
        item = get_args(hint)[0]
        ok = isinstance(value, (list, tuple)) and all(
            isinstance(v, item) and not isinstance(v, bool) for v in value
        )
        if not ok:
            noun = "integers" if item is int else "strings"
            raise _fail(where, f"must be a list of {noun}, got {value!r}", value)
        return tuple(value)
    if origin in (Union, types.UnionType):  # str | None
        if value is None:
            return None
        return _convert(where, next(a for a in get_args(hint) if a is not type(None)), value)
    if hint is Mapping[str, Any] or origin is Mapping:
        if not isinstance(value, Mapping):
            raise _fail(where, f"must be a table, got {value!r}", value)
        return dict(value)
    if hint is bool:
        if not isinstance(value, bool):
            raise _fail(where, f"must be true or false, got {value!r}", value)
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _fail(where, f"must be an integer, got {value!r}", value)
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _fail(where, f"must be a number, got {value!r}", value)
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise _fail(where, f"must be a string, got {value!r}", value)
        return value
    raise TypeError(f"no conversion for {hint!r}")  # pragma: no cover - a bug here


def _build(cls: type[Any], mapping: Any, where: str) -> Any:
    if not isinstance(mapping, Mapping):
        raise _fail(where or "config", f"must be a table, got {mapping!r}", mapping)
    hints = get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    values = {}
    for key, value in mapping.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in fields:
            raise _fail(path, f"unknown key; expected one of {', '.join(sorted(fields))}", value)
        values[key] = _convert(path, hints[key], value)
    return cls(**values)


def config_document(config: SimulationConfig) -> dict[str, Any]:
    """``config`` as the mapping it was built from, every default filled in and
    ``base_dir`` absolute: ``config_from_mapping`` (or ``tokenyard simulate config.json``)
    rebuilds the same config from it."""
    document: dict[str, Any] = json.loads(json.dumps(dataclasses.asdict(config)))
    document["base_dir"] = str(Path(config.base_dir or Path.cwd()).resolve())
    return document


def config_from_mapping(mapping: Mapping[str, Any]) -> SimulationConfig:
    """Builds a config from nested mappings (a parsed TOML or YAML document)."""
    config: SimulationConfig = _build(SimulationConfig, mapping, "")
    return config


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The document of a ``.toml``, ``.yaml``, ``.yml`` or ``.json`` file, with ``base_dir``
    set to its folder (unless the document sets it) and the default workload if it has
    none."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(
            f"config file {path}: {exc.strerror}", field="config", value=str(path)
        ) from None
    data = _parse(path, text)
    data.setdefault("base_dir", str(path.parent))
    data.setdefault("workload", default_workload())
    return data


def load_config(path: str | Path, overrides: Mapping[str, Any] | None = None) -> SimulationConfig:
    """Reads a ``.toml``, ``.yaml`` or ``.yml`` file; ``overrides`` (dotted keys) win."""
    return config_from_mapping(apply_overrides(read_config_file(path), overrides or {}))


def toml_module() -> types.ModuleType:
    """``tomllib`` (Python 3.11+) or its backport ``tomli``."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    return tomllib


def _parse(path: Path, text: str) -> dict[str, Any]:
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            return dict(toml_module().loads(text))
        if suffix == ".json":  # e.g. the config.json a run writes beside its results
            return _document(path, json.loads(text))
        if suffix in (".yaml", ".yml"):
            import yaml

            return _document(path, yaml.safe_load(text))
    except (ValueError, ImportError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"config file {path}: {exc}", field="config", value=str(path)) from None
    raise ConfigError(
        f"config file {path}: unknown format {suffix!r}; use .toml, .yaml, .yml or .json",
        field="config",
        value=str(path),
    )


def _document(path: Path, data: Any) -> dict[str, Any]:
    """A parsed YAML or JSON document, which must be a mapping (empty: no keys)."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {path}: the document must be a mapping",
            field="config",
            value=str(path),
        )
    return data


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
    """A copy of ``data`` with each ``"a.b.c": value`` set (tables created as needed)."""
    result: dict[str, Any] = _deep_copy(data)
    for dotted, value in overrides.items():
        keys = dotted.split(".")
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


def _deep_copy(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in data.items()}
