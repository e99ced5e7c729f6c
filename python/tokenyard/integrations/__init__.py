"""Adapters that let serving engines use tokenyard's structures through their own interfaces.

- :mod:`tokenyard.integrations.sglang` — SGLang's prefix-cache interface (``RadixCache``:
  ``match_prefix``, ``insert``, ``evict``, lock counts, sizes) over tokenyard's radix cache.
- :mod:`tokenyard.integrations.vllm` — vLLM 0.33's ``SchedulerInterface``
  (``TokenyardScheduler``, for vLLM's ``scheduler_cls``) over tokenyard's step scheduler.
  It imports vLLM (and says so where vLLM is missing); its config translation lives in
  ``_vllm_translate`` and needs no vLLM.

Each adapter is imported on its own (``from tokenyard.integrations.sglang import ...``); the
SGLang one never imports SGLang, the vLLM one needs vLLM.
See ``docs/integrations.md``.
"""

from __future__ import annotations

__all__: list[str] = []
