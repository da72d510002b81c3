"""OpenTelemetry trace propagation through the outbox (optional: the ``otel`` extra).

The trace context travels as W3C Trace Context (``traceparent``, ``tracestate``):

* the writer stores the current span's context in the outbox row's ``tracing_span_context``
  column (Debezium's ``tracingspancontext`` convention) as properties-style text, one
  ``name=value`` per line: ``traceparent=00-<trace id>-<span id>-<flags>`` and, if not
  empty, ``tracestate=...`` with ``\\`` escaped as ``\\\\`` (Java ``Properties`` text, as
  Debezium writes it; :func:`current_span_context`, :func:`format_span_context`);
* the relay turns that text into Kafka headers ``traceparent`` / ``tracestate``
  (:func:`span_context_headers`, pure); with ``tracing_relay_span = true`` it also opens a
  PRODUCER span ``"<topic> publish"`` per such record, a child of the writer's span ended
  when Kafka reports the record, and the headers then carry that span (:class:`RelaySpans`);
* the consumer runs the handler inside a CONSUMER span whose parent is the context of those
  headers (:func:`handler_span`).

Without ``opentelemetry-api`` installed the writer stores nothing and the consumer opens no
span; the relay needs no OpenTelemetry unless ``tracing_relay_span`` is on. Only stdlib is
imported at module level.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Protocol

__all__ = [
    "RelaySpans",
    "current_span_context",
    "format_span_context",
    "handler_span",
    "handler_span_wanted",
    "span_context_headers",
    "tracer_provider_set",
]

#: W3C traceparent: version 00 (lowercase hex), trace id, parent span id, flags.
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
_FIELDS = ("traceparent", "tracestate")
#: Java Properties escapes (Debezium writes the column with ``Properties.store``).
_ESCAPE = re.compile(r"\\(.)")


def format_span_context(carrier: Mapping[str, str]) -> str | None:
    """The column text of a W3C carrier (``traceparent`` required), or None."""
    traceparent = carrier.get("traceparent", "")
    if not _TRACEPARENT.fullmatch(traceparent):
        return None
    lines = [f"traceparent={traceparent}"]
    tracestate = carrier.get("tracestate", "").strip()
    if tracestate and "\n" not in tracestate:
        escaped = tracestate.replace("\\", "\\\\")  # read back as Properties text
        lines.append(f"tracestate={escaped}")
    return "\n".join(lines)


def span_context_headers(text: bytes) -> tuple[tuple[str, bytes], ...]:
    """Kafka headers from a ``tracing_span_context`` column value (pure, never raises).

    Accepts properties-style text (``traceparent=...``; ``#`` comment lines and Java escapes
    as ``Properties.store`` writes them) or a bare traceparent. A missing or malformed
    traceparent gives no headers at all: tracing never dead-letters an event.
    """
    try:
        decoded = text.decode()
    except UnicodeDecodeError:
        return ()
    found: dict[str, str] = {}
    for raw in decoded.splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        name, sep, value = line.partition("=")
        if not sep:
            name, value = "traceparent", line
        name = name.strip()
        if name in _FIELDS and name not in found:
            found[name] = _ESCAPE.sub(r"\1", value.strip())
    traceparent = found.get("traceparent", "")
    if not _TRACEPARENT.fullmatch(traceparent):
        return ()
    out = [("traceparent", traceparent.encode())]
    if found.get("tracestate"):
        out.append(("tracestate", found["tracestate"].encode()))
    return tuple(out)


def current_span_context() -> str | None:
    """The column text of the current span's context; None without ``opentelemetry-api``
    or without a valid current span."""
    try:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        return None
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)  # writes nothing for an invalid span
    return format_span_context(carrier)


def tracer_provider_set() -> bool:
    """Whether opentelemetry is installed and a tracer provider is set (a span can be
    recorded). For :func:`handler_span_wanted`; asking costs about as much as a record's
    JSON parse, so a consumer asks once per batch, not per record."""
    try:
        from opentelemetry import trace
    except ImportError:
        return False
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def handler_span_wanted(headers: Mapping[str, bytes | None], provider_set: bool) -> bool:
    """Whether :func:`handler_span` would change anything for a record with ``headers``
    (``provider_set``: :func:`tracer_provider_set`): a provider is set, or the record has a
    ``traceparent`` (a no-op tracer still hands its context to the handler as the current
    span). Otherwise the span would be the invalid no-op span, as if none were open, and
    the caller may run the handler without it (about 100,000 CPU instructions less)."""
    return provider_set or "traceparent" in headers


@contextlib.contextmanager
def handler_span(
    headers: Iterable[tuple[str, bytes | None]], topic: str, attributes: Mapping[str, Any]
) -> Iterator[None]:
    """Run the body in a CONSUMER span ``"<topic> process"`` continuing the trace of the
    record's ``traceparent``/``tracestate`` headers (a new trace without them); does nothing
    without ``opentelemetry-api``. An exception of the body is recorded on the span."""
    try:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        yield
        return
    carrier: dict[str, str] = {}
    for name, value in headers:
        if name in _FIELDS and value is not None and name not in carrier:
            with contextlib.suppress(UnicodeDecodeError):
                carrier[name] = value.decode()
    parent = TraceContextTextMapPropagator().extract(carrier)
    tracer = trace.get_tracer("cdc_outbox.consumer")
    with tracer.start_as_current_span(
        f"{topic} process", context=parent, kind=trace.SpanKind.CONSUMER, attributes=attributes
    ):
        yield


class _Listener(Protocol):
    """A delivery listener (cdc_outbox.kafka.publisher.DeliveryListener)."""

    def delivered(self, topic: str, headers: Any) -> None: ...

    def failed(self, failure: Any) -> None: ...


class _SpanListener:
    """Ends the relay span when Kafka reports the record, then passes the report on."""

    __slots__ = ("inner", "span", "spans")

    def __init__(self, inner: _Listener, span: Any, spans: RelaySpans) -> None:
        self.inner = inner
        self.span = span
        self.spans = spans

    @property
    def txn(self) -> Any:
        """The wrapped listener's transaction stamp (exactly-once), if it takes one."""
        return getattr(self.inner, "txn", None)

    @txn.setter
    def txn(self, value: Any) -> None:
        if hasattr(self.inner, "txn"):
            self.inner.txn = value

    def delivered(self, topic: str, headers: Any) -> None:
        self.span.end()
        self.inner.delivered(topic, headers)

    def failed(self, failure: Any) -> None:
        self.spans.end_failed(self.span, str(getattr(failure, "reason", failure)))
        self.inner.failed(failure)


class RelaySpans:
    """The relay hop's PRODUCER spans (setting ``tracing_relay_span``; needs
    ``opentelemetry-api``, whose tracer provider decides whether they are recorded).

    :meth:`start` takes a record's headers and delivery listener: a record without a valid
    ``traceparent`` is returned unchanged (no span); otherwise a span ``"<topic> publish"``
    starts as a child of that context, the ``traceparent``/``tracestate`` headers are replaced
    (in place) by the span's own context, so the consumer's span is its child, and the
    listener ends the span on Kafka's report (an error status on a failed delivery).
    """

    def __init__(self, tracer_provider: Any = None) -> None:
        """``tracer_provider``: the global one by default (set by the application)."""
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._trace = trace
        self._tracer = trace.get_tracer("cdc_outbox.relay", tracer_provider=tracer_provider)
        self._propagator = TraceContextTextMapPropagator()

    def start(
        self, topic: str, event_id: str, headers: list[tuple[str, bytes]], listener: _Listener
    ) -> tuple[list[tuple[str, bytes]], _Listener]:
        """(headers, listener) to produce the record with (see the class contract)."""
        carrier: dict[str, str] = {}
        first = -1
        for i, (name, value) in enumerate(headers):
            if name in _FIELDS and name not in carrier:
                first = i if first < 0 else first
                carrier[name] = value.decode(errors="replace")
        if not _TRACEPARENT.fullmatch(carrier.get("traceparent", "")):
            return headers, listener
        trace = self._trace
        span = self._tracer.start_span(
            f"{topic} publish",
            context=self._propagator.extract(carrier),
            kind=trace.SpanKind.PRODUCER,
            attributes={
                "messaging.system": "kafka",
                "messaging.operation.type": "send",
                "messaging.operation.name": "publish",
                "messaging.destination.name": topic,
                "messaging.message.id": event_id,
            },
        )
        injected: dict[str, str] = {}
        self._propagator.inject(injected, context=trace.set_span_in_context(span))
        out = [h for h in headers if h[0] not in _FIELDS]
        out[first:first] = [(k, v.encode()) for k, v in injected.items() if k in _FIELDS]
        return out, _SpanListener(listener, span, self)

    def end_failed(self, span: Any, reason: str) -> None:
        """End ``span`` with an error status (Kafka did not take the record)."""
        span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, reason))
        span.end()
