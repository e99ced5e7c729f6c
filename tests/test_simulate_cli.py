"""`tokenyard simulate`: config files (TOML, YAML), flag and --set overrides, the summary,
the result files, --help, and errors that name the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenyard.cli import main
from tokenyard.workload import sample_path

SMALL = """
seed = 1
[cluster]
num_replicas = 2
[replica.scheduler]
policy = "sarathi"
[workload]
kind = "synthetic"
num_requests = 300
[workload.arrival]
kind = "poisson"
qps = 5.0
[workload.prompt_tokens]
kind = "uniform"
low = 32
high = 512
[workload.output_tokens]
kind = "fixed"
value = 16
"""

SMALL_YAML = """
cluster: {num_replicas: 2, global_scheduler: {policy: power_of_two}}
replica: {model: llama-3.1-8b, scheduler: {policy: orca, max_request_tokens: 16384}}
workload:
  kind: trace
  format: mooncake
  path: PATH
"""


def test_a_toml_config_with_overrides_writes_every_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "small.toml"
    config.write_text(SMALL)
    out = tmp_path / "out"
    argv = ["simulate", str(config), "--output", str(out), "--replicas", "3"]
    assert main([*argv, "--set", "workload.num_requests=200", "--stage-trace"]) == 0
    printed = capsys.readouterr().out
    assert "3 x llama-2-7b" in printed
    assert "200 requests" in printed
    assert "TTFT" in printed
    assert {p.name for p in out.iterdir()} == {
        "command.txt",
        "config.json",
        "token_gaps.parquet",
        "requests.csv",
        "requests.parquet",
        "samples.parquet",
        "summary.json",
        "trace.json",
    }
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["replica_policy"] == "sarathi"
    assert summary["config"]["num_replicas"] == 3


def test_a_yaml_config_replays_a_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "small.yaml"
    config.write_text(SMALL_YAML.replace("PATH", str(sample_path("mooncake"))))
    assert main(["simulate", str(config), "--json", "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["num_requests"] > 0
    assert summary["config"]["global_policy"] == "power_of_two"


def test_the_default_job_runs_from_flags_alone(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--requests", "500", "--qps", "10", "--no-progress"]) == 0
    assert "500 requests" in capsys.readouterr().out


def test_help_documents_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    text = capsys.readouterr().out
    for flag in (
        "--output",
        "--set",
        "--replicas",
        "--global-policy",
        "--replica-policy",
        "--requests",
        "--qps",
        "--trace",
        "--trace-format",
        "--seed",
        "--stage-trace",
        "--json",
        "--no-progress",
        "replica.scheduler.",
        "prefix_affinity",
    ):
        assert flag in text, flag


def test_an_unknown_key_is_an_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "--set", "replica.scheduler.chunk=3"]) == 2
    assert "replica.scheduler.chunk: unknown key" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text("[cluster]\nnum_replicas = -1\n")
    out = tmp_path / "out"
    assert main(["simulate", str(bad), "--output", str(out)]) == 2
    assert "cluster.num_replicas" in capsys.readouterr().err
    assert not out.exists(), "nothing is written on an error"


def test_a_missing_config_file_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "/no/such/file.toml"]) == 2
    assert "/no/such/file.toml" in capsys.readouterr().err


TINY = ["simulate", "--requests", "20", "--replicas", "1", "--no-progress"]


def test_json_with_output_keeps_stdout_one_json_document(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*TINY, "--json", "--output", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["num_requests"] == 20
    assert "wrote" in captured.err


def test_links_in_the_output_folder_are_replaced_not_written_through(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    names = ("summary.json", "command.txt", "report.html")
    for name in names:
        (tmp_path / f"victim-{name}").write_text("not yours\n")
        (out / name).symlink_to(tmp_path / f"victim-{name}")
    (out / "plots").symlink_to(elsewhere, target_is_directory=True)
    assert main([*TINY, "--output", str(out), "--plots"]) == 0
    for name in names:
        assert (tmp_path / f"victim-{name}").read_text() == "not yours\n"
        assert not (out / name).is_symlink()
    assert json.loads((out / "summary.json").read_text())["num_requests"] == 20
    assert list(elsewhere.iterdir()) == []
    assert not (out / "plots").is_symlink()
    assert (out / "plots" / "latency.png").is_file()
