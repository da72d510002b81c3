"""DDL rendering (psycopg renders Composed without a connection: ``as_string(None)``)."""

from __future__ import annotations

from typing import Any

from psycopg import sql
from pydantic import SecretStr

from cdc_outbox.config.settings import Settings
from cdc_outbox.store import schema

DSN = "host=db.example dbname=shop"


def settings(**kwargs: Any) -> Settings:
    return Settings(dsn=SecretStr(DSN), **kwargs)


def render(stmts: list[sql.Composed] | sql.Composed) -> str:
    items = stmts if isinstance(stmts, list) else [stmts]
    return ";\n".join(s.as_string(None) for s in items)


def test_default_outbox_table() -> None:
    text = render(schema.outbox_table_ddl(settings()))
    assert text.startswith('CREATE TABLE IF NOT EXISTS "public"."outbox" (')
    for line in (
        '"id" uuid PRIMARY KEY DEFAULT gen_random_uuid()',
        '"aggregate_type" text NOT NULL',
        '"aggregate_id" text NOT NULL',
        '"event_type" text NOT NULL',
        '"payload" jsonb',
        "\"headers\" jsonb NOT NULL DEFAULT '{}'",
        "created_at timestamptz NOT NULL DEFAULT clock_timestamp()",
        "status text NOT NULL DEFAULT 'PENDING' CHECK (status IN "
        "('PENDING', 'PROCESSING', 'PUBLISHED', 'FAILED'))",
        "attempts integer NOT NULL DEFAULT 0",
        "available_at timestamptz NOT NULL DEFAULT now()",
        "locked_at timestamptz",
        "locked_by text",
        "published_at timestamptz",
        "last_error text",
    ):
        assert line in text
    assert (
        'CREATE INDEX IF NOT EXISTS "outbox_pending_idx" ON "public"."outbox" (available_at) '
        "WHERE status = 'PENDING'" in text
    )


def test_debezium_outbox_table_has_debezium_shape_only() -> None:
    s = settings(columns={"preset": "debezium"})
    stmts = schema.outbox_table_ddl(s)
    assert len(stmts) == 1  # no polling index
    text = render(stmts)
    for col in (
        '"id" uuid',
        '"aggregatetype" text',
        '"aggregateid" text',
        '"type" text',
        '"payload" jsonb',
    ):
        assert col in text
    for absent in ("headers", "status", "locked_by"):
        assert absent not in text


def test_configured_names_are_quoted_identifiers() -> None:
    s = settings(outbox_schema="App", outbox_table="Out$box", columns={"aggregate_id": "AggId"})
    text = render(schema.outbox_table_ddl(s))
    assert '"App"."Out$box"' in text
    assert '"AggId" text NOT NULL' in text
    assert '"Out$box_pending_idx"' in text
    assert render(schema.publication_ddl(s)) == (
        'CREATE PUBLICATION "cdc_outbox_pub" FOR TABLE "App"."Out$box"'
        " WITH (publish = 'insert', publish_via_partition_root = true)"
    )


def test_long_table_name_keeps_index_name_within_63() -> None:
    s = settings(outbox_table="t" * 63)
    index = schema.outbox_table_ddl(s)[1].as_string(None)
    name = index.split('"')[1]
    assert len(name) == 63
    assert name.endswith("_pending_idx")


def test_slot_sql_uses_literal() -> None:
    s = settings(slot_name="my_slot")
    assert render(schema.create_slot_sql(s)) == (
        "SELECT lsn::text FROM pg_create_logical_replication_slot('my_slot', 'pgoutput')"
    )
    assert render(schema.drop_slot_sql(s)) == "SELECT pg_drop_replication_slot('my_slot')"
    assert render(schema.drop_publication_ddl(s)) == 'DROP PUBLICATION IF EXISTS "cdc_outbox_pub"'


def test_processed_events() -> None:
    text = render(schema.processed_events_ddl("consumer"))
    assert 'CREATE TABLE IF NOT EXISTS "consumer"."processed_events"' in text
    assert "PRIMARY KEY (consumer_name, event_id)" in text


def test_role_grants_are_least_privilege() -> None:
    lines = render(schema.role_ddl(settings(), "relay")).split(";\n")
    assert lines == [
        'CREATE ROLE "relay" WITH LOGIN REPLICATION',
        'GRANT USAGE ON SCHEMA "public" TO "relay"',
        'GRANT SELECT ON "public"."outbox" TO "relay"',
        'GRANT UPDATE ("status", "attempts", "available_at", "locked_at", "locked_by", '
        '"published_at", "last_error") ON "public"."outbox" TO "relay"',
        'GRANT DELETE ON "public"."outbox" TO "relay"',
        'GRANT SELECT, INSERT, UPDATE ON "public"."cdc_outbox_relay_state" TO "relay"',
    ]
    debezium = render(schema.role_ddl(settings(columns={"preset": "debezium"}), "relay"))
    assert "UPDATE (" not in debezium  # no polling columns; the state table stays
