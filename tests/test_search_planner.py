"""A deployment search's results as a planner reads them (issue 31, item 4): the table shows
the percentiles the SLOs name and the target rate, P/D rows name their pools, the
saturation guard applies only where the SLOs bound no queueing and is named when it binds,
the tokens/s-per-GPU chart is drawn from the evaluated deployments, and a re-run leaves no
plot of other results in the folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from exec_models import FAST_LINEAR

from tokenyard.search import deployment_search, search_config_from_mapping
from tokenyard.search.config import GUARD_KEY
from tokenyard.search.tables import format_summary, frontier_rows, label, pool_text

SLO = {"ttft_p90_s": 0.5, "tpot_p90_s": 0.05}


def doc(**extra: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "simulation": {
            "replica": {"model": "llama-3.1-8b", "device": "h100-sxm"},
            "execution": FAST_LINEAR,
            "workload": {
                "kind": "synthetic",
                "num_requests": 120,
                "seed": 2,
                "arrival": {"kind": "poisson", "qps": 1.0},
                "prompt_tokens": {"kind": "uniform", "low": 50, "high": 400},
                "output_tokens": {"kind": "uniform", "low": 4, "high": 40},
            },
        },
        "slo": SLO,
        "search": {"initial_qps": 4.0, "tolerance": 0.1, "target_qps": 6.0},
        "variants": [
            {"name": "agg1", "cluster.num_replicas": 1},
            {"name": "agg2", "cluster.num_replicas": 2},
            {"name": "pd", "cluster.num_replicas": 1, "cluster.decode": {"num_replicas": 1}},
        ],
    }
    data.update(extra)
    return data


@pytest.fixture(scope="module")
def result() -> Any:
    return deployment_search(search_config_from_mapping(doc()), executor="serial")


def test_the_table_shows_the_percentiles_the_slos_name_and_the_target(result: Any) -> None:
    text = format_summary(result)
    header = next(line for line in text.splitlines() if "config" in line and "GPUs" in line)
    assert "TTFT p90" in header
    assert "TPOT p90" in header
    assert "p99" not in header, "no percentile the SLOs did not ask for"
    assert "target_qps: 6" in text
    assert "* on the Pareto front of cost against ttft_p90_s" in text
    for row in result.rows:
        assert row["target_qps"] == 6.0
        assert row["ttft_p90_s"] is not None
        assert row["tpot_p90_s"] is not None
    # The printed value is the row's own at capacity.
    agg1 = next(r for r in result.rows if r["variant"] == "agg1")
    line = next(line for line in text.splitlines() if line.strip().startswith("agg1"))
    assert f"{agg1['ttft_p90_s']:.3f}" in line
    assert f"{agg1['tpot_p90_s']:.3f}" in line


def test_pd_rows_name_their_pools(result: Any) -> None:
    pd = next(r for r in result.rows if r["variant"] == "pd")
    assert pd["deployment"] == "disaggregated"
    assert pd["label"] == "pd prefill 1 x TP1 / decode 1 x TP1"
    assert "replicas=" not in pd["label"]
    agg = next(r for r in result.rows if r["variant"] == "agg2")
    assert agg["deployment"] == "aggregated"
    assert "prefill" not in agg["label"]
    layout = {
        "num_replicas": 2,
        "tensor_parallel_size": 4,
        "decode_num_replicas": 3,
        "decode_tensor_parallel_size": 8,
    }
    assert pool_text(layout) == "prefill 2 x TP4 / decode 3 x TP8"
    overrides = {"cluster.num_replicas": 2, "cluster.decode.num_replicas": 3, "seed": 1}
    assert label(overrides, layout) == "prefill 2 x TP4 / decode 3 x TP8 seed=1"
    nested = {"cluster.decode": {"num_replicas": 3}, "replica.device": "h100-sxm"}
    assert label(nested, layout) == "prefill 2 x TP4 / decode 3 x TP8 device=h100-sxm"


def test_the_frontier_chart_is_one_point_per_evaluated_deployment(result: Any) -> None:
    points = frontier_rows(result.rows)
    evaluated = [r for r in result.rows if r["status"] == "ok" and r["capacity_qps"]]
    assert [r["key"] for r in points] == [r["key"] for r in evaluated]
    assert len({r["key"] for r in points}) == len(points) == 3
    probes = {(p["key"], p["rate"]) for p in result.probes}
    assert len(probes) > len(points), "the bisection simulated more rates than it drew"
    for r in points:
        # At its found capacity: output tokens per second over its GPUs, 1 / mean TPOT.
        assert r["tokens_per_s_per_gpu"] == pytest.approx(r["decode_tokens_per_s"] / r["num_gpus"])
        assert r["tokens_per_s_per_user"] == pytest.approx(1.0 / r["tpot_mean_s"])
        probe = next(
            p for p in result.probes if p["key"] == r["key"] and p["rate"] == r["capacity_qps"]
        )
        assert probe["decode_tokens_per_s"] == r["decode_tokens_per_s"]
    # Each kind has a frontier; a dominated point is not on it.
    for kind in ("aggregated", "disaggregated"):
        assert any(r["frontier"] for r in points if r["deployment"] == kind)
    for r in points:
        if r["frontier"]:
            assert not any(
                o["deployment"] == r["deployment"]
                and o["tokens_per_s_per_gpu"] > r["tokens_per_s_per_gpu"]
                and o["tokens_per_s_per_user"] > r["tokens_per_s_per_user"]
                for o in points
            )


def test_the_guard_applies_only_where_the_slos_bound_no_queueing() -> None:
    config = search_config_from_mapping(
        doc(slo={"latency": SLO, "decode_only": {"tpot_p90_s": 0.05}})
    )
    sets = {s.name: s.bounds for s in config.effective_slos()}
    assert GUARD_KEY not in sets["latency"], "TTFT holds the queueing: the user's SLOs rule"
    assert sets["decode_only"][GUARD_KEY] == 2.0, "nothing else sees a queue grow"
    explicit = search_config_from_mapping(
        doc(search={"max_scheduling_delay_p99_s": 0.5}, slo={"latency": SLO})
    )
    assert explicit.effective_slos()[0].bounds[GUARD_KEY] == 0.5, "a set value always applies"


def test_a_binding_guard_is_named_in_the_table() -> None:
    tight = doc(
        slo={"decode_only": {"tpot_p90_s": 5.0}},
        search={"initial_qps": 4.0, "tolerance": 0.1, "max_scheduling_delay_p99_s": 0.05},
        variants=[{"name": "agg1", "cluster.num_replicas": 1}],
    )
    result = deployment_search(search_config_from_mapping(tight), executor="serial")
    (row,) = result.rows
    assert row["guard_binding"]
    assert row["guard_s"] == 0.05
    text = format_summary(result)
    assert f"saturation guard {GUARD_KEY} <= 0.05" in text
    assert f"{GUARD_KEY} (guard)" in text
    assert "1 deployment(s) stopped by the saturation guard alone, not by these SLOs" in text


def test_a_rerun_leaves_no_plot_of_other_results(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from tokenyard.search import write_plots

    config = search_config_from_mapping(doc(variants=[{"name": "agg1"}]))
    first = deployment_search(config, output_dir=tmp_path, executor="serial")
    write_plots(first, tmp_path, ("png", "svg"))
    assert {p.name for p in tmp_path.glob("frontier.*")} == {"frontier.png", "frontier.svg"}
    # The same folder again, plots in one format: none of the earlier run's stays.
    again = deployment_search(config, output_dir=tmp_path, executor="serial")
    assert not list(tmp_path.glob("*.png"))
    assert not list(tmp_path.glob("*.svg"))
    write_plots(again, tmp_path, ("svg",))
    names = sorted(p.name for p in tmp_path.iterdir() if p.suffix in (".png", ".svg"))
    assert names == ["capacity.svg", "frontier.svg", "pareto.svg"]
    # A link named like a plot is removed, not what it points to.
    outside = tmp_path.parent / "mine.png"
    outside.write_text("keep")
    (tmp_path / "capacity.png").symlink_to(outside)
    deployment_search(config, output_dir=tmp_path, executor="serial")
    assert not (tmp_path / "capacity.png").exists()
    assert outside.read_text() == "keep"


def test_the_cost_latency_front_follows_the_slos_percentile(result: Any) -> None:
    from tokenyard.search.tables import pareto_metric

    assert pareto_metric(result.config) == "ttft_p90_s"
    tpot_only = search_config_from_mapping(doc(slo={"tpot_p90_s": 0.05}))
    assert pareto_metric(tpot_only) == "tpot_p90_s"
    chosen = search_config_from_mapping(
        doc(search={"pareto_metric": "e2e_p99_s", "initial_qps": 4.0})
    )
    assert pareto_metric(chosen) == "e2e_p99_s", "a set metric is kept"
