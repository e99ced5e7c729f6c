"""The engine end to end: a real (tiny) model generating under tokenyard's scheduler.

The key property: greedy outputs under continuous batching with chunked prefill, prefix
caching and forced preemption are token for token those of each prompt run alone through a
plain, non-paged forward pass, in the synchronous and the overlap loop alike."""

from __future__ import annotations

import pytest
import torch

from tokenyard.engine import EngineConfig, LLMEngine, ModelConfig
from tokenyard.engine.model import LlamaModel
from tokenyard.errors import ConfigError, InputError
from tokenyard.sched import SchedulerConfig

MODEL = ModelConfig(seed=7)
SYSTEM = [11, 22, 33, 44, 55, 66, 77, 88, 99, 111, 122, 133]  # shared by every prompt
PROMPTS = [SYSTEM + list(range(140 + 10 * i, 140 + 10 * i + 3 + i)) for i in range(6)]
MAX_TOKENS = 8


def tight_scheduler(**overrides: object) -> SchedulerConfig:
    """Small budget (prompts are chunked) and a KV pool of 56 tokens for 4 running requests
    of up to 29 tokens (requests are preempted)."""
    fields: dict[str, object] = dict(
        max_num_batched_tokens=16,
        max_num_seqs=4,
        block_size=4,
        num_blocks=14,
        max_model_len=48,
    )
    fields.update(overrides)
    return SchedulerConfig(**fields)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def dense_outputs() -> list[list[int]]:
    """Each prompt alone, full causal attention over the whole sequence at every step."""
    model = LlamaModel(MODEL, device=torch.device("cpu"), dtype=torch.float32)
    outputs = []
    for prompt in PROMPTS:
        sequence, generated = list(prompt), []
        for _ in range(MAX_TOKENS):
            token = int(model.dense_logits(sequence)[-1].argmax())
            generated.append(token)
            sequence.append(token)
        outputs.append(generated)
    return outputs


def make_engine(backend: str = "torch", **overrides: object) -> LLMEngine:
    fields: dict[str, object] = dict(
        model=MODEL, scheduler=tight_scheduler(), device="cpu", attention_backend=backend
    )
    fields.update(overrides)
    return LLMEngine(EngineConfig(**fields))  # type: ignore[arg-type]


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
@pytest.mark.parametrize("prefix_cache", ["block_hash", "radix"])
def test_batched_paged_generation_matches_each_prompt_alone(
    dense_outputs: list[list[int]], overlap: bool, prefix_cache: str
) -> None:
    engine = make_engine(overlap=overlap, scheduler=tight_scheduler(prefix_cache=prefix_cache))
    assert engine.generate(PROMPTS, MAX_TOKENS) == dense_outputs
    stats = engine.scheduler.stats()
    assert stats.num_preemptions > 0, "the scenario must force preemption"
    assert stats.prefix_cache_hits > 0, "the shared system prompt must hit the cache"
    chunked = [t for t in engine.timings if t.num_prefill_tokens and t.num_decode_tokens]
    assert chunked, "prefill chunks must share steps with decodes"
    engine.scheduler.check_invariants()


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="Triton's CPU interpreter is on only without CUDA"
)
def test_triton_kernels_in_the_loop_match_the_dense_forward(
    dense_outputs: list[list[int]],
) -> None:
    """The same scenario through the Triton kernels (Triton's interpreter on a CPU)."""
    engine = make_engine("triton", overlap=True)
    assert engine.generate(PROMPTS[:4], MAX_TOKENS) == dense_outputs[:4]
    assert engine.scheduler.stats().num_preemptions > 0


def test_graph_padding_never_leaks_into_outputs(dense_outputs: list[list[int]]) -> None:
    engine = make_engine(overlap=True, graph_batch_sizes=(1, 8, 16))
    assert engine.generate(PROMPTS, MAX_TOKENS) == dense_outputs
    padded = [t for t in engine.timings if t.num_padding_rows]
    assert padded, "decode batches of 2-7 requests are padded to 8"
    assert all(t.num_prefill_tokens == 0 for t in padded), "only decode batches are padded"
    assert all(t.num_decode_tokens + t.num_padding_rows in (1, 8, 16) for t in padded)


def test_stream_reports_each_token_once_and_the_finish_on_the_last() -> None:
    engine = make_engine(overlap=True)
    engine.add_request("a", PROMPTS[0], 3)
    engine.add_request("b", PROMPTS[1], 5)
    events = list(engine.stream())
    for request_id, n in (("a", 3), ("b", 5)):
        mine = [e for e in events if e.request_id == request_id]
        assert len(mine) == n
        assert [e.finish_reason for e in mine] == [None] * (n - 1) + ["length"]
    assert not engine.has_unfinished_requests()


def test_overlap_frees_a_finished_request_at_once_as_vllm_does(
    dense_outputs: list[list[int]],
) -> None:
    """The first greedy token is made the EOS: the request finishes while its next decode is
    already in flight. Its KV blocks go back to the pool at once, as vLLM 0.33 frees them:
    the step in flight still reads them, but the device runs steps in launch order, so no
    later step writes them first. The in-flight step's late token is dropped."""
    engine = make_engine(overlap=True, scheduler=tight_scheduler(enable_prefix_caching=False))
    engine.add_request("r", PROMPTS[0], MAX_TOKENS, eos_token_id=dense_outputs[0][0])
    assert engine.step() == []  # step 1 (the prompt) launched, nothing processed yet
    while not (events := engine.step()):
        pass
    assert [(e.token_id, e.finish_reason) for e in events] == [(dense_outputs[0][0], "stop")]
    assert not engine.scheduler.has_unfinished_requests()
    assert engine.has_unfinished_requests(), "the decode launched meanwhile is in flight"
    assert engine.scheduler.stats().kv_usage == 0, "its blocks are freed at once"
    assert engine.step() == [], "the late token is dropped"
    assert engine.scheduler.stats().kv_usage == 0
    assert not engine.has_unfinished_requests()


def test_step_timings_describe_each_step() -> None:
    engine = make_engine()
    engine.generate(PROMPTS[:2], 2)
    first = engine.timings[0]
    assert first.num_prefill_tokens == 16  # the budget, all prefill
    assert first.num_decode_tokens == 0
    # Prompt 0 whole (15 tokens), then prompt 1 past its 12 cached system tokens: one token
    # over a context of 13.
    assert first.sum_prefill_squared == 15 * 15 + 1 * 1
    assert first.sum_prefill_context == 15 * 15 + 1 * 13
    assert all(t.schedule_s >= 0 and t.model_s > 0 for t in engine.timings)
    assert sum(t.num_decode_tokens for t in engine.timings) >= 2


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("dtype", "float64"),
        ("graph_batch_sizes", (8, 4)),
        ("graph_batch_sizes", (0,)),
        ("device", "no-such-device"),
        ("attention_backend", "cutlass"),
    ],
)
def test_bad_engine_config_names_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError) as info:
        make_engine(**{field: value})
    assert info.value.field == field


def test_model_config_rejects_bad_shapes() -> None:
    with pytest.raises(ConfigError, match="num_kv_heads"):
        ModelConfig(num_heads=4, num_kv_heads=3)
    with pytest.raises(ConfigError, match="hidden_size"):
        ModelConfig(hidden_size=0)


def test_prompt_tokens_outside_the_vocabulary_are_rejected() -> None:
    engine = make_engine()
    with pytest.raises(InputError, match="vocabulary"):
        engine.add_request("x", [1, 2, MODEL.vocab_size], 4)
    assert not engine.has_unfinished_requests()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_on_a_gpu_the_triton_loop_matches_the_dense_forward(
    dense_outputs: list[list[int]], overlap: bool
) -> None:
    engine = make_engine("triton", device="cuda", dtype="float32", overlap=overlap)
    assert engine.generate(PROMPTS, MAX_TOKENS) == dense_outputs
    assert engine.scheduler.stats().num_preemptions > 0
