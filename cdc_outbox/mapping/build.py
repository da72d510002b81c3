"""The row-to-record mapper of an outbox, built from the settings (the mapping layer's entry)."""

from __future__ import annotations

from typing import Any

from psycopg.conninfo import conninfo_to_dict

from cdc_outbox.config.models import OutboxSettings
from cdc_outbox.config.settings import Settings
from cdc_outbox.mapping.cloudevents import CloudEventsMapper, default_source
from cdc_outbox.mapping.rows import OutboxMapper

__all__ = ["outbox_mapper"]


def outbox_mapper(settings: Settings, outbox: OutboxSettings | None = None) -> OutboxMapper:
    """The row-to-record mapping of ``outbox`` (None: the first; every mode uses these)."""
    o = outbox or settings.outbox()
    args = (o.schema_name, o.table, settings.column_names(o), o.topic_template)
    kwargs: dict[str, Any] = {
        "tombstones": settings.null_payload == "tombstone",
        "reserved_topics": frozenset({settings.dead_letter_topic, settings.eos.checkpoint_topic}),
    }
    if settings.cloudevents == "off":
        return OutboxMapper(*args, **kwargs)
    dbname = conninfo_to_dict(settings.postgres_dsn()).get("dbname") if settings.dsn else None
    avro = settings.value_format == "avro"
    return CloudEventsMapper(
        *args,
        mode=settings.cloudevents,
        source=o.cloudevents_source or default_source(str(dbname or ""), o.schema_name, o.table),
        datacontenttype="application/avro" if avro else "application/json",
        **kwargs,
    )
