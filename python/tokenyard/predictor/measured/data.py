"""Where measured GPU tables live, and which of them a (system, framework, version) means.

The tables follow ``aiconfigurator-core``'s layout (NVIDIA, Apache-2.0): under a data root,
``<system>/<family>/<framework>/<version>/<table>.parquet``, with ``family`` one of
``gemm``, ``attention``, ``comm``, ``moe``, ``mla`` (MLA attention modules),
``mla_bmm`` (MLA's absorbed-decode BMMs) and ``linear_attention`` (gated DeltaNet and
Mamba2 kernels). The package's own root is found by importing
``aiconfigurator_core`` (the ``tokenyard[measured]`` extra); any folder in the same layout
may be named instead (``[execution.measured] data_dir``), which is how the tests feed
small tables of their own.

``version = "latest"`` is the version the package marks current for that system and
framework (its ``query_versions.yaml``), else the highest version with GEMM tables. Each
family then uses the newest version at or below it: collections are refreshed one family
at a time, and an older table stands in for one not re-collected (the package does the
same, never filling forward).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tokenyard.errors import ConfigError

__all__ = [
    "FAMILIES",
    "FRAMEWORKS",
    "MOE_DISTRIBUTIONS",
    "SYSTEM_OF_DEVICE",
    "MeasuredSource",
    "package_root",
    "resolve_source",
]

FRAMEWORKS = ("vllm", "sglang", "trtllm")
#: ``quantize``: vLLM's activation-quantization costs, which price static FP8 GEMMs
#: (``ops.StaticFp8GemmTimes``); ``linear_attention``: the GDN and Mamba2 kernels
#: (``ops.LinearMixerTimes``).
FAMILIES = ("gemm", "attention", "comm", "moe", "mla", "mla_bmm", "quantize", "linear_attention")
#: The expert routings the MoE tables measure (``moe_perf.parquet``'s ``distribution``;
#: every table of aiconfigurator-core 0.12.0 holds the power laws, most also ``balanced``).
MOE_DISTRIBUTIONS = ("balanced", "power_law_1.01", "power_law_1.2")

#: Catalog device -> measured system. Only a system measured on that very GPU is listed:
#: an A100 40GB has the A100 80GB's chip but not its memory bandwidth, an H100 PCIe has
#: neither the SXM's clocks nor its bandwidth, so both price with the calibrated roofline.
#: aiconfigurator-core 0.12.0 also ships system files for h100_pcie, a100_pcie, l4 and a30,
#: but no tables under them: those devices borrow a sibling's calibrated curves
#: (``calibration.PROXIES``), and ``auto`` says why in the simulator's banner.
SYSTEM_OF_DEVICE: Mapping[str, str] = {
    "a100-80gb": "a100_sxm",
    "h100-sxm": "h100_sxm",
    "h200": "h200_sxm",
    "l40s": "l40s",
    "b200": "b200_sxm",
    "b300": "b300_sxm",
    "gb200": "gb200",
    "gb300": "gb300",
    "rtx-pro-6000": "rtx_pro_6000_server",
}


def package_root() -> Path | None:
    """The data root inside the installed ``aiconfigurator_core`` package, or None. The
    package is located, not imported: only its data files are read."""
    import importlib.util

    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations))) / "systems" / "data"
    return root if root.is_dir() else None


def package_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("aiconfigurator-core")
    except Exception:
        return None


def _version_key(version: str) -> tuple[tuple[int, int | str], ...]:
    """Sorts ``0.5.6.post2 < 0.5.10 < 0.5.14`` and ``1.3.0rc10 < 1.3.0rc20 < 1.3.0``."""
    parts: list[tuple[int, int | str]] = []
    for token in re.findall(r"\d+|[a-z]+", version.lower()):
        if token.isdigit():
            parts.append((1, int(token)))
        elif token in ("rc", "a", "b", "dev"):
            parts.append((0, token))  # pre-releases sort below the release
        else:
            parts.append((2, token))
    return tuple(parts)


@dataclasses.dataclass(frozen=True)
class MeasuredSource:
    """The folders one predictor reads: ``folders[family]`` (absent if not measured);
    ``field`` is the config key that named them, for errors about their tables."""

    root: Path
    system: str
    framework: str
    version: str
    folders: Mapping[str, Path] = dataclasses.field(hash=False, compare=False)
    field: str = dataclasses.field(default="execution.measured", compare=False)

    def describe(self) -> str:
        """``h100_sxm, vllm 0.24.0`` (with the families that came from older versions)."""
        older = sorted(
            f"{family} {folder.name}"
            for family, folder in self.folders.items()
            if folder.name != self.version and family not in ("comm", "nccl")
        )
        text = f"{self.system}, {self.framework} {self.version}"
        return f"{text} ({', '.join(older)})" if older else text


def _versions(root: Path, system: str, family: str, framework: str) -> list[str]:
    folder = root / system / family / framework
    if not folder.is_dir():
        return []
    found = [p.name for p in folder.iterdir() if p.is_dir() and any(p.glob("*.parquet"))]
    return sorted(found, key=_version_key)


@functools.lru_cache(maxsize=8)
def _query_versions(path: Path, mtime_ns: int) -> object:
    """``path`` parsed (read only), once per process and file version: every simulation's
    execution choice asks, and the YAML parse costs ~9 ms. Raises yaml.YAMLError."""
    import yaml

    return yaml.safe_load(path.read_text())


def _current_version(root: Path, system: str, framework: str) -> str | None:
    """The package's ``current`` slot for (system, framework), if it says one."""
    path = root.parent / "query_versions.yaml"
    if not path.is_file():
        return None
    import yaml

    try:
        data: Any = _query_versions(path, path.stat().st_mtime_ns) or {}
        slots = (data.get("overrides") or {}).get(system, {}).get(framework)
        slots = slots or (data.get("defaults") or {}).get(framework) or {}
        current = slots.get("current")
    except (AttributeError, yaml.YAMLError):
        return None
    return str(current) if current else None


def measured_catalog(root: Path) -> dict[str, dict[str, list[str]]]:
    """``{system: {framework: [versions with GEMM and attention tables]}}`` under ``root``."""
    out: dict[str, dict[str, list[str]]] = {}
    for system in sorted(p.name for p in root.iterdir() if p.is_dir()):
        for framework in FRAMEWORKS:
            gemm = set(_versions(root, system, "gemm", framework))
            attention = set(_versions(root, system, "attention", framework))
            if gemm and attention:
                both = sorted(gemm | attention, key=_version_key)
                out.setdefault(system, {})[framework] = both
    return out


def _listing(root: Path) -> str:
    catalog = measured_catalog(root)
    if not catalog:
        return "none"
    return "; ".join(
        f"{system}: " + ", ".join(f"{fw} {'/'.join(vs)}" for fw, vs in frameworks.items())
        for system, frameworks in catalog.items()
    )


def _fail(field: str, message: str, value: object) -> ConfigError:
    return ConfigError(f"{field}: {message}", field=field, value=repr(value))


def resolve_source(
    root: Path,
    system: str,
    framework: str,
    version: str,
    *,
    where: str = "execution.measured",
    field: str | None = None,
) -> MeasuredSource:
    """The folders of each family for ``system``/``framework``/``version`` under ``root``.

    ``where`` prefixes the keys of errors about the choice; ``field`` is the key that named
    ``root`` (default ``{where}.data_dir``; ``where`` itself for the package's tables), which
    errors about its tables name.

    Raises:
        ConfigError: the system, framework or version has no GEMM or attention tables; the
            message lists what is measured.
    """
    if framework not in FRAMEWORKS:
        raise _fail(
            f"{where}.framework",
            f"must be one of {', '.join(FRAMEWORKS)}, got {framework!r}",
            framework,
        )
    if not (root / system).is_dir():
        raise _fail(
            f"{where}.system",
            f"no measured tables for system {system!r} under {root}; measured: {_listing(root)}",
            system,
        )
    gemm = _versions(root, system, "gemm", framework)
    attention = _versions(root, system, "attention", framework)
    if not gemm or not attention:
        raise _fail(
            f"{where}.framework",
            f"{system} has no {framework} GEMM and attention tables; measured: {_listing(root)}",
            framework,
        )
    if version == "latest":
        current = _current_version(root, system, framework)
        version = current if current in gemm or current in attention else gemm[-1]
    elif version not in gemm and version not in attention:
        raise _fail(
            f"{where}.version",
            f"{system}/{framework} has no version {version!r}; measured: "
            f"{', '.join(sorted(set(gemm) | set(attention), key=_version_key))} (or 'latest')",
            version,
        )
    folders: dict[str, Path] = {}
    for family in FAMILIES:
        usable = [
            v
            for v in _versions(root, system, family, framework)
            if _version_key(v) <= _version_key(version)
        ]
        if usable:
            folders[family] = root / system / family / framework / usable[-1]
    nccl = _versions(root, system, "comm", "nccl")
    if nccl:  # NCCL's own tables: sizes and GPU counts the framework's all-reduce lacks
        folders["nccl"] = root / system / "comm" / "nccl" / nccl[-1]
    for family in ("gemm", "attention"):
        if family not in folders:
            raise _fail(
                f"{where}.version",
                f"{system}/{framework} has no {family} tables at or below {version}; "
                f"measured: {_listing(root)}",
                version,
            )
    return MeasuredSource(root, system, framework, version, folders, field or f"{where}.data_dir")
