"""Nested settings tables: ``[columns]``, ``[kafka]``, ``[polling]``, ``[health]``,
``[schema_registry]`` and ``[eos]``.

Each model forbids unknown keys and validates its defaults;
:class:`~cdc_outbox.config.settings.Settings` composes them (see docs/configuration.md).
:func:`check_ident` and :func:`check_topic` (the SQL identifier and Kafka topic rules) are
shared with the top-level settings.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from cdc_outbox.config.backoff import BackoffPolicy
from cdc_outbox.config.columns import DEBEZIUM_COLUMNS, DEFAULT_COLUMNS
from cdc_outbox.names import IDENT_RE, is_free_header_name, is_legal_topic
from cdc_outbox.redaction import MASK, redact_kafka_config

__all__ = [
    "COLUMN_PRESETS",
    "IDENT_RE",
    "OUTBOX_KEYS",
    "TOPIC_FIELDS",
    "ColumnSettings",
    "EosSettings",
    "HealthSettings",
    "KafkaSettings",
    "OutboxSettings",
    "PollingSettings",
    "SchemaRegistrySettings",
    "check_ident",
    "check_topic",
    "check_topic_template",
]

_IDENT_RULE = "letters, digits, _ or $, not starting with a digit; max 63"

COLUMN_PRESETS: dict[str, dict[str, str | None]] = {
    name: {k: v for k, v in asdict(cols).items() if k != "header_columns"}
    for name, cols in (("default", DEFAULT_COLUMNS), ("debezium", DEBEZIUM_COLUMNS))
}


#: The column presets whose layout has the status columns.
_STATUS_LAYOUTS = frozenset({"default"})


def check_ident(what: str, value: str) -> str:
    """``value`` if it is a valid SQL identifier, else ``ValueError`` naming ``what``."""
    if not IDENT_RE.fullmatch(value):
        raise ValueError(f"{what} {value!r} is not a valid identifier ({_IDENT_RULE})")
    return value


def check_topic(what: str, value: str) -> str:
    """``value`` if it is a legal Kafka topic name, else ``ValueError`` naming ``what``."""
    if not is_legal_topic(value):
        raise ValueError(f"{what} {value!r} is not a legal Kafka topic name")
    return value


#: The fields a topic template may use.
TOPIC_FIELDS = frozenset({"aggregate_type", "event_type"})


def check_topic_template(value: str) -> str:
    """``value`` if it is a topic template giving legal Kafka topic names, else ``ValueError``."""
    import string

    try:
        names = {f for _, f, _, _ in string.Formatter().parse(value) if f is not None}
    except ValueError as exc:
        raise ValueError(f"topic_template {value!r} is not a valid template: {exc}") from None
    bad = sorted(n for n in names if n not in TOPIC_FIELDS)
    if bad:
        raise ValueError(
            f"topic_template uses unknown field(s) {', '.join(repr(b) for b in bad)}"
            f" (allowed: {', '.join(sorted(TOPIC_FIELDS))})"
        )
    if not is_legal_topic(value.format(aggregate_type="a", event_type="e")):
        raise ValueError(f"topic_template {value!r} does not give legal Kafka topic names")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class ColumnSettings(_Strict):
    """Outbox column names: a ``preset`` plus per-column overrides (overrides win).

    ``headers = ""`` means "no headers column" (the debezium preset has none).
    """

    preset: Literal["default", "debezium"] = "default"
    id: str
    aggregate_type: str
    aggregate_id: str
    event_type: str
    payload: str
    headers: str | None = None
    #: Text column of the W3C trace context the writer helper stores, e.g. Debezium's
    #: ``tracingspancontext`` (docs/consumers.md, "Trace propagation"); None (default): none.
    tracing_span_context: str | None = None
    #: A column whose values grow per aggregate in commit order (a per-aggregate version, an
    #: insert timestamp): the catch-up's order (cdc_outbox.cdc.catch_up_order). None: the
    #: layout's own (created_at in the default preset).
    sequence: str | None = None
    #: ``{header name = column}``: each row's column value is also sent in that header
    #: (Debezium's ``column:header:alias``); empty (default): none.
    header_columns: dict[str, str] = Field(default_factory=dict)

    @property
    def has_status(self) -> bool:
        """The layout keeps row states (status, attempts, ...): the default preset does, the
        Debezium preset does not. The one definition; everything else asks
        :class:`cdc_outbox.store.outbox_table.OutboxTable` (or this, inside the settings)."""
        return self.preset in _STATUS_LAYOUTS

    @model_validator(mode="before")
    @classmethod
    def _fill_from_preset(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        preset = COLUMN_PRESETS.get(str(data.get("preset", "default")), COLUMN_PRESETS["default"])
        for name, default in preset.items():
            data.setdefault(name, default)
        for optional in ("headers", "sequence", "tracing_span_context"):
            if data.get(optional) == "":
                data[optional] = None
        return data

    @field_validator(
        "id",
        "aggregate_type",
        "aggregate_id",
        "event_type",
        "payload",
        "headers",
        "sequence",
        "tracing_span_context",
    )
    @classmethod
    def _ident(cls, v: str | None, info: Any) -> str | None:
        return None if v is None else check_ident(f"columns.{info.field_name}", v)

    @field_validator("header_columns")
    @classmethod
    def _header_columns(cls, v: dict[str, str]) -> dict[str, str]:
        for header, column in v.items():
            if not is_free_header_name(header):
                raise ValueError(
                    f"columns.header_columns: header {header!r} is empty or the relay's own"
                    " (id, event_type, aggregate_type, cdc_outbox.*)"
                )
            check_ident(f"columns.header_columns.{header}", column)
        return v


#: The top-level keys that describe one outbox table; with ``[[outboxes]]`` they are refused
#: (each entry has its own), without it they are the one entry.
OUTBOX_KEYS = {
    "outbox_schema": "schema",
    "outbox_table": "table",
    "columns": "columns",
    "topic_template": "topic_template",
    "cdc_mark_published": "cdc_mark_published",
    "cloudevents_source": "cloudevents_source",
}


class OutboxSettings(_Strict):
    """One outbox table (an ``[[outboxes]]`` entry, or the single-table top-level keys).

    Keys: ``schema``, ``table``, ``[columns]``, ``topic_template``, ``cdc_mark_published`` and
    ``cloudevents_source``, with the top-level keys' meanings and defaults. A layout without
    status columns never keeps ``cdc_mark_published = "update"``: left unset it becomes
    ``"off"``, set explicitly it is refused.
    """

    model_config = ConfigDict(extra="forbid", validate_default=True, populate_by_name=True)

    schema_name: str = Field(default="public", alias="schema")
    table: str = "outbox"
    columns: ColumnSettings = Field(default_factory=lambda: ColumnSettings.model_validate({}))
    topic_template: str = "outbox.event.{aggregate_type}"
    #: after Kafka acknowledges an event: mark its row PUBLISHED, delete it, or leave it.
    cdc_mark_published: Literal["update", "delete", "off"] = "update"
    #: The CloudEvents ``source``; empty: ``cdc-outbox/<database>/<schema>.<table>``.
    cloudevents_source: str = ""

    @field_validator("schema_name", "table")
    @classmethod
    def _ident(cls, v: str, info: Any) -> str:
        return check_ident("schema" if info.field_name == "schema_name" else "table", v)

    @field_validator("topic_template")
    @classmethod
    def _template(cls, v: str) -> str:
        return check_topic_template(v)

    @model_validator(mode="after")
    def _marking_fits_layout(self) -> OutboxSettings:
        if not self.columns.has_status and self.cdc_mark_published == "update":
            if "cdc_mark_published" in self.model_fields_set:
                raise ValueError(
                    f'{self.name}: cdc_mark_published = "update" needs a status column; the'
                    f' {self.columns.preset} preset has none: use "delete" or "off"'
                )
            self.cdc_mark_published = "off"
        return self

    @property
    def name(self) -> str:
        """``schema.table``: how messages, labels and ``--table`` name this outbox."""
        return f"{self.schema_name}.{self.table}"


def _dotted(table: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of a nested table: ``CDC_OUTBOX_KAFKA__CONFIG__SASL__PASSWORD``
    arrives as ``{"sasl": {"password": ...}}`` and means ``sasl.password``."""
    for key, value in table.items():
        if isinstance(value, Mapping):
            yield from _dotted(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


class KafkaSettings(_Strict):
    """Kafka producer settings; ``config`` is passed through to librdkafka verbatim."""

    bootstrap_servers: str = "127.0.0.1:9092"
    config: dict[str, str] = Field(default_factory=dict)

    @field_validator("config", mode="before")
    @classmethod
    def _stringify(cls, v: Any) -> Any:
        if not isinstance(v, Mapping):
            return v
        out: dict[str, Any] = {}
        for key, value in _dotted(v):
            if isinstance(value, bool):
                value = "true" if value else "false"
            elif isinstance(value, int | float):
                value = str(value)
            out[str(key)] = value
        return out

    @field_validator("config")
    @classmethod
    def _no_bootstrap(cls, v: dict[str, str]) -> dict[str, str]:
        if "bootstrap.servers" in v:
            raise ValueError("set kafka.bootstrap_servers, not kafka.config 'bootstrap.servers'")
        return v

    @field_validator("bootstrap_servers")
    @classmethod
    def _nonempty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("kafka.bootstrap_servers must not be empty")
        return v

    def redacted_config(self) -> dict[str, str]:
        """``config`` with secret-looking values replaced by ``***``."""
        return redact_kafka_config(self.config)

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        yield "bootstrap_servers", self.bootstrap_servers
        yield "config", self.redacted_config()


class PollingSettings(_Strict):
    """Polling relay (fallback mode) tuning."""

    batch_size: int = Field(default=500, gt=0)
    poll_interval_s: float = Field(default=0.5, gt=0)
    max_attempts: int = Field(default=10, ge=1)
    lease_s: float = Field(default=60.0, gt=0)
    backoff_base_s: float = Field(default=1.0, gt=0)
    backoff_max_s: float = Field(default=300.0, gt=0)

    @model_validator(mode="after")
    def _backoff_order(self) -> PollingSettings:
        if self.backoff_max_s < self.backoff_base_s:
            raise ValueError("polling.backoff_max_s must be >= polling.backoff_base_s")
        return self

    @property
    def backoff(self) -> BackoffPolicy:
        """A retried row's back-off: ``backoff_base_s`` doubling up to ``backoff_max_s``."""
        return BackoffPolicy(self.backoff_base_s, self.backoff_max_s)


class HealthSettings(_Strict):
    """Liveness (``/healthz``) and readiness (``/readyz``) of the metrics endpoint."""

    #: Seconds between the background readiness checks (PostgreSQL ``SELECT 1``, Kafka
    #: metadata); each check gives up after ``check_timeout_s``.
    check_interval_s: float = Field(default=2.0, gt=0, le=60)
    check_timeout_s: float = Field(default=2.0, gt=0, le=30)
    #: ``/healthz`` fails once the main loop has not turned for this long.
    loop_stale_s: float = Field(default=60.0, ge=5, le=3600)


class SchemaRegistrySettings(_Strict):
    """Where Avro writer schemas come from (``value_format = "avro"``; docs/avro.md).

    ``url`` is a Confluent-compatible API base (e.g. Apicurio's ``.../apis/ccompat/v7``);
    ``basic_auth_user_info`` (``user:password``) is a secret: never shown or logged.
    ``schemas_dir`` holds ``*.avsc`` files, one record schema each; with ``auto_register`` they
    are registered under the subject the ``subject_name_strategy`` gives.
    """

    url: str = ""
    basic_auth_user_info: SecretStr = SecretStr("")
    schemas_dir: str = ""
    auto_register: bool = False
    subject_name_strategy: Literal["topic", "record", "topic_record"] = "topic"
    #: HTTP timeout of one registry request; a registry that does not answer is an outage.
    timeout_s: float = Field(default=5.0, gt=0, le=120)

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        v = v.strip().rstrip("/")
        if v and not v.startswith(("http://", "https://")):
            raise ValueError(f"schema_registry.url {v!r} must start with http:// or https://")
        return v

    def redacted(self) -> dict[str, Any]:
        data = self.model_dump(mode="python")
        data["basic_auth_user_info"] = MASK if self.basic_auth_user_info.get_secret_value() else ""
        return data


class EosSettings(_Strict):
    """Exactly-once delivery (``delivery = "exactly_once"``): Kafka transactions."""

    #: ``transactional.id`` of the producer; empty: ``cdc-outbox.<system id>.<database>.<slot>``.
    #: Two relays with the same id fence each other: the newer one wins.
    transactional_id: str = ""
    #: A Kafka transaction is committed at the latest this long after its first event (at a
    #: PostgreSQL transaction boundary) ...
    commit_interval_ms: int = Field(default=100, ge=1, le=60_000)
    #: ... and, once the relay has caught up with the WAL, at once, but no sooner than this.
    min_commit_interval_ms: int = Field(default=0, ge=0, le=60_000)
    #: ... or once it holds this many events (a PostgreSQL transaction is never split).
    max_events: int = Field(default=10_000, ge=1)
    #: Compacted topic of the checkpoint records (created if missing).
    checkpoint_topic: str = "cdc_outbox.checkpoints"
    #: librdkafka ``transaction.timeout.ms``: the broker aborts a transaction open longer than
    #: this, so it must cover the largest PostgreSQL transaction (at most the broker's
    #: ``transaction.max.timeout.ms``, 15 min by default).
    transaction_timeout_ms: int = Field(default=600_000, ge=1_000)

    @field_validator("checkpoint_topic")
    @classmethod
    def _topic(cls, v: str) -> str:
        return check_topic("eos.checkpoint_topic", v)
