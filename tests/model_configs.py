"""Hugging Face ``config.json`` files written for a test and read as catalog models, and
the bundled ones a test needs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tokenyard import catalog

#: A small DeepSeek-V3-shaped config: 4 layers, the first dense, then 3 MoE layers of 8
#: routed experts (top-2) and one shared expert.
SMALL_DEEPSEEK = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 1024,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "q_lora_rank": 256,
    "kv_lora_rank": 128,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16,
    "v_head_dim": 32,
    "intermediate_size": 2048,
    "moe_intermediate_size": 256,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "num_nextn_predict_layers": 1,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}


def write_config(tmp_path: Path, config: dict[str, Any], **changes: Any) -> Path:
    """``config`` with ``changes`` over it, as ``tmp_path/config.json``."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, **changes}))
    return path


def load_config(tmp_path: Path, config: dict[str, Any], **changes: Any) -> catalog.ModelSpec:
    """The model of ``write_config(tmp_path, config, **changes)``, read as ``replica.model``."""
    return catalog.model(str(write_config(tmp_path, config, **changes)), field="replica.model")


def require_bundled(*names: str) -> None:
    """Skip the test unless aiconfigurator-core's bundled configs include ``names``."""
    bundled = catalog.bundled_model_names()
    if any(name not in bundled for name in names):
        pytest.skip("aiconfigurator-core's bundled configs are not installed")


def needs_measured(*names: str) -> pytest.MarkDecorator:
    """Skip unless aiconfigurator-core is installed: its tables, and bundled configs of
    ``names``."""
    try:
        import aiconfigurator_core  # noqa: F401
    except ImportError:
        installed = False
    else:
        installed = all(name in catalog.bundled_model_names() for name in names)
    return pytest.mark.skipif(
        not installed, reason="aiconfigurator-core's tables and configs are not installed"
    )
