"""Avro serialization of mapped outbox records (the one code path of every mode).

:meth:`AvroSerializer.encode` takes an :class:`~cdc_outbox.mapping.rows.OutboxRecord` whose
value is the row's JSON payload and returns ``(key, value)`` in the Confluent wire format, or an
:class:`EncodeProblem` for :func:`cdc_outbox.delivery.policy.on_encode_failure` to judge:

- ``invalid``: permanent for this record: the payload does not match its writer schema (the
  text is fastavro's reason), no schema exists for its event type, or the registry refused the
  schema (incompatible, invalid);
- ``unavailable``: the registry could not be asked (outage) and nothing usable is cached.

Which schema (docs/avro.md): the event's ``event_type`` is an Avro record name. A ``*.avsc``
file of ``schema_registry.schemas_dir`` whose record full name or simple name equals it is the
writer schema (registered on first use with ``auto_register``, else looked up); otherwise the
latest version of the event's subject in the registry, if its record name matches. The subject
follows ``subject_name_strategy`` (topic / record / topic_record). Resolved ``(id, schema)`` are
cached per (topic, event type): no registry round trip per event, and an outage does not stop
cached event types. A payload rejected by a registry-sourced schema re-reads the subject's
latest version (at most once per second) before failing, so a fixed schema applies without a
restart. A failed resolution is remembered for one second.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fastavro import parse_schema

from cdc_outbox.avro.registry import RegistryClient, RegistryError, RegistryUnavailable
from cdc_outbox.avro.wire import (
    AvroEncodeError,
    JsonToAvro,
    frame,
    header,
    record_names,
    subject_name,
)
from cdc_outbox.config.delivery import AvroSection
from cdc_outbox.errors import ConfigError
from cdc_outbox.records import OutboxRecord

__all__ = ["AvroSerializer", "EncodeProblem", "LocalSchema", "load_schemas_dir"]

logger = logging.getLogger(__name__)

_RECHECK_S = 1.0
_KEY_SCHEMA = '"string"'


@dataclass(frozen=True, slots=True)
class EncodeProblem:
    kind: Literal["invalid", "unavailable"]
    reason: str


@dataclass(frozen=True, slots=True)
class LocalSchema:
    name: str  # the record's full name
    text: str  # canonical-ish JSON text sent to the registry
    parsed: Any
    path: Path


@dataclass(slots=True)
class _Writer:
    schema_id: int
    parsed: Any
    subject: str
    from_registry: bool
    checked_at: float
    encode: Callable[[bytes], bytes] = field(init=False)  # framed with schema_id's header

    def __post_init__(self) -> None:
        self.encode = JsonToAvro(self.parsed, header(self.schema_id)).encode


def load_schemas_dir(directory: str) -> dict[str, LocalSchema]:
    """Record schemas of ``directory``/*.avsc by full and simple name (``ConfigError`` for an
    unreadable or invalid file, a non-record schema, or two files with the same name)."""
    out: dict[str, LocalSchema] = {}
    if not directory:
        return out
    root = Path(directory)
    if not root.is_dir():
        raise ConfigError(f"config: schema_registry.schemas_dir {directory!r} is not a directory")
    for path in sorted(root.glob("*.avsc")):
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            parsed: Any = parse_schema(raw)
        except Exception as exc:
            raise ConfigError(f"config: {path} is not a valid Avro schema: {exc}") from None
        names = record_names(parsed)
        if not names:
            raise ConfigError(f"config: {path} must hold one Avro record schema")
        local = LocalSchema(parsed["name"], json.dumps(raw, separators=(",", ":")), parsed, path)
        for name in names:
            other = out.get(name)
            if other is not None and other.name != local.name:
                raise ConfigError(f"config: {path} and {other.path} both define {name!r}")
            out[name] = local
    return out


class AvroSerializer:
    """Encodes records for one relay; see the module contract."""

    def __init__(self, section: AvroSection) -> None:
        sr = section.registry
        self.client = RegistryClient(
            sr.url, sr.basic_auth_user_info.get_secret_value(), sr.timeout_s
        )
        self.strategy = sr.subject_name_strategy
        self.auto_register = sr.auto_register
        self.values = section.values
        self.keys = section.keys
        self.local = load_schemas_dir(sr.schemas_dir)
        self._writers: dict[tuple[str, bytes], _Writer] = {}
        self._failed: dict[tuple[str, bytes], tuple[EncodeProblem, float]] = {}
        self._key_ids: dict[str, int] = {}

    def register_all(self) -> None:
        """With ``auto_register`` and the record strategy (subjects do not depend on the
        topic), register every local schema now; an outage only logs (they register later)."""
        if not (self.auto_register and self.strategy == "record"):
            return
        for schema in {s.name: s for s in self.local.values()}.values():
            subject = subject_name("record", "", schema.name)
            try:
                self.client.register(subject, schema.text)
            except (RegistryError, RegistryUnavailable) as exc:
                logger.warning("registering %s failed: %s", subject, exc)

    def encode(self, record: OutboxRecord) -> tuple[bytes, bytes | None] | EncodeProblem:
        """``(key, value)`` for Kafka, or why not (see the module contract)."""
        key: bytes = record.key
        if self.keys:
            key_id = self._key_ids.get(record.topic)
            if key_id is None:
                got = self._key_id(record.topic)
                if isinstance(got, EncodeProblem):
                    return got
                key_id = got
            key = frame(key_id, _avro_string(record.key))
        value = record.value
        if not self.values or value is None:  # a tombstone stays null
            return key, value
        headers = record.headers  # the mapper puts event_type second
        if len(headers) > 1 and headers[1][0] == "event_type":
            event_type = headers[1][1]
        else:
            event_type = _event_type(record)
        writer = self._writers.get((record.topic, event_type))
        if writer is None:
            got_w = self._resolve(record.topic, event_type)
            if isinstance(got_w, EncodeProblem):
                return got_w
            writer = got_w
        try:
            return key, writer.encode(value)
        except AvroEncodeError as exc:
            problem = EncodeProblem("invalid", str(exc))
        if writer.from_registry and self._refresh(record.topic, event_type, writer):
            return self.encode(record)
        return problem

    # -- resolution ------------------------------------------------------------------------

    def _resolve(self, topic: str, event_type: bytes) -> _Writer | EncodeProblem:
        cache_key = (topic, event_type)
        failed = self._failed.get(cache_key)
        now = time.monotonic()
        if failed is not None and now < failed[1]:
            return failed[0]
        got = self._lookup(topic, event_type.decode(errors="replace"), now)
        if isinstance(got, EncodeProblem):
            if got.kind == "invalid":
                self._failed[cache_key] = (got, now + _RECHECK_S)
            return got
        self._failed.pop(cache_key, None)
        self._writers[cache_key] = got
        return got

    def _lookup(self, topic: str, event_type: str, now: float) -> _Writer | EncodeProblem:
        local = self.local.get(event_type)
        record = local.name if local is not None else event_type
        subject = subject_name(self.strategy, topic, record)
        try:
            if local is not None:
                if self.auto_register:
                    schema_id = self.client.register(subject, local.text)
                else:
                    schema_id = self.client.lookup(subject, local.text)
                logger.info(
                    "event type %s: schema id %d (subject %s)", event_type, schema_id, subject
                )
                return _Writer(schema_id, local.parsed, subject, False, now)
            schema_id, text = self.client.latest(subject)
        except RegistryUnavailable as exc:
            return EncodeProblem("unavailable", f"no cached schema for {event_type}: {exc}")
        except RegistryError as exc:
            if exc.status == 404:
                how = "registered" if local is not None else "found"
                return EncodeProblem(
                    "invalid",
                    f"avro: no schema for event type {event_type!r} ({how} under"
                    f" subject {subject!r}: {exc.message})",
                )
            return EncodeProblem("invalid", f"avro: subject {subject!r}: {exc.message[:300]}")
        parsed = parse_schema(json.loads(text))
        if event_type not in record_names(parsed):
            return EncodeProblem(
                "invalid",
                f"avro: no schema for event type {event_type!r} (latest schema of"
                f" subject {subject!r} is not a record named so)",
            )
        logger.info("event type %s: schema id %d (subject %s)", event_type, schema_id, subject)
        return _Writer(schema_id, parsed, subject, True, now)

    def _refresh(self, topic: str, event_type: bytes, writer: _Writer) -> bool:
        """Re-read the subject's latest version; True if a different schema is now cached."""
        now = time.monotonic()
        if now < writer.checked_at + _RECHECK_S:
            return False
        writer.checked_at = now
        try:
            schema_id, text = self.client.latest(writer.subject)
        except (RegistryError, RegistryUnavailable):
            return False
        if schema_id == writer.schema_id:
            return False
        parsed = parse_schema(json.loads(text))
        if event_type.decode(errors="replace") not in record_names(parsed):
            return False
        self._writers[(topic, event_type)] = _Writer(schema_id, parsed, writer.subject, True, now)
        return True

    def _key_id(self, topic: str) -> int | EncodeProblem:
        subject = subject_name(self.strategy, topic, "string", "key")
        try:
            if self.auto_register:
                key_id = self.client.register(subject, _KEY_SCHEMA)
            else:
                key_id = self.client.lookup(subject, _KEY_SCHEMA)
        except RegistryUnavailable as exc:
            return EncodeProblem("unavailable", f"no cached key schema for {topic}: {exc}")
        except RegistryError as exc:
            return EncodeProblem("invalid", f"avro: key subject {subject!r}: {exc.message}")
        self._key_ids[topic] = key_id
        return key_id


def _event_type(record: OutboxRecord) -> bytes:
    headers = record.headers
    if len(headers) > 1 and headers[1][0] == "event_type":  # the mapper's order
        return headers[1][1]
    for name, value in headers:
        if name == "event_type":
            return value
    return b""


def _avro_string(data: bytes) -> bytes:
    """Avro binary of a string: zig-zag varint length, then the UTF-8 bytes."""
    n = len(data) << 1
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out) + data
