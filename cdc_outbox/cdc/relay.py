"""The CDC relay: the pipeline's session loop (the pipeline is wired by
:func:`~cdc_outbox.cdc.relay_build.build_relay`).

    replication stream -> pgoutput decoder -> outbox mapping -> delivery -> ack tracker
      (libpq COPY BOTH)       (pure)             (pure)      (policy + Kafka)     |
    standby status update (confirmed_flush_lsn)  <--------------------------------+

The session loop (reading, flow control, confirmation, shutdown) is here; each message is
routed by :class:`~cdc_outbox.cdc.message_router.MessageRouter`.

Delivery contract (at-least-once, per-aggregate order):
- Transactions arrive in commit order; their events are submitted in that order, so events of
  one ``aggregate_id`` (one key, one partition) reach Kafka in commit order.
- The slot is confirmed only up to the end LSN of the newest commit whose events, and those
  of every earlier transaction, Kafka has acknowledged or were durably dead-lettered (record
  on the dead-letter topic *and* row marked FAILED). A crash anywhere re-sends the unconfirmed
  window; nothing is skipped. Every position and its rules: :mod:`cdc_outbox.cdc.ledger`.
- Every failure follows :mod:`cdc_outbox.delivery.policy`: record-level rejections are
  dead-lettered and park their aggregate (or halt); anything else drops the stream and the
  producer queue and re-streams from the confirmed position (duplicates, no gaps, no reorder).
- A ``cdc_outbox.redrive`` logical message (written by ``cdc-outbox redrive`` in the same
  transaction as the re-inserted rows) releases the named aggregates at that point of the
  stream, so re-driven events and later ones keep their order.
- Memory is bounded by ``max_in_flight`` unacknowledged events whatever the transaction size:
  past it the relay stops reading the slot and keeps the connection alive with status updates.
- The relay runs only while ``is_leader()`` holds; otherwise it drops everything unconfirmed
  and raises :class:`~cdc_outbox.store.relay_state.NotLeader`. A lost leadership is latched
  where it is first seen: a later ``True`` (a renew that came in late) does not revive it.
- :meth:`Relay.run` returns only after :meth:`Relay.request_stop`; every other end raises
  its reason (``RelayHalted``, ``NotLeader``, ``CdcUnavailable``, a permanent error).
- ``delivery = "exactly_once"``: Kafka transactions, see :mod:`cdc_outbox.cdc.eos`.
- Every session start re-applies the service's catch-up rule (:mod:`cdc_outbox.cdc.slot_watch`):
  a slot recreated while the relay was between sessions is never streamed;
  :class:`~cdc_outbox.cdc.slot_watch.SlotChanged` is raised and the service catches up.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import psycopg

from cdc_outbox.cdc.catch_up import CatchUpFailed, publish_backlog
from cdc_outbox.cdc.ledger import Ledger
from cdc_outbox.cdc.progress_log import ProgressLog
from cdc_outbox.cdc.relay_finish import finish
from cdc_outbox.cdc.relay_parts import RelayParts
from cdc_outbox.cdc.replication_stream import ReplicationError
from cdc_outbox.cdc.slot_feedback import Checkpointer
from cdc_outbox.cdc.slot_watch import SlotWatch
from cdc_outbox.cdc.stream_failures import give_up_if_unusable
from cdc_outbox.config.backoff import RECONNECT, Backoff
from cdc_outbox.config.cdc import CdcRelaySection
from cdc_outbox.delivery.policy import guarantee_in_effect
from cdc_outbox.errors import DatabaseUnavailable, RelayHalted
from cdc_outbox.kafka.publisher import ProduceInterrupted, TransactionFailed
from cdc_outbox.lsn import Lsn
from cdc_outbox.store.relay_state import NotLeader
from cdc_outbox.telemetry.relay_stats import RelayStats

logger = logging.getLogger(__name__)

#: A session that streamed this long resets the restart back-off.
_HEALTHY_SESSION_S = 5.0


class _Restart(Exception):
    """Tear the stream down and re-stream from the confirmed position."""


class _Ended(Exception):
    """The session loop cannot go on (halted, leadership lost): :meth:`Relay.run` raises
    the reason after closing."""


class Relay:
    """Streams one slot into Kafka until :meth:`request_stop`; see the module contract."""

    def __init__(
        self,
        section: CdcRelaySection,
        parts: RelayParts,
        stats: RelayStats,
        *,
        is_leader: Callable[[], bool] = lambda: True,
    ) -> None:
        """``parts``: the pipeline :func:`~cdc_outbox.cdc.relay_build.build_relay` wired for
        ``section``, reporting to ``stats``."""
        self.section = section
        self.stats = stats
        self._leader_check = is_leader
        #: Why leadership ended, latched where first seen (a lapsed term cannot come back).
        self.lost_leadership: str | None = None
        self._stream = parts.stream
        self._kept, self._keep, self._parked = parts.kept, parts.keep, parts.parked
        self._slot_watch = SlotWatch(parts.slot_facts)
        self._new_tables = parts.new_tables
        self._outboxes, self._mappers = parts.outboxes, parts.mappers
        self.marker = parts.marker
        self._bookkept = all(t.has_status for t in self._outboxes)
        self.delivery, self.eos, self._router = parts.delivery, parts.eos, parts.router
        self.stats.delivery_guarantee = guarantee_in_effect(section.guarantee, None)
        self.delivery.interrupted = self._interrupted
        self._ledger = self.eos.ledger if self.eos is not None else Ledger()
        self._stop_requested = False
        self._grace_deadline: float | None = None
        self._session_opened = False
        self._checkpoint: Checkpointer | None = None
        self._started = False
        self._catching_up = False

    # -- lifecycle -------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Finish the current transaction, flush, confirm and return (within the grace)."""
        self._stop_requested = True

    def catch_up(self) -> tuple[int, int]:
        """Create the slot (exporting a snapshot) and publish every row still unpublished in
        that snapshot, all acknowledged or durably dead-lettered, before :meth:`run` streams
        from the consistent point. Returns ``(consistent_point, rows)``. Raises
        :class:`~cdc_outbox.cdc.catch_up.CatchUpFailed`, ``RelayHalted`` or ``NotLeader``;
        the slot is then left for the caller (its phase stays CATCHING_UP)."""
        from cdc_outbox.crash_points import crash_point

        self._start()
        self._catching_up = True
        try:
            if self.eos is not None:
                self.eos.settle_last_catch_up(self._stream.connect())
                if not self._is_leader():  # lapsed while registering: see _stream_session
                    raise NotLeader("leadership lost while registering the transactional id")
            point, snapshot = self._stream.create_slot()
            crash_point("catch_up.slot_created")
            rows = publish_backlog(
                self.section.catch_up,
                self._outboxes,
                snapshot,
                self.delivery,
                self._mappers,
                self.eos,
            )
            if self._new_tables is not None:
                self._new_tables.slot_created(point)  # every configured table, from point
        except BaseException:
            self.delivery.abandon()
            self.close()
            raise
        finally:
            self._catching_up = False
        return point, rows

    def run(self) -> None:
        """Stream until stopped (see the module contract).

        Raises RelayHalted on a permanent delivery failure with the halt policy, NotLeader when
        leadership is lost. With ``mode="auto"`` raises :class:`CdcUnavailable` when streaming
        cannot work (a permanent replication error, or ``cdc_max_failures`` failed connections
        in a row); otherwise a permanent replication error is raised as is and transient ones
        are retried forever.
        """
        self._start()
        backoff = Backoff(RECONNECT)
        failures = 0
        try:
            while not self._stop_requested:
                self._session_opened = False
                began = time.monotonic()
                try:
                    self._stream_session()
                    backoff.reset()
                except (_Restart, ReplicationError, psycopg.Error, TransactionFailed) as exc:
                    failures = 0 if self._session_opened else failures + 1
                    if isinstance(exc, ReplicationError):
                        give_up_if_unusable(self.section, exc, failures)
                    if self._session_opened and time.monotonic() - began >= _HEALTHY_SESSION_S:
                        backoff.reset()  # it streamed healthily: this failure is a new one
                    self.stats.restarts += 1
                    # Kafka trouble: drop the queue. Database trouble: let Kafka finish first,
                    # so what it acknowledges moves the restart position forward. Kafka-side
                    # problems are retried at least every 10 s (an alert is up).
                    kafka_side = isinstance(exc, _Restart | TransactionFailed)
                    delay = backoff.failed(10.0 if kafka_side else None)
                    lsn = str(Lsn(self._ledger.acked.confirmed))
                    extra = {"mode": "cdc", "lsn": lsn}
                    logger.warning("relay restarting in %.1fs: %s", delay, exc, extra=extra)
                    self._teardown(flush_s=0.0 if kafka_side or self.eos else 10.0)
                    self._sleep(delay)
        except _Ended:
            pass
        finally:
            self.close()
        if self.delivery.halt_reason is not None:
            raise RelayHalted(self.delivery.halt_reason)
        if self.lost_leadership is not None:
            raise NotLeader(f"leadership lost ({self.lost_leadership}); stopped relaying")

    def close(self) -> None:
        """Drop the stream and the producer (unacknowledged records are re-sent later)."""
        self._stream.close()
        left = self.delivery.close(timeout=0.5 if self._is_leader() else 0.0)
        if left:
            logger.warning("%d records were not acknowledged; they will be re-sent", left)
        if self.marker is not None:
            self.marker.stop()

    def _is_leader(self) -> bool:
        """``is_leader()``, latched: once False in this relay's life, always False."""
        if self.lost_leadership is not None:
            return False
        if self._leader_check():
            return True
        self.lost_leadership = "lease not renewed in time"
        return False

    def _start(self) -> None:
        if not self._started and self.marker is not None:
            self.marker.start()
        self._started = True

    def _interrupted(self) -> str | None:
        """Why a wait (full producer queue, catch-up) must end now, if it must."""
        delivery = self.delivery
        if delivery.halt_reason is not None:
            return "halt"
        if delivery.restart_reason is not None:
            return delivery.restart_reason
        if not self._is_leader():
            return "leadership lost"
        if self._stop_requested and self._catching_up:
            return "stop requested"  # the phase stays CATCHING_UP: redone on the next start
        if self._stop_requested:
            now = time.monotonic()
            if self._grace_deadline is None:
                self._grace_deadline = now + self.section.shutdown_grace_s
            if now >= self._grace_deadline - 1.0:
                return "stop requested: grace period over"
        return None

    # -- one streaming session -------------------------------------------------------------

    def _stream_session(self) -> None:
        delivery = self.delivery
        eos = self.eos
        if not self._is_leader():  # never hold the leader's slot, never fence its producer
            raise _Ended("leadership lost")
        delivery.new_session()
        history = self._stream.connect()
        last = None
        if eos is not None:
            try:
                last = eos.start_session(history)
            except (ConnectionError, TimeoutError) as exc:
                raise _Restart(f"reading the checkpoint topic failed: {exc}") from exc
            if not self._is_leader():
                # Frozen between the check above and init_transactions, the lease lapsed: the
                # registration may have fenced the new leader's producer (it registers again
                # on its next session; docs/exactly-once.md). Hold no slot, produce nothing.
                logger.error("leadership lost while registering the transactional id")
                raise _Ended("leadership lost")
        try:
            self._slot_watch.check()  # raises SlotChanged: the service catches up
        except DatabaseUnavailable as exc:
            raise _Restart(f"reading the slot's state failed: {exc}") from exc
        if self._new_tables is not None:  # outbox tables the slot has not streamed yet
            self._catching_up = True
            try:
                lsns = self._new_tables.catch_up(delivery, self._mappers, eos, last)
            except (CatchUpFailed, DatabaseUnavailable) as exc:
                raise _Restart(f"catching up outbox tables failed: {exc}") from exc
            finally:
                self._catching_up = False
            self._router.streamed_from(lsns)
        ledger = self._ledger
        start = self._stream.start(ledger.restart_from(history, self._kept()))
        confirmed = self._stream.slot_confirmed
        handed = self.marker.handed if self.marker is not None else 0
        tracker = ledger.start_session(history, start, confirmed=confirmed, handed=handed)
        self._session_opened = True
        if self._bookkept:
            # Parked from each FAILED event's position on: a re-stream may send again events
            # that came before it (and it), which are handled as the first time.
            delivery.parking.load_from_position(self._parked())
        self._checkpoint = checkpoint = Checkpointer(
            self._stream,
            ledger,
            self.stats,
            start=start,
            confirmed=confirmed,
            interval_s=self.section.status_interval_s,
            keep=self._keep_position,
            marker=self.marker,
        )
        delivery.idle = checkpoint.maybe_send
        self._router.new_session(tracker, checkpoint)
        self.stats.confirmed_lsn = checkpoint.sent_flush
        progress = ProgressLog(self.stats)
        while True:
            self.stats.beat()
            if delivery.halt_reason is not None:
                self._finish()
                raise _Ended("halted")
            if delivery.restart_reason is not None:
                raise _Restart(delivery.restart_reason)
            if not self._is_leader():
                logger.error("leadership lost: dropping the stream without confirming more")
                raise _Ended("leadership lost")
            if self._stop_requested:
                reason = self._interrupted()
                if tracker.open_txn is None or reason is not None:
                    self._finish()
                    return
            try:
                reading = tracker.in_flight < self.section.max_in_flight and not (
                    eos is not None and eos.batch.full()
                )
                if reading:
                    self._router.read_turn(
                        self._stream.read_raw, self._is_leader, lambda: self._stop_requested
                    )
                else:  # at the in-flight limit batches are full: linger.ms does not hold them
                    delivery.publisher.poll(0.01)
            except ProduceInterrupted:
                continue  # the checks above say why
            delivery.service()
            if eos is not None:
                # Caught up with the WAL, or not reading: nothing more joins the Kafka
                # transaction now, so it may close without waiting out the commit interval.
                idle = self._router.caught_up or not reading
                try:
                    eos.step(self._commit_interrupted, checkpoint.maybe_send, caught_up=idle)
                except ProduceInterrupted:
                    continue  # the checks above say why
            checkpoint.maybe_send()
            self.stats.in_flight = tracker.in_flight
            progress.maybe(tracker)

    # -- confirmation ------------------------------------------------------------------------

    def _commit_interrupted(self) -> str | None:
        delivery = self.delivery
        reason = delivery.halt_reason or delivery.restart_reason or self._interrupted()
        return reason or (None if self._is_leader() else "leadership lost")

    def _finish(self) -> None:
        """The shutdown sequence (:func:`~cdc_outbox.cdc.relay_finish.finish`), within the
        grace period."""
        if self._grace_deadline is None:
            self._grace_deadline = time.monotonic() + self.section.shutdown_grace_s
        finish(
            self._grace_deadline,
            stream=self._stream,
            delivery=self.delivery,
            checkpoint=self._require_checkpoint(),
            eos=self.eos,
            marker=self.marker,
            is_leader=self._is_leader,
            interrupted=self._commit_interrupted,
        )

    # -- helpers -----------------------------------------------------------------------------

    def _teardown(self, flush_s: float = 0.0) -> None:
        self._stream.close()
        if flush_s > 0:
            self.delivery.publisher.flush(flush_s)
        self.delivery.abandon()
        self.stats.in_flight = 0

    def _keep_position(self, lsn: int) -> bool:
        """Whether ``lsn`` may be confirmed: kept, or the state table cannot keep it at all."""
        return not self._ledger.keeps or self._ledger.kept(self._keep(lsn))

    def _require_checkpoint(self) -> Checkpointer:
        assert self._checkpoint is not None, "a streaming session creates the checkpointer"
        return self._checkpoint

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self._stop_requested and time.monotonic() < deadline:
            self.stats.beat()
            time.sleep(min(0.1, deadline - time.monotonic()))
