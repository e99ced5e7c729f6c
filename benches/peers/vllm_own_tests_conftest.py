"""Copied beside vLLM's tests as tests/v1/core/conftest.py by vllm_own_tests.sh: makes
``tests/v1/core/utils.py::create_scheduler`` build tokenyard's scheduler unless a test asks
for another class, and rebinds the name ``Scheduler`` (``AsyncScheduler``) in the test
modules that build vLLM's ``Scheduler`` themselves (calling the name builds tokenyard's; the
rest of vLLM's class, its methods called unbound, stays vLLM's). Each test records whether
it built a tokenyard scheduler (a junit property, ``tokenyard_scheduler``, the fixture of
``vllm_own_tests_swap.py``, whose stand-ins this file shares), so that a file whose tests
never do is reported as one with no scheduler involved. Nothing else in vLLM's
tests changes."""

from __future__ import annotations

import functools
from typing import Any

from tests.v1.core import utils
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm_own_tests_swap import _builds, _record_tokenyard_scheduler  # noqa: F401 (fixture)

from tokenyard.integrations.vllm import AsyncTokenyardScheduler, TokenyardScheduler

_create_scheduler = utils.create_scheduler


@functools.wraps(_create_scheduler)
def _create_tokenyard_scheduler(*args, **kwargs):  # type: ignore[no-untyped-def]
    if kwargs.get("scheduler_cls") is None:
        # create_scheduler picks vLLM's AsyncScheduler for async_scheduling=True (the
        # config's flag may be off on a CPU-only machine); the same choice here.
        async_scheduling = kwargs.get("async_scheduling", False)
        kwargs["scheduler_cls"] = (
            AsyncTokenyardScheduler if async_scheduling else TokenyardScheduler
        )
    return _create_scheduler(*args, **kwargs)


utils.create_scheduler = _create_tokenyard_scheduler


def pytest_collection_modifyitems(items: list[Any]) -> None:
    stand_ins = {
        Scheduler: _builds(TokenyardScheduler, Scheduler),
        AsyncScheduler: _builds(AsyncTokenyardScheduler, AsyncScheduler),
    }
    for item in items:
        module = getattr(item, "module", None)
        if module is None:
            continue
        for name in ("Scheduler", "AsyncScheduler"):
            stand_in = stand_ins.get(getattr(module, name, None))  # type: ignore[arg-type]
            if stand_in is not None:
                setattr(module, name, stand_in)
