"""tokenyard.integrations.vllm: a streaming-input session's turn that stops while its next
chunk is queued gets its logprobs under its own sampling settings, as vLLM 0.33's
``update_from_output`` slices them before ``_handle_stopped_request`` lets the chunk's
settings replace the turn's. vLLM's ``Scheduler`` and the adapter run the same turns; the
outputs' logprobs must be equal. Needs vLLM (the bench venv); skipped elsewhere.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import LogprobsLists, ModelRunnerOutput
from vllm_compare import add_to_each, peer_pair

from tokenyard.integrations.vllm import TokenyardScheduler

STOP = 42


def _turn(pair: list[Any], token: int) -> list[Any]:
    """One step of the session on each scheduler, sampling ``token`` with a logprob."""
    seen = []
    for s in pair:
        out = s.schedule()
        ids = list(out.num_scheduled_tokens)
        logprobs = LogprobsLists(
            logprob_token_ids=np.array([[token]] * len(ids), dtype=np.int32),
            logprobs=np.array([[-0.5]] * len(ids), dtype=np.float32),
            sampled_token_ranks=np.array([1] * len(ids), dtype=np.int32),
        )
        runner = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=[[token] for _ in ids],
            logprobs=logprobs,
        )
        outputs = s.update_from_output(out, runner)
        seen.append(
            [
                (o.request_id, list(o.new_token_ids), o.new_logprobs is not None)
                for eco in outputs.values()
                for o in eco.outputs
            ]
        )
    return seen


@pytest.mark.parametrize("queued", [False, True])
def test_a_stopping_turn_keeps_its_logprobs_whatever_the_chunk_asks(queued: bool) -> None:
    pair = peer_pair(
        (Scheduler, TokenyardScheduler),
        num_blocks=64,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        max_model_len=256,
    )
    asking = SamplingParams(max_tokens=8, stop_token_ids=[STOP], logprobs=0)
    add_to_each(pair, "s", [1, 2, 3], asking, resumable=True)
    first = _turn(pair, 5)
    assert first[1] == first[0] == [("s", [5], True)]
    if queued:
        # The next chunk, asking for no logprobs, waits behind the running turn.
        add_to_each(
            pair, "s", [6, 7], SamplingParams(max_tokens=8, stop_token_ids=[STOP]), resumable=True
        )
    stop = _turn(pair, STOP)
    assert stop[1] == stop[0]
    assert stop[0] == [("s", [STOP], True)], "the turn asked for logprobs"
