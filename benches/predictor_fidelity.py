"""Held-out error of the profiled predictor on a profile measured here.

Profiles one decoder layer of a model on the current device (``tokenyard profile``'s
code), then trains the profiled predictor on 80% of each operation's shapes and scores it on
the other 20% (``tokenyard predictor eval``'s code). On a GPU use the catalog model and the
default grid; on a CPU the default is a 1B-shaped model and a grid sized for minutes.

    python benches/predictor_fidelity.py --out benches/out/predictor_cpu
    python benches/predictor_fidelity.py --model llama-2-7b --grid default --out $OUT   # GPU
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from tokenyard.catalog import ModelSpec, model
from tokenyard.predictor import TrainingOptions, holdout_errors, read_profiles
from tokenyard.profiler.run import ProfileGrid, profile_model, write_profile

# Llama-3.2-1B's shape (meta-llama/Llama-3.2-1B config.json): small enough for a CPU.
SMALL = ModelSpec(
    name="llama-3.2-1b",
    num_layers=16,
    hidden_size=2048,
    num_heads=32,
    num_kv_heads=8,
    head_dim=64,
    intermediate_size=8192,
    vocab_size=128256,
    context_length=131072,
    tied_embeddings=True,
    attention_bias=False,
    num_experts=1,
    experts_per_token=1,
    source="https://huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json",
)

CPU_TOKENS = (1, 2, 3, 4, 6, 8, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128, 160, 192)
CPU_GRID = ProfileGrid(
    num_tokens=(*CPU_TOKENS, 256, 320, 384, 512, 640, 768, 1024),
    prefill_batch_sizes=(1, 2),
    prefill_chunk_sizes=(16, 32, 64, 128, 256, 512),
    prefill_context_lens=(0, 128, 256, 512, 1024, 2048),
    decode_batch_sizes=(1, 2, 4, 8, 16, 32, 64),
    decode_context_lens=(64, 128, 256, 512, 1024, 2048, 4096),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", help="catalog model (default: a Llama-3.2-1B shape)")
    parser.add_argument("--grid", default="cpu", help="cpu (this file's), tiny or default")
    parser.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--dtype", default="bf16", help="bf16 (GPU); use fp32 on a CPU")
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--profile", help="skip profiling: evaluate this CSV")
    parser.add_argument("--out", default="benches/out/predictor", help="output folder")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = Path(args.profile) if args.profile else out / "profile.csv"
    started = time.perf_counter()
    if not args.profile:
        spec = model(args.model) if args.model else SMALL
        grid = CPU_GRID if args.grid == "cpu" else ProfileGrid.preset(args.grid)
        rows = profile_model(
            spec,
            grid=grid,
            device=args.device,
            dtype=args.dtype,
            repeats=args.repeats,
            warmup=args.warmup,
        )
        write_profile(rows, path)
    profiled_s = time.perf_counter() - started
    profiles = read_profiles([path])
    started = time.perf_counter()
    errors = holdout_errors(profiles, options=TrainingOptions(seed=0))
    eval_s = time.perf_counter() - started
    print(f"profile {path} ({profiles.device}, {profiled_s:.0f} s); evaluation {eval_s:.0f} s")
    print(f"{'op':<16} {'regressor':<18} {'train':>5} {'test':>5} {'MAPE %':>7} {'p90 %':>7}")
    for e in errors:
        print(
            f"{e.op:<16} {e.regressor:<18} {e.num_train:>5} {e.num_test:>5} "
            f"{100 * e.mape:>7.2f} {100 * e.p90_ape:>7.2f}"
        )
    report = {
        "profile": str(path),
        "device": profiles.device,
        "profile_s": profiled_s,
        "eval_s": eval_s,
        "errors": [dataclasses.asdict(e) for e in errors],
    }
    (out / "fidelity.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
