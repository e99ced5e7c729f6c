"""Execution-time predictors for the simulator (``docs/predictor.md``).

Python builds, Rust evaluates: a predictor compiles to per-operation costs (roofline
coefficients or interpolated tables) that the simulator's event loop evaluates natively.

    from tokenyard import catalog, predictor

    llama, a100 = catalog.model("llama-2-7b"), catalog.device("a100-80gb")
    roofline = predictor.roofline_predictor(llama, a100)
    profiles = predictor.read_profiles(["profile.csv"])
    trained = predictor.profiled_predictor(profiles, roofline, hidden_size=4096)
    predictor.holdout_errors(profiles)  # held-out error per operation
"""

from tokenyard.predictor.compiled import (
    FEATURES,
    CompiledOp,
    CompiledPredictor,
    RooflineCost,
    TableCost,
    batch_features,
)
from tokenyard.predictor.evaluate import OpError, holdout_errors
from tokenyard.predictor.profiled import (
    REGRESSORS,
    OpFit,
    TrainingOptions,
    fit_op,
    profiled_predictor,
)
from tokenyard.predictor.profiles import OpSamples, ProfileError, ProfileSet, read_profiles
from tokenyard.predictor.roofline import CpuOverheads, Efficiencies, roofline_predictor

__all__ = [
    "FEATURES",
    "REGRESSORS",
    "CompiledOp",
    "CompiledPredictor",
    "CpuOverheads",
    "Efficiencies",
    "OpError",
    "OpFit",
    "OpSamples",
    "ProfileError",
    "ProfileSet",
    "RooflineCost",
    "TableCost",
    "TrainingOptions",
    "batch_features",
    "fit_op",
    "holdout_errors",
    "profiled_predictor",
    "read_profiles",
    "roofline_predictor",
]
