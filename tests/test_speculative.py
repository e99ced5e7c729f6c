"""Speculative decoding in vllm_v1 replicas (docs/speculative.md): the closed-form mean of
tokens per step under i.i.d. acceptance, the per-request invariants on random workloads,
determinism, what each method's draft work costs, and typed errors for bad configs."""

from __future__ import annotations

import csv
import math
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenyard.errors import ConfigError
from tokenyard.simulation import config_from_mapping, simulate

#: One second per step plus 0.1 s per prefill token and 0.2 s per decode token (drafts too).
STEP_MODEL = {
    "model": "linear",
    "constant_s": 1.0,
    "per_prefill_token_s": 0.1,
    "per_decode_token_s": 0.2,
    "per_decode_context_token_s": 0.0,
    "per_prefill_context_token_s": 0.0,
    "cpu_overhead_s": 0.0,
}


_TRACES = tempfile.TemporaryDirectory(prefix="tokenyard-spec-")


def write_trace(rows: list[tuple[float, int, int]]) -> str:
    """A Vidur-format trace of ``rows`` (arrival, prompt, output), in arrival order."""
    path = Path(_TRACES.name) / f"trace-{abs(hash(tuple(rows)))}.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["arrived_at", "num_prefill_tokens", "num_decode_tokens"])
        writer.writerows(sorted(rows))
    return str(path)


def mapping(
    speculative: dict[str, Any] | None,
    *,
    rows: list[tuple[float, int, int]] | None = None,
    num_requests: int = 200,
    output_tokens: int = 200,
    execution: dict[str, Any] | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    workload: dict[str, Any] = {
        "kind": "synthetic",
        "num_requests": num_requests,
        "seed": 0,
        "arrival": {"kind": "poisson", "qps": 2.0},
        "prompt_tokens": {"kind": "fixed", "value": 64},
        "output_tokens": {"kind": "fixed", "value": output_tokens},
    }
    if rows is not None:
        workload = {"kind": "trace", "format": "vidur", "path": write_trace(rows)}
    m: dict[str, Any] = {
        "seed": seed,
        "cluster": {"num_replicas": 1},
        "replica": {"scheduler": {"policy": "vllm_v1"}},
        "execution": execution or STEP_MODEL,
        "workload": workload,
    }
    if speculative is not None:
        m["replica"]["speculative"] = speculative
    return m


def run(m: dict[str, Any]) -> Any:
    return simulate(config_from_mapping(m))


def closed_form(alpha: float, k: int) -> tuple[float, float]:
    """Mean and standard deviation of accepted + 1 when each of k drafts is accepted with
    probability alpha until the first rejection."""
    probs = [alpha**j * (1 - alpha) for j in range(k)] + [alpha**k]
    mean = sum((j + 1) * p for j, p in enumerate(probs))
    var = sum((j + 1 - mean) ** 2 * p for j, p in enumerate(probs))
    return mean, math.sqrt(var)


@pytest.mark.parametrize(("alpha", "k"), [(0.5, 1), (0.6, 3), (0.8, 2), (0.9, 5)])
def test_iid_acceptance_gives_the_closed_form_tokens_per_step(alpha: float, k: int) -> None:
    result = run(
        mapping({"method": "ngram", "num_speculative_tokens": k, "acceptance_rate": alpha})
    )
    spec = result.summary["speculative"]
    mean, sd = closed_form(alpha, k)
    assert mean == pytest.approx((1 - alpha ** (k + 1)) / (1 - alpha))
    # Thousands of independent steps: the pooled mean's standard error is sd / sqrt(steps).
    # Five standard errors bound it; the seed is fixed, so the run is the same every time.
    tolerance = 5 * sd / math.sqrt(spec["num_steps"])
    assert spec["num_steps"] > 5000
    assert abs(spec["mean_tokens_per_step"] - mean) < tolerance, (spec, mean, tolerance)
    # vLLM's acceptance rate: accepted / drafted.
    assert spec["acceptance_rate"] == pytest.approx((mean - 1) / k, abs=tolerance)


rows_strategy = st.lists(
    st.tuples(st.floats(0, 3), st.integers(1, 40), st.integers(1, 30)), min_size=1, max_size=12
)


@settings(max_examples=30, deadline=None)
@given(
    rows=rows_strategy,
    k=st.integers(1, 5),
    accepted=st.integers(0, 5),
)
def test_fixed_acceptance_emits_exactly_accepted_plus_one_per_step(
    rows: list[tuple[float, int, int]], k: int, accepted: int
) -> None:
    # Every step accepts exactly j drafts, so each request's draws are known: it emits j + 1
    # tokens per verify step after its first token, the last step trimmed to what is left.
    # A one-token prompt admitted beside decodes computes its first token with k placeholder
    # drafts (vLLM 0.33's padding): one more verify step, none of its drafts accepted.
    rows = sorted(rows)
    j = min(accepted, k)
    dist = [0.0] * (k + 1)
    dist[j] = 1.0
    result = run(
        mapping(
            {"method": "ngram", "num_speculative_tokens": k, "accepted_distribution": dist},
            rows=rows,
        )
    )
    c = result.columns
    assert len(c["request_id"]) == len(rows), "every request finishes"
    for i, (_, prompt, output) in enumerate(rows):
        steps = math.ceil((output - 1) / (j + 1))
        padded = int(c["spec_steps"][i]) - steps
        assert c["num_restarts"][i] == 0
        assert padded in ((0, 1) if prompt == 1 else (0,)), (i, prompt, output)
        assert c["spec_draft_tokens"][i] == k * (steps + padded)
        assert c["spec_accepted_tokens"][i] == j * steps


@settings(max_examples=30, deadline=None)
@given(
    rows=rows_strategy,
    k=st.integers(1, 5),
    alpha=st.floats(0, 1),
    seed=st.integers(0, 2**32),
    num_blocks=st.sampled_from([None, 24]),
)
def test_random_acceptance_never_emits_more_than_k_plus_one_per_step(
    rows: list[tuple[float, int, int]], k: int, alpha: float, seed: int, num_blocks: int | None
) -> None:
    rows = sorted(rows)
    m = mapping(
        {"method": "ngram", "num_speculative_tokens": k, "acceptance_rate": alpha},
        rows=rows,
        seed=seed,
    )
    if num_blocks:  # tight memory: preemptions while drafts are in flight
        m["replica"]["scheduler"] = {
            "policy": "vllm_v1",
            "num_blocks": num_blocks,
            "block_size": 4,
            "max_request_tokens": 80,
        }
    first = run(m)
    c = first.columns
    assert len(c["request_id"]) == len(rows), "every request finishes"
    steps = c["spec_steps"].astype(np.int64)
    drafts = c["spec_draft_tokens"].astype(np.int64)
    accepted = c["spec_accepted_tokens"].astype(np.int64)
    output = c["num_decode_tokens"].astype(np.int64)
    assert (accepted <= drafts).all()
    assert (drafts <= k * steps).all()
    # A step emits at most k + 1 tokens (and a recompute after a preemption emits one).
    assert ((k + 1) * steps + c["num_restarts"] >= output - 1).all()
    assert (c["completed_at"] >= c["first_token_at"]).all()
    again = run(m)
    for name in ("completed_at", "first_token_at", "spec_steps", "spec_accepted_tokens"):
        assert np.array_equal(again.columns[name], c[name]), f"{name}: same seed, same run"


def test_the_seed_drives_the_draws() -> None:
    spec = {"method": "ngram", "num_speculative_tokens": 3, "acceptance_rate": 0.7}
    a = run(mapping(spec, num_requests=20, seed=1)).columns["spec_accepted_tokens"]
    b = run(mapping(spec, num_requests=20, seed=1)).columns["spec_accepted_tokens"]
    c = run(mapping(spec, num_requests=20, seed=2)).columns["spec_accepted_tokens"]
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_speculation_cuts_tpot_and_each_method_pays_its_draft_work() -> None:
    # The roofline prices real models: a 7B target on an A100. With the same acceptance,
    # ngram drafts for free, an EAGLE head costs one layer per pass, a draft model as large
    # as the target costs a whole decode per pass.
    base: dict[str, Any] = {"num_speculative_tokens": 3, "acceptance_rate": 0.8}
    roofline = {"model": "roofline"}
    tpot = {}
    for method, extra in [
        ("off", None),
        ("ngram", {}),
        ("eagle", {}),
        ("draft_model", {"draft_model": "llama-2-7b"}),
    ]:
        spec = None if extra is None else {"method": method, **base, **extra}
        result = run(mapping(spec, num_requests=50, execution=roofline))
        tpot[method] = result.summary["latency_s"]["tpot"]["mean"]
    assert tpot["ngram"] < tpot["eagle"] < tpot["off"] < tpot["draft_model"], tpot


def test_a_verify_step_reads_each_requests_kv_once_and_costs_no_less_than_a_decode() -> None:
    # 32 requests at 600 tokens of context, each verifying 3 drafts: 128 GEMM rows, but
    # the attention of 32 sequences (priced as without drafts), for every predictor kind.
    from tokenyard.predictor.compiled import batch_features
    from tokenyard.predictor.measured.data import package_root
    from tokenyard.simulation.execution import build_predictor

    models = ["roofline", "measured"] if package_root() is not None else ["roofline"]
    for model in models:
        config = config_from_mapping({"execution": {"model": model}})
        predictor = build_predictor(config)
        assert predictor is not None
        shape = dict(
            num_requests=32,
            num_prefill_tokens=0,
            sum_decode_context=32 * 600,
            sum_prefill_context=0,
            sum_prefill_squared=0,
            num_padding_rows=0,
        )
        plain = batch_features(num_decode_tokens=32, **shape)
        verify = batch_features(num_decode_tokens=128, num_spec_decode_tokens=96, **shape)
        assert verify["decode_sequences"] == 32
        attn_plain = predictor.op_times(plain)["attn_decode"]
        attn_verify = predictor.op_times(verify)["attn_decode"]
        assert attn_verify == pytest.approx(attn_plain, rel=0.02), model
        assert predictor.stage_time(verify)[0] > predictor.stage_time(plain)[0], model


def test_spec_off_leaves_the_summary_without_a_speculative_section() -> None:
    result = run(mapping(None, num_requests=5))
    assert "speculative" not in result.summary
    assert int(result.columns["spec_steps"].sum()) == 0


OK = {"method": "ngram", "num_speculative_tokens": 2, "acceptance_rate": 0.5}


@pytest.mark.parametrize(
    ("speculative", "key"),
    [
        ({**OK, "method": "medusa"}, "replica.speculative.method"),
        ({**OK, "num_speculative_tokens": 0}, "replica.speculative.num_speculative_tokens"),
        ({**OK, "num_speculative_tokens": None}, "replica.speculative.num_speculative_tokens"),
        ({**OK, "acceptance_rate": 1.5}, "replica.speculative.acceptance_rate"),
        ({**OK, "acceptance_rates": [0.5, 0.5]}, "replica.speculative.acceptance_rate"),
        (
            {"method": "ngram", "num_speculative_tokens": 2},
            "replica.speculative.acceptance_rate",
        ),
        (
            {"method": "ngram", "num_speculative_tokens": 2, "acceptance_rates": [0.5]},
            "replica.speculative.acceptance_rates",
        ),
        (
            {"method": "ngram", "num_speculative_tokens": 2, "acceptance_rates": [0.5, 2.0]},
            "replica.speculative.acceptance_rates[1]",
        ),
        (
            {"method": "ngram", "num_speculative_tokens": 1, "accepted_distribution": [0.5, 0.4]},
            "replica.speculative.accepted_distribution",
        ),
        ({**OK, "draft_model": "llama-2-7b"}, "replica.speculative.draft_model"),
        ({**OK, "method": "draft_model"}, "replica.speculative.draft_model"),
        ({"acceptance_rate": 0.5}, "replica.speculative.acceptance_rate"),
        ({"num_speculative_tokens": 3}, "replica.speculative.num_speculative_tokens"),
    ],
)
def test_bad_configs_name_their_key(speculative: dict[str, Any], key: str) -> None:
    speculative = {k: v for k, v in speculative.items() if v is not None}
    with pytest.raises(ConfigError) as info:
        config_from_mapping(mapping(speculative))
    assert info.value.field == key, str(info.value)


def test_the_scheduler_section_leaves_k_to_the_speculative_section() -> None:
    # k set on the step scheduler alone would pad admissions with drafts nobody judges.
    m = mapping(None)
    m["replica"]["scheduler"] = {"policy": "vllm_v1", "vllm_v1": {"num_speculative_tokens": 2}}
    with pytest.raises(ConfigError) as info:
        config_from_mapping(m)
    assert info.value.field == "replica.scheduler.vllm_v1.num_speculative_tokens"


@pytest.mark.parametrize("policy", ["vllm", "sarathi", "sglang"])
def test_other_replica_policies_refuse_speculation(policy: str) -> None:
    m = mapping(OK)
    m["replica"]["scheduler"] = {"policy": policy}
    with pytest.raises(ConfigError) as info:
        config_from_mapping(m)
    assert info.value.field == "replica.speculative.method"


def test_a_draft_model_must_be_in_the_catalog_and_priced_by_a_model_aware_predictor() -> None:
    spec = {**OK, "method": "draft_model", "draft_model": "llama-9b"}
    with pytest.raises(ConfigError) as info:
        run(mapping(spec, num_requests=2))
    assert info.value.field == "replica.speculative.draft_model"
    spec["draft_model"] = "llama-2-7b"
    with pytest.raises(ConfigError) as info:
        run(mapping(spec, num_requests=2))  # linear ignores the model: it cannot price it
    assert info.value.field == "replica.speculative.draft_model"


def test_whole_numbers_in_acceptance_lists_are_numbers() -> None:
    for key, value in (("accepted_distribution", [0, 0, 0, 1]), ("acceptance_rates", [1, 0.5, 0])):
        config = config_from_mapping(
            {
                "replica": {
                    "speculative": {"method": "ngram", "num_speculative_tokens": 3, key: value}
                }
            }
        )
        assert getattr(config.replica.speculative, key) == tuple(float(v) for v in value)
    with pytest.raises(ConfigError, match="must be a list of numbers"):
        config_from_mapping(
            {
                "replica": {
                    "speculative": {
                        "method": "ngram",
                        "num_speculative_tokens": 1,
                        "acceptance_rates": ["high"],
                    }
                }
            }
        )


# ---- vLLM's prefix-cache rules for EAGLE/MTP drafters ---------------------------------------


def test_the_drafters_lookahead_is_vllms() -> None:
    # VllmConfig.num_prefill_lookahead_tokens and num_hash_lookahead_tokens: EAGLE reads one
    # token past a chunk; MTP one per module it chains (min(num_mtp_layers, k) > 1: k);
    # drafters without the target's hidden states none. The hashes cover it only with
    # prefix caching on and no KV connector.
    from tokenyard.simulation.speculative import SpeculativeConfig

    def spec(method: str, k: int = 3) -> SpeculativeConfig:
        return SpeculativeConfig(method=method, num_speculative_tokens=k, acceptance_rate=0.5)

    assert spec("eagle").num_prefill_lookahead_tokens(0) == 1
    assert spec("mtp").num_prefill_lookahead_tokens(1) == 1
    assert spec("mtp").num_prefill_lookahead_tokens(2) == 3
    assert spec("mtp", k=1).num_prefill_lookahead_tokens(4) == 1
    assert spec("ngram").num_prefill_lookahead_tokens(0) == 0
    assert spec("draft_model").num_prefill_lookahead_tokens(0) == 0
    hashes = spec("mtp").num_hash_lookahead_tokens
    assert hashes(3, prefix_caching=True, kv_connector=False) == 3
    assert hashes(3, prefix_caching=False, kv_connector=False) == 0
    assert hashes(3, prefix_caching=True, kv_connector=True) == 0


def _shared_prefix_hits(
    method: str | None,
    prefix_tokens: int = 600,
    prompt_tokens: int = 1000,
    kv_offload: dict[str, float] | None = None,
) -> set[int]:
    """Each request's prefix hit tokens: 64 prompts of 1,000 tokens opening with one
    600-token prefix (37 shared blocks of 16 tokens: 592), k = 2 drafts of ``method``;
    ``kv_offload``: the replica's host tier."""
    m = mapping(
        {"method": method, "num_speculative_tokens": 2, "acceptance_rate": 0.6} if method else None,
        num_requests=64,
        output_tokens=8,
    )
    m["workload"] = {
        **m["workload"],
        "prompt_tokens": {"kind": "fixed", "value": prompt_tokens},
        "shared_prefix": {"num_groups": 1, "prefix_tokens": prefix_tokens, "share_ratio": 1.0},
    }
    if kv_offload is not None:
        m["replica"]["kv_offload"] = kv_offload
    return {int(x) for x in run(m).columns["prefix_hit_tokens"]}


def test_eagle_beside_a_host_tier_keeps_the_legacy_hashes_and_drops() -> None:
    # A host tier is vLLM's offloading connector (kv_offloading_size builds one), beside
    # which VllmConfig.num_hash_lookahead_tokens is 0, and Scheduler.__init__ then keeps
    # EAGLE's use_eagle_block_drop (cleared only by look-ahead hashes): (prefill
    # look-ahead, hash look-ahead, drop) for the replica.
    from tokenyard.simulation.replica_plan import _drafter_lookahead

    eagle = {"method": "eagle", "num_speculative_tokens": 2, "acceptance_rate": 0.6}
    plain = config_from_mapping(mapping(eagle))
    assert _drafter_lookahead(plain, caching=True) == (1, 1, False)
    tiered = mapping(eagle)
    tiered["replica"]["kv_offload"] = {"host_memory_gb": 4.0}
    assert _drafter_lookahead(config_from_mapping(tiered), caching=True) == (1, 0, True)
    assert _drafter_lookahead(config_from_mapping(tiered), caching=False) == (1, 0, False)
    assert _drafter_lookahead(config_from_mapping(mapping(None)), caching=True) == (0, 0, False)


def test_the_lookahead_keys_are_derived_not_set() -> None:
    for key in ("num_hash_lookahead_tokens", "num_prefill_lookahead"):
        m = mapping(None)
        m["replica"]["scheduler"]["vllm_v1"] = {key: 1}
        with pytest.raises(ConfigError, match="derived from") as err:
            run(m)
        assert err.value.field == f"replica.scheduler.vllm_v1.{key}"
