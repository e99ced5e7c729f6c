"""The built-in GPUs beyond Hopper (issue 29, part 4): Blackwell and the PCIe cards, their
sources, the measured system each maps to, their calibration, FP8/FP4 peaks in the
roofline, and the docs' tables kept in step with the catalog."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from step_shapes import prompt

from tokenyard import catalog
from tokenyard.cli import main as cli_main
from tokenyard.errors import ConfigError
from tokenyard.predictor import roofline_predictor
from tokenyard.predictor.calibration import PROXIES, builtin_calibration
from tokenyard.predictor.measured.data import SYSTEM_OF_DEVICE, package_root
from tokenyard.simulation import config_from_mapping
from tokenyard.simulation.execution import choose_execution

ROOT = Path(__file__).resolve().parent.parent
NEW = ("b200", "b300", "gb200", "gb300", "rtx-pro-6000", "a100-pcie", "l4", "a30")
BLACKWELL_SYSTEMS = {
    "b200": "b200_sxm",
    "b300": "b300_sxm",
    "gb200": "gb200",
    "gb300": "gb300",
    "rtx-pro-6000": "rtx_pro_6000_server",
}
NO_TABLES = ("a100-40gb", "a100-pcie", "a30", "h100-pcie", "l4", "a10g", "mi300x")


@pytest.fixture
def package() -> None:
    pytest.importorskip(
        "aiconfigurator_core", reason="the measured tables need the tokenyard[measured] extra"
    )


@pytest.mark.parametrize("name", NEW)
def test_each_new_device_loads_with_its_source(name: str) -> None:
    dev = catalog.device(name)
    assert dev.name == name
    assert dev.source.startswith("https://www.nvidia.com/")
    assert "illustrative" in dev.price_source
    assert dev.memory_gib > 0
    assert dev.dense_bf16_tflops > 0


def test_blackwell_datasheet_figures() -> None:
    b200 = catalog.device("b200")
    assert (b200.memory_gib, b200.dense_bf16_tflops, b200.memory_bandwidth_gbps) == (
        180.0,
        2250.0,
        7700.0,
    )
    # Dense, not sparse: half of the 4.5 / 9 / 18 PFLOPS NVIDIA prints.
    assert (b200.dense_fp8_tflops, b200.dense_fp4_tflops) == (4500.0, 9000.0)
    assert b200.interconnect_gbps == 1800.0  # NVLink 5
    gb200 = catalog.device("gb200-nvl72")
    assert gb200.name == "gb200"
    assert (gb200.dense_bf16_tflops, gb200.memory_bandwidth_gbps) == (2500.0, 8000.0)
    assert gb200.host_link_gbps == 450.0  # NVLink-C2C to Grace, one way
    # Driver figures where the marketed 10^9-byte one would overstate the GiB.
    assert catalog.device("b300").memory_gib == 268.5
    assert catalog.device("gb300").memory_gib == 277.5


def test_fp8_and_fp4_are_left_out_where_the_tensor_cores_lack_them() -> None:
    for name in ("a100-80gb", "a100-pcie", "a30", "a10g"):
        assert catalog.device(name).dense_fp8_tflops == 0.0
    for name in ("h100-sxm", "h200", "l40s", "l4", "mi300x"):
        dev = catalog.device(name)
        assert dev.dense_fp8_tflops > dev.dense_bf16_tflops
        assert dev.dense_fp4_tflops == 0.0
    for name in BLACKWELL_SYSTEMS:
        dev = catalog.device(name)
        assert dev.dense_fp4_tflops > dev.dense_fp8_tflops > dev.dense_bf16_tflops


def test_a_negative_fp8_peak_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "gpu.toml"
    path.write_text(
        "[devices.x]\nmemory_gib = 8\ndense_bf16_tflops = 10\nmemory_bandwidth_gbps = 100\n"
        "interconnect_gbps = 10\ndense_fp8_tflops = -1\n"
    )
    with pytest.raises(ConfigError) as info:
        catalog.load_catalog_file(path)
    assert info.value.field == "devices.x.dense_fp8_tflops"
    catalog.reset_catalog()


# ---- measured systems and calibration ------------------------------------------------------


def test_each_blackwell_device_maps_to_its_own_system() -> None:
    for name, system in BLACKWELL_SYSTEMS.items():
        assert SYSTEM_OF_DEVICE[name] == system
    for name in NO_TABLES:
        assert name not in SYSTEM_OF_DEVICE
    assert set(SYSTEM_OF_DEVICE) | set(NO_TABLES) == set(catalog.builtin_devices())


@pytest.mark.usefixtures("package")
def test_every_mapped_system_has_tables_and_the_others_have_none() -> None:
    root = package_root()
    assert root is not None
    for system in SYSTEM_OF_DEVICE.values():
        assert (root / system / "gemm" / "vllm").is_dir(), system
    # aiconfigurator ships these systems' files without measurements.
    for system in ("h100_pcie", "a100_pcie", "l4", "a30"):
        assert not (root / system / "gemm").exists(), system


def test_every_device_has_a_calibration_its_own_where_it_has_tables() -> None:
    for name, dev in catalog.builtin_devices().items():
        calibration = builtin_calibration(dev)
        assert calibration is not None, name
        if name in SYSTEM_OF_DEVICE:
            assert calibration.proxy_for == ""
            assert calibration.source.startswith(f"fitted to {SYSTEM_OF_DEVICE[name]}, vllm ")
        else:
            assert calibration.proxy_for == PROXIES[name]


def simulate_50(capsys: pytest.CaptureFixture[str], *settings: str) -> list[str]:
    """The output lines of ``tokenyard simulate`` over 50 requests on one replica, each of
    ``settings`` given as ``--set``."""
    sets = [arg for setting in settings for arg in ("--set", setting)]
    code = cli_main(["simulate", *sets, "--requests", "50", "--replicas", "1", "--no-progress"])
    assert code == 0
    return capsys.readouterr().out.splitlines()


@pytest.mark.usefixtures("package")
def test_simulate_on_b200_prices_from_its_measured_tables_by_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = simulate_50(capsys, "replica.device=b200", "replica.model=llama-3.1-8b")
    assert lines[1].startswith("execution model: measured: b200_sxm, vllm "), lines[1]
    assert "not measured" not in lines[2]


@pytest.mark.usefixtures("package")
@pytest.mark.parametrize("name", ["gb300", "rtx-pro-6000"])
def test_auto_chooses_each_blackwell_systems_tables(name: str) -> None:
    config = config_from_mapping({"replica": {"model": "llama-3.1-8b", "device": name}})
    choice = choose_execution(config)
    assert choice.kind == "measured"
    assert choice.label().startswith(f"measured: {BLACKWELL_SYSTEMS[name]}, vllm ")


def test_a_device_without_tables_falls_back_and_says_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = simulate_50(
        capsys,
        "replica.device=l4",
        "replica.model=llama-3.1-8b",
        "replica.scheduler.max_request_tokens=8192",
    )
    assert lines[1] == "execution model: roofline calibrated to measured tables (curves of l40s)"
    assert lines[2].startswith("  not measured: "), lines[2]
    if package_root() is not None:  # else the reason is the missing package
        assert "no measured system is known for 'l4'" in lines[2]


def test_predictor_show_says_why_a_device_is_not_measured(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = cli_main(["predictor", "show", "--model", "llama-3.1-8b", "--device", "a30"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out[0] == "execution model: roofline calibrated to measured tables (curves of a100-80gb)"
    assert out[1].startswith("  not measured: ")


# ---- FP8 and FP4 in the roofline -----------------------------------------------------------

PREFILL = prompt(8192)


@pytest.mark.parametrize("calibrated", [False, True])
def test_fp8_gemms_run_at_the_fp8_peak(calibrated: bool) -> None:
    model, dev = catalog.model("llama-3.1-8b"), catalog.device("h100-sxm")
    calibration = builtin_calibration(dev) if calibrated else None
    bf16 = roofline_predictor(model, dev, calibration=calibration)
    fp8 = roofline_predictor(
        model, dev, weight_bytes=1.0, calibration=calibration, gemm_activations="fp8"
    )
    a, b = bf16.op_times(PREFILL), fp8.op_times(PREFILL)
    # A compute-bound 8192-row GEMM: twice the peak, half the time (within the bytes' share).
    assert b["gate_up_proj"] == pytest.approx(a["gate_up_proj"] / 2, rel=0.02)
    # Attention and the LM head stay in BF16.
    assert b["attn_prefill"] == a["attn_prefill"]
    assert fp8.description["gemm_activations"] == "fp8"


def test_fp4_gemms_need_fp4_tensor_cores() -> None:
    model = catalog.model("llama-3.1-8b")
    with pytest.raises(ConfigError) as info:
        roofline_predictor(model, catalog.device("h100-sxm"), gemm_activations="fp4")
    assert info.value.field == "replica.device"
    assert "no FP4 tensor cores" in str(info.value)
    with pytest.raises(ConfigError) as info:
        roofline_predictor(model, catalog.device("a100-80gb"), gemm_activations="fp8")
    assert "devices.a100-80gb.dense_fp8_tflops is 0" in str(info.value)
    b200 = catalog.device("b200")
    fp8 = roofline_predictor(model, b200, weight_bytes=1.0, gemm_activations="fp8")
    fp4 = roofline_predictor(model, b200, weight_bytes=0.5, gemm_activations="fp4")
    assert fp4.op_times(PREFILL)["down_proj"] < fp8.op_times(PREFILL)["down_proj"]


# ---- the docs ------------------------------------------------------------------------------


def _number(cell: str) -> float:
    return float(cell) if cell else 0.0


def test_the_docs_gpu_table_is_the_catalog() -> None:
    text = (ROOT / "docs" / "catalog.md").read_text()
    section = text[text.index("## Built-in GPUs") : text.index("## Adding your own")]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    seen = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        seen[cells[0].strip("`")] = cells
    assert set(seen) == set(catalog.builtin_devices())
    for name, cells in seen.items():
        dev = catalog.device(name)
        figures = [_number(c) for c in cells[1:10]]
        assert figures == [
            dev.memory_gib,
            dev.dense_bf16_tflops,
            dev.dense_fp8_tflops,
            dev.dense_fp4_tflops,
            dev.memory_bandwidth_gbps,
            dev.interconnect_gbps,
            dev.host_link_gbps,
            dev.interconnect_latency_us,
            dev.price_per_hour,
        ], name
        system = SYSTEM_OF_DEVICE.get(name)
        assert cells[10] == (f"`{system}`" if system else "none"), name
        assert re.findall(r"`([^`]+)`", cells[11]) == list(dev.aliases), name
        assert f"({dev.source})" in cells[12], name


def test_the_predictor_docs_list_the_measured_systems() -> None:
    text = " ".join((ROOT / "docs" / "predictor.md").read_text().split())  # unwrapped
    for name, system in SYSTEM_OF_DEVICE.items():
        assert f"| `{name}` | `{system}` |" in text, name
        assert f"`{name}` = `{system}`" in text, name
    for name, proxy in PROXIES.items():
        assert f"`{name}` ({proxy}'s)" in text, name
