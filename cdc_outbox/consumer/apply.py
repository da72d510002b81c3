"""How the records of one poll reach PostgreSQL: the fast path and the slow path.

* :meth:`Applier.fast`: the records in ONE transaction. The ``processed_events`` rows of
  the whole batch are inserted by one statement (:meth:`ConsumerStore.mark_batch
  <cdc_outbox.store.processed_events.ConsumerStore.mark_batch>`: a plain ``INSERT ... SELECT
  unnest(ids)``; only after a duplicate ``ON CONFLICT DO NOTHING RETURNING event_id``), the
  handler runs for the new ids only, in record order, then ``COMMIT``: two round trips per
  batch (``BEGIN`` pipelined with the INSERT, then ``COMMIT``) when no handler raises and
  nothing is dead-lettered. The common record (no parked key, no span wanted, no duplicate
  in the batch) is handled inline, without the per-record helper calls.
  Between two handlers, once at least 1 ms has passed since the last check, the
  connection's socket is checked (no round trip): a connection the server closed stops the
  batch instead of running the rest of its handlers in a transaction that cannot commit.
* :meth:`Applier.one`: one record in a transaction of its own, retried with doubling backoff
  when its handler or its COMMIT fails, up to ``max_attempts`` attempts counting the one its
  batch made, then dead-lettered and its key parked. Used only for records the fast path
  could not finish (see :mod:`cdc_outbox.consumer.loop`), so an error raised at COMMIT (a
  deferred constraint, a serialization failure) is attributed to the record that caused it.

Errors: :class:`HandlerFailed` (the fast path's handler of record ``index`` raised),
:class:`CommitFailed` (the fast path's COMMIT failed, the server rolled it back),
:data:`INFRA_ERRORS` for trouble that is not the records' fault (retried, never dead-letters),
and :class:`HandlerAborted` (the handler raised a ``BaseException`` such as ``SystemExit``:
rolled back, never retried, the consumer stops; ``KeyboardInterrupt`` is re-raised as is).
"""

from __future__ import annotations

import contextlib
import logging
import select
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import pq
from psycopg_pool import ConnectionPool, PoolTimeout

from cdc_outbox.consumer.event_types import DecodeUnavailable, Event
from cdc_outbox.consumer.metrics import PROCESSED, ConsumerMetrics
from cdc_outbox.consumer.settings import ConsumerSettings
from cdc_outbox.errors import CdcOutboxError
from cdc_outbox.kafka.consumer import DeadLetterError, DeadLetterSender, RawRecord
from cdc_outbox.store.processed_events import ConsumerStore
from cdc_outbox.telemetry.tracing import handler_span, handler_span_wanted, tracer_provider_set

logger = logging.getLogger("cdc_outbox.consumer.loop")

__all__ = [
    "INFRA_ERRORS",
    "PROCESSED",
    "Applier",
    "CommitFailed",
    "HandlerAborted",
    "HandlerFailed",
    "Item",
    "Outcome",
]

#: Not the records' fault: the batch (from the first unfinished record) is redone later.
INFRA_ERRORS = (psycopg.OperationalError, PoolTimeout, DeadLetterError, DecodeUnavailable)
#: A record and its event, or the reason it can never be handled (dead-lettered at once).
Item = tuple[RawRecord, Event | str]
#: (outcome, reason): "processed", "duplicate" or "dead_lettered" (metrics.OUTCOMES).
Outcome = tuple[str, str]
Parked = dict[tuple[str, str], str]
#: Handler time after which the fast path checks its connection before the next handler.
_LOST_CHECK_S = 0.001


class HandlerFailed(Exception):
    """The handler of item ``index`` raised (the cause); the transaction was rolled back."""

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.index = index


class CommitFailed(Exception):
    """The COMMIT of the first ``count`` items failed (the cause) and rolled them back."""

    def __init__(self, count: int) -> None:
        super().__init__(count)
        self.count = count


class HandlerAborted(CdcOutboxError):
    """The handler raised a ``BaseException`` that is not an ``Exception`` nor a stop request
    (``KeyboardInterrupt``, re-raised as is), e.g. ``SystemExit``: the consumer stops (exit
    code 1), its transaction rolled back, the event's offset not stored."""

    def __init__(self, exc: BaseException, event: Event) -> None:
        super().__init__(
            f"consumer: the handler raised {exc!r} on {event.topic}[{event.partition}]"
            f"@{event.offset} (event {event.event_id}); stopped without committing that"
            " event (the next run reads it again)"
        )


def _aborted(exc: BaseException, event: Event) -> BaseException:
    """What a handler's ``BaseException`` (not an ``Exception``) is re-raised as."""
    return exc if isinstance(exc, KeyboardInterrupt) else HandlerAborted(exc, event)


class ConnectionLost(psycopg.OperationalError):
    """The server closed the connection while the batch's handlers ran."""


class Applier:
    """Applies items with ``handler`` for one consumer. ``parked`` (shared with the loop) is
    the persisted parked keys; a transaction's new ones join it only once it committed."""

    def __init__(
        self,
        settings: ConsumerSettings,
        pool: ConnectionPool[Any],
        handler: Any,
        store: ConsumerStore,
        dead_letters: DeadLetterSender,
        parked: Parked,
        stop: threading.Event,
        metrics: ConsumerMetrics,
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.handler = handler
        self.store = store
        self.dead_letters = dead_letters
        self.parked = parked
        self.stop = stop
        self.metrics = metrics
        self._tracing = False  # tracer_provider_set(), asked once per transaction

    # -- the fast path ---------------------------------------------------------------------
    def fast(self, items: Sequence[Item]) -> tuple[list[Outcome], Exception | None]:
        """Apply a prefix of ``items`` in one transaction; its outcomes (one per item done,
        committed) and the infrastructure error that ended it early with the connection
        intact (a dead letter not acknowledged: the prefix before it is committed).
        Raises :class:`HandlerFailed`, :class:`CommitFailed` or :data:`INFRA_ERRORS`."""
        outcomes: list[Outcome] = []
        parked: Parked = {}
        trouble: Exception | None = None
        self._tracing = tracer_provider_set()
        with self.pool.connection() as conn:
            try:
                new: set[uuid.UUID] | None = None  # None: every id is new (and distinct)
                done: set[uuid.UUID] = set()
                if self.settings.dedupe:
                    new = self.store.mark_batch(conn, _ids(items))
                checked = time.monotonic()
                stopping, handler, tracing = self.stop.is_set, self.handler, self._tracing
                try:
                    for index, (record, event) in enumerate(items):
                        if stopping():
                            break
                        if index and (now := time.monotonic()) - checked >= _LOST_CHECK_S:
                            if _lost(conn):
                                raise ConnectionLost("the server closed the connection mid-batch")
                            checked = now
                        if (  # the common case, inline: what _fast_one would do for it
                            new is None
                            and type(event) is Event
                            and not (parked or self.parked)
                            and not handler_span_wanted(event.headers, tracing)
                        ):
                            try:
                                handler(conn, event)
                            except Exception as exc:
                                if isinstance(exc, INFRA_ERRORS) and conn.broken:
                                    raise
                                raise HandlerFailed(index) from exc
                            except BaseException as exc:
                                raise _aborted(exc, event) from exc
                            outcomes.append(PROCESSED)
                            continue
                        outcomes.append(
                            self._fast_one(conn, index, record, event, new, done, parked)
                        )
                except DeadLetterError as exc:
                    trouble = exc
                if self.settings.dedupe and len(outcomes) < len(items):
                    rest = items[len(outcomes) :]
                    unfinished = [i for i in _ids(rest)
                                  if new is None or (i in new and i not in done)]  # fmt: skip
                    self.store.unmark(conn, unfinished)
            except BaseException:
                _rollback(conn)
                raise
            _commit(conn, len(outcomes))
        self.parked.update(parked)
        return outcomes, trouble

    def _fast_one(
        self,
        conn: psycopg.Connection[Any],
        index: int,
        record: RawRecord,
        event: Event | str,
        new: set[uuid.UUID] | None,
        done: set[uuid.UUID],
        parked: Parked,
    ) -> Outcome:
        if isinstance(event, str):
            return self._give_up(conn, record, None, event, parked)
        if new is not None:  # de-duplicating, and the batch had a duplicate
            if event.event_id not in new or event.event_id in done:
                return "duplicate", ""
            done.add(event.event_id)  # a repeat later in this batch is a duplicate
        blocker = self._blocker(record, parked)
        if blocker is not None:
            return self._dead_letter(record, f"blocked_by {blocker}")
        try:
            self._handle(conn, event)
        except Exception as exc:
            if isinstance(exc, INFRA_ERRORS) and conn.broken:
                raise
            raise HandlerFailed(index) from exc
        except BaseException as exc:
            raise _aborted(exc, event) from exc
        return PROCESSED

    def _handle(self, conn: psycopg.Connection[Any], event: Event) -> None:
        """The handler, in a span continuing the record's trace (cdc_outbox.telemetry.tracing), when
        a span would change anything (:func:`~cdc_outbox.telemetry.tracing.handler_span_wanted`;
        whether a tracer provider is set is asked once per transaction)."""
        if not handler_span_wanted(event.headers, self._tracing):
            self.handler(conn, event)
            return
        attributes = {
            "messaging.system": "kafka",
            "messaging.operation.type": "process",
            "messaging.destination.name": event.topic,
            "messaging.destination.partition.id": str(event.partition),
            "messaging.kafka.offset": event.offset,
            "messaging.message.id": str(event.event_id),
        }
        with handler_span(event.headers.items(), event.topic, attributes):
            self.handler(conn, event)

    # -- the slow path ---------------------------------------------------------------------
    def one(
        self, item: Item, *, tried: int = 0, failure: HandlerFailed | CommitFailed | None = None
    ) -> tuple[Outcome, bool] | None:
        """Finish ``item`` in transactions of its own: (its outcome, whether an attempt made
        here failed); None when stopping first (an unfinished retry is abandoned). ``tried``:
        its attempts already made in a batch, ``failure`` the last one's error when it was
        this record's (the backoff after it is then waited here first). At most
        ``max_attempts`` attempts in all, ``doubling`` backoff after each failed one.
        Raises :data:`INFRA_ERRORS`."""
        record, event = item
        if isinstance(event, str):
            return self._give_up_alone(record, None, event), True
        s = self.settings
        attempt = tried
        while True:
            if failure is not None:
                cause = failure.__cause__
                what = "handler" if isinstance(failure, HandlerFailed) else "commit"
                why = (f"{what} failed after {attempt} attempt(s):"
                       f" {type(cause).__name__}: {cause}")  # fmt: skip
                extra = {"event_id": event.event_id}
                if attempt >= s.max_attempts:
                    logger.error("%s; dead-lettering", why, extra=extra)
                    return self._give_up_alone(record, event, why), True
                self.metrics.retried()
                logger.warning("%s; retrying", why, extra=extra)
                if self.stop.wait(s.retry_backoff.delay(attempt)):
                    return None
            try:
                with self.pool.connection() as conn:
                    outcome = self._attempt(conn, record, event)
                return outcome, attempt > tried
            except (HandlerFailed, CommitFailed) as exc:
                attempt += 1
                failure = exc

    def _attempt(self, conn: psycopg.Connection[Any], record: RawRecord, event: Event) -> Outcome:
        self._tracing = tracer_provider_set()
        try:
            if self.settings.dedupe and not self.store.mark_processed(conn, event.event_id):
                outcome: Outcome = "duplicate", ""
            elif (blocker := self._blocker(record, {})) is not None:
                outcome = self._dead_letter(record, f"blocked_by {blocker}")
            else:
                try:
                    self._handle(conn, event)
                except Exception as exc:
                    if isinstance(exc, INFRA_ERRORS) and conn.broken:
                        raise
                    raise HandlerFailed(0) from exc
                except BaseException as exc:
                    raise _aborted(exc, event) from exc
                outcome = "processed", ""
        except BaseException:
            _rollback(conn)
            raise
        _commit(conn, 1)
        return outcome

    def _give_up_alone(self, record: RawRecord, event: Event | None, reason: str) -> Outcome:
        parked: Parked = {}
        with self.pool.connection() as conn, conn.transaction():
            outcome = self._give_up(conn, record, event, reason, parked)
        self.parked.update(parked)
        return outcome

    # -- dead letters ----------------------------------------------------------------------
    def _blocker(self, record: RawRecord, parked: Parked) -> str | None:
        if record.key is None or not (parked or self.parked):
            return None
        key = (record.topic, record.key.decode(errors="replace"))
        return parked.get(key) or self.parked.get(key)

    def _give_up(
        self,
        conn: psycopg.Connection[Any],
        record: RawRecord,
        event: Event | None,
        reason: str,
        parked: Parked,
    ) -> Outcome:
        """Dead-letter ``record`` (acknowledged by Kafka) and park its key, on ``conn``."""
        key = None if record.key is None else record.key.decode(errors="replace")
        if (
            event is not None
            and self.settings.dedupe
            and not self.store.mark_processed(conn, event.event_id)
        ):
            return "duplicate", ""
        blocker = self._blocker(record, parked)
        if blocker is not None:
            reason = f"blocked_by {blocker}"
        self._dead_letter(record, reason)
        if key is not None and blocker is None:
            event_id = event.event_id if event else None
            self.store.park(conn, record.topic, key, event_id, reason)
            parked[(record.topic, key)] = str(event_id) if event_id else "unknown"
        return "dead_lettered", reason

    def _dead_letter(self, record: RawRecord, reason: str) -> Outcome:
        headers: list[tuple[str, str | bytes | None]] = list(record.headers)
        headers += [
            ("cdc_outbox.error", reason.encode()),
            ("cdc_outbox.consumer", self.settings.consumer_name.encode()),
            ("cdc_outbox.original_topic", record.topic.encode()),
            ("cdc_outbox.original_partition", str(record.partition).encode()),
            ("cdc_outbox.original_offset", str(record.offset).encode()),
        ]
        topic = self.settings.dead_letter_topic
        self.dead_letters.send(topic, record.key, record.value, headers)
        logger.warning("dead-lettered %s[%d]@%d: %s", record.topic, record.partition,
                       record.offset, reason)  # fmt: skip
        return "dead_lettered", reason


def _ids(items: Sequence[Item]) -> list[uuid.UUID]:
    return [e.event_id for _r, e in items if isinstance(e, Event)]


def _commit(conn: psycopg.Connection[Any], count: int) -> None:
    """COMMIT; :class:`CommitFailed` (``count`` items rolled back) unless the connection is
    gone (then the error itself: infrastructure, the outcome is unknown)."""
    try:
        conn.commit()
    except psycopg.Error as exc:
        if conn.broken:
            raise
        raise CommitFailed(count) from exc


def _rollback(conn: psycopg.Connection[Any]) -> None:
    if not conn.broken:
        with contextlib.suppress(psycopg.Error):
            conn.rollback()


def _lost(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server closed ``conn``, found without a round trip. Between statements of
    an open transaction the server sends nothing unasked but a FATAL message before it
    closes the connection (notifications wait for the transaction's end): so data waiting on
    the socket is read, and then the end of the stream is waited for (up to 1 s, which only
    a connection the server is closing ever spends)."""
    pgconn = conn.pgconn
    wait = 0.0
    try:
        for _ in range(4):
            if pgconn.status == pq.ConnStatus.BAD:
                return True
            readable, _w, _x = select.select([pgconn.socket], [], [], wait)
            if not readable:
                return False
            pgconn.consume_input()
            wait = 1.0
    except (OSError, psycopg.OperationalError):
        return True
    return bool(pgconn.status == pq.ConnStatus.BAD)
