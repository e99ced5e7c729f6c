"""A pytest plugin (``-p vllm_own_tests_swap``, with benches/peers on ``PYTHONPATH``) for
vLLM's own tests outside ``tests/v1/core/`` (the KV-connector, offloading and EC-connector
unit tests): every module of vLLM's ``tests`` package loaded at collection that binds the
name ``Scheduler`` (``AsyncScheduler``) to vLLM's class gets a stand-in whose call builds
tokenyard's ``TokenyardScheduler`` (``AsyncTokenyardScheduler``), as the ``tests/v1/core``
conftest (vllm_own_tests_conftest.py) does for its test modules; the helpers' modules
(``tests/v1/kv_connector/unit/utils.py::create_scheduler`` picks the class by those names)
included. The rest of vLLM's class stays vLLM's, so a test calling its methods unbound on
a stand-in ``self`` still tests vLLM's code. Each case records whether it built a tokenyard
scheduler (junit property ``tokenyard_scheduler``). Nothing in vLLM's tests changes."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from tokenyard.integrations.vllm import AsyncTokenyardScheduler, TokenyardScheduler

_built = [0]
_init = TokenyardScheduler.__init__


def _counting_init(self: Any, *args: Any, **kwargs: Any) -> None:
    _built[0] += 1
    _init(self, *args, **kwargs)


TokenyardScheduler.__init__ = _counting_init  # type: ignore[method-assign]


def _builds(cls: type, vllm_cls: type) -> type:
    """A stand-in for ``vllm_cls``: calling it builds ``cls``; everything else is vLLM's.

    A test (or a plugin it loads) that assigns a class attribute on the name, as
    ``Scheduler._build_kv_connector_meta = ...`` replaces vLLM's hook for every scheduler
    built after it, sets it on the stand-in; a call then builds a subclass of ``cls``
    carrying those attributes, so the built scheduler sees them as vLLM's would."""

    class _Switch(type(vllm_cls)):  # type: ignore[misc]
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            assigned = {k: v for k, v in vars(self).items() if k not in _STAND_IN_OWN}
            if not assigned:
                return cls(*args, **kwargs)
            return type(cls.__name__, (cls,), assigned)(*args, **kwargs)

        def __instancecheck__(self, obj: Any) -> bool:
            return isinstance(obj, (cls, vllm_cls))

    return _Switch(vllm_cls.__name__, (vllm_cls,), {})


# What a class statement puts in any stand-in's namespace (not a test's assignment).
_STAND_IN_OWN = frozenset(vars(type("_Probe", (object,), {})))


def pytest_collection_modifyitems(items: list[Any]) -> None:
    stand_ins = {
        Scheduler: _builds(TokenyardScheduler, Scheduler),
        AsyncScheduler: _builds(AsyncTokenyardScheduler, AsyncScheduler),
    }
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "tests" or name.startswith("tests.")):
            continue
        for attr in ("Scheduler", "AsyncScheduler"):
            stand_in = stand_ins.get(getattr(module, attr, None))  # type: ignore[arg-type]
            if stand_in is not None:
                setattr(module, attr, stand_in)


@pytest.fixture(autouse=True)
def _record_tokenyard_scheduler(record_property: Any) -> Any:
    before = _built[0]
    yield
    record_property("tokenyard_scheduler", int(_built[0] > before))
