"""The expert all-to-all of an EP group wider than one node, from DeepEP's inter-node
tables (``comm/sglang/<version>/wideep_deepep_{ll,normal}_perf.parquet``).

The framework's own ``moe_a2a`` table measures one node (vLLM 0.24.0: EP 8, ``node_num``
1). DeepEP's kernels are one library whichever engine calls them (vLLM's
``deepep_low_latency`` / ``deepep_high_throughput`` all2all backends and SGLang's
``--deepep-mode`` run the same ``Buffer.low_latency_dispatch`` / ``Buffer.dispatch``), so
across nodes tokenyard prices them from the tables aiconfigurator-core collected under
SGLang, which measure 2, 4 and 8 nodes (H100 and H200, SGLang 0.5.6.post2), and says so.

Schemas (one row per tokens-per-GPU count, ``num_token``; times in microseconds):

- ``wideep_deepep_ll_perf``: ``node_num, hidden_size, num_topk, num_experts, num_token,
  dispatch_avg_t_us, combine_avg_t_us`` (low latency, decode-sized steps);
- ``wideep_deepep_normal_perf``: also ``dispatch_sms``, ``dispatch_transmit_us,
  dispatch_notify_us, combine_transmit_us, combine_notify_us`` (high throughput); the rows
  at vLLM's SM count (``WIDE_EP_SMS``) are read, a phase's time transmit + notify.

A table whose node count, hidden size and top-k match but not the expert count is read at
the nearest measured expert count (DeepEP sends ``tokens x top-k x hidden`` values; the
count only changes which GPU receives them: 256 and 288 experts differ by under 5% in
the H200 rows), and the banner says which.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokenyard.catalog import ModelSpec
from tokenyard.predictor.measured.data import MeasuredSource, _version_key, _versions
from tokenyard.predictor.measured.interpolate import Curve
from tokenyard.predictor.measured.tables import table_error

#: vLLM 0.33's DeepEP high-throughput kernels run on 20 SMs (``device_communicators/
#: all2all.py``, ``DeepEPAll2AllManagerBase``: ``self.num_sms = 20``, which
#: ``DeepEPHTAll2AllManager`` passes to DeepEP); vLLM 0.24.0's own ``moe_a2a`` rows record
#: ``sms = 20`` too.
WIDE_EP_SMS = 20
#: Where the inter-node tables live: DeepEP collected under this framework.
WIDE_EP_FRAMEWORK = "sglang"
LL_TABLE = "wideep_deepep_ll_perf.parquet"
NORMAL_TABLE = "wideep_deepep_normal_perf.parquet"


@dataclass(frozen=True)
class WideEp:
    """Seconds of each phase by the tokens each GPU sends, low-latency and normal mode."""

    low: dict[str, Curve]
    high: dict[str, Curve]
    low_max_tokens: float
    words: str  # where from, for the banner

    def seconds(self, phase: str, tokens_per_gpu: float) -> float:
        """Low latency up to its largest measured count, normal mode above (DeepEP's
        low-latency buffers are sized for decode batches)."""
        if tokens_per_gpu <= self.low_max_tokens:
            return self.low[phase](max(tokens_per_gpu, 1.0))
        return self.high[phase](tokens_per_gpu)


def wide_ep(source: MeasuredSource, model: ModelSpec, nodes: int) -> tuple[WideEp | None, str]:
    """DeepEP over ``nodes`` nodes at ``model``'s hidden size and top-k from the newest
    inter-node tables beside ``source`` that measure them, or (None, why none does).

    Raises:
        ProfileError: a table that is unreadable or lacks a column it needs.
    """
    folder = source.root / source.system / "comm" / WIDE_EP_FRAMEWORK
    seen = []
    for version in sorted(
        _versions(source.root, source.system, "comm", WIDE_EP_FRAMEWORK),
        key=_version_key,
        reverse=True,
    ):
        ll, normal = folder / version / LL_TABLE, folder / version / NORMAL_TABLE
        if not (ll.is_file() and normal.is_file()):
            continue
        low_rows = _read(source, ll, ("dispatch_avg_t_us", "combine_avg_t_us"))
        high_rows = _read(
            source,
            normal,
            (
                "dispatch_sms",
                "dispatch_transmit_us",
                "dispatch_notify_us",
                "combine_transmit_us",
                "combine_notify_us",
            ),
        )
        high_rows = {k: v[high_rows["dispatch_sms"] == WIDE_EP_SMS] for k, v in high_rows.items()}
        low_key, high_key = _pick(low_rows, model, nodes), _pick(high_rows, model, nodes)
        seen.append(f"{version} ({_measured(low_rows)})")
        if low_key is None or high_key is None:
            continue
        shape = (float(nodes), float(model.hidden_size), float(model.experts_per_token))
        low = {
            phase: _curve(low_rows, (*shape, low_key), (f"{phase}_avg_t_us",))
            for phase in ("dispatch", "combine")
        }
        high = {
            phase: _curve(
                high_rows, (*shape, high_key), (f"{phase}_transmit_us", f"{phase}_notify_us")
            )
            for phase in ("dispatch", "combine")
        }
        experts = "" if low_key == model.num_experts else f" at {low_key:g} experts (nearest)"
        words = (
            f"DeepEP over {nodes} nodes from {WIDE_EP_FRAMEWORK} {version}'s wideep_deepep "
            f"tables{experts}: low latency up to {low['dispatch'].xs[-1]:g} tokens per GPU, "
            f"normal ({WIDE_EP_SMS} SMs) above"
        )
        return WideEp(low, high, low["dispatch"].xs[-1], words), ""
    return None, (
        f"no DeepEP inter-node table ({folder}/*/{LL_TABLE}, {NORMAL_TABLE}) measures "
        f"{nodes} nodes at hidden {model.hidden_size}, top-{model.experts_per_token}; "
        f"measured: {'; '.join(seen) or 'none'}"
    )


def _read(source: MeasuredSource, path: Path, times: tuple[str, ...]) -> dict[str, np.ndarray]:
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    needed = ("node_num", "hidden_size", "num_topk", "num_experts", "num_token", *times)
    try:
        table = pq.ParquetFile(path).read(columns=list(needed))
    except (OSError, pa.ArrowException, KeyError) as exc:
        raise table_error(source.field, path, None, f"cannot read {needed} ({exc})") from None
    out = {}
    for name in needed:
        values = np.asarray(table.column(name).to_pylist(), dtype=float)
        if not np.all(np.isfinite(values)) or (values < 0).any():
            raise table_error(source.field, path, name, "must hold finite numbers >= 0")
        out[name] = values
    return out


def _pick(rows: dict[str, np.ndarray], model: ModelSpec, nodes: int) -> float | None:
    """The expert count to read: the model's, else the nearest measured at its node
    count, hidden size and top-k (None where none is)."""
    mask = (
        (rows["node_num"] == nodes)
        & (rows["hidden_size"] == model.hidden_size)
        & (rows["num_topk"] == model.experts_per_token)
    )
    counts = sorted(set(rows["num_experts"][mask].tolist()))
    if not counts:
        return None
    return float(min(counts, key=lambda c: (abs(math.log(c / model.num_experts)), c)))


def _curve(rows: dict[str, np.ndarray], key: tuple[float, ...], times: tuple[str, ...]) -> Curve:
    """Seconds by tokens per GPU at ``key`` (nodes, hidden size, top-k, experts: the rows
    ``_pick`` chose), the mean of any repeated count."""
    mask = np.ones(len(rows["num_token"]), dtype=bool)
    for name, value in zip(
        ("node_num", "hidden_size", "num_topk", "num_experts"), key, strict=True
    ):
        mask &= rows[name] == value
    tokens = rows["num_token"][mask]
    seconds = np.sum([rows[t][mask] for t in times], axis=0) * 1e-6
    xs = sorted(set(tokens.tolist()))
    ys = [float(np.mean(seconds[tokens == x])) for x in xs]
    return Curve(xs, [max(y, 1e-9) for y in ys], log_log=True)


def _measured(rows: dict[str, np.ndarray]) -> str:
    """The (nodes, hidden, top-k, experts) a table measures, for the error."""
    names = ("node_num", "hidden_size", "num_topk", "num_experts")
    keys = zip(*(rows[n] for n in names), strict=True)
    return ", ".join(f"{n:g} nodes h{h:g} top-{k:g} E{e:g}" for n, h, k, e in sorted(set(keys)))
