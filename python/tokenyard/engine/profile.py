"""Engine step times in the predictor's profile format, and the fidelity figure.

A profile is a CSV with one row per measured step: the device and model it ran on, the
step's composition (what the execution-time model is a function of) and the measured wall
times. ``fit_linear_step_model`` fits the simulator's linear execution model (a constant plus
terms in prefill tokens, decode tokens, decode context and prefill query-key pairs) to such
rows; comparing its prediction with held-out measurements is the fidelity figure.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from tokenyard.engine.engine import StepTiming

__all__ = ["PROFILE_COLUMNS", "LinearStepModel", "fit_linear_step_model", "write_step_profile"]

PROFILE_COLUMNS = (
    "device",
    "model",
    "dtype",
    "num_seqs",
    "num_prefill_tokens",
    "num_decode_tokens",
    "num_padding_rows",
    "sum_prefill_context",
    "sum_decode_context",
    "sum_prefill_squared",
    "schedule_ms",
    "prepare_ms",
    "model_ms",
    "process_ms",
)

#: The step composition columns, as ``StepTiming`` names them.
_COMPOSITION = PROFILE_COLUMNS[3:10]
_FEATURES = ("num_prefill_tokens", "num_decode_tokens", "sum_decode_context", "sum_prefill_context")


def write_step_profile(
    path: str | Path, timings: Sequence[StepTiming], *, device: str, model: str, dtype: str
) -> None:
    """Writes one CSV row per step (times in milliseconds)."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=PROFILE_COLUMNS)
        writer.writeheader()
        for t in timings:
            row = asdict(t)
            writer.writerow(
                {
                    "device": device,
                    "model": model,
                    "dtype": dtype,
                    **{k: row[k] for k in _COMPOSITION},
                    **{
                        f"{k}_ms": row[f"{k}_s"] * 1e3
                        for k in ("schedule", "prepare", "model", "process")
                    },
                }
            )


@dataclass(frozen=True)
class LinearStepModel:
    """``model_ms = constant + Σ coefficient · feature`` over the step composition."""

    constant_ms: float
    coefficients_ms: dict[str, float]

    def predict_ms(self, t: StepTiming) -> float:
        row = asdict(t)
        terms = (c * float(row[k]) for k, c in self.coefficients_ms.items())
        return self.constant_ms + sum(terms)


def fit_linear_step_model(timings: Sequence[StepTiming]) -> LinearStepModel:
    """Least-squares fit of the model time (ms) on the step composition."""
    rows = [asdict(t) for t in timings]
    x = np.array([[1.0] + [float(r[k]) for k in _FEATURES] for r in rows])
    y = np.array([r["model_s"] * 1e3 for r in rows])
    # Scale columns so the solve is well conditioned (context sums dwarf token counts).
    scale = np.maximum(np.abs(x).max(axis=0), 1e-12)
    solution, *_ = np.linalg.lstsq(x / scale, y, rcond=None)
    coef = solution / scale
    return LinearStepModel(float(coef[0]), dict(zip(_FEATURES, map(float, coef[1:]), strict=True)))
