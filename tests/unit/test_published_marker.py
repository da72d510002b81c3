"""The housekeeping statement per id type (rendered without a connection), and the rule that
a confirmed position is a marked one (the watermark, the Checkpointer's use of it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretStr

from cdc_outbox.cdc.eos_batch import EosBatch
from cdc_outbox.cdc.ledger import Ledger, MarkedWatermark
from cdc_outbox.cdc.published_marker import PublishedMarker
from cdc_outbox.config.cdc import marker_section
from cdc_outbox.config.settings import Settings
from cdc_outbox.store.inspection import ColumnType
from cdc_outbox.store.outbox_table import OutboxTable
from cdc_outbox.store.published_marks import marks_statement as _statement
from tests.support.helpers import recording_checkpointer

UUID = ColumnType("uuid", "pg_catalog", "uuid")
TEXT = ColumnType("text", "pg_catalog", "text")
VARCHAR = ColumnType("character varying(64)", "pg_catalog", "varchar")


def _marker(s: Settings) -> PublishedMarker:
    return PublishedMarker(marker_section(s), OutboxTable.all_of(s))


def settings(**kwargs: Any) -> Settings:
    return Settings(dsn=SecretStr("host=db.example dbname=shop"), **kwargs)


def render(id_type: ColumnType, **kwargs: Any) -> str | None:
    stmt = _statement(settings(**kwargs), id_type)
    return None if stmt is None else stmt.as_string(None)


def test_uuid_ids_keep_one_comma_joined_text_parameter() -> None:
    assert render(UUID) == (
        'UPDATE "public"."outbox" SET status = \'PUBLISHED\', published_at = now(),'
        " locked_by = NULL, locked_at = NULL"
        " WHERE \"id\" = ANY(string_to_array(%s, ',')::uuid[])"
        " AND status IN ('PENDING', 'PROCESSING')"
    )


def test_other_ids_are_one_array_parameter_cast_to_the_column_type() -> None:
    assert render(TEXT, cdc_mark_published="delete") == (
        'DELETE FROM "public"."outbox" WHERE "id" = ANY(%s::text[]::"pg_catalog"."text"[])'
        " AND status IN ('PENDING', 'PROCESSING')"
    )
    debezium = render(TEXT, cdc_mark_published="delete", columns={"preset": "debezium"})
    assert debezium is not None and "status" not in debezium  # no status column to test
    text = render(VARCHAR, columns={"id": "event_id"})
    assert text is not None and "string_to_array" not in text
    assert '"event_id" = ANY(%s::text[]::"pg_catalog"."varchar"[])' in text


def test_housekeeping_off_or_without_status_column_marks_nothing() -> None:
    assert render(TEXT, cdc_mark_published="off", mode="cdc") is None
    assert render(UUID, columns={"preset": "debezium"}) is None
    assert not _marker(settings(columns={"preset": "debezium"})).enabled
    assert _marker(settings(cdc_mark_published="delete")).enabled


# -- confirmed means marked ---------------------------------------------------------------


@dataclass
class _Marker:
    """What the Checkpointer reads of a PublishedMarker: the two counters."""

    handed: int = 0
    settled: int = 0


@st.composite
def _runs(draw: st.DrawFn) -> list[tuple[str, int]]:
    """Steps of a relay: 'txn' n (a transaction of n events, all acknowledged), 'mark' n (the
    marker marks up to n more ids), 'read' (the Checkpointer asks)."""
    steps = st.one_of(
        st.tuples(st.just("txn"), st.integers(0, 4)),
        st.tuples(st.just("mark"), st.integers(1, 6)),
        st.tuples(st.just("read"), st.just(0)),
    )
    return draw(st.lists(steps, max_size=60))


@given(_runs())
def test_the_watermark_never_passes_an_unmarked_event_and_catches_up(
    run: list[tuple[str, int]],
) -> None:
    marker = _Marker()
    watermark = MarkedWatermark(0)
    confirmed = 0
    event_positions: list[int] = []  # the commit position of the event with id index i
    for step, n in run:
        if step == "txn":
            confirmed += 10
            event_positions += [confirmed] * n
            marker.handed += n  # acknowledged: handed over before the position moves
        elif step == "mark":
            marker.settled = min(marker.handed, marker.settled + n)
        watermark.note(confirmed, marker.handed)
        got = watermark.through(marker.settled)
        unmarked = event_positions[marker.settled :]
        assert got <= confirmed
        assert not unmarked or got < min(unmarked)  # every event up to it is marked
    marker.settled = marker.handed
    watermark.note(confirmed, marker.handed)
    assert watermark.through(marker.settled) == confirmed


def test_the_checkpointer_confirms_only_what_is_marked() -> None:
    ledger = Ledger()
    marker = _Marker()
    cp, stream = recording_checkpointer(ledger, 100, marker=marker)
    tracker = ledger.acked
    txn = tracker.begin()
    tracker.add_event(txn)
    tracker.ack(txn)
    marker.handed += 1  # the report hands the id over, then the tracker counts the ack
    tracker.commit(txn, 200)
    assert tracker.confirmed == 200
    cp.send()
    assert stream.sent[-1][1] == 100  # acknowledged, not marked
    marker.settled = 1
    cp.send()
    assert stream.sent[-1][1] == 200
    tracker.keepalive(300)  # no events since: nothing to wait for
    cp.send()
    assert stream.sent[-1][1] == 300


def test_exactly_once_waits_for_the_marks_of_the_committed_transaction() -> None:
    """Exactly-once acknowledges records inside the open Kafka transaction but hands their
    ids over only at the commit, which is also when the ceiling moves."""
    batch = EosBatch(0.1, 10, committed_lsn=100)
    ledger = Ledger(batch)
    marker = _Marker()
    cp, stream = recording_checkpointer(ledger, 100, marker=marker)
    tracker = ledger.acked
    txn = tracker.begin()
    batch.begin()
    tracker.add_event(txn)
    batch.add_event(0.0)
    tracker.ack(txn)  # in the open Kafka transaction: nothing handed over yet
    tracker.commit(txn, 200)
    batch.end(200, had_events=True)
    cp.send()
    assert stream.sent[-1][1] == 100
    batch.close()
    batch.committed()  # the Kafka commit: the ceiling moves and the id is handed over
    marker.handed += 1
    cp.send()
    assert stream.sent[-1][1] == 100  # committed, not marked
    marker.settled = 1
    cp.send()
    assert stream.sent[-1][1] == 200


def test_a_marker_not_running_has_nothing_unmarked_and_settles_at_once() -> None:
    marker = _marker(settings())
    marker.add(b"00000000-0000-0000-0000-000000000001")
    assert marker.handed == 1
    assert marker.unmarked == 0  # no thread: nothing will be marked, nothing to wait for
    assert marker.settle(10.0)
