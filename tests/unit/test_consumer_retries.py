"""Issue 37: how often, and when, the idempotent consumer calls a handler that keeps failing.

``max_attempts`` calls in all (the batch's attempt is the first), with doubling backoff
between them; then the record is dead-lettered. The loop and the applier run on fakes: a
pool whose connections only count commits and rollbacks, a dead-letter sender that keeps
what it is given, and a fake clock as the stop event (``wait`` advances it, never sleeps).
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import psycopg
from psycopg import pq

from cdc_outbox.consumer.apply import Applier
from cdc_outbox.consumer.event_types import Event
from cdc_outbox.consumer.loop import IdempotentConsumer
from cdc_outbox.consumer.metrics import ConsumerMetrics
from cdc_outbox.consumer.settings import ConsumerSettings
from cdc_outbox.kafka.consumer import RawRecord


class _Clock:
    """The stop event: never set; ``wait`` moves time on by the delay."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def is_set(self) -> bool:
        return False

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.waits.append(timeout)
        self.now += timeout
        return False


class _Conn:
    """A connection whose COMMIT fails once ``fail_commit`` is set by a handler (as a
    deferred constraint would); the socket is a quiet socketpair end (never "lost")."""

    def __init__(self, sock: socket.socket) -> None:
        self.broken = False
        self.fail_commit = False
        self.pgconn = SimpleNamespace(status=pq.ConnStatus.OK, socket=sock.fileno())

    def commit(self) -> None:
        failing, self.fail_commit = self.fail_commit, False
        if failing:
            raise psycopg.errors.ForeignKeyViolation("dangling row")

    def rollback(self) -> None:
        self.fail_commit = False

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        yield


class _Pool:
    def __init__(self) -> None:
        self._ends = socket.socketpair()
        self.conn = _Conn(self._ends[0])

    @contextlib.contextmanager
    def connection(self) -> Iterator[_Conn]:
        yield self.conn

    def close(self) -> None:
        for end in self._ends:
            end.close()


class _Store:
    def park(self, conn: Any, topic: str, key: str, event_id: Any, reason: str) -> None:
        pass


class _DeadLetters:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, dict[str, Any]]] = []

    def send(self, topic: str, key: bytes | None, value: bytes | None, headers: Any) -> None:
        self.sent.append((topic, key, dict(headers)))


class _Source:
    def __init__(self) -> None:
        self.done: list[int] = []

    def done_records(self, records: list[RawRecord]) -> None:
        self.done.extend(r.offset for r in records)


class _Failing:
    """A handler that fails for the events in ``bad`` (raising, or making the COMMIT fail),
    noting the clock at each call."""

    def __init__(self, clock: _Clock, pool: _Pool, bad: set[int], *, at_commit: bool) -> None:
        self.clock, self.pool, self.bad, self.at_commit = clock, pool, bad, at_commit
        self.calls: dict[int, list[float]] = {}

    def __call__(self, conn: Any, event: Event) -> None:
        self.calls.setdefault(event.offset, []).append(self.clock.now)
        if event.offset in self.bad:
            if self.at_commit:
                self.pool.conn.fail_commit = True
            else:
                raise RuntimeError(f"cannot apply {event.offset}")


def _record(offset: int) -> RawRecord:
    headers = (("id", str(uuid.UUID(int=offset + 1)).encode()), ("event_type", b"Counted"),
               ("aggregate_type", b"counter"))  # fmt: skip
    return RawRecord("t", 0, offset, f"k-{offset}".encode(), b'{"n": 1}', headers)


def _run(max_attempts: int, bad: set[int], *, at_commit: bool, records: int = 3) -> Any:
    """Three records through the loop (one poll) with a handler failing for ``bad``."""
    settings = ConsumerSettings(
        consumer_name="retries", group_id="g", topics=("t",), bootstrap_servers="k:9092",
        dedupe=False, max_attempts=max_attempts, retry_backoff_s=0.1, retry_backoff_max_s=0.5,
    )  # fmt: skip
    clock, pool, letters, source = _Clock(), _Pool(), _DeadLetters(), _Source()
    handler = _Failing(clock, pool, bad, at_commit=at_commit)
    metrics = ConsumerMetrics("retries")
    consumer = IdempotentConsumer(settings, pool, handler, metrics=metrics)  # type: ignore[arg-type]
    consumer._stop = clock  # type: ignore[assignment]
    applier = Applier(settings, pool, handler, _Store(), letters, consumer._parked,  # type: ignore[arg-type]
                      clock, metrics)  # type: ignore[arg-type]  # fmt: skip
    kafka = SimpleNamespace(done=source.done_records)
    try:
        consumer._consume([_record(i) for i in range(records)], applier, kafka)  # type: ignore[arg-type]
    finally:
        pool.close()
    return SimpleNamespace(
        calls=handler.calls, letters=letters.sent, done=source.done, counts=metrics.counts
    )


def _gaps(times: list[float]) -> list[float]:
    return [round(b - a, 9) for a, b in itertools.pairwise(times)]


def test_a_failing_handler_is_called_max_attempts_times_with_doubling_gaps() -> None:
    got = _run(4, {1}, at_commit=False)
    assert len(got.calls[1]) == 4  # before: 5 (once in the batch, then 4 times alone)
    assert _gaps(got.calls[1]) == [0.1, 0.2, 0.4]  # before: [0.0, 0.1, 0.2, 0.4]
    (letter,) = got.letters
    reason = letter[2]["cdc_outbox.error"]
    assert reason == b"handler failed after 4 attempt(s): RuntimeError: cannot apply 1"
    assert got.done == [0, 1, 2]
    assert got.counts == {"processed": 2, "duplicate": 0, "dead_lettered": 1, "retried": 3}
    assert len(got.calls[0]) == 2 and len(got.calls[2]) == 1  # redone once after the batch


def test_the_backoff_is_capped_by_retry_backoff_max_s() -> None:
    got = _run(6, {0}, at_commit=False, records=1)
    assert _gaps(got.calls[0]) == [0.1, 0.2, 0.4, 0.5, 0.5]


def test_one_attempt_dead_letters_after_the_batch_call_alone() -> None:
    got = _run(1, {1}, at_commit=False)
    assert got.calls[1] == [0.0]  # before: called a second time, alone
    assert got.letters[0][2]["cdc_outbox.error"].startswith(b"handler failed after 1 attempt(s)")
    assert got.counts["retried"] == 0


def test_a_commit_that_keeps_failing_is_attempted_max_attempts_times_with_doubling_gaps() -> None:
    got = _run(4, {1}, at_commit=True)
    assert len(got.calls[1]) == 4
    assert _gaps(got.calls[1]) == [0.1, 0.2, 0.4]
    (letter,) = got.letters
    assert letter[2]["cdc_outbox.error"].startswith(
        b"commit failed after 4 attempt(s): ForeignKeyViolation: dangling row"
    )
    assert got.done == [0, 1, 2]
    assert got.counts == {"processed": 2, "duplicate": 0, "dead_lettered": 1, "retried": 3}
