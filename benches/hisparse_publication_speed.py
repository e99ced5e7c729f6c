"""Speed of the core's HiSparse host publication (``tokenyard._core.HiSparseHostPublication``)
against the pure-Python reference model (``tests/hisparse_publication_model.py``) on the
same recorded operation streams (admissions with shared prefixes, chunks, decodes,
acknowledgements, finishes, preemptions). Prints the median seconds of each over
``--repeat`` replays and their ratio. Both sides answer identically (asserted).

    PYTHONPATH=python .venv/bin/python benches/hisparse_publication_speed.py
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from hisparse_publication_model import HostPublication

from tokenyard._core import HiSparseHostPublication

BLOCK_SIZE = 16
MAX_MODEL_LEN = 128


def record(seed: int, num_blocks: int, operations: int) -> list[tuple[Any, ...]]:
    """A stream of operations valid for the pool, recorded on the model."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1000) for _ in range(64)] for _ in range(4)]
    model = HostPublication(num_blocks, BLOCK_SIZE)
    ops: list[tuple[Any, ...]] = []
    planned: list[int] = []
    next_id = 0
    for _ in range(operations):
        before = set(model.transfers)
        op = rng.random()
        live = sorted(model.requests)
        if op < 0.3 or not live:
            prefix = rng.choice(prefixes)[: rng.choice([0, 16, 32, 48, 64])]
            tokens = prefix + [rng.randrange(1000, 5000) for _ in range(rng.randrange(1, 60))]
            entry: tuple[Any, ...] = ("admit", f"r{next_id}", tokens, rng.choice([None, 16, 40]))
            next_id += 1
        elif op < 0.5:
            request_id = rng.choice(live)
            request = model.requests[request_id]
            if request.computed < len(request.tokens):
                entry = ("step", request_id, rng.choice([8, 16, 40]))
            elif request.computed < MAX_MODEL_LEN - 1:
                entry = ("decode", request_id, rng.randrange(1000, 5000))
            else:
                entry = ("free", request_id, True)
        elif op < 0.8 and planned:
            done = sorted(rng.sample(planned, rng.randrange(1, len(planned) + 1)))
            planned = [t for t in planned if t not in done]
            entry = ("ack", done)
        else:
            entry = ("free", rng.choice(live), rng.random() < 0.7)
        apply_model(model, entry)
        planned.extend(sorted(set(model.transfers) - before))
        ops.append(entry)
    return ops


def apply_model(model: HostPublication, entry: tuple[Any, ...]) -> Any:
    kind = entry[0]
    if kind == "admit":
        return model.admit(entry[1], list(entry[2]), entry[3])
    if kind == "step":
        return model.step(entry[1], entry[2])
    if kind == "decode":
        return model.decode(entry[1], entry[2])
    if kind == "ack":
        return model.acknowledge(entry[1])
    return model.finish(entry[1], finished=entry[2])


def apply_core(core: HiSparseHostPublication, entry: tuple[Any, ...]) -> Any:
    kind = entry[0]
    if kind == "admit":
        answer = core.admit(entry[1], entry[2], entry[3])
    elif kind == "step":
        answer = core.step(entry[1], entry[2])
    elif kind == "decode":
        answer = core.decode(entry[1], entry[2])
    elif kind == "ack":
        counts = dict.fromkeys(entry[1], 1)
        order: set[str] = set()
        for request_id in core.acknowledge(counts, counts):
            order.add(request_id)
        core.publish_ready(list(order))
        answer = None
    else:
        answer = core.free(entry[1], finished=entry[2])
    core.take_transfers()
    return answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--operations", type=int, default=2000)
    parser.add_argument("--num-blocks", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    streams = [record(seed, args.num_blocks, args.operations) for seed in range(args.streams)]
    times: dict[str, list[float]] = {"model": [], "core": []}
    for _ in range(args.repeat):
        answers: dict[str, list[Any]] = {"model": [], "core": []}
        start = time.perf_counter()
        for ops in streams:
            model = HostPublication(args.num_blocks, BLOCK_SIZE)
            answers["model"].extend(apply_model(model, entry) for entry in ops)
        times["model"].append(time.perf_counter() - start)
        start = time.perf_counter()
        for ops in streams:
            core = HiSparseHostPublication(
                num_blocks=args.num_blocks,
                block_size=BLOCK_SIZE,
                max_spill_pages=MAX_MODEL_LEN // BLOCK_SIZE,
            )
            answers["core"].extend(apply_core(core, entry) for entry in ops)
        times["core"].append(time.perf_counter() - start)
        if answers["model"] != answers["core"]:
            raise SystemExit("the core and the model answered differently")
    model_s, core_s = (statistics.median(times[k]) for k in ("model", "core"))
    num_ops = args.streams * args.operations
    print(
        f"{num_ops} operations, {args.num_blocks} host blocks: model {model_s:.3f} s, "
        f"core {core_s:.3f} s (median of {args.repeat}), core {model_s / core_s:.1f}x faster"
    )


if __name__ == "__main__":
    main()
