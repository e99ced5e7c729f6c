"""Differential fuzz of tokenyard's vLLM adapter against vLLM 0.33's ``Scheduler`` over KV
cache groups with different block sizes (the layouts vLLM's hybrid manager gives a model whose
layer kinds have different page sizes, e.g. Gemma 4: ``unify_kv_cache_spec_page_size`` grows
the block of the layers with smaller pages).

Both sides are built as vLLM's engine builds its scheduler: ``block_size`` the scheduler block
size (the lcm of the groups'), ``hash_block_size`` the gcd of the prefix-cacheable groups'
(``resolve_kv_cache_block_sizes``) or ``--prefix-match-unit``, requests hashed at it. The
scenarios are ``vllm_adapter_diff.py``'s (arrivals with shared prefixes, aborts, EOS and stop
ids, the prefill cadence, a cache below ``max_model_len`` in some, n-gram speculative
decoding with up to 4 drafts). ``--eagle lookahead`` or ``drop`` turns every scenario into an
EAGLE/EAGLE3 one with prefix caching (``vllm_adapter_diff.eagle_scenario``: vLLM's look-ahead
block hashes, or its trailing-block drop); ``--eagle-groups`` sets ``is_eagle_group`` on vLLM's
groups as a drafter's layers would (``kv_cache_planning``: a group is flagged when it holds a
draft layer): ``none`` (vLLM's coordinator then drops in every group), ``all``, ``full`` or
``window`` (the groups of that kind), or group indices (``0,2``); the adapter reads the flags
from the same ``KVCacheConfig``, and the drop acts only in the flagged groups
(``KVCacheCoordinator.drop_eagle_group_ids``); ``--long-steps`` gives every scenario ``k`` of 17 to
40 drafts, so one speculative step's slots exceed the hash block (vLLM's
``_spec_decode_step_blocks`` counts them per group). Every step's ``SchedulerOutput`` (scheduled
tokens, block ids per group, computed tokens of new requests: the prefix hits),
``EngineCoreOutputs`` (finishes) and the request state (KV usage, prefix-cache stats) are
compared. Layouts (``--layout``):

- ``gemma``: full attention in blocks of 32 beside a sliding window (64 tokens) in blocks of
  16 (Gemma 4's global layers have the larger page);
- ``three``: full attention in blocks of 64, a window of 48 in blocks of 16 and one of 100 in
  blocks of 32;
- ``gptoss`` and ``windows``: one block size (16), full attention beside a window of 128
  (gpt-oss's layout), or beside windows of 32 and 80;
- ``mambanone16``, ``mambanone64`` and ``mambanone128``: full attention in blocks of 16 beside
  a ``none``-mode ``MambaSpec`` in blocks of 16, 64 or 128 (``num_speculative_blocks`` the
  scenario's draft count), prefix caching off (vLLM's ``MambaManager`` asserts it in that
  mode; ``--eagle`` is refused with these). The scenarios' ``max_model_len`` is 128, 256 or
  512, so the block is shorter than it (vLLM's manager then holds a slot per block, all but
  the last state's nulled) but for 128 where ``max_model_len`` is 128 (one block covers the
  request);
- ``mambaalign16``, ``mambaalignwin`` and ``mambaalign32``: a Mamba ``align`` group (the split
  on, on the Mamba block) in blocks of 16 beside full attention in blocks of 32; in blocks of
  32 beside full attention in 16 and a window of 64 in 32 (the window keeps vLLM's partial
  hash hits off, so hits land on 32); in blocks of 32 beside full attention in 16, prefix
  caching off (with it vLLM turns partial hash hits on, refused by name);
- ``chunk`` and ``chunk16``: chunked local attention (chunks of 64) in blocks of 32 beside
  full attention in 16, and in blocks of 16 beside full attention in 32, prefix caching off
  (vLLM's chunked manager asserts its block is the hit alignment at its first lookup).

Prints how many scenarios agree at every step and the first differing step of the first that
does not.

    PYTHONPATH=python .venv-bench/bin/python benches/peers/vllm_block_sizes_diff.py \\
        [--layout gemma|three|gptoss|windows|mambanone64|...] [--mode sync|async] \\
        [--scenarios 200] \\
        [--eagle off|lookahead|drop] [--eagle-groups none|all|full|window|0,2] [--long-steps]
"""

from __future__ import annotations

import argparse
import logging
import math
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: Per layout: (kind, block size, sliding window) of each group.
LAYOUTS: dict[str, list[tuple[str, int, int]]] = {
    "gemma": [("full", 32, 0), ("window", 16, 64)],
    "three": [("full", 64, 0), ("window", 16, 48), ("window", 32, 100)],
    # One block size (the hybrid layouts of one page size, for EAGLE's per-group drop).
    "gptoss": [("full", 16, 0), ("window", 16, 128)],
    "windows": [("full", 16, 0), ("window", 16, 32), ("window", 16, 80)],
    # A `none`-mode Mamba group (prefix caching off), one block size or a larger block.
    "mambanone16": [("full", 16, 0), ("mambanone", 16, 0)],
    "mambanone64": [("full", 16, 0), ("mambanone", 64, 0)],
    "mambanone128": [("full", 16, 0), ("mambanone", 128, 0)],
    # A Mamba `align` group (no prefill checkpoint block) beside differing sizes: on the hash
    # block (hits on the scheduler block of 32), beside a window whose manager keeps vLLM's
    # partial hash hits off, or larger than the hash block without prefix caching.
    "mambaalign16": [("full", 32, 0), ("mambaalign", 16, 0)],
    "mambaalignwin": [("full", 16, 0), ("window", 32, 64), ("mambaalign", 32, 0)],
    "mambaalign32": [("full", 16, 0), ("mambaalign", 32, 0)],
    # Chunked local attention (chunks of 64) beside differing sizes: on the scheduler block
    # size, or a finer block without prefix caching.
    "chunk": [("full", 16, 0), ("chunk", 32, 64)],
    "chunk16": [("full", 32, 0), ("chunk", 16, 64)],
}

#: Layouts vLLM 0.33 serves only without prefix caching (a none-mode Mamba group asserts it;
#: a Mamba align block over the hash block turns on partial hash hits; a chunked local block
#: off the scheduler block size fails vLLM's first lookup).
UNCACHED = {"mambanone16", "mambanone64", "mambanone128", "mambaalign32", "chunk16"}


def has_plain_mamba(layout: str) -> bool:
    """Whether ``layout``'s scenarios run uncached (``UNCACHED``)."""
    return layout in UNCACHED


def mamba_align_spec(block_size: int, num_speculative_blocks: int) -> Any:
    """vLLM 0.33's ``MambaSpec`` in ``align`` mode over blocks of ``block_size`` (no prefill
    checkpoint block)."""
    import torch
    from vllm.v1.kv_cache_interface import MambaSpec

    return MambaSpec(
        block_size=block_size,
        shapes=((1, 1),),
        dtypes=(torch.float32,),
        mamba_cache_mode="align",
        num_speculative_blocks=num_speculative_blocks,
    )


def mamba_none_spec(block_size: int, num_speculative_blocks: int) -> Any:
    """vLLM 0.33's ``MambaSpec`` in ``none`` mode over blocks of ``block_size``."""
    import torch
    from vllm.v1.kv_cache_interface import MambaSpec

    return MambaSpec(
        block_size=block_size,
        shapes=((1, 1),),
        dtypes=(torch.float32,),
        mamba_cache_mode="none",
        num_speculative_blocks=num_speculative_blocks,
    )


def eagle_flags(layout: str, which: str) -> list[bool]:
    """Each group's ``is_eagle_group`` in ``layout`` for ``--eagle-groups which``: ``none``,
    ``all``, the groups of kind ``full`` or ``window``, or comma-separated group indices.

    Raises:
        ValueError: naming ``--eagle-groups`` for another word or an index out of range.
    """
    kinds = [kind for kind, _, _ in LAYOUTS[layout]]
    if which in ("none", "all"):
        return [which == "all"] * len(kinds)
    if which in ("full", "window"):
        return [kind == which for kind in kinds]
    try:
        picked = {int(i) for i in which.split(",")}
    except ValueError:
        picked = {-1}
    if not picked <= set(range(len(kinds))):
        raise ValueError(
            f"--eagle-groups {which!r}: expected none, all, full, window or group indices "
            f"below {len(kinds)} ({layout})"
        )
    return [i in picked for i in range(len(kinds))]


def install(
    layout: str, prefix_match_unit: int | None, eagle_groups: str = "none"
) -> tuple[int, int]:
    """Makes ``vllm_peer.VllmSchedulerPeer`` build both schedulers over ``layout`` with vLLM's
    two block sizes and the groups ``eagle_groups`` flags (``eagle_flags``), and hash its
    requests at the hash block size. Returns them."""
    import torch
    import vllm_peer
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        SlidingWindowSpec,
    )

    groups_spec = LAYOUTS[layout]
    sizes = [bs for _, bs, _ in groups_spec]
    scheduler_block_size = math.lcm(*sizes)
    hash_block_size = prefix_match_unit or math.gcd(*sizes)
    flags = eagle_flags(layout, eagle_groups)

    def layout_build(self: Any, cls: type, kv_cache_config: Any, **kw: Any) -> Any:
        from vllm.v1.structured_output import StructuredOutputManager

        groups = []
        k = self.vllm_config.num_speculative_tokens or 0
        for i, (kind, bs, window) in enumerate(groups_spec):
            common = {"block_size": bs, "num_kv_heads": 1, "head_size": 1, "dtype": torch.float16}
            if kind == "mambanone":
                spec = mamba_none_spec(bs, k)
            elif kind == "mambaalign":
                spec = mamba_align_spec(bs, k)
                # vLLM's engine turns the split on from the cache config, on the Mamba
                # block (`Scheduler._mamba_block_aligned_split` reads cache_config.block_size).
                self.vllm_config.cache_config.mamba_cache_mode = "align"
                self.vllm_config.cache_config.block_size = bs
            elif kind == "chunk":
                spec = ChunkedLocalAttentionSpec(attention_chunk_size=window, **common)
            elif kind == "full":
                spec = FullAttentionSpec(**common)
            else:
                spec = SlidingWindowSpec(sliding_window=window, **common)
            groups.append(KVCacheGroupSpec([f"layers.{i}"], spec, is_eagle_group=flags[i]))
        config = KVCacheConfig(
            num_blocks=kv_cache_config.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups
        )
        caching = self.vllm_config.cache_config.enable_prefix_caching
        # vLLM's engine picks AsyncScheduler when async scheduling is on, and its window
        # groups' admission cap counts two batches in flight then (max_concurrent_batches).
        self.vllm_config.scheduler_config.async_scheduling = "Async" in cls.__name__
        return cls(
            vllm_config=self.vllm_config,
            kv_cache_config=config,
            structured_output_manager=StructuredOutputManager(self.vllm_config),
            block_size=scheduler_block_size,
            # resolve_kv_cache_block_sizes: no hashing finer than the scheduler's without
            # prefix caching (or a connector).
            hash_block_size=hash_block_size if caching else scheduler_block_size,
            log_stats=kw.get("log_stats", True),
        )

    init = vllm_peer.VllmSchedulerPeer.__init__

    def layout_init(self: Any, *args: Any, **kw: Any) -> None:
        init(self, *args, **kw)
        if self._block_hasher is not None:
            hash_fn = get_hash_fn_by_name(self.vllm_config.cache_config.prefix_caching_hash_algo)
            self._block_hasher = kv_cache_utils.get_request_block_hasher(
                hash_block_size, hash_fn, self.vllm_config.num_hash_lookahead_tokens
            )

    vllm_peer.VllmSchedulerPeer.build = layout_build  # type: ignore[method-assign]
    vllm_peer.VllmSchedulerPeer.__init__ = layout_init  # type: ignore[method-assign]
    return scheduler_block_size, hash_block_size


def long_steps(scenario: Any, seed: int, steps: int) -> None:
    """Gives ``scenario`` ``k`` of 17 to 40 drafts (n-gram unless an EAGLE drafter is set),
    and prompts that repeat so the n-gram proposer finds drafts."""
    from vllm_sched_diff import _spec_prompts

    c = scenario.config
    rng = random.Random(f"{seed}/long-steps")
    if not c.num_speculative_tokens:
        c.draft_accept_rate = rng.choice([0.0, 0.5, 0.8, 1.0])
        _spec_prompts(rng, seed, scenario.arrivals, steps, c.max_model_len)
    c.num_speculative_tokens = rng.randrange(17, 41)
    # vLLM refuses a budget that cannot hold one request's drafts, and asserts when a long
    # prefill threshold cuts a padded decode (`pad_spec_decode` in `Scheduler.schedule`).
    c.max_num_batched_tokens = max(c.max_num_batched_tokens, c.num_speculative_tokens + 2)
    if c.long_prefill_token_threshold:
        c.long_prefill_token_threshold = max(
            c.long_prefill_token_threshold, c.num_speculative_tokens + 1
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="gemma")
    parser.add_argument("--mode", choices=["sync", "async"], default="sync")
    parser.add_argument("--scenarios", type=int, default=200)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--prefix-match-unit", type=int, default=None)
    parser.add_argument("--eagle", choices=["off", "lookahead", "drop"], default="off")
    parser.add_argument("--eagle-groups", default="none")
    parser.add_argument("--long-steps", action="store_true")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    try:
        flags = eagle_flags(args.layout, args.eagle_groups)
    except ValueError as err:
        parser.error(str(err))
    plain_mamba = has_plain_mamba(args.layout)
    if plain_mamba and args.eagle != "off":
        parser.error(f"--eagle {args.eagle}: {args.layout} runs without prefix caching")
    scheduler_bs, hash_bs = install(args.layout, args.prefix_match_unit, args.eagle_groups)
    import vllm_adapter_diff

    agree = ran = caching = agree_caching = spec = agree_spec = 0
    first: tuple[int, int, str] | None = None
    for seed in range(args.first_seed, args.first_seed + args.scenarios):
        scenario = vllm_adapter_diff.draw(seed, args.steps, args.eagle)
        if args.long_steps:
            long_steps(scenario, seed, args.steps)
        if plain_mamba:
            scenario.config.enable_prefix_caching = False
        ran += 1
        k = scenario.config.num_speculative_tokens
        spec += k > 0
        caching += scenario.config.enable_prefix_caching
        try:
            diff = vllm_adapter_diff.run_scenario(scenario, args.steps, args.mode == "async")
        except Exception as err:  # a crash on either side is a difference
            diff = (-1, f"raised {type(err).__name__}: {err}")
        if diff is None:
            agree += 1
            agree_spec += k > 0
            agree_caching += scenario.config.enable_prefix_caching
        elif first is None:
            first = (seed, *diff)
    extra = "".join(
        [
            f", EAGLE {args.eagle}" if args.eagle != "off" else "",
            f", is_eagle_group {flags}" if any(flags) else "",
            ", k 17-40" * args.long_steps,
        ]
    )
    sizes = [bs for _, bs, _ in LAYOUTS[args.layout]]
    print(
        f"{args.layout} ({args.mode}{extra}, block sizes {sizes}, "
        f"scheduler {scheduler_bs}, hash {hash_bs}): {agree}/{ran} scenarios agree at every "
        f"step, {agree_caching}/{caching} with prefix caching, {agree_spec}/{spec} with "
        "speculative decoding"
    )
    if first is not None:
        print(f"  first difference: seed {first[0]} step {first[1]}: {first[2][:400]}")
    return 0 if agree == ran else 1


if __name__ == "__main__":
    sys.exit(main())
