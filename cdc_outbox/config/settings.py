"""Settings: defaults < TOML file < ``CDC_OUTBOX_*`` environment < command-line flags.

Use :func:`load_settings`; it raises :class:`~cdc_outbox.errors.ConfigError` with one line
(``config: ...``) for every invalid input, unknown keys included (TOML keys and
``CDC_OUTBOX_*`` variables alike).

Secrets: ``Settings.dsn`` is a ``SecretStr`` so a settings object can be printed or logged
safely; code that connects calls :meth:`Settings.postgres_dsn` (the real conninfo) and
:meth:`Settings.kafka_config` (the full librdkafka dict). :meth:`Settings.redacted` is the
display form (DSN password and secret-looking Kafka keys shown as ``***``). The nested tables
live in :mod:`cdc_outbox.config.models`, the secret helpers in :mod:`cdc_outbox.redaction`;
both are re-exported here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal, cast

from pydantic import (
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from cdc_outbox.config.columns import ColumnNames
from cdc_outbox.config.combinations import check_combination
from cdc_outbox.config.input import (
    ENV_ALLOWED,
    ENV_ALLOWED_PREFIXES,
    ENV_PREFIX,
    check_env,
    check_toml,
    describe,
    parse_standby_names,
)
from cdc_outbox.config.models import (
    COLUMN_PRESETS,
    IDENT_RE,
    OUTBOX_KEYS,
    TOPIC_FIELDS,
    ColumnSettings,
    EosSettings,
    HealthSettings,
    KafkaSettings,
    OutboxSettings,
    PollingSettings,
    SchemaRegistrySettings,
    check_ident,
    check_topic,
    check_topic_template,
)
from cdc_outbox.errors import ConfigError
from cdc_outbox.redaction import (
    KAFKA_SECRET_MARKERS,
    MASK,
    dsn_password,
    is_secret_kafka_key,
    redact_dsn,
    validate_dsn,
)

__all__ = [
    "COLUMN_PRESETS",
    "ENV_ALLOWED",
    "ENV_ALLOWED_PREFIXES",
    "ENV_PREFIX",
    "IDENT_RE",
    "KAFKA_SECRET_MARKERS",
    "MASK",
    "SLOT_RE",
    "TOPIC_FIELDS",
    "WAL_SENDER_TIMEOUT_DEFAULT_S",
    "ColumnSettings",
    "EosSettings",
    "HealthSettings",
    "KafkaSettings",
    "OutboxSettings",
    "PollingSettings",
    "SchemaRegistrySettings",
    "Settings",
    "dsn_password",
    "is_secret_kafka_key",
    "load_settings",
    "redact_dsn",
    "validate_dsn",
]

#: ``wal_sender_timeout`` default; the relay must report status well within it.
WAL_SENDER_TIMEOUT_DEFAULT_S = 60.0

SLOT_RE = re.compile(r"^[a-z0-9_]{1,63}$")
_SLOT_RULE = "lowercase letters, digits, underscore; max 63"

_toml_path: ContextVar[Path | None] = ContextVar("cdc_outbox_toml_path", default=None)


class Settings(BaseSettings):
    """All cdc-outbox settings (see docs/configuration.md for every key)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
        case_sensitive=False,
    )

    dsn: SecretStr = SecretStr("")
    slot_name: str = "cdc_outbox"
    #: create the slot with ``failover = true`` on PostgreSQL 17+ (synchronized to standbys
    #: that run ``sync_replication_slots``); ignored, with an INFO line, on older servers.
    slot_failover: bool = True
    publication_name: str = "cdc_outbox_pub"
    outbox_schema: str = "public"
    outbox_table: str = "outbox"
    columns: ColumnSettings = Field(default_factory=lambda: ColumnSettings.model_validate({}))
    topic_template: str = "outbox.event.{aggregate_type}"
    dead_letter_topic: str = "cdc_outbox.dead_letter"
    on_permanent_error: Literal["dead_letter", "halt"] = "dead_letter"
    #: a NULL payload: dead-letter the event, or publish a tombstone (its key, value null).
    null_payload: Literal["dead_letter", "tombstone"] = "dead_letter"
    #: table-less events: the prefix of the transactional logical messages (None: off).
    message_prefix: str | None = None
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    status_interval_s: float = Field(default=10.0, gt=0, lt=WAL_SENDER_TIMEOUT_DEFAULT_S)
    shutdown_grace_s: float = Field(default=30.0, ge=0)
    max_in_flight: int = Field(default=50_000, gt=0)
    #: CDC: hand a transaction to Kafka only once one of these physical standbys (comma-
    #: separated application_names, or "*": any) flushed its commit (pg_stat_replication).
    wait_for_standbys: str = ""
    mode: Literal["auto", "cdc", "polling"] = "auto"
    #: exactly_once: Kafka transactions in CDC streaming and catch-up (polling: at-least-once).
    delivery: Literal["at_least_once", "exactly_once"] = "at_least_once"
    eos: EosSettings = Field(default_factory=EosSettings)
    #: CDC housekeeping: after Kafka acknowledges an event, mark its row PUBLISHED ("update"),
    #: delete it ("delete") or leave it ("off"; a later polling pass would republish it).
    cdc_mark_published: Literal["update", "delete", "off"] = "update"
    #: auto mode: seconds between checks whether CDC is usable again while polling.
    cdc_probe_interval_s: float = Field(30.0, gt=0)
    #: auto mode: consecutive replication connection failures before falling back to polling.
    cdc_max_failures: int = Field(5, ge=1)
    polling: PollingSettings = Field(default_factory=PollingSettings)
    #: Single active instance: a leader that cannot renew its lease for this long is replaced
    #: by a standby (which ends the old leader's sessions); the leader stops itself first.
    leader_lease_s: float = Field(default=5.0, ge=1.0, le=300.0)
    #: Records larger than this (key + value + headers) are dead-lettered before they reach
    #: Kafka; keep it at or below the topics' max.message.bytes.
    max_record_bytes: int = Field(default=1_000_000, ge=1024)
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(default=9077, ge=0, le=65535)
    monitor_interval_s: float = Field(default=5.0, gt=0, le=3600)
    heartbeat_interval_s: float = Field(default=0.0, ge=0, le=3600)
    #: Connections the process-wide pool (cdc_outbox.store.db_pool) may hold: probes, phase
    #: reads/writes, housekeeping, monitor, heartbeat and readiness check borrow from it.
    db_pool_max_size: int = Field(default=4, ge=1, le=32)
    health: HealthSettings = Field(default_factory=HealthSettings)
    #: Record values: the payload as is ("json") or Avro in the Confluent wire format.
    value_format: Literal["json", "avro"] = "json"
    key_format: Literal["string", "avro"] = "string"
    #: Publish in the CloudEvents Kafka binding: "binary" (ce_* headers, the payload as value)
    #: or "structured" (a JSON envelope); needs the cloudevents extra (docs/cloudevents.md).
    cloudevents: Literal["off", "binary", "structured"] = "off"
    #: The CloudEvents ``source``; empty: ``cdc-outbox/<database>/<schema>.<table>``.
    cloudevents_source: str = ""
    #: Several outbox tables through one slot (``[[outboxes]]``, :class:`OutboxSettings`);
    #: empty: the single-table keys above are the one entry (see :meth:`outbox_settings`).
    outboxes: list[OutboxSettings] = Field(default_factory=list)
    #: The last single-table entry and the values it was built from (:meth:`_single_outbox`).
    _single: tuple[tuple[Any, ...], OutboxSettings] | None = PrivateAttr(default=None)
    schema_registry: SchemaRegistrySettings = Field(default_factory=SchemaRegistrySettings)
    log_format: Literal["text", "json"] = "text"
    log_level: str = "INFO"
    #: A PRODUCER span per traced record for the relay hop (telemetry.tracing.RelaySpans).
    tracing_relay_span: bool = False

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = _toml_path.get()
        if path is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=path))
        return tuple(sources)

    @field_validator("dsn")
    @classmethod
    def _dsn(cls, v: SecretStr) -> SecretStr:
        validate_dsn(v.get_secret_value())
        return v

    @field_validator("wait_for_standbys")
    @classmethod
    def _standbys(cls, v: str) -> str:
        v = v.strip()
        if v:
            parse_standby_names(v)
        return v

    @field_validator("slot_name")
    @classmethod
    def _slot(cls, v: str) -> str:
        if not SLOT_RE.fullmatch(v):
            raise ValueError(f"slot_name {v!r} is not a valid identifier ({_SLOT_RULE})")
        return v

    @field_validator("publication_name", "outbox_schema", "outbox_table")
    @classmethod
    def _ident(cls, v: str, info: Any) -> str:
        return check_ident(str(info.field_name), v)

    @field_validator("topic_template")
    @classmethod
    def _template(cls, v: str) -> str:
        return check_topic_template(v)

    @field_validator("dead_letter_topic")
    @classmethod
    def _topic(cls, v: str) -> str:
        return check_topic("dead_letter_topic", v)

    @field_validator("message_prefix")
    @classmethod
    def _message_prefix(cls, v: str | None) -> str | None:
        if v is not None and (not v or v.startswith("cdc_outbox.")):
            raise ValueError(
                f"message_prefix {v!r}: not empty, not under the relay's 'cdc_outbox.'"
            )
        return v

    @field_validator("log_level")
    @classmethod
    def _level(cls, v: str) -> str:
        level = v.strip().upper()
        if level not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
            raise ValueError(
                f"log_level {v!r} must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL"
            )
        return level

    @model_validator(mode="after")
    def _safe_combination(self) -> Settings:
        """Refuse combinations the relay cannot honour (one line each, exit 2): the rules of
        :func:`cdc_outbox.config.combinations.check_combination`."""
        if (resolved := check_combination(self, self.model_fields_set)) != self.on_permanent_error:
            self.on_permanent_error = resolved
        return self

    def _single_outbox(self) -> OutboxSettings:
        """The single-table keys as one :class:`OutboxSettings` (``ValueError`` if invalid);
        validated once per set of values (a ``model_copy`` with other values builds anew)."""
        marking = self.cdc_mark_published if "cdc_mark_published" in self.model_fields_set else None
        key = (self.outbox_schema, self.outbox_table, self.columns, self.topic_template,
               self.cloudevents_source, marking)  # fmt: skip
        private = self.__pydantic_private__ or {}
        cached = private.get("_single")
        if cached is not None and cached[0] == key:
            return cast(OutboxSettings, cached[1])
        entry: dict[str, Any] = {OUTBOX_KEYS[k]: getattr(self, k) for k in OUTBOX_KEYS}
        if marking is None:
            del entry["cdc_mark_published"]  # unset: the layout's default
        try:
            single = OutboxSettings.model_validate(entry)
        except ValidationError as exc:
            raise ValueError(describe(exc).removeprefix("config: ")) from None
        self._single = (key, single)
        return single

    def _check_outboxes(self, explicit: set[str]) -> None:
        """The single-table keys are refused beside ``[[outboxes]]``; names must differ."""
        if not self.outboxes:
            single = self._single_outbox()
            if self.cdc_mark_published != single.cdc_mark_published:
                self.cdc_mark_published = single.cdc_mark_published
            return
        given = sorted(k for k in OUTBOX_KEYS if k in explicit)
        if given:
            raise ValueError(
                f"[[outboxes]] replaces the single-table key(s) {', '.join(given)}:"
                " set them in each entry"
            )
        seen: set[str] = set()
        for o in self.outboxes:
            if o.name in seen:
                raise ValueError(f"[[outboxes]]: {o.name} is listed twice")
            seen.add(o.name)

    # -- helpers used by the rest of the package ---------------------------------------

    def outbox_settings(self) -> tuple[OutboxSettings, ...]:
        """Every outbox table, in configuration order (never empty): the ``[[outboxes]]``
        entries, or the single-table keys as one. Derived at each call, so a ``model_copy``
        of the single-table keys is seen; read this, never ``outboxes`` itself."""
        return tuple(self.outboxes) if self.outboxes else (self._single_outbox(),)

    def outbox(self, name: str | None = None) -> OutboxSettings:
        """The outbox named ``schema.table`` (None: the first; table-less events map with
        it). ``ConfigError`` names the configured ones when ``name`` is not one of them."""
        entries = self.outbox_settings()
        if name is None:
            return entries[0]
        for o in entries:
            if o.name == name:
                return o
        known = ", ".join(o.name for o in entries)
        raise ConfigError(f"config: no outbox {name!r} is configured (configured: {known})")

    def postgres_dsn(self) -> str:
        """The real conninfo string / URI, for psycopg. Never log it."""
        return self.dsn.get_secret_value()

    def kafka_config(self) -> dict[str, str]:
        """Complete librdkafka config: ``bootstrap.servers`` plus the passthrough keys."""
        return {"bootstrap.servers": self.kafka.bootstrap_servers, **self.kafka.config}

    def column_names(self, outbox: OutboxSettings | None = None) -> ColumnNames:
        """The resolved column names (preset + overrides) of ``outbox`` (None: the first)."""
        c = (outbox or self.outbox()).columns
        return ColumnNames(
            id=c.id,
            aggregate_type=c.aggregate_type,
            aggregate_id=c.aggregate_id,
            event_type=c.event_type,
            payload=c.payload,
            headers=c.headers,
            tracing_span_context=c.tracing_span_context,
            header_columns=tuple(c.header_columns.items()),
        )

    def redacted(self) -> dict[str, Any]:
        """Plain-data view safe to print or log (secrets replaced by ``***``)."""
        data = self.model_dump(mode="python")
        data["dsn"] = redact_dsn(self.postgres_dsn())
        data["kafka"]["config"] = self.kafka.redacted_config()
        data["schema_registry"] = self.schema_registry.redacted()
        return data

    def secret_values(self) -> list[str]:
        """Every secret string in these settings (for scrubbing error text and logs)."""
        out: list[str] = []
        password = dsn_password(self.postgres_dsn())
        if password:
            out.append(password)
        out.extend(v for k, v in self.kafka.config.items() if is_secret_kafka_key(k) and v)
        auth = self.schema_registry.basic_auth_user_info.get_secret_value()
        if auth:
            out.extend({auth, auth.partition(":")[2]} - {""})
        return out

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        for name, value in super().__repr_args__():
            yield name, (redact_dsn(self.postgres_dsn()) if name == "dsn" else value)


# -- loading -------------------------------------------------------------------------------


def load_settings(
    config_file: Path | None = None, overrides: Mapping[str, Any] | None = None
) -> Settings:
    """Build :class:`Settings`; precedence: ``overrides`` > env > TOML > defaults.

    ``config_file`` defaults to ``$CDC_OUTBOX_CONFIG``; ``None`` values in ``overrides`` are
    ignored (an absent flag). Raises ``ConfigError`` with a single ``config: ...`` line.
    """
    if config_file is None and os.environ.get(f"{ENV_PREFIX}CONFIG"):
        config_file = Path(os.environ[f"{ENV_PREFIX}CONFIG"])
    if config_file is not None:
        check_toml(config_file, Settings)
    check_env(os.environ, Settings)
    kwargs = {k: v for k, v in (overrides or {}).items() if v is not None}
    token = _toml_path.set(config_file)
    try:
        return Settings(**kwargs)
    except ValidationError as exc:
        raise ConfigError(describe(exc)) from None
    except SettingsError as exc:  # e.g. a CDC_OUTBOX_KAFKA value that is not JSON
        raise ConfigError(f"config: {exc}") from None
    finally:
        _toml_path.reset(token)
