"""The pure parts of trace propagation: column text, relay headers, writer and mapper rules."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from cdc_outbox.config.settings import Settings
from cdc_outbox.mapping.rows import OutboxMapper
from cdc_outbox.records import OutboxRecord
from cdc_outbox.telemetry.tracing import (
    RelaySpans,
    current_span_context,
    format_span_context,
    handler_span,
    span_context_headers,
)
from cdc_outbox.writer import OutboxTable, prepare

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
DSN = "host=localhost dbname=x"
COLUMNS = {"tracing_span_context": "tracingspancontext"}


@pytest.mark.parametrize(
    ("text", "headers"),
    [
        (f"traceparent={TP}", [("traceparent", TP)]),
        (TP, [("traceparent", TP)]),  # a bare traceparent
        (f"traceparent={TP}\ntracestate=congo=t61,rojo=00f", [
            ("traceparent", TP), ("tracestate", "congo=t61,rojo=00f")
        ]),
        # Java Properties.store, as Debezium's ActivateTracingSpan writes the column
        (f"#Mon Jan 01 00:00:00 UTC 2024\r\ntracestate=congo\\=t61\r\ntraceparent={TP}\r\n", [
            ("traceparent", TP), ("tracestate", "congo=t61")
        ]),
        (f"traceparent={TP}\ntracestate=", [("traceparent", TP)]),
        ("", []),
        ("tracestate=congo=t61", []),  # no traceparent: no headers at all
        ("traceparent=00-xyz-b7ad6b7169203331-01", []),
        (f"traceparent={TP.upper()}", []),  # W3C: lowercase hex only
        ("\xff", []),
    ],
)  # fmt: skip
def test_column_text_becomes_w3c_headers(text: str, headers: list[tuple[str, str]]) -> None:
    raw = text.encode("latin-1") if text == "\xff" else text.encode()
    assert span_context_headers(raw) == tuple((k, v.encode()) for k, v in headers)


_HEX = "0123456789abcdef"
_traceparents = st.builds(
    lambda t, s, f: f"00-{t}-{s}-{f}",
    st.text(_HEX, min_size=32, max_size=32),
    st.text(_HEX, min_size=16, max_size=16),
    st.text(_HEX, min_size=2, max_size=2),
)
_tracestates = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=80)


@given(_traceparents, _tracestates)
def test_what_the_writer_stores_the_relay_carries(traceparent: str, tracestate: str) -> None:
    text = format_span_context({"traceparent": traceparent, "tracestate": tracestate})
    assert text is not None
    expected = [("traceparent", traceparent.encode())]
    if tracestate:
        expected.append(("tracestate", tracestate.encode()))
    assert span_context_headers(text.encode()) == tuple(expected)


@given(st.binary(max_size=300))
def test_any_column_value_gives_headers_or_none_never_an_error(raw: bytes) -> None:
    headers = span_context_headers(raw)
    assert [k for k, _ in headers] in ([], ["traceparent"], ["traceparent", "tracestate"])


def test_no_valid_traceparent_is_no_column_text() -> None:
    assert format_span_context({}) is None
    assert format_span_context({"traceparent": "garbage", "tracestate": "a=b"}) is None


def _prepare(table: OutboxTable) -> tuple[str, tuple[Any, ...]]:
    query, params, _ = prepare(table, "order", 1, "Placed", {}, None, None)
    return query.as_string(None), params


def test_the_writer_stores_the_current_span_only_in_a_named_column() -> None:
    tracer = TracerProvider().get_tracer("test")
    with_column = OutboxTable(columns=COLUMNS)
    sql, params = _prepare(with_column)
    assert "tracingspancontext" not in sql and len(params) == 5  # no current span
    with tracer.start_as_current_span("write") as span:
        ctx = span.get_span_context()
        sql, params = _prepare(with_column)
        plain_sql, plain_params = _prepare(OutboxTable())
    assert '"tracingspancontext"' in sql
    expected = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"
    assert params[-1] == f"traceparent={expected}"
    assert "tracingspancontext" not in plain_sql and len(plain_params) == 5
    assert not trace.get_current_span().get_span_context().is_valid


@pytest.mark.parametrize(
    ("tracing", "extra"),
    [
        (f"traceparent={TP}", [("traceparent", TP.encode())]),
        (None, []),
        ("not a trace context", []),  # published without tracing headers, not dead-lettered
    ],
)
def test_the_relay_adds_the_tracing_headers_after_the_row_headers(
    tracing: str | None, extra: list[tuple[str, bytes]]
) -> None:
    mapper = OutboxMapper(
        "public", "outbox", Settings(dsn=DSN, columns=COLUMNS).column_names(), "t.{aggregate_type}"
    )
    assert mapper.row_columns[-1] == "tracingspancontext"
    id_ = "6f1c1c9e-8d5e-4a8e-9f55-0d3c1b1f3a10"
    for headers in ("{}", '{"h": "v"}'):
        record = mapper.map_row([id_, "order", "7", "Placed", "{}", headers, tracing])
        assert isinstance(record, OutboxRecord)
        own = [("h", b"v")] if headers != "{}" else []
        assert record.headers[3:] == own + extra


def test_without_the_setting_the_relay_reads_no_tracing_column() -> None:
    assert Settings(dsn=DSN).column_names().tracing_span_context is None
    assert Settings(dsn=DSN).columns.tracing_span_context is None
    assert Settings(dsn=DSN, columns={"preset": "debezium"}).columns.tracing_span_context is None
    assert (
        Settings(dsn=DSN, columns={"tracing_span_context": ""}).columns.tracing_span_context is None
    )
    with pytest.raises(ValueError, match=r"columns\.tracing_span_context"):
        Settings(dsn=DSN, columns={"tracing_span_context": "bad name"})


def test_without_opentelemetry_nothing_is_stored_and_no_span_is_opened(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("write"):
        for name in [m for m in sys.modules if m.split(".")[0] == "opentelemetry"]:
            monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError
        assert current_span_context() is None
        sql, params = _prepare(OutboxTable(columns=COLUMNS))
        assert "tracingspancontext" not in sql and len(params) == 5
        ran = []
        with handler_span([("traceparent", TP.encode())], "t", {}):
            ran.append(True)
        assert ran == [True]


# -- the relay hop's span (tracing_relay_span) -------------------------------------------------


class _Listener:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def delivered(self, topic: str, headers: Any) -> None:
        self.calls.append(("delivered", topic))

    def failed(self, failure: Any) -> None:
        self.calls.append(("failed", failure))


class _Failure:
    reason = "Broker: Message size too large"


def _provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def test_a_traced_record_is_produced_in_a_relay_span_its_headers_carry() -> None:
    provider, exporter = _provider()
    spans = RelaySpans(provider)
    headers = [("id", b"e-1"), ("traceparent", TP.encode()), ("tracestate", b"congo=t61"),
               ("ce_id", b"e-1")]  # fmt: skip
    inner = _Listener()
    out, listener = spans.start("orders", "e-1", headers, inner)
    assert exporter.get_finished_spans() == ()  # open until Kafka reports the record
    listener.delivered("orders", out)
    assert inner.calls == [("delivered", "orders")]
    [span] = exporter.get_finished_spans()
    assert (span.name, span.kind) == ("orders publish", trace.SpanKind.PRODUCER)
    assert span.attributes is not None and span.attributes["messaging.message.id"] == "e-1"
    assert span.parent is not None and span.parent.is_remote
    assert (f"{span.parent.trace_id:032x}", f"{span.parent.span_id:016x}") == (
        TP.split("-")[1], TP.split("-")[2],
    )  # fmt: skip
    assert span.context is not None and span.status.is_ok
    ctx = span.context
    assert out == [
        ("id", b"e-1"),
        ("traceparent", f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-01".encode()),
        ("tracestate", b"congo=t61"),
        ("ce_id", b"e-1"),
    ]
    assert headers[1] == ("traceparent", TP.encode())  # the record's own list is unchanged


def test_a_failed_delivery_ends_the_relay_span_with_an_error() -> None:
    provider, exporter = _provider()
    inner = _Listener()
    _, listener = RelaySpans(provider).start("t", "e-1", [("traceparent", TP.encode())], inner)
    failure = _Failure()
    listener.failed(failure)
    assert inner.calls == [("failed", failure)]
    [span] = exporter.get_finished_spans()
    assert span.status.status_code is trace.StatusCode.ERROR
    assert span.status.description == "Broker: Message size too large"


@pytest.mark.parametrize("headers", [[("id", b"e-1")], [("traceparent", b"not-a-traceparent")], []])
def test_an_untraced_record_gets_no_relay_span(headers: list[tuple[str, bytes]]) -> None:
    provider, exporter = _provider()
    inner = _Listener()
    out, listener = RelaySpans(provider).start("t", "e-1", headers, inner)
    assert out is headers and listener is inner
    assert exporter.get_finished_spans() == ()


def test_without_a_tracer_provider_the_writer_context_is_kept() -> None:
    headers = [("id", b"e-1"), ("traceparent", TP.encode())]
    inner = _Listener()
    out, listener = RelaySpans(trace.NoOpTracerProvider()).start("t", "e-1", headers, inner)
    assert out == headers  # a non-recording span carries its parent's context
    listener.delivered("t", out)
    assert inner.calls == [("delivered", "t")]


def test_the_relay_span_setting_needs_the_tracing_column() -> None:
    assert Settings(dsn=DSN).tracing_relay_span is False
    assert Settings(dsn=DSN, columns=COLUMNS, tracing_relay_span=True).tracing_relay_span
    with pytest.raises(ValueError, match=r"tracing_relay_span needs columns\.tracing_span_context"):
        Settings(dsn=DSN, tracing_relay_span=True)


def test_the_relay_span_setting_needs_opentelemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "opentelemetry" else real(name, *a),
    )
    with pytest.raises(
        ValueError, match=r"needs opentelemetry-api: pip install 'cdc-outbox\[otel\]'"
    ):
        Settings(dsn=DSN, columns=COLUMNS, tracing_relay_span=True)
