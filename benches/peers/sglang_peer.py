"""SGLang's radix cache, imported offline for side-by-side benchmarks.

SGLang is not pip-installed here: ``setup.sh`` unzips the Python sources of the
0.5.23 wheel (without its native ``.so`` extensions) into
``.venv-bench/sglang_src``. ``sglang.srt.mem_cache.radix_cache`` is pure Python,
but its import chain reaches GPU-only or heavyweight packages (sgl_kernel,
flashinfer, torchvision, tvm_ffi) and SGLang modules whose import needs those.
None of them is *called* by the radix tree, so ``install_stubs`` answers those
imports with inert placeholder modules.

The helpers below call the cache the way SGLang's scheduler does
(``mem_cache/common.py::match_kv_cache``, ``RadixCache._insert_cache``,
``allocation.py::_prefix_kv_indices``): keys are ``RadixKey`` over
``array('q')`` token ids, values int64 tensors of KV indices.

Which SGLang structure this is: in 0.5.23 the scheduler's live prefix cache is
``UnifiedRadixCache`` (``mem_cache/registry.py``), whose tree core defaults to a
bundled Rust extension (``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=rust``) when
torch is 2.11-2.14 on Linux. The pure-Python ``RadixCache`` here is the classic
SGLang radix tree, still used by its scheduler for the waiting-queue prefix check
(``schedule_policy.py``). Results against it say nothing about the Rust core.

Only runs inside the bench venv made by ``benches/peers/setup.sh``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from array import array
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SGLANG_SRC = Path(os.environ.get("SGLANG_SRC", REPO / ".venv-bench" / "sglang_src"))

# Module prefixes answered with placeholders. The first four are native or
# GPU-only packages, stubbed only when not really installed (vLLM's xgrammar
# brings the real tvm_ffi, and must get it); the SGLang-internal ones are
# modules whose import pulls in model configs / quantization kernels / real
# memory pools we do not use (the radix tree only needs an allocator object with
# ``free_segment``).
STUBBED_PREFIXES = (
    "tvm_ffi",
    "torchvision",
    "sgl_kernel",
    "flashinfer",
    "sglang.srt.configs",
    "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.layers.quantization",
)


class _Placeholder:
    """Stands in for any attribute of a stubbed module.

    It has to survive what import-time code does with imported names: subclass
    them, call them as decorators, use them in annotations, index them as
    generics, compare them. It must never be reached by the benchmarked code.
    """

    def __init__(self, *args, **kwargs):
        pass

    def __init_subclass__(cls, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        # Used as a decorator: hand the decorated function back unchanged.
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return _Placeholder()

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Placeholder()

    def __class_getitem__(cls, item):
        return cls

    def __getitem__(self, item):
        return _Placeholder()

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False

    def __or__(self, other):
        return self

    __ror__ = __or__


class _StubModule(types.ModuleType):
    def __init__(self, name: str):
        super().__init__(name)
        self.__path__ = []  # a package, so `import stub.sub` also resolves here
        self.__file__ = f"<stub {name}>"

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        # A fresh subclass per name: code may subclass or isinstance-check it.
        value = type(name, (_Placeholder,), {"__module__": self.__name__})
        setattr(self, name, value)
        return value


def _is_availability_probe() -> bool:
    """True when ``importlib.util.find_spec`` (not an import statement) is asking.

    Libraries probe optional packages that way (transformers checks for
    torchvision and then uses it for real). Such probes must see the truth --
    not installed -- or they go on to use the placeholder in earnest.
    """
    frame = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            return False
        code = frame.f_code
        # importlib.util is frozen in CPython 3.11+, so its frames report
        # "<frozen importlib.util>" rather than a path.
        if code.co_name == "find_spec" and (
            code.co_filename == "<frozen importlib.util>"
            or code.co_filename.endswith(os.path.join("importlib", "util.py"))
        ):
            return True
        frame = frame.f_back
    return False


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, prefixes: tuple[str, ...]):
        self.prefixes = prefixes

    def find_spec(self, fullname, path=None, target=None):
        if any(fullname == p or fullname.startswith(p + ".") for p in self.prefixes):
            if _is_availability_probe():
                return None
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return _StubModule(spec.name)

    def exec_module(self, module):
        pass


_installed = False


def install_stubs() -> None:
    """Put the stub finder first on sys.meta_path and SGLang's sources on sys.path."""
    global _installed
    if _installed:
        return
    if not (SGLANG_SRC / "sglang").is_dir():
        raise RuntimeError(
            f"SGLang sources not found under {SGLANG_SRC}; run benches/peers/setup.sh"
        )
    sys.path.insert(0, str(SGLANG_SRC))
    prefixes = tuple(
        p
        for p in STUBBED_PREFIXES
        if p.startswith("sglang.") or importlib.util.find_spec(p) is None
    )
    sys.meta_path.insert(0, _StubFinder(prefixes))
    _installed = True


install_stubs()

import torch  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import (  # noqa: E402
    EvictParams,
    InsertParams,
    MatchPrefixParams,
)
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey  # noqa: E402


class CountingAllocator:
    """The slice of SGLang's token-to-KV allocator that RadixCache touches.

    The tree hands evicted (and, via the caller, duplicate) KV indices to
    ``free_segment``. A real allocator would push them onto a free list; we only
    count them, so the peer's evict cost excludes the allocator's own work
    (tokenyard's evict returns the freed indices, which is the comparable step).
    """

    device = "cpu"

    def __init__(self) -> None:
        self.freed_tokens = 0

    def free_segment(self, indices: torch.Tensor, start_pos: int = 0) -> None:
        self.freed_tokens += len(indices)


def make_radix_cache(page_size: int = 1) -> RadixCache:
    """A ready RadixCache with SGLang's defaults (LRU eviction, no events/metrics)."""
    return RadixCache.create_simulated(mock_allocator=CountingAllocator(), page_size=page_size)


def to_key_ids(token_ids) -> array:
    """SGLang's native token-id container (``Req.origin_input_ids`` is ``array('q')``)."""
    return array("q", token_ids.tolist() if hasattr(token_ids, "tolist") else token_ids)


def insert(cache: RadixCache, token_ids: array, values: torch.Tensor) -> int:
    """Insert as ``RadixCache._insert_cache`` does; returns the already-cached length.

    The caller would free ``values[:prefix_len]`` (duplicates of what the tree
    already holds); we return the length and leave that to the harness.
    """
    key = RadixKey(token_ids).page_aligned(cache.page_size)
    result = cache.insert(InsertParams(key=key, value=values[: len(key)]))
    return result.prefix_len


def match_prefix(cache: RadixCache, token_ids: array):
    """Match and fetch the matched KV indices, as the scheduler does per request.

    SGLang's ``match_prefix`` returns only the length and the last node; the
    indices are read off the path when the request is allocated
    (``prefix_device_indices``). tokenyard returns them from ``match_prefix``,
    so both steps belong to the comparable operation.
    Returns ``(matched_len, indices, last_node)``.
    """
    result = cache.match_prefix(MatchPrefixParams(key=RadixKey(token_ids)))
    n = result.device_prefix_len
    indices = cache.path_device_indices(result.last_device_node)[:n]
    return n, indices, result.last_device_node


def evict(cache: RadixCache, num_tokens: int) -> int:
    """Evict LRU leaves until ``num_tokens`` are freed; returns the number freed."""
    return cache.evict(EvictParams(num_tokens=num_tokens)).num_tokens_evicted


def lock(cache: RadixCache, node) -> None:
    cache.inc_lock_ref(node)


def unlock(cache: RadixCache, node) -> None:
    cache.dec_lock_ref(node)


def versions() -> dict[str, str]:
    try:
        from sglang.version import __version__ as v
    except Exception:  # the version module is plain Python, but be safe
        v = "unknown"
    return {"sglang": v}
