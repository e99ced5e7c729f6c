"""Cost and energy per million tokens (tokenyard.recommend.cost): hand-checked figures,
the linear power model, unknown prices and powers, refusals by field, the catalog's
board powers against aiconfigurator-core's measured system files, and a real run."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from tokenyard import catalog
from tokenyard.errors import ConfigError
from tokenyard.recommend.cost import (
    IDLE_POWER_FRACTION,
    PoolUsage,
    cost_and_energy,
    cost_from_summary,
    gpu_power_w,
    pools_from_summary,
)
from tokenyard.simulation.config import config_from_mapping


@pytest.fixture(autouse=True)
def _builtin_catalog() -> Iterator[None]:
    catalog.reset_catalog()
    yield
    catalog.reset_catalog()


def _with_device(tmp_path: Path, name: str, **fields: object) -> None:
    base = catalog.device("h200")
    entry = {k: v for k, v in vars(base).items() if k not in ("name", "aliases")}
    entry.update(fields)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"devices": {name: entry}}))
    catalog.load_catalog_file(path)


def test_eight_h200s_half_busy_for_an_hour_serving_a_million_tokens() -> None:
    """8 GPUs x 1 h x 3.80 USD = 30.40 USD; each draws 105 + (700 - 105) x 0.5 = 402.5 W
    (idle 15% of 700), 8 x 402.5 W x 1 h = 3.22 kWh."""
    got = cost_and_energy(
        [PoolUsage(device="h200", num_gpus=8, busy_fraction=0.5)],
        duration_s=3600.0,
        tokens=1_000_000,
    )
    assert got.num_gpus == 8
    assert got.gpu_hours == pytest.approx(8.0)
    assert got.usd_per_million_tokens == pytest.approx(30.40)
    assert got.mean_power_w == pytest.approx(402.5)
    assert got.kwh_per_million_tokens == pytest.approx(3.22)


def test_power_is_linear_in_the_busy_fraction_from_idle_to_the_board_power() -> None:
    busy_w, idle_w = gpu_power_w("h100-sxm") or (0.0, 0.0)
    assert (busy_w, idle_w) == (700.0, pytest.approx(700.0 * IDLE_POWER_FRACTION))
    draws = [
        cost_and_energy(
            [PoolUsage(device="h100-sxm", num_gpus=1, busy_fraction=u)],
            duration_s=10.0,
            tokens=100,
        ).mean_power_w
        for u in (0.0, 0.25, 1.0)
    ]
    assert draws[0] == pytest.approx(idle_w)
    assert draws[1] == pytest.approx(idle_w + 0.25 * (busy_w - idle_w))
    assert draws[2] == pytest.approx(busy_w)


def test_cost_does_not_depend_on_how_busy_the_gpus_are() -> None:
    """A GPU is paid for the whole run; only the energy follows the work."""
    figures = [
        cost_and_energy(
            [PoolUsage(device="b200", num_gpus=4, busy_fraction=u)], duration_s=60.0, tokens=5000
        )
        for u in (0.1, 0.9)
    ]
    assert figures[0].cost_usd == pytest.approx(figures[1].cost_usd or math.nan)
    assert (figures[0].energy_kwh or 0) < (figures[1].energy_kwh or 0)


def test_two_pools_add_up() -> None:
    one = cost_and_energy(
        [PoolUsage(device="h200", num_gpus=4, busy_fraction=0.8)], duration_s=100.0, tokens=10
    )
    two = cost_and_energy(
        [PoolUsage(device="h100-sxm", num_gpus=2, busy_fraction=0.3)], duration_s=100.0, tokens=10
    )
    both = cost_and_energy(
        [
            PoolUsage(device="h200", num_gpus=4, busy_fraction=0.8),
            PoolUsage(device="h100-sxm", num_gpus=2, busy_fraction=0.3),
        ],
        duration_s=100.0,
        tokens=10,
    )
    assert both.num_gpus == 6
    assert both.cost_usd == pytest.approx((one.cost_usd or 0) + (two.cost_usd or 0))
    assert both.energy_kwh == pytest.approx((one.energy_kwh or 0) + (two.energy_kwh or 0))


def test_a_catalog_idle_power_replaces_the_modelled_share(tmp_path: Path) -> None:
    _with_device(tmp_path, "quiet-gpu", idle_power_w=50.0)
    assert gpu_power_w("quiet-gpu") == (700.0, 50.0)
    got = cost_and_energy(
        [PoolUsage(device="quiet-gpu", num_gpus=1, busy_fraction=0.0)], duration_s=1.0, tokens=1
    )
    assert got.mean_power_w == pytest.approx(50.0)


def test_unknown_price_or_power_gives_none_not_zero(tmp_path: Path) -> None:
    _with_device(tmp_path, "mystery-gpu", price_per_hour=0.0, power_w=0.0)
    got = cost_and_energy(
        [
            PoolUsage(device="h200", num_gpus=1, busy_fraction=0.5),
            PoolUsage(device="mystery-gpu", num_gpus=1, busy_fraction=0.5),
        ],
        duration_s=10.0,
        tokens=10,
    )
    assert got.cost_usd is None
    assert got.usd_per_million_tokens is None
    assert got.energy_kwh is None
    assert got.mean_power_w is None
    assert got.gpu_hours == pytest.approx(20 / 3600)


def test_an_idle_power_above_the_board_power_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="idle_power_w"):
        _with_device(tmp_path, "odd-gpu", idle_power_w=800.0)


@pytest.mark.parametrize(
    ("pools", "duration_s", "tokens", "field"),
    [
        ([], 1.0, 1, "pools"),
        ([PoolUsage(device="h200", num_gpus=1, busy_fraction=1.5)], 1.0, 1, "busy_fraction"),
        ([PoolUsage(device="h200", num_gpus=1, busy_fraction=-0.1)], 1.0, 1, "busy_fraction"),
        ([PoolUsage(device="h200", num_gpus=0, busy_fraction=0.5)], 1.0, 1, "num_gpus"),
        ([PoolUsage(device="h200", num_gpus=1, busy_fraction=0.5)], 0.0, 1, "duration_s"),
        ([PoolUsage(device="h200", num_gpus=1, busy_fraction=0.5)], 1.0, 0, "tokens"),
        ([PoolUsage(device="no-such-gpu", num_gpus=1, busy_fraction=0.5)], 1.0, 1, "device"),
    ],
)
def test_bad_inputs_are_refused_naming_the_field(
    pools: list[PoolUsage], duration_s: float, tokens: int, field: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        cost_and_energy(pools, duration_s=duration_s, tokens=tokens)
    assert field in str(caught.value)


def test_catalog_board_powers_are_aiconfigurators_measured_system_files() -> None:
    """Every device that aiconfigurator-core measures has its systems file's gpu.power."""
    core = pytest.importorskip("aiconfigurator_core")
    yaml = pytest.importorskip("yaml")
    systems = Path(core.__file__).parent / "systems"
    files = {
        "a100-80gb": "a100_sxm",
        "h100-sxm": "h100_sxm",
        "h100-pcie": "h100_pcie",
        "h200": "h200_sxm",
        "l40s": "l40s",
        "b200": "b200_sxm",
        "b300": "b300_sxm",
        "gb200": "gb200",
        "gb300": "gb300",
        "rtx-pro-6000": "rtx_pro_6000_server",
        "a100-pcie": "a100_pcie",
        "l4": "l4",
        "a30": "a30",
    }
    for device, system in files.items():
        power = yaml.safe_load((systems / f"{system}.yaml").read_text())["gpu"]["power"]
        assert catalog.device(device).power_w == float(power), device
    assert all(d.power_w > 0 for d in catalog.builtin_devices().values())


def test_a_finished_run_is_priced_from_its_summary() -> None:
    from tokenyard.simulation import simulate

    config = config_from_mapping(
        {
            "cluster": {"num_replicas": 2},
            "replica": {"model": "llama-3.1-8b", "device": "h100-sxm"},
            "execution": {"model": "roofline"},
            "workload": {
                "kind": "synthetic",
                "num_requests": 40,
                "arrival": {"kind": "poisson", "qps": 20.0},
                "prompt_tokens": {"kind": "fixed", "value": 200},
                "output_tokens": {"kind": "fixed", "value": 20},
            },
        }
    )
    summary = simulate(config).summary
    pools = pools_from_summary(config, summary)
    assert [p.num_gpus for p in pools] == [1, 1]
    out = cost_from_summary(config, summary)
    total = cost_from_summary(config, summary, tokens="total")
    assert out.tokens == 40 * 20
    assert total.tokens == 40 * 220
    assert out.cost_usd == pytest.approx(2 * summary["makespan_s"] / 3600 * 3.00)
    assert out.usd_per_million_tokens == pytest.approx((out.cost_usd or 0) / 800e-6)
    with pytest.raises(ConfigError, match="summary"):
        pools_from_summary(config_from_mapping({"cluster": {"num_replicas": 3}}), summary)
