"""A small built-in catalog of models and GPUs for the memory planner.

Model shapes are from the models' published configs (Hugging Face ``config.json``); GPU
memory from the vendors' datasheets. The full catalog (more models, FLOP/s and bandwidth for
the predictor) comes with the execution-time predictor.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenyard.errors import ConfigError

__all__ = ["DEVICES", "MODELS", "DeviceSpec", "ModelSpec", "device_spec", "model_spec"]


@dataclass(frozen=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    tied_embeddings: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def num_parameters(self) -> int:
        """Weights of a Llama-style decoder: attention, SwiGLU MLP, norms, embeddings."""
        h, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        attention = h * h * 2 + h * kv * 2  # q and o, then k and v
        mlp = 3 * h * self.intermediate_size
        per_layer = attention + mlp + 2 * h
        embeddings = self.vocab_size * h * (1 if self.tied_embeddings else 2)
        return self.num_layers * per_layer + embeddings + h


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    memory_gib: float


MODELS = {
    m.name: m
    for m in (
        # meta-llama/Llama-2-7b-hf, Llama-2-13b-hf, Llama-2-70b-hf, Meta-Llama-3-8B
        ModelSpec("llama-2-7b", 32, 4096, 32, 32, 11008, 32000),
        ModelSpec("llama-2-13b", 40, 5120, 40, 40, 13824, 32000),
        ModelSpec("llama-2-70b", 80, 8192, 64, 8, 28672, 32000),
        ModelSpec("llama-3-8b", 32, 4096, 32, 8, 14336, 128256),
    )
}

DEVICES = {
    d.name: d
    for d in (
        DeviceSpec("a100-40gb", 40.0),
        DeviceSpec("a100-80gb", 80.0),
        DeviceSpec("h100-80gb", 80.0),
        DeviceSpec("a10g", 24.0),
    )
}


def model_spec(name: str) -> ModelSpec:
    if name not in MODELS:
        raise ConfigError(
            f"replica.model: unknown model {name!r}; expected one of {', '.join(MODELS)}",
            field="replica.model",
            value=repr(name),
        )
    return MODELS[name]


def device_spec(name: str) -> DeviceSpec:
    if name not in DEVICES:
        raise ConfigError(
            f"replica.device: unknown device {name!r}; expected one of {', '.join(DEVICES)}",
            field="replica.device",
            value=repr(name),
        )
    return DEVICES[name]
