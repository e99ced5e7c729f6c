"""Builds the execution-time model a simulation config asks for (``execution.model``).

``auto`` resolves to ``measured`` when measured tables cover the replica (the
``tokenyard[measured]`` extra, or ``[execution.measured] data_dir``), else to ``roofline``
(calibrated to measured tables where the device has a calibration). ``linear`` needs nothing
here (the core reads the coefficients); ``module:callable`` loads a Python function (the
slow path). What was chosen, from which data, is recorded by :func:`describe`, and the CLI
prints it. Where ``auto`` falls back only because the running Python cannot install the
tables' package, it also warns (``MeasuredUnavailableWarning``): the banner alone is easy to
miss. A measured predictor is built once per machine and kept on disk; the build says so
on stderr.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from tokenyard.catalog import DeviceSpec, ModelSpec
from tokenyard.catalog.quant import Quantization, resolve_quantization
from tokenyard.errors import ConfigError, MeasuredUnavailableWarning
from tokenyard.predictor.calibration import Calibration, builtin_calibration
from tokenyard.predictor.compiled import CompiledPredictor
from tokenyard.predictor.measured.build import measured_predictor
from tokenyard.predictor.measured.data import (
    SYSTEM_OF_DEVICE,
    MeasuredSource,
    package_root,
    resolve_source,
)
from tokenyard.predictor.profiled import default_cache_dir, profiled_predictor
from tokenyard.predictor.profiles import read_profiles
from tokenyard.predictor.roofline import CpuOverheads, Efficiencies, roofline_predictor
from tokenyard.simulation.catalog import catalog_for
from tokenyard.simulation.config import MeasuredConfig, ProfiledConfig, SimulationConfig
from tokenyard.simulation.lora_config import lora_op
from tokenyard.simulation.planner import _resolve_kv_dtype, dtype_bytes

__all__ = [
    "ExecutionChoice",
    "build_predictor",
    "choose_execution",
    "describe",
    "lora_core",
    "quantization_for",
    "with_lora",
]

#: What ``linear`` leaves out, said wherever it is used.
LINEAR_WARNING = (
    "linear: fixed coefficients (Llama-2-7B / A100-80GB figures unless set); it ignores the "
    "replica's model, device, dtypes and parallelism"
)


@dataclasses.dataclass(frozen=True)
class ExecutionChoice:
    """The execution model a config resolves to: ``kind`` and, for ``measured``, its
    source; ``reason`` says why ``auto`` chose it."""

    kind: str
    source: MeasuredSource | None = None
    calibration: Calibration | None = None
    reason: str = ""
    #: Which kernel families priced the GEMMs and experts (``measured`` only).
    kernels: str = ""

    def label(self) -> str:
        """The banner's words: ``measured: h100_sxm, vllm 0.24.0; GEMM bfloat16, MoE
        bfloat16`` and the like."""
        if self.kind == "measured" and self.source is not None:
            kernels = f"; {self.kernels}" if self.kernels else ""
            return f"measured: {self.source.describe()}{kernels}"
        if self.kind == "roofline":
            if self.calibration is None:
                return "roofline: datasheet peaks x constant efficiencies"
            proxy = (
                f" (curves of {self.calibration.proxy_for})" if self.calibration.proxy_for else ""
            )
            return f"roofline calibrated to measured tables{proxy}"
        if self.kind == "linear":
            return LINEAR_WARNING
        return self.kind


#: The Pythons the tables' package installs on: aiconfigurator-core 0.12.0 requires
#: ``>=3.11, <3.14`` (the ``measured`` extra's marker skips it below 3.11, so pip installs
#: nothing there and says nothing).
MEASURED_PYTHONS = ((3, 11), (3, 14))


def _running_python() -> tuple[int, int]:
    """This interpreter's (major, minor); the tests stand in other Pythons here."""
    return (sys.version_info.major, sys.version_info.minor)


def _python_lacks_measured() -> str | None:
    """Why the running Python cannot have the measured tables' package, or None."""
    running = _running_python()
    low, high = MEASURED_PYTHONS
    if low <= running < high:
        return None
    return (
        f"the measured tables cannot be installed on Python {running[0]}.{running[1]}: their "
        f"package, aiconfigurator-core (the tokenyard[measured] extra), supports Python "
        f"{low[0]}.{low[1]} to {high[0]}.{high[1] - 1}"
    )


def _missing_tables_advice() -> str:
    """What to do when the package's tables are absent, for this Python."""
    low, high = MEASURED_PYTHONS
    if _python_lacks_measured():
        return (
            f"run tokenyard on Python {low[0]}.{low[1]}-{high[0]}.{high[1] - 1} with "
            "pip install 'tokenyard[measured]', or name a folder of tables in "
            "[execution.measured] data_dir"
        )
    return (
        "pip install 'tokenyard[measured]' (aiconfigurator-core), or name your own folder "
        "in [execution.measured] data_dir"
    )


def _warn_measured_unavailable(spec: DeviceSpec) -> None:
    """``auto`` on a device the tables measure, without them because of this Python: a
    warning that says why and what to do (the banner alone is easy to miss)."""
    why = _python_lacks_measured()
    if why is None or package_root() is not None or spec.name not in SYSTEM_OF_DEVICE:
        return
    warnings.warn(
        MeasuredUnavailableWarning(
            f"{why}, so the default execution model prices batches on {spec.name} with the "
            f"roofline calibrated to them instead. To use the measured tables, "
            f'{_missing_tables_advice()}; set execution.model = "roofline" to choose the '
            "roofline and silence this warning (docs/install.md)"
        ),
        stacklevel=3,
    )


def _framework(config: SimulationConfig, measured: MeasuredConfig) -> str:
    if measured.framework:
        return measured.framework
    return "sglang" if config.replica.scheduler.policy == "sglang" else "vllm"


def _measured_source(config: SimulationConfig, spec: DeviceSpec) -> MeasuredSource:
    """The tables ``config`` names, or a ConfigError saying why there are none."""
    measured = config.execution.measured or MeasuredConfig()
    root: Path
    if measured.data_dir:
        root = config.path(measured.data_dir)
        if not root.is_dir():
            raise ConfigError(
                f"execution.measured.data_dir: no folder {root}",
                field="execution.measured.data_dir",
                value=repr(measured.data_dir),
            )
    else:
        found = package_root()
        if found is None:
            why = _python_lacks_measured() or "the measured tables are not installed"
            raise ConfigError(
                f"execution.model: {why}; {_missing_tables_advice()}",
                field="execution.model",
                value=repr(config.execution.model),
            )
        root = found
    system = measured.system or SYSTEM_OF_DEVICE.get(spec.name)
    if not system:
        raise ConfigError(
            f"replica.device: no measured system is known for {spec.name!r} (measured: "
            f"{', '.join(f'{d} = {s}' for d, s in SYSTEM_OF_DEVICE.items())}); set "
            "[execution.measured] system to use another system's tables",
            field="replica.device",
            value=repr(spec.name),
        )
    # Errors about the tables name the key that chose them: data_dir, else the section.
    field = "execution.measured.data_dir" if measured.data_dir else "execution.measured"
    framework = _framework(config, measured)
    return resolve_source(root, system, framework, measured.version, field=field)


def choose_execution(config: SimulationConfig) -> ExecutionChoice:
    """The execution model ``config`` resolves to (``auto`` decided here)."""
    kind = config.execution.model
    if kind in ("linear", "profiled") or ":" in kind:
        return ExecutionChoice(kind)
    spec = catalog_for(config).device(config.replica.device, field="replica.device")
    calibration = None if config.execution.efficiency is not None else builtin_calibration(spec)
    if kind == "roofline":
        return ExecutionChoice("roofline", calibration=calibration)
    try:
        source = _measured_source(config, spec)
        built = _build_measured(config, source)  # coverage of the model and dtypes
    except ConfigError as exc:
        if kind == "measured" or config.execution.measured is not None:
            raise  # tables were asked for by name: not having them is an error, not a fallback
        _warn_measured_unavailable(spec)
        return ExecutionChoice("roofline", calibration=calibration, reason=str(exc))
    kernels = str(built.description.get("kernels", ""))
    return ExecutionChoice("measured", source=source, kernels=kernels)


def quantization_for(config: SimulationConfig, model: ModelSpec) -> Quantization | None:
    """The quantization ``config``'s replica runs ``model`` with: ``replica.quantization``,
    ``auto`` being the checkpoint's; a ``replica.dtype`` that contradicts it is refused
    (``catalog.quant.resolve_quantization``)."""
    replica = config.replica
    return resolve_quantization(model.quantization, replica.dtype, replica.quantization)


#: Each table folder (family) with its files' (name, size, modification time).
TableFiles = tuple[tuple[str, tuple[tuple[str, int, int], ...]], ...]


def _build_measured(
    config: SimulationConfig, source: MeasuredSource, spec: ModelSpec | None = None
) -> CompiledPredictor:
    replica = config.replica
    catalog = catalog_for(config)
    model = spec or catalog.model(config.model_name(), field="replica.model")
    return _cached_measured(
        model,
        catalog.device(replica.device, field="replica.device"),
        source,
        replica.tensor_parallel_size,
        replica.num_pipeline_stages,
        replica.dtype,
        _resolve_kv_dtype(replica.dtype, replica.kv_cache_dtype),
        config.execution.cpu or CpuOverheads(),
        (config.execution.measured or MeasuredConfig()).moe_distribution,
        _table_files(source),
        quantization_for(config, model),
        replica.expert_parallel_size,
        replica.data_parallel_size,
    )


def _table_files(source: MeasuredSource) -> TableFiles:
    """Each table folder's files (name, size, modification time): part of every key a
    measured predictor is kept under, in this process and on disk, so a table rewritten
    during a session is not answered from the old one."""
    return tuple(
        (
            family,
            tuple(
                sorted(
                    (f.name, f.stat().st_size, f.stat().st_mtime_ns)
                    for f in Path(folder).iterdir()
                    if f.is_file()
                )
            ),
        )
        for family, folder in sorted(source.folders.items())
    )


@functools.lru_cache(maxsize=32)
def _cached_measured(
    spec: ModelSpec,
    gpu: DeviceSpec,
    source: MeasuredSource,
    tp: int,
    pp: int,
    dtype: str,
    kv_dtype: str,
    cpu: Any,
    moe_distribution: str,
    tables: TableFiles,
    quantization: Quantization | None = None,
    ep: int = 1,
    dp: int = 1,
) -> CompiledPredictor:
    # Built once per machine: the build interpolates thousands of grid points (most of a
    # short run's start-up), so the result is kept on disk under every input that shapes
    # it, the tables' files and the predictor code included.
    inputs = (spec, gpu, tp, pp, dtype, kv_dtype, cpu, moe_distribution, quantization, ep, dp)
    path = default_cache_dir() / f"measured-{_measured_key(source, inputs, tables)}.json"
    if path.exists():
        try:
            return CompiledPredictor.load(path)
        except ConfigError:  # unreadable (a crash mid-write elsewhere): build again
            path.unlink(missing_ok=True)
    # The one line a first run shows while it builds (later runs load the file above).
    print(
        f"tokenyard: building measured tables for {spec.name} on {source.system} "
        "(first run only, up to a few seconds)...",
        file=sys.stderr,
        flush=True,
    )
    weight_bytes, kv_bytes = dtype_bytes(dtype, kv_dtype)
    if quantization is not None:
        weight_bytes = quantization.bytes_per_weight
    predictor = measured_predictor(
        spec,
        gpu,
        source,
        tensor_parallel_size=tp,
        num_pipeline_stages=pp,
        weight_dtype=dtype,
        kv_cache_dtype=kv_dtype,
        weight_bytes=weight_bytes,
        kv_bytes=kv_bytes,
        cpu=cpu,
        moe_distribution=moe_distribution,
        quantization=quantization,
        expert_parallel_size=ep,
        data_parallel_size=dp,
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        predictor.save(partial)
        partial.replace(path)
    except OSError:  # a read-only home: build every time
        pass
    return predictor


MEASURED_CACHE_VERSION = 2


def _measured_key(
    source: MeasuredSource,
    inputs: tuple[Any, ...],
    tables: TableFiles,
) -> str:
    """A digest of what a measured predictor is built from: ``inputs`` (the model and
    device specs, layout, dtypes, CPU overheads), the tables' files (name, size and
    modification time), the predictor package's code and the shipped calibration, and the
    libraries that read and interpolate the tables (numpy's version; pyarrow's installed
    files, stamped without importing it: a hit must not pay for pyarrow's import)."""
    digest = hashlib.sha256()
    header = {
        "version": MEASURED_CACHE_VERSION,
        "source": [str(source.root), source.system, source.framework, source.version],
        "folders": {family: str(folder) for family, folder in source.folders.items()},
        "tables": {family: [list(f) for f in files] for family, files in tables},
        "inputs": repr(inputs),
        "libraries": {"numpy": np.__version__, "pyarrow": _installed_stamp("pyarrow")},
    }
    digest.update(json.dumps(header, sort_keys=True).encode())
    for path in _predictor_code():
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:32]


def _installed_stamp(module: str) -> list[object]:
    """The size and modification time of an installed module's entry file (an upgrade or
    reinstall changes them), found without importing it; empty when it is absent."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return []
    stat = Path(spec.origin).stat()
    return [spec.origin, stat.st_size, stat.st_mtime_ns]


def _predictor_code() -> list[Path]:
    """The files a measured predictor's build runs or reads: the predictor package, this
    module and the dtype sizes (`planner.py`), and the shipped calibration."""
    package = Path(__file__).resolve().parent.parent
    files = sorted((package / "predictor").rglob("*.py"))
    here = Path(__file__).resolve()
    extra = [here, here.with_name("planner.py"), package / "catalog" / "calibration.toml"]
    return [*files, *extra]


def build_predictor(
    config: SimulationConfig, choice: ExecutionChoice | None = None
) -> CompiledPredictor | None:
    """The compiled predictor of ``config``; None for ``linear`` and Python callables."""
    return _build(config, choice or choose_execution(config))


def build_mtp_predictor(config: SimulationConfig, drafter: ModelSpec) -> CompiledPredictor | None:
    """The ``mtp`` drafter's predictor: ``drafter`` (``ModelSpec.mtp_drafter()``) priced
    as ``config``'s model would be, one pipeline stage; None for ``linear`` and Python
    callables."""
    replica = dataclasses.replace(config.replica, num_pipeline_stages=1)
    config = dataclasses.replace(config, replica=replica)
    return _build(config, choose_execution(config), drafter)


def _build(
    config: SimulationConfig, choice: ExecutionChoice, model: ModelSpec | None = None
) -> CompiledPredictor | None:
    execution, replica = config.execution, config.replica
    if choice.kind == "measured" and choice.source is not None:
        return _build_measured(config, choice.source, model)
    if choice.kind not in ("roofline", "profiled"):
        return None
    catalog = catalog_for(config)
    spec = model or catalog.model(config.model_name(), field="replica.model")
    gpu = catalog.device(replica.device, field="replica.device")
    weight_bytes, kv_bytes = dtype_bytes(replica.dtype, replica.kv_cache_dtype)
    quantization = quantization_for(config, spec)
    if quantization is not None:  # the roofline reads every weight at this size
        weight_bytes = quantization.bytes_per_weight
    roofline = roofline_predictor(
        spec,
        gpu,
        tensor_parallel_size=replica.tensor_parallel_size,
        num_pipeline_stages=replica.num_pipeline_stages,
        weight_bytes=weight_bytes,
        kv_bytes=kv_bytes,
        efficiencies=execution.efficiency or Efficiencies(),
        cpu=execution.cpu or CpuOverheads(),
        calibration=choice.calibration if choice.kind == "roofline" else None,
        expert_parallel_size=replica.expert_parallel_size,
        data_parallel_size=replica.data_parallel_size,
    )
    if choice.kind == "roofline":
        return roofline
    profiled = execution.profiled or ProfiledConfig()  # checked: it names profiles
    profiles = read_profiles(
        [config.path(p) for p in profiled.profiles],
        model=None,
        tensor_parallel_size=replica.tensor_parallel_size,
    )
    return profiled_predictor(
        profiles,
        roofline,
        hidden_size=spec.hidden_size,
        options=profiled.options(),
        cache_dir=config.path(profiled.cache_dir) if profiled.cache_dir else None,
    )


def describe(
    predictor: CompiledPredictor | None, config: SimulationConfig, choice: ExecutionChoice
) -> dict[str, Any]:
    """What the summary records about the execution model."""
    out: dict[str, Any] = {"model": choice.kind, "requested": config.execution.model}
    out["label"] = choice.label()
    if choice.kernels:
        out["kernels"] = choice.kernels
    if choice.reason:
        out["why_not_measured"] = choice.reason
    if choice.calibration is not None:
        out["calibration"] = choice.calibration.source
    if predictor is not None:
        out["op_sources"] = {op.name: op.source for op in predictor.ops}
        fallbacks = predictor.description.get("fallbacks")
        if fallbacks:
            out["fallbacks"] = dict(fallbacks)
        if predictor.description.get("a2a"):
            out["a2a"] = predictor.description["a2a"]
    if choice.kind == "linear":
        out["ignores"] = ["replica.model", "replica.device", "replica.dtype", "parallelism"]
    return out


def with_lora(config: SimulationConfig, predictor: CompiledPredictor) -> CompiledPredictor:
    """``predictor`` with the LoRA operation added when ``[replica.lora]`` is set. Measured
    and profiled tables have no LoRA kernels: every predictor prices it as a roofline."""
    lora, replica = config.replica.lora, config.replica
    if lora is None:
        return predictor
    catalog = catalog_for(config)
    op = lora_op(
        lora,
        catalog.model(config.model_name(), field="replica.model"),
        catalog.device(replica.device, field="replica.device"),
        replica.dtype,
        replica.tensor_parallel_size,
        config.execution.efficiency or Efficiencies(),
    )
    return dataclasses.replace(predictor, ops=(*predictor.ops, op))


def lora_core(config: SimulationConfig) -> dict[str, float] | None:
    """``[replica.lora]`` as ``_core.SimConfig(lora=...)`` takes it (None without it)."""
    lora, replica = config.replica.lora, config.replica
    if lora is None:
        return None
    catalog = catalog_for(config)
    return lora.core(
        catalog.model(config.model_name(), field="replica.model"),
        catalog.device(replica.device, field="replica.device"),
        replica.dtype,
        replica.tensor_parallel_size,
        replica.num_pipeline_stages,
    )
