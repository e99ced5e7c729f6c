"""tokenyard.integrations.vllm's P/D connector paths, step by step against vLLM 0.33's own
``Scheduler`` on the same requests: what a finished request hands its connector
(``_connector_finished``: the block tables clipped to the computed tokens' blocks by
``KVCacheManager.get_block_ids_for_computed_tokens``, so slots allocated ahead of them, for
rejected drafts or look-ahead, are not sent). Needs vLLM (the bench venv, ``.venv-bench``);
skipped elsewhere.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is installed only in the bench venv")

from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
)
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
from vllm.v1.request import RequestStatus
from vllm_peer import VllmSchedulerPeer

from tokenyard.integrations.vllm import TokenyardScheduler

CONNECTOR = "TokenyardRecordingPdConnector"


class RecordingConnector(KVConnectorBase_V1):
    """Scheduler side only: offers ``offer`` tokens of each request (asynchronously when
    ``load_async``) and keeps the block table each finished request hands it."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config
        self._offer = int(extra.get("offer", 0))
        self._load_async = bool(extra.get("load_async", False))
        self.finished: dict[str, list[int]] = {}

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Any:
        if request.status != RequestStatus.WAITING or num_computed_tokens:
            return 0, False
        return self._offer, self._load_async

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        pass

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return KVConnectorMetadata()

    def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, None]:
        self.finished[request.request_id] = list(block_ids)
        return False, None

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        pass

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kw: Any) -> None:
        pass

    def wait_for_save(self) -> None:
        pass


if CONNECTOR not in KVConnectorFactory._registry:
    KVConnectorFactory.register_connector(CONNECTOR, __name__, RecordingConnector.__name__)


def _pair(*, num_speculative_tokens: int = 0, **extra: Any) -> tuple[list[Any], VllmSchedulerPeer]:
    """vLLM's scheduler and tokenyard's, blocks of 16, with the recording connector."""
    peer = VllmSchedulerPeer(
        num_blocks=64,
        max_num_seqs=4,
        max_num_batched_tokens=128,
        max_model_len=256,
        num_speculative_tokens=num_speculative_tokens,
    )
    peer.vllm_config.kv_transfer_config = KVTransferConfig(
        kv_connector=CONNECTOR, kv_role="kv_both", kv_connector_extra_config=extra
    )
    kv_cache_config = peer.scheduler.kv_cache_config
    return [peer.build(cls, kv_cache_config) for cls in (Scheduler, TokenyardScheduler)], peer


def _output(out: Any, tokens: list[int]) -> ModelRunnerOutput:
    ids = list(out.num_scheduled_tokens)
    return ModelRunnerOutput(
        req_ids=ids,
        req_id_to_index={r: n for n, r in enumerate(ids)},
        sampled_token_ids=[list(tokens) for _ in ids],
    )


def test_rejected_drafts_slots_are_not_handed_to_request_finished() -> None:
    # Blocks of 16, 3 n-gram drafts: a 30-token prompt prefills and samples (31 tokens);
    # with drafts the next step computes positions 30..33 and holds 3 blocks. All 3
    # drafts are rejected: 31 computed tokens, so an abort hands cdiv(31, 16) = 2 blocks.
    pair, peer = _pair(num_speculative_tokens=3)
    held = []
    for scheduler in pair:
        request = peer.make_request("r", range(100, 130), max_tokens=20)
        scheduler.add_request(request)
        out = scheduler.schedule()
        scheduler.update_from_output(out, _output(out, [7]))
        scheduler.update_draft_token_ids(DraftTokenIds(["r"], [[8, 9, 10]]))
        out = scheduler.schedule()
        assert out.num_scheduled_tokens == {"r": 4}
        scheduler.update_from_output(out, _output(out, [11]))
        assert request.num_computed_tokens == 31
        held.append(scheduler.kv_cache_manager.get_block_ids("r")[0])
        scheduler.finish_requests("r", RequestStatus.FINISHED_ABORTED)
    assert len(held[0]) == len(held[1]) == 3
    finished = [s.connector.finished["r"] for s in pair]
    assert finished == [held[0][:2], held[1][:2]]


def test_a_load_aborted_in_flight_hands_the_blocks_being_loaded() -> None:
    # vLLM counts the tokens being loaded as computed while the request waits for them:
    # 40 of a 48-token prompt loading into blocks of 16 hand cdiv(40, 16) = 3 blocks of
    # the 3 held.
    pair, peer = _pair(offer=40, load_async=True)
    for scheduler in pair:
        request = peer.make_request("r", range(200, 248), max_tokens=4)
        scheduler.add_request(request)
        out = scheduler.schedule()
        assert out.num_scheduled_tokens == {}
        assert request.status == RequestStatus.WAITING_FOR_REMOTE_KVS
        held = scheduler.kv_cache_manager.get_block_ids("r")[0]
        scheduler.finish_requests("r", RequestStatus.FINISHED_ABORTED)
        assert scheduler.connector.finished["r"] == held[:3]
