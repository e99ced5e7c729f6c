"""Copied beside vLLM's tests as tests/v1/core/conftest.py by vllm_own_tests.sh: makes
``tests/v1/core/utils.py::create_scheduler`` build tokenyard's scheduler unless a test asks
for another class, and rebinds the name ``Scheduler`` (``AsyncScheduler``) in the test modules
that build vLLM's ``Scheduler`` themselves. Each test records whether it built a tokenyard
scheduler (a junit property, ``tokenyard_scheduler``), so that a file whose tests never do is
reported as one with no scheduler involved. Nothing else in vLLM's tests changes."""

from __future__ import annotations

import functools
from typing import Any

import pytest
from tests.v1.core import utils
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from tokenyard.integrations.vllm import AsyncTokenyardScheduler, TokenyardScheduler

_create_scheduler = utils.create_scheduler
_built = [0]


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

_init = TokenyardScheduler.__init__


def _counting_init(self: Any, *args: Any, **kwargs: Any) -> None:
    _built[0] += 1
    _init(self, *args, **kwargs)


TokenyardScheduler.__init__ = _counting_init  # type: ignore[method-assign]


def pytest_collection_modifyitems(items: list[Any]) -> None:
    for item in items:
        module = getattr(item, "module", None)
        if module is None:
            continue
        if getattr(module, "Scheduler", None) is Scheduler:
            module.Scheduler = TokenyardScheduler
        if getattr(module, "AsyncScheduler", None) is AsyncScheduler:
            module.AsyncScheduler = AsyncTokenyardScheduler


@pytest.fixture(autouse=True)
def _record_tokenyard_scheduler(record_property: Any) -> Any:
    before = _built[0]
    yield
    record_property("tokenyard_scheduler", int(_built[0] > before))
