"""The CDC relay's shutdown sequence for one streaming session (see :func:`finish`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from cdc_outbox.cdc.eos import EosCommitter
from cdc_outbox.cdc.published_marker import PublishedMarker
from cdc_outbox.cdc.relay_ports import ReplicationPort
from cdc_outbox.cdc.slot_feedback import Checkpointer
from cdc_outbox.delivery.engine import Delivery
from cdc_outbox.kafka.publisher import ProduceInterrupted, TransactionFailed
from cdc_outbox.lsn import Lsn
from cdc_outbox.pgwire.walproto import Keepalive

logger = logging.getLogger(__name__)


def finish(
    deadline: float,
    *,
    stream: ReplicationPort,
    delivery: Delivery,
    checkpoint: Checkpointer,
    eos: EosCommitter | None,
    marker: PublishedMarker | None,
    is_leader: Callable[[], bool],
    interrupted: Callable[[], str | None],
) -> None:
    """Until ``deadline`` (monotonic): let Kafka acknowledge what is in flight (exactly-once:
    commit the closing Kafka transaction, then the open one unless ``interrupted()``), wait for
    the marker, confirm what is acknowledged and wait briefly for the server's reply. A lost
    leadership ends it at once, confirming nothing more."""
    while (
        time.monotonic() < deadline - 1.0
        and (delivery.busy or (eos is not None and eos.closing))
        and is_leader()
    ):
        if eos is not None and eos.closing and interrupted() is not None:
            break  # e.g. halted: the closing transaction is not committed
        delivery.publisher.send_now(0.05)  # nothing more is read: no lingering
        try:
            delivery.service()
            if eos is not None:
                eos.step(interrupted, checkpoint.maybe_send, close=False)
        except (ProduceInterrupted, TransactionFailed):
            break
        checkpoint.maybe_send()
    if not is_leader():
        return
    if (
        eos is not None
        and eos.batch.events
        and not eos.batch.in_txn
        and not eos.closing
        and not delivery.publisher.deferring
    ):
        try:
            eos.settle_and_commit(interrupted, checkpoint.maybe_send)
        except TransactionFailed as exc:
            logger.warning("final Kafka commit failed (%s): it will be re-sent", exc)
    if marker is not None:  # confirmed positions must be marked (see checkpoint)
        marker.settle(max(0.0, deadline - 0.5 - time.monotonic()))
    checkpoint.send(reply_requested=True)
    reply_deadline = time.monotonic() + max(0.2, min(1.0, deadline - time.monotonic()))
    while time.monotonic() < reply_deadline:
        frame = stream.read(reply_deadline - time.monotonic())
        if isinstance(frame, Keepalive) or frame is None:
            break
    confirmed = str(Lsn(checkpoint.sent_flush))
    logger.info("stopped; confirmed %s", confirmed, extra={"mode": "cdc", "lsn": confirmed})
