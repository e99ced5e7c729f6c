"""The ``measured`` extra where it cannot install, and the first build of its tables.

aiconfigurator-core (the extra) supports CPython 3.11 to 3.13; on 3.10 the extra's marker
installs nothing, and ``auto`` used to fall back to the roofline with only the banner to say
so. These tests stand in another Python (``execution._running_python``) and remove the
package (``sys.modules`` entry None: its import, and ``find_spec``, find nothing).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
from measured_tables import attention_columns, gemm_columns, write
from synthetic_jobs import SMALL_WORKLOAD

from tokenyard.errors import ConfigError, MeasuredUnavailableWarning, TokenyardWarning
from tokenyard.predictor.measured import build
from tokenyard.simulation import config_from_mapping, simulate
from tokenyard.simulation import execution as ex
from tokenyard.simulation.execution import choose_execution

DEFAULT_JOB = {"replica": {"model": "llama-2-7b", "device": "a100-80gb"}}


@pytest.fixture
def without_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "aiconfigurator_core", None)


def on_python(monkeypatch: pytest.MonkeyPatch, version: tuple[int, int]) -> None:
    monkeypatch.setattr(ex, "_running_python", lambda: version)


def choose_without_warning(mapping: dict[str, object]) -> ex.ExecutionChoice:
    """``choose_execution``, checking it warns nothing (pyproject's filterwarnings ignores
    this warning for the rest of the suite, so it is recorded here explicitly)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        choice = choose_execution(config_from_mapping(mapping))
    assert [str(w.message) for w in caught] == []
    return choice


@pytest.mark.usefixtures("without_the_package")
def test_on_python_3_10_the_default_model_warns_why_measured_is_not_used_and_what_to_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    on_python(monkeypatch, (3, 10))
    with pytest.warns(MeasuredUnavailableWarning) as caught:
        choice = choose_execution(config_from_mapping(DEFAULT_JOB))
    assert choice.kind == "roofline"
    assert choice.label() == "roofline calibrated to measured tables"
    (warning,) = caught
    message = str(warning.message)
    assert "cannot be installed on Python 3.10" in message
    assert "aiconfigurator-core (the tokenyard[measured] extra), supports Python 3.11 to 3.13" in (
        message
    )
    assert "prices batches on a100-80gb with the roofline calibrated to them" in message
    assert "run tokenyard on Python 3.11-3.13 with pip install 'tokenyard[measured]'" in message
    assert 'set execution.model = "roofline"' in message
    assert issubclass(MeasuredUnavailableWarning, TokenyardWarning)


@pytest.mark.usefixtures("without_the_package")
def test_a_simulation_on_python_3_14_warns_too(monkeypatch: pytest.MonkeyPatch) -> None:
    on_python(monkeypatch, (3, 14))
    config = config_from_mapping({**DEFAULT_JOB, "workload": SMALL_WORKLOAD})
    with pytest.warns(MeasuredUnavailableWarning, match=r"on Python 3\.14"):
        result = simulate(config)
    assert result.summary["config"]["execution"]["model"] == "roofline"


@pytest.mark.usefixtures("without_the_package")
@pytest.mark.parametrize(
    "setting",
    [
        {"execution": {"model": "roofline"}},  # chosen by name: nothing to warn about
        {"replica": {"model": "llama-2-7b", "device": "a10g"}},  # no tables measure it
    ],
)
def test_no_warning_where_measured_would_not_be_used_anyway(
    monkeypatch: pytest.MonkeyPatch, setting: dict[str, object]
) -> None:
    on_python(monkeypatch, (3, 10))
    assert choose_without_warning({**DEFAULT_JOB, **setting}).kind == "roofline"


@pytest.mark.usefixtures("without_the_package")
def test_on_a_supported_python_a_missing_extra_falls_back_as_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the extra by choice (`pip install tokenyard`), the banner and the summary's
    ``why_not_measured`` say so; no warning."""
    on_python(monkeypatch, (3, 11))
    choice = choose_without_warning(DEFAULT_JOB)
    assert choice.kind == "roofline"
    assert "the measured tables are not installed; pip install 'tokenyard[measured]'" in (
        choice.reason
    )


@pytest.mark.usefixtures("without_the_package")
def test_measured_by_name_on_python_3_10_says_why_in_its_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    on_python(monkeypatch, (3, 10))
    config = config_from_mapping({**DEFAULT_JOB, "execution": {"model": "measured"}})
    with pytest.raises(ConfigError, match=r"cannot be installed on Python 3\.10") as raised:
        choose_execution(config)
    assert "run tokenyard on Python 3.11-3.13" in str(raised.value)


# ---- the first build of a measured predictor ------------------------------------------


@pytest.fixture
def tables(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    write(root / "h100_sxm/gemm/vllm/0.2.0/gemm_perf.parquet", gemm_columns())
    attention = root / "h100_sxm/attention/vllm/0.2.0"
    write(attention / "context_attention_perf.parquet", attention_columns(False))
    write(attention / "generation_attention_perf.parquet", attention_columns(True))
    return root


def test_the_first_build_says_so_on_stderr_and_a_load_from_the_cache_does_not(
    tables: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("TOKENYARD_CACHE_DIR", str(tmp_path / "cache"))
    config = config_from_mapping(
        {
            "replica": {"model": "llama-3.1-8b", "device": "h100-sxm"},
            "execution": {"model": "measured", "measured": {"data_dir": str(tables)}},
        }
    )

    def choose() -> str:
        ex._cached_measured.cache_clear()  # only the disk's cache is left
        build._read_version.cache_clear()
        assert choose_execution(config).kind == "measured"
        return capsys.readouterr().err

    first = choose()
    assert first.splitlines() == [
        "tokenyard: building measured tables for llama-3.1-8b on h100_sxm "
        "(first run only, up to a few seconds)..."
    ]
    assert choose() == "", "loaded from the cache: nothing to say"
    ex._cached_measured.cache_clear()
    build._read_version.cache_clear()
