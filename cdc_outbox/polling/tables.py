"""What a polling worker needs of one outbox table, derived from the settings once
(:func:`polling_tables`): the table's statements, mapper, parked aggregates and delivery
engine. The worker (:class:`~cdc_outbox.polling.relay.PollingRelay`) receives these and its
:class:`~cdc_outbox.config.polling.PollingSection`, never the whole settings."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from cdc_outbox.config.delivery import delivery_section
from cdc_outbox.config.settings import OutboxSettings, Settings
from cdc_outbox.delivery.engine import Delivery
from cdc_outbox.mapping.build import outbox_mapper
from cdc_outbox.mapping.rows import OutboxMapper
from cdc_outbox.store import polling_sql
from cdc_outbox.store.failed_rows import failed_rows_of, parked_aggregates
from cdc_outbox.telemetry.relay_stats import RelayStats

__all__ = ["PollingTable", "polling_tables"]

Conn = psycopg.Connection[Any]


@dataclass(frozen=True, slots=True)
class PollingTable:
    """One outbox table with status columns, as its polling worker serves it."""

    outbox: OutboxSettings
    sql: polling_sql.PollingSql
    mapper: OutboxMapper
    #: The layout has a ``headers`` / ``tracing_span_context`` column (claimed with the row).
    with_headers: bool
    with_tracing: bool
    #: ``(conn, aggregate ids)`` -> ``(aggregate id, oldest FAILED id)`` of those parked.
    parked: Callable[[Conn, Sequence[str]], list[tuple[str, str]]]
    #: ``(stats, interrupted)`` -> a delivery engine of this table (FAILED rows marked in it).
    delivery: Callable[[RelayStats, Callable[[], str | None]], Delivery]


def polling_tables(settings: Settings) -> list[PollingTable]:
    """Every configured outbox table with status columns, in configuration order (the
    others cannot be polled)."""
    return [_table(settings, o) for o in settings.outbox_settings() if o.columns.has_status]


def _table(settings: Settings, outbox: OutboxSettings) -> PollingTable:
    #: ``settings`` narrowed to this table, for the store helpers of "the" outbox table.
    own = settings.model_copy(update={"outboxes": [outbox]})
    names = settings.column_names(outbox)

    def parked(conn: Conn, aggregates: Sequence[str]) -> list[tuple[str, str]]:
        return parked_aggregates(conn, own, aggregates)

    def delivery(stats: RelayStats, interrupted: Callable[[], str | None]) -> Delivery:
        return Delivery(
            delivery_section(own),
            stats,
            failed_rows=failed_rows_of(own),
            interrupted=interrupted,
        )

    return PollingTable(
        outbox,
        polling_sql.build(settings, outbox),
        outbox_mapper(settings, outbox),
        with_headers=names.headers is not None,
        with_tracing=names.tracing_span_context is not None,
        parked=parked,
        delivery=delivery,
    )
