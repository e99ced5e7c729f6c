"""Copied beside vLLM's tests/v1/core/ tests as conftest.py by vllm_own_tests.sh: makes
``tests/v1/core/utils.py::create_scheduler`` build tokenyard's scheduler unless a test asks
for another class. Nothing else in vLLM's tests changes."""

from __future__ import annotations

import functools

from tests.v1.core import utils

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
