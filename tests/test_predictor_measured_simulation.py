"""The measured predictor as the simulator's default (docs/predictor.md#measured): the
execution model chosen, the settings refused at config time, broken or sparse tables met
in a run, the real tables of the tokenyard[measured] extra, and the kept predictor.

Most tests write small tables of their own (``measured_tables``); tests on the real package
data skip without it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from measured_tables import POWERS, gemm_columns, write, write_tables
from synthetic_jobs import SMALL_WORKLOAD, one_replica

from tokenyard import catalog
from tokenyard.errors import ConfigError
from tokenyard.predictor import ProfileError
from tokenyard.predictor.measured.build import measured_predictor
from tokenyard.predictor.measured.data import resolve_source
from tokenyard.simulation import config_from_mapping, load_config, simulate
from tokenyard.simulation.execution import choose_execution


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The formula tables of ``measured_tables.write_tables``."""
    return write_tables(tmp_path_factory.mktemp("measured") / "data")


# ---- in the simulator -----------------------------------------------------------------


def run(execution: dict[str, Any], **replica: Any) -> Any:
    base = {"model": "llama-3.1-8b", "device": "h100-sxm", **replica}
    return simulate(one_replica(base, SMALL_WORKLOAD, execution=execution))


def test_a_simulation_names_its_tables_and_every_op_source(tables: Path) -> None:
    result = run({"model": "measured", "measured": {"data_dir": str(tables)}})
    execution = result.summary["config"]["execution"]
    assert execution["model"] == "measured"
    assert execution["label"] == "measured: h100_sxm, vllm 0.2.0; GEMM bfloat16"
    assert execution["op_sources"]["attn_prefill"] == "measured:attention (0.2.0)"


def test_auto_falls_back_to_the_calibrated_roofline_and_says_why() -> None:
    config = config_from_mapping({"replica": {"model": "llama-3.1-8b", "device": "a10g"}})
    choice = choose_execution(config)
    assert choice.kind == "roofline"
    reasons = ("no measured system is known for 'a10g'", "measured tables are not installed")
    assert any(reason in choice.reason for reason in reasons)
    assert choice.calibration is not None
    assert choice.calibration.proxy_for == "l40s"
    assert choice.label() == "roofline calibrated to measured tables (curves of l40s)"


def test_auto_with_tables_named_refuses_to_fall_back(tables: Path) -> None:
    config = config_from_mapping(
        {
            "replica": {"model": "llama-3.1-8b", "device": "a10g"},
            "execution": {"measured": {"data_dir": str(tables)}},
        }
    )
    with pytest.raises(ConfigError, match="no measured system is known for 'a10g'") as err:
        choose_execution(config)
    assert err.value.field == "replica.device"


@pytest.mark.parametrize(
    ("execution", "field"),
    [
        ({"efficiency": {"gemm": 0.6}}, "execution.efficiency"),
        ({"model": "measured", "efficiency": {}}, "execution.efficiency"),
        ({"model": "roofline", "measured": {"system": "h100_sxm"}}, "execution.measured"),
        ({"model": "roofline", "constant_s": 0.01}, "execution.constant_s"),
        ({"model": "linear", "profiled": {"profiles": ["a.csv"]}}, "execution.profiled"),
        ({"measured": {"framework": "tgi"}}, "execution.measured.framework"),
        ({"model": "linear", "cpu": {"sample_s": 0.001}}, "execution.cpu"),
    ],
)
def test_a_setting_the_chosen_model_would_ignore_is_refused(
    execution: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_mapping({"execution": execution})
    assert err.value.field == field


def test_measured_with_an_unmeasured_dtype_lists_the_measured_ones(tables: Path) -> None:
    with pytest.raises(ConfigError, match="measured: bfloat16") as err:
        run({"model": "measured", "measured": {"data_dir": str(tables)}}, dtype="fp8")
    assert err.value.field == "replica.dtype"


def copy_tables(tables: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(tables, tmp_path / "data"))


def measured_in(root: Path, **measured: Any) -> dict[str, Any]:
    return {"model": "measured", "measured": {"data_dir": str(root), **measured}}


@pytest.mark.parametrize("link", ["dangling", "looping"])
def test_a_broken_link_in_data_dir_is_a_profile_error_naming_the_key_and_the_file(
    tables: Path, tmp_path: Path, link: str
) -> None:
    root = copy_tables(tables, tmp_path)
    path = root / "h100_sxm/attention/vllm/0.2.0/generation_attention_perf.parquet"
    path.unlink()
    path.symlink_to(tmp_path / "moved.parquet" if link == "dangling" else path)
    with pytest.raises(ProfileError) as err:  # was a bare FileNotFoundError / OSError
        run(measured_in(root))
    assert (err.value.field, err.value.path) == ("execution.measured.data_dir", str(path))
    assert str(err.value).startswith(f"execution.measured.data_dir: {path}: cannot read the table")


def test_a_gemm_table_cut_to_one_row_is_refused_naming_the_table_and_the_axis(
    tables: Path, tmp_path: Path
) -> None:
    # It used to price every GEMM from that one launch-bound reading (issue 32: TTFT p50
    # 21.6 s where the whole table gives 0.010 s).
    root = copy_tables(tables, tmp_path)
    gemm = root / "h100_sxm/gemm/vllm/0.2.0/gemm_perf.parquet"
    write(gemm, {name: values[:1] for name, values in gemm_columns().items()})
    with pytest.raises(ProfileError) as err:
        run(measured_in(root))
    assert (err.value.field, err.value.path) == ("execution.measured.data_dir", str(gemm))
    assert f"{gemm}:m: too sparse: gemm_dtype 'bfloat16' has one measured m (1)" in str(err.value)


def moe_columns(distributions: tuple[str, ...], tokens: list[int]) -> dict[str, list[Any]]:
    """Mixtral-8x7B's MoE block at TP 1 (times from a simple formula, in ms)."""
    rows = [(t, d) for d in distributions for t in tokens]
    n = len(rows)
    shape = {"hidden_size": 4096, "inter_size": 14336, "topk": 2, "num_experts": 8}
    return {
        "num_tokens": [r[0] for r in rows],
        **{name: [value] * n for name, value in shape.items()},
        "moe_tp_size": [1] * n,
        "moe_ep_size": [1] * n,
        "moe_dtype": ["bfloat16"] * n,
        "distribution": [r[1] for r in rows],
        "latency": [0.05 + 1e-4 * r[0] for r in rows],
    }


def mixtral_measured(root: Path, **kwargs: Any) -> Any:
    source = resolve_source(root, "h100_sxm", "vllm", "latest")
    return measured_predictor(
        catalog.model("mixtral-8x7b"), catalog.device("h100-sxm"), source, **kwargs
    )


def test_an_moe_routing_the_tables_lack_is_refused_listing_the_measured_ones(
    tables: Path, tmp_path: Path
) -> None:
    root = copy_tables(tables, tmp_path)
    routings = ("power_law_1.01", "power_law_1.2")
    write(root / "h100_sxm/moe/vllm/0.2.0/moe_perf.parquet", moe_columns(routings, POWERS))
    predictor = mixtral_measured(root)
    assert {op.name: op.source for op in predictor.ops}["moe_experts"] == "measured:moe (0.2.0)"
    # It used to fall back to the calibrated roofline, changing the answer unasked.
    with pytest.raises(ConfigError) as err:
        mixtral_measured(root, moe_distribution="balanced")
    assert err.value.field == "execution.measured.moe_distribution"
    assert "under power_law_1.01, power_law_1.2, got 'balanced'" in str(err.value)


def test_an_moe_shape_measured_at_one_token_count_is_not_measured(
    tables: Path, tmp_path: Path
) -> None:
    # aiconfigurator-core's own vLLM tables hold a few such shapes (a collection that
    # stopped early): the calibrated roofline prices them, and says why.
    root = copy_tables(tables, tmp_path)
    write(root / "h100_sxm/moe/vllm/0.2.0/moe_perf.parquet", moe_columns(("power_law_1.2",), [1]))
    predictor = mixtral_measured(root)
    assert {op.name: op.source for op in predictor.ops}["gate_up_proj"] == "calibrated"
    assert "one point, too few to interpolate" in predictor.description["fallbacks"]["gate_up_proj"]


@pytest.mark.parametrize(
    ("measured", "field", "message"),
    [
        ({"system": ""}, "system", "must not be empty (leave it out for the default), got ''"),
        ({"framework": " "}, "framework", "must not be empty"),
        ({"data_dir": ""}, "data_dir", "must not be empty"),
        ({"version": ""}, "version", "must not be empty (name one, or 'latest')"),
        (
            {"moe_distribution": "x"},
            "moe_distribution",
            "must be one of balanced, power_law_1.01, power_law_1.2 (the routings the MoE "
            "tables measure), got 'x'",
        ),
    ],
)
def test_an_empty_or_unmeasured_measured_setting_is_refused_at_config_time(
    measured: dict[str, Any], field: str, message: str
) -> None:
    # An empty system used to mean the default, and an unknown routing to change the answer.
    with pytest.raises(ConfigError) as err:
        config_from_mapping({"execution": {"measured": measured}})
    assert err.value.field == f"execution.measured.{field}"
    assert message in str(err.value)


def test_the_constant_efficiencies_still_price_the_datasheet_roofline() -> None:
    calibrated = run({"model": "roofline"})
    datasheet = run({"model": "roofline", "efficiency": {}})
    assert calibrated.summary["config"]["execution"]["label"].startswith("roofline calibrated")
    assert datasheet.summary["config"]["execution"]["label"].startswith("roofline: datasheet")
    assert calibrated.summary["latency_s"]["ttft"]["mean"] != pytest.approx(
        datasheet.summary["latency_s"]["ttft"]["mean"]
    )


def test_linear_says_what_it_ignores() -> None:
    execution = run({"model": "linear"}).summary["config"]["execution"]
    assert "ignores the replica's model, device" in execution["label"]
    assert "replica.device" in execution["ignores"]


# ---- the real tables (the tokenyard[measured] extra) ------------------------------------


@pytest.fixture
def package() -> None:
    pytest.importorskip(
        "aiconfigurator_core", reason="the measured tables need the tokenyard[measured] extra"
    )


@pytest.mark.usefixtures("package")
def test_the_default_run_prices_batches_from_measured_tables() -> None:
    config = config_from_mapping({})
    choice = choose_execution(config)
    assert choice.kind == "measured"
    assert choice.label().startswith("measured: a100_sxm, vllm ")
    assert choice.source is not None
    assert choice.source.field == "execution.measured"  # what errors about its tables name


@pytest.mark.usefixtures("package")
@pytest.mark.parametrize(
    "change",
    [
        {"device": "h200"},
        {"model": "mistral-7b"},
        {"tensor_parallel_size": 2},
        {"kv_cache_dtype": "fp8"},
        {"dtype": "fp8"},
    ],
)
def test_every_replica_setting_changes_the_answer(change: dict[str, Any]) -> None:
    base = run({})
    other = run({}, **change)
    assert base.summary["config"]["execution"]["model"] == "measured"
    assert other.summary["config"]["execution"]["model"] == "measured"
    assert other.summary["latency_s"]["tpot"]["mean"] != base.summary["latency_s"]["tpot"]["mean"]


@pytest.mark.usefixtures("package")
def test_a_big_model_on_a_fast_gpu_is_not_priced_like_a_small_one_on_a_slow_gpu() -> None:
    # The example: under the old linear default these two gave identical answers.
    big = run({}, model="llama-3.1-70b", device="h200", tensor_parallel_size=8)
    small = run({}, model="llama-2-7b", device="a100-80gb")
    assert big.summary["config"]["execution"]["label"].startswith("measured: h200_sxm")
    ratio = big.summary["latency_s"]["tpot"]["mean"] / small.summary["latency_s"]["tpot"]["mean"]
    assert not math.isclose(ratio, 1.0, rel_tol=0.05)


def test_a_qwen3_config_json_relative_to_the_config_file_runs(tmp_path: Path) -> None:
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_attention_heads": 16,
        "num_hidden_layers": 4,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 1000,
        "max_position_embeddings": 40960,
        "tie_word_embeddings": True,
    }
    (tmp_path / "qwen3.json").write_text(json.dumps(config))
    (tmp_path / "sim.toml").write_text(
        '[replica]\nmodel = "qwen3.json"\ndevice = "h100-sxm"\n[execution]\nmodel = "roofline"\n'
    )
    loaded = load_config(tmp_path / "sim.toml", {"workload": SMALL_WORKLOAD})
    result = simulate(loaded)
    assert result.summary["config"]["execution"]["op_sources"]["qk_norm"] == "calibrated"


def test_predictor_show_names_each_operations_source(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tokenyard.cli import main as cli_main

    code = cli_main(
        ["predictor", "show", "--model", "llama-3.1-8b", "--device", "a10g", "--decode", "8"]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("execution model: roofline calibrated to measured tables")
    assert "qkv_proj" in out
    assert "calibrated" in out


def test_predictor_show_refuses_a_negative_size(capsys: pytest.CaptureFixture[str]) -> None:
    from tokenyard.cli import main as cli_main

    with pytest.raises(SystemExit):
        cli_main(
            [
                "predictor",
                "show",
                "--model",
                "llama-3.1-8b",
                "--device",
                "a10g",
                "--prefill",
                "-5000",
            ]
        )
    assert "must be an integer in [0, 16777216], got -5000" in capsys.readouterr().err


def test_a_built_predictor_is_kept_on_disk_and_rebuilt_when_its_tables_change(
    tables: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    from tokenyard.predictor.measured import build
    from tokenyard.simulation import execution as ex

    monkeypatch.setenv("TOKENYARD_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "data"
    shutil.copytree(tables, root)
    measured = {"model": "measured", "measured": {"data_dir": str(root)}}

    def columns() -> dict[str, bytes]:
        ex._cached_measured.cache_clear()  # the in-process caches: only the disk's is left
        build._read_version.cache_clear()
        result = run(measured)
        return {name: col.tobytes() for name, col in result.columns.items()}

    built = columns()
    kept = sorted((tmp_path / "cache/predictors").glob("measured-*.json"))
    assert len(kept) == 1

    def no_build(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("built again instead of read from the cache")

    with monkeypatch.context() as m:
        m.setattr(ex, "measured_predictor", no_build)
        assert columns() == built, "the kept predictor prices exactly as the built one"
    # Slower GEMMs: a new key, a new build, new times.
    gemm = root / "h100_sxm/gemm/vllm/0.2.0/gemm_perf.parquet"
    slower = gemm_columns()
    slower["latency"] = [3 * v for v in slower["latency"]]
    write(gemm, slower)
    assert columns() != built
    assert len(list((tmp_path / "cache/predictors").glob("measured-*.json"))) == 2
    # Rewritten during the session: the in-process caches answer by file version too, so
    # the original latencies price as at first without clearing anything.
    write(gemm, gemm_columns())
    restored = run(measured)
    assert {name: col.tobytes() for name, col in restored.columns.items()} == built
    # Another numpy (it interpolates the tables) is another key: built again.
    ex._cached_measured.cache_clear()
    with monkeypatch.context() as m:
        m.setattr(np, "__version__", "0.0.0+another")
        m.setattr(ex, "measured_predictor", no_build)
        with pytest.raises(AssertionError, match="built again"):
            run(measured)
    ex._cached_measured.cache_clear()
    build._read_version.cache_clear()
