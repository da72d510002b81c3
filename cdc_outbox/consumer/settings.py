"""Settings of the idempotent consumer (its own small model) and the pure helpers around them.

:meth:`ConsumerSettings.from_relay` fills the defaults from the relay's settings: bootstrap
servers and ``kafka.config``, and a topic subscription derived from ``topic_template``
(``outbox.event.{aggregate_type}`` -> the regex ``^outbox\\.event\\.[A-Za-z0-9._-]+$``),
and the value format with the ``[schema_registry]`` settings.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Callable
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from cdc_outbox.config.backoff import BackoffPolicy
from cdc_outbox.config.models import SchemaRegistrySettings, check_ident, check_topic
from cdc_outbox.errors import ConfigError
from cdc_outbox.names import is_legal_topic

__all__ = [
    "DEFAULT_DEAD_LETTER_TOPIC",
    "ConsumerSettings",
    "load_handler",
    "topics_from_template",
]

DEFAULT_DEAD_LETTER_TOPIC = "cdc_outbox.consumer_dead_letter"
_FIELD_RE = re.compile(r"\{(aggregate_type|event_type)\}")


class ConsumerSettings(BaseModel):
    """Everything :class:`~cdc_outbox.consumer.IdempotentConsumer` needs besides a pool and a
    handler. ``kafka_config`` is passed to librdkafka (auto-commit cannot be turned on)."""

    model_config = ConfigDict(extra="forbid", validate_default=True, frozen=True)

    consumer_name: str = Field(min_length=1, max_length=200)
    group_id: str = Field(min_length=1, max_length=249)
    topics: tuple[str, ...] = Field(min_length=1)
    bootstrap_servers: str = Field(min_length=1)
    kafka_config: dict[str, str] = Field(default_factory=dict)
    dead_letter_topic: str = DEFAULT_DEAD_LETTER_TOPIC
    #: How values are decoded (cdc_outbox.consumer.events.decoder_for); "avro" reads the
    #: Confluent wire format with writer schemas from ``schema_registry`` (its url is needed).
    value_format: Literal["json", "avro"] = "json"
    #: The relay's ``[schema_registry]`` settings (url, basic auth, timeout) for "avro".
    schema_registry: SchemaRegistrySettings = Field(default_factory=SchemaRegistrySettings)
    #: Schema of processed_events / consumer_parked_keys.
    schema_name: str = "public"
    #: False: no processed_events row and no duplicate check (benchmark baseline only).
    dedupe: bool = True
    create_tables: bool = True
    max_attempts: int = Field(default=5, ge=1, le=100)
    retry_backoff_s: float = Field(default=0.2, gt=0, le=60)
    retry_backoff_max_s: float = Field(default=5.0, gt=0, le=300)
    commit_interval_s: float = Field(default=1.0, gt=0, le=60)
    poll_batch: int = Field(default=500, ge=1, le=100_000)

    @property
    def retry_backoff(self) -> BackoffPolicy:
        """A failing record's back-off: ``retry_backoff_s`` doubling to ``retry_backoff_max_s``."""
        return BackoffPolicy(self.retry_backoff_s, self.retry_backoff_max_s)

    @field_validator("topics")
    @classmethod
    def _topics(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for t in v:
            if not t.startswith("^") and not is_legal_topic(t):
                raise ValueError(f"topic {t!r} is not a legal Kafka topic name nor a ^regex")
        return v

    @field_validator("dead_letter_topic")
    @classmethod
    def _dlq(cls, v: str) -> str:
        return check_topic("dead_letter_topic", v)

    @field_validator("schema_name")
    @classmethod
    def _schema(cls, v: str) -> str:
        return check_ident("schema", v)

    @model_validator(mode="after")
    def _registry(self) -> ConsumerSettings:
        if self.value_format == "avro" and not self.schema_registry.url:
            raise ValueError("value_format 'avro' needs schema_registry.url")
        return self

    def kafka_consumer_config(self) -> dict[str, str]:
        return {"bootstrap.servers": self.bootstrap_servers, **self.kafka_config}

    @classmethod
    def build(cls, **values: Any) -> ConsumerSettings:
        """Validate ``values``; a problem is one ``ConfigError`` line (exit code 2)."""
        try:
            return cls(**{k: v for k, v in values.items() if v is not None})
        except ValidationError as exc:
            err = exc.errors(include_url=False)[0]
            loc = ".".join(str(p) for p in err["loc"])
            msg = (err.get("ctx") or {}).get("error", err["msg"])
            raise ConfigError(f"consumer: {loc}: {msg}" if loc else f"consumer: {msg}") from None

    @classmethod
    def from_relay(cls, relay: Any, **values: Any) -> ConsumerSettings:
        """Defaults from the relay's :class:`~cdc_outbox.config.settings.Settings` (Kafka, topics,
        ``value_format``, ``[schema_registry]``), ``values`` win (``None`` = not given)."""
        given = {k: v for k, v in values.items() if v is not None}
        given.setdefault("bootstrap_servers", relay.kafka.bootstrap_servers)
        given.setdefault("value_format", relay.value_format)
        given.setdefault("schema_registry", relay.schema_registry)
        given["kafka_config"] = {**relay.kafka.config, **given.get("kafka_config", {})}
        if not given.get("topics"):
            given["topics"] = topics_from_template(relay.topic_template)
        group = given.get("group_id") or given.get("consumer_name")
        if group is None:
            raise ConfigError("consumer: give a consumer group (--group) or --consumer-name")
        given.setdefault("group_id", group)
        given.setdefault("consumer_name", group)
        return cls.build(**given)


def topics_from_template(template: str) -> tuple[str, ...]:
    """The subscription that matches every topic ``template`` can produce."""
    if not _FIELD_RE.search(template):
        return (template,)
    prefix = template[: _FIELD_RE.search(template).start()]  # type: ignore[union-attr]
    if not prefix:
        raise ConfigError(
            f"consumer: topic_template {template!r} has no constant prefix; give --topic"
        )
    parts = _FIELD_RE.split(template)
    pattern = "".join("[A-Za-z0-9._-]+" if i % 2 else re.escape(p) for i, p in enumerate(parts))
    return (f"^{pattern}$",)


def load_handler(spec: str) -> Callable[..., Any]:
    """``"package.module:function"`` -> the function; the current directory is importable
    (like ``python -m``). Anything wrong is a one-line ``ConfigError``."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"consumer: --handler {spec!r} must look like 'module:function'")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"consumer: cannot import handler module {module_name!r}: {exc}"
        ) from None
    target: Any = module
    for part in attr.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise ConfigError(f"consumer: {module_name!r} has no attribute {attr!r}")
    if not callable(target):
        raise ConfigError(f"consumer: handler {spec!r} is not callable")
    return target  # type: ignore[no-any-return]
