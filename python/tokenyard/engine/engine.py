"""The engine loop: tokenyard's scheduler decides, the engine runs the model on the paged KV
cache the scheduler's block tables address, and greedy samples go back to the scheduler.

Two loops produce the same tokens:
- synchronous: schedule step N, run it, process its results, repeat;
- overlap (seed 003, with the scheduler's async mode): schedule and prepare step N+1 while
  step N runs on the device, launch N+1, then process N's results. Step N+1's inputs that
  depend on N's samples are filled on the device. A finished request's blocks go back to the
  pool at once, as vLLM's do: the step in flight still reads them, but the device runs steps
  in launch order, so no later step writes them first; its late output is dropped.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from tokenyard.engine.attention import AttentionBackend, BackendName
from tokenyard.engine.batch import (
    PreparedBatch,
    RequestId,
    RequestState,
    apply_scheduler_output,
    prepare_batch,
)
from tokenyard.engine.model import LlamaModel, ModelConfig
from tokenyard.errors import ConfigError, InputError
from tokenyard.sched import Scheduler, SchedulerConfig

__all__ = ["EngineConfig", "LLMEngine", "StepTiming", "TokenEvent"]

DtypeName = Literal["auto", "float32", "bfloat16", "float16"]
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """What to run and how.

    ``device="auto"`` picks CUDA when present; ``attention_backend="auto"`` picks the Triton
    kernels on CUDA and their torch references on the CPU; ``dtype="auto"`` is bfloat16 on
    CUDA and float32 on the CPU. ``overlap=True`` runs the overlap loop (the scheduler is
    switched to async mode). ``graph_batch_sizes`` pads decode-only batches up to the next
    listed size, as CUDA-graph engines do; padding rows never reach the outputs.
    """

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    scheduler: SchedulerConfig = dataclasses.field(
        default_factory=lambda: SchedulerConfig(num_blocks=512, max_model_len=2048)
    )
    device: str = "auto"
    attention_backend: Literal["auto", "triton", "torch"] = "auto"
    dtype: DtypeName = "auto"
    overlap: bool = False
    graph_batch_sizes: tuple[int, ...] = ()
    #: Wait for the device after every step so ``StepTiming.model_s`` is the model alone.
    synchronize_timings: bool = False

    def __post_init__(self) -> None:
        if self.dtype != "auto" and self.dtype not in _DTYPES:
            raise ConfigError(
                f"EngineConfig.dtype must be 'auto' or one of {sorted(_DTYPES)}, "
                f"got {self.dtype!r}",
                field="dtype",
                value=repr(self.dtype),
            )
        sizes = self.graph_batch_sizes
        if any(not isinstance(s, int) or s < 1 for s in sizes) or list(sizes) != sorted(sizes):
            raise ConfigError(
                f"EngineConfig.graph_batch_sizes must be increasing positive integers, "
                f"got {sizes!r}",
                field="graph_batch_sizes",
                value=repr(sizes),
            )


@dataclass(frozen=True)
class TokenEvent:
    """One generated token; ``finish_reason`` ("length", "stop") on a request's last."""

    request_id: RequestId
    token_id: int
    finish_reason: str | None = None


@dataclass(frozen=True)
class StepTiming:
    """Wall seconds of one step's phases, and the step's composition."""

    schedule_s: float
    prepare_s: float
    model_s: float
    process_s: float
    num_seqs: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_padding_rows: int
    sum_decode_context: int
    sum_prefill_context: int
    sum_prefill_squared: int = 0


@dataclass
class _Launched:
    batch: PreparedBatch
    sampled: torch.Tensor  # on the device
    sampled_host: torch.Tensor
    done: torch.cuda.Event | None
    schedule_s: float
    prepare_s: float
    launched_at: float


class LLMEngine:
    """A model served step by step under tokenyard's scheduler."""

    def __init__(self, config: EngineConfig | None = None, *, model: LlamaModel | None = None):
        """``model``: reuse an already built model (its config must be ``config.model``)."""
        self.config = config = config or EngineConfig()
        self.device = _pick_device(config.device)
        on_cuda = self.device.type == "cuda"
        dtype_name = (
            config.dtype if config.dtype != "auto" else "bfloat16" if on_cuda else "float32"
        )
        backend: BackendName
        if config.attention_backend == "auto":
            backend = "triton" if on_cuda else "torch"
        else:
            backend = config.attention_backend
        self.backend = AttentionBackend(backend)
        if model is not None and model.config != config.model:
            raise ConfigError(
                "LLMEngine(model=...): the model was built for another ModelConfig",
                field="model",
                value=repr(model.config),
            )
        self.model = model or LlamaModel(
            config.model, device=self.device, dtype=_DTYPES[dtype_name]
        )
        sched = dataclasses.replace(config.scheduler, async_scheduling=config.overlap)
        self.scheduler = Scheduler(sched)
        self.kv_caches = self.model.new_kv_caches(sched.num_blocks, sched.block_size)
        self.timings: list[StepTiming] = []
        self._states: dict[RequestId, RequestState] = {}
        self._in_flight: _Launched | None = None

    def add_request(
        self,
        request_id: RequestId,
        prompt_token_ids: Iterable[int],
        max_tokens: int,
        *,
        eos_token_id: int | None = None,
        ignore_eos: bool = False,
    ) -> None:
        """Queues a prompt (validated by the scheduler: ``InputError`` on bad input)."""
        vocab = self.config.model.vocab_size
        tokens = list(prompt_token_ids)
        bad = next((t for t in tokens if not 0 <= t < vocab), None)
        if bad is not None:
            raise InputError(
                f"prompt_token_ids: token {bad} is outside the vocabulary [0, {vocab})",
                field="prompt_token_ids",
                value=str(bad),
            )
        self.scheduler.add_request(
            request_id, tokens, max_tokens, eos_token_id=eos_token_id, ignore_eos=ignore_eos
        )

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or self._in_flight is not None

    def step(self) -> list[TokenEvent]:
        """One iteration of the loop; returns the tokens it produced (in overlap mode, those
        of the previous step)."""
        if self.config.overlap:
            return self._overlap_step()
        launched = self._schedule_and_launch(previous=None)
        return self._process(launched) if launched else []

    def stream(self) -> Iterator[TokenEvent]:
        """Runs until every request has finished, yielding tokens as they are produced."""
        while self.has_unfinished_requests():
            yield from self.step()

    def generate(
        self, prompts: Sequence[Sequence[int]], max_tokens: int, *, eos_token_id: int | None = None
    ) -> list[list[int]]:
        """Greedy completions of ``prompts``, in order."""
        base = len(self._states) + self.scheduler.num_waiting + self.scheduler.num_running
        ids = [f"gen-{base + i}" for i in range(len(prompts))]
        for request_id, prompt in zip(ids, prompts, strict=True):
            self.add_request(request_id, prompt, max_tokens, eos_token_id=eos_token_id)
        outputs: dict[RequestId, list[int]] = {request_id: [] for request_id in ids}
        for event in self.stream():
            if event.request_id in outputs:
                outputs[event.request_id].append(event.token_id)
        return [outputs[request_id] for request_id in ids]

    def _overlap_step(self) -> list[TokenEvent]:
        previous = self._in_flight
        launched = None
        if self.scheduler.has_unfinished_requests():
            launched = self._schedule_and_launch(previous)
        self._in_flight = launched
        return self._process(previous) if previous else []

    def _schedule_and_launch(self, previous: _Launched | None) -> _Launched | None:
        t0 = time.perf_counter()
        out = self.scheduler.schedule()
        t1 = time.perf_counter()
        apply_scheduler_output(out, self._states)
        batch = prepare_batch(
            out,
            self._states,
            block_size=self.config.scheduler.block_size,
            device=self.device,
            previous=previous.batch if previous else None,
            graph_batch_sizes=self.config.graph_batch_sizes,
        )
        t2 = time.perf_counter()
        if batch is None:
            return None
        return self._launch(batch, previous, t1 - t0, t2 - t1)

    def _launch(
        self, batch: PreparedBatch, previous: _Launched | None, schedule_s: float, prepare_s: float
    ) -> _Launched:
        launched_at = time.perf_counter()
        input_ids = batch.input_ids
        if batch.placeholder_rows.numel():
            if previous is None:
                raise AssertionError("placeholders without a step in flight")
            input_ids = input_ids.index_copy(
                0, batch.placeholder_rows, previous.sampled[batch.placeholder_sources]
            )
        hidden = self.model.forward(
            input_ids, batch.positions, batch.metadata, self.kv_caches, self.backend
        )
        sampled = self.model.logits(hidden[batch.sample_rows]).argmax(dim=-1)
        on_cuda = self.device.type == "cuda"
        sampled_host = torch.empty(sampled.shape, dtype=sampled.dtype, pin_memory=on_cuda)
        sampled_host.copy_(sampled, non_blocking=on_cuda)
        done = None
        if on_cuda:
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record()
        for request_id in batch.request_ids:
            self._states[request_id].num_in_flight += 1
        launched = _Launched(batch, sampled, sampled_host, done, schedule_s, prepare_s, launched_at)
        if self.config.synchronize_timings and done is not None:
            done.synchronize()
        return launched

    def _process(self, launched: _Launched) -> list[TokenEvent]:
        if launched.done is not None:
            launched.done.synchronize()
        t0 = time.perf_counter()
        batch = launched.batch
        tokens = launched.sampled_host.tolist()
        sampled = {rid: [tok] for rid, tok in zip(batch.sampled_request_ids, tokens, strict=True)}
        finished = dict(self.scheduler.update_from_output(sampled))
        events = []
        for request_id, token in zip(batch.sampled_request_ids, tokens, strict=True):
            state = self._states[request_id]
            if state.finished:
                continue  # a late output of a request that finished while this step ran
            state.token_ids.append(token)
            reason = finished.get(request_id)
            state.finished = reason is not None
            events.append(TokenEvent(request_id, token, reason))
        for request_id in batch.request_ids:
            state = self._states[request_id]
            state.num_in_flight -= 1
            if state.finished and state.num_in_flight == 0:
                del self._states[request_id]
        t1 = time.perf_counter()
        self._record(launched, model_s=t0 - launched.launched_at, process_s=t1 - t0)
        return events

    def _record(self, launched: _Launched, *, model_s: float, process_s: float) -> None:
        b = launched.batch
        self.timings.append(
            StepTiming(
                schedule_s=launched.schedule_s,
                prepare_s=launched.prepare_s,
                model_s=model_s,
                process_s=process_s,
                num_seqs=len(b.request_ids),
                num_prefill_tokens=b.num_prefill_tokens,
                num_decode_tokens=b.num_decode_tokens,
                num_padding_rows=b.num_padding_rows,
                sum_decode_context=b.sum_decode_context,
                sum_prefill_context=b.sum_prefill_context,
                sum_prefill_squared=b.sum_prefill_squared,
            )
        )


def _pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ConfigError(
            f"EngineConfig.device: {name!r} is not a torch device ({exc})",
            field="device",
            value=repr(name),
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "EngineConfig.device: 'cuda' was asked for but torch sees no CUDA device",
            field="device",
            value=repr(name),
        )
    return device
