"""The compiled form of a predictor: what the simulator evaluates in Rust.

A batch stage's time is the sum over operations of ``runs x count x cost`` plus the CPU
overheads, where an operation's cost is a roofline (``max(FLOPs / rate, bytes / bandwidth)
+ latency``, FLOPs and bytes linear in the batch's features) or a table interpolated over
one or two features. :meth:`CompiledPredictor.to_core` hands the arrays to Rust
(``rust/core/src/sim/exec/ops.rs``); calling the object evaluates the same arithmetic in
Python, in the same order, so the simulator's slow path gives identical times.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from tokenyard.errors import ConfigError

__all__ = [
    "FEATURES",
    "SCOPES",
    "BatchFeatures",
    "CompiledOp",
    "CompiledPredictor",
    "RooflineCost",
    "TableCost",
    "batch_features",
]

#: The features an operation's cost may depend on (``Feature`` in Rust, same order).
FEATURES = (
    "one",
    "num_tokens",
    "num_prefill_tokens",
    "num_decode_tokens",
    "num_requests",
    "prefill_attention_pairs",
    "decode_attention_keys",
    "prefill_mean_context",
    "decode_mean_context",
    "num_lora_tokens",
    "num_lora_adapters",
    "decode_sequences",
)
SCOPES = ("layer", "first_stage", "last_stage", "between_stages", "every_stage")
Scope = Literal["layer", "first_stage", "last_stage", "between_stages", "every_stage"]
BatchFeatures = dict[str, float]


def batch_features(
    *,
    num_requests: int,
    num_prefill_tokens: int,
    num_decode_tokens: int,
    sum_decode_context: int,
    sum_prefill_context: int,
    sum_prefill_squared: int,
    num_padding_rows: int,
    num_lora_tokens: int = 0,
    num_lora_adapters: int = 0,
    num_spec_decode_tokens: int = 0,
) -> BatchFeatures:
    """The features of a batch shape (``Features::of`` in Rust). ``num_spec_decode_tokens``:
    speculative drafts among the decode tokens (GEMM rows, but no attention sequences of
    their own: docs/speculative.md)."""
    prefill = float(num_prefill_tokens)
    decode = float(num_decode_tokens)
    pairs = float(sum_prefill_context) - (float(sum_prefill_squared) - prefill) / 2.0
    keys = float(sum_decode_context + num_decode_tokens)
    sequences = float(num_decode_tokens - num_spec_decode_tokens)
    return {
        "one": 1.0,
        "num_tokens": float(num_prefill_tokens + num_decode_tokens + num_padding_rows),
        "num_prefill_tokens": prefill,
        "num_decode_tokens": decode,
        "num_requests": float(num_requests),
        "prefill_attention_pairs": pairs,
        "decode_attention_keys": keys,
        "prefill_mean_context": pairs / prefill if prefill > 0 else 0.0,
        "decode_mean_context": keys / sequences if sequences > 0 else 0.0,
        "num_lora_tokens": float(num_lora_tokens),
        "num_lora_adapters": float(num_lora_adapters),
        "decode_sequences": sequences,
    }


@dataclasses.dataclass(frozen=True)
class RooflineCost:
    """``max(Σ flops[f]·f / flops_per_s, Σ bytes[f]·f / bytes_per_s) + latency_s``."""

    flops: Mapping[str, float]
    bytes: Mapping[str, float]
    flops_per_s: float
    bytes_per_s: float
    latency_s: float = 0.0

    def time(self, features: BatchFeatures) -> float:
        # Rust's order exactly (``Roofline::new``): non-zero terms in feature order, each
        # coefficient divided by its rate first, so both give identical times.
        compute = 0.0
        memory = 0.0
        for name in FEATURES:
            coefficient = self.flops.get(name, 0.0)
            if coefficient != 0.0:
                compute += coefficient / self.flops_per_s * features[name]
        for name in FEATURES:
            coefficient = self.bytes.get(name, 0.0)
            if coefficient != 0.0:
                memory += coefficient / self.bytes_per_s * features[name]
        return max(compute, memory) + self.latency_s

    def to_core(self) -> dict[str, Any]:
        return {
            "kind": "roofline",
            "flops": dict(self.flops),
            "bytes": dict(self.bytes),
            "flops_per_s": self.flops_per_s,
            "bytes_per_s": self.bytes_per_s,
            "latency_s": self.latency_s,
        }


def _locate(axis: Sequence[float], value: float) -> tuple[int, int, float]:
    if len(axis) == 1 or value <= axis[0]:
        return 0, 0, 0.0
    j = min(bisect.bisect_left(axis, value), len(axis) - 1)
    i = j - 1
    return i, j, (value - axis[i]) / (axis[j] - axis[i])


def _lerp(a: float, b: float, w: float) -> float:
    return a + (b - a) * w


@dataclasses.dataclass(frozen=True)
class TableCost:
    """Seconds on a grid over feature ``x`` (and ``y``), interpolated linearly; the edge
    value below the grid; above it the last segment extended, never below the edge."""

    x: str
    xs: tuple[float, ...]
    values: tuple[float, ...]  # row-major: values[ix * len(ys) + iy]
    y: str | None = None
    ys: tuple[float, ...] = ()

    def time(self, features: BatchFeatures) -> float:
        xi, xj, wx = _locate(self.xs, features[self.x])
        v = self.values
        if self.y is None:
            return max(_lerp(v[xi], v[xj], wx), _lerp(v[xi], v[xj], min(wx, 1.0)))
        yi, yj, wy = _locate(self.ys, features[self.y])
        ny = len(self.ys)

        def at(wx: float, wy: float) -> float:
            low = _lerp(v[xi * ny + yi], v[xi * ny + yj], wy)
            high = _lerp(v[xj * ny + yi], v[xj * ny + yj], wy)
            return _lerp(low, high, wx)

        return max(at(wx, wy), at(min(wx, 1.0), min(wy, 1.0)))

    def to_core(self) -> dict[str, Any]:
        return {
            "kind": "table",
            "x": self.x,
            "y": self.y,
            "xs": list(self.xs),
            "ys": list(self.ys),
            "values": list(self.values),
        }


Cost = RooflineCost | TableCost


@dataclasses.dataclass(frozen=True)
class CompiledOp:
    """One operation: ``count`` runs per ``scope``, skipped when feature ``gate`` is 0.
    ``source`` says where its cost came from (``roofline``, ``profile:<regressor>``)."""

    name: str
    scope: Scope
    gate: str
    cost: Cost
    count: float = 1.0
    source: str = "roofline"

    def runs(self, stage: int, num_stages: int, num_layers: int) -> float:
        last = stage + 1 == num_stages
        return {
            "layer": num_layers / num_stages,
            "first_stage": float(stage == 0),
            "last_stage": float(last),
            "between_stages": float(not last),
            "every_stage": 1.0,
        }[self.scope]


@dataclasses.dataclass(frozen=True)
class CompiledPredictor:
    """A predictor ready for the simulator: ``to_core()`` for Rust, or call it (the Python
    slow path, with the keyword arguments the simulator passes) for the same times."""

    ops: tuple[CompiledOp, ...]
    num_layers: int
    cpu_overhead_s: float
    description: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def op_times(
        self, features: BatchFeatures, stage: int = 0, num_stages: int = 1
    ) -> dict[str, float]:
        """Seconds per operation on ``stage`` (operations with one name are summed)."""
        times: dict[str, float] = {}
        for op in self.ops:
            times[op.name] = times.get(op.name, 0.0) + self._op_time(
                op, features, stage, num_stages
            )
        return times

    def _op_time(
        self, op: CompiledOp, features: BatchFeatures, stage: int, num_stages: int
    ) -> float:
        runs = op.runs(stage, num_stages, self.num_layers)
        if runs == 0.0 or features[op.gate] == 0.0:
            return 0.0
        return runs * op.count * op.cost.time(features)

    def stage_time(
        self, features: BatchFeatures, stage: int = 0, num_stages: int = 1
    ) -> tuple[float, float]:
        """``(total_s, model_s)`` of a batch stage."""
        model_s = 0.0
        for op in self.ops:
            model_s += self._op_time(op, features, stage, num_stages)
        return model_s + self.cpu_overhead_s, model_s

    def __call__(self, *, stage: int, num_stages: int, **shape: int) -> tuple[float, float]:
        return self.stage_time(batch_features(**shape), stage, num_stages)

    def to_core(self) -> dict[str, Any]:
        return {
            "num_layers": self.num_layers,
            "cpu_overhead_s": self.cpu_overhead_s,
            "ops": [
                {
                    "name": op.name,
                    "scope": op.scope,
                    "count": op.count,
                    "gate": op.gate,
                    **op.cost.to_core(),
                }
                for op in self.ops
            ],
        }

    def fused(self, num_stages: int | None = None) -> CompiledPredictor:
        """The same predictor with fewer lookups, which is what ``simulate`` hands to Rust.

        Operations of one scope, gated on the single feature ``x`` their cost depends on, are
        piecewise linear in it: a one-feature table between its points, a roofline on ``1``
        and ``x`` on either side of where compute and memory cross. Their sum (counts
        folded in) is piecewise linear on the union of those breakpoints, so one table there
        gives the same times up to rounding: a layer's dozen per-token operations become one
        lookup. Tables whose last segment falls stay apart (above the grid each holds its
        edge value, which a sum cannot express). Breakdowns by operation need the unfused
        predictor.

        With ``num_stages=1`` every operation runs on the one stage: the layers' count folds
        into the operation, so the embedding joins the layers' table too."""
        groups: dict[tuple[Scope, str, str], list[CompiledOp]] = {}
        kept: list[CompiledOp] = []
        ops = self.ops
        if num_stages == 1:
            ops = tuple(
                dataclasses.replace(
                    op, scope="every_stage", count=op.count * op.runs(0, 1, self.num_layers)
                )
                for op in ops
            )
        for op in ops:
            x = _single_feature(op.cost)
            if x is None or x != op.gate:  # gated on x, a running op has x >= 1
                kept.append(op)
            else:
                groups.setdefault((op.scope, op.gate, x), []).append(op)
        for (scope, gate, x), members in groups.items():
            if len(members) == 1:
                kept.append(members[0])
                continue
            bends = (b for op in members for b in _breakpoints(op.cost) if b > 1.0)
            xs = sorted({1.0, *bends})
            xs.append(2.0 * xs[-1])  # a point past the last bend: the line beyond is exact

            def total(value: float, members: list[CompiledOp] = members, x: str = x) -> float:
                features = {**dict.fromkeys(FEATURES, 0.0), "one": 1.0, x: value}
                return sum(op.count * op.cost.time(features) for op in members)

            table = TableCost(x=x, xs=tuple(xs), values=tuple(total(v) for v in xs))
            name = "+".join(op.name for op in members)
            kept.append(CompiledOp(name, scope, gate, table, 1.0, "fused"))
        return dataclasses.replace(self, ops=tuple(kept))

    def save(self, path: str | Path) -> None:
        data = {**self.to_core(), "description": dict(self.description)}
        for op, entry in zip(self.ops, data["ops"], strict=True):
            entry["source"] = op.source
        Path(path).write_text(json.dumps(data, indent=1, sort_keys=True))

    @classmethod
    def load(cls, path: str | Path) -> CompiledPredictor:
        try:
            data = json.loads(Path(path).read_text())
            return cls(
                ops=tuple(_op_from_dict(d) for d in data["ops"]),
                num_layers=int(data["num_layers"]),
                cpu_overhead_s=float(data["cpu_overhead_s"]),
                description=data.get("description", {}),
            )
        except (KeyError, TypeError, ValueError, OSError) as err:
            raise ConfigError(
                f"{path}: not a compiled predictor ({err!r})", field="execution", value=str(path)
            ) from err


def _single_feature(cost: Cost) -> str | None:
    """The one feature ``cost`` depends on, if it is piecewise linear in it with known bends
    and rises past the last one; else None."""
    if isinstance(cost, TableCost):
        if cost.y is not None or (len(cost.values) > 1 and cost.values[-1] < cost.values[-2]):
            return None
        return cost.x
    names = {n for n, c in (*cost.flops.items(), *cost.bytes.items()) if c != 0.0} - {"one"}
    return names.pop() if len(names) == 1 else None


def _breakpoints(cost: Cost) -> tuple[float, ...]:
    if isinstance(cost, TableCost):
        return cost.xs
    # Compute (d + a x) meets memory (e + c x) at x = (e - d) / (a - c), in seconds.
    (x,) = {n for n, c in (*cost.flops.items(), *cost.bytes.items()) if c != 0.0} - {"one"}
    a = cost.flops.get(x, 0.0) / cost.flops_per_s
    c = cost.bytes.get(x, 0.0) / cost.bytes_per_s
    b = (
        cost.bytes.get("one", 0.0) / cost.bytes_per_s
        - cost.flops.get("one", 0.0) / cost.flops_per_s
    )
    return (b / (a - c),) if a != c and b / (a - c) > 0 else ()


def _op_from_dict(d: Mapping[str, Any]) -> CompiledOp:
    cost: Cost
    if d["kind"] == "roofline":
        cost = RooflineCost(
            flops=d["flops"],
            bytes=d["bytes"],
            flops_per_s=d["flops_per_s"],
            bytes_per_s=d["bytes_per_s"],
            latency_s=d["latency_s"],
        )
    else:
        cost = TableCost(
            x=d["x"],
            xs=tuple(d["xs"]),
            values=tuple(d["values"]),
            y=d["y"],
            ys=tuple(d["ys"]),
        )
    return CompiledOp(
        name=d["name"],
        scope=d["scope"],
        gate=d["gate"],
        cost=cost,
        count=d["count"],
        source=d.get("source", "roofline"),
    )
