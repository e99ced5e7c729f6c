"""Cost and energy per million tokens of a simulated deployment.

What is modelled (docs/recommend.md, "Cost and energy"):

- **Cost** is GPU-hours times the catalog's ``price_per_hour``: a GPU is paid for the
  whole run, busy or idle. Prices are illustrative (``price_source``); set your own.
- **Power** of one GPU is linear in its busy fraction ``u`` (the share of the run its
  replica had a batch stage in flight, the simulator's ``busy_fraction``):
  ``P(u) = idle + (board - idle) * u``. ``board`` is the device's ``power_w``, the board
  power aiconfigurator-core's measured systems record (``systems/<system>.yaml``
  ``gpu.power``, the datasheet TDP); a busy GPU is taken to draw all of it, an upper
  bound (aiconfigurator's B200 vLLM tables, the only ones with a power column, measure a
  median of 74% of it in prefill attention, 39% in decode attention, 73% in MoE layers).
  ``idle`` is the device's ``idle_power_w``, else ``IDLE_POWER_FRACTION`` of the board
  power: an assumption, not a measurement (no measured system file records idle power).
- **Energy** is GPUs x duration x ``P(u)``, GPU boards only (no host, network or cooling).

Invariant: every figure is per million of the ``tokens`` the caller counts, over the same
``duration_s`` the GPUs are held; unknown prices or powers give ``None``, never 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from tokenyard._checks import fail
from tokenyard.simulation.config import SimulationConfig

__all__ = [
    "IDLE_POWER_FRACTION",
    "CostEnergy",
    "PoolUsage",
    "cost_and_energy",
    "cost_from_summary",
    "gpu_power_w",
    "pools_from_summary",
]

#: Idle draw (a model loaded, nothing running) as a share of the board power, where the
#: catalog gives no ``idle_power_w``. An assumption: set ``idle_power_w`` per device.
IDLE_POWER_FRACTION = 0.15
#: Busy fractions are ratios of floating-point sums; this much over 1 is rounding.
_BUSY_SLACK = 1e-9


@dataclasses.dataclass(frozen=True, kw_only=True)
class PoolUsage:
    """``num_gpus`` GPUs of catalog ``device``, each busy ``busy_fraction`` of the run."""

    device: str
    num_gpus: int
    busy_fraction: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class CostEnergy:
    """One deployment's cost and energy over ``duration_s`` serving ``tokens`` tokens.
    ``None`` where a device's price (``cost_*``) or power (``energy_*``, ``mean_power_w``)
    is unknown (0 in the catalog)."""

    num_gpus: int
    duration_s: float
    tokens: int
    gpu_hours: float
    cost_usd: float | None
    energy_kwh: float | None
    #: Mean draw of one GPU over the run, in W.
    mean_power_w: float | None
    usd_per_million_tokens: float | None
    kwh_per_million_tokens: float | None


def gpu_power_w(device: str) -> tuple[float, float] | None:
    """``(busy, idle)`` draw of one GPU in W: the catalog's ``power_w`` and
    ``idle_power_w`` (or ``IDLE_POWER_FRACTION`` of ``power_w``); None if ``power_w`` is
    unknown.

    Raises:
        ConfigError: ``device`` is not in the catalog (field ``device``).
    """
    from tokenyard import catalog

    spec = catalog.device(device, field="device")
    if spec.power_w <= 0:
        return None
    idle = spec.idle_power_w if spec.idle_power_w > 0 else IDLE_POWER_FRACTION * spec.power_w
    return spec.power_w, idle


def cost_and_energy(pools: Sequence[PoolUsage], *, duration_s: float, tokens: int) -> CostEnergy:
    """Cost and energy of ``pools`` held for ``duration_s`` seconds while serving
    ``tokens`` tokens (the caller's count: output tokens, or prompt and output).

    Raises:
        ConfigError: no pools, a pool without GPUs, a busy fraction outside [0, 1], a
            duration <= 0 or fewer than one token (each names its field and value).
    """
    from tokenyard import catalog

    if not pools:
        raise fail("pools", "needs at least one pool of GPUs", list(pools))
    if not duration_s > 0:
        raise fail("duration_s", "must be > 0 (the seconds the GPUs are held)", duration_s)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise fail("tokens", "must be an int >= 1 (the tokens served)", tokens)
    hours = duration_s / 3600.0
    gpus = 0
    cost: float | None = 0.0
    joules: float | None = 0.0
    for i, pool in enumerate(pools):
        where = f"pools[{i}]"
        if isinstance(pool.num_gpus, bool) or not isinstance(pool.num_gpus, int):
            raise fail(f"{where}.num_gpus", "must be an int >= 1", pool.num_gpus)
        if pool.num_gpus < 1:
            raise fail(f"{where}.num_gpus", "must be an int >= 1", pool.num_gpus)
        u = pool.busy_fraction
        if not 0 <= u <= 1 + _BUSY_SLACK:
            raise fail(f"{where}.busy_fraction", "must be in [0, 1]", u)
        u = min(u, 1.0)
        gpus += pool.num_gpus
        price = catalog.device(pool.device, field=f"{where}.device").price_per_hour
        cost = None if cost is None or price <= 0 else cost + pool.num_gpus * hours * price
        power = gpu_power_w(pool.device)
        if joules is not None and power is not None:
            busy_w, idle_w = power
            joules += pool.num_gpus * duration_s * (idle_w + (busy_w - idle_w) * u)
        else:
            joules = None
    millions = tokens / 1e6
    kwh = None if joules is None else joules / 3.6e6
    return CostEnergy(
        num_gpus=gpus,
        duration_s=duration_s,
        tokens=tokens,
        gpu_hours=gpus * hours,
        cost_usd=cost,
        energy_kwh=kwh,
        mean_power_w=None if joules is None else joules / (gpus * duration_s),
        usd_per_million_tokens=None if cost is None else cost / millions,
        kwh_per_million_tokens=None if kwh is None else kwh / millions,
    )


def pools_from_summary(config: SimulationConfig, summary: Mapping[str, Any]) -> list[PoolUsage]:
    """One ``PoolUsage`` per simulated scheduler (each attention DP rank of each
    replica, then of each decode replica) from a run's summary
    (``summary["replicas"]["busy_fraction"]``).

    Raises:
        ConfigError: the summary's schedulers are not the config's (field ``summary``).
    """
    r, c = config.replica, config.cluster
    busy = list(summary["replicas"]["busy_fraction"])
    ranks = [(r.device, r.tensor_parallel_size * r.num_pipeline_stages)] * (
        c.num_replicas * r.data_parallel_size
    )
    decode = c.decode
    if decode is not None:
        d = decode.resolve(r)  # each attention DP rank of a decode replica is a scheduler
        gpus = d.tensor_parallel_size * d.num_pipeline_stages
        ranks += [(d.device, gpus)] * (decode.num_replicas * d.data_parallel_size)
    if len(busy) != len(ranks):
        raise fail(
            "summary",
            f"has {len(busy)} schedulers' busy fractions; the config runs {len(ranks)}",
            len(busy),
        )
    return [
        PoolUsage(device=device, num_gpus=gpus, busy_fraction=float(u))
        for (device, gpus), u in zip(ranks, busy, strict=True)
    ]


def cost_from_summary(
    config: SimulationConfig, summary: Mapping[str, Any], *, tokens: str = "output"
) -> CostEnergy:
    """``cost_and_energy`` of a finished run: its pools, its makespan, and its ``output``
    (decode) tokens or ``total`` (prompt and output) tokens.

    Raises:
        ConfigError: ``tokens`` is neither, or the run served no such tokens.
    """
    if tokens not in ("output", "total"):
        raise fail("tokens", "must be 'output' or 'total'", tokens)
    duration = float(summary["makespan_s"])
    rates = summary["throughput"]
    per_s = rates["decode_tokens_per_s"]
    if tokens == "total":
        per_s += rates["prompt_tokens_per_s"]
    return cost_and_energy(
        pools_from_summary(config, summary),
        duration_s=duration,
        tokens=round(per_s * duration),
    )
