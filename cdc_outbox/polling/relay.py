"""The polling relay: claims outbox rows by their status columns and publishes them to Kafka.

Contract (at-least-once, per-aggregate order per table):

- Every configured outbox table with status columns is polled (a table without them cannot
  be). Each table has its own worker (claim statements, advisory-lock namespace, mapping,
  delivery and parking: an aggregate id in two tables is two independent sequences); one
  pass claims from every table in turn, each up to its share of ``batch_size``, so a table
  with a big backlog never starves a small one.
- Claim (:mod:`cdc_outbox.store.polling_sql`): rows go PENDING -> PROCESSING (``locked_by``,
  ``locked_at``). Per aggregate only the leading run of unpublished rows (by ``created_at``,
  then physical position) that are all PENDING and due, and only while no row of the aggregate
  is PROCESSING anywhere; a per-aggregate advisory lock held while claiming makes that check
  exact across workers. So an aggregate's next event is never produced while an earlier
  visible one is unpublished or in flight.
- Publish through the one :class:`~cdc_outbox.delivery.engine.Delivery` policy, in that order; rows
  are marked PUBLISHED (one UPDATE per batch) only after Kafka acknowledged them.
- Failure, as in every mode: a record-level rejection (or a row the mapping rejects) is
  dead-lettered on ``dead_letter_topic`` and its row marked FAILED with the reason; the later
  rows of that aggregate are parked (dead-lettered ``blocked_by <id>``, FAILED) until
  ``cdc-outbox redrive``. Aggregates with a FAILED row are parked from the table at each
  claim. With ``on_permanent_error = "halt"`` the relay stops instead. A retried failure
  (not authorised, broker trouble) re-queues the row after a backoff that doubles per retry
  of that row, from ``backoff_base_s`` up to ``backoff_max_s``
  (:mod:`~cdc_outbox.polling.outcomes`), without using an attempt; the later rows of its
  aggregate are not sent before it, whatever their topic (:mod:`~cdc_outbox.polling.waves`).
  While the broker is down rows stay PROCESSING (lease renewed).
- Crash: a dead worker's rows stay PROCESSING until the lease (``lease_s`` after the last
  renewal) expires; every worker sweeps such rows back to PENDING about every ``lease_s / 2``
  (one attempt counted, so a row that keeps killing workers ends FAILED at ``max_attempts``).
  The elected leader sweeps every PROCESSING row of other workers when it starts. They are
  sent again: duplicates possible, nothing lost (consumers de-duplicate by the ``id`` header).
- Order between transactions is visibility order: no cursor is kept, every PENDING row is
  found, so a transaction committing after a later-started one (commit inversion) is published
  too, after what was already visible. Equal ``created_at`` values fall back to physical
  position (insertion order unless a retry moved the row).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any

import psycopg

from cdc_outbox.config.backoff import RECONNECT, Backoff
from cdc_outbox.config.delivery import delivery_section
from cdc_outbox.config.settings import OutboxSettings, Settings
from cdc_outbox.delivery.engine import Delivery
from cdc_outbox.errors import ConfigError, RelayHalted, raise_if_cannot_heal
from cdc_outbox.kafka.publisher import ProduceInterrupted
from cdc_outbox.mapping.build import outbox_mapper
from cdc_outbox.polling.outcomes import BACK, DEAD, OK, RetryCounts, outcome_params
from cdc_outbox.polling.rows import _Row, batch_shares, default_worker_id
from cdc_outbox.polling.waves import held_back, next_wave
from cdc_outbox.records import DeadLetter, OutboxRecord
from cdc_outbox.store import db_pool, polling_sql
from cdc_outbox.store.failed_rows import failed_rows_of, parked_aggregates
from cdc_outbox.store.relay_state import NotLeader
from cdc_outbox.telemetry.relay_stats import RelayStats

logger = logging.getLogger(__name__)


class PollingRelay:
    """A polling worker over every outbox table with status columns (see the module
    contract): it serves the first itself and one sibling worker per other table (``outbox``
    given: a worker of that one table only, claiming up to ``batch_size`` rows per pass)."""

    def __init__(
        self,
        settings: Settings,
        stats: RelayStats | None = None,
        worker_id: str | None = None,
        *,
        is_leader: Callable[[], bool] | None = None,
        outbox: OutboxSettings | None = None,
        batch_size: int | None = None,
    ) -> None:
        tables = [o for o in settings.outbox_settings() if o.columns.has_status]
        o = outbox or (tables[0] if tables else settings.outbox())
        if not o.columns.has_status:
            raise ConfigError(
                "config: polling mode needs the status columns of the default column preset"
                f" (status, attempts, available_at, ...); {o.name} (the {o.columns.preset}"
                ' preset) has none: use mode = "cdc" or columns.preset = "default"'
            )
        shares = batch_shares(settings.polling.batch_size, len(tables))
        siblings = list(zip(tables[1:], shares[1:], strict=True)) if outbox is None else []
        self.outbox = o
        self.settings = settings
        #: ``settings`` narrowed to this table, for the store helpers of "the" outbox table.
        self._own = settings.model_copy(update={"outboxes": [self.outbox]})
        self._batch = batch_size or (shares[0] if outbox is None else settings.polling.batch_size)
        self.stats = stats if stats is not None else RelayStats(mode="polling")
        self.stats.mode = "polling"
        self.worker_id = worker_id or default_worker_id()
        self._is_leader = is_leader
        self._sql = polling_sql.build(settings, self.outbox)
        self._ns = polling_sql.advisory_namespace(self.outbox.schema_name, self.outbox.table)
        self._mapper = outbox_mapper(settings, self.outbox)
        self._with_headers = settings.column_names(self.outbox).headers is not None
        self._with_tracing = settings.column_names(self.outbox).tracing_span_context is not None
        self._siblings = [
            PollingRelay(settings, self.stats, self.worker_id, is_leader=is_leader,
                         outbox=o, batch_size=n)
            for o, n in siblings
        ]  # fmt: skip
        self._conn: psycopg.Connection[Any] | None = None
        self._delivery: Delivery | None = None
        self._stop = False
        self._deadline: float | None = None
        self._more = False
        self._outstanding = 0
        self._unmarked: list[_Row] = []
        self._next_sweep = 0.0
        self._rng = random.Random()
        self._retries = RetryCounts()

    # -- lifecycle -------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Finish the in-flight batch (acks awaited up to ``shutdown_grace_s``), then return."""
        self._stop = True
        for sibling in self._siblings:
            sibling.request_stop()

    def run(self) -> None:
        """Claim and publish until :meth:`request_stop`, one pass over every table at a time;
        database and Kafka trouble is waited out with backoff (``backoff.RECONNECT``), never
        raised. Raises ``RelayHalted`` (halt policy) and ``NotLeader`` (an elected relay that
        lost its lease)."""
        polling = self.settings.polling
        backoff = Backoff(RECONNECT)
        workers = [self, *self._siblings]
        swept_all = self._is_leader is None  # a leader first takes over every lease
        try:
            while not self._stop:
                self.stats.beat()
                try:
                    if not swept_all:
                        for worker in workers:
                            worker.sweep(everything=True)
                        swept_all = True
                    self.run_once()
                    backoff.reset()
                except (psycopg.Error, OSError) as exc:
                    raise_if_cannot_heal(exc)
                    self.stats.restarts += 1
                    delay = backoff.failed()
                    logger.warning("polling relay: %s; retrying in %.1fs", exc, delay)
                    for worker in workers:
                        worker._close_connection()
                    self._sleep(delay)
                    continue
                deliveries = [worker._require_delivery() for worker in workers]
                for delivery in deliveries:
                    if delivery.halt_reason is not None:
                        raise RelayHalted(delivery.halt_reason)
                if self._lost_lead():
                    raise NotLeader("leadership lost; stopped polling")
                restarting = [d for d in deliveries if d.restart_reason is not None]
                for delivery in restarting:
                    delivery.abandon()
                if restarting:
                    self._sleep(backoff.failed())
                elif not any(worker._more for worker in workers):
                    self._sleep(polling.poll_interval_s)
        finally:
            self.close()

    def run_once(self) -> int:
        """One pass: for each table in turn, sweep if due, claim up to its share, publish it,
        record the outcomes; returns rows claimed.

        Raises ``psycopg.Error`` on database trouble; outcomes not yet written are kept and
        written first by the next call."""
        claimed = self._run_table_once()
        for sibling in self._siblings:
            if self._stop:
                break
            claimed += sibling._run_table_once()
        return claimed

    def _run_table_once(self) -> int:
        conn = self._connect()
        if self._unmarked:
            self._write_outcomes(conn, self._unmarked)
        if time.monotonic() >= self._next_sweep:
            self.sweep()
        rows = self._claim(conn)
        if rows:
            delivery = self._require_delivery()
            aggregates = sorted({r.aggregate_id for r in rows})
            delivery.parking.load(parked_aggregates(conn, self._own, aggregates))
            self._publish(rows)
            self._write_outcomes(self._connect(), rows)
        return len(rows)

    def sweep(self, *, everything: bool = False) -> int:
        """Return PROCESSING rows whose lease expired (``everything``: all rows of other
        workers) to PENDING, FAILED at max attempts."""
        polling = self.settings.polling
        self._next_sweep = time.monotonic() + polling.lease_s / 2
        cur = self._connect().execute(
            self._sql.sweep,
            {
                "max": polling.max_attempts,
                "lease": -1.0 if everything else polling.lease_s,
                "me": self.worker_id,
            },
        )
        statuses = [r[0] for r in cur.fetchall()]
        if statuses:
            logger.warning(
                "%s: swept %d rows with an expired lease (%d now FAILED)",
                self.outbox.name,
                len(statuses),
                statuses.count("FAILED"),
            )
        return len(statuses)

    def close(self) -> None:
        """Drop the producers (unacknowledged records are purged) and the connections."""
        for sibling in self._siblings:
            sibling.close()
        if self._delivery is not None:
            left = self._delivery.close(timeout=0.0 if self._lost_lead() else 0.5)
            if left:
                logger.warning("%d records were not acknowledged; they will be re-sent", left)
            self._delivery = None
        self._close_connection()

    # -- claim -------------------------------------------------------------------------------

    def _claim(self, conn: psycopg.Connection[Any]) -> list[_Row]:
        batch = self._batch
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
        """Submit the rows in order, in waves (:mod:`cdc_outbox.polling.waves`: no row goes
        before an earlier row of its aggregate on another topic is published), and wait for
        every outcome (or the shutdown grace); rows not sent are given back."""
        delivery = self._require_delivery()
        items: list[tuple[_Row, str | None]] = []
        results: dict[int, OutboxRecord | DeadLetter] = {}
        for row in rows:
            values = [row.id_text, row.agg_type, row.aggregate_id, row.event_type, row.payload]
            if self._with_headers:
                values.append(row.headers)
            if self._with_tracing:
                values.append(row.tracing)
            values.extend(row.extra)
            result = self._mapper.map_row(values)
            results[id(row)] = result
            items.append((row, result.topic if type(result) is OutboxRecord else None))
        try:
            while items:
                wave, items = next_wave(items)
                self._outstanding = len(wave)
                for row in wave:
                    delivery.submit(results[id(row)], row)
                self._await(rows, delivery)
                if self._outstanding or self._stop or delivery.restart_reason is not None:
                    break  # interrupted, stopping, or a session to drop: the rest goes back
                items, _back = held_back(items, wave, (OK, DEAD))
        except ProduceInterrupted as exc:
            logger.warning("polling batch interrupted: %s", exc.args[0])
            delivery.abandon()
        self.stats.in_flight = 0
        for row in rows:
            if row.outcome is None:
                row.outcome = BACK

    def _interrupted(self) -> str | None:
        delivery = self._delivery
        if delivery is not None and delivery.halt_reason is not None:
            return "halt"
        if self._lost_lead():
            return "leadership lost"
        if self._stop:
            now = time.monotonic()
            if self._deadline is None:
                self._deadline = now + self.settings.shutdown_grace_s
            if now >= self._deadline:
                return "stop requested: grace period over"
        return None

    def _await(self, rows: list[_Row], delivery: Delivery) -> None:
        """Serve the producer until the wave is settled; renews the lease of ``rows`` not
        settled yet (those waiting for a later wave too)."""
        lease = self.settings.polling.lease_s
        last_renew = time.monotonic()
        while self._outstanding > 0:
            self.stats.beat()
            self.stats.in_flight = self._outstanding
            delivery.publisher.poll(0.05)
            delivery.service()
            reason = self._interrupted()
            if reason is not None:
                logger.warning("%s with %d records unacknowledged", reason, self._outstanding)
                delivery.abandon()
                return
            now = time.monotonic()
            if now - last_renew >= lease / 3:
                last_renew = now
                self._renew([r for r in rows if r.outcome is None])

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
        """Mark acknowledged rows PUBLISHED and give the others back, in one transaction.

        Dead-lettered rows were already marked FAILED by the delivery (before they counted
        as settled), so they no longer match and are left alone."""
        self._unmarked = rows
        published = [r.id for r in rows if r.outcome == OK]
        others = [r for r in rows if r.outcome not in (OK, DEAD)]
        marked = 0
        with conn.transaction():
            if published:
                cur = conn.execute(
                    self._sql.mark_published, {"ids": published, "me": self.worker_id}
                )
                marked = cur.rowcount
            if others:
                polling = self.settings.polling
                failures = self._retries.failures(others)
                conn.execute(
                    self._sql.mark_outcomes,
                    outcome_params(others, polling, self.worker_id, self._rng, failures),
                )
        self._retries.settle(rows)
        self._unmarked = []
        if marked < len(published):
            logger.warning("lease lost for %d published rows", len(published) - marked)

    # -- helpers -----------------------------------------------------------------------------

    def _lost_lead(self) -> bool:
        return self._is_leader is not None and not self._is_leader()

    def _connect(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = db_pool.connect(self.settings.postgres_dsn(), autocommit=True)
        return self._conn

    def _close_connection(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

    def _require_delivery(self) -> Delivery:
        if self._delivery is None:
            self._delivery = Delivery(
                delivery_section(self._own),
                self.stats,
                failed_rows=failed_rows_of(self._own),
                interrupted=self._interrupted,
            )
        return self._delivery

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self._stop and (left := deadline - time.monotonic()) > 0:
            self.stats.beat()
            time.sleep(min(0.05, left))
