"""Where the simulations run: in this process, on a local process pool, or as Ray tasks.
One task per simulation (``capacity.run_probe`` on a plain-data payload); an executor only
runs tasks, it never decides which, so results do not depend on it.

Each executor has ``max_in_flight``, ``submit(tag, payload)``, ``wait()`` (blocks for at
least one finished task and returns ``[(tag, result)]``) and ``close()``.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from collections.abc import Hashable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Any, Protocol

from tokenyard.errors import ConfigError
from tokenyard.search.capacity import run_probe

__all__ = [
    "Executor",
    "LocalExecutor",
    "RayExecutor",
    "SerialExecutor",
    "make_executor",
]

Payload = dict[str, Any]
Result = dict[str, Any]


class Executor(Protocol):
    max_in_flight: int

    def submit(self, tag: Hashable, payload: Payload) -> None: ...

    def wait(self) -> list[tuple[Hashable, Result]]: ...

    def close(self) -> None: ...


class SerialExecutor:
    """Runs each task in this process when waited for (no parallelism; for debugging and
    small searches)."""

    max_in_flight = 1

    def __init__(self) -> None:
        self._queue: deque[tuple[Hashable, Payload]] = deque()

    def submit(self, tag: Hashable, payload: Payload) -> None:
        self._queue.append((tag, payload))

    def wait(self) -> list[tuple[Hashable, Result]]:
        tag, payload = self._queue.popleft()
        return [(tag, run_probe(payload))]

    def close(self) -> None:
        self._queue.clear()


class LocalExecutor:
    """A process pool on the local cores (``forkserver`` where available, else ``spawn``:
    never ``fork``, which is unsafe once Rust or numpy threads exist)."""

    def __init__(self, workers: int | None = None):
        workers = workers or available_cores()
        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        self.max_in_flight = workers
        self._pool = ProcessPoolExecutor(max_workers=workers, mp_context=context)
        self._futures: dict[Future[Result], Hashable] = {}

    def submit(self, tag: Hashable, payload: Payload) -> None:
        self._futures[self._pool.submit(run_probe, payload)] = tag

    def wait(self) -> list[tuple[Hashable, Result]]:
        done, _ = wait_futures(list(self._futures), return_when=FIRST_COMPLETED)
        return [(self._futures.pop(f), f.result()) for f in done]

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class RayExecutor:
    """Ray tasks, one per simulation (``num_cpus=1`` each). Connects to ``address``
    (``"auto"``: the running cluster, ``"local"``: a new local instance) unless Ray is
    already initialized in this process. Workers need tokenyard installed and any trace
    files at the same paths."""

    def __init__(self, address: str | None = "auto", *, max_in_flight: int | None = None):
        ray = _import_ray()
        if not ray.is_initialized():
            try:
                ray.init(address=None if address == "local" else address)
            except ConnectionError as exc:
                raise ConfigError(
                    f"ray: cannot connect to a Ray cluster at {address!r}: {exc} (start one "
                    f"with 'ray start --head', or use --ray local for a local instance)",
                    field="ray",
                    value=repr(address),
                ) from None
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.max_in_flight = max_in_flight or max(1, 2 * cpus)
        self._ray = ray
        self._remote = ray.remote(num_cpus=1)(run_probe)
        self._refs: dict[Any, Hashable] = {}

    def submit(self, tag: Hashable, payload: Payload) -> None:
        self._refs[self._remote.remote(payload)] = tag

    def wait(self) -> list[tuple[Hashable, Result]]:
        done, _ = self._ray.wait(list(self._refs), num_returns=1)
        return [(self._refs.pop(ref), self._ray.get(ref)) for ref in done]

    def close(self) -> None:
        for ref in self._refs:
            self._ray.cancel(ref)
        self._refs.clear()


def available_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "ray: running a search on Ray needs the ray package "
            "(pip install 'tokenyard[ray]' or pip install 'ray[default]')",
            field="ray",
        ) from None
    return ray


def make_executor(
    executor: str | Executor | None = None,
    *,
    workers: int | None = None,
    ray_address: str | None = None,
) -> Executor:
    """``"local"`` (default: a process pool of ``workers``, all cores if ``None``; one
    worker runs in this process), ``"serial"``, ``"ray"`` (at ``ray_address``, default
    ``"auto"``), or an executor object, returned as is."""
    if executor is not None and not isinstance(executor, str):
        return executor
    kind = executor or ("ray" if ray_address else "local")
    if kind == "ray":
        return RayExecutor(ray_address or "auto")
    if kind == "serial" or (kind == "local" and workers == 1):
        return SerialExecutor()
    if kind == "local":
        if workers is not None and workers < 1:
            raise ConfigError(
                f"workers: must be >= 1, got {workers}", field="workers", value=str(workers)
            )
        return LocalExecutor(workers)
    raise ConfigError(
        f"executor: unknown executor {kind!r}; expected local, serial or ray",
        field="executor",
        value=repr(kind),
    )
