"""Workloads for the simulator: synthetic request streams and trace readers, all streamed.

A workload yields ``RequestChunk``s (numpy arrays of arrival times, prompt and output
lengths, and optional prefix hash ids) of at most ``chunk_size`` requests, so a trace of
millions of requests is replayed with memory flat in its length::

    from tokenyard.workload import load_workload

    workload = load_workload({"kind": "trace", "format": "vidur", "path": "trace.csv"})
    for chunk in workload.chunks(65536):
        ...

- ``chunk``: ``RequestChunk``, the ``Workload`` protocol, ``summarize``.
- ``synthetic``: ``SyntheticWorkload`` and its parts (``ArrivalProcess``,
  ``LengthDistribution``, ``SharedPrefix``).
- ``sessions``: ``SessionWorkload`` (conversations and agents: turns sent a think time
  after the previous one completes) and ``ClosedLoop`` (a fixed number of users).
- ``traces``: ``VidurTrace``, ``MooncakeTrace``, ``AzureTrace``; ``TraceError`` names the
  file, line and field of a bad row.
- ``columns``: ``ColumnTrace``, any CSV/TSV/JSON-lines trace read through a column mapping
  (``TraceColumns``) and row filters (``ColumnFilter``).
- ``config``: ``load_workload``, the entry point of the simulator's config.

See ``docs/workloads.md`` for every option and the trace formats.
"""

from tokenyard.workload.chunk import (
    MAX_REQUESTS,
    NO_SESSION,
    RequestChunk,
    Workload,
    WorkloadStats,
    summarize,
)
from tokenyard.workload.columns import ColumnFilter, ColumnTrace, TraceColumns
from tokenyard.workload.config import load_workload
from tokenyard.workload.errors import TraceError
from tokenyard.workload.session_traces import BailianTrace, SessionTrace
from tokenyard.workload.sessions import ClosedLoop, SessionWorkload, ThinkTime
from tokenyard.workload.synthetic import (
    SHARED_ID_BIT,
    ArrivalProcess,
    LengthDistribution,
    SharedPrefix,
    SyntheticWorkload,
)
from tokenyard.workload.traces import AzureTrace, MooncakeTrace, VidurTrace, sample_path

__all__ = [
    "MAX_REQUESTS",
    "NO_SESSION",
    "SHARED_ID_BIT",
    "ArrivalProcess",
    "AzureTrace",
    "BailianTrace",
    "ClosedLoop",
    "ColumnFilter",
    "ColumnTrace",
    "LengthDistribution",
    "MooncakeTrace",
    "RequestChunk",
    "SessionTrace",
    "SessionWorkload",
    "SharedPrefix",
    "SyntheticWorkload",
    "ThinkTime",
    "TraceColumns",
    "TraceError",
    "VidurTrace",
    "Workload",
    "WorkloadStats",
    "load_workload",
    "sample_path",
    "summarize",
]
