"""The statements moved into ``store/`` (issue 35: ``store/`` builds every statement on the
outbox database's own tables) are byte-identical to those the other layers built before the
move: ``golden/store_statements.json`` was captured from the code of commit 121874c (the
backlog query and order of ``cdc/catch_up*.py``, redrive's and cleanup's statements of
``admin/outbox_ops.py``, the lease statements of ``ha/leadership.py`` and the slot drop of
``service/housekeeping.py``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql

from cdc_outbox.config.settings import Settings
from cdc_outbox.store import catch_up_sql, leases, outbox_rows
from cdc_outbox.store.outbox_table import OutboxTable

GOLDEN: dict[str, Any] = json.loads(
    (Path(__file__).parent / "golden" / "store_statements.json").read_text()
)


def _settings(**values: Any) -> Settings:
    return Settings.model_validate({"dsn": "host=db", **values})


TABLES = {
    "default": OutboxTable.of(_settings(outbox_schema="billing", outbox_table="events")),
    "sequence": OutboxTable.of(_settings(columns={"sequence": "version"})),
    "debezium": OutboxTable.of(
        _settings(columns={"preset": "debezium"}, cdc_mark_published="delete")
    ),
}
DEFAULT = TABLES["default"]


def _text(statement: sql.Composable) -> str:
    return statement.as_string(None)


@pytest.mark.parametrize("layout", sorted(TABLES))
@pytest.mark.parametrize("commit_ts", [False, True])
def test_the_backlog_query_and_its_order_are_unchanged(layout: str, commit_ts: bool) -> None:
    table = TABLES[layout]
    columns = ["id", "aggregate_id", "payload"]
    backlog = _text(catch_up_sql.backlog_query(table, columns, commit_ts))
    assert backlog == GOLDEN[f"backlog/{layout}/{commit_ts}"]
    assert _text(catch_up_sql.order_by(table, commit_ts)) == GOLDEN[f"order/{layout}/{commit_ts}"]
    assert _text(table.count_unpublished()) == GOLDEN[f"backlog_count/{layout}"]


FILTERS: dict[str, dict[str, Any]] = {
    "all": {},
    "full": {
        "ids": ["a"],
        "event_type": "x",
        "since": datetime(2026, 1, 1, tzinfo=UTC),
        "until": datetime(2026, 2, 1, tzinfo=UTC),
        "limit": 5,
    },
}


@pytest.mark.parametrize("name", sorted(FILTERS))
def test_redrives_statements_are_unchanged(name: str) -> None:
    matching, params = outbox_rows.failed_ids(DEFAULT, **FILTERS[name])
    assert _text(matching) == GOLDEN[f"redrive_matching/{name}"]
    assert sorted(params) == GOLDEN[f"redrive_params/{name}"]
    assert params == FILTERS[name]
    assert [_text(outbox_rows.failed_listing(DEFAULT, matching))] == GOLDEN[f"failed_rows/{name}"]
    assert [
        _text(outbox_rows.aggregates_of(DEFAULT, matching)),
        _text(outbox_rows.count_failed_of_aggregates(DEFAULT)),
    ] == GOLDEN[f"redrive_dry/{name}"]


def test_cleanups_statements_are_unchanged() -> None:
    assert [_text(outbox_rows.count_published_before(DEFAULT))] == GOLDEN["cleanup_dry"]
    assert [_text(outbox_rows.delete_published_before(DEFAULT))] == GOLDEN["cleanup"]


def test_the_operator_statements_need_status_columns() -> None:
    with pytest.raises(ValueError, match="status columns"):
        outbox_rows.failed_ids(TABLES["debezium"])
    with pytest.raises(ValueError, match="status columns"):
        outbox_rows.delete_published_before(TABLES["debezium"])


def test_the_lease_statements_are_unchanged() -> None:
    state = sql.Identifier("billing", "cdc_outbox_relay_state")
    statements = leases.lease_statements(state)
    assert sorted(statements) == ["acquire", "clear", "end_stuck", "end_walsender", "renew"]
    for name, statement in statements.items():
        assert _text(statement) == GOLDEN[f"leadership/{name}"], name
    drop = leases.drop_slot_if_leader(state, "my_slot", "me:1")
    assert [_text(drop)] == GOLDEN["drop_slot"]
