"""Pure parts of the polling relay (backoff with jitter, gap-free claims, configuration
checks) and one batch published into the in-memory Kafka of tests/fakes."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError
from hypothesis import given
from hypothesis import strategies as st

from cdc_outbox.config.backoff import BackoffPolicy
from cdc_outbox.config.delivery import delivery_section
from cdc_outbox.config.settings import Settings
from cdc_outbox.delivery.engine import Delivery
from cdc_outbox.errors import ConfigError
from cdc_outbox.polling.outcomes import BACK, DEAD, OK, RETRY, RetryCounts, backoff_delay
from cdc_outbox.polling.relay import PollingRelay, _Row
from cdc_outbox.service.wiring import polling_relay
from cdc_outbox.store.polling_sql import advisory_namespace, build, gap_free
from tests.support.fakes.kafka import FakeCluster


@given(
    failures=st.integers(min_value=1, max_value=200),
    base=st.floats(min_value=0.001, max_value=100.0),
    extra=st.floats(min_value=0.0, max_value=10_000.0),
    rand=st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
)
def test_backoff_is_capped_exponential_times_jitter_in_half_to_one(
    failures: int, base: float, extra: float, rand: float
) -> None:
    cap = base + extra
    nominal = min(cap, base * 2.0 ** (failures - 1))
    delay = backoff_delay(failures, BackoffPolicy(base, cap), rand)
    assert 0.5 * nominal <= delay <= nominal
    assert delay <= cap


def test_backoff_doubles_per_failure_until_the_cap() -> None:
    delays = [backoff_delay(n, BackoffPolicy(1.0, 10.0), 1.0 - 1e-12) for n in range(1, 7)]
    assert delays == pytest.approx([1.0, 2.0, 4.0, 8.0, 10.0, 10.0])
    assert backoff_delay(1, BackoffPolicy(1.0, 10.0), 0.0) == 0.5  # the lowest jitter halves it


@dataclass
class _R:
    aggregate_id: str
    rank: int


def test_gap_free_keeps_contiguous_ranks_per_aggregate() -> None:
    rows = [_R("a", 1), _R("b", 2), _R("a", 2), _R("c", 1), _R("a", 4), _R("b", 3), _R("c", 2)]
    keep, back = gap_free(rows)
    # "b" lacks rank 1 (a row SKIP LOCKED skipped): nothing of it may go before that row.
    assert keep == [_R("a", 1), _R("a", 2), _R("c", 1), _R("c", 2)]
    assert back == [_R("b", 2), _R("a", 4), _R("b", 3)]


@given(st.lists(st.tuples(st.sampled_from("xyz"), st.integers(1, 6)), unique=True))
def test_gap_free_partitions_and_kept_ranks_are_prefixes(pairs: list[tuple[str, int]]) -> None:
    rows = [_R(a, r) for a, r in pairs]
    keep, back = gap_free(rows)
    assert sorted(keep + back, key=rows.index) == rows
    for agg in "xyz":
        kept = sorted(r.rank for r in keep if r.aggregate_id == agg)
        assert kept == list(range(1, len(kept) + 1))
        # kept stops exactly at the first missing rank
        assert len(kept) + 1 not in {r.rank for r in rows if r.aggregate_id == agg}


def test_advisory_namespace_is_a_stable_int4_per_table() -> None:
    a = advisory_namespace("public", "outbox")
    assert a == advisory_namespace("public", "outbox")
    assert a != advisory_namespace("public", "outbox2")
    for table in ("outbox", "x", "a" * 63, "Ünïcode"):
        assert -(2**31) <= advisory_namespace("s", table) < 2**31


def _settings(**values: object) -> Settings:
    return Settings.model_validate({"dsn": "host=127.0.0.1 dbname=x", **values})


def test_debezium_preset_is_refused_with_a_clear_message() -> None:
    with pytest.raises(ConfigError, match=r"polling mode needs the status columns.*debezium"):
        polling_relay(_settings(columns={"preset": "debezium"}))


def test_relay_without_headers_column_builds_and_names_itself() -> None:
    relay = polling_relay(_settings(columns={"headers": ""}), worker_id="w-1")
    assert relay.worker_id == "w-1" and relay.stats.mode == "polling"
    assert polling_relay(_settings()).worker_id != polling_relay(_settings()).worker_id


def test_sql_quotes_configured_names() -> None:
    settings = _settings(
        outbox_schema="App", outbox_table="OutBox", columns={"aggregate_id": "aggId"}
    )
    text = build(settings).claim.as_string(None)
    assert '"App"."OutBox"' in text and '"aggId"' in text


# -- one batch against an in-memory Kafka (tests/support/fakes/kafka.py) ----------------------


def _relay_on(cluster: FakeCluster, **values: object) -> PollingRelay:
    """A polling relay whose delivery produces into ``cluster`` (no database is touched by
    :meth:`PollingRelay._publish`)."""
    settings = _settings(**values)
    relay = polling_relay(settings, worker_id="w-1")
    relay._delivery = Delivery(
        delivery_section(settings), relay.stats, producer_client=cluster.client,
        interrupted=relay._interrupted,
    )  # fmt: skip
    return relay


def _rows(relay: PollingRelay, events: list[tuple[str, str]]) -> list[_Row]:
    """Claimed rows for ``(aggregate id, event type)`` pairs, in claim order."""
    ranks: dict[str, int] = {}
    rows = []
    for i, (agg, event_type) in enumerate(events):
        ranks[agg] = ranks.get(agg, 0) + 1
        values = (ranks[agg], i, f"id-{i}", "order", agg, event_type, f'{{"n": {i}}}', "{}",
                  None, 0, 1000.0 + i)  # fmt: skip
        rows.append(_Row(relay, values))
    return rows


def test_a_retried_row_holds_the_later_rows_of_its_aggregate_on_other_topics() -> None:
    """Row 1 of aggregate "a" fails with a retriable error on its topic; rows 2 and 3 of "a"
    go to other topics (topic per event type): none of them may reach Kafka before row 1
    does, so they are given back unsent. Aggregate "b" is not held."""
    cluster = FakeCluster()
    relay = _relay_on(cluster, topic_template="ev.{event_type}")
    rows = _rows(relay, [("a", "Created"), ("b", "Paid"), ("a", "Paid"), ("b", "Paid"),
                         ("a", "Shipped")])  # fmt: skip
    denied = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "denied", retriable=False)
    cluster.reject_next("ev.Created", denied)  # the first record on ev.Created: a's row 1
    relay._publish(rows)
    sent = [(r.topic, r.key) for r in cluster.read_committed("ev.")]
    assert b"a" not in {k for _t, k in sent}, sent
    assert [r.outcome for r in rows] == [RETRY, OK, BACK, OK, BACK]
    assert sent == [("ev.Paid", b"b"), ("ev.Paid", b"b")]
    assert relay._require_delivery().restart_reason is not None  # run() drops the session


def test_a_dead_lettered_row_parks_the_later_rows_of_its_aggregate_on_other_topics() -> None:
    cluster = FakeCluster()
    relay = _relay_on(cluster, topic_template="ev.{event_type}")
    rows = _rows(relay, [("a", "Created"), ("a", "Paid"), ("b", "Paid")])
    too_large = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too large", retriable=False)
    cluster.reject_next("ev.Created", too_large)
    relay._publish(rows)
    assert [r.outcome for r in rows] == [DEAD, DEAD, OK]
    letters = [dict(r.headers)["cdc_outbox.error"] for r in cluster.read_committed("cdc_outbox.")]
    assert letters[1] == b"blocked_by id-0", letters
    assert [r.key for r in cluster.read_committed("ev.")] == [b"b"]


def test_rows_of_one_aggregate_on_several_topics_all_go_when_nothing_fails() -> None:
    cluster = FakeCluster()
    relay = _relay_on(cluster, topic_template="ev.{event_type}")
    rows = _rows(relay, [("a", "Created"), ("a", "Paid"), ("b", "Paid"), ("a", "Paid"),
                         ("a", "Created")])  # fmt: skip
    relay._publish(rows)
    assert [r.outcome for r in rows] == [OK] * 5
    sent = [(r.topic, r.key, r.value) for r in cluster.read_committed("ev.")]
    a_values = [v for _t, k, v in sent if k == b"a"]
    assert a_values == [b'{"n": 0}', b'{"n": 1}', b'{"n": 3}', b'{"n": 4}']  # in row order


class _Conn:
    """What ``PollingRelay._write_outcomes`` uses of a connection: records each statement's
    parameters."""

    def __init__(self) -> None:
        self.params: list[dict[str, Any]] = []

    def transaction(self) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    def execute(self, statement: object, params: dict[str, Any]) -> SimpleNamespace:
        self.params.append(params)
        return SimpleNamespace(rowcount=len(params["ids"]))


def _given_back(relay: PollingRelay, conn: _Conn, outcome: str) -> float | None:
    """Row ``id-0`` claimed again and settled with ``outcome``: the delay written for it."""
    (row,) = _rows(relay, [("a", "Created")])
    row.outcome, row.error = outcome, "not authorised"
    conn.params.clear()
    relay._write_outcomes(conn, [row])  # type: ignore[arg-type]
    delays = [p["delays"][0] for p in conn.params if "delays" in p]
    return delays[0] if delays else None


def test_a_row_retried_again_and_again_backs_off_up_to_backoff_max_s() -> None:
    """Issue 35: every retry of a row waited ``backoff_base_s`` (the first failure's delay),
    whatever ``backoff_max_s`` said. The delay doubles per retry of the same row, up to the
    cap (jitter pinned at its top), and starts over once the row is published."""
    relay = polling_relay(_settings(polling={"backoff_base_s": 1.0, "backoff_max_s": 5.0}))
    relay._rng = SimpleNamespace(random=lambda: 1.0 - 1e-12)  # type: ignore[assignment]
    conn = _Conn()
    delays = [_given_back(relay, conn, RETRY) for _ in range(6)]
    assert delays == pytest.approx([1.0, 2.0, 4.0, 5.0, 5.0, 5.0])
    assert _given_back(relay, conn, BACK) is None  # given back unsent: no delay, no count
    assert _given_back(relay, conn, RETRY) == pytest.approx(5.0)
    assert _given_back(relay, conn, OK) is None
    assert _given_back(relay, conn, RETRY) == pytest.approx(1.0)  # published: starts over


def test_retry_counts_forget_the_oldest_row_past_their_limit() -> None:
    counts = RetryCounts(limit=2)
    rows = [SimpleNamespace(id=i, outcome=RETRY, error=None) for i in range(3)]
    counts.settle(rows[:2])
    counts.settle(rows[:1])  # row 0 retried again: now the newest
    counts.settle(rows[2:])
    assert counts.failures(rows) == {0: 3, 1: 1, 2: 2}  # row 1 was forgotten
