"""``tokenyard recommend``: from a model, GPUs, a load and SLOs to a verified, launchable
deployment (docs/recommend.md).

    from tokenyard.recommend import Ask, recommend, rows

    result = recommend(Ask(model="llama-3.1-70b", systems=("h200_sxm",), workload=...,
                           slo={"ttft_p90_s": 1.0, "tpot_p90_s": 0.05}, gpus=16))
    sim, verdict = result.best("agg")

- ``estimate``: steady-state step arithmetic on the simulator's predictor (the pruner).
- ``candidates``: the layouts (aggregated, P/D), each with its estimate.
- ``recommend``: the three phases (estimate, simulate on ``tokenyard.search``, verify).
- ``verify``: the whole-load rule (margin, step down, reject) and headroom.
- ``table``: rows, the printed answer, ``--out`` files.
- ``cost``, ``launch``: cost and energy per million tokens; launch lines and configs.
"""

from typing import TYPE_CHECKING

from tokenyard._lazy import lazy_module

if TYPE_CHECKING:
    from tokenyard.recommend.recommend import Ask, Recommendation, recommend
    from tokenyard.recommend.table import format_table, rows, write_outputs
    from tokenyard.recommend.verify import Verdict

# Imported at first use: the command line imports this package to add its subcommand.
_EXPORTS = {
    "Ask": "tokenyard.recommend.recommend",
    "Recommendation": "tokenyard.recommend.recommend",
    "recommend": "tokenyard.recommend.recommend",
    "Verdict": "tokenyard.recommend.verify",
    "format_table": "tokenyard.recommend.table",
    "rows": "tokenyard.recommend.table",
    "write_outputs": "tokenyard.recommend.table",
}

__getattr__, __dir__ = lazy_module(globals(), _EXPORTS)

__all__ = ["Ask", "Recommendation", "Verdict", "format_table", "recommend", "rows", "write_outputs"]
