"""The engine on a GPU: where a step's time goes, the overlap loop's gain, and how well the
simulator's linear execution model predicts measured step times (the fidelity figure).

    python benches/engine_gpu.py --out DIR [--model llama-3.1-8b] [--requests N]
        (needs CUDA; writes engine.json and the step profile engine_profile.csv into DIR)

Model: Llama-3.2-1B's shape (16 layers, hidden 2048, 32 heads, 8 KV heads, head_dim 64,
SwiGLU 8192, vocab 128256) by default, or a dense catalog model's shape (``--model``), with
random bf16 weights. Workload: 256 requests, prompts of 64-1024 random tokens, 32-256 output
tokens each (EOS ignored), seeded. ``benches/engine_vs_measured.py`` prices the profile's
steps with the measured predictor of the GPU it ran on.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from tokenyard.engine import EngineConfig, LlamaModel, LLMEngine, ModelConfig
from tokenyard.engine.profile import fit_linear_step_model, write_step_profile
from tokenyard.sched import SchedulerConfig

MODEL = ModelConfig(
    vocab_size=128256,
    hidden_size=2048,
    num_layers=16,
    num_heads=32,
    num_kv_heads=8,
    head_dim=64,
    intermediate_size=8192,
    rope_theta=500000.0,
)
SCHEDULER = SchedulerConfig(
    max_num_batched_tokens=4096,
    max_num_seqs=256,
    block_size=16,
    num_blocks=16384,
    max_model_len=4096,
)


def catalog_shape(name: str) -> ModelConfig:
    """A dense catalog model's shape. The catalog keeps no RoPE base; 500,000 (Llama 3's) is
    used, which changes no timing."""
    from tokenyard import catalog

    spec = catalog.model(name)
    if spec.num_experts > 1 or spec.mla is not None or spec.sliding_window or spec.linear:
        sys.exit(f"--model {name}: the engine runs dense full-attention models only")
    return ModelConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        num_layers=spec.num_layers,
        num_heads=spec.num_heads,
        num_kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        intermediate_size=spec.intermediate_size,
        rope_theta=500000.0,
    )


def workload(n: int, seed: int, vocab_size: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [
        (
            [rng.randrange(vocab_size) for _ in range(rng.randint(64, 1024))],
            rng.randint(32, 256),
        )
        for _ in range(n)
    ]


def run(
    shape: ModelConfig,
    model: LlamaModel,
    requests: list[tuple[list[int], int]],
    *,
    overlap: bool,
    synchronize: bool,
) -> tuple[LLMEngine, dict[str, list[int]], float]:
    engine = LLMEngine(
        EngineConfig(
            model=shape,
            scheduler=SCHEDULER,
            overlap=overlap,
            synchronize_timings=synchronize,
            graph_batch_sizes=(1, 2, 4, 8, 16, 32, 64, 128, 256) if overlap else (),
        ),
        model=model,
    )
    for i, (prompt, max_tokens) in enumerate(requests):
        engine.add_request(f"r{i}", prompt, max_tokens, ignore_eos=True)
    outputs: dict[str, list[int]] = {}
    torch.cuda.synchronize()
    start = time.perf_counter()
    for event in engine.stream():
        outputs.setdefault(str(event.request_id), []).append(event.token_id)
    torch.cuda.synchronize()
    return engine, outputs, time.perf_counter() - start


def phase_split(engine: LLMEngine) -> dict[str, float]:
    steps = engine.timings
    total = {
        phase: sum(getattr(t, f"{phase}_s") for t in steps)
        for phase in ("schedule", "prepare", "model", "process")
    }
    wall = sum(total.values())
    return {
        "steps": len(steps),
        **{f"{phase}_s": value for phase, value in total.items()},
        **{f"{phase}_share": value / wall for phase, value in total.items()},
        "median_schedule_us": statistics.median(t.schedule_s for t in steps) * 1e6,
        "median_step_ms": statistics.median(
            t.schedule_s + t.prepare_s + t.model_s + t.process_s for t in steps
        )
        * 1e3,
    }


def fidelity(engine: LLMEngine) -> dict[str, float]:
    """Fit the linear step model on even steps, report its error on odd ones."""
    steps = engine.timings[1:]  # the first step carries kernel compilation
    train, test = steps[0::2], steps[1::2]
    model = fit_linear_step_model(train)
    errors = [abs(model.predict_ms(t) - t.model_s * 1e3) / (t.model_s * 1e3) for t in test]
    errors.sort()
    return {
        "mape": statistics.fmean(errors),
        "median_abs_pct_error": statistics.median(errors),
        "p90_abs_pct_error": errors[int(0.9 * (len(errors) - 1))],
        "constant_ms": model.constant_ms,
        **{f"coef_{k}_ms": v for k, v in model.coefficients_ms.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--model", help="a dense catalog model's shape (default: Llama-3.2-1B's)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("engine_gpu.py needs a CUDA device")
    args.out.mkdir(parents=True, exist_ok=True)
    shape = catalog_shape(args.model) if args.model else MODEL
    model_name = args.model or "llama-3.2-1b-shape"
    requests = workload(args.requests, seed=0, vocab_size=shape.vocab_size)
    model = LlamaModel(shape, device=torch.device("cuda"), dtype=torch.bfloat16)
    run(shape, model, requests[:8], overlap=False, synchronize=False)  # compile kernels
    _, sync_out, sync_wall = run(shape, model, requests, overlap=False, synchronize=False)
    overlap_engine, overlap_out, overlap_wall = run(
        shape, model, requests, overlap=True, synchronize=False
    )
    # Last, so every kernel specialisation the workload needs is already compiled.
    timed, _, timed_wall = run(shape, model, requests, overlap=False, synchronize=True)
    num_output = sum(len(v) for v in sync_out.values())
    same = sum(sync_out[k] == overlap_out.get(k) for k in sync_out)
    write_step_profile(
        args.out / "engine_profile.csv",
        timed.timings,
        device=torch.cuda.get_device_name(),
        model=model_name,
        dtype="bfloat16",
    )
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "model": model_name,
        "requests": len(requests),
        "output_tokens": num_output,
        "sync_wall_s": sync_wall,
        "overlap_wall_s": overlap_wall,
        "overlap_speedup": sync_wall / overlap_wall,
        "sync_tokens_per_s": num_output / sync_wall,
        "overlap_tokens_per_s": num_output / overlap_wall,
        "requests_identical_sync_vs_overlap": same,
        "synchronized_run": {"wall_s": timed_wall, **phase_split(timed)},
        "overlap_run_steps": len(overlap_engine.timings),
        "fidelity_linear_model": fidelity(timed),
    }
    (args.out / "engine.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
