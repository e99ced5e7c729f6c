"""Differential check of ``tokenyard.kv.KvCoordinator`` against vLLM 0.33's own
``KVCacheManager`` (its ``HybridKVCacheCoordinator`` / ``UnitaryKVCacheCoordinator`` over
single-type managers) on random operation streams.

Each stream builds both sides with the same groups (full attention, sliding windows,
chunked local attention; one block size), pool size and caching flag, then applies the
same operations the way vLLM's scheduler drives its manager: admit a request (build a
``Request``, ``get_computed_blocks``, ``allocate_slots`` for a prefill chunk with the hit),
continue a prefill chunk, a decode step (one sampled token appended, ``allocate_slots``
for 1), and ``free``. After every operation both must agree on the hit (length and block
ids per group), the allocation's answer (``None`` or the new block ids per group), every
live request's block table per group (vLLM's null block is block 0, as ours) and the free
queue's order. A stream agrees when every step does; the first differing step is printed.

    bash benches/peers/setup.sh    # once: .venv-bench with vLLM 0.33.0
    PYTHONPATH=python .venv-bench/bin/python benches/peers/vllm_coordinator_diff.py \\
        [--streams 300] [--steps 80] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import vllm_peer  # noqa: F401  (sets vLLM's environment before it is imported)
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request

from tokenyard import kv

MAX_MODEL_LEN = 4096


def vllm_spec(kind: str, size: int, block_size: int) -> Any:
    common = {"block_size": block_size, "num_kv_heads": 1, "head_size": 1, "dtype": torch.float16}
    if kind == "full":
        return FullAttentionSpec(**common)
    if kind == "window":
        return SlidingWindowSpec(**common, sliding_window=size)
    return ChunkedLocalAttentionSpec(**common, attention_chunk_size=size)


def our_spec(kind: str, size: int) -> Any:
    if kind == "full":
        return kv.FullAttentionSpec()
    if kind == "window":
        return kv.SlidingWindowSpec(sliding_window=size)
    return kv.ChunkedLocalAttentionSpec(attention_chunk_size=size)


class Stream:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.block_size = rng.choice([1, 2, 4, 16])
        bs = self.block_size
        kinds = [("full", 0)]
        for _ in range(rng.randint(0, 2)):
            if rng.random() < 0.7:
                kinds.append(("window", rng.choice([bs, 2 * bs, 2 * bs + 1, 3 * bs - 1, 128])))
            else:
                kinds.append(("local", bs * rng.randint(1, 4)))
        if rng.random() < 0.15:
            kinds = kinds[1:] or [("window", 2 * bs)]
        self.kinds = kinds
        self.num_blocks = rng.randint(4, 48)
        self.caching = rng.random() < 0.85
        hash_fn = get_hash_fn_by_name("sha256")
        kv_cache_utils.init_none_hash(hash_fn)
        self.hasher = kv_cache_utils.get_request_block_hasher(bs, hash_fn)
        groups = [
            KVCacheGroupSpec([f"layers.{i}.attn"], vllm_spec(k, s, bs))
            for i, (k, s) in enumerate(kinds)
        ]
        config = KVCacheConfig(
            num_blocks=self.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups
        )
        self.vllm = KVCacheManager(
            kv_cache_config=config,
            max_model_len=MAX_MODEL_LEN,
            scheduler_block_size=bs,
            hash_block_size=bs,
            enable_caching=self.caching,
        )
        self.ours = kv.KvCoordinator(
            groups=[our_spec(k, s) for k, s in kinds],
            num_blocks=self.num_blocks,
            block_size=bs,
            enable_caching=self.caching,
        )
        self.params = SamplingParams(max_tokens=1)
        self.requests: dict[str, Request] = {}
        self.prompt_left: dict[str, int] = {}
        self.next_id = 0
        self.prefixes = [[rng.randrange(50) for _ in range(rng.randint(1, 60))] for _ in range(3)]

    def describe(self) -> str:
        return (
            f"groups={self.kinds} block_size={self.block_size} "
            f"num_blocks={self.num_blocks} caching={self.caching}"
        )

    def state(self) -> tuple[Any, ...]:
        vllm_tables = {
            rid: [list(b.block_id for b in g) for g in self.vllm.coordinator.get_blocks(rid)]
            for rid in self.requests
        }
        our_tables = {rid: [t.tolist() for t in self.ours.block_ids(rid)] for rid in self.requests}
        queue = self.vllm.block_pool.free_block_queue
        vllm_free = [b.block_id for b in queue.get_all_free_blocks()]
        return vllm_tables, our_tables, vllm_free, self.ours.free_block_ids().tolist()

    def step(self) -> tuple[str, Any, Any]:
        rng = self.rng
        running = list(self.requests)
        choice = rng.random()
        if not running or choice < 0.3:
            rid = f"r{self.next_id}"
            self.next_id += 1
            prompt = list(rng.choice(self.prefixes)) + [
                rng.randrange(50) for _ in range(rng.randint(1, 40))
            ]
            req = Request(
                request_id=rid,
                prompt_token_ids=prompt,
                sampling_params=self.params,
                pooling_params=None,
                block_hasher=self.hasher,
            )
            blocks, hit_len, _ = self.vllm.get_computed_blocks(req)
            hit = self.ours.get_computed_blocks(prompt)
            vllm_hit = (hit_len, [[b.block_id for b in g] for g in blocks.blocks])
            our_hit = (hit.num_computed_tokens, [t.tolist() for t in hit.block_ids])
            if vllm_hit != our_hit:
                return f"admit {rid} lookup", vllm_hit, our_hit
            n = min(len(prompt) - hit_len, rng.randint(1, 48))
            got = self.vllm.allocate_slots(req, n, hit_len, blocks)
            mine = self.ours.allocate_slots(rid, n, token_ids=prompt, new_computed_blocks=hit)
            if got is not None:
                req.num_computed_tokens = hit_len + n
                self.requests[rid] = req
                self.prompt_left[rid] = len(prompt) - hit_len - n
            label = f"admit {rid} ({len(prompt)} tokens, hit {hit_len}, {n} new)"
            return self.compare_alloc(label, got, mine)
        rid = rng.choice(running)
        req = self.requests[rid]
        if choice < 0.45:
            self.vllm.free(req)
            self.ours.free(rid)
            del self.requests[rid]
            return f"free {rid}", None, None
        if self.prompt_left[rid] > 0:
            n = min(self.prompt_left[rid], rng.randint(1, 48))
            got = self.vllm.allocate_slots(req, n)
            mine = self.ours.allocate_slots(rid, n)
            if got is not None:
                req.num_computed_tokens += n
                self.prompt_left[rid] -= n
            return self.compare_alloc(f"chunk {rid} ({n})", got, mine)
        token = rng.randrange(50)
        if req.num_computed_tokens == req.num_tokens:
            req.append_output_token_ids(token)
            pending = [token]
        else:
            pending = []
        got = self.vllm.allocate_slots(req, 1)
        mine = self.ours.allocate_slots(rid, 1, token_ids=pending)
        if got is not None:
            req.num_computed_tokens += 1
        elif pending:
            # Neither side took the step: the token stays known to vLLM's request, so give
            # it to ours without computing (a later step computes it).
            self.ours.cache_blocks(rid, pending)
        return self.compare_alloc(f"decode {rid}", got, mine)

    @staticmethod
    def compare_alloc(label: str, got: Any, mine: Any) -> tuple[str, Any, Any]:
        a = None if got is None else [[b.block_id for b in g] for g in got.blocks]
        b = None if mine is None else [t.tolist() for t in mine]
        return label, a, b


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, default=300)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show", type=int, default=3)
    args = parser.parse_args()
    agreed = steps = 0
    shown = 0
    for s in range(args.streams):
        stream = Stream(random.Random(args.seed * 100_003 + s))
        ok = True
        for i in range(args.steps):
            label, a, b = stream.step()
            steps += 1
            vt, ot, vf, of = stream.state()
            if a != b or vt != ot or vf != of:
                ok = False
                if shown < args.show:
                    shown += 1
                    print(f"stream {s} ({stream.describe()}) differs at step {i}: {label}")
                    if a != b:
                        print(f"  vLLM: {a}\n  ours: {b}")
                    if vt != ot:
                        print(f"  tables vLLM: {vt}\n  tables ours: {ot}")
                    if vf != of:
                        print(f"  free vLLM: {vf}\n  free ours: {of}")
                break
        agreed += ok
    import vllm

    print(
        f"vLLM {vllm.__version__}: {agreed}/{args.streams} streams agree at every step "
        f"({steps} steps run, {args.steps} per stream at most)"
    )


if __name__ == "__main__":
    main()
