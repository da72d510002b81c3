"""Exactly-once delivery of the CDC relay: Kafka transactions over PostgreSQL transactions.

Learned from Kafka Connect's KIP-618, in one process: one transactional producer per slot
(``transactional.id`` derived from the server's system identifier, the database and the slot),
the position (a checkpoint record) committed in the same Kafka transaction as the events, and
zombie fencing by ``init_transactions``. Contract (the positions and their rules are the
:class:`~cdc_outbox.cdc.ledger.Ledger`'s, with :class:`~cdc_outbox.cdc.eos_batch.EosBatch`):

- Events of whole PostgreSQL transactions go into the open Kafka transaction; at a boundary,
  once it is due (at once when the relay caught up with the WAL, else by the commit interval
  or ``max_events``: :meth:`EosBatch.due`), :meth:`EosCommitter.step` closes it: the
  checkpoint record (end LSN of the batch's last PostgreSQL transaction) goes in, later
  records are held back for the next transaction while the relay keeps reading, and once
  every record of the closed one is acknowledged it commits, then releases the held-back
  records. With dead letters pending it waits instead until they are acknowledged and their
  rows FAILED in PostgreSQL, then commits (:meth:`EosCommitter.settle_and_commit`; catch-up
  batches: :meth:`EosCommitter.commit`).
- The slot is confirmed only up to the last committed end LSN (:meth:`Ledger.ceiling`).
- Every session (start and re-stream) :meth:`EosCommitter.load` reads the last committed
  checkpoint (``read_committed``, after ``init_transactions`` settled our older transactions:
  the outcome of a commit that failed midway is known only there); PostgreSQL transactions
  that Kafka already holds are skipped (:meth:`EosCommitter.on_begin`), and their events' ids
  go to the published-marker all the same. A checkpoint of another history (a failover to a
  standby that was behind, a restore) is trusted only as far as
  :meth:`~cdc_outbox.cdc.ledger.Ledger.trust_checkpoint` allows: the rest is published again
  (counted in ``stats.untrusted_checkpoints``, logged).
- The relay re-streams from :meth:`Ledger.restart_from`: nothing past the last Kafka commit,
  whatever was acknowledged in an aborted transaction, nor past the last commit this process
  knew before the checkpoint read (a commit that landed though reported failed never handed
  its ids to the marker: its transactions are streamed again, skipped and marked).
- Any failure aborts the Kafka transaction and re-streams from the confirmed position; a
  fenced producer (a newer instance took over) never commits.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from cdc_outbox.cdc.eos_batch import EosBatch
from cdc_outbox.cdc.eos_start import meanwhile
from cdc_outbox.cdc.history import History
from cdc_outbox.cdc.ledger import Ledger
from cdc_outbox.cdc.txn_handle import TxnHandle
from cdc_outbox.config.cdc import EosSection
from cdc_outbox.crash_points import crash_during, crash_point
from cdc_outbox.delivery.engine import Delivery
from cdc_outbox.kafka import checkpoints
from cdc_outbox.kafka.delivery_failure import DeliveryFailure, Headers
from cdc_outbox.kafka.publisher import ProduceInterrupted, TransactionFailed
from cdc_outbox.lsn import Lsn
from cdc_outbox.pgwire import pgoutput
from cdc_outbox.store import db_pool
from cdc_outbox.store.outbox_table import OutboxTable
from cdc_outbox.telemetry.relay_stats import RelayStats

logger = logging.getLogger(__name__)

#: After a commit every record is acknowledged: serving the last reports takes no longer.
_REPORTS_AFTER_COMMIT_S = 5.0


def transactional_id(section: EosSection, system_id: str, database: str) -> str:
    """The configured ``eos.transactional_id`` or ``cdc-outbox.<system>.<database>.<slot>``."""
    explicit = section.eos.transactional_id
    return explicit or f"cdc-outbox.{system_id}.{database}.{section.slot_name}"


class EosCommitter:
    """The open Kafka transaction of one relay and its checkpoints (see the module contract);
    ``outboxes``: every configured outbox table (a catch-up checkpoint's ids are theirs)."""

    def __init__(
        self,
        section: EosSection,
        outboxes: Sequence[OutboxTable],
        delivery: Delivery,
        stats: RelayStats,
        identity: tuple[str, str],
        store: checkpoints.CheckpointStore | None = None,
    ) -> None:
        self.section, self._outboxes = section, tuple(outboxes)
        self.store = store or checkpoints.KafkaCheckpoints(
            dict(section.kafka), section.eos.checkpoint_topic
        )
        self.delivery = delivery
        self.stats = stats
        self.system_id, self.database = identity
        self.producer = delivery.transactional_id or ""
        eos = section.eos
        self.batch = EosBatch(
            eos.commit_interval_ms / 1000,
            eos.max_events,
            min_interval_s=eos.min_commit_interval_ms / 1000,
        )
        self.ledger = Ledger(self.batch)  # the relay's positions (the batch's included)
        self.txns: list[TxnHandle] = []  # the batch's transactions with events (for latency)
        self._closing_txns: list[TxnHandle] = []  # those of the closed batch

    def load(self, history: History, *, ensure_topic: bool = True) -> checkpoints.Checkpoint | None:
        """Create the checkpoint topic if missing (unless ``ensure_topic`` is False: done
        already) and read the last committed checkpoint (call after the producer's
        ``init_transactions``: our older transactions are then settled). Transactions below
        the part of it that holds in ``history`` are skipped from now on. Raises
        ``ConnectionError`` or ``TimeoutError``."""
        if ensure_topic:
            self.store.ensure()
        slot = self.section.slot_name
        key = checkpoints.checkpoint_key(self.system_id, self.database, slot)
        last = self.store.read_last(
            key, lambda cp: cp.written_by(slot, self.system_id, self.database, self.producer)
        )
        recorded = None if last is None else (last.end_lsn, last.system_id, last.timeline)
        kafka = self.ledger.trust_checkpoint(history, recorded)
        if last is not None and kafka < last.end_lsn:
            self.stats.untrusted_checkpoints += 1
            logger.warning(
                "exactly-once: the last checkpoint (%s on timeline %s) is not all in this"
                " database's history (timeline %d, WAL end %s): trusting it only up to %s;"
                " transactions after that are published again (duplicates possible)",
                Lsn(last.end_lsn),
                last.timeline if last.timeline is not None else "unknown",
                history.timeline,
                Lsn(history.wal_end),
                Lsn(kafka),
                extra={"mode": "cdc"},
            )
        logger.info(
            "exactly-once: Kafka holds PostgreSQL transactions up to %s (timeline %d)",
            Lsn(self.batch.committed_lsn),
            history.timeline,
            extra={"mode": "cdc"},
        )
        return last

    def start_session(self, history: History) -> checkpoints.Checkpoint | None:
        """A streaming session starts (only as the leader): fence older producers with our
        transactional.id, forget the aborted batch (it is re-streamed) and read the last
        checkpoint (every session: a failed commit's outcome is only known from Kafka).
        Raises ``TransactionFailed``, ``ConnectionError``, ``TimeoutError``.

        The checkpoint topic is ensured on a helper thread meanwhile (it needs no fencing: only
        reading the checkpoint must come after ``init_transactions``), so that a session start
        pays one broker round trip less. Returns the checkpoint read."""
        ensured = self._fence_meanwhile_ensure_topic()
        self.batch.aborted()
        self.txns.clear()
        self._closing_txns = []
        return self.load(history, ensure_topic=not ensured)

    def _fence_meanwhile_ensure_topic(self) -> bool:
        """``ensure_transactions`` while a helper thread ensures the checkpoint topic; True if
        the topic was ensured. Raises what either raised."""
        return meanwhile(self.delivery.ensure_transactions, self.store.ensure)

    def on_begin(self, payload: bytes) -> bool:
        """A Begin message: True if Kafka already holds this transaction (skip it)."""
        begin = pgoutput.decode(payload)
        assert isinstance(begin, pgoutput.Begin)
        if self.ledger.skip(begin.final_lsn):
            return True
        self.batch.begin()
        return False

    def on_commit(self, end_lsn: int, txn: TxnHandle) -> None:
        """The Commit of a transaction that was not skipped."""
        self.batch.end(end_lsn, had_events=txn.events > 0)
        if txn.events:
            self.txns.append(txn)

    def add_event(self) -> None:
        """An event of the open PostgreSQL transaction goes into the Kafka transaction. The
        first one is preceded by a copy of the committed checkpoint: it registers the
        checkpoint partition with the Kafka transaction together with the first events', so
        the commit does not wait for that registration (a coordinator round trip, at times
        ~100 ms on a busy broker). Harmless: it claims only what is committed, and the
        transaction's own checkpoint record, written later, supersedes it."""
        batch = self.batch
        if batch.events == 0:
            self._produce_checkpoint(end_lsn=batch.committed_lsn)
        batch.add_event(time.monotonic())

    def due(self, caught_up: bool = False) -> bool:
        return self.batch.due(time.monotonic(), caught_up)

    def commit(
        self,
        catch_up_ids: list[str] | None = None,
        dead_letters: list[tuple[str, str]] | None = None,
    ) -> None:
        """Add the checkpoint record to the open Kafka transaction and commit it (nothing may
        be busy); raises ``TransactionFailed``. A catch-up batch's checkpoint names its
        published rows and its dead letters (marked FAILED only after the commit)."""
        self._produce_checkpoint(catch_up_ids, dead_letters=dead_letters)
        self._close()
        self._commit_call()
        self._committed()

    # -- streaming: close, keep reading, commit ----------------------------------------------

    @property
    def closing(self) -> bool:
        return self.batch.closing

    def step(
        self,
        interrupted: Callable[[], str | None],
        idle: Callable[[], None],
        *,
        close: bool = True,
        caught_up: bool = False,
    ) -> None:
        """The relay's exactly-once turn: commit the closing Kafka transaction once all its
        records are acknowledged, or close the open one when due (``caught_up``: nothing more
        to read now; and ``close``). Reading goes
        on while a transaction closes; with dead letters pending the commit waits for them
        instead (:meth:`settle_and_commit`). Raises ``TransactionFailed`` and
        ``ProduceInterrupted``."""
        publisher = self.delivery.publisher
        if not self.closing:
            if publisher.deferring:  # an interrupted release: finish it first
                publisher.release(interrupted=interrupted, idle=idle)
                return
            if not (close and self.due(caught_up)):
                return
            if self.delivery.dead_letters_pending:
                self.settle_and_commit(interrupted, idle)
                return
            # Often acknowledged at once (its flush serves the reports): then commit now, as
            # nothing else would wake the relay before its next read times out.
            self.begin_close()
        if self.close_ready() and interrupted() is None:
            self.finish_close(interrupted, idle)

    def turn_ends(self) -> bool:
        """At a PostgreSQL commit: should the relay's read turn end here for :meth:`step`?
        Yes if the closing transaction can commit (or the next one is :meth:`~EosBatch.full`),
        or if the open one is due."""
        if self.closing:
            return self.close_ready() or self.batch.full()
        return self.due()

    def begin_close(self) -> None:
        """Close the open Kafka transaction without waiting (no dead letter may be pending):
        its checkpoint record goes in, and what the relay produces from now on is held back
        for the next transaction until :meth:`finish_close`."""
        self._produce_checkpoint()
        self._close()
        publisher = self.delivery.publisher
        publisher.defer()
        # Nothing joins this transaction any more: its records go out now instead of after
        # linger.ms, and often their acknowledgements arrive meanwhile (then step commits now).
        publisher.send_now(0.002)

    def close_ready(self) -> bool:
        """Every record of the closing transaction is acknowledged (its reports served)."""
        return self.delivery.publisher.unacknowledged == 0

    def finish_close(self, interrupted: Callable[[], str | None], idle: Callable[[], None]) -> None:
        """Commit the closed transaction (once :meth:`close_ready`), then produce the records
        held back into the next one. Raises ``TransactionFailed``, or ``ProduceInterrupted``
        after the commit (the rest stays held back, ahead of anything later)."""
        self._commit_call()
        self._committed()
        self.delivery.publisher.release(interrupted=interrupted, idle=idle)

    # -- the commit ----------------------------------------------------------------------------

    def _close(self) -> None:
        self.batch.close(time.monotonic())
        self._closing_txns, self.txns = self.txns, []

    def _produce_checkpoint(
        self,
        catch_up_ids: list[str] | None = None,
        end_lsn: int | None = None,
        dead_letters: list[tuple[str, str]] | None = None,
    ) -> None:
        """A checkpoint record (end LSN of the open batch, or ``end_lsn``) into the open Kafka
        transaction (held back while the previous one closes)."""
        delivery = self.delivery
        checkpoint = checkpoints.Checkpoint(
            self.section.slot_name,
            self.system_id,
            self.database,
            self.batch.end_lsn if end_lsn is None else end_lsn,
            catch_up_ids or [],
            timeline=None if (h := self.ledger.committed_in) is None else h.timeline,
            producer=self.producer,
            dead_letters=dead_letters or [],
        )
        topic = self.section.eos.checkpoint_topic
        delivery.publisher.produce(
            topic, checkpoint.key, checkpoint.encode(), [], _CheckpointSent(delivery)
        )

    def _commit_call(self) -> None:
        """Commit the Kafka transaction (``commit_transaction`` flushes every queued record
        first and fails if any of them failed). On failure the delivery reports are served
        before raising, so a broker rejection is recorded (its event is dead-lettered up front
        when re-sent)."""
        delivery = self.delivery
        crash_point("eos.before_kafka_commit")
        try:
            with crash_during("eos.in_kafka_commit"):
                delivery.publisher.commit(delivery.txn_timeout_s())
        except TransactionFailed:
            delivery.publisher.poll(0)
            raise
        crash_point("eos.after_kafka_commit")

    def _committed(self) -> None:
        """The closed Kafka transaction committed and every report of it was served."""
        self.batch.committed(time.monotonic())
        self.delivery.committed()
        if self.stats.latency_observers and self._closing_txns:
            now = time.time()
            for txn in self._closing_txns:
                if txn.commit_unix:
                    self.stats.observe_latency(now - txn.commit_unix, txn.events)
        self._closing_txns = []

    def settle_and_commit(
        self, interrupted: Callable[[], str | None], idle: Callable[[], None]
    ) -> bool:
        """Commit the open Kafka transaction. Dead letters in it are settled first (acknowledged
        and their rows FAILED in PostgreSQL: durable before the commit); otherwise the commit
        goes out at once, and the delivery reports (all acknowledged once it succeeded) are
        served before the ids go to the published-marker. Returns False, committing nothing,
        once ``interrupted()`` gives a reason (stop, restart, halt, leadership lost: the
        caller's loop deals with it); raises ``TransactionFailed``."""
        delivery = self.delivery
        try:
            delivery.service()
            while delivery.dead_letters_pending:
                self.stats.beat()
                if interrupted() is not None:
                    return False
                delivery.publisher.flush(0.01)  # sends at once, without waiting for linger.ms
                delivery.service()
                idle()
        except ProduceInterrupted:
            return False
        if interrupted() is not None:
            return False
        self._produce_checkpoint()
        self._close()
        try:
            self._commit_call()
        except TransactionFailed:
            if interrupted() is not None:  # e.g. a rejected record (its report was served)
                return False
            raise
        # Committed: every record is acknowledged. Serve the reports still queued (each a
        # success now, no broker round trip), whatever interrupts, so that every id reaches
        # the published-marker (a row left PENDING would be published again by a catch-up);
        # a report served after this wait hands its id itself (RecordReport).
        publisher = delivery.publisher
        deadline = time.monotonic() + _REPORTS_AFTER_COMMIT_S
        while publisher.unacknowledged and time.monotonic() < deadline:
            publisher.poll(0.001)
        self._committed()
        idle()
        return True

    def settle_last_catch_up(self, history: History) -> None:
        """Before a catch-up takes its snapshot: fence older producers, read the last
        checkpoint and mark the rows of the catch-up batch it committed, PUBLISHED or FAILED
        (they are then skipped). Raises ``CatchUpFailed``."""
        from cdc_outbox.cdc.catch_up import CatchUpFailed
        from cdc_outbox.cdc.catch_up_marks import mark_committed_batch

        try:
            self.delivery.new_session()
            ensured = self._fence_meanwhile_ensure_topic()
            last = self.load(history, ensure_topic=not ensured)
        except (TransactionFailed, ConnectionError, TimeoutError) as exc:
            raise CatchUpFailed(f"exactly-once start failed: {exc}") from exc
        if last is not None and (last.catch_up_ids or last.dead_letters):
            with db_pool.connect(self.section.dsn, autocommit=True) as conn:
                mark_committed_batch(conn, self._outboxes, last.catch_up_ids, last.dead_letters)


class _CheckpointSent:
    """Delivery listener of a checkpoint record: a failure aborts the transaction."""

    __slots__ = ("delivery", "epoch")

    def __init__(self, delivery: Delivery) -> None:
        self.delivery = delivery
        self.epoch = delivery.epoch

    def delivered(self, topic: str, headers: Headers) -> None:
        pass

    def failed(self, failure: DeliveryFailure) -> None:
        if self.epoch == self.delivery.epoch:
            self.delivery.restart(f"checkpoint record failed: {failure.reason}", failure)
