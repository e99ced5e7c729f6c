"""vLLM 0.33's prefix-cache rules for EAGLE/EAGLE3/MTP drafters, read off its configs and
requests for the core (``SchedulerConfig.num_hash_lookahead_tokens``, ``eagle_block_drop``;
``docs/integrations.md``, "EAGLE/MTP prefix caching").

- The hash look-ahead is ``VllmConfig.num_hash_lookahead_tokens`` (``vllm/config/vllm.py``):
  ``num_prefill_lookahead_tokens`` when ``speculative_config.use_eagle_block_drop()`` with
  prefix caching, unless ``disable_lookahead_block_hashes`` or a KV transfer config.
- The trailing-block drop is ``Scheduler.use_eagle_block_drop`` (``v1/core/sched/
  scheduler.py``): the speculative config's ``use_eagle_block_drop()``, off when look-ahead
  hashes are on; the core serves it only with prefix caching (vLLM's drop acts on hits).
- vLLM hashes a request's blocks with the request's own block hasher
  (``get_request_block_hasher(block_size, fn, num_hash_lookahead_tokens)``, which the engine
  builds from the config); a request whose hasher says another look-ahead switches the
  core to it while no request holds blocks (vLLM's tests build such requests by hand).
- ``Scheduler.num_hash_lookahead_tokens`` (vLLM's attribute, which its Mamba ``align`` split
  and its resumable re-hash read) is the core's one look-ahead (:class:`HashLookahead`):
  assigning it on a built scheduler moves the core's hashes and split together.
"""

from __future__ import annotations

from typing import Any

from tokenyard.errors import InputError
from tokenyard.integrations._vllm_state import AdapterBase, non_negative


def hasher_lookahead(request: Any) -> int | None:
    """The look-ahead of the request's block hasher (vLLM's ``get_request_block_hasher``
    closure keeps it), or ``None`` if it has no hasher or one of another make."""
    hasher = getattr(request, "_block_hasher", None)
    code = getattr(hasher, "__code__", None)
    closure = getattr(hasher, "__closure__", None)
    if code is None or closure is None:
        return None
    names = code.co_freevars
    if "num_hash_lookahead_tokens" not in names:
        return None
    value = closure[names.index("num_hash_lookahead_tokens")].cell_contents
    return int(value) if isinstance(value, int) else None


def follow_hasher(core: Any, request: Any) -> None:
    """Switches the core's hash look-ahead to the request's hasher's, as vLLM hashes with
    the request's hasher.

    Raises:
        InputError: the request's hasher's look-ahead differs from the one the requests
            holding blocks were hashed with (or the core refuses it, e.g. with a KV
            connector).
    """
    lookahead = hasher_lookahead(request)
    if lookahead is None or lookahead == core.num_hash_lookahead_tokens:
        return
    try:
        core.num_hash_lookahead_tokens = lookahead
    except ValueError as err:
        raise InputError(
            f"block_hasher: request {request.request_id!r} is hashed with "
            f"num_hash_lookahead_tokens={lookahead}, but the scheduler hashes with "
            f"{core.num_hash_lookahead_tokens} and cannot switch now ({err})",
            field="block_hasher",
            value=str(lookahead),
        ) from err


class HashLookahead(AdapterBase):
    """vLLM 0.33's ``Scheduler.num_hash_lookahead_tokens`` over the core's one setting."""

    @property
    def num_hash_lookahead_tokens(self) -> int:
        """Tokens past each block that its hash covers (``VllmConfig.
        num_hash_lookahead_tokens`` at construction, then the requests' hashers'): the
        core's, which its hashes and its Mamba ``align`` split both follow."""
        lookahead: int = self._core.num_hash_lookahead_tokens
        return lookahead

    @num_hash_lookahead_tokens.setter
    def num_hash_lookahead_tokens(self, value: int) -> None:
        """From the next step, as assigning vLLM's moves its split's last reusable state;
        the core also hashes with it (vLLM hashes with the requests' hashers, which its
        engine builds from the same value).

        Raises:
            ConfigError: a negative value, or one the core refuses now (a request holds
                blocks, a KV connector, prefix caching off), naming the field.
        """
        self._core.num_hash_lookahead_tokens = non_negative(value, "num_hash_lookahead_tokens")
