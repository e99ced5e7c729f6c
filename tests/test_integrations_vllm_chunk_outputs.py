"""tokenyard.integrations.vllm given tokens for a prefill chunk, against vLLM 0.33's own
``Scheduler``, step by step on seeded streams. vLLM's model runner returns no token for a
step that does not finish a prompt, but ``update_from_output`` appends whatever it is
handed for a scheduled request (``_update_request_with_output``: the token joins the
request, is emitted, counts towards its stop, and the rest of the prefill computes it);
vLLM's offloading-connector tests hand one to every running request each step
(``tests/v1/kv_connector/unit/offloading_connector/utils.py``). The adapter turns on the
core's ``append_prefill_chunk_outputs`` to do the same.

Every step is compared: scheduled tokens and block ids, each update's outputs (ids, tokens,
finish reasons), every request's tokens, computed tokens and status, KV usage. Needs vLLM
(the bench venv); skipped elsewhere.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

from vllm_compare import block_digest, build_pair, runner_output, seeded_arrivals


def _outputs(engine_outputs: dict[int, Any]) -> list[tuple[str, list[int], Any]]:
    return sorted(
        (o.request_id, list(o.new_token_ids), o.finish_reason)
        for eco in engine_outputs.values()
        for o in eco.outputs
    )


def _state(scheduler: Any) -> dict[str, Any]:
    return {
        r.request_id: (r.status, r.num_computed_tokens, list(r.all_token_ids))
        for r in scheduler.requests.values()
    }


def run_chunk_tokens(seed: int, *, share: float) -> int:
    """A seeded stream of long prompts (chunked by a 64-token budget) on both schedulers,
    the runner handing a token to a ``share`` of the scheduled prefill chunks (and to
    every request finishing its prompt or decoding); returns the chunk tokens handed."""
    theirs, ours, peer = build_pair(num_blocks=200, max_num_batched_tokens=64)
    rng = random.Random(seed)
    arrivals = seeded_arrivals(
        rng, count=6, prefix_tokens=96, shared=(0, 32, 96), tail_max=160, max_tokens=8
    )
    handed = 0
    for step in range(400):
        for at, *args in arrivals:
            if at == step:
                for scheduler in (theirs, ours):
                    scheduler.add_request(peer.make_request(*args))
        outs = [s.schedule() for s in (theirs, ours)]
        assert block_digest(outs[1]) == block_digest(outs[0]), f"step {step}"
        samples = set()
        for r in outs[0].num_scheduled_tokens:
            request = theirs.requests[r]
            if request.num_computed_tokens >= request.num_tokens:
                samples.add(r)
            elif rng.random() < share:
                samples.add(r)
                handed += 1
        results = [
            _outputs(s.update_from_output(out, runner_output(s, out, samples, token=5 + step)))
            for s, out in zip((theirs, ours), outs, strict=True)
        ]
        assert results[1] == results[0], f"step {step}"
        assert _state(ours) == _state(theirs), f"step {step}"
        assert ours.get_kv_cache_usage() == pytest.approx(theirs.get_kv_cache_usage()), step
        if step > 8 and not theirs.has_unfinished_requests():
            assert not ours.has_unfinished_requests()
            return handed
    raise AssertionError("the stream did not drain")


@pytest.mark.parametrize("seed", range(4))
def test_tokens_given_for_prefill_chunks_land_as_vllm_lands_them(seed: int) -> None:
    assert run_chunk_tokens(seed, share=0.5) > 0


def test_the_check_catches_a_refused_chunk_token() -> None:
    # The core left refusing such tokens (its default): the stream's first chunk token
    # raises InputError naming the request, where vLLM appends it.
    from tokenyard.errors import InputError
    from tokenyard.integrations.vllm import TokenyardScheduler

    init = TokenyardScheduler.__init__

    def refusing(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self._core.append_prefill_chunk_outputs = False

    with pytest.MonkeyPatch.context() as m:
        m.setattr(TokenyardScheduler, "__init__", refusing)
        with pytest.raises(InputError, match="no step in flight"):
            run_chunk_tokens(0, share=0.5)
