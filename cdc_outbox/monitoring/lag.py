"""The lag view: one :class:`LagSample` of slot, WAL and outbox figures, read from PostgreSQL.

Shared by the relay's slot monitor (which adds relay figures) and ``cdc-outbox lag`` (which
reads the database itself). Reads only catalog views and the outbox table, so it works for the
least-privilege relay role. Positions are LSN text; sizes are bytes; ``None`` = not known.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import psycopg

from cdc_outbox.lsn import Lsn
from cdc_outbox.redaction import redact
from cdc_outbox.store.inspection import outbox_figures
from cdc_outbox.store.outbox_table import OutboxTable

Conn = psycopg.Connection[tuple[Any, ...]]


@dataclass(slots=True)
class LagSample:
    """Figures at ``sampled_at`` (Unix time). Relay fields are set only by the relay's monitor."""

    sampled_at: float
    slot_name: str
    # server and slot (pg_replication_slots, pg_stat_replication_slots)
    wal_lsn: str | None = None
    slot_present: bool | None = None
    slot_active: bool | None = None
    slot_active_pid: int | None = None
    confirmed_flush_lsn: str | None = None
    restart_lsn: str | None = None
    slot_lag_bytes: int | None = None
    slot_retained_wal_bytes: int | None = None
    slot_wal_status: str | None = None
    slot_safe_wal_size_bytes: int | None = None
    slot_spill_txns: int | None = None
    slot_spill_count: int | None = None
    slot_spill_bytes: int | None = None
    slot_stream_txns: int | None = None
    slot_stream_count: int | None = None
    slot_stream_bytes: int | None = None
    slot_total_txns: int | None = None
    slot_total_bytes: int | None = None
    # outbox
    oldest_unpublished_age_seconds: float | None = None
    polling_pending: int | None = None
    polling_processing: int | None = None
    polling_failed: int | None = None
    polling_retrying_rows: int | None = None
    polling_retry_attempts: int | None = None
    #: Per configured outbox table (``outbox`` = schema.table), each an
    #: :class:`~cdc_outbox.store.inspection.OutboxFigures` as a dict; the tables whose rows
    #: tell what is unpublished in the mode (:func:`figure_tables`).
    outboxes: list[dict[str, Any]] | None = None
    # relay (from RelayStats and the latency histogram, over the last sampling interval)
    mode: str | None = None
    role: str | None = None  # leader or standby (single active instance)
    phase: str | None = None  # durable phase: POLLING, CATCHING_UP, STREAMING
    delivery: str | None = None  # guarantee in effect: at_least_once or exactly_once
    events_published_total: int | None = None
    events_dead_lettered_total: int | None = None
    delivery_errors_total: int | None = None
    in_flight_events: int | None = None
    relay_confirmed_lsn: str | None = None
    last_confirm_unix: float | None = None
    throughput_events_per_second: float | None = None
    latency_p50_seconds: float | None = None
    latency_p95_seconds: float | None = None
    latency_mean_seconds: float | None = None
    heartbeats_total: int | None = None
    heartbeat_errors_total: int | None = None
    monitor_errors_total: int | None = None
    #: Why the database figures are missing (one line), if they are.
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class HasSecrets(Protocol):
    """Settings, or a section, that know their secrets (``Settings``, ``DatabaseSection``)."""

    def secret_values(self) -> list[str]: ...


def one_line(exc: BaseException, settings: HasSecrets) -> str:
    """``exc`` as one line with any secret of ``settings`` masked."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return redact(text, settings.secret_values())


#: One row whatever exists: the slot and its statistics are LEFT JOINed.
_SLOT_SQL = """
SELECT w.lsn::text, s.slot_name IS NOT NULL, s.active, s.active_pid,
       s.confirmed_flush_lsn::text, s.restart_lsn::text,
       greatest(pg_wal_lsn_diff(w.lsn, s.confirmed_flush_lsn), 0)::bigint,
       greatest(pg_wal_lsn_diff(w.lsn, s.restart_lsn), 0)::bigint,
       s.wal_status, s.safe_wal_size,
       st.spill_txns, st.spill_count, st.spill_bytes, st.stream_txns, st.stream_count,
       st.stream_bytes, st.total_txns, st.total_bytes
FROM (SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
                  ELSE pg_current_wal_lsn() END AS lsn) w
LEFT JOIN pg_replication_slots s ON s.slot_name = %(slot)s
LEFT JOIN pg_stat_replication_slots st ON st.slot_name = %(slot)s
"""
_SLOT_FIELDS = (
    "wal_lsn", "slot_present", "slot_active", "slot_active_pid", "confirmed_flush_lsn",
    "restart_lsn", "slot_lag_bytes", "slot_retained_wal_bytes", "slot_wal_status",
    "slot_safe_wal_size_bytes", "slot_spill_txns", "slot_spill_count", "slot_spill_bytes",
    "slot_stream_txns", "slot_stream_count", "slot_stream_bytes", "slot_total_txns",
    "slot_total_bytes",
)  # fmt: skip
_COLUMNS_SQL = """
SELECT a.attname FROM pg_attribute a
WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped
"""
#: Outbox columns the polling figures need (the default preset has them; debezium does not).
POLLING_NEEDS = frozenset({"status", "attempts"})


def outbox_columns(conn: Conn, tables: Sequence[OutboxTable]) -> dict[str, frozenset[str]]:
    """Column names of each outbox table by ``schema.table`` (empty if it does not exist or
    is not visible)."""
    return {
        outbox.name: frozenset(
            r[0] for r in conn.execute(_COLUMNS_SQL, (outbox.ident.as_string(conn),))
        )
        for outbox in tables
    }


def read_slot(conn: Conn, slot_name: str, sample: LagSample) -> None:
    """Fill the server and slot fields of ``sample`` (one statement)."""
    row = conn.execute(_SLOT_SQL, {"slot": slot_name}).fetchone()
    assert row is not None
    for name, value in zip(_SLOT_FIELDS, row, strict=True):
        setattr(sample, name, value)


def read_polling(
    conn: Conn,
    tables: Sequence[OutboxTable],
    sample: LagSample,
    columns: dict[str, frozenset[str]],
) -> None:
    """Fill the polling counts (summed over the outbox tables) and the oldest unpublished
    (PENDING/PROCESSING) row's age (the oldest of every table).

    Needs the ``status`` and ``attempts`` columns (age also ``created_at``); a table without
    them is left out, and with none the fields stay ``None``.
    """
    for outbox in tables:
        have = columns.get(outbox.name, frozenset())
        if not outbox.has_status or not have >= POLLING_NEEDS:
            continue
        row = conn.execute(outbox.polling_counts(with_age="created_at" in have)).fetchone()
        assert row is not None
        pending, processing, failed, retrying, attempts_sum = (int(v) for v in row[:5])
        sample.polling_pending = (sample.polling_pending or 0) + pending
        sample.polling_processing = (sample.polling_processing or 0) + processing
        sample.polling_failed = (sample.polling_failed or 0) + failed
        sample.polling_retrying_rows = (sample.polling_retrying_rows or 0) + retrying
        sample.polling_retry_attempts = (sample.polling_retry_attempts or 0) + attempts_sum
        if "created_at" in have:  # no unpublished row: age 0
            age = max(float(row[5] or 0.0), 0.0)
            sample.oldest_unpublished_age_seconds = max(
                sample.oldest_unpublished_age_seconds or 0.0, age
            )


def figure_tables(tables: Sequence[OutboxTable], mode: str | None) -> list[OutboxTable]:
    """The outbox tables whose rows tell what is unpublished in ``mode``: a table with status
    columns, unless CDC leaves its rows unmarked (``cdc_mark_published = "off"`` outside
    polling); a table without them only when CDC deletes published rows."""
    return [
        t
        for t in tables
        if (t.has_status and (mode == "polling" or t.marking != "off"))
        or (not t.has_status and t.marking == "delete")
    ]


def read_outboxes(conn: Conn, tables: Sequence[OutboxTable], sample: LagSample) -> None:
    """Fill ``sample.outboxes``: the figures of each of :func:`figure_tables` of ``tables``."""
    figures = outbox_figures(conn, figure_tables(tables, sample.mode))
    sample.outboxes = [asdict(f) for f in figures]


class WalClock:
    """When was WAL position X written? Estimated from (time, current WAL) samples.

    Keeps at most ``max_points`` samples; runs of equal positions keep their first and last
    sample. A position older than every sample gets the age of the oldest sample (a lower
    bound); a position at or past the newest sample is "now" (age 0).
    """

    def __init__(self, max_points: int = 20_000) -> None:
        self._points: deque[tuple[float, int]] = deque(maxlen=max_points)

    def add(self, unix: float, lsn: int) -> None:
        pts = self._points
        if pts and lsn < pts[-1][1]:  # another server, or a restored one: start over
            pts.clear()
        if len(pts) >= 2 and pts[-1][1] == lsn and pts[-2][1] == lsn:
            pts[-1] = (unix, lsn)
        else:
            pts.append((unix, lsn))

    def age(self, lsn: int, now: float) -> float | None:
        """Seconds since WAL ``lsn`` was written (``None`` before the first sample)."""
        pts = self._points
        if not pts:
            return None
        if lsn >= pts[-1][1]:
            return 0.0
        i = bisect.bisect_right(pts, lsn, key=lambda p: p[1])  # first sample past ``lsn``
        if i == 0:
            return max(now - pts[0][0], 0.0)
        (t0, l0), (t1, l1) = pts[i - 1], pts[i]
        written = t0 + (t1 - t0) * ((lsn - l0) / (l1 - l0))
        return max(now - written, 0.0)

    def __len__(self) -> int:
        return len(self._points)


def lsn_value(text: str | None) -> int | None:
    return None if text is None else int(Lsn.parse(text))
