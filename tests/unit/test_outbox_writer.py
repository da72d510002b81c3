"""The outbox writer's pure part: validation, presets, SQL text, and no relay imports."""

from __future__ import annotations

import subprocess
import sys
import uuid
from decimal import Decimal

import pytest

from cdc_outbox.config_models import COLUMN_PRESETS
from cdc_outbox.outbox import PRESETS, OutboxTable, OutboxWriteError
from cdc_outbox.outbox import prepare as _prepare


def prepare(*args: object, **kwargs: object) -> object:
    return _prepare(OutboxTable(), *args, **kwargs)  # type: ignore[arg-type]


def test_presets_match_the_relay_settings() -> None:
    assert PRESETS == COLUMN_PRESETS


def test_importing_the_writer_imports_no_relay_code() -> None:
    code = (
        "import sys, cdc_outbox.outbox; "
        "print(sorted(m for m in sys.modules if m.startswith('cdc_outbox')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['cdc_outbox', 'cdc_outbox.outbox']"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("order", "", "Created", {}, None, None), "aggregate_id must be a non-empty"),
        (("order", "   ", "Created", {}, None, None), "aggregate_id must be a non-empty"),
        (("order", 7, "Created", {}, None, None), "aggregate_id must be a non-empty"),
        (("order", "1", "Created", {"x": object()}, None, None), "payload is not JSON"),
        (("order", "1", "Created", {"x": Decimal(1)}, None, None), "payload is not JSON"),
        (("order", "1", "Created", float("nan"), None, None), "payload is not JSON"),
        (("", "1", "Created", {}, None, None), "aggregate_type must be"),
        (("or der", "1", "Created", {}, None, None), "aggregate_type must be"),
        (("order", "1", "Created/v2", {}, None, None), "event_type must be"),
        (("order", "1", "Created", {}, {"id": "x"}, None), "reserved"),
        (("order", "1", "Created", {}, {"cdc_outbox.reason": "x"}, None), "reserved"),
        (("order", "1", "Created", {}, {"trace": {1, 2}}, None), "headers is not JSON"),
        (("order", "1", "Created", {}, None, "not-a-uuid"), "is not a UUID"),
    ],
)
def test_bad_input_is_refused_with_a_clear_error(args: tuple[object, ...], fragment: str) -> None:
    with pytest.raises(OutboxWriteError, match=fragment):
        prepare(*args)


def test_sql_follows_the_table_spec() -> None:
    eid = uuid.uuid4()
    table = OutboxTable("app", "events", preset="debezium", columns={"payload": "body"})
    query, params, got = _prepare(table, "order", "1", "Created", {"a": 1}, None, eid)
    text = query.as_string(None)
    assert text == (
        'INSERT INTO "app"."events" ("id", "aggregatetype", "aggregateid", "type", "body")'
        " VALUES (%s, %s, %s, %s, %s)"
    )
    assert params == (str(eid), "order", "1", "Created", '{"a":1}')
    assert got == eid
    with pytest.raises(OutboxWriteError, match="no headers column"):
        _prepare(table, "order", "1", "Created", {}, {"trace": "t"}, None)
    with pytest.raises(OutboxWriteError, match="not a valid SQL identifier"):
        _prepare(OutboxTable(table='x"; drop'), "order", "1", "Created", {}, None, None)
