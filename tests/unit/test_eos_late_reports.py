"""Delivery reports served only after their Kafka transaction committed (issue 37 item 6c).

A committed Kafka transaction means every record in it was delivered. The relay waits a
bounded time after a commit for the last reports; ids whose reports come later must still
reach the published-marker (a row left PENDING is published again by a catch-up), and an id
must never reach it before its own transaction committed. Through the fakes of tests/fakes.
"""

from __future__ import annotations

from typing import Any

import pytest

from cdc_outbox.cdc import eos
from cdc_outbox.cdc.eos import EosCommitter
from cdc_outbox.config.cdc import eos_section
from cdc_outbox.config.delivery import delivery_section
from cdc_outbox.config.settings import Settings
from cdc_outbox.delivery.engine import Delivery
from cdc_outbox.records import OutboxRecord
from cdc_outbox.store.outbox_table import OutboxTable
from cdc_outbox.telemetry.relay_stats import RelayStats
from tests.support.fakes.kafka import FakeCheckpoints, FakeCluster, FakeProducerClient

TOPIC = "t.event.orders"
_TRACEPARENT = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class _HeldReports(FakeProducerClient):
    """Serves no delivery report while ``hold`` (not even in ``commit_transaction``)."""

    hold = False

    def poll(self, timeout: float = 0.0) -> int:
        return 0 if self.hold else super().poll(timeout)


class _Marker:
    def __init__(self) -> None:
        self.ids: list[bytes] = []

    def add(self, event_id: bytes, outbox: int = 0) -> None:
        self.ids.append(event_id)


class _Handle:
    def published(self, topic: str) -> None:
        pass

    def dead_lettered(self) -> None:
        pass

    def retry(self, reason: str) -> None:
        pass


class _Relay:
    """A Delivery and its EosCommitter on a FakeCluster, with a recording marker."""

    def __init__(self, tracing: bool = False) -> None:
        self.tracing = tracing
        self.cluster = FakeCluster()
        self.marker = _Marker()
        self.clients: list[_HeldReports] = []
        settings = Settings.model_validate(
            {
                "dsn": "postgresql://fake@127.0.0.1:1/db",
                "mode": "cdc",
                "delivery": "exactly_once",
                "topic_template": "t.event.{aggregate_type}",
                "eos": {"checkpoint_topic": "t.checkpoints"},
                "kafka": {"bootstrap_servers": "fake:9092"},
                "tracing_relay_span": tracing,
                "columns": {"tracing_span_context": "tracingspancontext"} if tracing else {},
            }
        )
        stats = RelayStats()
        self.delivery = Delivery(
            delivery_section(settings),
            stats,
            marker=self.marker,
            transactional_id="tid",
            producer_client=self._client,
        )
        self.eos = EosCommitter(
            eos_section(settings),
            OutboxTable.all_of(settings),
            self.delivery,
            stats,
            ("42", "db"),
            FakeCheckpoints(self.cluster, "t"),
        )
        self.delivery.ensure_transactions()
        self.lsn = 100

    def _client(self, config: dict[str, Any]) -> _HeldReports:
        self.clients.append(_HeldReports(self.cluster, config))
        return self.clients[-1]

    def hold(self, held: bool) -> None:
        self.clients[-1].hold = held

    def txn(self, *ids: str) -> None:
        """A PostgreSQL transaction with events ``ids`` into the open Kafka transaction."""
        self.eos.batch.begin()
        for event_id in ids:
            self.eos.add_event()
            headers = [("id", event_id.encode())]
            if self.tracing:  # a traced event: its listener is wrapped in the relay's span
                headers.append(("traceparent", _TRACEPARENT))
            record = OutboxRecord(TOPIC, b"k", b"{}", headers, event_id)
            self.delivery.submit(record, _Handle())
        self.lsn += 10
        self.eos.batch.end(self.lsn, had_events=True)


@pytest.fixture
def no_wait_after_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bounded wait for reports after a commit is over at once (as after 5 s)."""
    monkeypatch.setattr(eos, "_REPORTS_AFTER_COMMIT_S", 0.0)


@pytest.mark.usefixtures("no_wait_after_commit")
@pytest.mark.parametrize("tracing", [False, True], ids=["plain", "tracing_relay_span"])
def test_reports_served_after_the_commit_and_its_wait_still_mark_their_rows(tracing: bool) -> None:
    r = _Relay(tracing)
    r.txn("a", "b", "c")
    r.hold(True)
    assert r.eos.settle_and_commit(lambda: None, lambda: None)
    assert [c.state for c in r.cluster.read_committed(TOPIC)] == ["committed"] * 3
    assert r.marker.ids == []  # not served yet
    r.hold(False)
    r.delivery.publisher.poll(0)  # served late, while the next transaction is open
    r.txn("d")
    r.delivery.abandon()  # ... which is aborted
    assert sorted(r.marker.ids) == [b"a", b"b", b"c"]


@pytest.mark.usefixtures("no_wait_after_commit")
def test_an_id_never_reaches_the_marker_before_its_own_transaction_committed() -> None:
    """Records held back while the previous transaction closes go into the next one: their
    reports, served after that commit, wait for their own transaction's commit."""
    r = _Relay()
    r.txn("a")
    r.eos.begin_close()  # "a" closes; what comes now is held back for the next transaction
    r.txn("b")
    assert r.eos.close_ready()
    r.eos.finish_close(lambda: None, lambda: None)  # commits "a", then produces "b"
    assert r.marker.ids == [b"a"]
    r.delivery.publisher.poll(0)  # "b" acknowledged inside its open transaction
    r.delivery.abandon()  # which is aborted
    assert r.marker.ids == [b"a"]
    r.txn("c")
    assert r.eos.settle_and_commit(lambda: None, lambda: None)
    assert r.marker.ids == [b"a", b"c"]
