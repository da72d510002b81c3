"""store.outbox_table: the one owner of an outbox layout's row rules (no server needed)."""

from __future__ import annotations

import pytest
from psycopg import sql

from cdc_outbox.config.settings import Settings
from cdc_outbox.store.outbox_table import STATUSES, UNPUBLISHED_STATES, OutboxTable


def _table(**extra: object) -> OutboxTable:
    return OutboxTable.of(Settings.model_validate({"dsn": "host=db", **extra}))


def _text(query: sql.Composable) -> str:
    return query.as_string(None)


def test_the_default_layout_keeps_row_states() -> None:
    t = _table(outbox_schema="billing", outbox_table="events")
    assert t.has_status and t.keeps_published_rows
    assert t.name == "billing.events"
    assert _text(t.ident) == '"billing"."events"'
    assert _text(t.unpublished()) == "\"status\" IN ('PENDING', 'PROCESSING')"
    assert _text(t.count_unpublished()) == (
        'SELECT count(*) FROM "billing"."events" WHERE "status" IN (\'PENDING\', \'PROCESSING\')'
    )
    assert _text(t.failed()) == "\"status\" = 'FAILED'"
    assert 'count(DISTINCT "aggregate_id")' in _text(t.status_counts())
    assert t.order_column == "created_at"
    assert STATUSES[:2] == UNPUBLISHED_STATES


def test_the_debezium_layout_keeps_none() -> None:
    t = _table(columns={"preset": "debezium"}, cdc_mark_published="delete")
    assert not t.has_status and not t.keeps_published_rows
    assert _text(t.unpublished()) == "true"  # every row in the table is still unpublished
    assert _text(t.count_unpublished()).endswith("WHERE true")
    assert t.order_column is None
    for question in (t.failed, t.published, t.status_counts):
        with pytest.raises(ValueError, match="status columns"):
            question()
    with pytest.raises(ValueError, match="status columns"):
        t.polling_counts(with_age=True)


def test_a_configured_sequence_orders_any_layout() -> None:
    t = _table(columns={"preset": "debezium", "sequence": "version"}, cdc_mark_published="delete")
    assert t.order_column == "version"


def test_polling_counts_read_the_age_only_with_created_at() -> None:
    t = _table()
    assert "NULL::float8" in _text(t.polling_counts(with_age=False))
    assert 'min("created_at")' in _text(t.polling_counts(with_age=True))


def test_a_dead_letter_is_told_by_the_table() -> None:
    """The catch-up and the polling relay ask this of a row's status (they never spell it)."""
    assert [OutboxTable.is_dead_letter(s) for s in STATUSES] == [False, False, False, True]
