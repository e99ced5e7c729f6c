"""KV bytes per token per GPU: vLLM 0.33's own per-layer KV cache specs against tokenyard's
memory planner, for the bundled configs of the models the catalog docs name.

For each model the per-layer specs are built the way vLLM's model code builds them, from the
HF ``config.json`` alone (no weights, no GPU), with vLLM's spec classes
(``vllm/v1/kv_cache_interface.py``): ``FullAttentionSpec`` / ``SlidingWindowSpec``
(``Attention.get_kv_cache_spec``, ``model_executor/layers/attention/attention.py``),
``ChunkedLocalAttentionSpec`` (``layers/attention/chunked_local_attention.py``),
``MLAAttentionSpec`` (``MLAAttention.get_kv_cache_spec``, ``layers/attention/mla_attention.py``;
``num_kv_heads=1``, ``head_size = kv_lora_rank + qk_rope_head_dim``, ``fp8_ds_mla`` 656-byte
rows for sparse MLA under a quantized KV dtype), DSA's indexer ``MLAAttentionSpec``
(``DeepseekV32IndexerCache``, ``models/deepseek_v2.py``: ``index_head_dim + index_head_dim //
128 * 4`` uint8) and ``MambaSpec`` (shapes and dtypes from ``MambaStateShapeCalculator`` /
``MambaStateDtypeCalculator``, ``layers/mamba/mamba_utils.py``, as ``qwen3_5.py`` and
``nemotron_h.py`` call them). Per-layer KV heads are ``max(1, kv_heads // TP)`` as every model
file computes them.

With ``--disable-hybrid-kv-cache-manager`` vLLM runs ``unify_hybrid_kv_cache_specs``
(``v1/core/kv_cache_planning.py``) on the specs, promoting sliding and chunked layers to full
attention; bytes per token are then the sum over layers of ``page_size_bytes / block_size``
(Mamba layers keep a per-request state page instead). Without it, the layers are grouped by
vLLM's own ``get_kv_cache_groups`` (with a stub config: layout ``LBNHC``, no HiSparse); the
"hybrid" column is what one request of ``--request-tokens`` holds in decode (a sliding group
its window plus a block, a chunked group its chunk plus a block: vLLM's
``max_admission_blocks_per_request`` with one in-flight token). The hybrid ``num_blocks``
columns size a 60 GiB pool: vLLM's own ``get_kv_cache_config_from_groups`` over those
groups against the simulator's ``simulation/hybrid_kv.vllm_kv_layout`` (what
``replica.hybrid_kv_cache_manager = true`` plans; it refuses what it does not model), with
the block size (vLLM's ``_align_hybrid_block_size`` beside Mamba layers) and, for the models
it plans with groups, what one request holds as ``blocks_per_request`` counts it.

    bash benches/peers/setup.sh    # once: .venv-bench with vLLM 0.33.0
    PYTHONPATH=python .venv-bench/bin/python benches/peers/vllm_kv_spec_diff.py \\
        [--request-tokens 32768] [--configs DIR]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import torch
from vllm.model_executor.layers.mamba.mamba_utils import (
    MambaStateDtypeCalculator,
    MambaStateShapeCalculator,
)
from vllm.utils.math_utils import cdiv
from vllm.v1.core import kv_cache_planning
from vllm.v1.kv_cache_interface import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    SparseCacheRole,
    get_kv_quant_mode,
)

from tokenyard.catalog import device as catalog_device
from tokenyard.catalog.hf import model_from_config
from tokenyard.simulation.planner import plan_memory

BLOCK_SIZE = 16
#: The KV memory both sides size a hybrid pool from (60 GiB).
HYBRID_POOL_BYTES = 60 * 2**30
TORCH_KV = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
VLLM_KV = {"bf16": "auto", "fp8": "fp8"}  # --kv-cache-dtype (auto: the bf16 model dtype)


@dataclass(frozen=True)
class Case:
    name: str
    repo: str  # bundled config: <repo with / as -->_config.json
    tp: int
    note: str = ""


CASES = (
    Case("DeepSeek-V3", "deepseek-ai/DeepSeek-V3", 8),
    Case("Kimi-K2", "moonshotai/Kimi-K2-Instruct", 8),
    Case("DeepSeek-V3.2", "deepseek-ai/DeepSeek-V3.2", 8),
    Case("gpt-oss-120b", "openai/gpt-oss-120b", 2),
    Case("gpt-oss-20b", "openai/gpt-oss-20b", 1),
    Case("Qwen3-235B-A22B-FP8", "Qwen/Qwen3-235B-A22B-FP8", 4),
    Case("Qwen3.5-35B-A3B", "Qwen/Qwen3.5-35B-A3B", 2),
    Case("Nemotron-3-Nano-30B-A3B", "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", 1),
    Case("Llama-4-Scout", "meta-llama/Llama-4-Scout-17B-16E-Instruct", 4),
    Case("gemma-4-26B-A4B", "google/gemma-4-26B-A4B", 1),
    Case("Qwen3-VL-8B", "Qwen/Qwen3-VL-8B-Instruct", 1),
    Case("Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-70B", 4),
)


# --- vLLM's per-layer specs, as each model file builds them -------------------------------


def _attn(kv_heads: int, head: int, tp: int, kv: str, **extra: Any) -> AttentionSpec:
    """``Attention.get_kv_cache_spec``: per-rank heads ``max(1, kv_heads // tp)``."""
    common = dict(
        num_kv_heads=max(1, kv_heads // tp),
        head_size=head,
        dtype=TORCH_KV[kv],
        kv_quant_mode=get_kv_quant_mode(VLLM_KV[kv]),
    )
    if "sliding_window" in extra:
        return SlidingWindowSpec(block_size=BLOCK_SIZE, **common, **extra)
    if "attention_chunk_size" in extra:
        return ChunkedLocalAttentionSpec(block_size=BLOCK_SIZE, **common, **extra)
    return FullAttentionSpec(block_size=BLOCK_SIZE, **common)


def _mla(cfg: dict, kv: str, sparse: bool) -> MLAAttentionSpec:
    """``MLAAttention.get_kv_cache_spec``; a sparse (DSA) layer on FLASHMLA_SPARSE (Hopper)
    serves any quantized dtype as ``fp8_ds_mla`` (``_canonicalize_sparse_mla_kv_cache_dtype``)."""
    cache_dtype = VLLM_KV[kv]
    if sparse and kv == "fp8":
        cache_dtype = "fp8_ds_mla"
    return MLAAttentionSpec(
        block_size=BLOCK_SIZE,
        num_kv_heads=1,
        max_tp_shards=1,
        head_size=cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"],
        dtype=TORCH_KV[kv],
        cache_dtype_str=cache_dtype,
        kv_quant_mode=get_kv_quant_mode(cache_dtype),
        state_content_bytes={"fp8_ds_mla": 656}.get(cache_dtype),
    )


def _indexer(cfg: dict) -> MLAAttentionSpec:
    """``DeepseekV32IndexerCache.get_kv_cache_spec``: fp8 key + fp32 scale per 128, uint8."""
    d = cfg["index_head_dim"]
    return MLAAttentionSpec(
        block_size=BLOCK_SIZE,
        num_kv_heads=1,
        max_tp_shards=1,
        head_size=d + d // 128 * 4,
        dtype=torch.uint8,
        cache_role=SparseCacheRole.INDEXER,
    )


def _mamba(shapes: Any, dtypes: Any) -> MambaSpec:
    return MambaSpec(block_size=BLOCK_SIZE, shapes=tuple(shapes), dtypes=tuple(dtypes))


def vllm_specs(raw: dict, tp: int, kv: str) -> dict[str, KVCacheSpec]:
    """Per-layer specs on one TP rank, keyed by vLLM's layer names (MTP layers left out:
    vLLM loads them only as a drafter)."""
    arch = raw["architectures"][0]
    cfg = raw.get("text_config", raw)
    n = cfg["num_hidden_layers"]
    specs: dict[str, KVCacheSpec] = {}
    if arch in ("DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM"):  # deepseek_v2.py
        sparse = "index_topk" in cfg
        for i in range(n):
            specs[f"layers.{i}.self_attn.attn"] = _mla(cfg, kv, sparse)
            if sparse:
                specs[f"layers.{i}.self_attn.indexer.k_cache"] = _indexer(cfg)
    elif arch == "GptOssForCausalLM":  # gpt_oss.py: sliding on even layers
        for i in range(n):
            extra = {"sliding_window": cfg["sliding_window"]} if i % 2 == 0 else {}
            specs[f"layers.{i}.attn"] = _attn(
                cfg["num_key_value_heads"], cfg["head_dim"], tp, kv, **extra
            )
    elif arch == "Llama4ForConditionalGeneration":  # llama4.py: NoPE layers global
        interval = cfg.get("no_rope_layer_interval", 4)
        nope = cfg.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(n)]
        for i in range(n):
            chunked = nope[i] != 0 and cfg.get("attention_chunk_size")
            extra = {"attention_chunk_size": cfg["attention_chunk_size"]} if chunked else {}
            specs[f"layers.{i}.attn"] = _attn(
                cfg["num_key_value_heads"], cfg["head_dim"], tp, kv, **extra
            )
    elif arch == "Gemma4ForConditionalGeneration":  # gemma4.py + transformers per_layer_config
        for i, kind in enumerate(cfg["layer_types"]):
            if kind == "sliding_attention":
                spec = _attn(
                    cfg["num_key_value_heads"],
                    cfg["head_dim"],
                    tp,
                    kv,
                    sliding_window=cfg["sliding_window"],
                )
            else:
                k_eq_v = cfg.get("attention_k_eq_v", True)
                heads = cfg.get("num_global_key_value_heads") if k_eq_v else None
                spec = _attn(heads or cfg["num_key_value_heads"], cfg["global_head_dim"], tp, kv)
            specs[f"layers.{i}.self_attn.attn"] = spec
    elif arch == "Qwen3_5MoeForConditionalGeneration":  # qwen3_5.py
        conv, ssm = MambaStateDtypeCalculator.gated_delta_net_state_dtype(
            torch.bfloat16, "auto", cfg.get("mamba_ssm_dtype", "auto")
        )
        shapes = MambaStateShapeCalculator.gated_delta_net_state_shape(
            tp,
            cfg["linear_num_key_heads"],
            cfg["linear_num_value_heads"],
            cfg["linear_key_head_dim"],
            cfg["linear_value_head_dim"],
            cfg["linear_conv_kernel_dim"],
        )
        for i, kind in enumerate(cfg["layer_types"]):
            if kind == "linear_attention":
                specs[f"layers.{i}.linear_attn"] = _mamba(shapes, (conv, ssm))
            else:
                specs[f"layers.{i}.self_attn.attn"] = _attn(
                    cfg["num_key_value_heads"], cfg["head_dim"], tp, kv
                )
    elif arch == "NemotronHForCausalLM":  # nemotron_h.py; ssm dtype from the config
        dtypes = MambaStateDtypeCalculator.mamba2_state_dtype(
            torch.bfloat16, "auto", cfg.get("mamba_ssm_cache_dtype", "float32")
        )
        shapes = MambaStateShapeCalculator.mamba2_state_shape(
            tp_world_size=tp,
            intermediate_size=cfg["mamba_num_heads"] * cfg["mamba_head_dim"],
            n_groups=cfg["n_groups"],
            num_heads=cfg["mamba_num_heads"],
            head_dim=cfg["mamba_head_dim"],
            state_size=cfg["ssm_state_size"],
            conv_kernel=cfg["conv_kernel"],
        )
        for i, c in enumerate(cfg["hybrid_override_pattern"]):
            if c == "M":
                specs[f"layers.{i}.mixer"] = _mamba(shapes, dtypes)
            elif c == "*":
                specs[f"layers.{i}.mixer.attn"] = _attn(
                    cfg["num_key_value_heads"], cfg["head_dim"], tp, kv
                )
    else:  # Llama, Qwen3(-MoE), Qwen3-VL's decoder: one full-attention layer each
        head = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        kv_heads = cfg.get("num_key_value_heads", cfg["num_attention_heads"])
        for i in range(n):
            specs[f"layers.{i}.self_attn.attn"] = _attn(kv_heads, head, tp, kv)
    return specs


# --- vLLM's arithmetic over the specs ---------------------------------------------------------


@dataclass
class VllmFigures:
    bytes_per_token: int  # disable-hybrid: every attention layer a full one
    state_bytes: int  # Mamba/GDN pages per request, unpadded
    state_bytes_padded: int  # the same, each page padded to the attention page
    attn_block_size: int  # vLLM's block size after hybrid alignment
    hybrid_request_bytes: int  # one request of N tokens under the hybrid allocator
    groups: str
    refused: str = ""  # vLLM's error for --disable-hybrid-kv-cache-manager, if any
    # get_kv_cache_config_from_groups over HYBRID_POOL_BYTES: its num_blocks, and groups
    hybrid_num_blocks: int = 0
    num_groups: int = 0
    # each group's block size (unify_kv_cache_spec_page_size grows the smaller pages')
    group_block_sizes: tuple[int, ...] = ()


def _align_block(specs: dict[str, KVCacheSpec]) -> tuple[int, int]:
    """``Platform._align_hybrid_block_size`` (``platforms/interface.py``): the attention
    block grows until one layer's page holds a Mamba page, which is padded to it. Kernel
    block alignment 16 (FLASH_ATTN on SM90)."""
    mamba = [s for s in specs.values() if isinstance(s, MambaSpec)]
    attn = [s for s in specs.values() if isinstance(s, AttentionSpec)]
    if not mamba or not attn:
        return BLOCK_SIZE, 0
    per_token = attn[0].page_size_bytes // attn[0].block_size
    page = max(s.page_size_bytes for s in mamba)
    block = max(BLOCK_SIZE, 16 * cdiv(page, 16 * per_token))
    return block, block * per_token


def _stub_config(request_tokens: int, disable_hybrid: bool) -> Any:
    from vllm.v1.kv_cache_layout import KVCacheLayout

    return SimpleNamespace(
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=disable_hybrid),
        attention_config=SimpleNamespace(hisparse_config=None),
        cache_config=SimpleNamespace(
            get_resolved_kv_cache_layout=lambda: KVCacheLayout.LBNHC,
            mamba_cache_mode="none",
            num_gpu_blocks_override=None,
            prefix_cache_retention_interval=None,
        ),
        model_config=SimpleNamespace(max_model_len=request_tokens),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
        max_in_flight_tokens=1,
    )


def vllm_figures(specs: dict[str, KVCacheSpec], request_tokens: int) -> VllmFigures:
    block, padded_page = _align_block(specs)
    if block != BLOCK_SIZE:
        specs = {
            k: dataclasses.replace(s, block_size=block)
            if isinstance(s, AttentionSpec)
            else dataclasses.replace(s, page_size_padded=padded_page)
            for k, s in specs.items()
        }
    unified = copy.copy(specs)
    refused = ""
    try:
        kv_cache_planning.unify_hybrid_kv_cache_specs(unified)
    except ValueError as exc:  # Mamba/GDN beside attention: one type is impossible
        refused = str(exc)
    per_token = sum(
        s.page_size_bytes // s.block_size for s in unified.values() if isinstance(s, AttentionSpec)
    )
    mamba = [s for s in specs.values() if isinstance(s, MambaSpec)]
    state = sum(s.real_page_size_bytes for s in mamba)
    state_padded = sum(s.page_size_bytes for s in mamba)

    cfg = _stub_config(request_tokens, disable_hybrid=False)
    groups = kv_cache_planning.get_kv_cache_groups(cfg, copy.copy(specs))
    # The pool charges a group's block at the widest group's bytes per block (padding
    # layers included): _get_kv_cache_bytes_per_block, as get_kv_cache_config_from_groups.
    per_block = kv_cache_planning._get_kv_cache_bytes_per_block(
        groups, cfg.cache_config.get_resolved_kv_cache_layout()
    )
    held, words, group_sizes = 0, [], []
    for g in groups:
        s0 = g.kv_cache_spec
        if hasattr(s0, "kv_cache_specs"):
            s0 = s0.kv_cache_specs[g.layer_names[0]]
        held += s0.max_memory_usage_bytes(cfg) // s0.page_size_bytes * per_block
        words.append(f"{type(s0).__name__}x{len(g.layer_names)}@bs{s0.block_size}")
        group_sizes.append(s0.block_size)
    try:
        pool = kv_cache_planning.get_kv_cache_config_from_groups(cfg, groups, HYBRID_POOL_BYTES)
        num_blocks = pool.num_blocks
    except Exception:  # a layout the stub cannot express: reported as 0
        num_blocks = 0
    return VllmFigures(
        per_token,
        state,
        state_padded,
        block,
        held,
        "; ".join(_squash(words)),
        refused,
        num_blocks,
        len(groups),
        tuple(group_sizes),
    )


def _squash(words: list[str]) -> list[str]:
    out: dict[str, int] = {}
    for w in words:
        out[w] = out.get(w, 0) + 1
    return [f"{n}x[{w}]" if n > 1 else w for w, n in out.items()]


# --- tokenyard's figures ------------------------------------------------------------------------


def tokenyard_hybrid_pool(
    path: Path, tp: int, kv: str, request_tokens: int
) -> tuple[int, int, int | tuple[int, ...], int] | str:
    """(num_blocks, groups, block size, bytes one request of ``request_tokens`` holds with
    one token in flight) tokenyard's hybrid plan gives HYBRID_POOL_BYTES
    (``simulation/hybrid_kv.vllm_kv_layout``, ``blocks_per_request``), or why it refuses
    the model. Attention pages that differ (Gemma 4) are planned by
    ``simulation/hybrid_kv_pages.pages_layout``: the block size is then each group's."""
    from tokenyard.errors import ConfigError
    from tokenyard.simulation import hybrid_kv_pages
    from tokenyard.simulation.hybrid_kv import blocks_per_request, is_hybrid, vllm_kv_layout
    from tokenyard.simulation.planner import dtype_bytes, kv_groups

    model = model_from_config(path)
    groups = kv_groups(model, tp, 1, dtype_bytes("bf16", kv)[1])
    if not is_hybrid(groups):
        return "one group"
    try:
        layout = vllm_kv_layout(groups, BLOCK_SIZE, model.name)
    except ConfigError:
        try:
            pages = hybrid_kv_pages.pages_layout(groups, BLOCK_SIZE, model.name)
        except ConfigError:
            return "refused: page sizes differ"
        held = hybrid_kv_pages.blocks_per_request(pages, request_tokens, 1)
        return (
            HYBRID_POOL_BYTES // pages.bytes_per_block,
            len(pages.groups),
            pages.group_block_sizes,
            held * pages.bytes_per_block,
        )
    held = blocks_per_request(layout.groups, request_tokens, layout.block_size, 1)
    return (
        HYBRID_POOL_BYTES // layout.bytes_per_block,
        len(layout.groups),
        layout.block_size,
        held * layout.bytes_per_block,
    )


def tokenyard_figures(path: Path, tp: int, kv: str, request_tokens: int) -> tuple[int, int, int]:
    """(KV bytes per token planned, state bytes per request, hybrid bytes held by one
    request of ``request_tokens``: a window group its window plus a block)."""
    model = model_from_config(path)
    big = dataclasses.replace(catalog_device("h200"), memory_gib=1_000_000.0)
    plan = plan_memory(
        model,
        big,
        tensor_parallel_size=tp,
        num_pipeline_stages=1,
        memory_margin_fraction=0.0,
        max_request_tokens=request_tokens,
        block_size=BLOCK_SIZE,
        weight_dtype="bf16",
        kv_cache_dtype=kv,
    )
    hybrid = 0
    for g in plan.groups:
        if g.state_bytes_per_request:
            continue
        kept = min(request_tokens, g.window + BLOCK_SIZE) if g.window else request_tokens
        hybrid += g.bytes_per_token * kept
    return (
        plan.kv_bytes_per_token,
        plan.state_bytes_per_request,
        hybrid + plan.state_bytes_per_request,
    )


# --- explanations of known differences ------------------------------------------------------


def explain(case: Case, kv: str, v: VllmFigures, ty: tuple[int, int, int]) -> str:
    why = []
    if v.refused:
        why.append(
            "vLLM refuses --disable-hybrid-kv-cache-manager for Mamba/GDN beside "
            "attention (_promote_local_kv_cache_specs: 'Failed to promote'); figure is "
            "its hybrid full-attention groups"
        )
    if v.bytes_per_token != ty[0]:
        if case.name == "DeepSeek-V3.2" and kv == "fp8":
            why.append(
                "FLASHMLA_SPARSE serves fp8 as fp8_ds_mla: 656 B a latent (512 fp8 NoPE "
                "+ 16 B scales + 128 B bf16 RoPE) vs the planner's 576; documented, not "
                "modelled"
            )
        else:
            why.append("UNEXPLAINED bytes/token difference")
    if v.state_bytes != ty[1]:
        why.append("UNEXPLAINED state difference")
    if v.state_bytes_padded != v.state_bytes:
        why.append(
            f"state page padded to the attention page (block {v.attn_block_size}): "
            f"{v.state_bytes_padded:,} B/req, as the hybrid plan pads it"
        )
    if case.name == "Llama-4-Scout":
        why.append(
            "vLLM disables the hybrid allocator by default for chunked attention "
            "(config/vllm.py): its default is the planner's layout"
        )
    if v.hybrid_request_bytes != ty[2]:
        if v.state_bytes:
            why.append("UNEXPLAINED hybrid held difference (Mamba groups)")
        elif case.name == "DeepSeek-V3.2" and kv == "fp8":
            pass
        else:
            why.append("UNEXPLAINED hybrid held difference")
    return "; ".join(why) or "-"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--request-tokens", type=int, default=32768)
    p.add_argument(
        "--configs",
        type=Path,
        default=Path(".venv/lib/python3.11/site-packages/aiconfigurator_core/model_configs"),
    )
    args = p.parse_args()
    n = args.request_tokens
    rows = []
    hybrid_pools: list[bool] = []
    for case in CASES:
        path = args.configs / f"{case.repo.replace('/', '--', 1)}_config.json"
        raw = json.loads(path.read_text())
        for kv in ("bf16", "fp8"):
            v = vllm_figures(vllm_specs(raw, case.tp, kv), n)
            ty = tokenyard_figures(path, case.tp, kv, n)
            same = v.bytes_per_token == ty[0] and v.state_bytes == ty[1]
            pool = tokenyard_hybrid_pool(path, case.tp, kv, n)
            if isinstance(pool, tuple) and isinstance(pool[2], tuple):
                # Groups of different block sizes: each group's, and the bytes one request
                # holds, against vLLM's planner.
                sizes = "/".join(str(b) for b in sorted(set(pool[2]), reverse=True))
                pool_words = f"{pool[0]:,} ({pool[1]} groups, blocks {sizes})"
                pool_same = pool == (
                    v.hybrid_num_blocks,
                    v.num_groups,
                    v.group_block_sizes,
                    v.hybrid_request_bytes,
                )
                hybrid_pools.append(pool_same)
                ty = (ty[0], ty[1], pool[3])
            elif isinstance(pool, tuple):
                pool_words = f"{pool[0]:,} ({pool[1]} groups, block {pool[2]})"
                pool_same = pool[:3] == (v.hybrid_num_blocks, v.num_groups, v.attn_block_size)
                hybrid_pools.append(pool_same)
                ty = (ty[0], ty[1], pool[3])  # the held figure of the hybrid plan itself
            else:
                pool_words = pool
            rows.append(
                (
                    case.name,
                    f"TP{case.tp} {kv}",
                    f"{v.bytes_per_token:,}",
                    f"{ty[0]:,}",
                    f"{v.state_bytes:,}" if v.state_bytes else "-",
                    f"{ty[1]:,}" if ty[1] else "-",
                    "yes" if same else "NO",
                    f"{v.hybrid_request_bytes / 2**20:,.1f}",
                    f"{ty[2] / 2**20:,.1f}",
                    v.groups,
                    f"{v.hybrid_num_blocks:,} ({v.num_groups} groups)",
                    pool_words,
                    explain(case, kv, v, ty),
                )
            )
    head = (
        "model",
        "layout KV",
        "vLLM B/token (disable-hybrid)",
        "tokenyard B/token",
        "vLLM state B/req",
        "tokenyard state B/req",
        "equal?",
        f"vLLM hybrid MiB/{n}-tok req",
        "tokenyard hybrid MiB",
        "vLLM hybrid groups",
        "vLLM hybrid num_blocks in 60 GiB",
        "tokenyard hybrid num_blocks",
        "explanation",
    )
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print(f"\nhybrid pools modelled: {sum(hybrid_pools)} of {len(hybrid_pools)} equal vLLM's")
    explained = all(r[6] == "yes" or "UNEXPLAINED" not in r[-1] for r in rows)
    return 0 if explained and all(hybrid_pools) else 1


if __name__ == "__main__":
    sys.exit(main())
