"""The outbox table's column names: a layout's presets and a resolved set (pure data)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEBEZIUM_COLUMNS", "DEFAULT_COLUMNS", "ColumnNames"]


@dataclass(frozen=True, slots=True)
class ColumnNames:
    id: str
    aggregate_type: str
    aggregate_id: str
    event_type: str
    payload: str
    headers: str | None
    #: W3C trace context text written by the writer helper (telemetry.tracing); None: none.
    tracing_span_context: str | None = None
    #: (header name, column) pairs: the column's value is sent in a header of that name
    #: (Debezium's ``column:header:alias`` placement); never part of a preset.
    header_columns: tuple[tuple[str, str], ...] = ()

    def row_columns(self) -> list[str]:
        """The columns a row is read with, in order: the event columns, the headers and
        tracing columns if configured, then :meth:`header_sources`."""
        return self._event_columns() + self.header_sources()

    def header_sources(self) -> list[str]:
        """The ``header_columns`` sources that are none of the other columns, each once."""
        if not self.header_columns:
            return []
        taken = self._event_columns()
        return [c for c in dict.fromkeys(c for _, c in self.header_columns) if c not in taken]

    def _event_columns(self) -> list[str]:
        names = [self.id, self.aggregate_type, self.aggregate_id, self.event_type, self.payload]
        names += [self.headers] if self.headers is not None else []
        return names + ([self.tracing_span_context] if self.tracing_span_context else [])


DEFAULT_COLUMNS = ColumnNames(
    "id", "aggregate_type", "aggregate_id", "event_type", "payload", "headers"
)
DEBEZIUM_COLUMNS = ColumnNames("id", "aggregatetype", "aggregateid", "type", "payload", None)
