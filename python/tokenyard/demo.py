"""The built-in default job until the simulator lands: a shared-prefix request stream run
through each KV structure, with the numbers an engine author would look at."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tokenyard.kv import BlockPool, CountingAllocator, RadixCache

TokenArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class DemoWorkload:
    """Requests made of one of ``num_prompts`` shared system prompts plus a unique suffix."""

    num_requests: int = 2_000
    num_prompts: int = 20
    prompt_len: tuple[int, int] = (256, 1024)
    suffix_len: tuple[int, int] = (32, 512)
    output_len: int = 64
    seed: int = 0

    def requests(self) -> list[TokenArray]:
        rng = np.random.default_rng(self.seed)
        prompts = [
            rng.integers(0, 32_000, rng.integers(*self.prompt_len, endpoint=True))
            for _ in range(self.num_prompts)
        ]
        choices = rng.integers(0, self.num_prompts, self.num_requests)
        return [
            np.concatenate(
                [prompts[c], rng.integers(0, 32_000, rng.integers(*self.suffix_len, endpoint=True))]
            )
            for c in choices
        ]


def block_pool_run(
    requests: list[TokenArray], block_size: int, num_blocks: int
) -> dict[str, float]:
    """Admit each request with its prefix hit, decode ``output_len`` tokens, free it."""
    pool = BlockPool(num_blocks=num_blocks, block_size=block_size)
    failed = 0
    start = time.perf_counter()
    for request_id, tokens in enumerate(requests):
        hit = pool.get_computed_blocks(tokens)
        new_tokens = len(tokens) - hit.num_computed_tokens
        blocks = pool.allocate_slots(
            request_id, new_tokens, token_ids=tokens, new_computed_blocks=hit
        )
        if blocks is None:
            failed += 1
            continue
        for step in range(DemoWorkload.output_len):
            pool.allocate_slots(request_id, 1, token_ids=[step])
        pool.free(request_id)
    elapsed = time.perf_counter() - start
    stats = pool.stats()
    return {
        "hit_rate": stats.hit_rate,
        "cached_blocks": pool.num_cached_blocks,
        "failed": failed,
        "us_per_request": elapsed / len(requests) * 1e6,
    }


def radix_run(requests: list[TokenArray], capacity_tokens: int) -> dict[str, float]:
    """SGLang's pattern: match, lock while running, insert the finished sequence, unlock,
    and evict LRU leaves when the cache outgrows its capacity."""
    cache = RadixCache(page_size=1)
    next_slot = 0
    hit_tokens = query_tokens = evicted = 0
    start = time.perf_counter()
    for tokens in requests:
        match = cache.match_prefix(tokens)
        hit_tokens += match.matched_len
        query_tokens += len(tokens)
        cache.lock(match.handle)
        new_slots = np.arange(next_slot, next_slot + len(tokens) - match.matched_len)
        next_slot += len(new_slots)
        cache.insert(tokens, np.concatenate([match.values, new_slots]))
        cache.unlock(match.handle)
        overflow = cache.total_size - capacity_tokens
        if overflow > 0:
            evicted += len(cache.evict(overflow))
    elapsed = time.perf_counter() - start
    return {
        "hit_rate": hit_tokens / query_tokens,
        "cached_tokens": cache.total_size,
        "evicted_tokens": evicted,
        "us_per_request": elapsed / len(requests) * 1e6,
    }


def counting_run(requests: list[TokenArray], block_size: int, num_blocks: int) -> dict[str, float]:
    """Vidur's rule: admit while the prompt's blocks fit above a 1% watermark."""
    alloc = CountingAllocator(num_blocks=num_blocks, watermark_fraction=0.01)
    admitted = 0
    for request_id, tokens in enumerate(requests):
        needed = -(-len(tokens) // block_size)
        if not alloc.can_admit(needed):
            break
        alloc.allocate(request_id, needed)
        admitted += 1
    return {"admitted": admitted, "usage": alloc.usage}


def main(workload: DemoWorkload | None = None) -> None:
    from tokenyard import __version__, build_profile

    workload = workload or DemoWorkload()
    requests = workload.requests()
    total = sum(len(r) for r in requests)
    print(f"tokenyard {__version__} ({build_profile} build): KV memory demo")
    print(
        f"workload: {workload.num_requests} requests, {total} prompt tokens, "
        f"{workload.num_prompts} shared system prompts, seed {workload.seed}\n"
    )
    pool = block_pool_run(requests, block_size=16, num_blocks=4096)
    print(
        "BlockPool   (vLLM V1, block_size=16, 4096 blocks): "
        f"prefix hit rate {pool['hit_rate']:.1%}, {pool['cached_blocks']} blocks cached, "
        f"{pool['failed']} admissions failed, {pool['us_per_request']:.1f} us/request"
    )
    radix = radix_run(requests, capacity_tokens=65_536)
    print(
        "RadixCache  (SGLang, page_size=1, 65536 tokens):   "
        f"prefix hit rate {radix['hit_rate']:.1%}, {radix['cached_tokens']} tokens cached, "
        f"{radix['evicted_tokens']} evicted, {radix['us_per_request']:.1f} us/request"
    )
    counting = counting_run(requests, block_size=16, num_blocks=4096)
    print(
        "Counting    (Vidur, block_size=16, 4096 blocks):   "
        f"{counting['admitted']} prompts admitted before the 1% watermark, "
        f"usage {counting['usage']:.1%}"
    )
