"""Expert parallelism and attention data parallelism, as vLLM serves MoE models (issue 29,
item 3): the layout keys and their refusals (DP without EP accepted: test_dp_without_ep.py),
memory per GPU by hand, and the measured pricing of DeepSeek-V3 (EP 8 over DP 8 on
H200s) and Qwen3-235B (TP 4 against EP 4)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from step_shapes import decodes, prompt
from synthetic_jobs import one_replica, synthetic_workload

from tokenyard import catalog
from tokenyard.catalog.quant import resolve_quantization
from tokenyard.errors import ConfigError
from tokenyard.predictor import roofline_predictor
from tokenyard.predictor.measured.build import measured_predictor
from tokenyard.predictor.measured.data import SYSTEM_OF_DEVICE, package_root, resolve_source
from tokenyard.simulation import plan_memory, simulate
from tokenyard.simulation.planner import parameters_per_device

#: 2 layers, h 1024, 8 heads of 128 (8 KV heads), 8 experts (top-2) of 512, vocab 1000.
TINY = catalog.ModelSpec(
    name="tiny-moe",
    num_layers=2,
    hidden_size=1024,
    num_heads=8,
    num_kv_heads=8,
    head_dim=128,
    intermediate_size=512,
    vocab_size=1000,
    context_length=4096,
    num_experts=8,
    experts_per_token=2,
)
H = 1024
ROUTER, NORMS = H * 8, 2 * H


def test_memory_per_gpu_by_hand_tp2_against_ep2() -> None:
    # TP 2: half the heads (q, o: 4 x 128; k, v: 4 KV heads), every expert's 512 halved.
    attention_tp2 = 2 * H * 512 + 2 * H * 512
    experts_tp2 = 3 * H * 256 * 8
    edge_tp2 = 500 * H + 500 * H + H  # embeddings and lm_head by vocab / 2, final norm
    tp2 = 2 * (attention_tp2 + experts_tp2 + ROUTER + NORMS) + edge_tp2
    assert parameters_per_device(TINY, 2, 1) == tp2 == 17_822_720
    # EP 2 over TP 2 (DP 1): the same attention; 4 whole experts per GPU: the same bytes.
    experts_ep2 = 3 * H * 512 * 4
    assert experts_ep2 == experts_tp2
    assert parameters_per_device(TINY, 2, 1, 2) == tp2
    # EP 2 over TP 1 x DP 2: every GPU holds the whole attention, embeddings and lm_head
    # (replicated across DP ranks) and half the experts, whole.
    attention_tp1 = 2 * H * 1024 + 2 * H * 1024
    ep2_dp2 = 2 * (attention_tp1 + experts_ep2 + ROUTER + NORMS) + 2 * 1000 * H + H
    assert parameters_per_device(TINY, 1, 1, 2) == ep2_dp2 == 23_041_024


def test_shared_experts_are_whole_under_sequence_parallel_moe() -> None:
    """vLLM 0.33 turns on sequence-parallel MoE with EP, TP > 1 and DP > 1
    (``ParallelConfig.use_sequence_parallel_moe``) and builds the shared experts whole
    on every GPU (``DeepseekV2MLP(disable_tp=is_sequence_parallel)``); with DP 1 they are
    split by TP. Gemma 4's dense MLP beside its experts is never sequence parallel."""
    shared = dataclasses.replace(TINY, num_shared_experts=1)  # one more expert of 512
    tp2 = parameters_per_device(TINY, 2, 1, 2)  # EP 2 = TP 2 x DP 1
    assert parameters_per_device(shared, 2, 1, 2) - tp2 == 2 * 3 * H * 256  # split by TP
    # EP 4 = TP 2 x DP 2: the routed experts halve again (2 whole ones a GPU), the shared
    # one is whole (3 x 1024 x 512 per layer) where DP 1 had half of it.
    ep4 = parameters_per_device(shared, 2, 1, 4)
    assert ep4 == tp2 - 2 * 3 * H * 512 * 2 + 2 * 3 * H * 512
    kept_split = dataclasses.replace(shared, sequence_parallel_shared_experts=False)
    assert parameters_per_device(kept_split, 2, 1, 4) == ep4 - 2 * 3 * H * 256


def test_the_planner_splits_shared_experts_by_the_predictors_rule_and_rounding() -> None:
    """A shared width TP does not divide (513 over TP 2) is floored, 256 a GPU, as the
    predictors' GEMMs take it (``shared_intermediate // (TP // sp)``), not rounded up; and
    whole under sequence-parallel MoE exactly when
    ``ModelSpec.shared_experts_sequence_parallel`` says so (EP 4 = TP 2 x DP 2)."""
    odd = dataclasses.replace(TINY, num_shared_experts=1, shared_expert_intermediate_size=513)
    base = parameters_per_device(TINY, 2, 1)
    assert parameters_per_device(odd, 2, 1) - base == 2 * 3 * H * 256
    assert odd.shared_experts_sequence_parallel(2, 4, 2) == 2
    whole = parameters_per_device(odd, 2, 1, 4, 2) - parameters_per_device(TINY, 2, 1, 4, 2)
    assert whole == 2 * 3 * H * 513


def test_the_roofline_runs_sequence_parallel_shared_experts_whole_on_a_tp_share() -> None:
    """The roofline's shared GEMMs under TP 2 x DP 2 (EP 4) are TP 1 x DP 4's (whole) at
    half the tokens: the same FLOPs per token as split by TP, but the whole weights read."""
    shared = dataclasses.replace(TINY, num_shared_experts=1)
    h100 = catalog.device("h100-sxm")
    sp = roofline_predictor(
        shared, h100, tensor_parallel_size=2, expert_parallel_size=4, data_parallel_size=2
    )
    whole = roofline_predictor(
        shared, h100, tensor_parallel_size=1, expert_parallel_size=4, data_parallel_size=4
    )
    split = roofline_predictor(shared, h100, tensor_parallel_size=2, expert_parallel_size=2)

    def seconds(predictor: Any, op: str, tokens: int) -> float:
        return float({o.name: o.cost for o in predictor.ops}[op].time(prompt(tokens)))

    for op in ("shared_gate_up_proj", "shared_down_proj"):
        assert seconds(sp, op, 4096) == pytest.approx(seconds(whole, op, 2048), rel=1e-12)
        # Weight-bound at 16 tokens: the whole weights take longer than TP's half.
        assert seconds(sp, op, 16) > 1.5 * seconds(split, op, 16)


def test_kv_per_gpu_is_the_dp_ranks_own() -> None:
    """Each DP rank's TP GPUs hold its own requests' KV: at TP 1 a GPU keeps all 8 KV
    heads of its tokens (8 KiB a token over 2 layers), at TP 2 half of them."""
    device = catalog.device("h100-sxm")
    common: dict[str, Any] = dict(
        num_pipeline_stages=1, memory_margin_fraction=0.1, max_request_tokens=4096, block_size=16
    )
    tp2 = plan_memory(TINY, device, tensor_parallel_size=2, **common)
    dp2 = plan_memory(TINY, device, tensor_parallel_size=1, expert_parallel_size=2, **common)
    assert tp2.kv_bytes_per_token == 2 * 2 * 128 * 4 * 2 == 4096
    assert dp2.kv_bytes_per_token == 8192
    assert dp2.parameter_bytes_per_device == 2 * 23_041_024
    usable = int(80 * 2**30 * 0.9)
    assert dp2.num_blocks == (usable - 2 * 23_041_024) // (8192 * 16)


def _config(replica: dict[str, Any], **cluster: Any) -> Any:
    workload = synthetic_workload(20, qps=5.0, prompt_tokens=100, output_tokens=10)
    return one_replica(replica, workload, cluster=cluster, execution={"model": "roofline"})


@pytest.mark.parametrize(
    ("replica", "field", "words"),
    [
        (
            {"model": "mixtral-8x7b", "tensor_parallel_size": 2, "expert_parallel_size": 4},
            "replica.expert_parallel_size",
            "tensor_parallel_size x data_parallel_size = 2 x 1 = 2",
        ),
        (
            {"model": "mixtral-8x7b", "expert_parallel_size": 0},
            "replica.expert_parallel_size",
            "",
        ),
    ],
)
def test_contradictory_layouts_are_refused_naming_the_key(
    replica: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(ConfigError) as error:
        _config({"device": "h100-sxm", **replica})
    assert error.value.field == field
    assert words in str(error.value)


def test_attention_dp_without_ep_is_accepted() -> None:
    """DP 2 without EP was refused before vLLM's layout for it was modelled; it now runs
    (tests/test_dp_without_ep.py prices it): the experts as TP over TP x DP GPUs."""
    config = _config({"device": "h100-sxm", "model": "mixtral-8x7b", "data_parallel_size": 2})
    assert config.replica.expert_parallel_size == 1
    c = simulate(config).summary["config"]
    assert c["layout"] == "TP 1 x DP 2 (2 schedulers), PP 1"
    assert "DP 2 without EP" in c["execution"]["a2a"]


def _refused_by_simulate(replica: dict[str, Any], match: str) -> ConfigError:
    """The error simulating ``replica`` on an H100 raises (its config builds)."""
    config = _config({"device": "h100-sxm", **replica})
    with pytest.raises(ConfigError, match=match) as error:
        simulate(config)
    return error.value


def test_expert_parallelism_needs_experts_it_divides() -> None:
    dense = {"model": "llama-3.1-8b", "tensor_parallel_size": 2, "expert_parallel_size": 2}
    error = _refused_by_simulate(dense, "needs a mixture-of-experts model")
    assert error.field == "replica.expert_parallel_size"
    # Mixtral's 8 experts over TP 1 x DP 3: 3 does not divide them.
    uneven = {"model": "mixtral-8x7b", "expert_parallel_size": 3, "data_parallel_size": 3}
    error = _refused_by_simulate(uneven, "does not divide the 8 routed experts")
    assert error.field == "replica.expert_parallel_size"


def test_expert_parallelism_is_served_in_disaggregated_pools() -> None:
    """Both pools take the replica's EP 2 over TP 2 (tests/test_decode_pool_layout.py has
    the decode pool's own layouts)."""
    config = _config(
        {
            "model": "mixtral-8x7b",
            "device": "h100-sxm",
            "tensor_parallel_size": 2,
            "expert_parallel_size": 2,
        },
        decode={"num_replicas": 1},
    )
    decode = simulate(config).summary["config"]["decode"]
    assert decode["layout"] == "TP 2, EP 2, PP 1"


def test_a_dp_rank_runs_its_own_scheduler_and_prices_the_all_to_all() -> None:
    """Mixtral over TP 1 x DP 2 with EP 2 on the calibrated roofline: two schedulers per
    replica, each step with a dispatch and a combine of ``DP x tokens x h x top-k / EP``
    16-bit values."""
    config = _config(
        {
            "model": "mixtral-8x7b",
            "device": "h100-sxm",
            "expert_parallel_size": 2,
            "data_parallel_size": 2,
        }
    )
    result = simulate(config)
    c = result.summary["config"]
    assert c["layout"] == "TP 1 x DP 2 (2 schedulers), EP 2, PP 1"
    assert len(result.summary["replicas"]["busy_fraction"]) == 2
    assert c["execution"]["a2a"].startswith("roofline: tokens x hidden x top-k / EP")
    predictor = roofline_predictor(
        catalog.model("mixtral-8x7b"),
        catalog.device("h100-sxm"),
        expert_parallel_size=2,
        data_parallel_size=2,
    )
    dispatch = next(op for op in predictor.ops if op.name == "moe_dispatch")
    assert dispatch.cost.bytes == {"num_tokens": 2 * 4096 * 2 * 2 / 2}  # type: ignore[union-attr]


def _bundled(name: str) -> catalog.ModelSpec:
    if package_root() is None or name not in catalog.bundled_model_names():
        pytest.skip("aiconfigurator-core's tables and bundled configs are not installed")
    return catalog.model(name)


def _measured(model: catalog.ModelSpec, device: str, **layout: Any) -> Any:
    """The measured predictor of ``model`` on ``device``'s tables (vLLM, latest), FP8 KV."""
    root = package_root()
    assert root is not None
    quant = resolve_quantization(model.quantization, "auto", "auto")
    assert quant is not None
    return measured_predictor(
        model,
        catalog.device(device),
        resolve_source(root, SYSTEM_OF_DEVICE[device], "vllm", "latest"),
        weight_dtype="auto",
        kv_cache_dtype="fp8",
        weight_bytes=quant.bytes_per_weight,
        kv_bytes=1.0,
        quantization=quant,
        **layout,
    )


def _attention_dp(ranks: int) -> dict[str, int]:
    """TP 1 x DP ``ranks``, the experts spread over all of them (EP ``ranks``)."""
    return {"tensor_parallel_size": 1, "expert_parallel_size": ranks, "data_parallel_size": ranks}


def _decode_ms(predictor: Any, batch: int, context: int = 2047) -> float:
    return float(predictor.stage_time(decodes(batch, context + 1))[1]) * 1e3


def test_deepseek_v3_ep8_dp8_on_h200s_against_tp8() -> None:
    """8 H200s, FP8 checkpoint and KV. Memory: DP 8 holds the whole attention, dense
    layers, shared expert and embeddings on every GPU (about 15.7 GB more than TP 8) and
    32 whole experts; each of its 8 ranks caches its own tokens. Decode at 1024
    sequences (128 a rank): faster than TP 8, whose every GPU reads all 1024 latents."""
    model = _bundled("deepseek-ai/DeepSeek-V3")
    quant = resolve_quantization(model.quantization, "auto", "auto")
    common: dict[str, Any] = dict(
        num_pipeline_stages=1,
        memory_margin_fraction=0.1,
        max_request_tokens=8192,
        block_size=16,
        kv_cache_dtype="fp8",
        quantization=quant,
    )
    h200 = catalog.device("h200")
    tp8 = plan_memory(model, h200, tensor_parallel_size=8, **common)
    ep8 = plan_memory(model, h200, tensor_parallel_size=1, expert_parallel_size=8, **common)
    assert tp8.max_kv_tokens == 1_454_848  # docs/catalog.md
    assert 15e9 < ep8.parameter_bytes_per_device - tp8.parameter_bytes_per_device < 16.5e9
    assert 8 * ep8.max_kv_tokens > 5 * tp8.max_kv_tokens  # 8 pools, not one replicated
    tp = _measured(model, "h200", tensor_parallel_size=8)
    ep = _measured(model, "h200", **_attention_dp(8))
    sources = {op.name: op.source for op in ep.ops}
    assert sources["moe_experts"].startswith("measured:moe")
    assert sources["moe_dispatch"].startswith("measured:moe_a2a")
    assert (
        "all-to-all deepep_ll up to 256 tokens per GPU, deepep_ht above"
        in ep.description["kernels"]
    )
    assert _decode_ms(ep, 128) < 0.85 * _decode_ms(tp, 1024)


def test_sequence_parallel_shared_experts_run_whole_on_a_tp_share_of_the_tokens() -> None:
    """DeepSeek-V3 over TP 2 x DP 4 (EP 8) on H200s: vLLM 0.33's sequence-parallel MoE
    runs the shared expert whole (2048 wide) on each GPU's half of the layer's tokens, so
    its measured GEMMs at 4096 tokens are TP 1's at 2048 (TP 1 x DP 8, whole, every
    token); with DP 1 (TP 2, EP 2) they are split by TP (1024 wide) over all 4096."""
    model = _bundled("deepseek-ai/DeepSeek-V3")
    sp = _measured(
        model, "h200", tensor_parallel_size=2, expert_parallel_size=8, data_parallel_size=4
    )
    whole = _measured(model, "h200", **_attention_dp(8))
    split = _measured(model, "h200", tensor_parallel_size=2, expert_parallel_size=2)

    def ms(predictor: Any, op: str, tokens: float) -> float:
        cost = {o.name: o.cost for o in predictor.ops}[op]
        return float(cost.time({"num_tokens": tokens})) * 1e3

    for op in ("shared_gate_up_proj", "shared_down_proj"):
        assert ms(sp, op, 4096) == pytest.approx(ms(whole, op, 2048), rel=1e-9)
        assert ms(sp, op, 4096) != pytest.approx(ms(split, op, 4096), rel=1e-3)


def test_shared_expert_gemms_take_the_shared_width_not_the_routed_one() -> None:
    """Gemma 4's dense MLP beside its experts (its shared expert) is 2112 wide, its routed
    experts 704: the measured shared GEMMs are priced at 2112; Nemotron-H's non-gated
    shared MLP (up, down of 3712) at up 3712, down 3712 (not gate-up 2 x 1856)."""
    root = package_root()
    assert root is not None
    source = resolve_source(root, SYSTEM_OF_DEVICE["h100-sxm"], "vllm", "latest")

    def ms(model: catalog.ModelSpec, op: str) -> float:
        predictor = measured_predictor(
            model, catalog.device("h100-sxm"), source, weight_dtype="bf16", kv_bytes=2.0
        )
        cost = {o.name: o.cost for o in predictor.ops}[op]
        return float(cost.time({"num_tokens": 4096.0})) * 1e3

    gemma = _bundled("google/gemma-4-26B-A4B")
    narrow = dataclasses.replace(gemma, shared_expert_intermediate_size=704)
    assert ms(gemma, "shared_down_proj") > 1.5 * ms(narrow, "shared_down_proj")
    nano = _bundled("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")
    half = dataclasses.replace(nano, shared_expert_intermediate_size=1856)
    assert ms(nano, "shared_down_proj") > 1.5 * ms(half, "shared_down_proj")


def test_deepseek_v3_ep8_dp8_simulates_end_to_end() -> None:
    _bundled("deepseek-ai/DeepSeek-V3")
    replica = {
        "model": "deepseek-ai/DeepSeek-V3",
        "device": "h200",
        "tensor_parallel_size": 1,
        "expert_parallel_size": 8,
        "data_parallel_size": 8,
        "kv_cache_dtype": "fp8",
    }
    workload = synthetic_workload(40, qps=4.0, prompt_tokens=(100, 2000), output_tokens=(10, 50))
    result = simulate(one_replica(replica, workload))
    c = result.summary["config"]
    assert c["layout"] == "TP 1 x DP 8 (8 schedulers), EP 8, PP 1"
    assert c["execution"]["model"] == "measured"
    assert c["execution"]["a2a"].startswith("measured: deepep_ll")
    assert c["execution"]["op_sources"]["moe_combine"].startswith("measured:moe_a2a")
    assert len(result.summary["replicas"]["busy_fraction"]) == 8
    assert result.summary["num_requests"] == 40


def test_qwen3_235b_fp8_tp4_against_ep4_on_h100s() -> None:
    """EP 4 over TP 4: the same bytes per GPU (32 whole experts of 1536 against 128 of
    384), the MoE table's ``moe_ep_size = 4`` rows instead of ``moe_tp_size = 4``, and no
    all-to-all (without DP, vLLM reduces the experts' output with the TP all-reduce)."""
    model = _bundled("Qwen/Qwen3-235B-A22B-FP8")
    h100 = catalog.device("h100-sxm")
    quant = resolve_quantization(model.quantization, "auto", "auto")
    common: dict[str, Any] = dict(
        tensor_parallel_size=4,
        num_pipeline_stages=1,
        memory_margin_fraction=0.1,
        max_request_tokens=8192,
        block_size=16,
        quantization=quant,
    )
    tp = plan_memory(model, h100, **common)
    ep = plan_memory(model, h100, expert_parallel_size=4, **common)
    assert tp.parameter_bytes_per_device == ep.parameter_bytes_per_device
    by_tp = _measured(model, "h100-sxm", tensor_parallel_size=4)
    by_ep = _measured(model, "h100-sxm", tensor_parallel_size=4, expert_parallel_size=4)
    assert not any(op.name.startswith("moe_dis") for op in by_ep.ops)
    assert {op.name: op.source for op in by_ep.ops}["moe_experts"].startswith("measured:moe")
    assert _decode_ms(by_ep, 256) != _decode_ms(by_tp, 256)


def test_an_all_to_all_the_tables_lack_falls_back_with_its_reason() -> None:
    """Qwen3-235B over TP 1 x DP 4: vLLM 0.24.0's H100 all-to-all table measures EP 8 at
    other MoE shapes only, so the calibrated roofline prices it and says why."""
    model = _bundled("Qwen/Qwen3-235B-A22B-FP8")
    predictor = _measured(model, "h100-sxm", **_attention_dp(4))
    sources = {op.name: op.source for op in predictor.ops}
    assert sources["moe_dispatch"] == "calibrated"
    assert "moe_a2a_perf" in predictor.description["fallbacks"]["moe_dispatch"]
    assert "not measured" in predictor.description["a2a"]
