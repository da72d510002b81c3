"""The consumer's Avro value decoder: Confluent wire format, writer schemas from the registry.

:class:`AvroValues` is a :data:`~cdc_outbox.consumer.events.ValueDecoder`. A value is
``magic 0 | 4-byte schema id | Avro binary`` (:mod:`cdc_outbox.avro.wire`, the relay's codec);
the writer schema is fetched by id once and cached parsed (ids are immutable in a registry).

- a tombstone (null value) decodes to ``None``;
- not the wire format, an id the registry answers 404 for, or a body that does not read with
  its schema: :class:`~cdc_outbox.consumer.events.BadRecord` (dead-lettered);
- the registry cannot be asked (outage: connection, timeout, 5xx/408/429) or refuses the
  consumer (e.g. 401/403, a configuration problem, not the record's):
  :class:`~cdc_outbox.consumer.events.DecodeUnavailable` (the batch is retried).
"""

from __future__ import annotations

import logging
from typing import Any

from cdc_outbox.avro.registry import RegistryClient, RegistryError, RegistryUnavailable
from cdc_outbox.avro.wire import decode, parse, unframe
from cdc_outbox.config.models import SchemaRegistrySettings
from cdc_outbox.consumer.event_types import BadRecord, DecodeUnavailable
from cdc_outbox.kafka.consumer import RawRecord

__all__ = ["AvroValues"]

logger = logging.getLogger(__name__)


class AvroValues:
    """Decodes Avro record values with writer schemas from ``registry`` (see module doc)."""

    def __init__(self, registry: SchemaRegistrySettings) -> None:
        self.client = RegistryClient(
            registry.url, registry.basic_auth_user_info.get_secret_value(), registry.timeout_s
        )
        self._schemas: dict[int, Any] = {}

    def __call__(self, record: RawRecord) -> Any:
        value = record.value
        if value is None:
            return None
        try:
            schema_id, _ = unframe(value)
        except ValueError as exc:
            raise BadRecord(f"value is not Avro: {exc}") from None
        schema = self._schemas.get(schema_id)
        if schema is None:
            schema = self._schemas[schema_id] = self._fetch(schema_id)
        try:
            return decode(value, lambda _: schema)
        except Exception as exc:  # fastavro: EOFError, UnicodeDecodeError, IndexError, ...
            why = f"{type(exc).__name__}: {exc}"[:300]
            raise BadRecord(f"value does not read with schema id {schema_id}: {why}") from None

    def _fetch(self, schema_id: int) -> Any:
        try:
            text = self.client.schema(schema_id)
        except RegistryUnavailable as exc:
            raise DecodeUnavailable(f"schema id {schema_id}: {exc}") from None
        except RegistryError as exc:
            if exc.status == 404:
                raise BadRecord(
                    f"value has schema id {schema_id}, which the registry does not know"
                    f" ({exc.message})"
                ) from None
            raise DecodeUnavailable(f"schema id {schema_id}: the registry refused: {exc}") from None
        try:
            parsed = parse(text)
        except Exception as exc:  # an invalid schema in the registry: no record can use it
            raise BadRecord(f"schema id {schema_id} is not a valid Avro schema: {exc}") from None
        logger.info("writer schema id %d fetched from the registry", schema_id)
        return parsed
