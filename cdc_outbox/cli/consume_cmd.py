"""``cdc-outbox consume``: the idempotent consumer with a handler given as ``module:function``."""

from __future__ import annotations

import signal
from types import FrameType
from typing import Annotated

import typer

from cdc_outbox.cli.common import settings_from
from cdc_outbox.errors import ConfigError


def register(app: typer.Typer) -> None:
    app.command("consume")(consume)


def _kafka_config(pairs: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"consumer: --kafka-config {pair!r} must look like KEY=VALUE")
        out[key.strip()] = value
    return out


def consume(
    ctx: typer.Context,
    handler: Annotated[
        str,
        typer.Option("--handler", help="The handler, module:function; called as f(conn, event)."),
    ],
    topic: Annotated[
        list[str] | None,
        typer.Option(
            "--topic",
            help="Topic (or ^regex) to read; repeatable. Default: every topic topic_template"
            " can produce.",
        ),
    ] = None,
    group: Annotated[
        str | None,
        typer.Option("--group", help="Kafka consumer group. Default: the consumer name."),
    ] = None,
    consumer_name: Annotated[
        str | None,
        typer.Option(
            "--consumer-name",
            help="Name in processed_events. Default: the group, else the handler spec.",
        ),
    ] = None,
    dead_letter_topic: Annotated[
        str | None,
        typer.Option("--dead-letter-topic", help="Default: cdc_outbox.consumer_dead_letter."),
    ] = None,
    max_attempts: Annotated[
        int | None, typer.Option("--max-attempts", help="Handler attempts before dead-lettering.")
    ] = None,
    retry_backoff: Annotated[
        float | None, typer.Option("--retry-backoff", help="First retry delay in seconds.")
    ] = None,
    processed_schema: Annotated[
        str | None,
        typer.Option("--processed-schema", help="Schema of processed_events (default public)."),
    ] = None,
    no_dedupe: Annotated[
        bool,
        typer.Option("--no-dedupe", help="Skip processed_events (benchmark baseline only)."),
    ] = False,
    kafka_config: Annotated[
        list[str] | None,
        typer.Option("--kafka-config", help="librdkafka consumer setting KEY=VALUE; repeatable."),
    ] = None,
    value_format: Annotated[
        str | None,
        typer.Option(
            "--value-format",
            help="json or avro (Confluent wire format, schemas from the"
            " \\[schema_registry] settings). Default: the relay's value_format.",
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option("--metrics-port", help="Serve Prometheus /metrics on metrics_host:PORT."),
    ] = None,
) -> None:
    """Apply each outbox event once: handler + processed_events row in one transaction, then
    the Kafka offset (docs/consumers.md). Failing events are retried, then dead-lettered; their
    key is held. Stops cleanly on SIGTERM/SIGINT."""
    from psycopg_pool import ConnectionPool

    from cdc_outbox.consumer.loop import IdempotentConsumer
    from cdc_outbox.consumer.metrics import ConsumerMetrics, serve
    from cdc_outbox.consumer.settings import ConsumerSettings, load_handler

    relay = settings_from(ctx)
    function = load_handler(handler)
    default_name = handler.replace(":", ".")
    settings = ConsumerSettings.from_relay(
        relay,
        topics=tuple(topic) if topic else None,
        group_id=group,
        consumer_name=consumer_name or group or default_name,
        dead_letter_topic=dead_letter_topic,
        max_attempts=max_attempts,
        retry_backoff_s=retry_backoff,
        schema_name=processed_schema,
        dedupe=not no_dedupe,
        kafka_config=_kafka_config(kafka_config),
        value_format=value_format,
    )
    metrics = ConsumerMetrics(settings.consumer_name)
    if metrics_port is not None:
        serve(metrics, metrics_port, relay.metrics_host)
    pool: ConnectionPool = ConnectionPool(
        relay.postgres_dsn(), min_size=1, max_size=2, open=True, name="cdc-outbox-consumer"
    )
    consumer = IdempotentConsumer(settings, pool, function, metrics=metrics)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        consumer.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        consumer.run()
    finally:
        pool.close()
