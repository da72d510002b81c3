"""Table-less events: the ``message_prefix`` setting, the message content a writer emits and
its mapping (the same record a row with those values gives)."""

from __future__ import annotations

import json
import struct
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from cdc_outbox.admin.preflight import evaluate_checks
from cdc_outbox.cdc.message_events import NON_TRANSACTIONAL, MessageEvents
from cdc_outbox.config.settings import Settings
from cdc_outbox.mapping.build import outbox_mapper
from cdc_outbox.mapping.rows import DEBEZIUM_COLUMNS, DEFAULT_COLUMNS, OutboxMapper
from cdc_outbox.records import DeadLetter, OutboxRecord
from cdc_outbox.writer import EMIT_SQL, OutboxTable, OutboxWriteError, prepare_message
from tests.support.helpers import lead_through_failing_streams


def test_message_prefix_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    dsn = {"dsn": "postgresql://u@h/db"}
    assert Settings.model_validate(dsn).message_prefix is None
    monkeypatch.setenv("CDC_OUTBOX_MESSAGE_PREFIX", "app.outbox")
    assert Settings.model_validate(dsn).message_prefix == "app.outbox"
    for bad in ("", "cdc_outbox.events"):
        with pytest.raises(ValidationError, match="message_prefix"):
            Settings.model_validate({**dsn, "message_prefix": bad})
    with pytest.raises(ValidationError, match="message_prefix needs CDC"):
        Settings.model_validate({**dsn, "message_prefix": "app", "mode": "polling"})


def _mapper(columns: Any = DEFAULT_COLUMNS, **kw: Any) -> OutboxMapper:
    return OutboxMapper("public", "outbox", columns, "t.{aggregate_type}", **kw)


_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
_name = st.from_regex(r"[A-Za-z0-9._-]{1,20}", fullmatch=True)
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=8,
)


@given(
    event_id=st.uuids().map(str),
    aggregate_type=_name,
    aggregate_id=_text,
    event_type=_name,
    payload=st.none() | _json.map(json.dumps),
    headers=st.none() | st.dictionaries(_name, _json, max_size=3).map(json.dumps),
    tombstones=st.booleans(),
)
def test_a_message_maps_to_the_record_of_the_same_row(
    event_id: str,
    aggregate_type: str,
    aggregate_id: str,
    event_type: str,
    payload: str | None,
    headers: str | None,
    tombstones: bool,
) -> None:
    mapper = _mapper(tombstones=tombstones)
    content = {
        "id": event_id,
        "aggregate_type": aggregate_type,
        "aggregate_id": aggregate_id,
        "event_type": event_type,
        "payload": payload,
        "headers": headers,
        "tracing_span_context": None,
    }
    row = [event_id, aggregate_type, aggregate_id, event_type, payload, headers]
    mapped = MessageEvents("p", DEFAULT_COLUMNS, mapper).map(json.dumps(content).encode())
    assert mapped == mapper.map_row(row)
    if payload is not None and headers is None and aggregate_id.strip():
        assert isinstance(mapped, OutboxRecord)
        assert mapped.value == payload.encode() and mapped.key == aggregate_id.encode()


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"not json", "message content is not valid JSON"),
        (b"\xff", "message content is not valid JSON"),
        (b"[1]", "message content is not a JSON object"),
        (b'{"id": 1}', "message field 'id' is not a string or null"),
        (b'{"id": "x", "aggregate_type": "a"}', "message field 'id' is not a UUID"),
        (b'{"id": "00000000-0000-0000-0000-00000000000A"}', "message field 'id' is not a UUID"),
        (
            b'{"id": "00000000-0000-0000-0000-00000000000a", "aggregate_type": "a"}',
            "column 'aggregate_id' is null",
        ),
    ],
)
def test_poison_content_is_a_dead_letter_with_its_reason(content: bytes, reason: str) -> None:
    mapped = MessageEvents("p", DEFAULT_COLUMNS, _mapper()).map(content)
    assert isinstance(mapped, DeadLetter)
    assert reason in mapped.reason


_ID = "6f1d2c3b-0000-4000-8000-00000000000a"


def test_headers_without_a_headers_column_are_a_dead_letter() -> None:
    events = MessageEvents("p", DEBEZIUM_COLUMNS, _mapper(DEBEZIUM_COLUMNS))
    base = {"id": _ID, "aggregate_type": "a", "aggregate_id": "k", "event_type": "e"}
    with_headers = json.dumps({**base, "payload": "{}", "headers": '{"h": 1}'}).encode()
    mapped = events.map(with_headers)
    assert isinstance(mapped, DeadLetter) and "no headers column" in mapped.reason
    plain = events.map(json.dumps({**base, "payload": "{}", "headers": None}).encode())
    headers = [("id", _ID.encode()), ("event_type", b"e"), ("aggregate_type", b"a")]
    assert plain == OutboxRecord("t.a", b"k", b"{}", headers, _ID)


def test_the_writer_emits_a_transactional_message_with_the_text_fields() -> None:
    eid = uuid.uuid4()
    query, params, got = prepare_message(
        OutboxTable(), "app", "order", 7, "Created", {"b": 1}, {"h": "v"}, eid
    )
    assert got == eid
    text = query.as_string(None)
    assert text == EMIT_SQL.as_string(None)
    assert text.startswith("SELECT pg_logical_emit_message(true, %s, CAST(jsonb_build_object(")
    assert "'payload', CAST(CAST(%s AS jsonb) AS text)" in text
    assert "'headers', CAST(CAST(%s AS jsonb) AS text)" in text
    assert params == ("app", str(eid), "order", "7", "Created", '{"b":1}', '{"h":"v"}', None)
    _, no_headers, _ = prepare_message(OutboxTable(), "app", "o", "1", "E", None, None, None)
    assert no_headers[5:] == (None, None, None)  # NULL payload, no headers, no trace context
    for bad in ("", "cdc_outbox.heartbeat"):
        with pytest.raises(OutboxWriteError, match="prefix"):
            prepare_message(OutboxTable(), bad, "o", "1", "E", {}, None, None)


def test_init_and_status_warn_what_a_table_less_outbox_can_lose() -> None:
    from tests.support.preflight import SETTINGS, ready

    on = SETTINGS.model_copy(update={"message_prefix": "app"})

    def warnings(settings: Settings, **state: Any) -> dict[str, str]:
        checks = evaluate_checks(ready(**state), settings, create_table=False)
        found = {c.name: c for c in checks if c.name.startswith("table_less")}
        assert all(c.ok and c.warning for c in found.values())
        return {name: c.detail for name, c in found.items()}

    assert list(warnings(on)) == ["table_less_failover"]  # PostgreSQL 15: no failover slots
    v17 = {"version_num": 170005, "slot_failover": True}
    assert warnings(on, **v17) == {}
    assert list(warnings(on, **{**v17, "slot_failover": False})) == ["table_less_failover"]
    no_failover = on.model_copy(update={"slot_failover": False})
    assert list(warnings(no_failover, **{**v17, "slot_failover": None})) == ["table_less_failover"]
    bounded = warnings(on, **v17, max_slot_wal_keep_size_mb=1024)
    assert list(bounded) == ["table_less_wal_keep"] and "= 1024MB" in bounded["table_less_wal_keep"]
    assert warnings(SETTINGS, max_slot_wal_keep_size_mb=1024) == {}  # no message_prefix


def test_auto_mode_retries_the_stream_instead_of_polling_table_less_events(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings.model_validate(
        {"dsn": "postgresql://u@h/db", "mode": "auto", "message_prefix": "app"}
    )
    with caplog.at_level("WARNING", logger="cdc_outbox.service.relay_service"):
        fell_back, attempts = lead_through_failing_streams(settings, monkeypatch)
    assert fell_back == []  # never polls: polling cannot see table-less events
    assert attempts == 3  # the stream is retried, as in cdc mode
    assert "relaying by CDC only" in caplog.text


def _message_frame(transactional: bool, lsn: int, prefix: str, content: bytes) -> bytes:
    head = struct.pack(">cBQ", b"M", 1 if transactional else 0, lsn)
    return head + prefix.encode() + b"\0" + struct.pack(">I", len(content)) + content


def test_a_non_transactional_message_is_confirmed_only_once_its_dead_letter_is() -> None:
    from cdc_outbox.cdc.ack_tracker import AckTracker
    from cdc_outbox.cdc.message_router import MessageRouter
    from cdc_outbox.config.cdc import router_section
    from cdc_outbox.telemetry.relay_stats import RelayStats

    settings = Settings.model_validate({"dsn": "postgresql://u@h/db", "message_prefix": "app"})
    submitted: list[tuple[Any, Any]] = []
    delivery = SimpleNamespace(submit=lambda r, h, o=0: submitted.append((r, h)), marker=None)
    written: list[int] = []
    checkpoint = SimpleNamespace(note_written=written.append)
    stats = RelayStats()
    router = MessageRouter(
        router_section(settings),
        [outbox_mapper(settings)],
        delivery,  # type: ignore[arg-type]
        stats,
        None,
    )
    tracker = AckTracker(0x100)
    router.new_session(tracker, checkpoint)  # type: ignore[arg-type]
    router.handle(_message_frame(False, 0x2000, "app", b'{"id": "x"}'))
    router.handle(_message_frame(False, 0x3000, "other", b"{}"))  # another prefix: ignored
    [(dead, handle)] = submitted
    assert isinstance(dead, DeadLetter) and dead.reason == NON_TRANSACTIONAL
    assert dead.value == b'{"id": "x"}' and dead.event_id is None
    assert stats.refused_messages == {NON_TRANSACTIONAL: 1}
    assert stats.ignored == {"message": 1}
    assert tracker.confirmed == 0x100  # not past the message before its dead letter is done
    tracker.keepalive(0x4000)
    assert tracker.confirmed == 0x100
    handle.dead_lettered()
    assert tracker.confirmed == 0x2001 and written == [0x2001]  # a restart does not decode it
