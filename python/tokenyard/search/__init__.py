"""Capacity planning on the simulator: the highest arrival rate a deployment serves within
its latency SLOs (capacity search), and that for every point of a declared grid of
deployments, with cost, QPS per dollar, the Pareto front and the best point (deployment
search). Locally on a process pool or on a Ray cluster; results are the same either way.

    from tokenyard.search import capacity_search, deployment_search, load_search_config

    report = capacity_search(simulation_config, {"ttft_p99_s": 2.0, "tbt_p99_s": 0.2})
    print(report.capacity_qps)

    result = deployment_search(load_search_config("grid.toml"), output_dir="out/")
    print(result.summary())

- ``config``: ``SearchConfig``, ``SLO``, ``SearchParams``, ``load_search_config``.
- ``capacity``: the bisection (``CapacitySearch``) and the task function (``run_probe``).
- ``deployments``: grid expansion and checks, ``capacity_search``, ``deployment_search``.
- ``driver``/``executors``: many searches at once on a process pool or Ray.
- ``results``/``tables``/``plots``: records, resumability, Parquet, summary, plots.

See ``docs/search.md``.
"""

from typing import TYPE_CHECKING

from tokenyard._lazy import lazy_module

if TYPE_CHECKING:
    from tokenyard.search.capacity import CapacityResult, CapacitySearch, Probe, with_rate
    from tokenyard.search.config import (
        SLO,
        SearchConfig,
        SearchParams,
        load_search_config,
        search_config_from_mapping,
    )
    from tokenyard.search.deployments import (
        CapacityReport,
        capacity_search,
        deployment_search,
        expand,
    )
    from tokenyard.search.executors import LocalExecutor, RayExecutor, SerialExecutor
    from tokenyard.search.plots import (
        draw_frontier,
        plot_capacity,
        plot_frontier,
        plot_frontier_rows,
        plot_pareto,
        write_plots,
    )
    from tokenyard.search.results import Point
    from tokenyard.search.tables import SearchResult

# Imported at first use: the command line imports this package to add its
# subcommand, and every other command would pay for its modules at start-up.
_EXPORTS = {
    "CapacityResult": "tokenyard.search.capacity",
    "CapacitySearch": "tokenyard.search.capacity",
    "Probe": "tokenyard.search.capacity",
    "with_rate": "tokenyard.search.capacity",
    "SLO": "tokenyard.search.config",
    "SearchConfig": "tokenyard.search.config",
    "SearchParams": "tokenyard.search.config",
    "load_search_config": "tokenyard.search.config",
    "search_config_from_mapping": "tokenyard.search.config",
    "CapacityReport": "tokenyard.search.deployments",
    "Point": "tokenyard.search.results",
    "SearchResult": "tokenyard.search.tables",
    "capacity_search": "tokenyard.search.deployments",
    "deployment_search": "tokenyard.search.deployments",
    "expand": "tokenyard.search.deployments",
    "LocalExecutor": "tokenyard.search.executors",
    "RayExecutor": "tokenyard.search.executors",
    "SerialExecutor": "tokenyard.search.executors",
    "draw_frontier": "tokenyard.search.plots",
    "plot_capacity": "tokenyard.search.plots",
    "plot_frontier": "tokenyard.search.plots",
    "plot_frontier_rows": "tokenyard.search.plots",
    "plot_pareto": "tokenyard.search.plots",
    "write_plots": "tokenyard.search.plots",
}


__getattr__, __dir__ = lazy_module(globals(), _EXPORTS)


__all__ = [
    "SLO",
    "CapacityReport",
    "CapacityResult",
    "CapacitySearch",
    "LocalExecutor",
    "Point",
    "Probe",
    "RayExecutor",
    "SearchConfig",
    "SearchParams",
    "SearchResult",
    "SerialExecutor",
    "capacity_search",
    "deployment_search",
    "draw_frontier",
    "expand",
    "load_search_config",
    "plot_capacity",
    "plot_frontier",
    "plot_frontier_rows",
    "plot_pareto",
    "search_config_from_mapping",
    "with_rate",
    "write_plots",
]
