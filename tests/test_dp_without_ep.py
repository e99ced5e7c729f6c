"""Attention DP without expert parallelism, as vLLM 0.33 runs ``--data-parallel-size``
without ``--enable-expert-parallel`` (``FusedMoEParallelConfig.make`` with ``use_ep``
false): the experts one TP group of TP x DP GPUs on every DP rank's tokens, all-gathered
and reduce-scattered over the DP ranks (``AgRsAll2AllManager``). Memory per GPU by hand,
the MoE at the ``moe_tp_size = TP x DP`` rows, the two collectives from NCCL's rows, the
roofline alike, the launch line and the dense-model refusal."""

from __future__ import annotations

from typing import Any

import pytest
from synthetic_jobs import one_replica, synthetic_workload

from tokenyard import catalog
from tokenyard.catalog.quant import resolve_quantization
from tokenyard.errors import ConfigError
from tokenyard.predictor import roofline_predictor
from tokenyard.predictor.measured.build import measured_predictor
from tokenyard.predictor.measured.data import SYSTEM_OF_DEVICE, package_root, resolve_source
from tokenyard.predictor.measured.lookup import read
from tokenyard.predictor.measured.ops import CollectiveTimes, MoeShape, MoeTimes
from tokenyard.recommend.launch import sglang_commands, vllm_commands
from tokenyard.simulation import plan_memory, simulate
from tokenyard.simulation.run import decode_config, plan_for

QWEN = "Qwen/Qwen3-30B-A3B"  # 48 layers, h 2048, 32 heads / 4 KV heads of 128, 128 x 768
H, LAYERS, EXPERTS = 2048, 48, 128


def _plan(**layout: Any) -> Any:
    return plan_memory(
        catalog.model(QWEN),
        catalog.device("h200"),
        num_pipeline_stages=1,
        memory_margin_fraction=0.1,
        max_request_tokens=8192,
        block_size=16,
        **layout,
    )


def test_memory_per_gpu_by_hand_tp2_dp2_without_ep() -> None:
    """TP 2 x DP 2, EP 1, bf16: the attention split by TP 2 (q, o: 16 heads of 128; k, v:
    2 KV heads), each of the 128 experts' 768 split by TP x DP = 4 (192), the router
    whole, embeddings and lm_head by vocab / 2."""
    attention = H * 2 * 16 * 128 + H * 2 * 2 * 128
    experts = 3 * H * 192 * EXPERTS
    layer = attention + experts + H * EXPERTS + 2 * H  # + router, two norms
    edge = 2 * (151_936 // 2) * H + H  # embeddings, lm_head, final norm
    params = LAYERS * layer + edge
    assert params == 8_024_688_640
    plan = _plan(tensor_parallel_size=2, data_parallel_size=2)
    assert plan.parameter_bytes_per_device == 2 * params
    # TP 2 alone holds each expert at 384, twice the routed weights; the KV is the
    # rank's own, as at TP 2 (2 KV heads of 128, 2 bytes, K and V, 48 layers).
    tp2 = _plan(tensor_parallel_size=2)
    assert tp2.parameter_bytes_per_device - plan.parameter_bytes_per_device == 2 * LAYERS * experts
    assert plan.kv_bytes_per_token == tp2.kv_bytes_per_token == 2 * 2 * 2 * 128 * LAYERS
    usable = int(catalog.device("h200").memory_gib * 2**30 * 0.9)
    assert plan.num_blocks == (usable - 2 * params) // (plan.kv_bytes_per_token * 16)


def _config(replica: dict[str, Any], **execution: Any) -> Any:
    workload = synthetic_workload(20, qps=5.0, prompt_tokens=100, output_tokens=10)
    return one_replica(
        {"model": QWEN, "device": "h200", **replica},
        workload,
        execution=execution or {"model": "roofline"},
    )


def test_dp_without_ep_simulates_with_a_scheduler_per_rank() -> None:
    config = _config({"tensor_parallel_size": 2, "data_parallel_size": 2})
    result = simulate(config)
    c = result.summary["config"]
    assert c["layout"] == "TP 2 x DP 2 (2 schedulers), PP 1"
    assert len(result.summary["replicas"]["busy_fraction"]) == 2
    words = c["execution"]["a2a"]
    for said in ("DP 2 without EP", "moe_tp 4", "equal load"):
        assert said in words


def test_the_roofline_runs_the_gathered_tokens_at_tp_x_dp_and_prices_the_ring() -> None:
    """Against TP 2 alone: every expert GEMM sees twice the rows at half the width (the
    same FLOPs per GPU per rank token x 2 / 2), and an all-gather and a reduce-scatter of
    ``(DP - 1) x tokens x h`` 16-bit values each per MoE layer."""
    model, h200 = catalog.model(QWEN), catalog.device("h200")
    dp2 = roofline_predictor(model, h200, tensor_parallel_size=2, data_parallel_size=2)
    tp2 = roofline_predictor(model, h200, tensor_parallel_size=2)
    ops = {op.name: op for op in dp2.ops}
    for name in ("moe_all_gather", "moe_reduce_scatter"):
        assert ops[name].cost.bytes == {"num_tokens": (2 - 1) * H * 2}  # type: ignore[union-attr]
    assert not any(op.name.startswith(("moe_all", "moe_red")) for op in tp2.ops)
    act = {op.name: op for op in tp2.ops}["act"]
    # act's FLOPs: 3 x inter x rows a token; DP 2: inter 192 (768 / 4), rows 16 (top-8 x 2).
    assert ops["act"].cost.flops == {"num_tokens": 3.0 * 192 * 16}  # type: ignore[union-attr]
    assert act.cost.flops == {"num_tokens": 3.0 * 384 * 8}  # type: ignore[union-attr]
    assert "DP 2 without EP" in dp2.description["a2a"]


def _source() -> Any:
    root = package_root()
    if root is None:
        pytest.skip("aiconfigurator-core's tables are not installed")
    return resolve_source(root, SYSTEM_OF_DEVICE["h200"], "vllm", "latest")


def test_the_measured_moe_is_the_moe_tp4_rows_at_dp_times_the_tokens() -> None:
    source = _source()
    model = catalog.model(QWEN)
    predictor = measured_predictor(
        model, catalog.device("h200"), source, tensor_parallel_size=2, data_parallel_size=2
    )
    ops = {op.name: op for op in predictor.ops}
    rows = read(source, source.folders["moe"] / "moe_perf.parquet")
    shape = MoeShape("bfloat16", H, 768, 8, EXPERTS, tensor_parallel_size=4)
    assert len(shape.rows(rows)) > 0  # the table measures moe_tp_size 4
    times = MoeTimes(rows, shape, distribution="power_law_1.2")
    for tokens in (8.0, 64.0, 512.0):
        priced = float(ops["moe_experts"].cost.time({"num_tokens": tokens}))
        assert priced == pytest.approx(times(2 * tokens), rel=1e-6)
    nccl = read(source, source.folders["nccl"] / "nccl_perf.parquet")
    for name, op in (("moe_all_gather", "all_gather"), ("moe_reduce_scatter", "reduce_scatter")):
        assert ops[name].source.startswith("measured:nccl")
        curve = CollectiveTimes(nccl, 2, dtype_column="nccl_dtype", dtype="half", op=op)
        for tokens in (8.0, 512.0):
            priced = float(ops[name].cost.time({"num_tokens": tokens}))
            assert priced == pytest.approx(curve(tokens * H), rel=1e-6)
    assert "measured, NCCL all_gather / reduce_scatter over 2 GPUs" in predictor.description["a2a"]


def test_a_dp_group_past_the_nvlink_domain_keeps_the_roofline_with_the_reason() -> None:
    """TP 4 x DP 4 on 8-GPU H200 nodes: the DP group crosses nodes, which NCCL's one-node
    rows do not measure."""
    source = _source()
    predictor = measured_predictor(
        catalog.model(QWEN),
        catalog.device("h200"),
        source,
        tensor_parallel_size=4,
        data_parallel_size=4,
    )
    sources = {op.name: op.source for op in predictor.ops}
    assert sources["moe_all_gather"] != "measured:nccl"
    assert "NVLink domains" in predictor.description["fallbacks"]["moe_all_gather"]
    assert "not measured" in predictor.description["a2a"]


def test_a_dense_model_with_dp_is_refused_naming_the_key() -> None:
    config = one_replica(
        {"model": "llama-3.1-8b", "device": "h100-sxm", "data_parallel_size": 2},
        synthetic_workload(5, qps=5.0, prompt_tokens=100, output_tokens=10),
        execution={"model": "roofline"},
    )
    with pytest.raises(ConfigError, match="dense") as error:
        simulate(config)
    assert error.value.field == "replica.data_parallel_size"


def test_the_launch_line_sets_dp_without_enabling_ep() -> None:
    config = _config({"tensor_parallel_size": 2, "data_parallel_size": 2})
    argv = " ".join(vllm_commands(config)[0].argv)
    assert "--data-parallel-size 2" in argv
    assert "--enable-expert-parallel" not in argv
    sglang = sglang_commands(config)[0]
    argv = " ".join(sglang.argv)
    assert "--tp-size 4 " in argv
    assert "--attn-dp-size 2" in argv
    assert "--ep-size" not in argv
    assert any("dp_attention.py" in note for note in sglang.notes)


def test_a_block_fp8_split_vllm_refuses_is_refused() -> None:
    """Qwen3-235B-A22B-FP8's 1,536-wide experts in 128 x 128 blocks: TP 4 x DP 2 gives each
    GPU 192 of them, not whole blocks (vLLM: validate_fp8_block_shape_moe); TP 2 x DP 2's
    384 is three blocks."""
    model = catalog.model("Qwen/Qwen3-235B-A22B-FP8")
    quant = resolve_quantization(model.quantization, "auto", "auto")
    common: dict[str, Any] = dict(
        num_pipeline_stages=1,
        memory_margin_fraction=0.1,
        max_request_tokens=8192,
        block_size=16,
        quantization=quant,
    )
    h200 = catalog.device("h200")
    with pytest.raises(ConfigError, match="validate_fp8_block_shape_moe") as error:
        plan_memory(model, h200, tensor_parallel_size=4, data_parallel_size=2, **common)
    assert error.value.field == "replica.data_parallel_size"
    plan_memory(model, h200, tensor_parallel_size=2, data_parallel_size=2, **common)


def test_a_decode_pool_runs_dp_without_ep_with_its_own_plan() -> None:
    """A disaggregated cluster's decode pool of TP 1 x DP 4 without EP: each GPU holds
    every expert at 768 / 4 = 192 wide (the replica's TP 2 prefill pool at 384), and the
    decode pool's ranks each run a scheduler."""
    workload = synthetic_workload(10, qps=5.0, prompt_tokens=100, output_tokens=10)
    config = one_replica(
        {"model": QWEN, "device": "h200", "tensor_parallel_size": 2},
        workload,
        cluster={"decode": {"tensor_parallel_size": 1, "data_parallel_size": 4}},
        execution={"model": "roofline"},
    )
    decode = plan_for(decode_config(config))
    one_gpu = _plan(tensor_parallel_size=1, data_parallel_size=4)
    assert decode.parameter_bytes_per_device == one_gpu.parameter_bytes_per_device
    assert (
        _plan(tensor_parallel_size=1).parameter_bytes_per_device
        - (one_gpu.parameter_bytes_per_device)
        == 2 * LAYERS * 3 * H * (768 - 192) * EXPERTS
    )
    summary = simulate(config).summary["config"]
    assert summary["decode"]["layout"] == "TP 1 x DP 4 (4 schedulers), PP 1"
