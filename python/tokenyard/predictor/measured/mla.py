"""Measured MLA attention (DeepSeek-V2/V3, Kimi-K2) and its DSA sparse form (DeepSeek-V3.2,
GLM-5): the whole measured module where the tables hold this model's shape, else the
projections from the GEMM rows, the absorbed-decode BMMs from ``mla_bmm`` and the
attention itself on the calibrated roofline, each with its reason."""

from __future__ import annotations

from pathlib import Path

from tokenyard import catalog
from tokenyard.catalog import ModelSpec
from tokenyard.errors import ConfigError
from tokenyard.predictor import grids
from tokenyard.predictor.measured.data import MeasuredSource, _version_key, _versions
from tokenyard.predictor.measured.lookup import (
    TABLE_DTYPES,
    Entry,
    gemm_table,
    prefill_seconds,
    present,
    read,
)
from tokenyard.predictor.measured.ops import (
    GemmTimes,
    MlaBmmTimes,
    MlaModuleTimes,
    NotMeasured,
    StaticFp8GemmTimes,
)
from tokenyard.predictor.measured.tables import Columns

#: Operations of the roofline's MLA attention that one measured MLA module row includes.
MLA_MODULE_OPS = (
    "qkv_a_proj",
    "latent_norm",
    "q_b_proj",
    "rope",
    "kv_store",
    "kv_b_proj",
    "mla_bmm_pre",
    "mla_bmm_post",
    "o_proj",
)
#: The MLA dims vLLM's MLA BMM collector measures (DeepSeek-V3's: qk_nope, kv_lora, v).
_MLA_BMM_DIMS = (128, 512, 128)


def _mla_gemm_shapes(model: ModelSpec, tp: int) -> dict[str, tuple[int, int, str]]:
    """The MLA projections on one TP rank: op -> (n, k, the feature of its rows)."""
    mla = model.mla
    if mla is None:
        return {}
    h, n = model.hidden_size, model.num_heads // tp
    return {
        "qkv_a_proj": (mla.q_lora_rank + mla.latent_dim, h, "num_tokens"),
        "q_b_proj": (n * mla.qk_head_dim, mla.q_lora_rank or h, "num_tokens"),
        "kv_b_proj": (
            n * (mla.qk_nope_head_dim + mla.v_head_dim),
            mla.kv_lora_rank,
            "num_prefill_tokens",
        ),
        "o_proj": (h, n * mla.v_head_dim, "num_tokens"),
        **(
            {
                "indexer_q_proj": (
                    model.indexer.num_heads * model.indexer.head_dim,
                    mla.q_lora_rank or h,
                    "num_tokens",
                ),
                "indexer_k_proj": (
                    model.indexer.head_dim + model.indexer.num_heads,
                    h,
                    "num_tokens",
                ),
            }
            if model.indexer is not None
            else {}
        ),
    }


def _module_model(rows: Columns, model: ModelSpec) -> tuple[str, str]:
    """The ``model`` of the MLA module rows whose config has ``model``'s shape (hidden
    size and MLA dims; the head count is a column), or ("", why none has)."""
    mine = (model.hidden_size, model.mla, model.indexer)
    seen = []
    for name in rows.values("model"):
        try:
            measured = catalog.model(str(name), field="execution.measured")
        except ConfigError:
            seen.append(f"{name} (its config is not known here)")
            continue
        if (measured.hidden_size, measured.mla, measured.indexer) == mine:
            return str(name), ""
        seen.append(f"{name} (hidden {measured.hidden_size}, {measured.mla})")
    return "", (
        f"{rows.path} measures the MLA module of {', '.join(seen)}, not {model.name}'s shape "
        f"(hidden {model.hidden_size}, {model.mla})"
    )


def mla_ops(
    source: MeasuredSource,
    model: ModelSpec,
    tp: int,
    kv_dtype: str,
    gemm_type: str,
    gemm: GemmTimes | StaticFp8GemmTimes,
    gemm_label: str,
) -> tuple[dict[str, Entry], str]:
    """MLA attention: the measured module (one row = one layer's whole attention at one
    TP rank's heads) for prefill chunks and for decodes, where the tables measure this
    model's shape, GEMM family and KV dtype; else the projections from the GEMM table,
    the absorbed-decode BMMs from ``mla_bmm`` (at DeepSeek-V3's dims) and the attention
    itself from the calibrated roofline, each with its reason. Also the banner's words."""
    heads = model.num_heads // tp
    why = _mla_module_why(source, model)
    dsa = _dsa_folder(source) if model.indexer is not None else None
    table = "dsa" if model.indexer is not None else "mla"
    if not why:
        folder = dsa or source.folders["mla"]
        context_rows = read(source, folder / f"{table}_context_module_perf.parquet")
        generation_rows = read(source, folder / f"{table}_generation_module_perf.parquet")
        name, why = _module_model(context_rows, model)
    if not why:
        kv_name = TABLE_DTYPES.get(kv_dtype, kv_dtype)
        layout = dict(num_heads=heads, kv_cache_dtype=kv_name, gemm_type=gemm_type)
        try:
            context = MlaModuleTimes(context_rows.where(model=name), generation=False, **layout)  # type: ignore[arg-type]
            generation = MlaModuleTimes(
                generation_rows.where(model=name),
                generation=True,
                **layout,  # type: ignore[arg-type]
            )
        except NotMeasured as exc:
            why = str(exc)
    if not why:
        label = f"measured:{table}_module ({(dsa or source.folders['mla']).name})"
        out: dict[str, Entry] = {
            "attn_prefill": (grids.prefill_attention_table(prefill_seconds(context)), label, ""),
            "attn_decode": (grids.decode_attention_table(generation), label, ""),
        }
        inside = f"in the measured {table.upper()} module ({label})"
        for op in MLA_MODULE_OPS + (DSA_MODULE_OPS if dsa else ()):
            out[op] = (None, "dropped", inside)
        kind = "DSA module" if dsa else "module"
        return out, f"{kind} ({gemm_type}, KV {kv_name}, {heads} heads per GPU)"
    out = {
        op: (gemm_table(gemm, n, k, feature, quantized_input=op == "o_proj"), gemm_label, "")
        for op, (n, k, feature) in _mla_gemm_shapes(model, tp).items()
    }
    out["attn_prefill"] = (None, "calibrated", why)
    out["attn_decode"] = (None, "calibrated", why)
    if model.indexer is not None:
        for op in ("indexer_prefill", "indexer_decode", "indexer_k_store"):
            out[op] = (None, "calibrated", why)
    bmm = "calibrated"
    mla = model.mla
    dims = (mla.qk_nope_head_dim, mla.kv_lora_rank, mla.v_head_dim) if mla else ()
    bmm_path = source.folders.get("mla_bmm", Path()) / "mla_bmm_perf.parquet"
    if dims == _MLA_BMM_DIMS and "mla_bmm" in source.folders and present(bmm_path):
        rows = read(source, bmm_path)
        label = f"measured:mla_bmm ({bmm_path.parent.name})"
        for op, name in (("mla_bmm_pre", "mla_gen_pre"), ("mla_bmm_post", "mla_gen_post")):
            try:
                times = MlaBmmTimes(rows, op_name=name, num_heads=heads)
            except NotMeasured as exc:
                out[op] = (None, "calibrated", str(exc))
                continue
            out[op] = (grids.token_table("num_decode_tokens", times, 2.0**17), label, "")
            bmm = "mla_bmm"
    else:
        for op in ("mla_bmm_pre", "mla_bmm_post"):
            out[op] = (None, "calibrated", f"no MLA BMM table measures dims {dims}")
    return out, f"GEMMs + {bmm} BMMs + calibrated attention"


#: The indexer's operations, inside a measured DSA module row (aiconfigurator's
#: ``ContextDSAModule`` / ``GenerationDSAModule``: wq_b, weights_proj, FP8 MQA logits,
#: top-k, then the sparse MLA).
DSA_MODULE_OPS = (
    "indexer_q_proj",
    "indexer_k_proj",
    "indexer_k_store",
    "indexer_prefill",
    "indexer_decode",
)


def _dsa_folder(source: MeasuredSource) -> Path | None:
    """The ``sparse_attention`` tables beside ``source``'s (the newest version at or
    below its own), None if its framework has none."""
    found = [
        v
        for v in _versions(source.root, source.system, "sparse_attention", source.framework)
        if _version_key(v) <= _version_key(source.version)
    ]
    if not found:
        return None
    return source.root / source.system / "sparse_attention" / source.framework / found[-1]


def _mla_module_why(source: MeasuredSource, model: ModelSpec) -> str:
    if model.indexer is not None:
        folder = _dsa_folder(source)
        names = ("dsa_context_module_perf.parquet", "dsa_generation_module_perf.parquet")
        if folder is None or not all(present(folder / n) for n in names):
            return (
                f"no sparse_attention (DSA module) tables for {source.system}/"
                f"{source.framework} at or below {source.version}; sparse MLA and the indexer "
                "priced by the calibrated roofline"
            )
        return ""
    folder = source.folders.get("mla")
    names = ("mla_context_module_perf.parquet", "mla_generation_module_perf.parquet")
    if folder is None or not all(present(folder / n) for n in names):
        return f"no MLA module tables for {source.system}/{source.framework}"
    return ""
