"""The profiled predictor: per-operation tables trained on measured times.

For each operation the profiles cover, candidate regressors are fitted and compiled to a
table (the form Rust evaluates); the one whose compiled table has the lowest
cross-validated error wins:

- ``interpolation``: the measured points themselves (medians of repeats) when they form a
  grid, else piecewise-linear interpolation over the points in log-log space, and outside
  their convex hull the ``linear`` fit of the nearest few;
- ``linear``: non-negative least squares on ``1, x`` (one feature) or ``1, x, y, xy`` (two:
  attention is linear in tokens x context), weighted for relative error;
- ``random_forest`` / ``gradient_boosting`` (scikit-learn): fitted in log-log space and
  evaluated on a log-spaced grid spanning the data.

Operations the profiles lack (the LM head in Vidur's files, the all-reduce without a
network profile) keep their roofline cost, and each op records its source. Trained models
are cached on disk keyed by the profiles' digest and every option that shapes the result.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tokenyard._checks import check_key_int
from tokenyard.errors import ConfigError
from tokenyard.predictor.compiled import CompiledPredictor, TableCost
from tokenyard.predictor.profiles import OpSamples, ProfileSet

__all__ = [
    "REGRESSORS",
    "OpFit",
    "TrainingOptions",
    "default_cache_dir",
    "fit_op",
    "median_by_point",
    "profiled_predictor",
    "table_predict",
]

REGRESSORS = ("interpolation", "linear", "random_forest", "gradient_boosting")
CACHE_VERSION = 1

#: Where each profiled op's table lives in the simulator's features: (x, y) axis names.
_AXES: Mapping[str, tuple[str, str | None]] = {
    "attn_prefill": ("num_prefill_tokens", "prefill_mean_context"),
    "attn_decode": ("decode_sequences", "decode_mean_context"),
    "lm_head": ("num_requests", None),
}

Array = npt.NDArray[np.float64]


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainingOptions:
    """``regressor``: ``auto`` (lowest cross-validated error) or one of ``REGRESSORS``.
    ``grid_points``: per axis of a table compiled from a fitted regressor."""

    regressor: str = "auto"
    grid_points: int = 48
    folds: int = 5
    seed: int = 0

    def check(self, where: str) -> None:
        if self.regressor != "auto" and self.regressor not in REGRESSORS:
            raise ConfigError(
                f"{where}.regressor: unknown regressor {self.regressor!r}; expected 'auto' or "
                f"one of {', '.join(REGRESSORS)}",
                field=f"{where}.regressor",
                value=repr(self.regressor),
            )
        for name, low, high in (
            ("grid_points", 2, 4096),
            ("folds", 2, 100),
            ("seed", 0, 2**64 - 1),
        ):
            check_key_int(f"{where}.{name}", getattr(self, name), low=low, high=high)


@dataclasses.dataclass(frozen=True)
class OpFit:
    """One operation's trained table and how each candidate did in cross-validation (mean
    absolute percentage error of its compiled table on held-out points)."""

    op: str
    regressor: str
    table: TableCost
    cv_mape: Mapping[str, float]


def median_by_point(samples: OpSamples) -> tuple[Array, Array]:
    """Unique feature rows and the median time of the repeats at each."""
    points, inverse = np.unique(samples.features, axis=0, return_inverse=True)
    times = np.array([np.median(samples.time_s[inverse.ravel() == i]) for i in range(len(points))])
    return points, times


def _log_grid(low: float, high: float, n: int) -> tuple[float, ...]:
    if high <= low:
        return (float(low),)
    grid = np.unique(np.geomspace(max(low, 1e-9), high, n))
    grid[0], grid[-1] = low, high
    return tuple(float(v) for v in grid)


def _basis(features: Array) -> Array:
    if features.shape[1] == 1:
        return np.column_stack([np.ones(len(features)), features[:, 0]])
    x, y = features[:, 0], features[:, 1]
    return np.column_stack([np.ones(len(features)), x, y, x * y])


def _linear_coefficients(features: Array, times: Array) -> Array:
    from scipy.optimize import nnls

    weights = 1.0 / times  # relative error: a 10 us op matters as much as a 10 ms one
    coefficients, _ = nnls(_basis(features) * weights[:, None], times * weights)
    return np.asarray(coefficients, dtype=np.float64)


def _grid_axes(features: Array, options: TrainingOptions) -> list[tuple[float, ...]]:
    low, high = features.min(axis=0), features.max(axis=0)
    return [
        _log_grid(float(lo), float(hi), options.grid_points)
        for lo, hi in zip(low, high, strict=True)
    ]


def _tabulate(axes: list[tuple[float, ...]], predict: Callable[[Array], Array]) -> TableCost:
    """A table of ``predict`` on the grid ``axes`` (one or two)."""
    if len(axes) == 1:
        values = predict(np.array(axes[0])[:, None])
        return TableCost(x="x", xs=axes[0], values=tuple(map(float, values)))
    mesh = np.array([(x, y) for x in axes[0] for y in axes[1]])
    values = predict(mesh)
    return TableCost(x="x", y="y", xs=axes[0], ys=axes[1], values=tuple(map(float, values)))


def _linear(features: Array, times: Array, options: TrainingOptions) -> TableCost:
    coefficients = _linear_coefficients(features, times)
    floor = float(times.min()) * 1e-3  # all-zero coefficients must not give a zero time

    def predict(points: Array) -> Array:
        return np.maximum(_basis(points) @ coefficients, floor)

    return _tabulate(_grid_axes(features, options), predict)


def _interpolation(points: Array, values: Array, options: TrainingOptions) -> TableCost:
    """``points`` are distinct (every fitter gets the medians per point)."""
    if points.shape[1] == 1:
        return TableCost(
            x="x", xs=tuple(map(float, points[:, 0])), values=tuple(map(float, values))
        )
    xs, ys = np.unique(points[:, 0]), np.unique(points[:, 1])
    if len(xs) * len(ys) == len(points):  # a full grid: use the measurements as they are
        order = np.lexsort((points[:, 1], points[:, 0]))
        return TableCost(
            x="x",
            y="y",
            xs=tuple(map(float, xs)),
            ys=tuple(map(float, ys)),
            values=tuple(map(float, values[order])),
        )
    from scipy.interpolate import LinearNDInterpolator
    from scipy.spatial import QhullError

    try:
        inside = LinearNDInterpolator(np.log(points), np.log(values))
    except (QhullError, ValueError):  # collinear points: no hull to interpolate in
        inside = None

    def predict(mesh: Array) -> Array:
        if inside is None:
            return _local_linear(points, values, mesh)
        interpolated = np.exp(inside(np.log(mesh)))
        outside = np.isnan(interpolated)
        interpolated[outside] = _local_linear(points, values, mesh[outside])
        return np.asarray(interpolated, dtype=np.float64)

    return _tabulate(_grid_axes(points, options), predict)


_NEIGHBOURS = 6


def _local_linear(points: Array, values: Array, queries: Array) -> Array:
    """At each query, the ``linear`` fit of its nearest measured points (log distance):
    outside the points' hull a local trend extrapolates better than a global one."""
    logs = np.log(points)
    floor = float(values.min()) * 1e-3
    out = np.empty(len(queries))
    for i, query in enumerate(queries):
        nearest = np.argsort(np.linalg.norm(logs - np.log(query), axis=1))[:_NEIGHBOURS]
        coefficients = _linear_coefficients(points[nearest], values[nearest])
        out[i] = max(float((_basis(query[None, :]) @ coefficients)[0]), floor)
    return out


def _tree_regressor(kind: str, seed: int) -> Any:
    from sklearn.ensemble import GradientBoostingRegressor, RandomForestRegressor

    if kind == "random_forest":
        return RandomForestRegressor(n_estimators=32, random_state=seed)
    return GradientBoostingRegressor(
        n_estimators=150, learning_rate=0.1, max_depth=3, random_state=seed
    )


def _fitted(kind: str) -> Callable[[Array, Array, TrainingOptions], TableCost]:
    def fit(features: Array, times: Array, options: TrainingOptions) -> TableCost:
        regressor = _tree_regressor(kind, options.seed)
        regressor.fit(np.log(features), np.log(times))

        def predict(points: Array) -> Array:
            return np.asarray(np.exp(regressor.predict(np.log(points))), dtype=np.float64)

        return _tabulate(_grid_axes(features, options), predict)

    return fit


_FITTERS: Mapping[str, Callable[[Array, Array, TrainingOptions], TableCost]] = {
    "interpolation": _interpolation,
    "linear": _linear,
    "random_forest": _fitted("random_forest"),
    "gradient_boosting": _fitted("gradient_boosting"),
}


def table_predict(table: TableCost, features: Array) -> Array:
    """The table's time at each feature row (the same arithmetic Rust runs)."""
    names = ("x", "y")[: features.shape[1]]
    return np.array(
        [table.time(dict(zip(names, map(float, row), strict=True))) for row in features]
    )


def _cv_mape(kind: str, points: Array, times: Array, options: TrainingOptions) -> float:
    """Mean absolute percentage error on held-out points over ``folds`` seeded folds."""
    n = len(points)
    if n < 3:
        return float("inf") if kind != "interpolation" else 0.0
    folds = min(options.folds, n)
    order = np.random.default_rng(options.seed).permutation(n)
    errors = []
    for k in range(folds):
        test = order[k::folds]
        train = np.setdiff1d(order, test)
        table = _FITTERS[kind](points[train], times[train], options)
        predicted = table_predict(table, points[test])
        errors.append(np.abs(predicted - times[test]) / times[test])
    return float(np.mean(np.concatenate(errors)))


def _check_samples(samples: OpSamples) -> None:
    if len(samples) == 0 or np.any(samples.features <= 0) or np.any(samples.time_s <= 0):
        raise ConfigError(
            f"profile op {samples.op}: needs positive features and times to train on",
            field=f"profiles.{samples.op}",
            value=str(len(samples)),
        )


def fit_op(samples: OpSamples, options: TrainingOptions | None = None) -> OpFit:
    """Trains one operation's table with ``options.regressor`` (or the best of all)."""
    options = options or TrainingOptions()
    _check_samples(samples)
    kinds = REGRESSORS if options.regressor == "auto" else (options.regressor,)
    points, times = median_by_point(samples)
    scores = {kind: _cv_mape(kind, points, times, options) for kind in kinds}
    best = min(kinds, key=lambda kind: (scores[kind], kinds.index(kind)))
    return OpFit(samples.op, best, _FITTERS[best](points, times, options), scores)


def _place(table: TableCost, op: str, bytes_per_token: float) -> TableCost:
    """The trained table on the simulator's features (bytes become tokens for comms)."""
    x, y = _AXES.get(op, ("num_tokens", None))
    xs = table.xs
    if op in ("all_reduce", "send_recv"):
        xs = tuple(v / bytes_per_token for v in xs)
    return dataclasses.replace(table, x=x, y=y, xs=xs)


def default_cache_dir() -> Path:
    configured = os.environ.get("TOKENYARD_CACHE_DIR")
    root = Path(configured) if configured else Path.home() / ".cache" / "tokenyard"
    return root / "predictors"


def _cache_key(
    profiles: ProfileSet, base: CompiledPredictor, options: TrainingOptions, bytes_per_token: float
) -> str:
    payload = json.dumps(
        {
            "version": CACHE_VERSION,
            "profiles": profiles.digest(),
            "base": base.to_core(),
            "options": dataclasses.asdict(options),
            "bytes_per_token": bytes_per_token,
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def profiled_predictor(
    profiles: ProfileSet,
    base: CompiledPredictor,
    *,
    hidden_size: int,
    activation_bytes: float = 2.0,
    options: TrainingOptions | None = None,
    cache_dir: Path | None = None,
) -> CompiledPredictor:
    """``base`` (a roofline of the same model and layout) with every operation the profiles
    cover replaced by its trained table. Cached under ``cache_dir`` (default
    ``$TOKENYARD_CACHE_DIR/predictors`` or ``~/.cache/tokenyard/predictors``)."""
    options = options or TrainingOptions()
    options.check("execution.profiled")
    cache_dir = cache_dir or default_cache_dir()
    bytes_per_token = hidden_size * activation_bytes
    path = cache_dir / f"{_cache_key(profiles, base, options, bytes_per_token)}.json"
    if path.exists():
        try:
            return CompiledPredictor.load(path)
        except ConfigError:  # unreadable (a crash mid-write elsewhere): train again
            path.unlink(missing_ok=True)
    ops = []
    fits = {}
    for op in base.ops:
        samples = profiles.ops.get(op.name)
        if samples is None:
            ops.append(op)
            continue
        fit = fit_op(samples, options)
        fits[op.name] = {"regressor": fit.regressor, "cv_mape": dict(fit.cv_mape)}
        table = _place(fit.table, op.name, bytes_per_token)
        ops.append(dataclasses.replace(op, cost=table, source=f"profile:{fit.regressor}"))
    description = {
        **base.description,
        "kind": "profiled",
        "profiles": list(profiles.sources),
        "profile_digest": profiles.digest(),
        "fits": fits,
    }
    predictor = dataclasses.replace(base, ops=tuple(ops), description=description)
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    predictor.save(partial)
    partial.replace(path)
    return predictor
