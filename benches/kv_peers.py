"""tokenyard's KV-cache structures against the peers they replace, in one process.

- ``RadixCache`` vs SGLang 0.5.23's ``RadixCache`` (``sglang.srt.mem_cache.radix_cache``).
- ``BlockPool`` vs vLLM 0.33.0's V1 ``KVCacheManager`` (and the ``BlockPool`` it owns).

Both sides get the same token stream (``kv_workload.py``), each in its native input
form, converted outside the timed region: numpy arrays for tokenyard, ``array('q')``
plus int64 tensors for SGLang, ``list[int]`` for vLLM. Each call is timed on its own
with ``perf_counter_ns``; the tables give median, p99 and max per operation, and
the work each side did (tokens inserted, matched, evicted, hit) to show both did
the same thing.

Garbage collection is part of what the peers cost: SGLang's radix tree and vLLM's
requests are Python object graphs the cyclic GC walks. Both servers ``gc.freeze()``
their start-up heap (vLLM's EngineCore after init, SGLang's HTTP server after
warm-up), so by default we do the same once a structure is built and time with the
collector enabled (what a deployment runs); then again under ``gc.disable()``, and
once more with nothing frozen (a plain process, where full collections also walk
every imported module's objects). See ``GC_SETTINGS``.

Run inside the bench venv (``bash benches/peers/setup.sh``):

    .venv-bench/bin/python benches/kv_peers.py --num-sequences 500
    .venv-bench/bin/python benches/kv_peers.py --json benches/out/kv_peers.json
    .venv-bench/bin/python benches/kv_peers.py --peers-only     # tokenyard not built
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import platform
import sys
import time
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from machine import cpu_model, loadavg

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE / "peers")]

import kv_workload  # noqa: E402

# Tokens asked of each evict() call: room for one long request, and the size the
# SGLang measurements in /work/shared/peers/NOTES.md used.
EVICT_CHUNK = 4096
BLOCK_SIZE = 16


# --- measurement ----------------------------------------------------------------------


@dataclass
class Stats:
    ops: int
    median_us: float
    p99_us: float
    max_us: float
    mean_us: float
    total_s: float

    @classmethod
    def of(cls, ns: list[int]) -> Stats | None:
        if not ns:
            return None
        a = np.asarray(ns, dtype=np.float64) / 1e3
        return cls(
            ops=len(a),
            median_us=float(np.median(a)),
            p99_us=float(np.percentile(a, 99)),
            max_us=float(a.max()),
            mean_us=float(a.mean()),
            total_s=float(a.sum() / 1e6),
        )


@dataclass
class Row:
    operation: str
    tokenyard: Stats | None
    peer: Stats | None
    peer_name: str


@dataclass
class Section:
    """One timed scenario: its rows plus the work both sides did, to show they match."""

    title: str
    notes: list[str]
    rows: list[Row] = field(default_factory=list)
    work: dict[str, dict[str, int]] = field(default_factory=dict)  # side -> counter -> n


# How the cyclic collector runs during a timed section (--gc):
GC_SETTINGS = {
    # What a deployment runs: collector on, start-up heap frozen (vLLM's EngineCore
    # freezes after init, SGLang's HTTP server after warm-up).
    "on": "gc on, start-up heap frozen",
    # Collector off for the section: the structure's cost without GC pauses.
    "off": "gc off",
    # A plain Python process that never froze: every full collection also walks
    # the imported torch/vLLM/SGLang object graph.
    "unfrozen": "gc on, nothing frozen",
}


@contextlib.contextmanager
def gc_mode(setting: str) -> Iterator[None]:
    """Run the timed block under one of ``GC_SETTINGS``, starting from a collected heap.

    Freezing moves everything built so far (imports, the workload, the freshly built
    structure) out of the collector's view; what the timed operations allocate stays
    visible to it.
    """
    gc.collect()
    if setting != "unfrozen":
        gc.freeze()
    was_enabled = gc.isenabled()
    if setting == "off":
        gc.disable()
    else:
        gc.enable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
        else:
            gc.disable()
        gc.unfreeze()
        gc.collect()


# --- RadixCache -------------------------------------------------------------------------

RadixTimings = tuple[dict[str, list[int]], dict[str, int]]


def page_aligned(seqs: list[np.ndarray], page_size: int) -> Iterator[np.ndarray]:
    """What a caller inserts: whole pages only (SGLang's ``_insert_cache`` cuts the
    key with ``page_aligned`` first; tokenyard's insert rejects a partial page).
    Lookups take the full sequence on both sides and round down themselves."""
    for s in seqs:
        yield s[: len(s) - len(s) % page_size]


def radix_tokenyard(seqs: list[np.ndarray], page_size: int, gc_setting: str) -> RadixTimings:
    from tokenyard.kv import RadixCache

    t: dict[str, list[int]] = {"insert": [], "match_prefix": [], "evict": []}
    work = {"inserted_tokens": 0, "already_cached": 0, "matched_tokens": 0, "evicted": 0}
    clock = time.perf_counter_ns
    cache = RadixCache(page_size=page_size)
    with gc_mode(gc_setting):
        next_slot = 0
        for s in page_aligned(seqs, page_size):
            values = np.arange(next_slot, next_slot + len(s), dtype=np.int64)
            next_slot += len(s)
            t0 = clock()
            cached = cache.insert(s, values)
            t1 = clock()
            t["insert"].append(t1 - t0)
            # A real caller would free values[:cached]; both sides just count them.
            work["already_cached"] += cached
            work["inserted_tokens"] += len(s)
        for s in seqs:
            t0 = clock()
            m = cache.match_prefix(s)
            n = len(m.values)
            t1 = clock()
            t["match_prefix"].append(t1 - t0)
            work["matched_tokens"] += n
        while cache.evictable_size > 0:
            t0 = clock()
            freed = cache.evict(EVICT_CHUNK)
            t1 = clock()
            t["evict"].append(t1 - t0)
            if len(freed) == 0:
                break
            work["evicted"] += len(freed)
    del cache
    return t, work


def radix_sglang(seqs: list[np.ndarray], page_size: int, gc_setting: str) -> RadixTimings:
    import sglang_peer
    import torch

    t: dict[str, list[int]] = {"insert": [], "match_prefix": [], "evict": []}
    work = {"inserted_tokens": 0, "already_cached": 0, "matched_tokens": 0, "evicted": 0}
    clock = time.perf_counter_ns
    cache = sglang_peer.make_radix_cache(page_size=page_size)
    insert, match, evict = sglang_peer.insert, sglang_peer.match_prefix, sglang_peer.evict

    def key_of(s: np.ndarray) -> array:
        return array("q", s.astype(np.int64).tobytes())

    with gc_mode(gc_setting):
        next_slot = 0
        for s in page_aligned(seqs, page_size):
            key = key_of(s)
            values = torch.arange(next_slot, next_slot + len(s), dtype=torch.int64)
            next_slot += len(s)
            t0 = clock()
            cached = insert(cache, key, values)
            t1 = clock()
            t["insert"].append(t1 - t0)
            work["already_cached"] += cached
            work["inserted_tokens"] += len(s)
        for s in seqs:
            key = key_of(s)
            t0 = clock()
            n, _indices, _node = match(cache, key)
            t1 = clock()
            t["match_prefix"].append(t1 - t0)
            work["matched_tokens"] += n
        while cache.evictable_size() > 0:
            t0 = clock()
            freed = evict(cache, EVICT_CHUNK)
            t1 = clock()
            t["evict"].append(t1 - t0)
            if freed == 0:
                break
            work["evicted"] += freed
    del cache
    return t, work


def radix_section(
    seqs: list[np.ndarray], page_size: int, gc_setting: str, peers_only: bool
) -> Section:
    gc_label = GC_SETTINGS[gc_setting]
    section = Section(
        title=f"RadixCache, page_size {page_size}, {gc_label}",
        notes=[
            "insert: every sequence cut to whole pages, values a fresh int64 range of KV slots",
            "match_prefix: every sequence after all inserts (full hits); the SGLang "
            "side includes reading the matched indices off the tree "
            "(path_device_indices), which tokenyard returns from match_prefix",
            f"evict: evict({EVICT_CHUNK}) until nothing is evictable",
            "peer: SGLang's pure-Python RadixCache (what its scheduler uses for the "
            "waiting-queue prefix check). SGLang 0.5.23 *serves* with UnifiedRadixCache, "
            "whose tree core defaults to a bundled Rust extension; not measured here",
        ],
    )
    ty = None if peers_only else radix_tokenyard(seqs, page_size, gc_setting)
    sg = radix_sglang(seqs, page_size, gc_setting)
    for op in ("insert", "match_prefix", "evict"):
        section.rows.append(
            Row(op, Stats.of(ty[0][op]) if ty else None, Stats.of(sg[0][op]), "SGLang")
        )
    if ty:
        section.work["tokenyard"] = ty[1]
    section.work["SGLang"] = sg[1]
    return section


# --- BlockPool / KVCacheManager ------------------------------------------------------------

PoolTimings = tuple[dict[str, list[int]], dict[str, int]]


def pool_tokenyard(seqs: list[np.ndarray], num_blocks: int, gc_setting: str) -> PoolTimings:
    from tokenyard.kv import BlockPool

    t: dict[str, list[int]] = {"lookup": [], "allocate+free": []}
    work = {"requests": 0, "hit_tokens": 0, "new_blocks": 0, "failed": 0}
    clock = time.perf_counter_ns
    # vLLM reserves one of its blocks as the null block; give both sides equal usable blocks.
    pool = BlockPool(num_blocks=num_blocks - 1, block_size=BLOCK_SIZE)
    with gc_mode(gc_setting):
        for i, s in enumerate(seqs):
            t0 = clock()
            hit = pool.get_computed_blocks(s)
            n = hit.num_computed_tokens
            t1 = clock()
            ids = pool.allocate_slots(i, len(s) - n, token_ids=s, new_computed_blocks=hit)
            pool.free(i)
            t2 = clock()
            t["lookup"].append(t1 - t0)
            t["allocate+free"].append(t2 - t1)
            work["requests"] += 1
            work["hit_tokens"] += n
            if ids is None:
                work["failed"] += 1
            else:
                work["new_blocks"] += len(ids)
    del pool
    return t, work


def pool_vllm(
    seqs: list[np.ndarray], num_blocks: int, gc_setting: str, hash_algo: str
) -> PoolTimings:
    from vllm_peer import VllmPeer

    t: dict[str, list[int]] = {"lookup": [], "allocate+free": []}
    work = {"requests": 0, "hit_tokens": 0, "new_blocks": 0, "failed": 0}
    clock = time.perf_counter_ns
    peer = VllmPeer(
        num_blocks=num_blocks,
        block_size=BLOCK_SIZE,
        max_model_len=max(len(s) for s in seqs) + BLOCK_SIZE,
        hash_algo=hash_algo,
    )
    with gc_mode(gc_setting):
        for i, s in enumerate(seqs):
            tokens = s.tolist()  # vLLM's prompt_token_ids are list[int]
            t0 = clock()
            request = peer.make_request(str(i), tokens)
            blocks, n = peer.get_computed_blocks(request)
            t1 = clock()
            new_blocks = peer.allocate_slots(request, len(tokens) - n, n, blocks)
            peer.free(request)
            t2 = clock()
            t["lookup"].append(t1 - t0)
            t["allocate+free"].append(t2 - t1)
            work["requests"] += 1
            work["hit_tokens"] += n
            if new_blocks is None:
                work["failed"] += 1
            else:
                work["new_blocks"] += len(new_blocks.blocks[0])
    del peer
    return t, work


def pool_section(
    seqs: list[np.ndarray],
    num_blocks: int,
    gc_setting: str,
    hash_algos: list[str],
    peers_only: bool,
) -> Section:
    gc_label = GC_SETTINGS[gc_setting]
    section = Section(
        title=f"BlockPool / KVCacheManager, block_size {BLOCK_SIZE}, "
        f"{num_blocks:,} blocks, {gc_label}",
        notes=[
            "per sequence: lookup = get_computed_blocks, then allocate_slots for the "
            "rest and free (the request finishes at once, its blocks stay cached)",
            "vLLM lookup includes constructing the Request, which computes its block "
            "hashes; tokenyard hashes inside get_computed_blocks",
            "vLLM's hash function is --prefix-caching-hash-algo (default sha256)",
        ],
    )
    ty = None if peers_only else pool_tokenyard(seqs, num_blocks, gc_setting)
    if ty:
        section.work["tokenyard"] = ty[1]
    for algo in hash_algos:
        v = pool_vllm(seqs, num_blocks, gc_setting, algo)
        name = f"vLLM {algo}"
        for op in ("lookup", "allocate+free"):
            section.rows.append(
                Row(
                    f"{op} [{algo}]",
                    Stats.of(ty[0][op]) if ty else None,
                    Stats.of(v[0][op]),
                    name,
                )
            )
        section.work[name] = v[1]
    return section


def pool_num_blocks(prompt_tokens: int, max_len: int) -> int:
    """Room for every shared prompt with 20% slack plus a few sequences in flight.

    Requests are freed as soon as they are allocated, so the pool is mostly cached
    blocks: the prompts stay hot and unique suffixes are evicted LRU as new
    requests need room. Allocation never fails at this size.
    """
    return math.ceil(1.2 * prompt_tokens / BLOCK_SIZE) + 4 * math.ceil(max_len / BLOCK_SIZE)


# --- environment + report -------------------------------------------------------------------


def environment(peers_only: bool) -> dict[str, str]:
    import torch

    env = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__,
    }
    try:
        import vllm

        env["vllm"] = vllm.__version__
    except Exception as e:
        env["vllm"] = f"unavailable ({e})"
    try:
        import sglang_peer

        env.update(sglang_peer.versions())
    except Exception as e:
        env["sglang"] = f"unavailable ({e})"
    if not peers_only:
        import tokenyard

        profile = getattr(tokenyard, "build_profile", "?")
        env["tokenyard"] = f"{tokenyard.__version__} ({profile} build)"
    env["cpus"] = str(len(os.sched_getaffinity(0)))
    env["cpu_model"] = cpu_model()
    # Other work on a small machine shows up in the tails; record how busy it was.
    env["loadavg_at_start"] = loadavg()
    env["platform"] = platform.platform()
    return env


def fmt(x: float | None, digits: int = 1) -> str:
    if x is None:
        return "—"
    if x >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def render(section: Section) -> str:
    out = [f"### {section.title}", ""]
    out += [f"- {n}" for n in section.notes]
    out += [
        "",
        "| operation | tokenyard median µs | peer median µs | ratio (peer/tokenyard) "
        "| tokenyard p99 µs | peer p99 µs | tokenyard max µs | peer max µs "
        "| ops (tokenyard / peer) | peer |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in section.rows:
        ty, pe = r.tokenyard, r.peer
        ratio = f"{pe.median_us / ty.median_us:.1f}x" if ty and pe and ty.median_us > 0 else "—"
        ops = f"{ty.ops if ty else '—'} / {pe.ops if pe else '—'}"
        out.append(
            f"| {r.operation} | {fmt(ty and ty.median_us, 2)} | {fmt(pe and pe.median_us, 2)} "
            f"| {ratio} | {fmt(ty and ty.p99_us)} | {fmt(pe and pe.p99_us)} "
            f"| {fmt(ty and ty.max_us)} | {fmt(pe and pe.max_us)} | {ops} | {r.peer_name} |"
        )
    out += [
        "",
        "(max and p99 carry any GC pause or scheduler hiccup; medians do not)",
        "",
        "Work done (same stream, so these should agree):",
        "",
    ]
    for side, counters in section.work.items():
        out.append(f"- {side}: " + ", ".join(f"{k} {v:,}" for k, v in counters.items()))
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(
        description="tokenyard vs SGLang RadixCache and vLLM KVCacheManager, same stream."
    )
    parser.add_argument("--num-sequences", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write all numbers here")
    parser.add_argument("--peers-only", action="store_true", help="skip tokenyard")
    parser.add_argument(
        "--page-sizes", default="1,16", help="RadixCache page sizes (comma list; '' skips)"
    )
    parser.add_argument(
        "--hash-algos",
        default="sha256,sha256_cbor,xxhash,xxhash_cbor",
        help="vLLM prefix-caching hashes to run (comma list; '' skips the pool)",
    )
    parser.add_argument(
        "--gc",
        default="on,off,unfrozen",
        help="collector settings to run, comma list of: "
        + "; ".join(f"{k} = {v}" for k, v in GC_SETTINGS.items()),
    )
    args = parser.parse_args()

    if not args.peers_only:
        try:
            import tokenyard.kv  # noqa: F401
        except ImportError as e:
            print(
                f"tokenyard is not importable ({e}).\n"
                "Build it into the bench venv with `bash benches/peers/setup.sh`, "
                "or pass --peers-only.",
                file=sys.stderr,
            )
            return 2

    env = environment(args.peers_only)
    seqs, prompt_index, prompt_len = kv_workload.make_workload(args.num_sequences, seed=args.seed)
    used = dict(zip(prompt_index, prompt_len, strict=True))
    prompt_tokens = sum(used.values())
    total_tokens = sum(len(s) for s in seqs)
    num_blocks = pool_num_blocks(prompt_tokens, max(len(s) for s in seqs))

    print("## KV-cache structures: tokenyard vs peers\n")
    for k, v in env.items():
        print(f"- {k}: {v}")
    print(
        f"- stream: {len(seqs):,} sequences, {total_tokens:,} tokens "
        f"(lengths {min(len(s) for s in seqs)}-{max(len(s) for s in seqs)}), "
        f"{len(used)} shared prompts totalling {prompt_tokens:,} tokens, seed {args.seed}"
    )
    print("- times are per call, perf_counter_ns, in µs; ratio > 1 means tokenyard is faster")
    print(
        "- gc: heap collected before each section; 'start-up heap frozen' mirrors both "
        "servers' gc.freeze() after start-up, 'gc off' is gc.disable() for the section"
    )
    print()

    gc_settings = [g.strip() for g in args.gc.split(",") if g.strip()]
    if unknown := set(gc_settings) - set(GC_SETTINGS):
        parser.error(f"unknown --gc setting(s): {', '.join(sorted(unknown))}")
    page_sizes = [int(p) for p in args.page_sizes.split(",") if p.strip()]
    hash_algos = [h.strip() for h in args.hash_algos.split(",") if h.strip()]

    sections: list[Section] = []
    jobs: list[Callable[[], Section]] = []
    for gc_setting in gc_settings:
        for ps in page_sizes:
            jobs.append(lambda ps=ps, g=gc_setting: radix_section(seqs, ps, g, args.peers_only))
        if hash_algos:
            jobs.append(
                lambda g=gc_setting: pool_section(seqs, num_blocks, g, hash_algos, args.peers_only)
            )
    for job in jobs:
        started = time.perf_counter()
        section = job()
        sections.append(section)
        print(render(section))
        print(f"\n(section took {time.perf_counter() - started:.1f} s)\n", flush=True)

    env["loadavg_at_end"] = loadavg()
    print(f"- loadavg at end: {env['loadavg_at_end']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "environment": env,
            "workload": {
                "num_sequences": len(seqs),
                "total_tokens": total_tokens,
                "num_prompts_used": len(used),
                "prompt_tokens": prompt_tokens,
                "seed": args.seed,
                "evict_chunk": EVICT_CHUNK,
                "block_size": BLOCK_SIZE,
                "num_blocks": num_blocks,
            },
            "sections": [
                {
                    "title": s.title,
                    "notes": s.notes,
                    "work": s.work,
                    "rows": [
                        {
                            "operation": r.operation,
                            "peer_name": r.peer_name,
                            "tokenyard": r.tokenyard and vars(r.tokenyard),
                            "peer": r.peer and vars(r.peer),
                        }
                        for r in s.rows
                    ],
                }
                for s in sections
            ],
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
