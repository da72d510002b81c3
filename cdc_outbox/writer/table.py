"""Where the writer's events go: the outbox table and its column names (:class:`OutboxTable`,
the presets), and the writer's error (:class:`OutboxWriteError`). Pure, no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from psycopg import sql

from cdc_outbox.names import IDENT_RE

__all__ = ["DEFAULT_TABLE", "PRESETS", "OutboxTable", "OutboxWriteError"]

#: Column names per preset; equal to ``cdc_outbox.config.models.COLUMN_PRESETS`` (a unit test
#: checks it) but kept here so that writing events does not import the relay.
PRESETS: dict[str, dict[str, str | None]] = {
    "default": {
        "id": "id",
        "aggregate_type": "aggregate_type",
        "aggregate_id": "aggregate_id",
        "event_type": "event_type",
        "payload": "payload",
        "headers": "headers",
        "tracing_span_context": None,
    },
    "debezium": {
        "id": "id",
        "aggregate_type": "aggregatetype",
        "aggregate_id": "aggregateid",
        "event_type": "type",
        "payload": "payload",
        "headers": None,
        "tracing_span_context": None,
    },
}


class OutboxWriteError(ValueError):
    """The event cannot be written (raised before any SQL is sent)."""


@dataclass(frozen=True, slots=True)
class OutboxTable:
    """Where events go: ``schema.table`` and its column names (a preset plus overrides)."""

    schema: str = "public"
    table: str = "outbox"
    preset: str = "default"
    columns: Mapping[str, str | None] = field(default_factory=dict)

    def column(self, name: str) -> str | None:
        """The column for logical column ``name`` (``headers`` and ``tracing_span_context`` may
        be None: no such column)."""
        if self.preset not in PRESETS:
            raise OutboxWriteError(f"unknown column preset {self.preset!r}")
        return self.columns.get(name, PRESETS[self.preset][name])

    def insert_sql(self, with_headers: bool, with_tracing: bool = False) -> sql.Composed:
        """``INSERT INTO schema.table (id, aggregate_type, ...) VALUES (%s, ...)``."""
        names = ["id", "aggregate_type", "aggregate_id", "event_type", "payload"]
        if with_headers:
            names.append("headers")
        if with_tracing:
            names.append("tracing_span_context")
        for name in [self.schema, self.table, *(self.column(n) or "" for n in names)]:
            if not IDENT_RE.fullmatch(name):
                raise OutboxWriteError(f"{name!r} is not a valid SQL identifier")
        cols = [sql.Identifier(self.column(n) or "") for n in names]
        return sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
            sql.Identifier(self.schema, self.table),
            sql.SQL(", ").join(cols),
            sql.SQL(", ").join(sql.Placeholder() * len(cols)),
        )


DEFAULT_TABLE = OutboxTable()
