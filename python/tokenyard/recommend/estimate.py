"""Steady-state estimates of a deployment from its step-time predictor, in microseconds of
arithmetic instead of a simulation: what ``tokenyard recommend`` prunes its candidates with.

The premise is aiconfigurator's: a replica holds ``batch_size`` requests of ``isl`` prompt
and ``osl`` output tokens in flight, every step decodes one token of each, and (aggregated,
chunked prefill) the prompts of the requests that replace the finished ones ride along in
the same steps: ``batch_size x isl / osl`` prefill tokens per step on average, within the
step budget ``max_num_batched_tokens``. TPOT is that step's time; the throughput is
``batch_size`` tokens per step; TTFT is the time to push one prompt through the budget left
beside the decodes. A disaggregated prefill replica runs prompts alone (with an M/D/1 wait
at the utilisation asked for); a decode replica runs decodes alone. No arrival process, no
queueing beyond that, no prefix cache: the simulation that follows decides.

Every step time comes from ``price(stage=, num_stages=, **shape)``, the simulator's own
predictor (``pricer``): a ``CompiledPredictor``, the linear model's formula or the user's
``module:callable``. Invariant: an estimate only reads the predictor; the same inputs give
the same numbers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from tokenyard.errors import ConfigError

__all__ = [
    "BATCH_SIZES",
    "DecodeEstimate",
    "Estimate",
    "PrefillEstimate",
    "Pricer",
    "aggregated",
    "best_batch",
    "decode_only",
    "prefill_only",
    "pricer",
    "step_time",
]

#: ``price(stage=, num_stages=, **batch shape) -> (total_s, model_s)`` (or seconds).
Pricer = Callable[..., Any]

#: The in-flight batch sizes tried (a geometric ladder, as aiconfigurator's ``bs`` list).
BATCH_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)


def pricer(config: Any) -> Pricer:
    """The step pricer ``simulate`` uses for ``config`` (a ``SimulationConfig``).

    Raises:
        ConfigError: an execution model the estimator cannot read (none today).
    """
    from tokenyard.simulation.execution import build_predictor, choose_execution
    from tokenyard.simulation.run import load_object

    execution = config.execution
    if ":" in execution.model:
        function: Pricer = load_object(execution.model, "execution.model")
        return function
    if execution.model == "linear":
        c = execution.linear_coefficients()

        def linear(*, stage: int, num_stages: int, **shape: int) -> tuple[float, float]:
            model_s = (
                c["constant_s"]
                + c["per_prefill_token_s"] * shape["num_prefill_tokens"]
                + c["per_decode_token_s"] * shape["num_decode_tokens"]
                + c["per_decode_context_token_s"] * shape["sum_decode_context"]
                + c["per_prefill_context_token_s"] * shape["sum_prefill_context"]
            ) / num_stages
            return model_s + c["cpu_overhead_s"], model_s

        return linear
    predictor = build_predictor(config, choose_execution(config))
    if predictor is None:  # pragma: no cover - every built-in model is handled above
        raise ConfigError(
            f"execution.model: the estimator cannot price {execution.model!r}",
            field="execution.model",
            value=repr(execution.model),
        )
    return predictor.fused(config.replica.num_pipeline_stages)


def step_time(
    price: Pricer,
    *,
    num_stages: int = 1,
    decode: float = 0.0,
    decode_context: float = 0.0,
    prefill: float = 0.0,
    prefill_context: float = 0.0,
    prefill_requests: float = 1.0,
) -> float:
    """Seconds of one batch on the slowest pipeline stage: ``decode`` requests at a mean
    context of ``decode_context`` tokens, and ``prefill`` prompt tokens in
    ``prefill_requests`` chunks that end at ``prefill_context`` tokens each (rounded)."""
    d, p = max(0, round(decode)), max(0, round(prefill))
    chunks = max(1, round(prefill_requests)) if p else 0
    chunk = p / chunks if chunks else 0.0
    end = max(chunk, prefill_context)
    shape = {
        "num_requests": d + chunks,
        "num_prefill_tokens": p,
        "num_decode_tokens": d,
        "sum_decode_context": round(d * decode_context),
        "sum_prefill_context": round(chunks * chunk * end),
        "sum_prefill_squared": round(chunks * chunk * chunk),
        "num_padding_rows": 0,
    }
    worst = 0.0
    for stage in range(num_stages):
        out = price(stage=stage, num_stages=num_stages, **shape)
        worst = max(worst, float(out[0] if isinstance(out, tuple) else out))
    return worst


@dataclasses.dataclass(frozen=True)
class Estimate:
    """An aggregated replica at ``batch_size`` requests in flight. Rates are per replica
    (all its DP ranks); ``tokens_per_s_per_gpu`` counts output tokens."""

    batch_size: int
    step_s: float
    tpot_s: float
    ttft_s: float
    requests_per_s: float
    tokens_per_s_per_gpu: float
    tokens_per_s_per_user: float
    kv_tokens: int


def aggregated(
    price: Pricer,
    *,
    isl: float,
    osl: float,
    batch_size: int,
    max_num_batched_tokens: int,
    num_stages: int = 1,
    data_parallel_size: int = 1,
    gpus: int = 1,
) -> Estimate | None:
    """The steady state of one aggregated replica (each DP rank at ``batch_size``); ``None``
    when the step budget cannot hold the decodes and the prompts that replace them."""
    b, budget = float(batch_size), float(max_num_batched_tokens)
    # Pipeline parallelism: num_stages micro-batches in flight, each visiting every stage.
    micro = b / num_stages
    prefill = micro * isl / osl
    if micro + prefill > budget:
        return None
    context = isl + osl / 2.0
    stage_s = step_time(
        price,
        num_stages=num_stages,
        decode=micro,
        decode_context=context,
        prefill=prefill,
        prefill_context=isl,
        prefill_requests=max(1.0, micro / osl),
    )
    tpot = stage_s * num_stages
    # One prompt through the budget left beside the decodes, a chunk per step.
    room = max(1.0, budget - micro)
    chunk = min(isl, room)
    chunk_s = step_time(
        price,
        num_stages=num_stages,
        decode=micro,
        decode_context=context,
        prefill=chunk,
        prefill_context=isl,
    )
    ttft = math.ceil(isl / room) * chunk_s * num_stages + tpot / 2.0
    per_replica = data_parallel_size * b / (osl * tpot)
    return Estimate(
        batch_size=batch_size,
        step_s=stage_s,
        tpot_s=tpot,
        ttft_s=ttft,
        requests_per_s=per_replica,
        tokens_per_s_per_gpu=per_replica * osl / gpus,
        tokens_per_s_per_user=1.0 / tpot,
        kv_tokens=round(b * (isl + osl)),
    )


@dataclasses.dataclass(frozen=True)
class PrefillEstimate:
    """A prefill-only replica: ``ttft_s`` at ``utilisation`` of its ``max_requests_per_s``;
    ``requests_per_s`` is what it serves there."""

    service_s: float
    ttft_s: float
    max_requests_per_s: float
    requests_per_s: float
    utilisation: float


def prefill_only(
    price: Pricer,
    *,
    isl: float,
    max_num_batched_tokens: int,
    ttft_s: float,
    num_stages: int = 1,
    data_parallel_size: int = 1,
) -> PrefillEstimate | None:
    """The busiest a prefill replica may be with its TTFT (service time plus an M/D/1 wait)
    within ``ttft_s``; ``None`` when one prompt alone takes longer."""
    budget = float(max_num_batched_tokens)
    chunk = min(isl, budget)
    chunk_s = step_time(price, num_stages=num_stages, prefill=chunk, prefill_context=isl)
    service = math.ceil(isl / budget) * chunk_s * num_stages
    if service > ttft_s:
        return None
    # A full step of prompts back to back: the replica's ceiling.
    per_step = max(1.0, budget / isl)
    full_s = step_time(
        price,
        num_stages=num_stages,
        prefill=per_step * isl if budget >= isl else budget,
        prefill_context=isl,
        prefill_requests=per_step,
    )
    ceiling = data_parallel_size * (per_step if budget >= isl else budget / isl) / full_s
    # M/D/1: wait = rho / (2 (1 - rho)) x service; the highest rho with ttft within bound.
    slack = ttft_s / service - 1.0
    rho = min(0.95, 2.0 * slack / (1.0 + 2.0 * slack))
    return PrefillEstimate(
        service, service * (1 + rho / (2 * (1 - rho))), ceiling, ceiling * rho, rho
    )


@dataclasses.dataclass(frozen=True)
class DecodeEstimate:
    """A decode-only replica at ``batch_size`` requests in flight per DP rank."""

    batch_size: int
    tpot_s: float
    requests_per_s: float
    kv_tokens: int


def decode_only(
    price: Pricer,
    *,
    isl: float,
    osl: float,
    batch_size: int,
    num_stages: int = 1,
    data_parallel_size: int = 1,
) -> DecodeEstimate:
    micro = batch_size / num_stages
    stage_s = step_time(price, num_stages=num_stages, decode=micro, decode_context=isl + osl / 2)
    tpot = stage_s * num_stages
    return DecodeEstimate(
        batch_size=batch_size,
        tpot_s=tpot,
        requests_per_s=data_parallel_size * batch_size / (osl * tpot),
        kv_tokens=round(batch_size * (isl + osl)),
    )


def best_batch(
    options: Callable[[int], Any],
    *,
    max_kv_tokens: int,
    ttft_s: float | None,
    tpot_s: float | None,
    max_batch: int = BATCH_SIZES[-1],
) -> Any:
    """The estimate of the largest batch size on ``BATCH_SIZES`` (at most ``max_batch``)
    whose KV fits ``max_kv_tokens`` and whose TTFT and TPOT are within the bounds given
    (``options(batch_size)`` makes one; ``None``: infeasible). ``None`` when no batch size
    qualifies. TPOT and TTFT rise with the batch, so the ladder stops at the first miss."""
    best = None
    for b in BATCH_SIZES:
        if b > max_batch:
            break
        est = options(b)
        if est is None or est.kv_tokens > max_kv_tokens:
            break
        if tpot_s is not None and est.tpot_s > tpot_s:
            break
        if ttft_s is not None and getattr(est, "ttft_s", 0.0) > ttft_s:
            break
        best = est
    return best
