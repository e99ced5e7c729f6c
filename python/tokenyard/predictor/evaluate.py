"""Held-out error of the profiled predictor, per operation (``tokenyard predictor eval``).

Each operation's measured shapes are split at random (seeded): the predictor trains on the
rest exactly as the simulator's would (regressor choice included) and is scored on the
held-out shapes with the table Rust would evaluate.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from tokenyard.errors import ConfigError
from tokenyard.predictor.profiled import (
    TrainingOptions,
    fit_op,
    median_by_point,
    table_predict,
)
from tokenyard.predictor.profiles import OpSamples, ProfileSet

__all__ = ["OpError", "holdout_errors"]


@dataclasses.dataclass(frozen=True)
class OpError:
    """Held-out error of one operation: mean and p90 absolute percentage error."""

    op: str
    regressor: str
    num_train: int
    num_test: int
    mape: float
    p90_ape: float
    cv_mape: Mapping[str, float]


def _split(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.random.default_rng(seed).permutation(n)
    num_test = min(n - 1, max(1, round(n * fraction)))
    return order[num_test:], order[:num_test]


def holdout_errors(
    profiles: ProfileSet,
    *,
    options: TrainingOptions | None = None,
    holdout_fraction: float = 0.2,
) -> list[OpError]:
    """Per operation with at least 5 distinct shapes: train on the rest, score the held-out
    ``holdout_fraction`` of shapes (at least one)."""
    options = options or TrainingOptions()
    options.check("predictor")
    if not 0 < holdout_fraction < 1:
        raise ConfigError(
            f"holdout_fraction: must be in (0, 1), got {holdout_fraction!r}",
            field="holdout_fraction",
            value=repr(holdout_fraction),
        )
    errors = []
    for op in sorted(profiles.ops):
        points, times = median_by_point(profiles.ops[op])
        if len(points) < 5:
            continue
        train, test = _split(len(points), holdout_fraction, options.seed)
        samples = OpSamples(op, profiles.ops[op].feature_names, points[train], times[train])
        fit = fit_op(samples, options)
        predicted = table_predict(fit.table, points[test])
        ape = np.abs(predicted - times[test]) / times[test]
        errors.append(
            OpError(
                op=op,
                regressor=fit.regressor,
                num_train=len(train),
                num_test=len(test),
                mape=float(np.mean(ape)),
                p90_ape=float(np.percentile(ape, 90)),
                cv_mape=fit.cv_mape,
            )
        )
    return errors
