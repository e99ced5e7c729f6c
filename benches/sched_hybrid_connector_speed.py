"""A KV connector beside hybrid KV groups: vLLM 0.33's ``Scheduler`` against
``TokenyardScheduler``, both on one ``VllmConfig`` with the same connector over a
full-attention group and a sliding-window group (window 128, block 16).

The connector (``SupportsHMA``, registered here) offers each request ``--loaded`` of its
prompt tokens, loaded synchronously, so every admission allocates loaded blocks in both
groups (the window group nulls what precedes its window of them). ``--requests`` requests of
``--prompt`` tokens and ``--max-tokens`` outputs arrive at once and run to the end; one step
is ``schedule()`` + the runner output + ``update_from_output()``, timed with
``perf_counter_ns``. ``--layout full``: one full-attention group (the layout connectors
were served on before). The sides alternate in rounds; the report gives each side's total and
median step, and the ratio of totals, after checking both scheduled the same tokens in every
step.

    PYTHONPATH=python .venv-bench/bin/python benches/sched_hybrid_connector_speed.py
        [--requests 512] [--prompt 512] [--loaded 384] [--max-tokens 16] [--rounds 5]
        [--layout window|full]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))

import torch
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    SupportsHMA,
)
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm_peer import VllmSchedulerPeer, runner_output

from tokenyard.integrations.vllm import TokenyardScheduler

BLOCK_SIZE = 16
CONNECTOR = "BenchLoadingConnector"


class LoadingConnector(KVConnectorBase_V1, SupportsHMA):
    """Offers ``loaded`` tokens of every request with nothing computed, synchronously."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self._loaded = int(self._kv_transfer_config.kv_connector_extra_config["loaded"])

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Any:
        most = request.num_tokens - num_computed_tokens - 1
        return max(0, min(self._loaded - num_computed_tokens, most)), False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        pass

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return KVConnectorMetadata()

    def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, None]:
        return False, None

    def request_finished_all_groups(self, request: Any, block_ids: Any) -> tuple[bool, None]:
        return False, None

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        pass

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kw: Any) -> None:
        pass

    def wait_for_save(self) -> None:
        pass


def run(cls: type, args: argparse.Namespace) -> tuple[list[int], list[dict[str, int]]]:
    """One stream on a scheduler of ``cls``: each step's time (ns) and scheduled tokens."""
    common = {"block_size": BLOCK_SIZE, "num_kv_heads": 1, "head_size": 1, "dtype": torch.float16}
    groups = [KVCacheGroupSpec(["layers.0.attn"], FullAttentionSpec(**common))]
    if args.layout == "window":
        window = SlidingWindowSpec(**common, sliding_window=128)
        groups.append(KVCacheGroupSpec(["layers.1.attn"], window))
    max_len = args.prompt + args.max_tokens + 16
    num_blocks = 2 * args.requests * (max_len // BLOCK_SIZE + 2) + 64
    peer = VllmSchedulerPeer(
        num_blocks=num_blocks,
        max_model_len=max_len,
        max_num_seqs=args.requests,
        max_num_batched_tokens=8192,
        block_size=BLOCK_SIZE,
        enable_prefix_caching=False,
    )
    peer.vllm_config.kv_transfer_config = KVTransferConfig(
        kv_connector=CONNECTOR,
        kv_role="kv_both",
        kv_connector_extra_config={"loaded": args.loaded},
    )
    config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    scheduler = peer.build(cls, config, log_stats=False)
    for i in range(args.requests):
        prompt = [(i * 7919 + t) % 30000 + 1 for t in range(args.prompt)]
        scheduler.add_request(peer.make_request(f"r{i}", prompt, args.max_tokens))
    times, tokens = [], []
    gc.collect()
    gc.disable()
    try:
        while scheduler.has_unfinished_requests():
            start = time.perf_counter_ns()
            out = scheduler.schedule()
            scheduler.update_from_output(out, runner_output(scheduler, out))
            times.append(time.perf_counter_ns() - start)
            tokens.append(dict(out.num_scheduled_tokens))
    finally:
        gc.enable()
    scheduler.shutdown()
    return times, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--loaded", type=int, default=384)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--layout",
        choices=("window", "full"),
        default="window",
        help="full + sliding window 128 (default), or one full-attention group",
    )
    args = parser.parse_args()
    KVConnectorFactory.register_connector(CONNECTOR, __name__, LoadingConnector.__name__)
    totals: dict[str, list[float]] = {"vllm": [], "tokenyard": []}
    medians: dict[str, list[float]] = {"vllm": [], "tokenyard": []}
    for _ in range(args.rounds):
        seen = {}
        for name, cls in (("vllm", Scheduler), ("tokenyard", TokenyardScheduler)):
            times, tokens = run(cls, args)
            seen[name] = tokens
            totals[name].append(sum(times) / 1e6)
            medians[name].append(statistics.median(times) / 1e6)
        if seen["vllm"] != seen["tokenyard"]:
            raise SystemExit("the two schedulers scheduled different tokens")
    steps = len(seen["vllm"])
    print(
        f"{args.layout} layout, {args.requests} requests x {args.prompt} tokens "
        f"({args.loaded} loaded), {steps} steps"
    )
    for name in totals:
        print(
            f"{name:>10}: total {statistics.median(totals[name]):8.1f} ms, "
            f"median step {statistics.median(medians[name]):7.2f} ms"
        )
    ratio = statistics.median(totals["vllm"]) / statistics.median(totals["tokenyard"])
    print(f"ratio (vLLM / tokenyard, totals): {ratio:.2f}x")


if __name__ == "__main__":
    main()
