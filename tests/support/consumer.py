"""Helpers for consumer tests: ``cdc-outbox consume`` as a real process, outbox-shaped records
produced straight into Kafka, and the handlers' bookkeeping table."""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psycopg
from confluent_kafka import Producer

from tests.support.helpers import create_topic, wait_until
from tests.support.relay_process import ChildProcess

#: What the handlers in tests/support/consumer_handlers.py write: one row per application.
APPLIED_DDL = """
CREATE TABLE IF NOT EXISTS applied (
    seq bigserial PRIMARY KEY,
    event_id uuid NOT NULL,
    aggregate_id text NOT NULL,
    n integer NOT NULL
)
"""


@dataclass(frozen=True)
class OutboxEvent:
    event_id: uuid.UUID
    aggregate_id: str
    n: int  # 1, 2, 3, ... per aggregate: the order it must be applied in
    extra: dict[str, object] | None = None


def produce_events(bootstrap: str, topic: str, events: Sequence[OutboxEvent]) -> None:
    """Produce ``events`` in order as the relay would (key = aggregate id, ``id`` header)."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20}
    )
    for e in events:
        value = {"n": e.n, **(e.extra or {})}
        headers = [
            ("id", str(e.event_id).encode()),
            ("event_type", b"Counted"),
            ("aggregate_type", b"counter"),
        ]
        while True:
            try:
                producer.produce(topic, json.dumps(value).encode(), e.aggregate_id.encode(),
                                 headers=headers)  # fmt: skip
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(60) == 0


def counter_topics(
    dsn: str, bootstrap: str, prefix: str, partitions: int, *ddl: str
) -> tuple[str, str]:
    """(topic, dead-letter topic) of a test, both created, and the ``applied`` table plus
    ``ddl`` created in ``dsn``."""
    topic, dlq = f"{prefix}.event.counter", f"{prefix}.consumer-dlq"
    create_topic(bootstrap, topic, partitions=partitions)
    create_topic(bootstrap, dlq, partitions=1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in (APPLIED_DDL, *ddl):
            conn.execute(statement)
    return topic, dlq


def applied_rows(dsn: str) -> list[tuple[int, str, str, int]]:
    with psycopg.connect(dsn) as conn:
        return [
            (seq, str(eid), agg, n)
            for seq, eid, agg, n in conn.execute(
                "SELECT seq, event_id, aggregate_id, n FROM applied ORDER BY seq"
            )
        ]


def count_rows(dsn: str, table: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()  # noqa: S608 (test)
        return int(row[0]) if row else 0


def wait_processed(dsn: str, events: int, timeout: float, context: Callable[[], str]) -> None:
    """Wait until ``processed_events`` holds ``events`` rows (a timeout shows the count and
    ``context()``, e.g. the process logs)."""
    wait_until(
        lambda: count_rows(dsn, "processed_events") >= events,
        timeout=timeout,
        interval=0.5,
        message=lambda: f"{count_rows(dsn, 'processed_events')}/{events} processed; {context()}",
    )


class ConsumerProcess(ChildProcess):
    """``python -m cdc_outbox consume ...`` as a real child process (kill -9, SIGTERM)."""

    def __init__(
        self, name: str, dsn: str, bootstrap: str, *args: str, env: dict[str, str] | None = None
    ) -> None:
        super().__init__(name)
        self.args = args
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_OUTBOX_")}
        self.env.update(CDC_OUTBOX_DSN=dsn, CDC_OUTBOX_KAFKA__BOOTSTRAP_SERVERS=bootstrap)
        self.env.update(env or {})

    def start(self) -> None:
        self._spawn(["consume", *self.args], self.env)

    def terminate(self, timeout: float = 60) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)
