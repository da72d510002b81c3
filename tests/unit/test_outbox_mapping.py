"""Outbox row -> Kafka record mapping: real outbox inserts (golden frames), dead letters,
template validation, schema changes, and a property test over arbitrary rows."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_outbox.errors import ConfigError, DecodeError
from cdc_outbox.mapping.rows import (
    DEBEZIUM_COLUMNS,
    DEFAULT_COLUMNS,
    ColumnNames,
    DeadLetter,
    OutboxMapper,
    OutboxRecord,
    is_legal_topic,
)
from cdc_outbox.pgwire.pgoutput import (
    UNCHANGED_TOAST,
    ColumnValue,
    Insert,
    Relation,
    RelationCache,
    RelationColumn,
    decode,
)

GOLDEN = json.loads((Path(__file__).parent / "golden" / "frames.json").read_text())
ID1 = b"00000000-0000-4000-8000-000000000001"


def golden_outbox_inserts() -> list[tuple[Relation, Insert]]:
    """(relation in force, insert) for every outbox insert of the v1 capture."""
    cache = RelationCache()
    out = []
    for f in GOLDEN["v1"]:
        if f["kind"] not in ("R", "I"):
            continue
        m = decode(bytes.fromhex(f["copy_data"])[25:])
        if isinstance(m, Relation):
            cache.put(m)
        elif isinstance(m, Insert):
            rel = cache.get(m.relation_oid)
            if rel.name == "outbox":
                out.append((rel, m))
    return out


def mapper(template: str = "outbox.event.{aggregate_type}") -> OutboxMapper:
    return OutboxMapper("public", "outbox", DEFAULT_COLUMNS, template)


def rel(*names: str, oid: int = 100, schema: str = "public", table: str = "outbox") -> Relation:
    cols = tuple(RelationColumn(int(n == "id"), n, 25, -1) for n in names)
    return Relation(oid, schema, table, "d", cols)


SIX = ("id", "aggregate_type", "aggregate_id", "event_type", "payload", "headers")
R6 = rel(*SIX)


def row(
    id: ColumnValue = b"e-1",
    at: ColumnValue = b"order",
    aid: ColumnValue = b"o-1",
    et: ColumnValue = b"Placed",
    payload: ColumnValue = b'{"a": 1}',
    headers: ColumnValue = b"{}",
) -> tuple[ColumnValue, ...]:
    return (id, at, aid, et, payload, headers)


def test_golden_outbox_inserts() -> None:
    inserts = golden_outbox_inserts()
    assert len(inserts) == 5
    m = mapper()
    results = [m.map_insert(r, i.new) for r, i in inserts]
    assert all(m.is_outbox(r) for r, _ in inserts)

    first = results[0]
    assert first == OutboxRecord(
        topic="outbox.event.order",
        key=b"order-42",
        value='{"note": "ünïcode", "items": ["a", "b"], "total": 12.5}'.encode(),
        headers=[
            ("id", ID1),
            ("event_type", b"OrderPlaced"),
            ("aggregate_type", b"order"),
            ("nested", b'{"a":[1,2]}'),  # non-string JSON values: compact JSON text
            ("attempt", b"1"),
            ("trace_id", b"abc123"),  # strings: their UTF-8 bytes, no quotes
        ],
        event_id=ID1.decode(),
    )
    assert results[1] == OutboxRecord(
        "outbox.event.order",
        b"order-42",
        b"{}",
        [
            ("id", b"00000000-0000-4000-8000-000000000002"),
            ("event_type", b"OrderPaid"),
            ("aggregate_type", b"order"),
        ],
        "00000000-0000-4000-8000-000000000002",
    )
    broken = results[2]  # NULL aggregate_id, payload and headers
    assert isinstance(broken, DeadLetter)
    assert broken.reason == "column 'aggregate_id' is null; column 'payload' is null"
    assert broken.event_id == "00000000-0000-4000-8000-000000000003"
    assert (broken.key, broken.value, broken.intended_topic) == (None, None, "outbox.event.order")
    assert broken.headers == [
        ("id", b"00000000-0000-4000-8000-000000000003"),
        ("event_type", b"Broken"),
        ("aggregate_type", b"order"),
    ]
    odd = results[3]  # headers '[1]' is not an object
    assert isinstance(odd, DeadLetter)
    assert odd.reason == "column 'headers' is not a JSON object (got list)"
    assert (odd.key, odd.value) == (b"order-7", b"[1, 2]")
    # after ALTER TABLE ADD COLUMN a new Relation arrived; the mapping still works
    assert inserts[4][0] is not inserts[0][0] and len(inserts[4][0].columns) == 15
    assert results[4] == OutboxRecord(
        "outbox.event.customer",
        b"c-1",
        b'{"name": "Ann"}',
        [
            ("id", b"00000000-0000-4000-8000-000000000005"),
            ("event_type", b"CustomerCreated"),
            ("aggregate_type", b"customer"),
        ],
        "00000000-0000-4000-8000-000000000005",
    )


def test_is_outbox_matches_schema_and_table_exactly() -> None:
    m = mapper()
    assert m.is_outbox(R6)
    assert not m.is_outbox(rel(*SIX, schema="other"))
    assert not m.is_outbox(rel(*SIX, table="Outbox"))


def test_schema_change_re_resolves_positions() -> None:
    m = mapper()
    assert isinstance(m.map_insert(R6, row()), OutboxRecord)
    # same OID, columns reordered (e.g. table rebuilt): positions must follow the new Relation
    moved = rel("payload", "headers", "event_type", "aggregate_id", "aggregate_type", "id")
    out = m.map_insert(moved, (b'{"b": 2}', b"{}", b"Paid", b"o-9", b"order", b"e-2"))
    assert isinstance(out, OutboxRecord)
    assert (out.key, out.value, out.event_id) == (b"o-9", b'{"b": 2}', "e-2")
    # a Relation that lost a configured column is a configuration problem
    with pytest.raises(ConfigError, match=r"outbox table public\.outbox has no column 'payload'"):
        m.map_insert(rel(*SIX[:4], "headers"), row()[:5])


def test_row_length_must_match_relation() -> None:
    with pytest.raises(DecodeError, match="Insert: 5 columns for relation outbox with 6 columns"):
        mapper().map_insert(R6, row()[:5])


def test_debezium_preset() -> None:
    m = OutboxMapper("public", "outbox", DEBEZIUM_COLUMNS, "outbox.event.{aggregate_type}")
    r = rel("id", "aggregatetype", "aggregateid", "type", "payload", "timestamp")
    out = m.map_insert(r, (b"e-1", b"Order", b"o-1", b"Created", b"{}", b"123"))
    assert out == OutboxRecord(
        "outbox.event.Order",
        b"o-1",
        b"{}",
        [("id", b"e-1"), ("event_type", b"Created"), ("aggregate_type", b"Order")],
        "e-1",
    )
    with pytest.raises(ConfigError, match="no column 'aggregatetype'"):
        m.map_insert(R6, row())
    with pytest.raises(ConfigError, match="no column 'headers'"):
        mapper().map_insert(rel(*SIX[:5]), row()[:5])


@pytest.mark.parametrize(
    "template",
    ["{foo}", "x.{}", "x.{0}", "{aggregate_type!r}", "{aggregate_type:>9}", "bad{", "a}b", "a b"],
)
def test_bad_templates_are_config_errors(template: str) -> None:
    with pytest.raises(ConfigError, match="topic template"):
        mapper(template)


def test_templates() -> None:
    r = row(at=b"order", et=b"Placed")
    assert isinstance(out := mapper("events").map_insert(R6, r), OutboxRecord)
    assert out.topic == "events"
    out = mapper("{aggregate_type}.{event_type}.v1").map_insert(R6, r)
    assert isinstance(out, OutboxRecord) and out.topic == "order.Placed.v1"
    # only the placeholders the template uses matter: bad UTF-8 elsewhere is fine
    out = mapper("evt.{event_type}").map_insert(R6, row(at=b"\xff"))
    assert isinstance(out, OutboxRecord) and out.topic == "evt.Placed"


@pytest.mark.parametrize(
    ("agg_type", "template"),
    [
        (b"order lines", "outbox.event.{aggregate_type}"),
        (b"x" * 250, "{aggregate_type}"),
        (b".", "{aggregate_type}"),
        (b"..", "{aggregate_type}"),
        (b"", "{aggregate_type}"),
        ("bestellung-ä".encode(), "{aggregate_type}"),
    ],
)
def test_illegal_topic_is_dead_lettered(agg_type: bytes, template: str) -> None:
    out = mapper(template).map_insert(R6, row(at=agg_type))
    assert isinstance(out, DeadLetter)
    assert out.reason.startswith("invalid topic name")
    assert out.intended_topic is None
    assert (out.key, out.value, out.event_id) == (b"o-1", b'{"a": 1}', "e-1")


def test_longest_legal_topic() -> None:
    out = mapper("{aggregate_type}").map_insert(R6, row(at=b"x" * 249))
    assert isinstance(out, OutboxRecord) and out.topic == "x" * 249


@pytest.mark.parametrize(
    ("field", "column"),
    [("id", "id"), ("at", "aggregate_type"), ("aid", "aggregate_id"), ("et", "event_type"),
     ("payload", "payload"), ("headers", "headers")],
)  # fmt: skip
@pytest.mark.parametrize(
    ("value", "words"), [(None, "is null"), (UNCHANGED_TOAST, "is an unchanged TOAST placeholder")]
)
def test_null_and_toast_are_dead_lettered(
    field: str, column: str, value: ColumnValue, words: str
) -> None:
    if field == "headers" and value is None:
        out = mapper().map_insert(R6, row(headers=None))  # NULL headers = no extra headers
        assert isinstance(out, OutboxRecord) and len(out.headers) == 3
        return
    out = mapper().map_insert(R6, row(**{field: value}))
    assert isinstance(out, DeadLetter)
    assert out.reason == f"column {column!r} {words}"
    assert None not in [v for _, v in out.headers]
    if field != "aid":
        assert out.key == b"o-1"
    if field != "payload":
        assert out.value == b'{"a": 1}'
    if field != "id":
        assert out.event_id == "e-1"


def test_null_payload_is_a_tombstone_when_enabled() -> None:
    m = OutboxMapper("public", "outbox", DEFAULT_COLUMNS, tombstones=True)
    out = m.map_insert(R6, row(payload=None, headers=b'{"trace": "t"}'))
    assert out == OutboxRecord(
        "outbox.event.order",
        b"o-1",
        None,
        [("id", b"e-1"), ("event_type", b"Placed"), ("aggregate_type", b"order"), ("trace", b"t")],
        "e-1",
    )
    row_out = m.map_row(["e-1", "order", "o-1", "Placed", None, "{}"])  # polling, catch-up
    assert isinstance(row_out, OutboxRecord) and row_out.value is None
    # a payload that is present is still published as stored
    present = m.map_insert(R6, row())
    assert isinstance(present, OutboxRecord) and present.value == b'{"a": 1}'


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        ({"payload": UNCHANGED_TOAST}, "column 'payload' is an unchanged TOAST placeholder"),
        # a tombstone needs its key
        ({"payload": None, "aid": None}, "column 'aggregate_id' is null"),
        ({"payload": None, "aid": UNCHANGED_TOAST}, "column 'aggregate_id' is an unchanged TOAST"),
        ({"payload": None, "headers": b"[1]"}, "column 'headers' is not a JSON object"),
        ({"payload": None, "headers": b'{"id": "x"}'}, "column 'headers': header 'id' is reserved"),
    ],
)
def test_tombstones_still_dead_letter_everything_else(
    values: dict[str, ColumnValue], reason: str
) -> None:
    m = OutboxMapper("public", "outbox", DEFAULT_COLUMNS, tombstones=True)
    out = m.map_insert(R6, row(**values))
    assert isinstance(out, DeadLetter) and out.reason.startswith(reason), out.reason
    assert out.value is None and out.event_id == "e-1"
    assert out.intended_topic == "outbox.event.order"


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        (b"{", "column 'headers' is not valid JSON"),
        (b"\xff{}", "column 'headers' is not valid JSON"),
        (b'"x"', r"column 'headers' is not a JSON object \(got str\)"),
        (b"null", r"column 'headers' is not a JSON object \(got NoneType\)"),
        (b'{"k": "\\ud800"}', "column 'headers' has a header that cannot be encoded"),
    ],
)
def test_bad_headers_are_dead_lettered(headers: bytes, reason: str) -> None:
    out = mapper().map_insert(R6, row(headers=headers))
    assert isinstance(out, DeadLetter) and re.match(reason, out.reason)
    assert out.key == b"o-1" and out.value == b'{"a": 1}'
    assert out.intended_topic == "outbox.event.order"
    assert out.headers == [("id", b"e-1"), ("event_type", b"Placed"), ("aggregate_type", b"order")]


RESERVED_HEADERS = ("id", "event_type", "aggregate_type")


@pytest.mark.parametrize("name", [*RESERVED_HEADERS, "cdc_outbox.error", "cdc_outbox.anything"])
def test_reserved_header_names_are_dead_lettered(name: str) -> None:
    hv = json.dumps({"trace_id": "t", name: "forged"}).encode()
    for out in (
        mapper().map_insert(R6, row(headers=hv)),
        mapper().map_row(["e-1", "order", "o-1", "Placed", '{"a": 1}', hv.decode()]),
    ):
        assert isinstance(out, DeadLetter)
        assert out.reason == f"column 'headers': header {name!r} is reserved"
        assert (out.key, out.value, out.event_id) == (b"o-1", b'{"a": 1}', "e-1")
        assert out.intended_topic == "outbox.event.order"
        # only the relay's own headers: neither the forged one nor the rest of the object
        assert out.headers == [
            ("id", b"e-1"), ("event_type", b"Placed"), ("aggregate_type", b"order"),
        ]  # fmt: skip


def test_header_names_close_to_reserved_ones_are_allowed() -> None:
    names = ["ID", "Event_Type", "aggregate_type_v2", "event_id", "cdc_outbox", "x.cdc_outbox.y"]
    out = mapper().map_insert(R6, row(headers=json.dumps(dict.fromkeys(names, "v")).encode()))
    assert isinstance(out, OutboxRecord)
    assert out.headers[3:] == [(n, b"v") for n in names]


plain_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=4)
header_names = plain_text | st.sampled_from([*RESERVED_HEADERS, "cdc_outbox.error", "cdc_outbox.x"])


@given(st.dictionaries(header_names, plain_text, max_size=4))
def test_a_headers_object_maps_unless_it_uses_a_reserved_name(obj: dict[str, str]) -> None:
    out = mapper().map_insert(R6, row(headers=json.dumps(obj).encode()))
    reserved = [k for k in obj if k in RESERVED_HEADERS or k.startswith("cdc_outbox.")]
    if reserved:
        assert isinstance(out, DeadLetter)
        assert out.reason == f"column 'headers': header {reserved[0]!r} is reserved"
    else:
        assert isinstance(out, OutboxRecord)
        assert out.headers[3:] == [(k, v.encode()) for k, v in obj.items()]


def test_header_value_forms() -> None:
    hv = json.dumps(
        {"s": "ä b", "i": -3, "f": 1.5, "t": True, "n": None, "l": [1, "x"], "o": {"k": "v"}}
    ).encode()
    out = mapper().map_insert(R6, row(headers=hv))
    assert isinstance(out, OutboxRecord)
    assert out.headers[3:] == [
        ("s", "ä b".encode()), ("i", b"-3"), ("f", b"1.5"), ("t", b"true"), ("n", b"null"),
        ("l", b'[1,"x"]'), ("o", b'{"k":"v"}'),
    ]  # fmt: skip


def test_non_ascii_but_valid_ids_are_fine() -> None:
    out = mapper().map_insert(R6, row(id="événement-1".encode()))
    assert isinstance(out, OutboxRecord) and out.event_id == "événement-1"
    bad = mapper().map_insert(R6, row(id=b"\xff"))
    assert isinstance(bad, DeadLetter) and bad.reason == "column 'id' is not valid UTF-8"
    assert bad.event_id is None and bad.headers[0] == ("id", b"\xff")


def test_topic_cache_is_bounded() -> None:
    m = mapper()
    for i in range(5000):
        out = m.map_insert(R6, row(at=f"t{i}".encode()))
        assert isinstance(out, OutboxRecord) and out.topic == f"outbox.event.t{i}"
    assert len(m._topics) <= 4096


def test_is_legal_topic() -> None:
    assert is_legal_topic("a") and is_legal_topic("A.b_c-9") and is_legal_topic("x" * 249)
    for bad in ("", ".", "..", "x" * 250, "a b", "a/b", "ä", "a\n"):
        assert not is_legal_topic(bad), bad


@given(st.text(max_size=260))
def test_is_legal_topic_property(name: str) -> None:
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
    expected = 1 <= len(name) <= 249 and set(name) <= allowed and name not in (".", "..")
    assert is_legal_topic(name) == expected


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)
column_value: st.SearchStrategy[ColumnValue] = st.one_of(
    st.none(),
    st.just(UNCHANGED_TOAST),
    st.binary(max_size=12),
    st.sampled_from([b"order", b"e-1", b"{}", b"a.b", b"\xff"]),
)
headers_value: st.SearchStrategy[ColumnValue] = st.one_of(
    column_value,
    st.dictionaries(st.text(max_size=4), json_values, max_size=4).map(
        lambda d: json.dumps(d).encode()
    ),
)


@given(
    column_value, column_value, column_value, column_value, column_value, headers_value,
    st.booleans(),
)  # fmt: skip
def test_any_row_maps_to_record_or_dead_letter(
    id: ColumnValue,
    at: ColumnValue,
    aid: ColumnValue,
    et: ColumnValue,
    payload: ColumnValue,
    headers: ColumnValue,
    tombstones: bool,
) -> None:
    r = (id, at, aid, et, payload, headers)
    m = OutboxMapper(
        "public", "outbox", DEFAULT_COLUMNS, "{aggregate_type}.{event_type}", tombstones=tombstones
    )
    out = m.map_insert(R6, r)
    assert all(type(v) is bytes for _, v in out.headers)
    if isinstance(out, OutboxRecord):
        assert out.key == aid and out.value == payload  # exactly as stored
        assert isinstance(payload, bytes) or (payload is None and tombstones)
        assert isinstance(id, bytes) and out.event_id == id.decode()
        assert is_legal_topic(out.topic)
        assert out.headers[:3] == [("id", id), ("event_type", et), ("aggregate_type", at)]
        assert headers is None or isinstance(headers, bytes)
    else:
        assert out.reason
        required = (id, at, aid, et, payload)
        if all(isinstance(v, bytes) for v in required) and headers in (None, b"{}"):
            # only a text/topic problem can dead-letter a row with every value present
            assert "UTF-8" in out.reason or "invalid topic name" in out.reason
        for v, name in ((id, "id"), (aid, "aggregate_id"), (payload, "payload")):
            if v is None:
                null_ok = name == "payload" and tombstones
                assert (f"column {name!r} is null" in out.reason) is not null_ok
            if v is UNCHANGED_TOAST:
                assert f"column {name!r} is an unchanged TOAST placeholder" in out.reason


def test_column_names_presets() -> None:
    assert ColumnNames(*SIX) == DEFAULT_COLUMNS
    assert DEBEZIUM_COLUMNS.headers is None and DEBEZIUM_COLUMNS.event_type == "type"


def test_map_row_maps_text_values_like_an_insert() -> None:
    mapper = OutboxMapper("public", "outbox", DEFAULT_COLUMNS)
    assert mapper.row_columns == [
        "id", "aggregate_type", "aggregate_id", "event_type", "payload", "headers",
    ]  # fmt: skip
    record = mapper.map_row(
        ["e-1", "order", "order-7", "OrderPlaced", '{"a": 1}', '{"trace": "t"}']
    )
    assert isinstance(record, OutboxRecord)
    assert record.topic == "outbox.event.order"
    assert (record.key, record.value) == (b"order-7", b'{"a": 1}')
    assert record.headers[0] == ("id", b"e-1") and ("trace", b"t") in record.headers
    dead = mapper.map_row(["e-2", "order", "order-7", "OrderPlaced", None, "{}"])
    assert isinstance(dead, DeadLetter) and "null" in dead.reason


# -- header_columns (Debezium's column:header:alias) -----------------------------------------

HEADER_COLUMNS = ColumnNames(
    *SIX, tracing_span_context="tsc", header_columns=(("eventType", "event_type"), ("t", "tenant"))
)
R8 = rel(*SIX, "tsc", "tenant", oid=101)
TRACE = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def header_mapper() -> OutboxMapper:
    return OutboxMapper("public", "outbox", HEADER_COLUMNS)


def test_header_columns_put_columns_in_headers_under_their_names() -> None:
    hv = b'{"trace_id": "x"}'
    out = header_mapper().map_insert(R8, (*row(headers=hv), TRACE, b"acme"))
    assert isinstance(out, OutboxRecord)
    # the relay's own, then header_columns in order, then the headers column, then tracing
    assert [h for h, _ in out.headers] == [
        "id", "event_type", "aggregate_type", "eventType", "t", "trace_id", "traceparent",
    ]  # fmt: skip
    assert out.headers[3:5] == [("eventType", b"Placed"), ("t", b"acme")]
    cols = ColumnNames(*SIX, header_columns=(("t", "tenant"),))
    untraced = OutboxMapper("public", "outbox", cols)
    out = untraced.map_insert(rel(*SIX, "tenant", oid=102), (*row(), b"acme"))
    assert isinstance(out, OutboxRecord) and out.headers[3:] == [("t", b"acme")]


def test_a_null_header_column_sends_no_header_and_a_toast_one_dead_letters() -> None:
    out = header_mapper().map_insert(R8, (*row(), None, None))
    assert isinstance(out, OutboxRecord)
    assert [h for h, _ in out.headers] == ["id", "event_type", "aggregate_type", "eventType"]
    dead = header_mapper().map_insert(R8, (*row(), None, UNCHANGED_TOAST))
    assert isinstance(dead, DeadLetter)
    assert dead.reason == "column 'tenant' is an unchanged TOAST placeholder"


@pytest.mark.parametrize("name", ["eventType", "t"])
def test_the_headers_column_may_not_forge_a_header_column(name: str) -> None:
    hv = json.dumps({name: "forged"}).encode()
    out = header_mapper().map_insert(R8, (*row(headers=hv), None, b"acme"))
    assert isinstance(out, DeadLetter)
    assert out.reason == f"column 'headers': header {name!r} is reserved"
    assert b"forged" not in [v for _, v in out.headers]


def test_header_columns_are_read_by_map_row_once_each() -> None:
    cols = ColumnNames(*SIX, header_columns=(("a", "tenant"), ("b", "tenant"), ("c", "id")))
    mapper = OutboxMapper("public", "outbox", cols)
    assert mapper.row_columns == [*SIX, "tenant"]
    assert cols.header_sources() == ["tenant"]
    out = mapper.map_row(["e-1", "order", "o-1", "Placed", "{}", None, "acme"])
    assert isinstance(out, OutboxRecord)
    assert out.headers[3:] == [("a", b"acme"), ("b", b"acme"), ("c", b"e-1")]


values = st.none() | st.just(UNCHANGED_TOAST) | st.binary(max_size=6)


@given(values, values)
def test_any_header_column_values(event_type: ColumnValue, tenant: ColumnValue) -> None:
    out = header_mapper().map_insert(R8, (*row(et=event_type), None, tenant))
    ok = type(event_type) is bytes and tenant is not UNCHANGED_TOAST
    assert isinstance(out, OutboxRecord) is ok
    expected = [("eventType", event_type)] if type(event_type) is bytes else []
    expected += [("t", tenant)] if type(tenant) is bytes else []
    assert [h for h in out.headers if h[0] in ("eventType", "t")] == expected
