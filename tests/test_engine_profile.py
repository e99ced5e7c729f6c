"""Step profiles: the CSV the engine writes for the predictor, and the linear step model."""

from __future__ import annotations

import csv
import random
from pathlib import Path

import pytest

from tokenyard.engine import StepTiming
from tokenyard.engine.profile import (
    PROFILE_COLUMNS,
    fit_linear_step_model,
    write_step_profile,
)


def step(
    prefill: int, decode: int, decode_ctx: int, prefill_ctx: int, model_s: float
) -> StepTiming:
    return StepTiming(
        schedule_s=1e-5,
        prepare_s=2e-5,
        model_s=model_s,
        process_s=3e-5,
        num_seqs=decode + (1 if prefill else 0),
        num_prefill_tokens=prefill,
        num_decode_tokens=decode,
        num_padding_rows=0,
        sum_decode_context=decode_ctx,
        sum_prefill_context=prefill_ctx,
    )


def test_linear_step_model_recovers_a_known_formula() -> None:
    rng = random.Random(3)
    steps = []
    for _ in range(200):
        p, d = rng.randint(0, 2048), rng.randint(0, 256)
        dc, pc = d * rng.randint(1, 4000), p * rng.randint(1, 3000)
        ms = 2.0 + 0.01 * p + 0.05 * d + 1e-5 * dc + 2e-7 * pc
        steps.append(step(p, d, dc, pc, ms / 1e3))
    model = fit_linear_step_model(steps)
    assert model.constant_ms == pytest.approx(2.0, rel=1e-6)
    assert model.coefficients_ms["num_prefill_tokens"] == pytest.approx(0.01, rel=1e-6)
    assert model.coefficients_ms["sum_prefill_context"] == pytest.approx(2e-7, rel=1e-6)
    assert model.predict_ms(steps[0]) == pytest.approx(steps[0].model_s * 1e3, rel=1e-6)


def test_profile_csv_has_one_row_per_step_in_milliseconds(tmp_path: Path) -> None:
    path = tmp_path / "profile.csv"
    write_step_profile(
        path, [step(16, 2, 40, 136, 0.004)], device="cpu", model="tiny", dtype="float32"
    )
    with open(path) as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == PROFILE_COLUMNS
    assert rows[0]["device"] == "cpu"
    assert float(rows[0]["model_ms"]) == pytest.approx(4.0)
    assert int(rows[0]["sum_prefill_context"]) == 136
