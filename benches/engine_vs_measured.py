"""The engine's measured steps and a `tokenyard profile` of one model's layers, priced by the
measured predictor (and the two rooflines) of the GPU they ran on.

    python benches/engine_vs_measured.py [--engine DIR/engine_profile.csv] \\
        [--profile DIR/profile.csv ...] [--model NAME_OR_CONFIG] [--device h200] [--json OUT]

Runs on any machine: the GPU part is `benches/gpu_session.sh` (engine_gpu.py and
`tokenyard profile`), this script only reads its CSVs. The measured predictor prices vLLM
0.x's kernels from aiconfigurator's tables (`version = "latest"`); the engine is tokenyard's
own eager PyTorch loop (no CUDA graphs), so its decode steps carry a host launch floor that
no kernel table holds. The floor is reported separately: the smallest decode steps' model
time, and the error of `max(floor, predicted)`.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from tokenyard import catalog
from tokenyard.predictor import batch_features
from tokenyard.predictor.calibration import builtin_calibration
from tokenyard.predictor.compiled import CompiledPredictor
from tokenyard.predictor.measured.build import measured_predictor
from tokenyard.predictor.measured.data import SYSTEM_OF_DEVICE, package_root, resolve_source
from tokenyard.predictor.roofline import roofline_predictor

GEMMS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")
# The measured predictor prices a MoE layer's experts as one fused kernel (vLLM's fused_moe);
# the profile times its pieces, so their sum per token count is compared with it.
MOE_PIECES = ("gate_up_proj", "act", "down_proj")
ELEMENTWISE = ("input_norm", "post_attn_norm", "rope", "act", "kv_store", "embedding")


def predictors(model_name: str, device_name: str) -> dict[str, CompiledPredictor]:
    model, device = catalog.model(model_name), catalog.device(device_name)
    source = resolve_source(package_root(), SYSTEM_OF_DEVICE[device.name], "vllm", "latest")
    return {
        "measured": measured_predictor(model, device, source),
        "calibrated": roofline_predictor(model, device, calibration=builtin_calibration(device)),
        "datasheet": roofline_predictor(model, device),
    }


def stats(errors: list[float]) -> dict[str, float]:
    """Percent errors (predicted / measured - 1): median |e|, mean |e| (MAPE), p90, signed."""
    if not errors:
        return {"n": 0}
    absolute = sorted(abs(e) for e in errors)
    return {
        "n": len(errors),
        "median": 100 * statistics.median(absolute),
        "mape": 100 * statistics.fmean(absolute),
        "p90": 100 * absolute[int(0.9 * (len(absolute) - 1))],
        "signed": 100 * statistics.median(errors),
    }


def step_kind(row: dict[str, str]) -> str:
    prefill, decode = int(row["num_prefill_tokens"]), int(row["num_decode_tokens"])
    return "mixed" if prefill and decode else "prefill" if prefill else "decode"


def step_shape(row: dict[str, str]) -> dict[str, float]:
    """The engine row as the simulator's batch features. The engine's decode context counts
    the token being decoded (its row's end); the simulator's counts the tokens before it."""
    decode = int(row["num_decode_tokens"])
    return batch_features(
        num_requests=int(row["num_seqs"]),
        num_prefill_tokens=int(row["num_prefill_tokens"]),
        num_decode_tokens=decode,
        sum_decode_context=int(row["sum_decode_context"]) - decode,
        sum_prefill_context=int(row["sum_prefill_context"]),
        sum_prefill_squared=int(row["sum_prefill_squared"]),
        num_padding_rows=int(row["num_padding_rows"]),
    )


def engine_section(path: Path, model: str, device: str) -> dict[str, Any]:
    with open(path) as f:
        rows = list(csv.DictReader(f))[1:]  # the first step carries kernel compilation
    priced = predictors(model, device)
    # The launch floor, fitted on the even steps only (the `max(floor, ...)` rows are
    # scored on the odd ones): the median model time of their smallest tenth of decodes.
    decode_rows = (r for r in rows[0::2] if step_kind(r) == "decode")
    decodes = sorted((int(r["num_decode_tokens"]), float(r["model_ms"])) for r in decode_rows)
    smallest = decodes[: max(1, len(decodes) // 10)]
    floor_ms = statistics.median(ms for _, ms in smallest)
    errors: dict[tuple[str, str], list[float]] = defaultdict(list)
    for index, row in enumerate(rows):
        measured_ms = float(row["model_ms"])
        shape = step_shape(row)
        for name, predictor in priced.items():
            predicted_ms = predictor.stage_time(shape)[1] * 1e3
            for kind in (step_kind(row), "all"):
                errors[(name, kind)].append(predicted_ms / measured_ms - 1)
                if index % 2:
                    errors[(f"max(floor, {name}), odd steps", kind)].append(
                        max(floor_ms, predicted_ms) / measured_ms - 1
                    )
    kinds = ("prefill", "mixed", "decode", "all")
    counts = {k: sum(step_kind(r) == k for r in rows) for k in kinds[:3]} | {"all": len(rows)}
    print(f"\n## Engine steps ({model} on {device}; {len(rows)} steps: {counts})\n")
    sizes = f"{smallest[0][0]}-{smallest[-1][0]} rows"
    print(f"launch floor (median model time of the {len(smallest)} smallest decode batches "
          f"of the even steps, {sizes}): {floor_ms:.2f} ms\n")  # fmt: skip
    print("| predictor | " + " | ".join(f"{k} MAPE / median / signed" for k in kinds) + " |")
    print("|---|" + "---:|" * len(kinds))
    table: dict[str, dict[str, Any]] = {}
    for name in sorted({n for n, _ in errors}, key=lambda n: (n.startswith("max"), n)):
        table[name] = {k: stats(errors[(name, k)]) for k in kinds}
        cells = (table[name][k] for k in kinds)
        print(f"| {name} | " + " | ".join(
            f"{s['mape']:.1f} / {s['median']:.1f} / {s['signed']:+.1f}" if s["n"] else "-"
            for s in cells
        ) + " |")  # fmt: skip
    return {"steps": counts, "launch_floor_ms": floor_ms, "errors": table}


def op_shape(row: dict[str, str]) -> dict[str, float] | None:
    """A `tokenyard profile` row as batch features (one layer's operation)."""
    op = row["op"]
    if op == "attn_prefill":
        batch, chunk, prefix = (int(row[k]) for k in ("batch_size", "chunk_size", "context_len"))
        return batch_features(
            num_requests=batch,
            num_prefill_tokens=batch * chunk,
            num_decode_tokens=0,
            sum_decode_context=0,
            sum_prefill_context=batch * chunk * (prefix + chunk),
            sum_prefill_squared=batch * chunk * chunk,
            num_padding_rows=0,
        )
    if op == "attn_decode":
        batch, context = int(row["batch_size"]), int(row["context_len"])
        return batch_features(
            num_requests=batch,
            num_prefill_tokens=0,
            num_decode_tokens=batch,
            sum_decode_context=batch * (context - 1),
            sum_prefill_context=0,
            sum_prefill_squared=0,
            num_padding_rows=0,
        )
    if not row["num_tokens"]:
        return None
    n = int(row["num_tokens"])
    if op == "lm_head":  # a serving step takes logits of sampled rows only: n decode rows
        return batch_features(
            num_requests=n,
            num_prefill_tokens=0,
            num_decode_tokens=n,
            sum_decode_context=n,
            sum_prefill_context=0,
            sum_prefill_squared=0,
            num_padding_rows=0,
        )
    return batch_features(
        num_requests=1,
        num_prefill_tokens=n,
        num_decode_tokens=0,
        sum_decode_context=0,
        sum_prefill_context=n * n,
        sum_prefill_squared=n * n,
        num_padding_rows=0,
    )


def moe_rows(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """One `moe_experts` row per token count: the profiled pieces of the experts' FFN summed."""
    total: dict[str, float] = defaultdict(float)
    pieces: dict[str, int] = defaultdict(int)
    for row in rows:
        if row["op"] in MOE_PIECES:
            total[row["num_tokens"]] += float(row["time_ms"])
            pieces[row["num_tokens"]] += 1
    return [
        {"op": "moe_experts", "num_tokens": n, "time_ms": str(t)}
        for n, t in total.items()
        if pieces[n] == len(MOE_PIECES)
    ]


def op_section(path: Path, model: str, device: str) -> dict[str, Any]:
    with open(path) as f:
        rows = list(csv.DictReader(f))
    backend = rows[0]["backend"]
    priced = predictors(model, device)
    num_layers = catalog.model(model).num_layers
    if catalog.model(model).num_experts > 1:
        rows += moe_rows(rows)
    errors: dict[tuple[str, str], list[float]] = defaultdict(list)
    for row in rows:
        shape = op_shape(row)
        if shape is None:
            continue
        op, measured_s = row["op"], float(row["time_ms"]) / 1e3
        for name, predictor in priced.items():
            ours = predictor.op_times(shape).get(op)
            if ours is None or ours == 0.0:
                continue
            per_layer = ours if op in ("embedding", "lm_head") else ours / num_layers
            error = per_layer / measured_s - 1
            errors[(op, name)].append(error)
            if name == "measured" and shape["num_tokens"] <= 128:
                errors[(op, "small")].append(error)
            elif name == "measured" and shape["num_tokens"] >= 1024:
                errors[(op, "large")].append(error)
    print(f"\n## `tokenyard profile` per operation ({model}, backend {backend}; "
          "per layer, predicted / profiled - 1)\n")  # fmt: skip
    names = tuple(priced)
    print("| op | n | " + " | ".join(f"{n} median / signed" for n in names)
          + " | measured signed, <= 128 / >= 1024 tokens |")  # fmt: skip
    print("|---|---:|" + "---:|" * (len(names) + 1))
    table: dict[str, dict[str, Any]] = {}
    for op in (*GEMMS, "moe_experts", "attn_prefill", "attn_decode", *ELEMENTWISE):
        if (op, "measured") not in errors:
            continue
        table[op] = {n: stats(errors[(op, n)]) for n in (*names, "small", "large")}
        cells = (table[op][n] for n in names)
        small, large = (table[op][k].get("signed") for k in ("small", "large"))
        sizes = " / ".join("-" if v is None else f"{v:+.1f}" for v in (small, large))
        print(f"| {op} | {table[op]['measured']['n']} | " + " | ".join(
            f"{s['median']:.1f} / {s['signed']:+.1f}" if s["n"] else "" for s in cells
        ) + f" | {sizes} |")  # fmt: skip
    return {"backend": backend, "ops": table}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", type=Path, help="engine_profile.csv (optional: profiles alone)")
    parser.add_argument("--profile", type=Path, action="append", default=[],
                        help="a `tokenyard profile` CSV (repeatable)")  # fmt: skip
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--device", default="h200", help="catalog device the runs used")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.engine is None and not args.profile:
        parser.error("give --engine, --profile or both")
    out: dict[str, Any] = {}
    if args.engine is not None:
        out["engine"] = engine_section(args.engine, args.model, args.device)
    out["profiles"] = [op_section(p, args.model, args.device) for p in args.profile]
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
