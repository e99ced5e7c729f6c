"""Issue 29: DeepSeek sparse attention (DSA: DeepSeek-V3.2, GLM-5) and the MTP drafter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from model_configs import SMALL_DEEPSEEK, load_config, require_bundled
from step_shapes import decodes
from synthetic_jobs import one_replica, synthetic_workload

from tokenyard import catalog
from tokenyard.errors import ConfigError
from tokenyard.predictor import roofline_predictor
from tokenyard.simulation import simulate
from tokenyard.simulation.planner import kv_groups

#: SMALL_DEEPSEEK (4 MLA layers, latent 128 + 16) as a DSA model: an indexer of
#: 4 heads of 128, top 256 keys.
SMALL_DSA = {
    **SMALL_DEEPSEEK,
    "architectures": ["DeepseekV32ForCausalLM"],
    "model_type": "deepseek_v32",
    "index_n_heads": 4,
    "index_head_dim": 128,
    "index_topk": 256,
}


def test_dsa_kv_per_token_is_the_latent_plus_the_indexer_key(tmp_path: Path) -> None:
    spec = load_config(tmp_path, SMALL_DSA)
    assert spec.indexer is not None
    assert spec.indexer.cache_bytes == 128 + 4  # fp8 + a scale
    # 4 layers x (144 latent values x 2 bytes + 132 indexer bytes), on every TP rank.
    (group,) = kv_groups(spec, 2, 1, 2)
    assert group.bytes_per_token == 4 * (144 * 2 + 132) == 1680
    (group,) = kv_groups(spec, 1, 1, 1)  # fp8 KV: the indexer's bytes do not shrink
    assert group.bytes_per_token == 4 * (144 + 132)


def test_dsa_weights_add_the_replicated_indexer(tmp_path: Path) -> None:
    dense = load_config(tmp_path, SMALL_DEEPSEEK)
    sparse = load_config(tmp_path, SMALL_DSA)
    # wq_b (q_lora 256 x 4 x 128) + wk and weights_proj (1024 x (128 + 4)) + LayerNorm 2 x 128.
    per_layer = 256 * 4 * 128 + 1024 * (128 + 4) + 2 * 128
    assert sparse.num_parameters() - dense.num_parameters() == 4 * per_layer


def test_sparse_decode_attention_flattens_past_index_topk(tmp_path: Path) -> None:
    spec = load_config(tmp_path, SMALL_DSA)
    predictor = roofline_predictor(spec, catalog.device("h100-sxm"))
    times = {k: predictor.op_times(decodes(64, k)) for k in (128, 256, 1024, 8192)}
    attention = {k: t["attn_decode"] for k, t in times.items()}
    indexer = {k: t["indexer_decode"] for k, t in times.items()}
    assert attention[128] < attention[256]
    assert attention[256] == attention[1024] == attention[8192]  # min(context, index_topk)
    assert indexer[1024] < indexer[8192]  # the indexer still scans every key
    dense = roofline_predictor(load_config(tmp_path, SMALL_DEEPSEEK), catalog.device("h100-sxm"))
    assert dense.op_times(decodes(64, 8192))["attn_decode"] > attention[8192]


@pytest.mark.parametrize(
    ("name", "key"),
    [("zai-org/GLM-5.2", "index_topk_freq"), ("deepseek-ai/DeepSeek-V4-Flash", "compress_ratios")],
)
def test_dsa_variants_not_modelled_name_their_key(name: str, key: str) -> None:
    require_bundled(name)
    with pytest.raises(ConfigError, match=f": {key}: "):
        catalog.model(name, field="replica.model")


def test_bundled_dsa_configs_read_their_indexer() -> None:
    require_bundled("deepseek-ai/DeepSeek-V3.2")
    v32 = catalog.model("deepseek-ai/DeepSeek-V3.2")
    glm = catalog.model("zai-org/GLM-5")
    assert (v32.indexer.num_heads, v32.indexer.head_dim, v32.indexer.topk) == (64, 128, 2048)
    assert (glm.indexer.num_heads, glm.indexer.topk) == (32, 2048)
    (group,) = kv_groups(v32, 8, 1, 2)
    assert group.bytes_per_token == 61 * (576 * 2 + 132) == 78_324


def run(model: str, speculative: dict[str, Any] | None = None) -> Any:
    replica: dict[str, Any] = {"model": model, "device": "h200", "tensor_parallel_size": 8}
    if speculative:
        replica["speculative"] = speculative
    workload = synthetic_workload(6, qps=2.0, prompt_tokens=3000, output_tokens=32)
    return simulate(one_replica(replica, workload))


def test_deepseek_v32_simulates_on_8_h200() -> None:
    require_bundled("deepseek-ai/DeepSeek-V3.2")
    result = run("deepseek-ai/DeepSeek-V3.2")
    assert result.summary["num_requests"] == 6
    assert result.summary["num_skipped_over_length"] == 0


# ---- MTP ----------------------------------------------------------------------------


def test_the_mtp_drafter_is_one_layer_and_eh_proj(tmp_path: Path) -> None:
    spec = load_config(tmp_path, SMALL_DEEPSEEK)
    drafter = spec.mtp_drafter()
    assert drafter.num_layers == 1
    assert drafter.mtp_module
    assert [(k.attention, k.ffn) for k in drafter.layer_kinds()] == [("mla", "moe")]
    device = catalog.device("h100-sxm")
    draft = roofline_predictor(drafter, device)
    target = roofline_predictor(spec, device)
    shape = decodes(1, 100)
    drafted, whole = draft.op_times(shape), target.op_times(shape)
    # eh_proj: [1, 2h] x [2h, h] at bf16, bound by its 2 x 1024 x 1024 x 2 weight bytes.
    eh = 2 * 1024 * 1024 * 2 + (2 * 1024 + 1024) * 2
    bandwidth = device.memory_bandwidth_gbps * 1e9
    assert drafted["eh_proj"] == pytest.approx(eh / (bandwidth * 0.85), rel=0.05)
    # The layer is a MoE layer of the target; the LM head is the target's, once.
    assert drafted["moe_experts" if "moe_experts" in drafted else "gate_up_proj"] > 0
    assert drafted["lm_head"] == pytest.approx(whole["lm_head"])
    assert drafted["attn_decode"] == pytest.approx(whole["attn_decode"] / 4)


def test_mtp_is_refused_for_a_model_without_mtp_layers() -> None:
    spec = {"method": "mtp", "num_speculative_tokens": 1, "acceptance_rate": 0.8}
    with pytest.raises(ConfigError) as err:
        run("llama-2-7b", spec)
    assert err.value.field == "replica.speculative.method"
    assert "num_nextn_predict_layers" in str(err.value)
    assert "llama-2-7b" in str(err.value)


def test_deepseek_v3_with_mtp_simulates_on_8_h200() -> None:
    require_bundled("deepseek-ai/DeepSeek-V3")
    spec = {"method": "mtp", "num_speculative_tokens": 1, "acceptance_rate": 0.85}
    result = run("deepseek-ai/DeepSeek-V3", spec)
    assert result.summary["num_requests"] == 6
    assert result.summary["num_skipped_over_length"] == 0
    assert result.summary["speculative"]["num_draft_tokens"] > 0
