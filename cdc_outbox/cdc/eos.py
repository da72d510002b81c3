"""Exactly-once delivery of the CDC relay: Kafka transactions over PostgreSQL transactions.

Learned from Kafka Connect's KIP-618, in one process: one transactional producer per slot
(``transactional.id`` derived from the server's system identifier, the database and the slot),
the position (a checkpoint record) committed in the same Kafka transaction as the events, and
zombie fencing by ``init_transactions``. Contract (with :class:`~cdc_outbox.delivery.eos_batch.
EosBatch` for the rules):

- Events of whole PostgreSQL transactions go into the open Kafka transaction; at a boundary,
  once :meth:`EosCommitter.due`, the relay waits for every outcome (dead-lettered rows are
  then FAILED in PostgreSQL) and :meth:`EosCommitter.commit` writes the checkpoint (end LSN of
  the batch's last PostgreSQL transaction) and commits.
- The slot is confirmed only up to the last committed end LSN (:meth:`EosCommitter.ceiling`).
- Every session (start and re-stream) :meth:`EosCommitter.load` reads the last committed
  checkpoint (``read_committed``, after ``init_transactions`` settled our older transactions:
  the outcome of a commit that failed midway is known only there); PostgreSQL transactions
  that Kafka already holds are skipped (:meth:`EosCommitter.skip`). The position never goes
  back (kept in memory too).
- Any failure aborts the Kafka transaction and re-streams from the confirmed position; a
  fenced producer (a newer instance took over) never commits.
"""

from __future__ import annotations

import logging
import time

from cdc_outbox.cdc.txn_handle import TxnHandle
from cdc_outbox.config import Settings
from cdc_outbox.delivery.engine import Delivery
from cdc_outbox.delivery.eos_batch import EosBatch
from cdc_outbox.kafka import checkpoints
from cdc_outbox.lsn import Lsn
from cdc_outbox.relay_stats import RelayStats

logger = logging.getLogger(__name__)


def transactional_id(settings: Settings, system_id: str, database: str) -> str:
    """The configured ``eos.transactional_id`` or ``cdc-outbox.<system>.<database>.<slot>``."""
    explicit = settings.eos.transactional_id
    return explicit or f"cdc-outbox.{system_id}.{database}.{settings.slot_name}"


class EosCommitter:
    """The open Kafka transaction of one relay and its checkpoints (see the module contract)."""

    def __init__(
        self, settings: Settings, delivery: Delivery, stats: RelayStats, identity: tuple[str, str]
    ) -> None:
        self.settings = settings
        self.delivery = delivery
        self.stats = stats
        self.system_id, self.database = identity
        self.batch = EosBatch(settings.eos.commit_interval_ms / 1000, settings.eos.max_events)
        self.txns: list[TxnHandle] = []  # the batch's transactions with events (for latency)

    def load(self) -> checkpoints.Checkpoint | None:
        """Create the checkpoint topic if missing and read the last committed checkpoint (call
        after the producer's ``init_transactions``: our older transactions are then settled).
        Raises ``ConnectionError`` or ``TimeoutError``."""
        config = self.settings.kafka_config()
        topic = self.settings.eos.checkpoint_topic
        checkpoints.ensure_topic(config, topic)
        key = checkpoints.checkpoint_key(self.system_id, self.database, self.settings.slot_name)
        last = checkpoints.read_last(config, topic, key)
        if last is not None and last.end_lsn > self.batch.committed_lsn:
            self.batch.committed_lsn = self.batch.end_lsn = last.end_lsn
        logger.info(
            "exactly-once: Kafka holds PostgreSQL transactions up to %s",
            Lsn(self.batch.committed_lsn),
            extra={"mode": "cdc"},
        )
        return last

    def reset(self) -> None:
        """A new session (after an abort): the open batch is forgotten and re-streamed."""
        self.batch.aborted()
        self.txns.clear()

    def skip(self, final_lsn: int) -> bool:
        return self.batch.skip(final_lsn)

    def ceiling(self) -> int | None:
        return self.batch.ceiling()

    def due(self) -> bool:
        return self.batch.due(time.monotonic())

    def checkpoint(self, catch_up_ids: list[str] | None = None) -> checkpoints.Checkpoint:
        return checkpoints.Checkpoint(
            self.settings.slot_name,
            self.system_id,
            self.database,
            self.batch.end_lsn,
            catch_up_ids or [],
        )

    def commit(self, catch_up_ids: list[str] | None = None) -> None:
        """Commit the open Kafka transaction with its checkpoint (nothing may be busy);
        raises ``TransactionFailed``."""
        self.delivery.commit(self.checkpoint(catch_up_ids))
        self.batch.committed()
        if self.stats.latency_observers and self.txns:
            now = time.time()
            for txn in self.txns:
                if txn.commit_unix:
                    self.stats.observe_latency(now - txn.commit_unix, txn.events)
        self.txns.clear()
