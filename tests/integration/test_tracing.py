"""OpenTelemetry trace propagation end to end on a real PostgreSQL and Kafka.

A span started around :func:`write_event` is continued by the consumer's handler span: the
writer stores the span's W3C context in the ``tracing_span_context`` column, the relay (CDC
and polling) publishes it as a ``traceparent`` header, the consumer extracts it. An event
written outside any span gets no header and starts a trace of its own in the consumer.
With ``tracing_relay_span`` the chain is writer -> relay (a PRODUCER span) -> consumer.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from psycopg import sql
from psycopg_pool import ConnectionPool

from cdc_outbox.consumer import ConsumerSettings, Event, IdempotentConsumer
from cdc_outbox.writer import OutboxTable, write_event
from tests.support.helpers import wait_until
from tests.support.relay import init_outbox, relay_settings, running, service_thread

COLUMN = "tracingspancontext"


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    """The finished spans of this process (the global tracer provider is set only once)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()


class _Collect:
    """A handler that keeps each event's headers (thread-safe)."""

    def __init__(self) -> None:
        self.headers: dict[uuid.UUID, dict[str, bytes | None]] = {}
        self._lock = threading.Lock()

    def __call__(self, conn: psycopg.Connection[Any], event: Event) -> None:
        with self._lock:
            self.headers[event.event_id] = event.headers


def _spans_of(
    spans: InMemorySpanExporter, kind: trace.SpanKind, event_id: uuid.UUID
) -> list[ReadableSpan]:
    return [
        s
        for s in spans.get_finished_spans()
        if s.kind is kind and (s.attributes or {}).get("messaging.message.id") == str(event_id)
    ]


def _consumer_span(spans: InMemorySpanExporter, event_id: uuid.UUID) -> ReadableSpan:
    found = _spans_of(spans, trace.SpanKind.CONSUMER, event_id)
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize(
    ("mode", "relay_span"), [("cdc", False), ("polling", False), ("cdc", True), ("polling", True)]
)
def test_a_trace_started_by_the_writer_is_continued_by_the_consumer(
    pg_dsn: str,
    kafka_broker: Any,
    kafka_topic_prefix: str,
    spans: InMemorySpanExporter,
    mode: str,
    relay_span: bool,
) -> None:
    settings = relay_settings(
        pg_dsn,
        kafka_broker.bootstrap_servers,
        kafka_topic_prefix,
        mode=mode,
        columns={"tracing_span_context": COLUMN},
        tracing_relay_span=relay_span,
    )
    init_outbox(settings)  # creates the tracingspancontext column too
    table = OutboxTable(columns={"tracing_span_context": COLUMN})
    tracer = trace.get_tracer("test.writer")
    with psycopg.connect(pg_dsn) as conn:
        with tracer.start_as_current_span("place order") as writer_span:
            traced = write_event(conn, "order", 7, "OrderPlaced", {"n": 1}, table=table)
        untraced = write_event(conn, "order", 7, "OrderPaid", {"n": 2}, table=table)
        conn.commit()
        query = sql.SQL("SELECT id, {} FROM outbox").format(sql.Identifier(COLUMN))
        stored = dict(conn.execute(query).fetchall())
    writer = writer_span.get_span_context()
    assert stored[untraced] is None
    assert stored[traced] == (
        f"traceparent=00-{writer.trace_id:032x}-{writer.span_id:016x}-{writer.trace_flags:02x}"
    )

    with service_thread(settings) as service:
        wait_until(
            lambda: service.stats.events_published >= 2,
            timeout=90,
            message=lambda: f"{service.stats}",
        )
    consumer_settings = ConsumerSettings.from_relay(
        settings, group_id=f"{kafka_topic_prefix}-trace", retry_backoff_s=0.2
    )
    handler = _Collect()
    with ConnectionPool(pg_dsn, min_size=1, max_size=2) as pool:
        consumer = IdempotentConsumer(consumer_settings, pool, handler)
        with running(consumer):
            wait_until(
                lambda: consumer.metrics.counts["processed"] >= 2,
                timeout=90,
                message=lambda: f"{consumer.metrics.counts}",
            )
    assert "traceparent" not in handler.headers[untraced]
    assert not _spans_of(spans, trace.SpanKind.PRODUCER, untraced)  # no context: no relay span

    # The consumer's parent: the writer's span, or the relay's when the relay opens one.
    parent = writer
    if relay_span:
        [relay] = _spans_of(spans, trace.SpanKind.PRODUCER, traced)
        assert relay.name == f"{kafka_topic_prefix}.event.order publish"
        assert relay.parent is not None and relay.parent.is_remote
        assert (relay.parent.trace_id, relay.parent.span_id) == (writer.trace_id, writer.span_id)
        assert relay.status.is_ok and relay.end_time is not None  # ended on Kafka's ack
        assert relay.context is not None
        parent = relay.context
    expected = f"00-{parent.trace_id:032x}-{parent.span_id:016x}-{parent.trace_flags:02x}"
    assert handler.headers[traced]["traceparent"] == expected.encode()

    continued = _consumer_span(spans, traced)
    assert continued.context is not None and continued.parent is not None
    assert continued.context.trace_id == writer.trace_id
    assert continued.parent.span_id == parent.span_id
    assert continued.parent.is_remote
    fresh = _consumer_span(spans, untraced)
    assert fresh.parent is None
    assert fresh.context is not None and fresh.context.trace_id != writer.trace_id
