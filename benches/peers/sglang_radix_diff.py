"""Differential check: SGLang 0.5.23's own ``RadixCache`` against
``tokenyard.integrations.sglang.SGLangRadixCache`` (tokenyard's radix cache behind SGLang's
interface), driven with identical random operation streams.

Each stream is ``--steps`` operations drawn from one seed: inserts of page-structured keys
(a few shared pages, so paths share prefixes and edges split), matches (half of them
locking the matched node), unlocks of a random locked node, and evictions. After every
operation the two caches must agree on the operation's result (insert's prefix length,
match's length and KV indices, lock deltas, evicted KV indices *in order* and counts) and
on the evictable / protected / total sizes. A stream agrees when every step does; the
first differing step of a stream that does not is printed.

    bash benches/peers/setup.sh   # once: .venv-bench with SGLang's sources and tokenyard
    .venv-bench/bin/python benches/peers/sglang_radix_diff.py [--streams 1000] [--steps 60]

Runs only where SGLang's sources are (``SGLANG_SRC``, see ``sglang_peer.py``).
"""

from __future__ import annotations

import argparse
import random
import sys
from array import array
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sglang_peer  # noqa: F401  (importing it installs the stubs SGLang needs)

OPS = ("insert", "insert", "match", "match", "unlock", "evict")


class RecordingAllocator:
    """The mock KV allocator both caches free evicted indices into, in order."""

    device = "cpu"

    def __init__(self) -> None:
        self.freed: list[int] = []

    def free(self, indices: Any) -> None:
        self.freed += [int(i) for i in indices.tolist()]

    def free_segment(self, indices: Any, start_pos: int = 0) -> None:
        self.free(indices)


class Pair:
    """SGLang's cache and tokenyard's adapter, fed the same operations."""

    def __init__(self, page_size: int) -> None:
        from sglang.srt.mem_cache.radix_cache import RadixCache

        from tokenyard.integrations import sglang as adapter

        self.adapter = adapter
        self.page_size = page_size
        self.peer_alloc, self.ours_alloc = RecordingAllocator(), RecordingAllocator()
        self.peer = RadixCache.create_simulated(mock_allocator=self.peer_alloc, page_size=page_size)
        self.ours = adapter.SGLangRadixCache.create_simulated(
            mock_allocator=self.ours_alloc, page_size=page_size
        )
        self.locked: list[tuple[Any, Any]] = []
        self.next_value = 0

    def insert(self, tokens: list[int]) -> tuple[Any, Any]:
        import torch
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        n = len(tokens) // self.page_size * self.page_size
        values = list(range(self.next_value, self.next_value + n))
        self.next_value += n
        peer_key = RadixKey(array("q", tokens)).page_aligned(self.page_size)
        tensor = torch.tensor(values, dtype=torch.int64)
        peer = self.peer.insert(InsertParams(key=peer_key, value=tensor)).prefix_len
        ad = self.adapter
        ours = self.ours.insert(ad.InsertParams(key=ad.RadixKey(array("q", tokens)), value=values))
        return peer, ours.prefix_len

    def match(self, tokens: list[int], lock: bool) -> tuple[Any, Any]:
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        m = self.peer.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens))))
        path = self.peer.path_device_indices(m.last_device_node).tolist()
        peer: Any = (m.device_prefix_len, path[: m.device_prefix_len])
        ad = self.adapter
        o = self.ours.match_prefix(ad.MatchPrefixParams(key=ad.RadixKey(array("q", tokens))))
        ours: Any = (o.device_prefix_len, o.device_indices.tolist())
        if lock:
            peer += (self.peer.inc_lock_ref(m.last_device_node).delta,)
            ours += (self.ours.inc_lock_ref(o.last_device_node).delta,)
            self.locked.append((m.last_device_node, o.last_device_node))
        return peer, ours

    def unlock(self, rng: random.Random) -> tuple[Any, Any]:
        if not self.locked:
            return None, None
        peer_node, our_node = self.locked.pop(rng.randrange(len(self.locked)))
        return self.peer.dec_lock_ref(peer_node).delta, self.ours.dec_lock_ref(our_node).delta

    def evict(self, num_tokens: int) -> tuple[Any, Any]:
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        self.peer_alloc.freed.clear()
        self.ours_alloc.freed.clear()
        peer_n = self.peer.evict(EvictParams(num_tokens=num_tokens)).num_tokens_evicted
        ours_n = self.ours.evict(self.adapter.EvictParams(num_tokens)).num_tokens_evicted
        return (peer_n, list(self.peer_alloc.freed)), (ours_n, list(self.ours_alloc.freed))

    def sizes(self) -> tuple[Any, Any]:
        def of(cache: Any) -> tuple[int, int, int]:
            return cache.evictable_size(), cache.protected_size(), cache.total_size()

        return of(self.peer), of(self.ours)


def random_tokens(rng: random.Random, page_size: int) -> list[int]:
    """Up to 5 pages drawn from 3 page patterns, plus a partial page."""
    pages = [rng.randrange(3) for _ in range(rng.randrange(6))]
    tokens = [p * 10 + i % 2 for p in pages for i in range(page_size)]
    tail = rng.randrange(page_size + 1) if page_size > 1 else 0
    return tokens + list(range(tail))


def run_stream(seed: int, page_size: int, steps: int) -> tuple[int, str, Any, Any] | None:
    """The first differing step (index, operation, SGLang's answer, ours), or ``None``."""
    rng = random.Random(seed)
    pair = Pair(page_size)
    for step in range(steps):
        op = rng.choice(OPS)
        tokens = random_tokens(rng, page_size)
        if op == "insert":
            peer, ours = pair.insert(tokens)
        elif op == "match":
            peer, ours = pair.match(tokens, lock=rng.random() < 0.5)
        elif op == "unlock":
            peer, ours = pair.unlock(rng)
        else:
            peer, ours = pair.evict(rng.randrange(1, 8) * page_size)
        if peer != ours:
            return step, op, peer, ours
        peer, ours = pair.sizes()
        if peer != ours:
            return step, f"{op} (sizes)", peer, ours
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--page-sizes", default="1,2,16")
    args = parser.parse_args()
    all_agree = True
    for page_size in (int(p) for p in args.page_sizes.split(",")):
        diffs = [run_stream(seed, page_size, args.steps) for seed in range(args.streams)]
        failed = [(seed, d) for seed, d in enumerate(diffs) if d is not None]
        agree = args.streams - len(failed)
        line = f"page size {page_size:>2}: {agree}/{args.streams} streams agree on every step"
        if failed:
            seed, (step, op, peer, ours) = failed[0]
            line += (
                f"; first difference: seed {seed}, step {step} ({op}): SGLang {peer}, ours {ours}"
            )
            all_agree = False
        print(line, flush=True)
    return 0 if all_agree else 1


if __name__ == "__main__":
    sys.exit(main())
