"""Capacity and deployment search (tokenyard.search): a capacity computable by hand, the
fixed bracketing, grid checks before any simulation, skips, cost and Pareto, resumability,
the files and the command line."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from tokenyard.cli import main
from tokenyard.errors import ConfigError
from tokenyard.search import (
    SLO,
    SearchParams,
    capacity_search,
    deployment_search,
    search_config_from_mapping,
    with_rate,
)
from tokenyard.search import deployments as deployments_module
from tokenyard.search.tables import label, pareto_front
from tokenyard.workload import load_workload

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "docs" / "examples"

# One request's service time under the linear model (docs/simulate.md, "Execution time"):
# a prompt of P tokens with one output token is one prefill batch (the prefill yields the
# first and only token), priced constant + a*P + d*P*P (a whole prompt's chunk of P tokens
# has context P) + cpu_overhead; no decode rows.
P = 1000
CONSTANT_S, PER_PREFILL_S, PER_PREFILL_CONTEXT_S, CPU_S = 0.01, 1e-4, 1e-8, 0.002
SERVICE_S = CONSTANT_S + PER_PREFILL_S * P + PER_PREFILL_CONTEXT_S * P * P + CPU_S  # 0.122


def one_at_a_time(num_requests: int = 400, arrival: str = "constant") -> dict[str, Any]:
    """One replica that runs one request at a time (vllm with batch_size_cap 1): a single
    server with constant service time SERVICE_S."""
    return {
        "cluster": {"num_replicas": 1},
        "replica": {"scheduler": {"policy": "vllm", "batch_size_cap": 1}},
        "execution": {
            "model": "linear",
            "constant_s": CONSTANT_S,
            "per_prefill_token_s": PER_PREFILL_S,
            "per_decode_token_s": 0.0,
            "per_decode_context_token_s": 0.0,
            "per_prefill_context_token_s": PER_PREFILL_CONTEXT_S,
            "cpu_overhead_s": CPU_S,
        },
        "workload": {
            "kind": "synthetic",
            "num_requests": num_requests,
            "arrival": {"kind": arrival, "qps": 1.0},
            "prompt_tokens": {"kind": "fixed", "value": P},
            "output_tokens": {"kind": "fixed", "value": 1},
        },
    }


def test_capacity_search_recovers_the_saturation_rate_computed_by_hand() -> None:
    # Constant arrivals every 1/r s at a server taking S = 0.122 s each: for r <= 1/S each
    # request finds the server idle (scheduling delay 0); for r > 1/S request i waits
    # i * (S - 1/r) > 0. So "max scheduling delay <= 1 us" holds exactly up to 1/S = 8.197
    # QPS, and the search (2% tolerance) returns a rate in [1/S / 1.02, 1/S].
    saturation = 1.0 / SERVICE_S
    report = capacity_search(
        one_at_a_time(),
        {"scheduling_delay_max_s": 1e-6},
        # The set bounds queueing: the guard applies only when asked for.
        search={"tolerance": 0.02, "refine_breaks": True, "max_scheduling_delay_p99_s": 2.0},
    )
    result = report.results["default"]
    assert result.stop == "tolerance"
    assert saturation / 1.02 <= result.capacity_qps <= saturation
    assert result.hi_qps is not None
    assert result.hi_qps > saturation
    assert result.hi_qps / result.capacity_qps - 1 <= 0.02
    # The metrics at capacity: every request alone on the server, TTFT = e2e = S.
    assert result.metrics["ttft_p99_s"] == pytest.approx(SERVICE_S, rel=1e-9)
    assert result.metrics["scheduling_delay_max_s"] == 0.0
    # The rate at which that SLO breaks: the first rate simulated above 1/S.
    brk = report.breaks["default"]["scheduling_delay_max_s"]
    assert brk["held_qps"] == result.capacity_qps
    assert brk["break_qps"] == result.hi_qps
    # The saturation guard (p99 delay <= 2 s) breaks later: 400 requests, p99 over i.
    guard = report.breaks["default"]["scheduling_delay_p99_s"]
    assert guard["break_qps"] is not None
    assert guard["break_qps"] > saturation


def test_capacity_search_brackets_by_doubling_then_bisects() -> None:
    report = capacity_search(one_at_a_time(100), {"scheduling_delay_max_s": 1e-6})
    rates = report.results["default"].rates
    # 1, 2, 4, 8 hold; 16 breaks; then geometric midpoints between 8 and 16.
    assert rates[:5] == (1.0, 2.0, 4.0, 8.0, 16.0)
    assert rates[5] == pytest.approx(math.sqrt(8.0 * 16.0))


def test_capacity_is_zero_below_min_qps_and_capped_at_max_qps() -> None:
    low = capacity_search(
        one_at_a_time(50),
        {"ttft_p99_s": 0.05},  # below S: never holds
        search={"min_qps": 0.25, "initial_qps": 1.0},
    )
    assert low.capacity_qps == 0.0
    assert low.results["default"].stop == "min_qps"
    assert low.results["default"].rates == (1.0, 0.5, 0.25)
    high = capacity_search(
        one_at_a_time(50),
        {"ttft_p99_s": 1e9},
        search={"max_qps": 4.0, "max_scheduling_delay_p99_s": math.inf},
    )
    assert high.capacity_qps == 4.0
    assert high.results["default"].capped


def test_with_rate_retimes_each_workload_kind() -> None:
    sim = one_at_a_time(10, "gamma")
    assert with_rate(sim, 3.0)["workload"]["arrival"]["qps"] == 3.0
    assert sim["workload"]["arrival"]["qps"] == 1.0  # not modified
    bursty = {
        "workload": {
            "kind": "synthetic",
            "num_requests": 10,
            "arrival": {
                "kind": "bursty",
                "qps": 2.0,
                "burst_qps": 50.0,
                "burst_duration_s": 5.0,
                "burst_interval_s": 60.0,
            },
            "prompt_tokens": {"kind": "fixed", "value": 8},
            "output_tokens": {"kind": "fixed", "value": 8},
        }
    }
    arrival = with_rate(bursty, 12.0)["workload"]["arrival"]  # mean 6 QPS -> x2
    assert (arrival["qps"], arrival["burst_qps"]) == (4.0, 100.0)
    trace = {"workload": {"kind": "trace", "format": "vidur", "path": "x.csv"}}
    assert with_rate(trace, 5.0)["workload"]["target_qps"] == 5.0


def test_capacity_search_on_a_trace_retimed_to_each_rate() -> None:
    from tokenyard.workload import sample_path

    sim = {
        "cluster": {"num_replicas": 1},
        # The sample's longest request (4,210 tokens) needs more than Llama-2-7B's context.
        "replica": {"model": "llama-3.1-8b"},
        "workload": {"kind": "trace", "format": "vidur", "path": str(sample_path("vidur"))},
    }
    report = capacity_search(sim, {"ttft_p99_s": 2.0}, search={"tolerance": 0.1})
    assert report.capacity_qps > 0
    for probe in report.probes:
        # target_qps makes the trace's mean rate exactly the probe's rate.
        workload = load_workload(with_rate(sim, probe.rate)["workload"])
        chunk = next(workload.chunks())
        span = float(chunk.arrived_at[-1] - chunk.arrived_at[0])
        assert (len(chunk) - 1) / span == pytest.approx(probe.rate)


def grid_doc(**extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "simulation": {
            "replica": {"model": "llama-2-7b"},
            "workload": {
                "kind": "synthetic",
                "num_requests": 150,
                "arrival": {"kind": "poisson", "qps": 1.0},
                "prompt_tokens": {"kind": "uniform", "low": 100, "high": 600},
                "output_tokens": {"kind": "uniform", "low": 8, "high": 64},
            },
        },
        "slo": {"ttft_p99_s": 1.0, "tbt_p99_s": 0.2},
        "search": {"initial_qps": 4.0, "tolerance": 0.1},
        "grid": {"cluster.num_replicas": [1, 2], "replica.device": ["a100-80gb", "h100-80gb"]},
    }
    doc.update(extra)
    return doc


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"grid": {"cluster.num_replicas": []}}, "grid.cluster.num_replicas: is empty"),
        ({"grid": {"replica.device": ["a100-80gb", "b900"]}}, "grid.replica.device: unknown"),
        (
            {"grid": {"replica.tensor_parallel_size": [1, 3]}},
            "grid.replica.tensor_parallel_size: 3 does not divide the 32 attention heads",
        ),
        (
            {"grid": {"replica": {"scheduler": {"chunk_sise": [1]}}}},
            "grid.replica.scheduler.chunk_sise: unknown key",
        ),
        ({"grid": {"cluster.num_replicas": 2}}, "grid.cluster.num_replicas: must be a list"),
        ({"grid": {"workload.arrival.qps": [1.0]}}, "grid.workload.arrival.qps: the arrival"),
        ({"grid": {"cluster.num_replicas": [0]}}, "grid.cluster.num_replicas: must be an"),
        ({"variants": [{"replica.device": "h100-80gb"}]}, "variants[0].replica.device: also"),
        ({"slo": {"ttft_p98_s": 1.0}}, "slo.ttft_p98_s: unknown SLO metric"),
        ({"slo": {"ttft_p99_s": -1.0}}, "slo.ttft_p99_s: must be >= 0"),
        ({"search": {"tolerance": 0}}, "search.tolerance: must be a finite number > 0"),
        ({"search": {"speed": 1}}, "search.speed: unknown key"),
        ({"prices": {"a100-80gb": "cheap"}}, "prices.a100-80gb: must be a number"),
        ({"constraints": {"max_gpus": 0}}, "constraints.max_gpus: must be an int in [1, 1000000]"),
        ({"grids": {}}, "grids: unknown key"),
        ({"grid": {"replica.dtype": ["bf16", "fp9"]}}, "grid.replica.dtype: unknown dtype"),
    ],
)
def test_bad_search_configs_are_errors_naming_the_key_before_any_simulation(
    change: dict[str, Any], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_simulation(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a simulation started")

    monkeypatch.setattr(deployments_module, "make_executor", no_simulation)
    with pytest.raises(ConfigError) as info:
        deployment_search(search_config_from_mapping(grid_doc(**change)), executor="serial")
    assert message in str(info.value)


def test_a_simulation_key_error_names_the_simulation_table() -> None:
    doc = grid_doc()
    doc["simulation"]["cluster"] = {"num_replicas": "four"}
    with pytest.raises(ConfigError, match=r"^simulation\.cluster\.num_replicas: must be"):
        search_config_from_mapping(doc)


def test_a_gpu_without_a_price_needs_one_in_prices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        deployments_module, "_price", lambda device, prices, catalog=None: prices.get(device)
    )
    config = search_config_from_mapping(grid_doc(prices={"a100-80gb": 2.0}))
    with pytest.raises(ConfigError, match=r"prices\.h100-80gb: the catalog has no price"):
        deployment_search(config, executor="serial")


def test_points_that_do_not_fit_or_exceed_the_budget_are_skipped_with_the_reason() -> None:
    doc = grid_doc(
        grid={
            "replica.model": ["llama-2-7b", "llama-2-70b"],
            "cluster.num_replicas": [1, 4],
        },
        constraints={"max_gpus": 2},
    )
    doc["simulation"]["workload"]["num_requests"] = 60
    result = deployment_search(search_config_from_mapping(doc), executor="serial")
    by_label = {r["label"]: r for r in result.rows}
    assert by_label["model=llama-2-7b replicas=1"]["status"] == "ok"
    assert by_label["model=llama-2-7b replicas=1"]["capacity_qps"] > 0
    too_big = by_label["model=llama-2-70b replicas=1"]
    assert too_big["status"] == "skipped"
    assert too_big["reason"].startswith("does not fit:")
    assert "llama-2-70b on a100-80gb" in too_big["reason"]
    over = by_label["model=llama-2-7b replicas=4"]
    assert over["status"] == "skipped"
    assert over["reason"] == "over budget: 4 GPUs > constraints.max_gpus = 2"
    assert result.ran == len(result.probes)


def test_cost_qps_per_dollar_pareto_and_best_per_slo_set() -> None:
    doc = grid_doc(
        slo={"strict": {"ttft_p99_s": 0.5}, "loose": {"ttft_p99_s": 2.0}},
        prices={"a100-80gb": 2.0, "h100-80gb": 4.0},
    )
    result = deployment_search(search_config_from_mapping(doc), executor="serial")
    assert len(result.rows) == 4 * 2
    for row in result.rows:
        gpus = row["num_replicas"]
        price = 2.0 if row["device"] == "a100-80gb" else 4.0
        assert row["cost_per_hour"] == gpus * price
        assert row["qps_per_dollar"] == pytest.approx(row["capacity_qps"] / row["cost_per_hour"])
    for name in ("strict", "loose"):
        mine = [r for r in result.rows if r["slo"] == name]
        best = result.best[name]
        assert best is not None
        assert best["best"]
        assert best["qps_per_dollar"] == max(r["qps_per_dollar"] for r in mine)
    # The same deployment never has less capacity under the looser set.
    for strict in (r for r in result.rows if r["slo"] == "strict"):
        loose = next(r for r in result.rows if r["slo"] == "loose" and r["key"] == strict["key"])
        assert loose["capacity_qps"] >= strict["capacity_qps"]
    front = [r for r in result.rows if r["pareto"]]
    assert front
    for r in front:  # nothing is cheaper per QPS and faster
        assert not any(
            o["cost_per_qps"] < r["cost_per_qps"] and o["ttft_p99_s"] < r["ttft_p99_s"]
            for o in result.rows
        )


def test_pareto_front_by_hand() -> None:
    # (cost, latency): (1, 5) and (3, 1) are the front; (2, 6) is beaten by (1, 5); the
    # duplicate (3, 1) ties, so neither dominates the other.
    assert pareto_front([(1, 5), (2, 6), (3, 1), (3, 1), (4, 1)]) == [
        True,
        False,
        True,
        True,
        False,
    ]


def test_target_qps_picks_the_cheapest_deployment_that_meets_it() -> None:
    doc = grid_doc(search={"initial_qps": 4.0, "tolerance": 0.1, "target_qps": 10.0})
    result = deployment_search(search_config_from_mapping(doc), executor="serial")
    meets = [r for r in result.rows if r["meets_target"]]
    best = result.best["default"]
    assert best is not None
    assert best["capacity_qps"] >= 10.0
    assert best["cost_per_hour"] == min(r["cost_per_hour"] for r in meets)


def test_a_rerun_skips_the_points_already_in_the_output_directory(tmp_path: Path) -> None:
    config = search_config_from_mapping(grid_doc())
    first = deployment_search(config, output_dir=tmp_path, executor="serial")
    assert first.ran > 0
    assert first.reused == 0
    assert len(list((tmp_path / "points").glob("*.json"))) == 4
    again = deployment_search(config, output_dir=tmp_path, executor="serial")
    assert again.ran == 0
    assert again.reused == 4
    assert again.rows == first.rows
    # A new axis value runs only the new points; a new price runs nothing.
    grown = grid_doc(prices={"a100-80gb": 9.0})
    grown["grid"]["cluster.num_replicas"] = [1, 2, 3]
    third = deployment_search(
        search_config_from_mapping(grown), output_dir=tmp_path, executor="serial"
    )
    assert third.reused == 4
    assert len(third.rows) == 6
    assert {r["price_per_gpu_hour"] for r in third.rows if r["device"] == "a100-80gb"} == {9.0}


def test_the_resume_key_follows_the_content_of_named_files(tmp_path: Path) -> None:
    from tokenyard.search.results import point_key

    gpus = tmp_path / "gpus.toml"
    gpus.write_text("# none yet\n")
    doc = {"catalog": ["gpus.toml"], "base_dir": str(tmp_path), "workload": {"kind": "x"}}
    before = point_key(doc, [], {})
    assert point_key(doc, [], {}) == before
    gpus.write_text("# edited\n")
    assert point_key(doc, [], {}) != before


def test_a_price_may_name_a_gpu_by_its_alias() -> None:
    assert deployments_module._price("h100-sxm", {"h100-80gb": 2.8}) == 2.8
    assert deployments_module._price("h100-80gb", {"h100-sxm": 2.7}) == 2.7


def test_results_are_written_as_parquet_with_a_summary_and_plots(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from tokenyard.search import write_plots

    result = deployment_search(
        search_config_from_mapping(grid_doc()), output_dir=tmp_path, executor="serial"
    )
    table = pq.read_table(tmp_path / "results.parquet")
    assert table.num_rows == 4
    assert {"capacity_qps", "cost_per_hour", "qps_per_dollar", "ttft_p99_s", "pareto"} <= set(
        table.column_names
    )
    assert "ttft_p99_s_break_qps" in table.column_names
    probes = pq.read_table(tmp_path / "probes.parquet")
    assert probes.num_rows == result.ran
    assert "SLO set 'default'" in (tmp_path / "summary.txt").read_text()
    doc = json.loads((tmp_path / "search.json").read_text())
    assert doc["best"]["default"]["key"] == result.best["default"]["key"]  # type: ignore[index]
    pytest.importorskip("matplotlib")
    paths = write_plots(result, tmp_path, ("png", "svg"))
    assert sorted(p.name for p in paths) == [
        "capacity.png",
        "capacity.svg",
        "frontier.png",
        "frontier.svg",
        "pareto.png",
        "pareto.svg",
    ]
    assert all(p.stat().st_size > 0 for p in paths)


def test_the_process_pool_gives_the_serial_results() -> None:
    config = search_config_from_mapping(grid_doc())
    serial = deployment_search(config, executor="serial")
    pool = deployment_search(config, executor="local", workers=2)
    assert _without_wall(pool.rows) == _without_wall(serial.rows)
    assert _without_wall(pool.probes) == _without_wall(serial.probes)


def _without_wall(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]


def test_capacity_search_takes_slo_objects_and_params() -> None:
    report = capacity_search(
        one_at_a_time(50),
        [SLO("a", {"ttft_p99_s": 0.5}), SLO("b", {"ttft_p99_s": 5.0})],
        search=SearchParams(initial_qps=2.0, tolerance=0.05),
    )
    assert set(report.results) == {"a", "b"}
    assert report.results["b"].capacity_qps >= report.results["a"].capacity_qps


def test_cli_capacity_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", "capacity", str(EXAMPLES / "search_capacity.toml")]) == 0
    out = capsys.readouterr().out
    assert "capacity:" in out
    assert "ttft_p99_s: holds at" in out


def test_cli_deployments_example_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "search",
        "deployments",
        str(EXAMPLES / "search_deployments.toml"),
        "-o",
        str(tmp_path),
        "--set",
        "simulation.workload.num_requests=100",
        "--set",
        "grid.cluster.num_replicas=[1, 2]",
        "--workers",
        "1",
        "--no-progress",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "SLO set 'interactive'" in out
    assert "best:" in out
    assert (tmp_path / "results.parquet").exists()


def test_cli_errors_name_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[grid]\n"replica.device" = ["a100-80gb", "tpu-v9"]\n')
    assert main(["search", "deployments", str(path)]) == 2
    assert "grid.replica.device: unknown device 'tpu-v9'" in capsys.readouterr().err
    assert main(["search", "capacity", str(path)]) == 2
    assert "grid: a capacity search runs one deployment" in capsys.readouterr().err


def test_yaml_search_config(tmp_path: Path) -> None:
    from tokenyard.search import load_search_config

    path = tmp_path / "s.yaml"
    path.write_text(
        "simulation:\n  cluster: {num_replicas: 2}\nslo: {ttft_p99_s: 1.5}\n"
        "grid:\n  replica:\n    scheduler:\n      policy: [vllm_v1, sarathi]\n"
    )
    config = load_search_config(path, {"search.tolerance": 0.05})
    assert config.grid == {"replica.scheduler.policy": ("vllm_v1", "sarathi")}
    assert config.search.tolerance == 0.05
    assert config.slos == (SLO("default", {"ttft_p99_s": 1.5}),)
    assert config.simulation["base_dir"] == str(tmp_path)


def test_the_config_reference_in_the_docs_is_a_valid_search() -> None:
    import re

    from tokenyard.search import expand
    from tokenyard.simulation.config import toml_module

    text = (ROOT / "docs" / "search.md").read_text()
    reference = re.findall(r"```toml\n(.*?)```", text, re.DOTALL)[0]
    points = expand(search_config_from_mapping(toml_module().loads(reference)))
    # 2 variants x 4 replica counts x 2 TP x 2 GPUs x 2 policies; 8 TP-2 x 8-replica
    # points need 16 GPUs > max_gpus = 8.
    assert len(points) == 64
    assert sum(p.skip is not None for p in points) == 8


def test_a_closed_loop_search_finds_the_most_users_computed_by_hand() -> None:
    # N users, no think time, one request at a time taking S = 0.122 s: each request waits
    # for the N - 1 others, so its TTFT is N * S. TTFT <= 0.5 s holds up to N = 4
    # (0.488 s) and breaks at 5 (0.61 s); the search varies whole numbers of users.
    simulation = one_at_a_time(60)
    # Arrival times are lower bounds under closed loop: make them all ~0.
    simulation["workload"]["arrival"]["qps"] = 1e9
    simulation["workload"]["closed_loop"] = {"concurrency": 1}
    report = capacity_search(simulation, {"ttft_max_s": 0.5})
    result = report.results["default"]
    assert result.capacity_qps == 4.0
    assert result.hi_qps == 5.0
    assert result.rates == (1.0, 2.0, 4.0, 8.0, 6.0, 5.0)
    assert result.metrics["ttft_max_s"] == pytest.approx(4 * SERVICE_S, rel=1e-9)
    assert with_rate(simulation, 3.4)["workload"]["closed_loop"]["concurrency"] == 3


def test_a_closed_loop_search_keeps_to_whole_users_within_the_bounds() -> None:
    simulation = one_at_a_time(30)
    simulation["workload"]["arrival"]["qps"] = 1e9
    simulation["workload"]["closed_loop"] = {"concurrency": 1}
    capped = capacity_search(
        simulation,
        {"ttft_max_s": 1e9},
        search={"max_qps": 10.5, "max_scheduling_delay_p99_s": math.inf},
    ).results["default"]
    assert capped.stop == "max_qps"
    assert capped.rates == (1.0, 2.0, 4.0, 8.0, 10.0)
    low = capacity_search(
        simulation, {"ttft_max_s": 1e-9}, search={"min_qps": 2.5, "initial_qps": 4.0}
    ).results["default"]
    assert low.stop == "min_qps"
    assert low.rates == (4.0, 3.0)


def test_an_open_loop_session_workload_is_refused_by_the_search() -> None:
    simulation = {
        "workload": {
            "kind": "sessions",
            "num_sessions": 5,
            "turns": {"kind": "fixed", "value": 2},
            "first_prompt_tokens": {"kind": "fixed", "value": 100},
            "input_tokens": {"kind": "fixed", "value": 10},
            "output_tokens": {"kind": "fixed", "value": 10},
            "think_time": {"kind": "fixed", "value_s": 1.0},
        }
    }
    with pytest.raises(ConfigError, match="closed_loop"):
        capacity_search(simulation, {"ttft_p99_s": 1.0})


TINY_SEARCH = """
[simulation.workload]
kind = "synthetic"
num_requests = 50
arrival = { kind = "poisson", qps = 1.0 }
prompt_tokens = { kind = "fixed", value = 200 }
output_tokens = { kind = "fixed", value = 8 }
[slo]
ttft_p99_s = 1.0
[search]
initial_qps = 4.0
max_simulations = 3
[grid]
"cluster.num_replicas" = [1]
"""


def test_search_replaces_links_in_its_output_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    config, out, elsewhere = tmp_path / "search.toml", tmp_path / "out", tmp_path / "elsewhere"
    config.write_text(TINY_SEARCH)
    out.mkdir()
    elsewhere.mkdir()
    names = ("capacity.json", "results.csv", "summary.txt", "search.json", "capacity.png")
    for name in names:
        (tmp_path / f"victim-{name}").write_text("not yours\n")
        (out / name).symlink_to(tmp_path / f"victim-{name}")
    (out / "points").symlink_to(elsewhere, target_is_directory=True)
    capacity = main(["search", "capacity", str(config), "-o", str(out), "--set", "grid={}"])
    assert capacity == 0
    deployments = ["search", "deployments", str(config), "-o", str(out), "--plots", "png"]
    assert main([*deployments, "--workers", "1", "--no-progress"]) == 0
    for name in names:
        assert (tmp_path / f"victim-{name}").read_text() == "not yours\n"
        assert not (out / name).is_symlink()
    assert list(elsewhere.iterdir()) == []
    assert not (out / "points").is_symlink()
    assert len(list((out / "points").glob("*.json"))) == 1
    assert (out / "capacity.png").stat().st_size > 0


def moe_grid_doc(grid: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """Mixtral-8x7B on H100s under the roofline, one replica per point, a few requests."""
    doc = grid_doc(grid=grid, prices={"h100-80gb": 3.0}, **extra)
    doc["simulation"]["cluster"] = {"num_replicas": 1}
    doc["simulation"]["replica"] = {"model": "mixtral-8x7b", "device": "h100-80gb"}
    doc["simulation"]["execution"] = {"model": "roofline"}
    doc["simulation"]["workload"]["num_requests"] = 40
    doc["search"] = {"initial_qps": 4.0, "tolerance": 0.25, "max_qps": 64.0}
    return doc


def test_expert_and_data_parallel_layouts_count_every_gpu_and_skip_what_vllm_refuses() -> None:
    # A replica is TP x DP x PP GPUs. Mixtral's 87 GiB of weights fit an H100 two ways:
    # TP 2, or TP 1 x DP 2 with its 8 experts over EP 2. TP 2 x DP 2 x EP 4 is 4 GPUs, over
    # the budget of 2 (counted as TP x PP it was 2). TP 1 x DP 2 without EP splits every
    # expert over both GPUs. The other combinations are layouts
    # vLLM refuses: skipped with the reason, not failures.
    doc = moe_grid_doc(
        {
            "replica.tensor_parallel_size": [1, 2],
            "replica.data_parallel_size": [1, 2],
            "replica.expert_parallel_size": [1, 2, 4],
        },
        constraints={"max_gpus": 2},
    )
    result = deployment_search(search_config_from_mapping(doc), executor="serial")
    rows = {r["label"]: r for r in result.rows}
    assert len(rows) == 12
    assert not [r for r in result.rows if r["status"] == "error"]
    for name in ("tp=1 dp=2 ep=2", "tp=2 dp=1 ep=1", "tp=2 dp=1 ep=2", "tp=1 dp=2 ep=1"):
        row = rows[name]
        assert row["status"] == "ok", row["reason"]
        assert row["num_gpus"] == 2
        assert row["cost_per_hour"] == 2 * 3.0
        assert row["qps_per_dollar"] == pytest.approx(row["capacity_qps"] / 6.0)
    dp2 = rows["tp=1 dp=2 ep=2"]
    assert (dp2["tensor_parallel_size"], dp2["data_parallel_size"]) == (1, 2)
    assert dp2["expert_parallel_size"] == 2
    over = rows["tp=2 dp=2 ep=4"]
    assert (over["status"], over["num_gpus"], over["cost_per_hour"]) == ("skipped", 4, 12.0)
    assert over["reason"] == "over budget: 4 GPUs > constraints.max_gpus = 2"
    assert rows["tp=1 dp=1 ep=1"]["reason"].startswith("does not fit:")
    # DP 2 without EP: the experts as TP over both GPUs (vLLM 0.33 without
    # --enable-expert-parallel), a layout of its own, no longer refused.
    assert rows["tp=1 dp=2 ep=1"]["status"] == "ok", rows["tp=1 dp=2 ep=1"]["reason"]
    assert rows["tp=1 dp=2 ep=1"]["num_gpus"] == 2
    for name in ("tp=1 dp=1 ep=2", "tp=1 dp=2 ep=4", "tp=2 dp=2 ep=2", "tp=2 dp=1 ep=4"):
        assert rows[name]["status"] == "skipped"
        assert rows[name]["reason"].startswith(
            "infeasible layout: replica.expert_parallel_size: must be 1 (experts split by TP) "
            "or tensor_parallel_size x data_parallel_size"
        )
    summary = result.summary()
    assert "(8 skipped, 0 failed)" in summary
    assert "  tp=1 dp=2 ep=2     2     6.00" in summary


def test_expert_parallelism_on_a_dense_model_is_a_skip_when_the_grid_chose_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_simulation(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a simulation started")

    monkeypatch.setattr(deployments_module, "make_executor", no_simulation)
    doc = moe_grid_doc({"replica.model": ["llama-2-7b"]})
    doc["variants"] = [
        {"name": "tp2-ep2", "replica.tensor_parallel_size": 2, "replica.expert_parallel_size": 2}
    ]
    result = deployment_search(search_config_from_mapping(doc), executor="serial")
    (row,) = result.rows
    assert (row["label"], row["status"]) == ("tp2-ep2 model=llama-2-7b", "skipped")
    assert (row["num_gpus"], row["expert_parallel_size"]) == (2, 2)
    assert row["reason"] == (
        "infeasible layout: replica.expert_parallel_size: expert parallelism needs a "
        "mixture-of-experts model; llama-2-7b is dense (num_experts 1), got 2"
    )
    # The same layout in the base simulation, with no grid key choosing it: an error.
    doc = moe_grid_doc({"replica.device": ["h100-80gb"]})
    doc["simulation"]["replica"] |= {"model": "llama-2-7b", "tensor_parallel_size": 2}
    doc["simulation"]["replica"]["expert_parallel_size"] = 2
    with pytest.raises(ConfigError, match=r"^simulation\.replica\.expert_parallel_size: exp"):
        deployment_search(search_config_from_mapping(doc), executor="serial")
    # A value that is no size at all is an error wherever it is set.
    bad = moe_grid_doc({"replica.expert_parallel_size": [2, 0]})
    with pytest.raises(ConfigError, match=r"^grid\.replica\.expert_parallel_size: must be an int"):
        deployment_search(search_config_from_mapping(bad), executor="serial")


def test_a_point_without_overrides_is_labelled_with_its_layout() -> None:
    layout = {
        "model": "mixtral-8x7b",
        "device": "h100-80gb",
        "num_replicas": 1,
        "tensor_parallel_size": 1,
        "data_parallel_size": 2,
        "expert_parallel_size": 2,
        "num_pipeline_stages": 1,
    }
    assert label({}, layout) == "1 x mixtral-8x7b on h100-80gb (TP 1 x DP 2, EP 2, PP 1)"
    layout |= {"data_parallel_size": 1, "expert_parallel_size": 1, "tensor_parallel_size": 2}
    assert label({}, layout) == "1 x mixtral-8x7b on h100-80gb (TP 2, PP 1)"


def test_the_package_exports_every_plot_of_search_plots() -> None:
    """``tokenyard.search`` exports each plotting function ``search.plots`` makes public,
    lazily (``plot_frontier`` was missing)."""
    import tokenyard.search as package
    from tokenyard.search import plots

    for name in plots.__all__:
        assert name in package.__all__, name
        assert getattr(package, name) is getattr(plots, name)
