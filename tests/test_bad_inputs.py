"""Every bad input is refused before work starts, with a typed error naming the key or the
request (issue 14's cases, one regression test each)."""

from __future__ import annotations

import csv
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tokenyard import _core
from tokenyard.errors import ConfigError, InputError, OutputError, PolicyError
from tokenyard.sched import Scheduler, SchedulerConfig
from tokenyard.simulation import config_from_mapping, simulate

LINEAR = {"model": "linear"}
POLICIES = ["vllm", "sarathi", "orca", "lightllm", "faster_transformer", "vllm_v1", "sglang"]


def trace(path: Path, rows: list[tuple[float, int, int]]) -> str:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["arrived_at", "num_prefill_tokens", "num_decode_tokens"])
        writer.writerows(rows)
    return str(path)


def run(path: str, policy: str, **replica: Any) -> Any:
    block = 1 if policy == "lightllm" else 16
    scheduler = {
        "policy": policy,
        "block_size": block,
        "num_blocks": 4096 // block,
        "max_request_tokens": 2048,
    }
    scheduler.update(replica.pop("scheduler", {}))
    return simulate(
        config_from_mapping(
            {
                "cluster": {"num_replicas": 1},
                "replica": {"scheduler": scheduler, **replica},
                "execution": LINEAR,
                "workload": {"kind": "trace", "format": "vidur", "path": path},
            }
        )
    )


@pytest.mark.parametrize("policy", POLICIES)
def test_an_over_length_request_is_one_input_error_for_every_policy(
    tmp_path: Path, policy: str
) -> None:
    # 4,096 tokens of KV per replica, requests of up to 2,048; request 1 has 6,000.
    path = trace(tmp_path / "t.csv", [(0.0, 100, 10), (1.0, 3000, 3000), (2.0, 100, 10)])
    with pytest.raises(InputError, match=r"request 1 \(3000 prompt \+ 3000 output") as err:
        run(path, policy)
    assert err.value.field == "request"
    message = str(err.value)
    assert "replica.scheduler." in message  # the limiting setting, by its key
    assert 'over_length = "skip"' in message


@pytest.mark.parametrize("policy", POLICIES)
def test_over_length_skip_leaves_the_request_out_and_counts_it(tmp_path: Path, policy: str) -> None:
    path = trace(tmp_path / "t.csv", [(0.0, 100, 10), (1.0, 3000, 3000), (2.0, 100, 10)])
    result = run(path, policy, over_length="skip")
    assert result.summary["num_skipped_over_length"] == 1
    assert result.columns["request_id"].tolist() == [0, 2]


@pytest.mark.parametrize("policy", ["vllm", "lightllm"])
def test_a_prompt_over_max_tokens_in_batch_names_it(tmp_path: Path, policy: str) -> None:
    path = trace(tmp_path / "t.csv", [(0.0, 600, 10)])
    with pytest.raises(InputError, match=r"max_tokens_in_batch = 512"):
        run(path, policy, scheduler={"max_tokens_in_batch": 512})


def test_a_huge_prompt_fails_at_once_without_allocating(tmp_path: Path) -> None:
    path = trace(tmp_path / "t.csv", [(0.0, 2**32 - 1, 1)])
    start = time.perf_counter()
    with pytest.raises(InputError, match="request 0"):
        run(path, "vllm_v1")
    assert time.perf_counter() - start < 5  # no 16 GB prompt is built first


@pytest.mark.parametrize(
    ("key", "value", "field"),
    [
        ("cluster.num_replicas", 100_000, "cluster.num_replicas"),
        ("workload.shared_prefix.prefix_tokens", 2**31, "workload.shared_prefix.prefix_tokens"),
        ("workload.prompt_tokens.sigma", 100.0, "workload.prompt_tokens.sigma"),
        ("workload.prompt_tokens.max_tokens", 2**32 - 1, "workload.prompt_tokens.max_tokens"),
        ("replica.scheduler.max_num_batched_tokens", 2**40, "max_num_batched_tokens"),
        ("execution.efficiency.gemm", 1e-300, "execution.efficiency.gemm"),
        ("seed", 2**64, "seed"),
        # vLLM refuses a step budget below the sequence cap (256 by default).
        (
            "replica.scheduler.vllm_v1.max_num_batched_tokens",
            128,
            "replica.scheduler.vllm_v1.max_num_batched_tokens",
        ),
    ],
)
def test_every_size_knob_is_bounded(key: str, value: Any, field: str) -> None:
    from tokenyard.simulation.config import apply_overrides, default_workload

    mapping: dict[str, Any] = {"workload": default_workload()}
    if key.startswith("execution.efficiency"):
        mapping["execution"] = {"model": "roofline"}
    with pytest.raises(ConfigError) as err:  # the workload is read first thing in simulate
        simulate(config_from_mapping(apply_overrides(mapping, {key: value})))
    assert field in str(err.value)
    assert str(err.value).startswith(err.value.field or "?")


def test_too_many_kv_blocks_across_the_cluster_are_refused() -> None:
    replica = _core.ReplicaSpec.vllm_v1(SchedulerConfig(num_blocks=2**20, max_model_len=4096))
    with pytest.raises(ConfigError, match=r"cluster\.num_replicas"):
        _core.SimConfig(
            num_replicas=4096,
            num_stages=1,
            global_policy="round_robin",
            balance=1.0,
            replica=replica,
            linear=_core.LinearModel(
                constant_s=0,
                per_prefill_token_s=0,
                per_decode_token_s=0,
                per_decode_context_token_s=0,
                per_prefill_context_token_s=0,
                cpu_overhead_s=0,
            ),
            seed=0,
            hash_block_size=16,
            sample_interval_s=1.0,
            record_stages=False,
            over_length="error",
        )


# --- the embeddable scheduler: update_from_output is tied to the step in flight ----------


def scheduler() -> Scheduler:
    s = Scheduler(SchedulerConfig(num_blocks=64, max_model_len=256))
    s.add_request("a", list(range(8)), max_tokens=4)
    return s


def test_tokens_for_a_request_with_no_step_in_flight_are_refused() -> None:
    s = scheduler()
    with pytest.raises(InputError, match="is not running"):  # still waiting
        s.update_from_output({"a": [1]})
    s.schedule()
    s.update_from_output({"a": [1]})
    with pytest.raises(InputError, match="no step in flight"):  # the same step again
        s.update_from_output({"a": [2]})
    out = s.schedule()  # nothing changed: one decode token, as without the bad calls
    assert out.num_scheduled_tokens == {"a": 1}


def test_more_tokens_than_scheduled_are_refused_and_nothing_changes() -> None:
    s = scheduler()
    s.schedule()
    with pytest.raises(InputError, match="at most 1"):
        s.update_from_output({"a": [1, 2, 3, 4, 5, 6]})
    s.update_from_output({"a": [1]})
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 1}


def test_a_partial_prefill_samples_nothing() -> None:
    s = Scheduler(SchedulerConfig(num_blocks=64, max_model_len=256, max_num_batched_tokens=4))
    s.add_request("a", list(range(8)), max_tokens=4)
    s.schedule()  # 4 of 8 prompt tokens: no token is sampled
    with pytest.raises(InputError, match="no step in flight"):
        s.update_from_output({"a": [1]})


def test_a_prefill_chunks_tokens_are_appended_where_asked() -> None:
    # vLLM 0.33's update_from_output appends what its runner returns for a prefill chunk:
    # the token joins the request, and the rest of its prefill computes it too.
    s = Scheduler(SchedulerConfig(num_blocks=64, max_model_len=256, max_num_batched_tokens=4))
    s.append_prefill_chunk_outputs = True
    s.add_request("a", list(range(8)), max_tokens=4)
    s.schedule()  # 4 of 8 prompt tokens
    s.update_from_output({"a": [100]})
    assert s.schedule().num_scheduled_tokens == {"a": 4}  # tokens 4..7 of 9
    s.update_from_output({"a": []})
    assert s.schedule().num_scheduled_tokens == {"a": 1}  # the appended token: 9 computed


@pytest.mark.parametrize(
    ("kwargs", "arg"),
    [
        ({"priority": 2**63}, "priority"),
        ({"priority": 1.5}, "priority"),
        ({"lora_id": -1}, "lora_id"),
        ({"eos_token_id": 2**32}, "eos_token_id"),
        ({"arrival_time": float("nan")}, "arrival_time"),
    ],
)
def test_add_request_arguments_are_typed_errors(kwargs: dict[str, Any], arg: str) -> None:
    s = Scheduler(SchedulerConfig(num_blocks=64, max_model_len=256))
    with pytest.raises(InputError) as err:
        s.add_request("a", [1, 2, 3], 4, **kwargs)
    assert err.value.field == arg
    with pytest.raises(InputError, match="max_tokens"):
        s.add_request("b", [1, 2, 3], 2**64)
    assert s.schedule().num_scheduled_tokens == {}  # nothing was queued


class CallsBack:
    """A scheduler plugin that calls back into the scheduler it serves."""

    def __init__(self) -> None:
        self.scheduler: Scheduler | None = None

    def order_waiting(self, waiting: list[Any]) -> list[Any]:
        assert self.scheduler is not None
        self.scheduler.schedule()
        return [v.request_id for v in waiting]

    def preemption_order(self, running: list[Any]) -> list[Any]:
        return [v.request_id for v in running]


def test_a_plugin_calling_back_into_the_scheduler_is_a_policy_error() -> None:
    plugin = CallsBack()
    s = Scheduler(SchedulerConfig(num_blocks=64, max_model_len=256), plugin=plugin)
    plugin.scheduler = s
    s.add_request("a", [1, 2, 3], 4)
    with pytest.raises(PolicyError, match="called back into the Scheduler"):
        s.schedule()


# --- simulator plugins' answers ---------------------------------------------------------


def plugin_run(tmp_path: Path, **sections: Any) -> Any:
    path = trace(tmp_path / "t.csv", [(0.0, 32, 4), (0.5, 32, 4)])
    mapping: dict[str, Any] = {
        "cluster": {"num_replicas": 2},
        "execution": LINEAR,
        "workload": {"kind": "trace", "format": "vidur", "path": path},
    }
    for key, value in sections.items():
        mapping[key] = value
    return simulate(config_from_mapping(mapping))


@pytest.mark.parametrize("answer", [-1, 2, 1.0, None, np.array([0]), "0", True])
def test_a_routing_answer_that_is_not_a_replica_index_is_a_policy_error(
    tmp_path: Path, answer: Any
) -> None:
    router = {"policy": "tests.sim_plugins:Answers", "options": {"answer": answer}}
    with pytest.raises(PolicyError, match=r"route\(\) returned"):
        plugin_run(tmp_path, cluster={"num_replicas": 2, "global_scheduler": router})


@pytest.mark.parametrize(
    "answer", [1.5, [(0, 1.5)], [(0,)], [[0, 1]], [(-1, 1)], [(0, 2**40)], np.array([[0, 1]])]
)
def test_a_batch_answer_of_the_wrong_shape_is_a_policy_error(tmp_path: Path, answer: Any) -> None:
    scheduler = {
        "policy": "tests.sim_plugins:BatchAnswers",
        "plugin": {"options": {"answer": answer}},
    }
    with pytest.raises(PolicyError, match="next_batch"):
        plugin_run(tmp_path, replica={"scheduler": scheduler})


@pytest.mark.parametrize("answer", [None, "x", float("nan"), 1.5, -0.1])
def test_a_kv_usage_answer_out_of_range_is_a_policy_error(tmp_path: Path, answer: Any) -> None:
    scheduler = {
        "policy": "tests.sim_plugins:KvUsageAnswers",
        "plugin": {"options": {"answer": answer}},
    }
    with pytest.raises(PolicyError, match="kv_usage"):
        plugin_run(tmp_path, replica={"scheduler": scheduler})


def test_plugin_options_a_constructor_rejects_name_the_key(tmp_path: Path) -> None:
    scheduler = {
        "policy": "tokenyard.simulation.plugins:TokenBudgetFcfs",
        "plugin": {"options": {"no_such_option": 1}},
    }
    with pytest.raises(ConfigError, match=r"replica\.scheduler\.plugin"):
        plugin_run(tmp_path, replica={"scheduler": scheduler})


def test_options_for_a_built_in_router_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"cluster\.global_scheduler\.options"):
        config_from_mapping({"cluster": {"global_scheduler": {"options": {"x": 1}}}})


def test_the_docs_replica_plugin_runs_under_pipeline_parallelism(tmp_path: Path) -> None:
    scheduler = {
        "policy": "tokenyard.simulation.plugins:TokenBudgetFcfs",
        "plugin": {"options": {"budget": 512}},
    }
    path = trace(tmp_path / "t.csv", [(0.1 * i, 64, 8) for i in range(40)])
    result = simulate(
        config_from_mapping(
            {
                "cluster": {"num_replicas": 1},
                "replica": {"num_pipeline_stages": 2, "scheduler": scheduler},
                "execution": LINEAR,
                "workload": {"kind": "trace", "format": "vidur", "path": path},
            }
        )
    )
    assert result.summary["num_requests"] == 40


@pytest.mark.parametrize("spec", ["math:nan", "math:pi"])
def test_an_execution_model_that_is_not_callable_is_a_config_error(spec: str) -> None:
    config = config_from_mapping({"execution": {"model": spec}})
    with pytest.raises(ConfigError, match="not a callable"):
        simulate(config)


def returns_text(**shape: Any) -> str:
    return "fast"


def test_an_execution_model_returning_a_non_number_is_a_policy_error(tmp_path: Path) -> None:
    path = trace(tmp_path / "t.csv", [(0.0, 32, 4)])
    config = config_from_mapping(
        {
            "execution": {"model": "tests.test_bad_inputs:returns_text"},
            "workload": {"kind": "trace", "format": "vidur", "path": path},
        }
    )
    with pytest.raises(PolicyError, match="execution-time model returned 'fast'"):
        simulate(config)


# --- the command line --------------------------------------------------------------------


def tokenyard(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tokenyard", *args],
        capture_output=True,
        text=True,
        timeout=120,
        **kwargs,
    )


def test_an_unusable_output_folder_fails_before_the_run(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    start = time.perf_counter()
    done = tokenyard("simulate", "--no-progress", "-o", str(tmp_path / "afile" / "sub"))
    assert time.perf_counter() - start < 20  # not after a 10,000-request simulation
    assert done.returncode == 2
    assert "cannot write" in done.stderr
    assert "Traceback" not in done.stderr


def test_output_error_is_typed_and_an_os_error() -> None:
    err = OutputError.of(FileExistsError(17, "File exists", "/x/y"), "/x")
    assert isinstance(err, OSError)
    assert str(err) == "cannot write /x/y: File exists"


def test_predictor_show_into_a_closed_pipe_ends_quietly() -> None:
    show = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tokenyard",
            "predictor",
            "show",
            "--model",
            "llama-2-7b",
            "--device",
            "a100-80gb",
            "--prefill",
            "512",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert show.stdout is not None
    show.stdout.readline()
    show.stdout.close()  # `| head -1`
    _, stderr = show.communicate(timeout=120)
    assert b"Traceback" not in stderr
    assert b"BrokenPipeError" not in stderr


def test_predictor_show_refuses_negative_sizes() -> None:
    done = tokenyard(
        "predictor", "show", "--model", "llama-2-7b", "--device", "a100-80gb", "--prefill", "-5000"
    )
    assert done.returncode == 2
    assert "must be an integer in [0, 16777216]" in done.stderr


def test_trace_flag_keeps_the_files_trace_options(tmp_path: Path) -> None:
    path = trace(tmp_path / "t.csv", [(0.1 * i, 32, 4) for i in range(50)])
    other = trace(tmp_path / "other.csv", [(0.1 * i, 32, 4) for i in range(50)])
    (tmp_path / "sim.toml").write_text(
        f'[execution]\nmodel = "linear"\n[workload]\nkind = "trace"\nformat = "vidur"\n'
        f'path = "{path}"\nlimit = 7\n'
    )
    done = tokenyard(
        "simulate", str(tmp_path / "sim.toml"), "--trace", other, "--json", "--no-progress"
    )
    assert done.returncode == 0, done.stderr
    assert '"num_requests": 7' in done.stdout


# --- one step-scheduler plugin protocol, in the embeddable Scheduler and in vllm_v1 ------


def step_plugin_run(tmp_path: Path, **scheduler: Any) -> Any:
    rows = [(0.0, 600 - 20 * i, 16) for i in range(24)]
    path = trace(tmp_path / "t.csv", rows)
    section = {"max_num_batched_tokens": 512, "max_num_seqs": 4}
    return simulate(
        config_from_mapping(
            {
                "cluster": {"num_replicas": 1},
                "replica": {"scheduler": {"policy": "vllm_v1", "vllm_v1": section, **scheduler}},
                "execution": LINEAR,
                "workload": {"kind": "trace", "format": "vidur", "path": path},
            }
        )
    )


def test_the_embeddable_schedulers_plugin_runs_unchanged_in_vllm_v1_replicas(
    tmp_path: Path,
) -> None:
    from tests.sim_plugins import RecordsIds
    from tokenyard.sched import ShortestPromptFirst

    Scheduler(SchedulerConfig(num_blocks=64, max_model_len=256), plugin=ShortestPromptFirst())
    fcfs = step_plugin_run(tmp_path)
    shortest = step_plugin_run(tmp_path, policy_plugin="tokenyard.sched:ShortestPromptFirst")
    # Prompts shrink with the request id: shortest-first serves the last arrivals first.
    first_fcfs = fcfs.columns["first_token_at"]
    first_spf = shortest.columns["first_token_at"]
    assert first_fcfs[0] < first_fcfs[-1]
    assert first_spf[-1] < first_spf[0]
    RecordsIds.seen.clear()
    step_plugin_run(tmp_path, policy_plugin="tests.sim_plugins:RecordsIds")
    assert RecordsIds.seen == set(range(24))  # the workload's ids, not internal slots


def test_a_policy_plugin_needs_vllm_v1() -> None:
    with pytest.raises(ConfigError, match=r"replica\.scheduler\.policy_plugin"):
        config_from_mapping(
            {"replica": {"scheduler": {"policy": "sarathi", "policy_plugin": "a.b:C"}}}
        )


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (
            lambda: __import__("tokenyard.kv").kv.BlockPool(num_blocks=2**64, block_size=16),
            "num_blocks",
        ),
        (lambda: __import__("tokenyard.kv").kv.CountingAllocator(num_blocks=2**63), "num_blocks"),
        (lambda: __import__("tokenyard.kv").kv.RadixCache(page_size=2**64), "page_size"),
        (lambda: __import__("tokenyard.kv").kv.RadixCache(page_size=1.0), "page_size"),
        (lambda: SchedulerConfig(num_blocks=2**64), "num_blocks"),
    ],
)
def test_huge_ints_are_config_errors_not_overflow_errors(build: Any, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        build()
    assert err.value.field == field


def test_abort_takes_one_id_or_many_and_a_str_is_one_id() -> None:
    s = Scheduler(SchedulerConfig(num_blocks=64, max_model_len=256))
    for rid in ("req", 7, "x", "y"):
        s.add_request(rid, [1, 2, 3], 4)
    s.abort("req")  # not the characters 'r', 'e', 'q'
    s.abort(7)
    s.abort(["x", "y"])
    assert not s.has_unfinished_requests()
    with pytest.raises(InputError, match="request_ids"):
        s.abort(1.5)


@pytest.mark.parametrize(
    ("file_scheduler", "override"),
    [
        ({"max_num_seqs": 32}, "replica.scheduler.vllm_v1.max_num_seqs"),
        ({"vllm_v1": {"max_num_seqs": 32}}, "replica.scheduler.max_num_seqs"),
        ({"max_num_seqs": 32}, "replica.scheduler.max_num_seqs"),
    ],
)
def test_an_override_wins_over_the_file_in_either_key_form(
    file_scheduler: dict[str, Any], override: str
) -> None:
    from tokenyard.simulation.config import apply_overrides

    document = {"replica": {"scheduler": {"policy": "vllm_v1", **file_scheduler}}}
    config = config_from_mapping(apply_overrides(document, {override: 64}))
    assert config.replica.scheduler.vllm_v1.max_num_seqs == 64


def test_a_one_level_override_follows_the_overridden_policy() -> None:
    from tokenyard.simulation.config import apply_overrides

    document = {"replica": {"scheduler": {"policy": "vllm_v1"}}}
    overrides = {"replica.scheduler.policy": "sglang", "replica.scheduler.max_num_seqs": 64}
    config = config_from_mapping(apply_overrides(document, overrides))
    assert config.replica.scheduler.sglang.max_running_requests == 64


def test_the_over_length_message_names_the_real_key(tmp_path: Path) -> None:
    path = trace(tmp_path / "t.csv", [(0.0, 3000, 3000)])
    with pytest.raises(InputError) as err:
        run(path, "vllm_v1")
    key = str(err.value).split("set ")[-1].split(" =")[0]
    assert key == "replica.over_length"
    config_from_mapping({"replica": {key.split(".")[1]: "skip"}})  # a key that exists


def test_lightllm_refuses_at_arrival_what_its_peak_rule_never_admits(tmp_path: Path) -> None:
    # 4096 token slots, decode 1: the peak is prompt + 1, which must stay below 4096
    # (the request itself is within the model's 4096-token context).
    path = trace(tmp_path / "t.csv", [(0.0, 4095, 1)])
    limits = {"watermark_blocks_fraction": 0.0, "max_request_tokens": 4096}
    with pytest.raises(InputError, match="worst-case peak"):
        run(path, "lightllm", scheduler=limits)
    ok = trace(tmp_path / "ok.csv", [(0.0, 4094, 1)])
    assert (
        run(
            ok,
            "lightllm",
            scheduler={**limits, "max_tokens_in_batch": 8192},
        ).summary["num_requests"]
        == 1
    )


def test_an_orca_reservation_below_one_block_is_a_config_error(tmp_path: Path) -> None:
    path = trace(tmp_path / "t.csv", [(0.0, 4, 2)])
    with pytest.raises(ConfigError, match="max_request_tokens"):
        run(path, "orca", scheduler={"max_request_tokens": 8, "block_size": 16})


def test_the_output_of_a_request_aborted_mid_step_is_dropped_not_an_error() -> None:
    s = Scheduler(SchedulerConfig(num_blocks=64, max_model_len=256))
    s.add_request("a", list(range(8)), max_tokens=4)
    s.add_request("b", list(range(100, 108)), max_tokens=4)
    s.schedule()
    s.abort("b")  # while its step runs
    s.update_from_output({"a": [1], "b": [2]})  # b's output lands late: dropped
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 1}
    with pytest.raises(InputError):  # the next step: b is simply unknown
        s.update_from_output({"a": [1], "b": [2]})


def test_simulate_releases_the_gil_while_the_event_loop_runs() -> None:
    import threading

    from tokenyard.simulation.config import default_workload
    from tokenyard.simulation.run import _core_config, plan_for, replica_spec
    from tokenyard.workload import load_workload

    workload = dict(default_workload(), num_requests=20_000)
    config = config_from_mapping({"execution": LINEAR, "workload": workload})
    core = _core_config(config, replica_spec(config, plan_for(config)), 16)
    chunks = list(load_workload(config.workload).chunks(65536))  # no Python left to run
    started, done = threading.Event(), threading.Event()

    def run_loop() -> None:
        started.set()
        _core.simulate(core, iter(chunks))
        done.set()

    worker = threading.Thread(target=run_loop)
    worker.start()
    started.wait()
    spins = 0
    while not done.is_set():  # runs only while the event loop does not hold the GIL
        spins += 1
    worker.join()
    assert spins > 500_000, spins  # held: under 100,000 (only before the loop starts)
