"""Metric families of the slot monitor's latest sample and of the heartbeat (read at scrape)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client.core import GaugeMetricFamily, Metric

from cdc_outbox.config.modes import FALLBACK_BLOCKERS
from cdc_outbox.lsn import Lsn
from cdc_outbox.monitoring.metric_families import PREFIX, counter, gauge, one_of

if TYPE_CHECKING:
    from cdc_outbox.monitoring.heartbeat import Heartbeat
    from cdc_outbox.monitoring.lag import LagSample
    from cdc_outbox.monitoring.slot_monitor import SlotMonitor

__all__ = ["OUTBOX_GAUGES", "heartbeat_families", "monitor_families", "outbox_families"]

WAL_STATUSES = ("reserved", "extended", "unreserved", "lost")
POLLING_STATUSES = ("pending", "processing", "failed")


def lsn_bytes(text: str) -> float:
    return float(Lsn.parse(text))


#: Per outbox table gauges: (name, help, OutboxFigures field); labelled ``outbox`` =
#: schema.table, one series per configured table the monitor samples (bounded cardinality).
OUTBOX_GAUGES = (
    ("outbox_unpublished_rows", "Unpublished rows (PENDING/PROCESSING; every row of a table"
     " without status columns) of the outbox table.", "unpublished_rows"),
    ("outbox_oldest_unpublished_age_seconds", "Age of the oldest unpublished row of the outbox"
     " table (by created_at; 0 when there is none).", "oldest_unpublished_age_seconds"),
    ("outbox_failed_rows", "Dead-lettered (FAILED) rows of the outbox table.", "failed_rows"),
    ("outbox_parked_aggregates", "Aggregates of the outbox table parked behind a FAILED row"
     " (until `cdc-outbox redrive`).", "parked_aggregates"),
)  # fmt: skip


def outbox_families(figures: list[dict[str, Any]]) -> Iterable[Metric]:
    """The :data:`OUTBOX_GAUGES`, one sample per outbox table with that figure known."""
    for name, doc, key in OUTBOX_GAUGES:
        family = GaugeMetricFamily(PREFIX + name, doc, labels=["outbox"])
        for f in figures:
            if f.get(key) is not None:
                family.add_metric([str(f["outbox"])], float(f[key]))
        yield family


def monitor_families(monitor: SlotMonitor) -> Iterable[Metric]:
    s: LagSample | None = monitor.latest
    section = monitor.section
    blocked = section.fallback_blocked
    yield one_of(
        PREFIX + "polling_fallback_disabled",
        "Auto mode only: 1 for the reason it relays by CDC only and never falls back to polling"
        " (table_less_events: message_prefix; statusless_outbox: a table without status"
        " columns), 0 for the others.",
        "reason",
        FALLBACK_BLOCKERS if section.mode == "auto" else (),
        None if blocked is None else blocked[0],
    )
    yield gauge("monitor_up", "1 if the last slot-monitor sample succeeded.", monitor.up)
    yield counter("monitor_errors_total", "Failed slot-monitor samples.", monitor.errors)
    yield gauge(
        "monitor_last_sample_timestamp_seconds",
        "Unix time of the last slot-monitor sample.",
        None if s is None else s.sampled_at,
    )
    if s is None:
        return
    yield gauge(
        "server_wal_lsn_bytes",
        "Current WAL position of the server.",
        None if s.wal_lsn is None else lsn_bytes(s.wal_lsn),
    )
    yield gauge("slot_present", "1 if the replication slot exists.", s.slot_present)
    yield gauge("slot_active", "1 if a connection is streaming from the slot.", s.slot_active)
    yield gauge(
        "slot_confirmed_flush_lsn_bytes",
        "Slot confirmed_flush_lsn.",
        None if s.confirmed_flush_lsn is None else lsn_bytes(s.confirmed_flush_lsn),
    )
    yield gauge(
        "slot_restart_lsn_bytes",
        "Slot restart_lsn.",
        None if s.restart_lsn is None else lsn_bytes(s.restart_lsn),
    )
    yield gauge(
        "slot_lag_bytes", "Current WAL minus the slot's confirmed_flush_lsn.", s.slot_lag_bytes
    )
    yield gauge(
        "slot_retained_wal_bytes",
        "Current WAL minus the slot's restart_lsn (WAL the server keeps for this slot).",
        s.slot_retained_wal_bytes,
    )
    yield one_of(
        PREFIX + "slot_wal_status",
        "1 for the slot's wal_status (reserved, extended, unreserved, lost).",
        "status",
        () if s.slot_wal_status is None else sorted({*WAL_STATUSES, s.slot_wal_status}),
        s.slot_wal_status,
    )
    yield gauge(
        "slot_safe_wal_size_bytes",
        "WAL that can still be written before the slot "
        "is in danger of being lost (absent: no max_slot_wal_keep_size).",
        s.slot_safe_wal_size_bytes,
    )
    pg_stats = (
        (
            "slot_spill_transactions_total",
            "Transactions spilled to disk (pg_stat_replication_slots.spill_txns).",
            s.slot_spill_txns,
        ),
        (
            "slot_spills_total",
            "Times transactions were spilled to disk (spill_count).",
            s.slot_spill_count,
        ),
        (
            "slot_spill_bytes_total",
            "Decoded bytes spilled to disk (spill_bytes).",
            s.slot_spill_bytes,
        ),
        (
            "slot_stream_transactions_total",
            "In-progress transactions streamed (stream_txns).",
            s.slot_stream_txns,
        ),
        (
            "slot_streams_total",
            "Times in-progress transactions were streamed (stream_count).",
            s.slot_stream_count,
        ),
        ("slot_stream_bytes_total", "Decoded bytes streamed (stream_bytes).", s.slot_stream_bytes),
        (
            "slot_decoded_transactions_total",
            "Transactions decoded for the slot (total_txns).",
            s.slot_total_txns,
        ),
        (
            "slot_decoded_bytes_total",
            "Bytes decoded for the slot (total_bytes).",
            s.slot_total_bytes,
        ),
    )
    for name, doc, value in pg_stats:
        yield counter(name, doc, value)
    yield gauge(
        "oldest_unpublished_age_seconds",
        "Age of the oldest unpublished outbox event (polling: oldest PENDING/PROCESSING row; "
        "cdc: age of the oldest WAL the slot has not confirmed, an upper bound).",
        s.oldest_unpublished_age_seconds,
    )
    rows = GaugeMetricFamily(
        PREFIX + "polling_rows",
        "Outbox rows by polling status (sampled in polling mode).",
        labels=["status"],
    )
    polling = (s.polling_pending, s.polling_processing, s.polling_failed)
    for name, count in zip(POLLING_STATUSES, polling, strict=True):
        if count is not None:
            rows.add_metric([name], count)
    yield rows
    yield gauge(
        "polling_retrying_rows", "PENDING rows that failed at least once.", s.polling_retrying_rows
    )
    yield from outbox_families(s.outboxes or [])
    yield gauge(
        "polling_retry_attempts",
        "Attempts made so far by the retrying PENDING rows.",
        s.polling_retry_attempts,
    )


def heartbeat_families(heartbeat: Heartbeat) -> Iterable[Metric]:
    yield counter("heartbeats_total", "Heartbeat messages committed.", heartbeat.sent)
    yield counter("heartbeat_errors_total", "Failed heartbeats.", heartbeat.errors)
    yield gauge(
        "heartbeat_last_success_timestamp_seconds",
        "Unix time of the last committed heartbeat.",
        heartbeat.last_success_unix or None,
    )
