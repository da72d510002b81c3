"""The housekeeping statement per id type (rendered without a connection)."""

from __future__ import annotations

from typing import Any

from pydantic import SecretStr

from cdc_outbox.admin.inspection import ColumnType
from cdc_outbox.cdc.published_marker import PublishedMarker, _statement
from cdc_outbox.config import Settings

UUID = ColumnType("uuid", "pg_catalog", "uuid")
TEXT = ColumnType("text", "pg_catalog", "text")
VARCHAR = ColumnType("character varying(64)", "pg_catalog", "varchar")


def settings(**kwargs: Any) -> Settings:
    return Settings(dsn=SecretStr("host=db.example dbname=shop"), **kwargs)


def render(id_type: ColumnType, **kwargs: Any) -> str | None:
    stmt = _statement(settings(**kwargs), id_type)
    return None if stmt is None else stmt.as_string(None)


def test_uuid_ids_keep_one_comma_joined_text_parameter() -> None:
    assert render(UUID) == (
        'UPDATE "public"."outbox" SET status = \'PUBLISHED\', published_at = now(),'
        " locked_by = NULL, locked_at = NULL"
        " WHERE \"id\" = ANY(string_to_array(%s, ',')::uuid[]) AND status <> 'PUBLISHED'"
    )


def test_other_ids_are_one_array_parameter_cast_to_the_column_type() -> None:
    assert render(TEXT, cdc_mark_published="delete") == (
        'DELETE FROM "public"."outbox" WHERE "id" = ANY(%s::text[]::"pg_catalog"."text"[])'
    )
    text = render(VARCHAR, columns={"id": "event_id"})
    assert text is not None and "string_to_array" not in text
    assert '"event_id" = ANY(%s::text[]::"pg_catalog"."varchar"[])' in text


def test_housekeeping_off_or_without_status_column_marks_nothing() -> None:
    assert render(TEXT, cdc_mark_published="off", mode="cdc") is None
    assert render(UUID, columns={"preset": "debezium"}) is None
    assert not PublishedMarker(settings(columns={"preset": "debezium"})).enabled
    assert PublishedMarker(settings(cdc_mark_published="delete")).enabled
