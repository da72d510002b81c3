"""The outbox writer on a real PostgreSQL: transactional, validated before any SQL is sent."""

from __future__ import annotations

import asyncio
import datetime
import uuid
from decimal import Decimal

import psycopg
import pytest
from psycopg.pq import TransactionStatus

from cdc_outbox.config.settings import Settings
from cdc_outbox.store.schema import outbox_table_ddl
from cdc_outbox.writer import (
    OutboxTable,
    OutboxWriteError,
    write_event,
    write_event_async,
    write_event_sqlalchemy,
)


def _create_outbox(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for stmt in outbox_table_ddl(Settings(dsn=dsn)):
            conn.execute(stmt)


def _ids(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        return {str(r[0]) for r in conn.execute("SELECT id FROM outbox")}


def test_events_of_a_rolled_back_transaction_never_appear(pg_dsn: str) -> None:
    _create_outbox(pg_dsn)
    with psycopg.connect(pg_dsn) as conn:
        kept = write_event(conn, "order", "o-1", "OrderCreated", {"total": 5}, {"trace": "t1"})
        conn.commit()
        with conn.cursor() as cur:
            dropped = write_event(cur, "order", "o-2", "OrderCreated", {"total": 6})
        conn.rollback()

    async def write_async() -> tuple[uuid.UUID, uuid.UUID]:
        async with await psycopg.AsyncConnection.connect(pg_dsn) as aconn:
            a_kept = await write_event_async(aconn, "order", "o-3", "OrderCreated", [1, 2])
            await aconn.commit()
            a_dropped = await write_event_async(aconn, "order", "o-4", "OrderCreated", None)
            await aconn.rollback()
            return a_kept, a_dropped

    a_kept, a_dropped = asyncio.run(write_async())

    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    engine = create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(pg_dsn))
    with Session(engine) as session:
        s_kept = write_event_sqlalchemy(session, "order", "o-5", "OrderCreated", {"n": 1})
        session.commit()
        s_dropped = write_event_sqlalchemy(session, "order", "o-6", "OrderCreated", {"n": 2})
        session.rollback()
    with engine.connect() as sa_conn:
        c_kept = write_event_sqlalchemy(sa_conn, "order", "o-7", "X", {"n": 3}, {"h": [1]})
        sa_conn.commit()
    engine.dispose()

    assert _ids(pg_dsn) == {str(kept), str(a_kept), str(s_kept), str(c_kept)}
    assert not {dropped, a_dropped, s_dropped} & {kept, a_kept, s_kept, c_kept}
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute(
            "SELECT aggregate_type, aggregate_id, event_type, payload, headers FROM outbox"
            " WHERE id = %s",
            [kept],
        ).fetchone()
        c_row = conn.execute("SELECT headers FROM outbox WHERE id = %s", [c_kept]).fetchone()
    assert row == ("order", "o-1", "OrderCreated", {"total": 5}, {"trace": "t1"})
    assert c_row == ({"h": [1]},)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("order", "1", "OrderCreated", {"when": object()}), "payload is not JSON"),
        (("order", "", "OrderCreated", {"total": 1}), "aggregate_id must be a non-empty"),
    ],
)
def test_bad_input_raises_before_any_sql_reaches_the_server(
    pg_dsn: str, args: tuple[object, ...], fragment: str
) -> None:
    _create_outbox(pg_dsn)
    with psycopg.connect(pg_dsn) as conn, psycopg.connect(pg_dsn, autocommit=True) as watcher:
        # A fresh connection: psycopg would send BEGIN with the first statement.
        with pytest.raises(OutboxWriteError, match=fragment):
            write_event(conn, *args)  # type: ignore[arg-type]
        assert conn.info.transaction_status == TransactionStatus.IDLE
        # Inside a transaction: the server's last statement of this session is still ours.
        conn.execute("SELECT 'marker-before-write'")
        with pytest.raises(OutboxWriteError, match=fragment):
            write_event(conn, *args)  # type: ignore[arg-type]
        assert conn.info.transaction_status == TransactionStatus.INTRANS  # not INERROR
        last = watcher.execute(
            "SELECT query FROM pg_stat_activity WHERE pid = %s", [conn.info.backend_pid]
        ).fetchone()
        assert last == ("SELECT 'marker-before-write'",)
        conn.rollback()
    assert _ids(pg_dsn) == set()


def test_writer_follows_the_debezium_preset_and_another_table(pg_dsn: str) -> None:
    settings = Settings.model_validate(
        {"dsn": pg_dsn, "outbox_schema": "app", "outbox_table": "events",
         "columns": {"preset": "debezium", "payload": "body"}, "on_permanent_error": "halt",
         "cdc_mark_published": "off"}
    )  # fmt: skip
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA app")
        for stmt in outbox_table_ddl(settings):
            conn.execute(stmt)
    table = OutboxTable("app", "events", preset="debezium", columns={"payload": "body"})
    with psycopg.connect(pg_dsn) as conn:
        eid = write_event(conn, "order", "o-9", "OrderShipped", {"n": 9}, table=table)
        conn.commit()
        row = conn.execute(
            "SELECT id, aggregatetype, aggregateid, type, body FROM app.events"
        ).fetchone()
    assert row == (eid, "order", "o-9", "OrderShipped", {"n": 9})


def test_real_payloads_and_scalar_aggregate_ids_are_written(pg_dsn: str) -> None:
    """Issue 27: a Decimal payload and an int aggregate id were refused."""
    _create_outbox(pg_dsn)
    order = uuid.uuid4()
    paid_at = datetime.datetime(2026, 3, 1, 12, 30, tzinfo=datetime.UTC)
    with psycopg.connect(pg_dsn) as conn:
        first = write_event(conn, "order", 42, "OrderPaid", {"t": Decimal("1.5")})
        second = write_event(
            conn, "order", order, "OrderPaid", {"at": paid_at, "day": paid_at.date()},
            headers={"amount": Decimal("0.10")},
        )  # fmt: skip
        conn.commit()
        rows = conn.execute(
            "SELECT id, aggregate_id, payload, headers FROM outbox ORDER BY created_at"
        ).fetchall()
    assert rows == [
        (first, "42", {"t": "1.5"}, {}),
        (second, str(order), {"at": "2026-03-01T12:30:00+00:00", "day": "2026-03-01"},
         {"amount": "0.10"}),
    ]  # fmt: skip

    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    engine = create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(pg_dsn))
    with Session(engine) as session:  # the SQLAlchemy snippet of docs/consumers.md: an int id
        third = write_event_sqlalchemy(session, "order", 7, "OrderPlaced", {"t": Decimal(3)})
        session.commit()
    engine.dispose()
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute("SELECT aggregate_id, payload FROM outbox WHERE id = %s", [third])
        assert row.fetchone() == ("7", {"t": "3"})
