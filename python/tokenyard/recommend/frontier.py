"""The agg-vs-disagg chart of ``tokenyard recommend``: output tokens/s per GPU against
tokens/s per user for every layout it simulated, each at the capacity its search found
(never a bisection probe, never an estimate), the recommended points and the ones the
whole load rejected marked over them. Drawn by ``tokenyard search``'s own
``plots.draw_frontier``, from the same figures its ``frontier.<fmt>`` uses: the output
tokens/s of the run at capacity per GPU, and ``1 / mean TPOT`` of that run.

Invariant: one row per ``Recommendation.simulated`` entry with a capacity above 0, in its
order; nothing else.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenyard.search.capacity import DECODE_TOKENS_KEY
from tokenyard.search.tables import pareto_front

if TYPE_CHECKING:
    from tokenyard.recommend.recommend import Recommendation

__all__ = ["frontier_rows", "plot_frontier"]

_KIND = {"agg": "aggregated", "disagg": "disaggregated"}


def frontier_rows(rec: Recommendation) -> list[dict[str, Any]]:
    """One row per simulated point that held some load: ``label`` (deployment and GPU),
    ``deployment`` (``aggregated``/``disaggregated``), ``gpus``, ``capacity``,
    ``tokens_per_s_per_gpu`` and ``tokens_per_s_per_user`` at that capacity, ``verdict``
    (``recommended``, ``rejected`` or ``""``: simulated, not verified) and ``frontier``
    (no point of the same kind has both figures higher)."""
    verdicts = {id(s): "recommended" for s, _ in rec.points}
    verdicts.update({id(s): "rejected" for s, _ in rec.rejected})
    out: list[dict[str, Any]] = []
    for sim in rec.simulated:
        metrics = sim.result.metrics
        tokens = metrics.get(DECODE_TOKENS_KEY, math.nan)
        tpot = metrics.get("tpot_mean_s", math.nan)
        if not (sim.capacity > 0 and math.isfinite(tokens) and math.isfinite(tpot) and tpot > 0):
            continue
        c = sim.candidate
        out.append(
            {
                "label": f"{c.label} ({c.layout.device})",
                "deployment": _KIND[c.kind],
                "gpus": c.gpus,
                "capacity": sim.capacity,
                "tokens_per_s_per_gpu": tokens / c.gpus,
                "tokens_per_s_per_user": 1.0 / tpot,
                "verdict": verdicts.get(id(sim), ""),
                "frontier": False,
            }
        )
    for kind in _KIND.values():
        mine = [r for r in out if r["deployment"] == kind]
        costs = [(-r["tokens_per_s_per_gpu"], -r["tokens_per_s_per_user"]) for r in mine]
        for row, flag in zip(mine, pareto_front(costs), strict=True):
            row["frontier"] = flag
    return out


def plot_frontier(rec: Recommendation, path: str | Path) -> Path:
    """Draws ``frontier_rows(rec)`` to ``path`` (format from its suffix).

    Raises:
        ConfigError: matplotlib is not installed (field ``plots``).
    """
    from tokenyard.search.plots import plot_frontier_rows

    title = f"{rec.ask.model}: {len(rec.simulated)} simulated layouts, each at its capacity"
    return plot_frontier_rows(frontier_rows(rec), path, title)
