"""Builds the execution-time model a simulation config asks for (``execution.model``).

``linear`` needs nothing here (the core reads the coefficients); ``roofline`` and
``profiled`` compile a :class:`~tokenyard.predictor.CompiledPredictor` for the replica's
model, GPU, layout and dtypes; ``module:callable`` loads a Python function (the slow path).
"""

from __future__ import annotations

from typing import Any

from tokenyard.catalog import device, model
from tokenyard.predictor.compiled import CompiledPredictor
from tokenyard.predictor.profiled import profiled_predictor
from tokenyard.predictor.profiles import read_profiles
from tokenyard.predictor.roofline import roofline_predictor
from tokenyard.simulation.config import SimulationConfig
from tokenyard.simulation.planner import dtype_bytes

__all__ = ["build_predictor"]


def build_predictor(config: SimulationConfig) -> CompiledPredictor | None:
    """The compiled roofline or profiled predictor of ``config``; None for the others."""
    execution, replica = config.execution, config.replica
    if execution.model not in ("roofline", "profiled"):
        return None
    spec = model(replica.model, field="replica.model")
    weight_bytes, kv_bytes = dtype_bytes(replica.dtype, replica.kv_cache_dtype)
    roofline = roofline_predictor(
        spec,
        device(replica.device, field="replica.device"),
        tensor_parallel_size=replica.tensor_parallel_size,
        num_pipeline_stages=replica.num_pipeline_stages,
        weight_bytes=weight_bytes,
        kv_bytes=kv_bytes,
        efficiencies=execution.efficiency,
        cpu=execution.cpu,
    )
    if execution.model == "roofline":
        return roofline
    profiled = execution.profiled
    profiles = read_profiles(
        [config.path(p) for p in profiled.profiles],
        model=None,
        tensor_parallel_size=replica.tensor_parallel_size,
    )
    return profiled_predictor(
        profiles,
        roofline,
        hidden_size=spec.hidden_size,
        options=profiled.options(),
        cache_dir=config.path(profiled.cache_dir) if profiled.cache_dir else None,
    )


def describe(predictor: CompiledPredictor | None, config: SimulationConfig) -> dict[str, Any]:
    """What the summary records about the execution model."""
    if predictor is None:
        return {"model": config.execution.model}
    sources = {op.name: op.source for op in predictor.ops}
    return {"model": config.execution.model, "op_sources": sources}
