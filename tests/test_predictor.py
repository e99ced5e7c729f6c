"""The execution-time predictors: roofline against hand computations, the compiled form
evaluated in Rust against its Python mirror, the profiled predictor against a known
formula, caching, and the config and CLI around them."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from step_shapes import decodes, prompt

from tokenyard import _core, catalog
from tokenyard.cli import main as cli_main
from tokenyard.errors import ConfigError
from tokenyard.predictor import (
    CompiledOp,
    CompiledPredictor,
    Efficiencies,
    TableCost,
    TrainingOptions,
    fit_op,
    profiled_predictor,
    read_profiles,
    roofline_predictor,
)
from tokenyard.predictor import profiled as profiled_module
from tokenyard.predictor.calibration import builtin_calibration
from tokenyard.predictor.profiles import OpSamples
from tokenyard.profiler.run import write_profile
from tokenyard.simulation import config_from_mapping, simulate

EXACT = Efficiencies(gemm=1.0, attention=1.0, memory=1.0, network=1.0)
SHAPE_KEYS = (
    "num_requests",
    "num_prefill_tokens",
    "num_decode_tokens",
    "sum_decode_context",
    "sum_prefill_context",
    "sum_prefill_squared",
    "num_padding_rows",
)


# --- roofline ----------------------------------------------------------------------------


def test_roofline_of_one_llama_2_7b_layer_matches_a_hand_computation() -> None:
    """Llama-2-7B (h = 4096, 32 heads of 128, i = 11008, bf16) on an A100-80GB at the
    datasheet peaks (312 TFLOP/s, 2039 GB/s), one 1024-token prompt."""
    predictor = roofline_predictor(
        catalog.model("llama-2-7b"), catalog.device("a100-80gb"), efficiencies=EXACT
    )
    flops, bw, h, i, t = 312e12, 2039e9, 4096, 11008, 1024
    times = predictor.op_times(prompt(t))
    per_layer = {name: seconds / 32 for name, seconds in times.items()}
    # qkv: 2·4096·12288·1024 = 103.1 GFLOP → 330 us; its 134 MB of weights and activations
    # take 66 us: compute-bound.
    assert per_layer["qkv_proj"] == pytest.approx(2 * h * 3 * h * t / flops, rel=1e-12)
    assert per_layer["qkv_proj"] == pytest.approx(330.4e-6, rel=1e-3)
    assert per_layer["o_proj"] == pytest.approx(2 * h * h * t / flops, rel=1e-12)
    assert per_layer["gate_up_proj"] == pytest.approx(2 * h * 2 * i * t / flops, rel=1e-12)
    assert per_layer["down_proj"] == pytest.approx(2 * i * h * t / flops, rel=1e-12)
    # Causal attention: 1024·1025/2 query-key pairs, 4 FLOPs per pair per dimension.
    pairs = t * (t + 1) / 2
    assert per_layer["attn_prefill"] == pytest.approx(4 * h * pairs / flops, rel=1e-12)
    # Memory-bound pieces: a norm reads and writes the activations (2 bytes each).
    assert per_layer["input_norm"] == pytest.approx((h * 2 + 2 * h * t * 2) / bw, rel=1e-12)
    assert per_layer["residual_add"] == pytest.approx(2 * 3 * h * t * 2 / bw, rel=1e-12)
    assert per_layer["kv_store"] == pytest.approx(2 * h * t * 4 / bw, rel=1e-12)
    assert times["attn_decode"] == 0.0  # gated off: no decodes in the batch
    # The LM head runs once, for the one row that samples: 4096 x 32000 weights.
    assert times["lm_head"] == pytest.approx((h * 32000 * 2 + (h + 32000) * 2) / bw, rel=1e-12)
    total, model_s = predictor.stage_time(prompt(t))
    assert model_s == pytest.approx(sum(times.values()), rel=1e-12)
    assert total - model_s == pytest.approx(1e-3)  # the default CPU overheads


def test_a_single_decode_reads_the_weights_once() -> None:
    """Batch-1 decode is memory-bound: about the 13.2 GB of weights (the LM head's one, the
    input embedding's only a row) and 0.5 GB of KV over the bandwidth."""
    spec = catalog.model("llama-2-7b")
    predictor = roofline_predictor(spec, catalog.device("a100-80gb"), efficiencies=EXACT)
    _, model_s = predictor.stage_time(decodes(1, 1000))
    weight_bytes = 2 * (spec.num_parameters() - spec.vocab_size * spec.hidden_size)
    kv_bytes = 32 * 2 * 4096 * 2 * 1001
    assert model_s == pytest.approx((weight_bytes + kv_bytes) / 2039e9, rel=0.01)
    # Decode attention reads the KV of 1001 tokens: 2·4096·2 bytes each, per layer.
    attention = predictor.op_times(decodes(1, 1000))["attn_decode"] / 32
    assert attention == pytest.approx((2 * 4096 * 2 * 1001 + 2 * 4096 * 2) / 2039e9, rel=1e-12)


def test_tensor_parallel_adds_ring_all_reduces_and_pipeline_stages_send() -> None:
    """Llama-2-70B on 4 H100s: two all-reduces per layer of 2·3/4·8192·2 bytes per token
    over half of NVLink's 900 GB/s (the catalog's figure is both directions), each with
    2·3 hops of 5 us."""
    h100 = catalog.device("h100-sxm")
    predictor = roofline_predictor(
        catalog.model("llama-2-70b"),
        h100,
        tensor_parallel_size=4,
        num_pipeline_stages=2,
        efficiencies=EXACT,
    )
    t = 2048
    first = predictor.op_times(prompt(t), stage=0, num_stages=2)
    last = predictor.op_times(prompt(t), stage=1, num_stages=2)
    one_reduce = 2 * 3 / 4 * 8192 * 2 * t / 450e9 + 6 * 5e-6
    assert first["all_reduce"] == pytest.approx(40 * 2 * one_reduce, rel=1e-12)
    assert first["send_recv"] == pytest.approx(8192 * 2 * t / 450e9 + 5e-6, rel=1e-12)
    assert (last["send_recv"], first["lm_head"], last["embedding"]) == (0.0, 0.0, 0.0)
    # Each TP worker holds 64/4 query heads (and 8/4 KV heads); at 2048 tokens attention is
    # compute-bound (at 512 its 5 MB of Q, K, V and output would take longer).
    assert first["attn_prefill"] == pytest.approx(40 * 4 * 16 * 128 * t * (t + 1) / 2 / 989e12)


def test_a_moe_layer_reads_only_the_experts_its_tokens_hit() -> None:
    mixtral = catalog.model("mixtral-8x7b")
    predictor = roofline_predictor(mixtral, catalog.device("h100-sxm"), efficiencies=EXACT)
    h, i = 4096, 14336
    expert_bytes = 2 * h * i * 2  # gate and up of one expert
    one = predictor.op_times(decodes(1, 100))["gate_up_proj"] / 32
    assert one == pytest.approx((2 * expert_bytes + 2 * (h + 2 * i) * 2) / 3350e9, rel=1e-9)
    many = predictor.op_times(decodes(64, 100))["gate_up_proj"] / 32
    assert many == pytest.approx((8 * expert_bytes + 128 * (h + 2 * i) * 2) / 3350e9, rel=1e-9)
    # Between grid points too: the table has the formula's bends (all experts hit at T = 4,
    # compute overtaking memory further up), so interpolation is exact.
    for tokens in np.random.default_rng(0).integers(1, 5000, 300):
        rows = 2 * tokens
        flops = 2 * h * 2 * i * rows / 989e12
        moved = (min(8, rows) * expert_bytes + rows * (h + 2 * i) * 2) / 3350e9
        got = predictor.op_times(decodes(int(tokens), 100))["gate_up_proj"] / 32
        assert got == pytest.approx(max(flops, moved), rel=1e-9)


# --- the compiled form: Rust against the Python mirror ----------------------------------


def shapes_array(shapes: list[dict[str, int]]) -> dict[str, np.ndarray]:
    return {k: np.array([s[k] for s in shapes], dtype=np.uint64) for k in SHAPE_KEYS}


@st.composite
def batch_shapes(draw: st.DrawFn) -> dict[str, int]:
    chunks = draw(st.lists(st.tuples(st.integers(1, 3000), st.integers(0, 9000)), max_size=4))
    contexts = draw(st.lists(st.integers(0, 40_000), max_size=40))
    return {
        "num_requests": len(chunks) + len(contexts),
        "num_prefill_tokens": sum(c for c, _ in chunks),
        "num_decode_tokens": len(contexts),
        "sum_decode_context": sum(contexts),
        "sum_prefill_context": sum(c * (p + c) for c, p in chunks),
        "sum_prefill_squared": sum(c * c for c, _ in chunks),
        "num_padding_rows": draw(st.integers(0, 7)),
    }


@st.composite
def tables(draw: st.DrawFn) -> TableCost:
    def axis() -> tuple[float, ...]:
        points = draw(st.lists(st.floats(1, 5e4), min_size=1, max_size=6, unique=True))
        return tuple(sorted(points))

    xs = axis()
    two = draw(st.booleans())
    ys = axis() if two else ()
    size = len(xs) * (len(ys) if two else 1)
    values = draw(st.lists(st.floats(0, 1.0), min_size=size, max_size=size))
    if two:
        return TableCost(
            x="num_decode_tokens", y="decode_mean_context", xs=xs, ys=ys, values=tuple(values)
        )
    return TableCost(x="num_tokens", xs=xs, values=tuple(values))


ROOFLINE_70B = roofline_predictor(
    catalog.model("llama-2-70b"),
    catalog.device("h100-sxm"),
    tensor_parallel_size=4,
    num_pipeline_stages=2,
)


@settings(max_examples=60, deadline=None)
@given(
    shapes=st.lists(batch_shapes(), min_size=1, max_size=8), table=tables(), stage=st.integers(0, 1)
)
def test_rust_evaluates_exactly_what_the_python_mirror_computes(
    shapes: list[dict[str, int]], table: TableCost, stage: int
) -> None:
    ops = (*ROOFLINE_70B.ops, CompiledOp("extra", "layer", "num_tokens", table, count=1.5))
    predictor = dataclasses.replace(ROOFLINE_70B, ops=ops)
    total, model_s = _core.evaluate_ops(
        predictor.to_core(), shapes_array(shapes), stage=stage, num_stages=2
    )
    for i, shape in enumerate(shapes):
        expected = predictor(stage=stage, num_stages=2, **shape)
        assert (total[i], model_s[i]) == expected


def test_bad_compiled_models_are_config_errors_naming_the_field() -> None:
    good = ROOFLINE_70B.to_core()
    shapes = shapes_array([dict.fromkeys(SHAPE_KEYS, 1)])

    def error_of(spec: dict[str, object], **kw: int) -> ConfigError:
        with pytest.raises(ConfigError) as err:
            _core.evaluate_ops(spec, shapes, **kw)
        return err.value

    table = {"name": "t", "scope": "layer", "count": 1.0, "gate": "num_tokens", "kind": "table"}
    unsorted = {
        **good,
        "ops": [
            {
                **table,
                "x": "num_tokens",
                "y": None,
                "xs": [2.0, 1.0],
                "ys": [],
                "values": [1.0, 1.0],
            }
        ],
    }
    assert error_of(unsorted, num_stages=2).field == "execution.ops.xs"
    unknown = {
        **good,
        "ops": [{**table, "x": "tokens", "y": None, "xs": [1.0], "ys": [], "values": [1.0]}],
    }
    assert error_of(unknown, num_stages=2).field == "execution.ops.x"
    assert error_of(good, num_stages=3).field == "replica.num_pipeline_stages"
    bad_scope = {**good, "ops": [{**good["ops"][0], "scope": "sometimes"}]}  # type: ignore[index]
    assert error_of(bad_scope, num_stages=2).field == "execution.ops.scope"


WORKLOAD = {
    "kind": "synthetic",
    "num_requests": 300,
    "seed": 3,
    "arrival": {"kind": "poisson", "qps": 8.0},
    "prompt_tokens": {"kind": "uniform", "low": 16, "high": 2048},
    "output_tokens": {"kind": "uniform", "low": 1, "high": 200},
}

#: The slow path: the simulator loads ``tests.test_predictor:ROOFLINE_7B_TP2_FUSED``.
ROOFLINE_7B_TP2 = roofline_predictor(
    catalog.model("llama-2-7b"),
    catalog.device("a100-80gb"),
    tensor_parallel_size=2,
    num_pipeline_stages=2,
)


ROOFLINE_7B_TP2_FUSED = ROOFLINE_7B_TP2.fused(2)  # what simulate() hands to Rust
CALIBRATED_7B_TP2_FUSED = roofline_predictor(
    catalog.model("llama-2-7b"),
    catalog.device("a100-80gb"),
    tensor_parallel_size=2,
    num_pipeline_stages=2,
    calibration=builtin_calibration(catalog.device("a100-80gb")),
).fused(2)


@pytest.mark.parametrize(
    ("execution", "python_model"),
    [
        ({"model": "roofline", "efficiency": {}}, "ROOFLINE_7B_TP2_FUSED"),
        ({"model": "roofline"}, "CALIBRATED_7B_TP2_FUSED"),
    ],
)
def test_the_simulator_gives_the_same_results_from_rust_and_the_python_slow_path(
    execution: dict[str, object], python_model: str
) -> None:
    base = {
        "workload": WORKLOAD,
        "replica": {
            "model": "llama-2-7b",
            "device": "a100-80gb",
            "tensor_parallel_size": 2,
            "num_pipeline_stages": 2,
            "scheduler": {"policy": "sarathi"},
        },
    }
    rust = simulate(config_from_mapping({**base, "execution": execution}))
    python = simulate(
        config_from_mapping(
            {**base, "execution": {"model": f"tests.test_predictor:{python_model}"}}
        )
    )
    for column in ("first_token_at", "completed_at", "execution_time"):
        assert np.array_equal(rust.table()[column], python.table()[column]), column
    source = "roofline" if "efficiency" in execution else "calibrated"
    assert rust.summary["config"]["execution"]["op_sources"]["attn_decode"] == source


# --- the profiled predictor -------------------------------------------------------------


def known_time(op: str, features: tuple[float, ...]) -> float:
    """The formula the synthetic profiles come from (seconds)."""
    if op == "attn_prefill":
        tokens, context = features
        return 8e-6 + 2e-11 * tokens * context + 1e-9 * tokens
    if op == "attn_decode":
        batch, context = features
        return 5e-6 + 3e-10 * batch * context
    (tokens,) = features
    return 4e-6 + 1e-8 * tokens * (1 + len(op) % 3)


def synthetic_profile(path: Path, scale: float = 1.0) -> Path:
    rows = []
    common = {
        "device": "synthetic-gpu",
        "model": "llama-2-7b",
        "tensor_parallel_size": 1,
        "repeats": 1,
    }
    for op in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "input_norm", "act"):
        for n in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096):
            rows.append(
                {**common, "op": op, "num_tokens": n, "time_ms": 1e3 * scale * known_time(op, (n,))}
            )
    for b in (1, 4):
        for c in (64, 128, 256, 512, 1024, 2048):
            for p in (0, 512, 1024, 2048, 4096, 8192):
                ms = 1e3 * known_time("attn_prefill", (b * c, p + (c + 1) / 2))
                rows.append(
                    {
                        **common,
                        "op": "attn_prefill",
                        "batch_size": b,
                        "chunk_size": c,
                        "context_len": p,
                        "time_ms": ms,
                    }
                )
    for b in (1, 2, 4, 8, 16, 32, 64, 128):
        for ctx in (128, 256, 512, 1024, 2048, 4096, 8192):
            ms = 1e3 * known_time("attn_decode", (b, ctx))
            rows.append(
                {**common, "op": "attn_decode", "batch_size": b, "context_len": ctx, "time_ms": ms}
            )
    return write_profile(rows, path)


def _profiled_synthetic() -> CompiledPredictor:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        profiles = read_profiles([synthetic_profile(Path(tmp) / "p.csv")])
        base = roofline_predictor(catalog.model("llama-2-7b"), catalog.device("a100-80gb"))
        options = TrainingOptions(regressor="interpolation")
        return profiled_predictor(
            profiles, base, hidden_size=4096, options=options, cache_dir=Path(tmp) / "cache"
        )


PROFILED_SYNTHETIC = _profiled_synthetic()


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def test_a_profiled_predictor_recovers_a_known_formula_within_two_percent(
    tmp_path: Path, cache_dir: Path
) -> None:
    profiles = read_profiles([synthetic_profile(tmp_path / "p.csv")])
    base = roofline_predictor(catalog.model("llama-2-7b"), catalog.device("a100-80gb"))
    options = TrainingOptions(folds=3)  # auto: the lowest cross-validated error wins
    predictor = profiled_predictor(
        profiles, base, hidden_size=4096, options=options, cache_dir=cache_dir
    )
    sources = {op.name: op.source for op in predictor.ops}
    assert sources["qkv_proj"] in ("profile:interpolation", "profile:linear")
    assert sources["attn_prefill"] == "profile:linear"  # the formula is in its basis
    assert sources["rope"] == "roofline"  # not profiled: the roofline's cost stays
    rng = np.random.default_rng(0)
    for _ in range(200):
        tokens = int(rng.integers(1, 4096))
        per_layer = predictor.op_times(prompt(tokens))["gate_up_proj"] / 32
        assert per_layer == pytest.approx(known_time("gate_up_proj", (tokens,)), rel=0.02)
        chunk, cached = int(rng.integers(64, 2048)), int(rng.integers(0, 8192))
        prefill = predictor.op_times(prompt(chunk, cached))["attn_prefill"] / 32
        expected = known_time("attn_prefill", (chunk, cached + (chunk + 1) / 2))
        assert prefill == pytest.approx(expected, rel=0.02)
        batch, context = int(rng.integers(1, 128)), int(rng.integers(128, 8192))
        decode = predictor.op_times(decodes(batch, context))["attn_decode"] / 32
        assert decode == pytest.approx(known_time("attn_decode", (batch, context + 1)), rel=0.02)


@settings(max_examples=30, deadline=None)
@given(shapes=st.lists(batch_shapes(), min_size=1, max_size=5))
def test_a_fused_predictor_gives_the_same_times_with_fewer_lookups(
    shapes: list[dict[str, int]],
) -> None:
    mixtral = roofline_predictor(
        catalog.model("mixtral-8x7b"), catalog.device("h100-sxm"), tensor_parallel_size=2
    )
    for predictor in (PROFILED_SYNTHETIC, ROOFLINE_70B, mixtral):
        fused = predictor.fused()
        assert len(fused.ops) <= len(predictor.ops) - 8
        assert any(op.source == "fused" for op in fused.ops)
        one_stage = predictor.fused(1)
        assert len(one_stage.ops) < len(fused.ops)  # the embedding joins the layers
        for shape in shapes:
            for stage in (0, 1):
                expected = predictor(stage=stage, num_stages=2, **shape)
                got = fused(stage=stage, num_stages=2, **shape)
                assert got == pytest.approx(expected, rel=1e-9)
            alone = one_stage(stage=0, num_stages=1, **shape)
            assert alone == pytest.approx(predictor(stage=0, num_stages=1, **shape), rel=1e-9)


def test_only_operations_gated_on_their_own_feature_fuse() -> None:
    """A cost on decode tokens gated on all tokens runs (at 0 decode tokens) in a prefill-only
    batch: fusing it with a table starting at 1 would change its time."""
    table = TableCost(x="num_decode_tokens", xs=(1.0, 10.0), values=(1.0, 2.0))
    ops = tuple(CompiledOp(f"t{i}", "layer", "num_tokens", table) for i in range(2))
    predictor = CompiledPredictor(ops=ops, num_layers=1, cpu_overhead_s=0.0)
    assert predictor.fused().ops == ops


def test_bad_roofline_inputs_are_config_errors() -> None:
    llama = catalog.model("llama-2-7b")
    a100 = catalog.device("a100-80gb")
    for kwargs, field in (
        ({"tensor_parallel_size": 3}, "replica.tensor_parallel_size"),
        ({"tensor_parallel_size": 0}, "replica.tensor_parallel_size"),
        ({"num_pipeline_stages": 5}, "replica.num_pipeline_stages"),
        ({"efficiencies": Efficiencies(gemm=2.0)}, "execution.efficiency.gemm"),
        ({"weight_bytes": -1.0}, "weight_bytes"),
    ):
        with pytest.raises(ConfigError) as err:
            roofline_predictor(llama, a100, **kwargs)  # type: ignore[arg-type]
        assert err.value.field == field


def test_auto_picks_the_regressor_with_the_lowest_cross_validated_error() -> None:
    tokens = np.array([2.0**e for e in range(13)])
    samples = OpSamples("qkv_proj", ("num_tokens",), tokens[:, None], 4e-6 + 1e-8 * tokens)
    fit = fit_op(samples, TrainingOptions(folds=3))
    assert set(fit.cv_mape) == {"interpolation", "linear", "random_forest", "gradient_boosting"}
    assert fit.cv_mape[fit.regressor] == min(fit.cv_mape.values())
    assert fit.regressor in ("interpolation", "linear")  # trees cannot extrapolate a line
    assert fit.cv_mape[fit.regressor] < 0.01


def test_trained_predictors_are_cached_by_the_profiles_digest(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = roofline_predictor(catalog.model("llama-2-7b"), catalog.device("a100-80gb"))
    options = TrainingOptions(regressor="linear")
    profiles = read_profiles([synthetic_profile(tmp_path / "a.csv")])
    first = profiled_predictor(
        profiles, base, hidden_size=4096, options=options, cache_dir=cache_dir
    )
    assert len(list(cache_dir.glob("*.json"))) == 1

    def no_training(*args: object, **kwargs: object) -> None:
        raise AssertionError("trained again despite the cache")

    monkeypatch.setattr(profiled_module, "fit_op", no_training)
    again = profiled_predictor(
        profiles, base, hidden_size=4096, options=options, cache_dir=cache_dir
    )
    assert again.to_core() == first.to_core()
    monkeypatch.undo()
    wider = profiled_predictor(
        profiles, base, hidden_size=4096, activation_bytes=4, options=options, cache_dir=cache_dir
    )
    assert len(list(cache_dir.glob("*.json"))) == 2  # comms tables scale with the bytes
    assert wider.description == first.description
    corrupt = next(iter(cache_dir.glob("*.json")))
    corrupt.write_text("{")
    profiled_predictor(profiles, base, hidden_size=4096, options=options, cache_dir=cache_dir)
    profiled_predictor(
        profiles, base, hidden_size=4096, activation_bytes=4, options=options, cache_dir=cache_dir
    )
    assert all(CompiledPredictor.load(p) for p in cache_dir.glob("*.json"))  # retrained
    changed = read_profiles([synthetic_profile(tmp_path / "b.csv", scale=1.5)])
    assert changed.digest() != profiles.digest()
    profiled_predictor(changed, base, hidden_size=4096, options=options, cache_dir=cache_dir)
    assert len(list(cache_dir.glob("*.json"))) == 3


def test_a_compiled_predictor_saves_and_loads(tmp_path: Path) -> None:
    path = tmp_path / "predictor.json"
    ROOFLINE_70B.save(path)
    loaded = CompiledPredictor.load(path)
    assert loaded.to_core() == ROOFLINE_70B.to_core()
    path.write_text("{}")
    with pytest.raises(ConfigError):
        CompiledPredictor.load(path)


def test_simulate_with_a_profiled_predictor_from_a_config_file(tmp_path: Path) -> None:
    synthetic_profile(tmp_path / "profiles" / "layer.csv")
    config = tmp_path / "sim.toml"
    config.write_text(
        f"""
[replica]
model = "llama-2-7b"
device = "a100-80gb"
[execution]
model = "profiled"
[execution.profiled]
profiles = ["profiles"]
regressor = "linear"
cache_dir = "{tmp_path / "cache"}"
[workload]
kind = "synthetic"
num_requests = 200
arrival = {{ kind = "poisson", qps = 4.0 }}
prompt_tokens = {{ kind = "fixed", value = 300 }}
output_tokens = {{ kind = "fixed", value = 20 }}
"""
    )
    from tokenyard.simulation import load_config

    result = simulate(load_config(config))
    sources = result.summary["config"]["execution"]["op_sources"]
    assert sources["attn_decode"] == "profile:linear"
    assert sources["lm_head"] == "roofline"
    assert result.summary["num_requests"] == 200
    assert math.isfinite(result.summary["latency_s"]["tpot"]["p50"])


@pytest.mark.parametrize(
    ("execution", "field"),
    [
        ({"model": "quadratic"}, "execution.model"),
        ({"model": "profiled"}, "execution.profiled.profiles"),
        ({"profiled": {"regressor": "svm"}}, "execution.profiled.regressor"),
        ({"efficiency": {"memory": 0}}, "execution.efficiency.memory"),
        ({"cpu": {"sample_s": -1.0}}, "execution.cpu.sample_s"),
        ({"profiled": {"profiles": "a.csv"}}, "execution.profiled.profiles"),
    ],
)
def test_bad_execution_configs_name_the_key(execution: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_mapping({"execution": execution})
    assert err.value.field == field


# --- the CLI -----------------------------------------------------------------------------


def test_predictor_eval_reports_held_out_error_per_op(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = synthetic_profile(tmp_path / "p.csv")
    out = tmp_path / "errors.json"
    code = cli_main(
        [
            "predictor",
            "eval",
            "--profiles",
            str(profile),
            "--regressor",
            "linear",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert "attn_prefill" in text
    assert "gate_up_proj" in text
    import json

    errors = {e["op"]: e for e in json.loads(out.read_text())}
    assert errors["attn_decode"]["mape"] < 1e-6  # the linear basis is the formula's
    assert errors["gate_up_proj"]["num_test"] == 3  # 20% of 13 shapes


def test_predictor_show_prints_the_breakdown(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli_main(
        ["predictor", "show", "--model", "llama-2-7b", "--device", "a100-80gb", "--prefill", "512"]
    )
    assert code == 0
    assert "qkv_proj" in capsys.readouterr().out
    assert cli_main(["predictor", "show", "--model", "gpt-9", "--device", "a100-80gb"]) == 2
    assert "gpt-9" in capsys.readouterr().err
