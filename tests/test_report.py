"""Plots, HTML reports and comparisons of results folders (docs/simulate.md#reports):
the files, the embedded images, and the numbers in the tables against summary.json."""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tokenyard.cli import main as cli_main
from tokenyard.errors import ConfigError
from tokenyard.report import compare_runs, load_run, write_report
from tokenyard.report.html import comparison_rows
from tokenyard.report.run import cdf, gap_cdf
from tokenyard.simulation import config_from_mapping, load_config, simulate

WORKLOAD = {
    "kind": "synthetic",
    "num_requests": 300,
    "seed": 3,
    "arrival": {"kind": "poisson", "qps": 8.0},
    "prompt_tokens": {"kind": "uniform", "low": 50, "high": 800},
    "output_tokens": {"kind": "uniform", "low": 5, "high": 60},
    "shared_prefix": {"num_groups": 4, "prefix_tokens": 128, "share_ratio": 0.5},
}


def run_into(folder: Path, **cluster: Any) -> Path:
    mapping = {
        "cluster": {"num_replicas": 2, **cluster},
        "execution": {"model": "roofline"},
        "workload": WORKLOAD,
    }
    simulate(config_from_mapping(mapping)).write(folder)
    return folder


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = run_into(tmp_path_factory.mktemp("run") / "rr")
    write_report(folder, ["png", "svg"])
    return folder


def test_cdf_and_gap_cdf_by_hand() -> None:
    xs, ys = cdf(np.array([4.0, 1.0, 3.0, 2.0, 5.0]), points=5)
    assert xs.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert ys.tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
    gaps = {
        "low_s": np.array([0.01, 0.02, 0.04]),
        "high_s": np.array([0.02, 0.04, 0.08]),
        "count": np.array([1, 0, 3]),
    }
    xs, ys = gap_cdf(gaps)
    assert xs.tolist() == [0.02, 0.08]
    assert ys.tolist() == [0.25, 1.0]


def test_a_report_has_every_plot_in_both_formats(run_dir: Path) -> None:
    names = sorted(p.name for p in (run_dir / "plots").iterdir())
    assert names == sorted(
        f"{plot}.{fmt}"
        for plot in ("latency", "over_time", "replicas", "prefix_hits")
        for fmt in ("png", "svg")
    )


def test_the_report_embeds_its_plots_and_opens_without_the_folder(run_dir: Path) -> None:
    page = (run_dir / "report.html").read_text()
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 4
    assert all(base64.b64decode(data).startswith(b"\x89PNG\r\n\x1a\n") for data in images)
    assert 'src="plots/' not in page
    assert "http" not in page.split("<h2>Config</h2>")[0]


def test_the_summary_tables_match_summary_json(run_dir: Path) -> None:
    page = (run_dir / "report.html").read_text()
    summary = json.loads((run_dir / "summary.json").read_text())
    table = page[page.index('<table id="latency">') : page.index("</table>")]
    rows = re.findall(r"<tr><td>([^<]+)</td>((?:<td>[^<]+</td>){4})</tr>", table)
    keys = {
        "TTFT": "ttft",
        "TPOT": "tpot",
        "TBT (all tokens)": "tbt",
        "end to end": "e2e",
        "scheduling delay": "scheduling_delay",
    }
    assert [label for label, _ in rows] == list(keys)
    for label, cells in rows:
        values = [float(v) for v in re.findall(r"<td>([^<]+)</td>", cells)]
        stats = summary["latency_s"][keys[label]]
        expected = [round(stats[q], 4) for q in ("mean", "p50", "p90", "p99")]
        assert values == pytest.approx(expected, abs=1e-12)
    headline = page[page.index('<table id="headline">') :]
    throughput = re.search(r"<td>throughput \(req/s\)</td><td>([^<]+)</td>", headline)
    assert throughput is not None
    assert float(throughput.group(1)) == round(summary["throughput"]["requests_per_s"], 2)


def test_the_saved_config_reproduces_the_run(run_dir: Path, tmp_path: Path) -> None:
    page = (run_dir / "report.html").read_text()
    assert f"tokenyard simulate {run_dir / 'config.json'} --output {run_dir}" in page
    again = simulate(load_config(run_dir / "config.json"))
    import pyarrow.parquet as pq

    assert again.table().equals(pq.read_table(run_dir / "requests.parquet"))


def test_reports_are_byte_for_byte_deterministic(run_dir: Path, tmp_path: Path) -> None:
    before = {p.name: p.read_bytes() for p in (run_dir / "plots").iterdir()}
    page = (run_dir / "report.html").read_bytes()
    write_report(run_dir, ["png", "svg"])
    assert {p.name: p.read_bytes() for p in (run_dir / "plots").iterdir()} == before
    assert (run_dir / "report.html").read_bytes() == page


def test_compare_marks_the_better_run_and_the_changes(run_dir: Path, tmp_path: Path) -> None:
    other = run_into(tmp_path / "lor", global_scheduler={"policy": "lor"})
    text, page = compare_runs([run_dir, other], output=tmp_path / "cmp")
    a = json.loads((run_dir / "summary.json").read_text())
    b = json.loads((other / "summary.json").read_text())
    line = next(x for x in text.splitlines() if x.startswith("TTFT mean (s)"))
    mean_a, mean_b = a["latency_s"]["ttft"]["mean"], b["latency_s"]["ttft"]["mean"]
    assert f"{mean_a:.4f}" in line
    assert f"{mean_b:.4f}" in line
    assert f"({(mean_b - mean_a) / mean_a:+.1%})" in line
    better = f"{min(mean_a, mean_b):.4f}*"
    assert better in line
    assert "best (*): rr: best on" in text
    assert page is not None
    html_page = page.read_text()
    assert html_page.count("data:image/png;base64,") == 4
    assert '<td class="best">' in html_page


def test_identical_runs_rank_nothing_and_ties_share_best(run_dir: Path) -> None:
    text, _ = compare_runs([run_dir, str(run_dir) + "/"])
    line = next(x for x in text.splitlines() if x.startswith("TTFT mean (s)"))
    assert "*" not in line
    assert "best on 0 of 0" in text
    runs = [load_run(run_dir, "a"), load_run(run_dir, "b")]
    worse = json.loads(json.dumps(runs[0].summary))
    worse["latency_s"]["ttft"]["mean"] *= 2
    third = dataclasses.replace(runs[0], name="c", summary=worse)
    row = comparison_rows([*runs, third])[0]
    assert row["metric"] == "TTFT mean (s)"
    assert row["best"] == {0, 1}
    assert row["changes"][2] == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda tmp: load_run(tmp), "not a tokenyard results folder"),
        (lambda tmp: compare_runs([tmp]), "needs at least two results folders"),
        (lambda tmp: write_report(tmp, ["gif"]), "formats must be a comma-separated list"),
    ],
)
def test_bad_inputs_are_config_errors(tmp_path: Path, call: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        call(tmp_path)


def test_simulate_plots_needs_an_output_folder_before_it_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli_main(["simulate", "--plots", "--requests", "10", "--no-progress"]) == 2
    assert "--plots: needs --output DIR" in capsys.readouterr().err


def test_the_cli_writes_the_report_and_compares(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    args = ["simulate", "--requests", "200", "--replicas", "2", "--no-progress"]
    assert cli_main([*args, "--output", str(out), "--plots"]) == 0
    assert (out / "report.html").is_file()
    assert (out / "plots" / "latency.png").is_file()
    command = (out / "command.txt").read_text()
    assert command.startswith("tokenyard simulate --requests 200")
    assert command in (out / "report.html").read_text()
    second = tmp_path / "lor"
    assert cli_main([*args, "--global-policy", "lor", "--output", str(second)]) == 0
    capsys.readouterr()
    assert cli_main(["report", str(second), "--plots", "svg"]) == 0
    assert (second / "plots" / "latency.svg").is_file()
    assert cli_main(["compare", str(out), str(second)]) == 0
    assert "best (*): run: best on" in capsys.readouterr().out


def copy_run(run_dir: Path, folder: Path) -> Path:
    """The run's results (not its report) in a folder of its own, to plant links in."""
    shutil.copytree(run_dir, folder, ignore=shutil.ignore_patterns("plots", "report.html"))
    return folder


def plant_links(folder: Path, page: str, tmp_path: Path) -> tuple[Path, Path]:
    """``folder/page`` a link to a file outside, ``folder/plots`` a link to a folder
    outside (what a results tarball from someone else may hold)."""
    victim, elsewhere = tmp_path / "victim.txt", tmp_path / "elsewhere"
    victim.write_text("not yours\n")
    elsewhere.mkdir()
    folder.mkdir(exist_ok=True)
    (folder / page).symlink_to(victim)
    (folder / "plots").symlink_to(elsewhere, target_is_directory=True)
    return victim, elsewhere


def assert_links_replaced(folder: Path, page: str, victim: Path, elsewhere: Path) -> None:
    assert victim.read_text() == "not yours\n"
    assert list(elsewhere.iterdir()) == []
    assert not (folder / page).is_symlink()
    assert "<html" in (folder / page).read_text()
    assert not (folder / "plots").is_symlink()
    assert (folder / "plots" / "latency.png").is_file()
    assert not [p for p in folder.iterdir() if p.name.startswith(".tokenyard-")]


def test_report_replaces_links_in_the_folder_instead_of_writing_through_them(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = copy_run(run_dir, tmp_path / "run")
    victim, elsewhere = plant_links(folder, "report.html", tmp_path)
    assert cli_main(["report", str(folder)]) == 0
    assert_links_replaced(folder, "report.html", victim, elsewhere)


def test_compare_replaces_links_in_its_output_folder(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cmp"
    victim, elsewhere = plant_links(out, "compare.html", tmp_path)
    assert cli_main(["compare", str(run_dir), str(run_dir) + "/", "-o", str(out)]) == 0
    assert_links_replaced(out, "compare.html", victim, elsewhere)


def test_a_rerun_leaves_no_plot_of_an_earlier_run(run_dir: Path, tmp_path: Path) -> None:
    folder = copy_run(run_dir, tmp_path / "run")
    write_report(folder, ["png", "svg"])
    assert len(list((folder / "plots").glob("*.svg"))) == 4
    write_report(folder, ["png"])
    assert sorted(p.suffix for p in (folder / "plots").iterdir()) == [".png"] * 4
