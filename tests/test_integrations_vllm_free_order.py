"""The order an update frees blocks in, against vLLM 0.33's own ``Scheduler`` and
``AsyncScheduler``: ``update_from_output`` finishes its ``error_req_ids`` (here a request the
encoder-cache connector gives up on, ``take_unavailable_requests``) and frees their blocks
first, and only then takes the KV connector's report (``_update_from_kv_xfer_finished``),
freeing the blocks of finished requests whose sends completed (``finished_sending``). The
free queue's order decides the blocks later allocations get, so it must be vLLM's. Needs
vLLM (the bench venv); skipped elsewhere.
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
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import KVConnectorOutput
from vllm_compare import runner_output
from vllm_peer import VllmSchedulerPeer

from tokenyard.integrations.vllm import AsyncTokenyardScheduler, TokenyardScheduler

CONNECTOR = "TokenyardSendingConnector"
SYNC = (Scheduler, TokenyardScheduler)


class SendingConnector(KVConnectorBase_V1):
    """Scheduler side only: loads nothing, and holds the blocks of a finished request whose
    id starts with ``send`` for a send (``request_finished`` answers delay-free ``True``)
    until a report frees them."""

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Any:
        return 0, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        pass

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return KVConnectorMetadata()

    def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, None]:
        return request.request_id.startswith("send"), None

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        pass

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kw: Any) -> None:
        pass

    def wait_for_save(self) -> None:
        pass


if CONNECTOR not in KVConnectorFactory._registry:
    KVConnectorFactory.register_connector(CONNECTOR, __name__, SendingConnector.__name__)


class GivingUpEncoderConnector:
    """An encoder-cache connector (scheduler side) that has every input, and gives up on
    the requests in ``give_up`` at the next update (``take_unavailable_requests``)."""

    def __init__(self) -> None:
        self.give_up: set[str] = set()

    def ensure_cache_available(self, request: Any, num_computed_tokens: int) -> bool:
        return True

    def take_unavailable_requests(self) -> set[str]:
        taken, self.give_up = self.give_up, set()
        return taken

    def has_cache_item(self, identifier: str) -> bool:
        return False

    def update_state_after_alloc(self, request: Any, index: int) -> None:
        pass

    def update_state_after_free(self, request: Any, index: int) -> None:
        pass

    def has_pending_push_work(self) -> bool:
        return False

    def build_connector_meta(self, scheduler_output: Any) -> None:
        return None

    def update_connector_output(self, output: Any) -> None:
        pass

    def request_finished(self, request: Any) -> tuple[bool, dict[str, Any]]:
        return False, {}

    def get_ec_connector_stats(self) -> None:
        return None

    def shutdown(self) -> None:
        pass


def _build(cls: type, peer: VllmSchedulerPeer) -> Any:
    scheduler = peer.build(cls, peer.scheduler.kv_cache_config)
    scheduler.ec_connector = GivingUpEncoderConnector()
    return scheduler


def _free_order(scheduler: Any) -> list[int]:
    queue = scheduler.kv_cache_manager.block_pool.free_block_queue
    return [block.block_id for block in queue.get_all_free_blocks()]


def _run(asynchronous: bool, caching: bool) -> list[list[int]]:
    """On each scheduler: ``send`` (one output token) and ``b`` run; ``send`` finishes and
    its send holds its blocks; then one update both reports that send done and gives up on
    ``b``'s encoder input. Returns each side's free queue after it, and checks the steps
    after (new requests take the blocks at the queue's head) agree."""
    peer = VllmSchedulerPeer(
        num_blocks=24,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        max_model_len=256,
        enable_prefix_caching=caching,
    )
    peer.vllm_config.scheduler_config.disable_hybrid_kv_cache_manager = True
    peer.vllm_config.kv_transfer_config = KVTransferConfig(
        kv_connector=CONNECTOR, kv_role="kv_both"
    )
    classes = (AsyncScheduler, AsyncTokenyardScheduler) if asynchronous else SYNC
    pair = [_build(cls, peer) for cls in classes]
    orders = []
    tables = []
    for scheduler in pair:
        scheduler.add_request(peer.make_request("send", list(range(40)), 1))
        scheduler.add_request(peer.make_request("b", list(range(100, 150)), 8))
        first = scheduler.schedule()
        second = scheduler.schedule() if asynchronous else None
        scheduler.update_from_output(first, runner_output(scheduler, first))
        # `send` finished: its blocks wait for the send.
        assert "send" in scheduler.requests
        if second is None:
            second = scheduler.schedule()
        landing = runner_output(scheduler, second)
        landing.kv_connector_output = KVConnectorOutput(finished_sending={"send"})
        scheduler.ec_connector.give_up = {"b"}
        scheduler.update_from_output(second, landing)
        assert "send" not in scheduler.requests
        assert "b" not in scheduler.requests
        orders.append(_free_order(scheduler))
        scheduler.add_request(peer.make_request("c", list(range(200, 240)), 2))
        out = scheduler.schedule()
        tables.append([r.block_ids for r in out.scheduled_new_reqs])
    assert tables[1] == tables[0]
    return orders


@pytest.mark.parametrize("caching", [False, True])
@pytest.mark.parametrize("asynchronous", [False, True])
def test_error_requests_free_their_blocks_before_finished_sends_as_in_vllm(
    asynchronous: bool, caching: bool
) -> None:
    # Before the adapter's early path (no pool-keeping connector) released the finished
    # send's blocks last, ahead of the encoder-cache error's: `c` got `b`'s blocks (7, 6, 5)
    # where vLLM gives it the send's (3, 2, 1).
    orders = _run(asynchronous, caching)
    assert orders[1] == orders[0]


class RaisingConnector(SendingConnector):
    """Raises from ``request_finished``."""

    def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, None]:
        raise RuntimeError(f"request_finished refused {request.request_id}")


if "TokenyardRaisingConnector" not in KVConnectorFactory._registry:
    KVConnectorFactory.register_connector(
        "TokenyardRaisingConnector", __name__, RaisingConnector.__name__
    )


def test_an_update_that_raises_forgets_its_tokens() -> None:
    """The KV connector bridge keeps the update's tokens while the core finishes requests
    (its ``request_finished`` appends them first); an update that raises there still drops
    them, so a later finish outside an update (an abort) appends nothing stale."""
    peer = VllmSchedulerPeer(
        num_blocks=24, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=256
    )
    peer.vllm_config.kv_transfer_config = KVTransferConfig(
        kv_connector="TokenyardRaisingConnector", kv_role="kv_both"
    )
    scheduler = peer.build(TokenyardScheduler, peer.scheduler.kv_cache_config)
    scheduler.add_request(peer.make_request("r", list(range(40)), 1))
    out = scheduler.schedule()
    with pytest.raises(Exception, match="request_finished") as raised:
        scheduler.update_from_output(out, runner_output(scheduler, out))
    assert "refused r" in repr(raised.value) + repr(raised.value.__cause__)
    assert scheduler._bridge.tokens_in_update == {}
