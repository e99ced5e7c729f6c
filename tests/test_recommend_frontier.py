"""``tokenyard recommend``'s agg-vs-disagg chart: its points are exactly the layouts it
simulated, each at its found capacity (never a bisection probe), the recommended and the
rejected marked; ``--out`` writes it fresh; ``--plots`` is refused where it cannot apply."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
from test_recommend import LINEAR  # TP buys nothing, a prefill token a tenth of a decode one

from tokenyard.cli import main
from tokenyard.recommend.frontier import frontier_rows
from tokenyard.recommend.recommend import Ask, recommend
from tokenyard.recommend.table import rows, write_outputs
from tokenyard.search.capacity import DECODE_TOKENS_KEY

pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def both() -> Any:
    """Aggregated and disaggregated layouts of Llama-3.1-8B on up to 4 H100s."""
    ask = Ask(
        model="llama-3.1-8b",
        systems=("h100_sxm",),
        workload={
            "kind": "synthetic",
            "num_requests": 1200,
            "arrival": {"kind": "poisson", "qps": 1.0},
            "prompt_tokens": {"kind": "fixed", "value": 400},
            "output_tokens": {"kind": "fixed", "value": 50},
        },
        slo={"ttft_p90_s": 0.5, "tpot_p90_s": 0.05},
        gpus=4,
        sample=300,
        execution=LINEAR,
        top_k=2,
        show=2,
    )
    return recommend(ask, executor="serial")


def test_the_points_are_the_simulated_layouts_at_capacity(both: Any) -> None:
    points = frontier_rows(both)
    simulated = [s for s in both.simulated if s.capacity > 0]
    assert len(points) == len(simulated) > 0
    assert {p["deployment"] for p in points} == {"aggregated", "disaggregated"}
    for point, sim in zip(points, simulated, strict=True):
        c = sim.candidate
        assert point["label"] == f"{c.label} ({c.layout.device})"
        assert point["capacity"] == sim.capacity == sim.result.capacity_qps
        # The run at the capacity the search found: its output tokens/s over the GPUs, and
        # 1 / its mean TPOT; no other probe of the bisection is drawn.
        metrics = sim.result.metrics
        assert point["tokens_per_s_per_gpu"] == metrics[DECODE_TOKENS_KEY] / c.gpus
        assert point["tokens_per_s_per_user"] == 1.0 / metrics["tpot_mean_s"]
        assert sim.capacity in sim.result.rates
    recommended = {id(s) for s, _ in both.points}
    rejected = {id(s) for s, _ in both.rejected}
    for point, sim in zip(points, simulated, strict=True):
        expected = (
            "recommended" if id(sim) in recommended else ("rejected" if id(sim) in rejected else "")
        )
        assert point["verdict"] == expected
    assert sum(p["verdict"] == "recommended" for p in points) == len(both.points)


def test_the_frontier_is_each_kinds_undominated_points(both: Any) -> None:
    points = frontier_rows(both)
    for p in points:
        dominated = any(
            q is not p
            and q["deployment"] == p["deployment"]
            and q["tokens_per_s_per_gpu"] >= p["tokens_per_s_per_gpu"]
            and q["tokens_per_s_per_user"] >= p["tokens_per_s_per_user"]
            and (
                q["tokens_per_s_per_gpu"] > p["tokens_per_s_per_gpu"]
                or q["tokens_per_s_per_user"] > p["tokens_per_s_per_user"]
            )
            for q in points
        )
        assert p["frontier"] == (not dominated), p["label"]


def test_the_chart_draws_exactly_those_points(both: Any) -> None:
    """What matplotlib holds: the two kinds' scatters, together exactly the rows' points,
    and the marks over the recommended ones."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tokenyard.search.plots import draw_frontier

    points = frontier_rows(both)
    fig, ax = plt.subplots()
    try:
        draw_frontier(ax, points, "test")
        by_label = {}
        for collection in ax.collections:
            by_label[collection.get_label()] = sorted(map(tuple, collection.get_offsets()))
    finally:
        plt.close(fig)
    drawn = sorted(
        xy for label, xys in by_label.items() if label.startswith("aggregated (") for xy in xys
    ) + sorted(
        xy for label, xys in by_label.items() if label.startswith("disaggregated (") for xy in xys
    )
    want = sorted(
        (p["tokens_per_s_per_user"], p["tokens_per_s_per_gpu"])
        for p in points
        if p["deployment"] == "aggregated"
    ) + sorted(
        (p["tokens_per_s_per_user"], p["tokens_per_s_per_gpu"])
        for p in points
        if p["deployment"] == "disaggregated"
    )
    assert drawn == want
    marked = next(xys for label, xys in by_label.items() if label.startswith("recommended"))
    assert marked == sorted(
        (p["tokens_per_s_per_user"], p["tokens_per_s_per_gpu"])
        for p in points
        if p["verdict"] == "recommended"
    )


def test_a_point_that_held_no_load_is_not_drawn(both: Any) -> None:
    first = both.simulated[0]
    none = dataclasses.replace(first, result=dataclasses.replace(first.result, capacity_qps=0.0))
    rec = dataclasses.replace(both, simulated=[none, *both.simulated[1:]])
    assert len(frontier_rows(rec)) == len(frontier_rows(both)) - 1


def test_out_writes_the_chart_fresh(both: Any, tmp_path: Path) -> None:
    out = tmp_path / "rec"
    names = write_outputs(both, rows(both), out, "first", ("png", "svg"))
    assert "frontier.png" in names
    assert "frontier.svg" in names
    assert (out / "frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in (out / "frontier.svg").read_text()
    write_outputs(both, rows(both), out, "second", ("png",))
    assert (out / "frontier.png").is_file()
    assert not (out / "frontier.svg").exists()  # the first run's other format is gone
    write_outputs(both, rows(both), out, "third")
    assert not list(out.glob("frontier.*"))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--plots", "png"], "--plots needs --out"),
        (["--plots", "gif", "--out", "x"], "--plots: formats are png, svg, pdf or none"),
    ],
)
def test_plots_is_refused_where_it_cannot_apply(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["recommend", "--model", "llama-3.1-8b", "--system", "h100_sxm", "--gpus", "2"]
    argv += ["--isl", "100", "--osl", "10", "--ttft", "1", *extra]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_every_drawn_figure_is_finite(both: Any) -> None:
    for p in frontier_rows(both):
        assert math.isfinite(p["tokens_per_s_per_gpu"])
        assert p["tokens_per_s_per_gpu"] > 0
        assert math.isfinite(p["tokens_per_s_per_user"])
        assert p["tokens_per_s_per_user"] > 0


def test_plot_formats_follow_the_flags() -> None:
    import argparse

    from tokenyard.recommend.cli import plot_formats

    def formats(plots: str | None, out: str | None) -> tuple[str, ...]:
        return plot_formats(argparse.Namespace(plots=plots, out=out))

    assert formats(None, "rec") == ("png",)  # matplotlib is installed here
    assert formats(None, None) == ()
    assert formats("none", "rec") == ()
    assert formats("svg, .PDF", "rec") == ("svg", "pdf")
