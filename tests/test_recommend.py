"""``tokenyard recommend``: the estimator against the simulator on steady loads, the answer
on a hand-computable case, the verification rule, typed CLI errors and fresh outputs."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import pytest

from tokenyard.cli import main
from tokenyard.errors import ConfigError
from tokenyard.recommend import estimate as est
from tokenyard.recommend.cli import length_distribution
from tokenyard.recommend.recommend import Ask, recommend
from tokenyard.recommend.table import format_table, rows, write_outputs
from tokenyard.recommend.verify import headroom, verify_points
from tokenyard.search.config import SLO
from tokenyard.simulation import simulate
from tokenyard.simulation.config import config_from_mapping

#: A predictor whose step takes ``constant + per decode token`` seconds whatever the
#: model, GPU or TP (the linear model ignores them), plus a CPU overhead per stage: TP2
#: buys nothing, PP2 pays the overhead twice per token.
LINEAR = {
    "model": "linear",
    "constant_s": 0.020,
    "per_prefill_token_s": 5e-5,
    "per_decode_token_s": 5e-4,
    "per_decode_context_token_s": 0.0,
    "per_prefill_context_token_s": 0.0,
    "cpu_overhead_s": 0.002,
}


def _closed_loop(model: str, device: str, tp: int, isl: int, osl: int, users: int) -> Any:
    return config_from_mapping(
        {
            "cluster": {"num_replicas": 1},
            "replica": {
                "model": model,
                "device": device,
                "tensor_parallel_size": tp,
                "scheduler": {
                    "policy": "vllm_v1",
                    "vllm_v1": {"max_num_seqs": 1024, "max_num_batched_tokens": 8192},
                },
            },
            "workload": {
                "kind": "synthetic",
                "num_requests": 30 * users,
                "arrival": {"kind": "poisson", "qps": 1e6},
                "prompt_tokens": {"kind": "lognormal", "median": isl, "sigma": 0.3},
                "output_tokens": {"kind": "lognormal", "median": osl, "sigma": 0.3},
                "closed_loop": {"concurrency": users},
            },
        }
    )


@pytest.mark.parametrize(
    ("model", "device", "tp", "isl", "osl", "users"),
    [
        ("llama-3.1-8b", "h100-sxm", 1, 1000, 200, 32),
        ("llama-3.1-8b", "h100-sxm", 1, 1000, 200, 128),
        ("llama-3.1-70b", "h200", 4, 4000, 500, 64),
    ],
)
def test_estimate_agrees_with_the_simulator_on_a_steady_load(
    model: str, device: str, tp: int, isl: int, osl: int, users: int
) -> None:
    """A closed loop of ``users`` keeps the batch the estimator assumes. Measured on these
    three (measured tables, vllm): the estimate's TPOT 7-10% under the simulation's and
    its throughput 11-14% over (no scheduling gaps, prompts spread evenly over steps);
    the bounds are 20% and 25%."""
    config = _closed_loop(model, device, tp, isl, osl, users)
    summary = simulate(config).summary
    mean_isl = isl * math.exp(0.3**2 / 2)  # lognormal means
    mean_osl = osl * math.exp(0.3**2 / 2)
    e = est.aggregated(
        est.pricer(config),
        isl=mean_isl,
        osl=mean_osl,
        batch_size=users,
        max_num_batched_tokens=8192,
        gpus=tp,
    )
    assert e is not None
    tpot = summary["latency_s"]["tpot"]["mean"]
    rps = summary["throughput"]["requests_per_s"]
    assert abs(e.tpot_s / tpot - 1) < 0.20, (e.tpot_s, tpot)
    assert abs(e.requests_per_s / rps - 1) < 0.25, (e.requests_per_s, rps)


def test_estimate_by_hand_on_a_constant_step() -> None:
    """Every step 10 ms: TPOT 10 ms at any batch, B / (OSL x 10 ms) requests/s, TTFT one
    chunk step plus half a step; a budget too small for the prompts is infeasible."""

    def price(*, stage: int, num_stages: int, **shape: int) -> float:
        return 0.010

    e = est.aggregated(price, isl=100, osl=10, batch_size=8, max_num_batched_tokens=2048, gpus=2)
    assert e is not None
    assert e.tpot_s == pytest.approx(0.010)
    assert e.requests_per_s == pytest.approx(8 / (10 * 0.010))
    assert e.tokens_per_s_per_gpu == pytest.approx(8 / 0.010 / 2)
    assert e.ttft_s == pytest.approx(0.010 + 0.005)
    # 8 decodes + 8 x 100 / 10 = 80 prompt tokens per step do not fit a budget of 64.
    assert est.aggregated(price, isl=100, osl=10, batch_size=8, max_num_batched_tokens=64) is None
    best = est.best_batch(
        lambda b: est.aggregated(price, isl=100, osl=10, batch_size=b, max_num_batched_tokens=2048),
        max_kv_tokens=24 * 110,
        ttft_s=None,
        tpot_s=None,
    )
    assert best.batch_size == 24  # the largest on the ladder whose KV fits


def _ask(**overrides: Any) -> Ask:
    fields: dict[str, Any] = {
        "model": "llama-3.1-8b",
        "systems": ("h100_sxm",),
        "workload": {
            "kind": "synthetic",
            "num_requests": 1500,
            "arrival": {"kind": "poisson", "qps": 1.0},
            "prompt_tokens": {"kind": "fixed", "value": 200},
            "output_tokens": {"kind": "fixed", "value": 50},
        },
        "slo": {"ttft_p90_s": 0.5, "tpot_p90_s": 0.05},
        "gpus": 2,
        "sample": 300,
        "execution": LINEAR,
        "disaggregated": False,
        "top_k": 3,
        "show": 3,
    }
    fields.update(overrides)
    return Ask(**fields)


@pytest.fixture(scope="module")
def small() -> Any:
    return recommend(_ask(), executor="serial")


def test_two_tp1_replicas_beat_one_tp2_replica(small: Any) -> None:
    """With a predictor TP does not speed up, TP1 x 2 serves about twice what TP2 x 1
    does on the same 2 GPUs, and PP2 pays its CPU overhead twice per token."""
    best = small.best("agg")
    assert best is not None
    sim, verdict = best
    assert sim.candidate.label == "TP1 x2"
    assert sim.candidate.layout.device == "h100-sxm"  # h100_sxm: aiconfigurator's name
    by_label = {s.candidate.label: (s, v) for s, v in small.points}
    if "TP2 x1" in by_label:
        assert by_label["TP2 x1"][1].rate < 0.7 * verdict.rate
    for s, v in small.points:  # every recommended point held on the whole load
        assert v.held
        assert v.num_requests == 1500
        assert all(v.metrics[k] <= b for k, b in small.slo.bounds.items())
        assert v.rate <= s.capacity * (1 - small.ask.margin) * (1 + 1e-9)


def test_table_has_the_asked_percentiles_and_target(small: Any) -> None:
    table = rows(small)
    first = table[0]
    for key in ("ttft_p90_s", "tpot_p90_s", "target_qps", "gpus", "tokens_per_s_per_gpu"):
        assert key in first
    assert "ttft_p99_s" not in first
    assert first["binding"] in ("ttft_p90_s", "tpot_p90_s")
    assert first[f"headroom_{first['binding']}"] == min(
        first["headroom_ttft_p90_s"], first["headroom_tpot_p90_s"]
    )
    # What the run served (its Poisson draw and drain included), near the rate x 50 tokens
    served = small.points[0][1].metrics["decode_tokens_per_s"] / 2
    assert first["tokens_per_s_per_gpu"] == pytest.approx(served)
    assert first["tokens_per_s_per_gpu"] == pytest.approx(first["target_qps"] * 50 / 2, rel=0.05)
    text = format_table(small, table)
    assert "TP1 x2" in text
    assert "best aggregated" in text
    assert "vllm serve" in text


class _FakeExecutor:
    """Runs no simulation: a point holds every SLO at rates up to ``holds_up_to[tag]``."""

    max_in_flight = 4

    def __init__(self, holds_up_to: dict[Hashable, float]):
        self.holds_up_to = holds_up_to
        self.queue: list[tuple[Hashable, dict[str, Any]]] = []

    def submit(self, tag: Hashable, payload: dict[str, Any]) -> None:
        self.queue.append((tag, payload))

    def wait(self) -> list[tuple[Hashable, dict[str, Any]]]:
        out = []
        for tag, payload in self.queue:
            rate = payload["rate"]
            ttft = 0.5 if rate <= self.holds_up_to[tag] else 2.0
            metrics = {"ttft_p90_s": ttft}
            probe = {"rate": rate, "metrics": metrics, "requests_per_s": rate}
            out.append((tag, {**probe, "num_requests": 10, "wall_s": 0.0, "error": None}))
        self.queue = []
        return out

    def close(self) -> None:
        pass


def test_verification_steps_down_then_rejects() -> None:
    slo = SLO("s", {"ttft_p90_s": 1.0})
    fake = _FakeExecutor({"ok": 10.0, "down": 8.5, "never": 1.0})
    points = [("ok", {}, 9.0), ("down", {}, 9.0), ("never", {}, 9.0)]
    verdicts = verify_points(points, slo, fake, margin=0.1)
    assert verdicts["ok"].held
    assert verdicts["ok"].rate == 9.0
    assert not verdicts["ok"].stepped_down
    assert verdicts["down"].held
    assert verdicts["down"].rate == pytest.approx(8.1)
    assert verdicts["down"].tried == pytest.approx((9.0, 8.1))
    assert "stepped down 1x" in verdicts["down"].note(0.1)
    never = verdicts["never"]
    assert not never.held
    assert never.tried == pytest.approx((9.0, 8.1, 7.29))
    assert never.note(0.1).startswith("rejected: the full run broke ttft_p90_s")
    # A fixed target rate is never stepped down: the point is rejected at once.
    fixed = verify_points(points, slo, fake, margin=0.1, step_down=False)
    assert not fixed["down"].held
    assert fixed["down"].tried == (9.0,)
    assert headroom({"ttft_p90_s": 1.0}, {"ttft_p90_s": 0.5}) == {"ttft_p90_s": 0.5}


def test_a_point_the_whole_trace_breaks_is_not_recommended(tmp_path: Path) -> None:
    """The first 200 requests of the trace are short, the rest long: the capacity found on
    the sample is far too high for the whole trace. Nothing the whole trace breaks at its
    rate is recommended; what is recommended held there."""
    lines = ["arrived_at,num_prefill_tokens,num_decode_tokens"]
    for i in range(3000):
        prompt, output = (100, 10) if i < 1000 else (1500, 120)
        lines.append(f"{i * 0.1:.3f},{prompt},{output}")
    trace = tmp_path / "trace.csv"
    trace.write_text("\n".join(lines) + "\n")
    ask = _ask(
        workload={"kind": "trace", "format": "vidur", "path": str(trace)},
        slo={"ttft_p90_s": 0.2, "tpot_p90_s": 0.05},
        sample=1000,
        margin=0.1,
        show=2,
    )
    result = recommend(ask, executor="serial")
    assert result.rejected, "the sample's capacities should not hold on the whole trace"
    for _sim, verdict in result.rejected:
        assert not verdict.held
        assert verdict.note(0.1).startswith("rejected")
    for sim, verdict in result.points:
        assert verdict.held
        assert verdict.num_requests == 3000
        assert verdict.rate < sim.capacity * 0.9 * 0.9 * (1 + 1e-9)  # stepped down at least once
    table = rows(result)
    assert all(r["recommended"] == (r["note"] == "" or "stepped" in r["note"]) for r in table)


def test_tokens_per_gpu_come_from_the_whole_load_run(tmp_path: Path) -> None:
    """The sample (the first 300 requests) has 10 output tokens each, the whole trace
    mostly 100: a point's output tokens/s per GPU is what its whole-load run served, not
    its rate x the sample's mean output (about 8x too low here)."""
    lines = ["arrived_at,num_prefill_tokens,num_decode_tokens"]
    for i in range(1500):
        lines.append(f"{i * 0.1:.3f},200,{10 if i < 300 else 100}")
    trace = tmp_path / "trace.csv"
    trace.write_text("\n".join(lines) + "\n")
    ask = _ask(
        workload={"kind": "trace", "format": "vidur", "path": str(trace)},
        slo={"e2e_p90_s": 5.0},
        sample=300,
        show=1,
    )
    result = recommend(ask, executor="serial")
    assert result.points
    assert result.mean_osl == pytest.approx(10.0)
    for r, (sim, verdict) in zip(rows(result), result.points, strict=False):
        served = verdict.metrics["decode_tokens_per_s"] / sim.candidate.gpus
        assert r["tokens_per_s_per_gpu"] == pytest.approx(served)
        assert served > 5 * verdict.rate * result.mean_osl / sim.candidate.gpus


def test_stale_outputs_are_replaced(small: Any, tmp_path: Path) -> None:
    out = tmp_path / "rec"
    write_outputs(small, rows(small), out, "first")
    first = sorted(p.name for p in (out / "launch").iterdir())
    # vLLM's scheduler was simulated: only vLLM launch lines, none for an unverified engine
    assert first == [f"agg-{i}.vllm.sh" for i in range(1, len(small.points) + 1)]
    (out / "launch" / "agg-9.vllm.sh").write_text("stale")
    one = dataclasses.replace(small, points=small.points[:1], summaries=small.summaries[:1])
    write_outputs(one, rows(one), out, "second")
    assert sorted(p.name for p in (out / "launch").iterdir()) == ["agg-1.vllm.sh"]
    assert sorted(p.name for p in (out / "configs").iterdir()) == ["agg-1.toml"]
    assert (out / "summary.txt").read_text() == "second\n"
    assert "tensor_parallel_size = 1" in (out / "configs" / "agg-1.toml").read_text()


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (
            ["--gpus", "2", "--isl", "100", "--osl", "10", "--ttft", "1", "--percentile", "95"],
            "--percentile",
        ),
        (["--gpus", "2", "--isl", "gamma:k=1", "--osl", "10", "--ttft", "1"], "--isl"),
        (["--gpus", "2", "--isl", "100", "--ttft", "1"], "--osl"),
        (
            ["--gpus", "2", "--isl", "100", "--osl", "10", "--trace", "t.csv", "--ttft", "1"],
            "--isl",
        ),
        (
            ["--gpus", "2", "--isl", "100", "--osl", "10", "--ttft", "1", "--margin", "1.5"],
            "--margin",
        ),
        (["--gpus", "2", "--isl", "100", "--osl", "10"], "--slo"),
        (["--gpus", "2", "--isl", "100", "--osl", "10", "--slo", "ttft_p95=1"], "--slo"),
        (["--gpus", "0", "--isl", "100", "--osl", "10", "--ttft", "1"], "--gpus"),
        # Flags that would change nothing are refused, not ignored.
        (["--gpus", "2", "--workload", "w.toml", "--requests", "99", "--ttft", "1"], "--requests"),
        (
            ["--gpus", "2", "--isl", "9", "--osl", "9", "--trace-format", "azure", "--ttft", "1"],
            "--trace-format",
        ),
        (
            [
                "--gpus",
                "2",
                "--isl",
                "9",
                "--osl",
                "9",
                "--slo",
                "ttft_p99=1",
                "--percentile",
                "50",
            ],
            "--percentile",
        ),
        (
            ["--gpus", "2", "--isl", "9", "--osl", "9", "--ttft", "1", "--mtp-acceptance", "0.7"],
            "--mtp-acceptance",
        ),
        (
            ["--gpus", "2", "--isl", "9", "--osl", "9", "--ttft", "1", "--workers", "2", "--ray"],
            "--workers",
        ),
    ],
)
def test_cli_errors_name_the_flag(
    argv: list[str], field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["recommend", "--model", "llama-3.1-8b", "--system", "h100_sxm", *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("tokenyard recommend: error: ")
    assert field in err


def test_cli_unknown_system_lists_the_names(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--gpus", "2", "--isl", "100", "--osl", "10", "--ttft", "1", "--system", "h300"]
    assert main(["recommend", "--model", "llama-3.1-8b", *argv]) == 2
    err = capsys.readouterr().err
    assert "unknown device 'h300'" in err
    assert "h200_sxm" in err


def test_length_distributions() -> None:
    assert length_distribution("4000", "--isl") == {"kind": "fixed", "value": 4000}
    assert length_distribution("lognormal:median=4000,sigma=0.5", "--isl") == {
        "kind": "lognormal",
        "median": 4000,
        "sigma": 0.5,
    }
    with pytest.raises(ConfigError, match="--osl: 'high' is not key=number"):
        length_distribution("uniform:low=1,high", "--osl")


def test_a_target_rate_sizes_the_replicas() -> None:
    """40 requests/s where one TP1 replica carries about 15: the estimate sizes TP1 x4, whose
    simulated capacity (57 requests/s) shows 3 replicas would do (x3: 46.0, and 46.0 x 0.9
    >= 40); the answer is the smallest size that fits, verified at 40."""
    result = recommend(_ask(gpus=None, rate=40.0), executor="serial")
    sim, verdict = result.best("agg")
    assert sim.candidate.label == "TP1 x3"
    assert verdict.rate == 40.0
    assert sim.capacity * 0.9 >= 40.0
    assert rows(result)[0]["target_qps"] == 40.0
    shapes = [s.candidate.shape for s, _ in result.points]
    assert len(shapes) == len(set(shapes))  # one size per layout


def test_a_concurrency_is_served_closed_loop() -> None:
    """48 users: the load is a number of users (the synthetic arrivals no bound), verified
    at 48, and the throughput is what the users drew."""
    result = recommend(_ask(gpus=None, concurrency=48), executor="serial")
    sim, verdict = result.best("agg")
    assert verdict.closed_loop
    assert verdict.rate == 48.0
    row = rows(result)[0]
    assert row["target_users"] == 48.0
    assert row["tokens_per_s_per_gpu"] == pytest.approx(
        verdict.requests_per_s * 50 / sim.candidate.gpus
    )
    assert verdict.requests_per_s > 10  # users, not the workload's 1 QPS, set the load


def test_the_package_imports_nothing_until_asked() -> None:
    """The command line imports ``tokenyard.recommend.cli`` to add the subcommand: that
    must not import the search, the simulator or the other modules (start-up)."""
    import subprocess
    import sys

    code = (
        "import sys, tokenyard.recommend, tokenyard.recommend.cli\n"
        "print(sorted(m for m in sys.modules if m.startswith(('tokenyard.recommend.', "
        "'tokenyard.search.', 'tokenyard.simulation'))))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert loaded.strip() == "['tokenyard.recommend.cli']", loaded
    import tokenyard.recommend as package

    for name in package.__all__:
        assert getattr(package, name) is not None


def test_sglang_skips_what_its_policy_refuses() -> None:
    """Under --framework sglang: no pipeline-parallel layout (SGLang's scheduler has none),
    no P/D (the simulator's pools are vLLM's), said in a note and in the skips; the best
    point's launch line is SGLang's."""
    result = recommend(_ask(framework="sglang", disaggregated=True), executor="serial")
    sim, _ = result.best("agg")
    assert sim.candidate.label == "TP1 x2"
    assert all(s.candidate.layout.pp == 1 for s in result.simulated)
    assert result.best("disagg") is None
    assert any("P/D not searched" in n for n in result.notes)
    assert any("pipeline parallelism" in why for _, why in result.skipped)
    text = format_table(result, rows(result))
    assert "python -m sglang.launch_server" in text


def test_a_load_the_search_cannot_time_is_refused_first() -> None:
    """A session workload has no request rate to bisect (each turn waits for the one
    before): refused before anything runs, naming the fix."""
    sessions = {"kind": "sessions", "num_sessions": 10}
    with pytest.raises(ConfigError, match="closed_loop"):
        recommend(_ask(workload=sessions), executor="serial")


def test_mtp_variants_need_a_drafter_and_an_acceptance_rate() -> None:
    """MTP speculative variants (1-3 tokens) join the aggregated candidates only for a model
    with an MTP module and only with an acceptance rate (a property of the data); their
    simulation configs are accepted as they are."""
    from tokenyard.recommend.candidates import Space, enumerate_candidates

    space = Space(isl=200, osl=50, ttft_s=0.5, tpot_s=0.05, gpus=16, disaggregated=False)
    deepseek = _ask(model="deepseek-ai/DeepSeek-V3", systems=("h200",), gpus=16)
    base = deepseek.base(deepseek.sample_workload())
    plain, _ = enumerate_candidates(space, base, ["h200"], framework="vllm")
    assert not any(c.speculative for c in plain)
    with_mtp = dataclasses.replace(space, mtp_acceptance=0.7)
    found, _ = enumerate_candidates(with_mtp, base, ["h200"], framework="vllm")
    spec = [c for c in found if c.speculative]
    assert len(spec) == 3 * len(plain)
    assert {c.speculative["num_speculative_tokens"] for c in spec} == {1, 2, 3}
    config = config_from_mapping(spec[0].simulation(base, "vllm_v1"))
    assert config.replica.speculative.method == "mtp"
    assert spec[0].label.endswith(" MTP1")
    llama = _ask()  # Llama-3.1 ships no MTP module: no variants even with a rate
    found, _ = enumerate_candidates(
        dataclasses.replace(with_mtp, gpus=2),
        llama.base(llama.sample_workload()),
        ["h100-sxm"],
        framework="vllm",
    )
    assert not any(c.speculative for c in found)


def test_moe_candidates_include_attention_dp_without_ep() -> None:
    """A MoE model's candidates include attention DP without EP (vLLM's
    ``--data-parallel-size`` without ``--enable-expert-parallel``: the experts one TP group
    of TP x DP GPUs) beside EP = TP x DP, each a document the simulator accepts; a dense
    model's include no DP at all (its DP ranks would be more replicas)."""
    from tokenyard.recommend.candidates import Space, enumerate_candidates

    space = Space(isl=200, osl=50, ttft_s=0.5, tpot_s=0.05, gpus=4, disaggregated=False)
    qwen = _ask(model="Qwen/Qwen3-30B-A3B", systems=("h200",), gpus=4)
    base = qwen.base(qwen.sample_workload())
    found, _ = enumerate_candidates(space, base, ["h200"], framework="vllm")
    layouts = {(c.layout.tp, c.layout.dp, c.layout.ep) for c in found}
    assert {(1, 2, 1), (2, 2, 1), (1, 4, 1)} <= layouts  # DP without EP
    assert {(1, 2, 2), (2, 2, 4), (1, 4, 4)} <= layouts  # and with EP
    plain = next(c for c in found if c.layout.dp == 2 and c.layout.ep == 1)
    assert plain.layout.label == f"TP{plain.layout.tp} DP2"
    config = config_from_mapping(plain.simulation(base, "vllm_v1"))
    assert config.replica.data_parallel_size == 2
    assert config.replica.expert_parallel_size == 1
    llama = _ask(gpus=4)
    found, _ = enumerate_candidates(
        dataclasses.replace(space, gpus=4),
        llama.base(llama.sample_workload()),
        ["h100-sxm"],
        framework="vllm",
    )
    assert found
    assert all(c.layout.dp == 1 and c.layout.ep == 1 for c in found)


def test_block_fp8_slices_vllm_refuses_are_skipped() -> None:
    """Qwen3-235B-A22B-FP8 (128 x 1536 experts, 128-wide FP8 blocks): DP without EP over
    8 GPUs would give each 1536 / 8 = 192 of every expert, which vLLM refuses
    (``validate_fp8_block_shape_moe``); the config refuses it, so it is a skip with the
    reason, while EP 8 over the same GPUs is a candidate."""
    from tokenyard.recommend.candidates import Space, enumerate_candidates

    space = Space(isl=200, osl=50, ttft_s=0.5, tpot_s=0.05, gpus=8, disaggregated=False)
    ask = _ask(model="Qwen/Qwen3-235B-A22B-FP8", systems=("h200",), gpus=8)
    found, skipped = enumerate_candidates(
        space, ask.base(ask.sample_workload()), ["h200"], framework="vllm"
    )
    layouts = {(c.layout.tp, c.layout.dp, c.layout.ep) for c in found}
    assert (4, 2, 8) in layouts
    assert (4, 2, 1) not in layouts
    reasons = dict(skipped)
    assert "FP8 blocks" in reasons["TP4 DP2 on h200"]


def test_vllm_default_caps_by_gpu() -> None:
    """``vllm serve``'s caps without flags (vLLM 0.33, ``EngineArgs.get_batch_defaults``,
    online serving): 1024 / 8192 on H100 and H200, 1024 / 16384 on B200, 256 / 2048 on an
    A100 80 GB (its name keeps it on the small tier) and on an L40S."""
    from tokenyard.catalog import current_catalog
    from tokenyard.recommend.candidates import vllm_default_caps

    devices = current_catalog().devices
    assert vllm_default_caps(devices["h100-sxm"]) == (1024, 8192)
    assert vllm_default_caps(devices["h200"]) == (1024, 8192)
    assert vllm_default_caps(devices["b200"]) == (1024, 16384)
    assert vllm_default_caps(devices["a100-80gb"]) == (256, 2048)
    assert vllm_default_caps(devices["l40s"]) == (256, 2048)


def test_vllm_default_caps_are_simulated_and_win_where_better(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An estimate that believes only 4 requests fit (its batch B = 4, so the caps it
    proposes are 4 and 8) is worse than vLLM's default caps (1024 / 8192 on H100) in
    simulation: every simulated aggregated layout also runs the default, at most one more
    search per layout, and the answer carries the default caps and their capacity."""
    real = est.best_batch

    def cramped(price: Any, *, max_kv_tokens: int, **kwargs: Any) -> Any:
        return real(price, max_kv_tokens=min(max_kv_tokens, 4 * 250), **kwargs)

    monkeypatch.setattr(est, "best_batch", cramped)
    result = recommend(_ask(top_k=2), executor="serial")
    by_shape: dict[str, list[Any]] = {}
    for s in result.simulated:
        by_shape.setdefault(s.candidate.shape, []).append(s)
    assert len(by_shape) == 2  # top_k layouts
    for sims in by_shape.values():
        defaults = [s for s in sims if s.candidate.default_caps]
        assert len(defaults) == 1
        assert (
            defaults[0].candidate.max_num_seqs,
            defaults[0].candidate.max_num_batched_tokens,
        ) == (
            1024,
            8192,
        )
        assert all(s.candidate.max_num_seqs <= 8 for s in sims if not s.candidate.default_caps)
    assert len(result.simulated) == 2 + 1 + 2  # best layout: B and 2B; the next: B; + defaults
    sim, _ = result.best("agg")
    assert sim.candidate.default_caps
    estimated = [s for s in by_shape[sim.candidate.shape] if not s.candidate.default_caps]
    assert sim.capacity > 1.2 * max(s.capacity for s in estimated)


def test_a_users_scheduler_table_is_kept(small: Any) -> None:
    """``replica.scheduler`` settings survive ``Ask.base`` (only the policy is the
    framework's), a user's ``max_request_tokens`` among them: recommend plans for it and
    adds no limit of its own."""
    from tokenyard.recommend.recommend import _request_limit

    user = {"max_request_tokens": 2048, "vllm_v1": {"enable_prefix_caching": False}}
    ask = _ask(replica={"scheduler": user})
    scheduler = ask.base(ask.sample_workload())["replica"]["scheduler"]
    assert scheduler == {**user, "policy": "vllm_v1"}
    limited, note = _request_limit(ask)
    assert note is None
    config = config_from_mapping(limited.base(limited.sample_workload()))
    assert config.replica.scheduler.max_request_tokens == 2048
    assert config.replica.scheduler.vllm_v1.enable_prefix_caching is False
    # The candidates set their caps on top of the user's table, not instead of it.
    candidate = small.points[0][0].candidate
    doc = candidate.simulation(limited.base(limited.sample_workload()), "vllm_v1")
    assert config_from_mapping(doc).replica.scheduler.max_request_tokens == 2048
    # vLLM's max_model_len is a user's limit too (it wins over max_request_tokens there)
    own = _ask(replica={"scheduler": {"vllm_v1": {"max_model_len": 4096}}})
    assert _request_limit(own)[1] is None
    assert _request_limit(_ask())[1] is not None  # no limit given: recommend sets one


@pytest.mark.parametrize("model", ["openai/gpt-oss-20b", "Qwen/Qwen3.5-35B-A3B"])
def test_hybrid_groups_cap_the_batch_by_the_blocks_of_every_group(model: str) -> None:
    """With vLLM's hybrid KV groups a request holds blocks in every group (gpt-oss: a full
    and a sliding-window group; Qwen3.5: full attention and Mamba state pages), so the
    tokens the estimates may fill are the requests the groups hold at once times their
    length, not ``num_blocks x block_size``, which counts each request's blocks once."""
    from tokenyard.recommend.candidates import Layout, Space, _dotted, _price_layouts
    from tokenyard.simulation.config import apply_overrides
    from tokenyard.simulation.hybrid_kv import requests_held
    from tokenyard.simulation.run import plan_for

    space = Space(isl=3000, osl=500, ttft_s=2.0, tpot_s=0.1, gpus=2, disaggregated=False)
    ask = _ask(model=model, systems=("h200",), gpus=2)
    base = ask.base(ask.sample_workload())
    layout = Layout("h200", 2, 1, 1, 1)
    skipped: list[tuple[str, str]] = []
    [priced] = _price_layouts(base, space, [layout], skipped)
    doc = apply_overrides(base, _dotted({"replica": layout.replica()}))
    config = config_from_mapping(doc)
    plan = plan_for(config)
    assert plan.kv_cache_groups
    held = requests_held(config, plan, 3500)
    assert priced.max_batch == held
    assert priced.max_kv_tokens == plan.max_kv_tokens  # the pool's tokens, as they are
    # Each request holds at least its full-attention blocks (219 of 16 tokens for gpt-oss,
    # a few of the aligned size for Qwen3.5) plus blocks in another group: fewer requests
    # than num_blocks x block_size / 3500 would say.
    assert held < plan.max_kv_tokens // 3500

    def decode(b: int) -> est.DecodeEstimate:
        return est.decode_only(priced.price, isl=3000, osl=500, batch_size=b)

    batch = est.best_batch(
        decode, max_kv_tokens=priced.max_kv_tokens, ttft_s=None, tpot_s=None, max_batch=held
    )
    assert batch is not None
    assert batch.batch_size <= held
    # The pool's tokens alone would let a larger batch through (gpt-oss holds more than
    # the ladder's top either way).
    loose = est.best_batch(decode, max_kv_tokens=priced.max_kv_tokens, ttft_s=None, tpot_s=None)
    assert loose is not None
    assert loose.batch_size > batch.batch_size or held >= est.BATCH_SIZES[-1]
