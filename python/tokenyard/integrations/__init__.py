"""Adapters that let serving engines use tokenyard's structures through their own interfaces.

- :mod:`tokenyard.integrations.sglang` — SGLang's prefix-cache interface (``RadixCache``:
  ``match_prefix``, ``insert``, ``evict``, lock counts, sizes) over tokenyard's radix cache.

Each adapter is imported on its own (``from tokenyard.integrations.sglang import ...``) and
never imports the engine it imitates, so it works where that engine is not installed.
See ``docs/integrations.md``.
"""

from __future__ import annotations

__all__: list[str] = []
