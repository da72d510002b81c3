"""The outbox writer's pure part: validation, presets, SQL text, and no relay imports."""

from __future__ import annotations

import datetime
import enum
import json
import subprocess
import sys
import uuid
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_outbox import writer
from cdc_outbox.config.models import COLUMN_PRESETS
from cdc_outbox.writer import PRESETS, OutboxTable, OutboxWriteError, default_dumps
from cdc_outbox.writer import prepare as _prepare


def prepare(*args: object, **kwargs: object) -> object:
    return _prepare(OutboxTable(), *args, **kwargs)  # type: ignore[arg-type]


def test_presets_match_the_relay_settings() -> None:
    assert PRESETS == COLUMN_PRESETS


def test_importing_the_writer_imports_no_relay_code() -> None:
    code = (
        "import sys, cdc_outbox.writer; "
        "print(sorted(m for m in sys.modules if m.startswith('cdc_outbox')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(
        [
            "cdc_outbox",
            "cdc_outbox.names",
            "cdc_outbox.telemetry",
            "cdc_outbox.telemetry.tracing",
            "cdc_outbox.writer",
            "cdc_outbox.writer.table",
            "cdc_outbox.writer.values",
        ]
    )


def test_the_writer_modules_stay_small() -> None:
    """House rule: modules of at most ~400 lines (the writer split by job, issue 35)."""
    root = Path(writer.__file__)
    files = sorted(root.parent.glob("*.py")) if root.name == "__init__.py" else [root]
    sizes = {f.name: len(f.read_text().splitlines()) for f in files}
    assert max(sizes.values()) <= 400, sizes


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("order", "", "Created", {}, None, None), "aggregate_id must be a non-empty"),
        (("order", "   ", "Created", {}, None, None), "aggregate_id must be a non-empty"),
        (("order", True, "Created", {}, None, None), "aggregate_id must be a str, int or UUID"),
        (("order", 1.5, "Created", {}, None, None), "aggregate_id must be a str, int or UUID"),
        (("order", None, "Created", {}, None, None), "aggregate_id must be a str, int or UUID"),
        (("order", "x" * 1001, "Created", {}, None, None), "at most 1000 characters"),
        (("order", "1", "Created", {"x": object()}, None, None), "payload is not JSON"),
        (("order", "1", "Created", {"x": Decimal("NaN")}, None, None), "payload is not JSON"),
        (("order", "1", "Created", {"x": Decimal("-Inf")}, None, None), "payload is not JSON"),
        (("order", "1", "Created", {"x": b"raw"}, None, None), "payload is not JSON"),
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


class Colour(enum.Enum):
    RED = "red"
    PRICE = Decimal("2.50")


class Kind(enum.StrEnum):
    ORDER = "order-7"


class Number(enum.IntEnum):
    SEVEN = 7


def test_the_default_encoder_writes_decimal_dates_uuid_and_enums() -> None:
    uid = uuid.UUID("12345678-1234-5678-1234-567812345678")
    value = {
        "t": Decimal("1.5"),
        "big": Decimal("12345678901234567890.000000001"),
        "at": datetime.datetime(2026, 1, 2, 3, 4, 5, 600_000, tzinfo=datetime.UTC),
        "naive": datetime.datetime(2026, 1, 2, 3, 4, 5),
        "day": datetime.date(2026, 1, 2),
        "time": datetime.time(3, 4, 5),
        "id": uid,
        "colours": [Colour.RED, Colour.PRICE, Kind.ORDER, Number.SEVEN],
        "text": "grüße",
    }
    assert json.loads(default_dumps(value)) == {
        "t": "1.5",
        "big": "12345678901234567890.000000001",
        "at": "2026-01-02T03:04:05.600000+00:00",
        "naive": "2026-01-02T03:04:05",
        "day": "2026-01-02",
        "time": "03:04:05",
        "id": "12345678-1234-5678-1234-567812345678",
        "colours": ["red", "2.50", "order-7", 7],
        "text": "grüße",
    }
    assert default_dumps({"a": [1, 2]}) == '{"a":[1,2]}'  # compact, as before


def test_the_payload_of_the_issue_is_accepted() -> None:
    _, params, _ = _prepare(
        OutboxTable(), "order", 42, "OrderPaid", {"t": Decimal("1.5")}, None, None
    )
    assert params[1:] == ("order", "42", "OrderPaid", '{"t":"1.5"}')


@pytest.mark.parametrize(
    ("aggregate_id", "stored"),
    [
        (42, "42"),
        (-7, "-7"),
        (2**70, str(2**70)),
        (uuid.UUID(int=1), "00000000-0000-0000-0000-000000000001"),
        ("o-1", "o-1"),
        (Kind.ORDER, "order-7"),
        (Number.SEVEN, "7"),
    ],
)
def test_aggregate_ids_of_any_scalar_type_are_stored_as_text(
    aggregate_id: object, stored: str
) -> None:
    _, params, _ = _prepare(OutboxTable(), "order", aggregate_id, "Created", {}, None, None)  # type: ignore[arg-type]
    assert params[2] == stored


def test_a_custom_dumps_is_used_for_payload_and_headers() -> None:
    calls: list[object] = []

    def dumps(value: object) -> bytes:
        calls.append(value)
        return json.dumps(value, default=float).encode()  # Decimal as a JSON number

    _, params, _ = _prepare(
        OutboxTable(), "order", "1", "Paid", {"t": Decimal("1.5")}, {"h": Decimal(2)}, None,
        dumps,
    )  # fmt: skip
    assert params[4:] == ('{"t": 1.5}', '{"h": 2.0}')
    assert len(calls) == 2
    with pytest.raises(OutboxWriteError, match="dumps returned dict"):
        _prepare(OutboxTable(), "order", "1", "Paid", {}, None, None, lambda v: v)
    with pytest.raises(OutboxWriteError, match="payload is not JSON-serialisable"):
        _prepare(OutboxTable(), "order", "1", "Paid", {}, None, None, lambda v: b"\xff")


@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.text()
        | st.decimals(allow_nan=False, allow_infinity=False)
        | st.uuids()
        | st.datetimes(timezones=st.none() | st.just(datetime.UTC))
        | st.dates(),
        lambda children: (
            st.lists(children, max_size=4)
            | st.dictionaries(st.text(max_size=5), children, max_size=4)
        ),
        max_leaves=12,
    )
)
def test_default_dumps_is_json_equal_to_converting_first(value: object) -> None:
    def plain(v: object) -> object:
        if isinstance(v, Decimal | uuid.UUID):
            return str(v)
        if isinstance(v, datetime.date):
            return v.isoformat()
        if isinstance(v, list):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    assert json.loads(default_dumps(value)) == plain(value)


#: The relay's dependencies: a writer-only install (psycopg only) has none of them.
RELAY_ONLY_MODULES = (
    "confluent_kafka", "fastavro", "msgspec", "prometheus_client", "pydantic",
    "pydantic_settings", "typer", "rich", "psycopg_pool", "sqlalchemy",
)  # fmt: skip
_BLOCKER = f"""
import importlib.abc, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {RELAY_ONLY_MODULES!r}:
            raise ImportError("blocked for this test: " + name)
        return None
sys.meta_path.insert(0, Refuse())
"""


def _run_blocked(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _BLOCKER + code], capture_output=True, text=True, check=False
    )


def test_the_writer_imports_and_works_without_the_relay_dependencies() -> None:
    done = _run_blocked(
        "import decimal, cdc_outbox.writer as o\n"
        "q, p, _ = o.prepare(o.OutboxTable(), 'order', 42, 'OrderPaid',"
        " {'t': decimal.Decimal('1.5')}, None, None)\n"
        "print(p[2], p[4])\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["42", '{"t":"1.5"}']
    # The blocker works: the relay's settings module needs pydantic, and is refused.
    refused = _run_blocked("import cdc_outbox.config.settings\n")
    assert refused.returncode == 1 and "blocked for this test: pydantic" in refused.stderr
