"""vLLM 0.33.0's own ``Scheduler`` against ``tokenyard.integrations.vllm.TokenyardScheduler``,
both driven through vLLM's scheduler interface, in one process.

The same ``VllmConfig`` and ``KVCacheConfig`` build both schedulers; each gets the same vLLM
``Request`` objects (own copies, with the sha256 block hasher an engine with prefix caching
gives them) and the same fake model runner: after ``schedule()``, a ``ModelRunnerOutput``
with one sampled token for each scheduled request that reached its end, then
``update_from_output(scheduler_output, model_runner_output)``, which returns the
``EngineCoreOutputs`` an engine streams back. One *step* is ``schedule()`` + building the
runner output + ``update_from_output()``, timed with ``perf_counter_ns``.

Scenario: R running decodes (128-token prompts, ``max_tokens`` large enough that nobody
finishes), warmed up until every request decodes, then ``--steps`` timed steps. The two
sides alternate in rounds (vLLM, tokenyard, vLLM, ...) so machine noise hits both; the
report gives each side's median step over all rounds and the ratio of medians, and checks
that both scheduled the same tokens for every request in every step.

    .venv-bench/bin/python benches/sched_vllm_adapter.py [--running 1024] [--steps 50]
        [--rounds 5] [--profile] [--eagle lookahead|drop]

``--eagle lookahead|drop`` builds both from an EAGLE3 config (k = 1) with vLLM's look-ahead
block hashes or its trailing-block drop; ``--cpu-time`` times steps in the process's CPU
time instead of wall time.

``--profile`` runs cProfile over the tokenyard side's timed steps and prints where the
adapter's time goes; ``--breakdown`` times the adapter's parts and its calls into the core
with ``perf_counter_ns`` instead (no profiler overhead; medians per step).
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import gc
import io
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

from vllm_peer import VllmSchedulerPeer

from tokenyard.integrations.vllm import TokenyardScheduler

PROMPT_TOKENS = 128
BLOCK_SIZE = 16


# The step clock: wall (perf_counter_ns), or with --cpu-time the process's CPU time, the
# steadier figure on a shared machine.
CLOCK = [time.perf_counter_ns]

# An EAGLE drafter for --eagle (vLLM's method, and whether its look-ahead hashes are off).
EAGLE: dict[str, object] = {}


def build(kind: str, running: int, prefix_caching: bool) -> tuple[object, VllmSchedulerPeer]:
    blocks_per_request = (PROMPT_TOKENS + 4096) // BLOCK_SIZE + 1
    peer = VllmSchedulerPeer(
        num_blocks=running * blocks_per_request + 16,
        max_num_seqs=running,
        max_num_batched_tokens=max(8192, running),
        max_model_len=8192,
        block_size=BLOCK_SIZE,
        enable_prefix_caching=prefix_caching,
        **EAGLE,  # type: ignore[arg-type]
    )
    if kind == "vllm":
        return peer.scheduler, peer
    # The same configs vLLM's Scheduler was built from.
    vllm_sched = peer.scheduler
    scheduler = TokenyardScheduler(
        vllm_config=peer.vllm_config,
        kv_cache_config=vllm_sched.kv_cache_config,
        structured_output_manager=vllm_sched.structured_output_manager,
        block_size=BLOCK_SIZE,
        hash_block_size=BLOCK_SIZE,
        log_stats=True,
    )
    return scheduler, peer


def runner_output(scheduler: object, out: object, runner_output_cls: type) -> object:
    """The fake model's output for a step: one token for each request whose prompt is
    computed, none for a prefill chunk."""
    requests = scheduler.requests  # type: ignore[attr-defined]
    req_ids = list(out.num_scheduled_tokens)  # type: ignore[attr-defined]
    sampled = []
    for rid in req_ids:
        r = requests[rid]
        sampled.append([7] if r.num_computed_tokens >= r.num_tokens else [])
    return runner_output_cls(
        req_ids=req_ids,
        req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
        sampled_token_ids=sampled,
    )


def step(scheduler: object, runner_output_cls: type) -> dict[str, int]:
    out = scheduler.schedule()  # type: ignore[attr-defined]
    mro = runner_output(scheduler, out, runner_output_cls)
    scheduler.update_from_output(out, mro)  # type: ignore[attr-defined]
    return dict(out.num_scheduled_tokens)


def decoding(kind: str, running: int, prefix_caching: bool) -> object:
    """A scheduler (``kind``) with ``running`` requests added and stepped until every one
    decodes (one token each)."""
    from vllm.v1.outputs import ModelRunnerOutput

    scheduler, peer = build(kind, running, prefix_caching)
    for i in range(running):
        prompt = [1000 + (i * 7919 + j) % 30000 for j in range(PROMPT_TOKENS)]
        scheduler.add_request(peer.make_request(f"r{i}", prompt, max_tokens=4000))  # type: ignore[attr-defined]
    for _ in range(1000):
        decided = step(scheduler, ModelRunnerOutput)
        if len(decided) == running and all(n == 1 for n in decided.values()):
            break
    return scheduler


def run_side(
    kind: str, running: int, steps: int, prefix_caching: bool, profile: bool
) -> tuple[list[int], list[dict[str, int]], str]:
    from vllm.v1.outputs import ModelRunnerOutput

    scheduler = decoding(kind, running, prefix_caching)
    times, decisions = [], []
    profiler = cProfile.Profile() if profile else None
    gc.collect()
    for _ in range(steps):
        if profiler:
            profiler.enable()
        t0 = CLOCK[0]()
        decided = step(scheduler, ModelRunnerOutput)
        times.append(CLOCK[0]() - t0)
        if profiler:
            profiler.disable()
        decisions.append(decided)
    report = ""
    if profiler:
        buf = io.StringIO()
        pstats.Stats(profiler, stream=buf).sort_stats("tottime").print_stats(18)
        report = buf.getvalue()
    return times, decisions, report


# The adapter's parts timed by --breakdown (methods of TokenyardScheduler).
_PARTS = (
    "_new_and_resumed",
    "_cached_request_data",
    "_after_schedule",
    "_sampled",
    "_outputs_by_client",
    "_step_stats",
)


class _TimedCore:
    """The adapter's core scheduler with each method call timed into ``acc``."""

    def __init__(self, core: object, acc: dict[str, list[int]]) -> None:
        self._core = core
        self._acc = acc

    def __getattr__(self, name: str) -> object:
        attr = getattr(self._core, name)
        if not callable(attr):
            return attr

        def timed(*args: object, **kwargs: object) -> object:
            t0 = time.perf_counter_ns()
            result = attr(*args, **kwargs)
            self._acc.setdefault(f"core.{name}", []).append(time.perf_counter_ns() - t0)
            return result

        return timed


def breakdown(running: int, steps: int, prefix_caching: bool) -> str:
    """Medians per step of the adapter's parts, its core calls, the harness's runner output
    and the whole step."""
    from vllm.v1.outputs import ModelRunnerOutput

    scheduler = decoding("tokenyard", running, prefix_caching)
    acc: dict[str, list[int]] = {}
    for name in _PARTS:
        method = getattr(scheduler, name)

        def timed(*args: object, _m: object = method, _n: str = name, **kwargs: object) -> object:
            t0 = time.perf_counter_ns()
            result = _m(*args, **kwargs)  # type: ignore[operator]
            acc.setdefault(_n, []).append(time.perf_counter_ns() - t0)
            return result

        setattr(scheduler, name, functools.wraps(method)(timed))
    scheduler._core = _TimedCore(scheduler._core, acc)  # type: ignore[attr-defined]
    gc.collect()
    for _ in range(steps):
        t0 = time.perf_counter_ns()
        out = scheduler.schedule()  # type: ignore[attr-defined]
        t1 = time.perf_counter_ns()
        mro = runner_output(scheduler, out, ModelRunnerOutput)
        t2 = time.perf_counter_ns()
        scheduler.update_from_output(out, mro)  # type: ignore[attr-defined]
        t3 = time.perf_counter_ns()
        acc.setdefault("schedule()", []).append(t1 - t0)
        acc.setdefault("(harness: runner output)", []).append(t2 - t1)
        acc.setdefault("update_from_output()", []).append(t3 - t2)
        acc.setdefault("whole step", []).append(t3 - t0)
    lines = [f"{'part':<36} {'median us/step':>14}"]
    for name, times in acc.items():
        lines.append(f"{name:<36} {statistics.median(times) / 1e3:>14.1f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--running", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-prefix-caching", action="store_true")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--breakdown", action="store_true")
    parser.add_argument(
        "--eagle",
        choices=["off", "lookahead", "drop"],
        default="off",
        help="an EAGLE3 drafter (k = 1, no drafts proposed) with vLLM's look-ahead block "
        "hashes or its trailing-block drop",
    )
    parser.add_argument("--cpu-time", action="store_true", help="time steps in CPU time")
    args = parser.parse_args()
    if args.cpu_time:
        CLOCK[0] = time.process_time_ns
    if args.eagle != "off":
        EAGLE.update(
            num_speculative_tokens=1,
            speculative_method="eagle3",
            disable_lookahead_block_hashes=args.eagle == "drop",
        )
    import vllm

    import tokenyard

    caching = not args.no_prefix_caching
    print(
        f"vllm {vllm.__version__}, tokenyard {tokenyard.__version__}; {args.running} running "
        f"decodes, {args.steps} steps x {args.rounds} rounds, prefix caching "
        f"{'on' if caching else 'off'}, EAGLE {args.eagle}, "
        f"{'CPU' if args.cpu_time else 'wall'} time"
    )
    all_times: dict[str, list[int]] = {"vllm": [], "tokenyard": []}
    same = True
    for _ in range(args.rounds):
        decisions = {}
        for kind in ("vllm", "tokenyard"):
            times, decided, _ = run_side(kind, args.running, args.steps, caching, False)
            all_times[kind].extend(times)
            decisions[kind] = decided
        same = same and decisions["vllm"] == decisions["tokenyard"]
    med = {k: statistics.median(v) / 1e6 for k, v in all_times.items()}
    print(f"same decisions every step: {same}")
    for kind in ("vllm", "tokenyard"):
        per_req = med[kind] * 1e3 / args.running
        print(f"{kind:>10}: median step {med[kind]:.3f} ms ({per_req:.2f} us per running request)")
    print(f"ratio (vLLM / tokenyard, medians): {med['vllm'] / med['tokenyard']:.1f}x")
    if args.profile:
        _, _, report = run_side("tokenyard", args.running, args.steps, caching, True)
        print(report)
    if args.breakdown:
        print(breakdown(args.running, args.steps, caching))


if __name__ == "__main__":
    main()
