"""The polling relay: claims outbox rows by their status columns and publishes them to Kafka.

Contract (at-least-once, per-aggregate order; any number of workers on any hosts):

- Claim (:mod:`cdc_outbox.polling_sql`): rows go PENDING -> PROCESSING (``locked_by``,
  ``locked_at``). Per aggregate only the leading run of unpublished rows (by ``created_at``,
  then physical position) that are all PENDING and due, and only while no row of the aggregate
  is PROCESSING anywhere; a per-aggregate advisory lock held while claiming makes that check
  exact across workers. So an aggregate's next event is never produced while an earlier
  visible one is unpublished or in flight.
- Publish: records go out in that order (key = aggregate id, idempotent producer); rows are
  marked PUBLISHED (one UPDATE per batch) only after Kafka acknowledged them.
- Failure: a permanent per-record failure adds an attempt and sets ``available_at`` =
  now + :func:`backoff_delay`; at ``max_attempts`` the row is FAILED with ``last_error`` (the
  dead letter: it stops blocking its aggregate; ``cdc-outbox redrive`` re-queues it). A row the
  mapping rejects (bad topic, null payload, headers not an object) is FAILED at once. Later
  rows of a failing aggregate are given back unproduced. A transient failure re-queues the row
  without using an attempt. While the broker is down rows stay PROCESSING (lease renewed).
- Crash: a dead worker's rows stay PROCESSING until the lease (``lease_s`` after the last
  renewal) expires; every worker sweeps such rows back to PENDING about every ``lease_s / 2``
  (one attempt counted, so a row that keeps killing workers ends FAILED). They are sent again:
  duplicates possible, nothing lost (consumers de-duplicate by the ``id`` header).
- Order between transactions is visibility order: no cursor is kept, every PENDING row is
  found, so a transaction committing after a later-started one (commit inversion) is published
  too, after what was already visible. Equal ``created_at`` values fall back to physical
  position (insertion order unless a retry moved the row).
- Residual: a permanent rejection the broker reports asynchronously does not stop later records
  of the same aggregate already produced in that batch.
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import socket
import time
from typing import Any

import psycopg

from cdc_outbox import polling_sql
from cdc_outbox.config import Settings
from cdc_outbox.errors import ConfigError
from cdc_outbox.kafka_publisher import DeliveryFailure, Headers, KafkaPublisher, QueueFull
from cdc_outbox.outbox_mapping import DeadLetter, OutboxMapper, OutboxRecord
from cdc_outbox.relay_stats import RelayStats

logger = logging.getLogger(__name__)

# Row outcomes.
_OK, _FAIL, _DEAD, _RETRY, _BACK = "ok", "fail", "dead", "retry", "back"


def backoff_delay(failures: int, base: float, cap: float, rand: float) -> float:
    """Seconds before attempt ``failures + 1``: ``min(cap, base * 2**(failures-1))`` scaled by
    a jitter factor in [0.5, 1.0] (``rand`` in [0, 1))."""
    exponent = min(max(failures - 1, 0), 60)
    return min(cap, base * 2.0**exponent) * (0.5 + 0.5 * rand)


def default_worker_id() -> str:
    """``host:pid:random`` (unique per worker instance; stored in ``locked_by``)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class _Row:
    """One claimed row, and the delivery listener of its record."""

    def __init__(self, relay: PollingRelay, values: tuple[Any, ...]) -> None:
        (
            self.rank,
            self.id,
            self.id_text,
            self.agg_type,
            self.aggregate_id,
            self.event_type,
            self.payload,
            self.headers,
            self.attempts,
            self.created_unix,
        ) = values
        self.relay = relay
        self.outcome: str | None = None
        self.error: str | None = None
        self.topic = ""

    def delivered(self, topic: str, headers: Headers) -> None:
        if self.outcome is None:
            self.outcome = _OK
            self.relay._settled(self, topic)

    def failed(self, failure: DeliveryFailure) -> None:
        if self.outcome is None:
            self.outcome = _FAIL if failure.permanent and not failure.fatal else _RETRY
            self.error = f"{failure.name}: {failure.reason}"
            self.relay._settled(self, "")


class PollingRelay:
    """A polling worker over the outbox table; see the module contract."""

    def __init__(
        self, settings: Settings, stats: RelayStats | None = None, worker_id: str | None = None
    ) -> None:
        if settings.columns.preset != "default":
            raise ConfigError(
                "config: polling mode needs the status columns of the default column preset"
                f" (status, attempts, available_at, ...); the {settings.columns.preset} preset"
                ' has none: use mode = "cdc" or columns.preset = "default"'
            )
        self.settings = settings
        self.stats = stats if stats is not None else RelayStats(mode="polling")
        self.stats.mode = "polling"
        self.worker_id = worker_id or default_worker_id()
        cols = settings.column_names()
        self._sql = polling_sql.build(settings)
        self._ns = polling_sql.advisory_namespace(settings.outbox_schema, settings.outbox_table)
        self._mapper = OutboxMapper(
            settings.outbox_schema, settings.outbox_table, cols, settings.topic_template
        )
        self._with_headers = cols.headers is not None
        self._conn: psycopg.Connection[Any] | None = None
        self._publisher: KafkaPublisher | None = None
        self._stop = False
        self._more = False
        self._outstanding = 0
        self._failed_aggs: set[str] = set()
        self._unmarked: list[_Row] = []
        self._next_sweep = 0.0
        self._rng = random.Random()

    # -- lifecycle -------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Finish the in-flight batch (acks awaited up to ``shutdown_grace_s``), then return."""
        self._stop = True

    def run(self) -> None:
        """Claim and publish until :meth:`request_stop`; database and Kafka trouble is waited
        out with backoff (0.5 s doubling to 30 s), never raised."""
        polling = self.settings.polling
        backoff = 0.5
        try:
            while not self._stop:
                try:
                    self.run_once()
                    backoff = 0.5
                except (psycopg.Error, OSError) as exc:
                    self.stats.restarts += 1
                    logger.warning("polling relay: %s; retrying in %.1fs", exc, backoff)
                    self._close_connection()
                    self._sleep(backoff)
                    backoff = min(backoff * 2, 30.0)
                    continue
                if not self._more:
                    self._sleep(polling.poll_interval_s)
        finally:
            self.close()

    def run_once(self) -> int:
        """Sweep if due, claim one batch, publish it, record the outcomes; returns rows claimed.

        Raises ``psycopg.Error`` on database trouble; outcomes not yet written are kept and
        written first by the next call."""
        conn = self._connect()
        if self._unmarked:
            self._write_outcomes(conn, self._unmarked)
        if time.monotonic() >= self._next_sweep:
            self.sweep()
        rows = self._claim(conn)
        if rows:
            self._publish(rows)
            self._write_outcomes(self._connect(), rows)
        return len(rows)

    def sweep(self) -> int:
        """Return PROCESSING rows whose lease expired to PENDING (FAILED at max attempts)."""
        polling = self.settings.polling
        self._next_sweep = time.monotonic() + polling.lease_s / 2
        cur = self._connect().execute(
            self._sql.sweep, {"max": polling.max_attempts, "lease": polling.lease_s}
        )
        statuses = [r[0] for r in cur.fetchall()]
        if statuses:
            logger.warning(
                "swept %d rows with an expired lease (%d now FAILED)",
                len(statuses),
                statuses.count("FAILED"),
            )
        return len(statuses)

    def close(self) -> None:
        """Drop the producer (unacknowledged records are purged) and the connection."""
        if self._publisher is not None:
            left = self._publisher.close(timeout=0.5)
            if left:
                logger.warning("%d records were not acknowledged; they will be re-sent", left)
            self._publisher = None
        self._close_connection()

    # -- claim -------------------------------------------------------------------------------

    def _claim(self, conn: psycopg.Connection[Any]) -> list[_Row]:
        batch = self.settings.polling.batch_size
        max_aggs = min(batch, polling_sql.MAX_AGGREGATES_PER_CLAIM)
        with conn.transaction():
            params = {"scan": max(4 * batch, 100), "max_aggs": max_aggs, "ns": self._ns}
            aggs = [r[0] for r in conn.execute(self._sql.lock_aggregates, params)]
            if not aggs:
                self._more = False
                return []
            cur = conn.execute(
                self._sql.claim, {"aggs": aggs, "limit": batch, "me": self.worker_id}
            )
            rows, back = polling_sql.gap_free([_Row(self, v) for v in cur.fetchall()])
            if back:
                conn.execute(self._sql.unclaim, {"ids": [r.id for r in back], "me": self.worker_id})
        self._more = len(rows) >= batch or len(aggs) >= max_aggs
        rows.sort(key=lambda r: (r.created_unix, r.aggregate_id, r.rank))
        return rows

    # -- publish -----------------------------------------------------------------------------

    def _publish(self, rows: list[_Row]) -> None:
        """Produce the rows in order and wait for every outcome (or the shutdown grace)."""
        publisher = self._require_publisher()
        self._failed_aggs = set()
        self._outstanding = 0
        for row in rows:
            if row.aggregate_id in self._failed_aggs:
                row.outcome = _BACK  # an earlier row of its aggregate failed: keep the order
                continue
            values = [row.id_text, row.agg_type, row.aggregate_id, row.event_type, row.payload]
            if self._with_headers:
                values.append(row.headers)
            record = self._mapper.map_row(values)
            if isinstance(record, DeadLetter):
                row.outcome, row.error = _DEAD, f"cannot be published: {record.reason}"
                row.topic = record.intended_topic or ""
                self._failed_aggs.add(row.aggregate_id)
                logger.warning("event %s: %s", row.id_text, row.error)
                continue
            row.topic = record.topic
            self._outstanding += 1
            self._produce(publisher, record, row)
        self._await(rows, publisher)
        if publisher.fatal_error:
            logger.warning("new Kafka producer after a fatal error: %s", publisher.fatal_error)
            publisher.close(timeout=0)
            self._publisher = None

    def _produce(self, publisher: KafkaPublisher, record: OutboxRecord, row: _Row) -> None:
        while True:
            try:
                publisher.produce(record.topic, record.key, record.value, record.headers, row)
                return
            except QueueFull:
                publisher.poll(0.05)
            except Exception as exc:  # a transient error raised by produce (KafkaException)
                row.outcome, row.error = _RETRY, f"produce failed: {exc}"
                self._settled(row, "")
                return

    def _settled(self, row: _Row, topic: str) -> None:
        """A row's outcome is known (called from delivery reports, on this thread)."""
        self._outstanding -= 1
        if row.outcome == _OK:
            self.stats.count_published(topic)
            if self.stats.latency_observers:
                self.stats.observe_latency(time.time() - row.created_unix, 1)
            return
        self.stats.delivery_errors += 1
        self._failed_aggs.add(row.aggregate_id)
        logger.warning("event %s not delivered: %s", row.id_text, row.error)

    def _await(self, rows: list[_Row], publisher: KafkaPublisher) -> None:
        lease = self.settings.polling.lease_s
        last_renew = time.monotonic()
        deadline: float | None = None
        while self._outstanding > 0:
            self.stats.in_flight = self._outstanding
            publisher.poll(0.05)
            now = time.monotonic()
            if self._stop and deadline is None:
                deadline = now + self.settings.shutdown_grace_s
            if deadline is not None and now >= deadline:
                logger.warning("stopping with %d records unacknowledged", self._outstanding)
                break
            if now - last_renew >= lease / 3:
                last_renew = now
                self._renew([r for r in rows if r.outcome is None])
        self.stats.in_flight = 0
        for row in rows:
            if row.outcome is None:
                row.outcome = _BACK

    def _renew(self, rows: list[_Row]) -> None:
        """Extend the lease of rows still waiting for Kafka (best effort)."""
        try:
            cur = self._connect().execute(
                self._sql.renew, {"ids": [r.id for r in rows], "me": self.worker_id}
            )
        except psycopg.Error as exc:
            logger.warning("could not renew the lease of %d rows: %s", len(rows), exc)
            self._close_connection()
            return
        if cur.rowcount < len(rows):
            logger.warning("lease lost for %d rows (swept by a worker)", len(rows) - cur.rowcount)

    # -- outcomes ----------------------------------------------------------------------------

    def _write_outcomes(self, conn: psycopg.Connection[Any], rows: list[_Row]) -> None:
        """Mark acknowledged rows PUBLISHED, the others by outcome, in one transaction."""
        self._unmarked = rows
        published = [r.id for r in rows if r.outcome == _OK]
        others = [r for r in rows if r.outcome != _OK]
        marked = 0
        failed_ids: set[Any] = set()
        with conn.transaction():
            if published:
                cur = conn.execute(
                    self._sql.mark_published, {"ids": published, "me": self.worker_id}
                )
                marked = cur.rowcount
            if others:
                cur = conn.execute(self._sql.mark_outcomes, self._outcome_params(others))
                failed_ids = {row_id for row_id, status in cur if status == "FAILED"}
        self._unmarked = []
        if marked < len(published):
            logger.warning("lease lost for %d published rows", len(published) - marked)
        for row in others:
            if row.id in failed_ids:
                self.stats.count_dead_lettered(row.topic)
                logger.error("event %s FAILED (dead letter): %s", row.id_text, row.error)

    def _outcome_params(self, rows: list[_Row]) -> dict[str, Any]:
        """Parameters of ``mark_outcomes``: attempts, backoff and error per row."""
        polling = self.settings.polling
        bumps, delays = [], []
        for r in rows:
            bumps.append(1 if r.outcome in (_FAIL, _DEAD) else 0)
            delay = None
            if r.outcome in (_FAIL, _RETRY):
                failures = r.attempts + 1 if r.outcome == _FAIL else 1
                delay = backoff_delay(
                    failures, polling.backoff_base_s, polling.backoff_max_s, self._rng.random()
                )
            delays.append(delay)
        return {
            "ids": [r.id for r in rows],
            "bumps": bumps,
            "delays": delays,
            "errors": [r.error for r in rows],
            "finals": [r.outcome == _DEAD for r in rows],
            "max": polling.max_attempts,
            "me": self.worker_id,
        }

    # -- helpers -----------------------------------------------------------------------------

    def _connect(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.settings.postgres_dsn(), autocommit=True)
        return self._conn

    def _close_connection(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

    def _require_publisher(self) -> KafkaPublisher:
        if self._publisher is None:
            self._publisher = KafkaPublisher(self.settings.kafka_config())
        return self._publisher

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self._stop and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(0.05, left))
