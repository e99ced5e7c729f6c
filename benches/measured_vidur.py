"""Part d of ``predictor_measured.py``: Vidur's measured MLP-side operations (its own
PyTorch profiler on A100/H100, ``../shared/data/profiling/vidur``) against tokenyard's
per-operation predictions, per layer. Skipped when ``../shared/data`` is absent. Run through
``predictor_measured.py``.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from aic_steps import error_stats, pct_error

from tokenyard import catalog
from tokenyard.predictor import batch_features, read_profiles
from tokenyard.predictor.calibration import builtin_calibration
from tokenyard.predictor.measured.build import measured_predictor
from tokenyard.predictor.measured.data import package_root, resolve_source
from tokenyard.predictor.roofline import roofline_predictor

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


# --- d. Vidur's measured operations -----------------------------------------------------------

VIDUR_MODELS = {
    "Llama-2-7b-hf": "llama-2-7b",
    "Llama-2-70b-hf": "llama-2-70b",
    "Meta-Llama-3-8B": "llama-3-8b",
}
VIDUR_DEVICES = {"h100": "h100_sxm", "a100": "a100_sxm"}
VIDUR_OPS = (
    "qkv_proj",
    "o_proj",
    "gate_up_proj",
    "down_proj",
    "act",
    "rope",
    "input_norm",
    "post_attn_norm",
    "embedding",
)


def vidur_section(systems: dict[str, str], predictor_names: tuple[str, ...]) -> dict[str, Any]:
    """Part d; ``systems`` maps a measured system to its catalog device,
    ``predictor_names`` the predictors reported, in column order."""
    base = SHARED / "profiling" / "vidur" / "compute"
    print("\n## d. Vidur's measured operations (per layer) vs tokenyard\n")
    if not base.is_dir():
        print(f"skipped: {base} is absent")
        return {"skipped": f"{base} is absent"}
    root = package_root()
    errors: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    runs = []
    for device_dir, system in VIDUR_DEVICES.items():
        device = catalog.device(systems[system])
        source = resolve_source(root, system, "vllm", "latest")
        for folder in sorted((base / device_dir / "meta-llama").iterdir()):
            name = VIDUR_MODELS.get(folder.name)
            path = folder / "mlp.csv"
            if name is None or not path.is_file():
                continue
            model = catalog.model(name)
            for tp in (1, 2, 4, 8):
                try:
                    profiles = read_profiles([path], tensor_parallel_size=tp)
                    predictors = {
                        "measured": measured_predictor(
                            model, device, source, tensor_parallel_size=tp
                        ),
                        "calibrated": roofline_predictor(
                            model,
                            device,
                            tensor_parallel_size=tp,
                            calibration=builtin_calibration(device),
                        ),
                        "datasheet": roofline_predictor(model, device, tensor_parallel_size=tp),
                    }
                except Exception as exc:  # report it and go on
                    runs.append(f"{device_dir} {folder.name} TP{tp}: skipped ({exc})")
                    continue
                runs.append(f"{device_dir} {folder.name} TP{tp}")
                for op in VIDUR_OPS:
                    samples = profiles.ops.get(op)
                    if samples is None:
                        continue
                    for tokens, seconds in zip(samples.features[:, 0], samples.time_s, strict=True):
                        n = int(tokens)
                        shape = batch_features(
                            num_requests=1,
                            num_prefill_tokens=n,
                            num_decode_tokens=0,
                            sum_decode_context=0,
                            sum_prefill_context=n * n,
                            sum_prefill_squared=n * n,
                            num_padding_rows=0,
                        )
                        for pr, predictor in predictors.items():
                            ours = predictor.op_times(shape).get(op)
                            if ours is None:
                                continue
                            per_layer = ours if op == "embedding" else ours / model.num_layers
                            error = pct_error(per_layer, seconds)
                            errors[(device_dir, op, pr)].append(error)
                            if n <= 128 or n >= 1024:
                                size = "small" if n <= 128 else "large"
                                errors[(device_dir, op, f"{pr} {size}")].append(error)
    print("deployments: " + "; ".join(runs) + "\n")
    print(
        "| device | op | n | measured median / signed | measured signed, <= 128 / >= 1024 "
        "tokens | calibrated median / signed | datasheet median / signed |"
    )
    print("|---|---|---:|---|---|---|---|")
    table = {}
    for device_dir in VIDUR_DEVICES:
        for op in VIDUR_OPS:
            keys = [f"{pr}{size}" for pr in predictor_names for size in ("", " small", " large")]
            stats = {k: error_stats(errors.get((device_dir, op, k), [])) for k in keys}
            if stats["measured"]["n"] == 0:
                continue
            table[f"{device_dir} {op}"] = stats

            def cell(key: str, stats: dict[str, dict[str, float]] = stats) -> str:
                s = stats[key]
                return f"{s['median']:.1f} / {s['signed']:+.1f}" if s["n"] else ""

            small, large = stats["measured small"]["signed"], stats["measured large"]["signed"]
            print(
                f"| {device_dir} | {op} | {stats['measured']['n']} | {cell('measured')} | "
                f"{small:+.1f} / {large:+.1f} | {cell('calibrated')} | {cell('datasheet')} |"
            )
    return {"runs": runs, "ops": table}
