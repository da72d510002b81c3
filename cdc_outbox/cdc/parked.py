"""The parked aggregates of every outbox table, as the CDC relay loads them at each session
start (:meth:`~cdc_outbox.delivery.policy.Parking.load_from_position`): each table's in a
namespace of its own (:func:`~cdc_outbox.delivery.policy.table_aggregate`), so the same
aggregate id in two tables is two aggregates (issue 36)."""

from __future__ import annotations

from cdc_outbox.config.settings import Settings
from cdc_outbox.delivery.policy import table_aggregate
from cdc_outbox.store import db_pool
from cdc_outbox.store.failed_rows import parked_aggregates
from cdc_outbox.store.outbox_table import OutboxTable

__all__ = ["parked_in_every_outbox"]


def parked_in_every_outbox(settings: Settings) -> list[tuple[str, str]]:
    """``(aggregate, first FAILED event id)`` of every outbox table with status columns."""
    tables = OutboxTable.all_of(settings)
    with db_pool.connect(settings.postgres_dsn()) as conn:
        return [
            (table_aggregate(n, aggregate), event_id)
            for n, table in enumerate(tables)
            if table.has_status
            for aggregate, event_id in parked_aggregates(conn, settings, outbox=table)
        ]
