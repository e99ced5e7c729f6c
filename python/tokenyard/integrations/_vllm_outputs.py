"""What ``TokenyardScheduler`` (``tokenyard.integrations.vllm``) hands vLLM with a step's
outputs beyond their tokens (logprobs, prompt logprobs, ``PrefillStats``), the request
kinds it refuses, the prompt the core gets for prompt embeddings, and its errors in vLLM's
request ids. Imported only by that module, so
vLLM is installed when this runs."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import re
from collections.abc import Iterator, Mapping
from typing import Any

from vllm.v1.core.kv_cache_utils import _gen_prompt_embeds_extra_hash_keys
from vllm.v1.engine import EngineCoreOutput
from vllm.v1.metrics.stats import PrefillStats
from vllm.v1.request import Request

from tokenyard.errors import InputError
from tokenyard.integrations._vllm_translate import core_prompt, key_tokens


def attach_prefill_stats(
    outputs: dict[int, list[EngineCoreOutput]], ready: dict[str, PrefillStats]
) -> None:
    """Hands the step's first outputs their requests' ``PrefillStats`` (and a remote
    prefill's transfer params its cached tokens, as vLLM does)."""
    for output in itertools.chain.from_iterable(outputs.values()):
        stats = ready.get(output.request_id)
        if stats is None:
            continue
        output.prefill_stats = stats
        params = output.kv_transfer_params
        if params is not None and params.get("do_remote_prefill"):
            params["remote_prefill_cached_tokens"] = stats.num_cached_tokens


def attach_logprobs(
    outputs: dict[int, list[EngineCoreOutput]],
    live: list[Request],
    model_runner_output: Any,
    turn_params: dict[str, Any] | None = None,
) -> None:
    """Hands each output the runner's logprobs for it, as vLLM's ``update_from_output``
    does: the sampled tokens' logprobs (for a request asking for them, as many as the
    tokens it emits after its stop) and the prompt logprobs (with the output that ends
    its prefill). ``turn_params``: the settings of sessions whose turn stopped and resumed
    with a queued chunk this update, whose logprobs vLLM slices under the turn's settings
    before the chunk's replace them; emptied here. Nothing to do on the usual step, which
    carries none."""
    logprobs = model_runner_output.logprobs
    prompt_logprobs = model_runner_output.prompt_logprobs_dict or {}
    prompt_token_logprobs = getattr(model_runner_output, "prompt_token_id_logprobs_dict", None)
    turns = dict(turn_params) if turn_params else {}
    if turn_params:
        turn_params.clear()
    if not (logprobs or prompt_logprobs or prompt_token_logprobs):
        return
    index = model_runner_output.req_id_to_index
    requests = {request.request_id: request for request in live}
    for output in itertools.chain.from_iterable(outputs.values()):
        request_id = output.request_id
        if request_id in turns and output.finish_reason is not None:
            params = turns[request_id]
        else:
            params = requests[request_id].sampling_params
        if logprobs and params is not None and params.num_logprobs is not None:
            output.new_logprobs = logprobs.slice_request(
                index[request_id], len(output.new_token_ids)
            )
        output.new_prompt_logprobs_tensors = prompt_logprobs.get(request_id)
        if prompt_token_logprobs:
            output.prompt_token_id_logprobs = prompt_token_logprobs.get(request_id)


def attach_sampling_masks(
    outputs: dict[int, list[EngineCoreOutput]], model_runner_output: Any
) -> None:
    """vLLM 0.33's ``update_from_output`` with ``return_sampling_mask``: each output with
    tokens gets the runner's sampling-mask rows for them (``SamplingMaskLists
    .slice_request`` at the request's batch index, as many as the tokens it emits after a
    stop)."""
    masks = model_runner_output.sampling_masks
    if masks is None:
        return
    index = model_runner_output.req_id_to_index
    for output in itertools.chain.from_iterable(outputs.values()):
        if output.new_token_ids:
            output.new_sampling_mask = masks.slice_request(
                index[output.request_id], len(output.new_token_ids)
            )


def check_supported(request: Request, multimodal: str | None = None) -> None:
    """Refuses request kinds tokenyard's scheduler has no notion of, naming the field.
    ``multimodal``: why this scheduler refuses multimodal items (``None``: it serves them)."""
    reason = None
    embeds = request.prompt_embeds is not None
    if request.prompt_token_ids is None and not embeds:
        reason = "prompt_token_ids", "a request without prompt tokens or embeddings"
    elif request.mm_features and multimodal is not None:
        reason = "mm_features", f"multimodal inputs {multimodal}"
    elif request.sampling_params is None and request.pooling_params is None:
        reason = "sampling_params", "a request without sampling params"
    if reason is not None:
        field, what = reason
        raise InputError(
            f"{field}: tokenyard's scheduler does not serve {what} "
            f"(request {request.request_id!r})",
            field=field,
            value=request.request_id,
        )


#: Token ids the core sees for prompt embeddings start here (above any vocabulary, and
#: above the multimodal placeholders' range, ``_vllm_translate._MM_TOKEN_BASE``).
_EMBEDS_TOKEN_BASE = 3 << 30


def embeds_prompt(
    prompt: list[int], request: Request, hash_block_size: int | None, lookahead: int = 0
) -> list[int]:
    """The prompt the core gets for a request with prompt embeddings: ``prompt`` (vLLM's
    ``_all_token_ids`` of the prompt, 0 where embeddings stand, as ``Request.__init__``
    makes them; multimodal placeholders already replaced, ``core_prompt``) as is without
    prefix caching, else each segment's tokens replaced by ids made from the sha256 of its
    embeddings (vLLM's own ``_gen_prompt_embeds_extra_hash_keys``, clipped at the
    prompt's end) and its tokens.

    vLLM puts the digest of a block's embeddings in the block's extra keys beside its
    tokens; with ``lookahead`` (L, ``num_hash_lookahead_tokens``) the digest covers the
    block and the L positions after it, and the hash those L tokens too
    (``get_request_block_hasher``, ``generate_lookahead_block_hash_extra_keys``). The core
    keys blocks by tokens alone, over the block and its L tokens (``kv::lookahead``), so
    the segments are cut at every multiple of ``hash_block_size`` and L past each: every
    block's hashed range is then whole segments, and two blocks share ids exactly when
    vLLM's keys agree (the same embeddings over the range, clipped at the same prompt
    end, and the same tokens; but for a 2**-30 chance per pair of segments). With L of 0
    a segment is a block. The prompt's last segments may be partial; outputs then fill
    them as vLLM's tokens do. Only the embeddings' rows are keyed: a streaming-input
    session's later chunks extend the prompt with ids alone (vLLM's ``StreamingUpdate``
    carries no embeddings, and its digests past the rows are of nothing, which the chained
    hashes already tell apart). The core never hands prompt tokens back."""
    if hash_block_size is None:
        return prompt
    tokens = list(prompt)
    num_rows = min(len(tokens), len(request.prompt_embeds))
    for start, end in _embeds_segments(num_rows, hash_block_size, lookahead):
        [(_, digest)] = _gen_prompt_embeds_extra_hash_keys(request, start, end)
        key_tokens(tokens, start, end, _EMBEDS_TOKEN_BASE, _digest(digest, tokens[start:end]))
    return tokens


def _embeds_segments(num_tokens: int, block_size: int, lookahead: int) -> Iterator[tuple[int, int]]:
    """The ranges :func:`embeds_prompt` keys apart over ``num_tokens``: cut at each
    multiple of ``block_size`` and ``lookahead`` past it (modulo ``block_size``)."""
    shift = lookahead % block_size
    cuts = range(0, num_tokens, block_size)
    points = sorted({*cuts, *(c + shift for c in cuts if c + shift < num_tokens), num_tokens})
    return itertools.pairwise(points)


#: Token ids the core sees for a salted prompt's first block start here (above any
#: vocabulary, below the multimodal and embeddings ranges).
_SALT_TOKEN_BASE = 1 << 30


def salted_prompt(prompt: list[int], cache_salt: str | None, hash_block_size: int) -> list[int]:
    """The prompt the core gets for a request with a ``cache_salt`` under prefix caching:
    the first ``hash_block_size`` tokens replaced by ids made from the salt and those
    tokens. vLLM puts the salt in the first block's extra keys only
    (``generate_block_hash_extra_keys``: ``("cache_salt", salt)`` when ``start_token_idx
    == 0``), and every later hash chains on that block's, so requests with different salts
    (or one salted, one not) share no block, and with one salt share as vLLM's do (but for
    a 2**-30 chance per pair). The core never hands prompt tokens back."""
    if not cache_salt:
        return prompt
    tokens = list(prompt)
    end = min(hash_block_size, len(tokens))
    key_tokens(tokens, 0, end, _SALT_TOKEN_BASE, _digest(cache_salt.encode(), tokens[:end]))
    return tokens


def _digest(key: bytes, tokens: list[int]) -> bytes:
    """4 bytes of blake2b over ``key`` and ``tokens`` (each 4 bytes, little-endian)."""
    mixed = hashlib.blake2b(key, digest_size=4)
    mixed.update(b"".join(t.to_bytes(4, "little") for t in tokens))
    return mixed.digest()


def keyed_prompt(
    request: Request, prompt: list[int], hash_block_size: int, *, lookahead: int
) -> list[int]:
    """The prompt tokens the core keys a request's blocks by under prefix caching:
    ``prompt`` (the request's, or its first tokens) with its multimodal items
    (``core_prompt``), prompt embeddings (:func:`embeds_prompt`, whose segments follow the
    core's hash ``lookahead``, ``num_hash_lookahead_tokens``) and cache salt
    (:func:`salted_prompt`) turned into ids, as vLLM adds them to its blocks' extra keys.
    Every place that asks the core about a request's blocks builds its tokens here."""
    if request.mm_features:
        prompt = core_prompt(prompt, request.mm_features)
    if request.prompt_embeds is not None:
        prompt = embeds_prompt(prompt, request, hash_block_size, lookahead)
    return salted_prompt(prompt, request.cache_salt, hash_block_size)


#: A core request id in an error's value: the whole value (``request_id``) or its end
#: (``"3 tokens for 17"``). Integer ids print bare; a str id prints quoted, so never matches.
_CORE_ID = re.compile(r"(?:^|for )(\d+)$")


@contextlib.contextmanager
def errors_in_vllm_ids(vllm_ids: Mapping[Any, str]) -> Iterator[None]:
    """Re-raises the core's request errors naming vLLM's request id instead of the integer
    the adapter gave the core (``InputError`` and ``UnknownRequestError``, same class,
    ``field`` and message, the id in ``value`` and the message replaced)."""
    try:
        yield
    except InputError as err:
        raise in_vllm_ids(err, vllm_ids) from None


def in_vllm_ids(err: InputError, vllm_ids: Mapping[Any, str]) -> InputError:
    """``err`` with the core id in its value (see ``_CORE_ID``) written as vLLM's id;
    ``err`` itself when it names no request the adapter knows."""
    value = err.value
    found = _CORE_ID.search(value) if value is not None else None
    if value is None or found is None:
        return err
    vllm_id = vllm_ids.get(int(found.group(1)))
    if vllm_id is None:
        return err
    new_value = value[: found.start(1)] + repr(vllm_id)
    message = str(err).replace(f"={value}", f"={new_value}", 1)
    return type(err)(message, field=err.field, value=new_value)
