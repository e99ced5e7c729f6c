"""A small torch engine that serves a Llama-shaped model under tokenyard's scheduler, with
the paged-attention kernels of ``tokenyard.kernels`` reading the KV cache through the
scheduler's block tables. Needs torch (and triton for the kernels)."""

from tokenyard.engine.attention import AttentionBackend, AttentionMetadata
from tokenyard.engine.engine import EngineConfig, LLMEngine, StepTiming, TokenEvent
from tokenyard.engine.model import KvCache, LlamaModel, ModelConfig

__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
    "EngineConfig",
    "KvCache",
    "LLMEngine",
    "LlamaModel",
    "ModelConfig",
    "StepTiming",
    "TokenEvent",
]
