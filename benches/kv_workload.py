"""Deterministic token streams for the KV-cache benchmarks.

The stream models a serving workload with shared system prompts: every sequence
is one of ``num_prompts`` shared prompts followed by a suffix of its own, with a
total length uniform in ``[min_len, max_len]``. Shared prompts are what make
prefix caching pay off, and their reuse is what a radix tree or a block-hash
pool must find.

Shape of the draw (all from one seeded ``numpy.random.Generator``):

- prompt lengths are uniform in ``[min_len // 2, max_len // 2]``, and the
  shortest is pinned to ``min_len // 2`` so every total length has a prompt
  that fits;
- each sequence draws its total length ``L``, then a prompt uniformly among
  those no longer than ``L - min_len // 2`` (so every suffix has at least
  ``min_len // 2`` fresh tokens), then the suffix tokens.

Short totals can only use short prompts, so short prompts are more popular than
long ones -- a mild skew, as in real traffic. Sequences are drawn one after the
other from the same generator, so the first ``n`` sequences are the same
whatever ``num_sequences`` is: a quick run is a prefix of the full one.

    python benches/kv_workload.py --num-sequences 500    # print the stream's shape
"""

from __future__ import annotations

import argparse

import numpy as np

VOCAB_SIZE = 32_000


def make_prompts(
    num_prompts: int, min_len: int, max_len: int, rng: np.random.Generator
) -> list[np.ndarray]:
    lo, hi = min_len // 2, max_len // 2
    lengths = rng.integers(lo, hi, size=num_prompts, endpoint=True)
    lengths[0] = lo
    return [rng.integers(0, VOCAB_SIZE, size=n, dtype=np.int32) for n in lengths]


def make_workload(
    num_sequences: int = 10_000,
    num_prompts: int = 200,
    min_len: int = 512,
    max_len: int = 4096,
    seed: int = 0,
) -> tuple[list[np.ndarray], list[int], list[int]]:
    """``(sequences, prompt_index, prompt_len)`` for each sequence of the stream."""
    if not 2 <= min_len <= max_len:
        raise ValueError(f"need 2 <= min_len <= max_len, got {min_len}, {max_len}")
    rng = np.random.default_rng(seed)
    prompts = make_prompts(num_prompts, min_len, max_len, rng)
    # Prompts sorted by length: the ones that fit a total L are a prefix of this order.
    order = sorted(range(num_prompts), key=lambda i: len(prompts[i]))
    sorted_lens = np.array([len(prompts[i]) for i in order])
    min_suffix = min_len // 2

    sequences, prompt_index, prompt_len = [], [], []
    for _ in range(num_sequences):
        total = int(rng.integers(min_len, max_len, endpoint=True))
        fitting = int(np.searchsorted(sorted_lens, total - min_suffix, side="right"))
        p = order[int(rng.integers(fitting))]
        suffix = rng.integers(0, VOCAB_SIZE, size=total - len(prompts[p]), dtype=np.int32)
        sequences.append(np.concatenate([prompts[p], suffix]))
        prompt_index.append(p)
        prompt_len.append(len(prompts[p]))
    return sequences, prompt_index, prompt_len


def make_sequences(
    num_sequences: int = 10_000,
    num_prompts: int = 200,
    min_len: int = 512,
    max_len: int = 4096,
    seed: int = 0,
) -> list[np.ndarray]:
    """``num_sequences`` int32 token arrays; see the module docstring for the shape."""
    return make_workload(num_sequences, num_prompts, min_len, max_len, seed)[0]


def describe(**workload_args) -> dict[str, float]:
    """Size and sharing of a stream. ``reusable_fraction`` is the share of tokens a
    cache that never evicts would already hold when each sequence arrives: the
    prompt, from its second use on (random suffixes practically never collide)."""
    seqs, prompt_index, prompt_len = make_workload(**workload_args)
    total = sum(len(s) for s in seqs)
    seen: set[int] = set()
    reusable = 0
    for p, n in zip(prompt_index, prompt_len, strict=True):
        if p in seen:
            reusable += n
        seen.add(p)
    return {
        "sequences": len(seqs),
        "tokens": total,
        "mean_len": total / max(len(seqs), 1),
        "prompts_used": len(seen),
        "prompt_tokens": sum(prompt_len[prompt_index.index(p)] for p in seen),
        "reusable_fraction": reusable / max(total, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-sequences", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for k, v in describe(num_sequences=args.num_sequences, seed=args.seed).items():
        print(f"{k}: {v:,.3f}" if isinstance(v, float) else f"{k}: {v:,}")


if __name__ == "__main__":
    main()
