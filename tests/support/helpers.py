"""Test helpers shared by all tests: condition waits, reading Kafka topics back, and the topic /
ACL changes that cause Kafka faults on the ``kafka_strict_broker`` (docs/kafka-faults.md).

Fixtures live in tests/conftest.py; plain functions live here
(``from tests.support.helpers import ...``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from cdc_outbox.cdc.history import History
from cdc_outbox.cdc.ledger import Ledger
from cdc_outbox.cdc.slot_feedback import Checkpointer
from cdc_outbox.config.settings import Settings
from cdc_outbox.telemetry.relay_stats import RelayStats

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T],
    timeout: float = 10.0,
    interval: float = 0.05,
    message: str | Callable[[], str] = "",
) -> T:
    """Poll ``predicate`` until it returns something truthy and return that value.

    Raises ``AssertionError`` after ``timeout`` seconds; ``message`` (a string, or a callable
    evaluated at failure time to describe the current state) is included.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            detail = message() if callable(message) else message
            raise AssertionError(f"condition not met within {timeout:.1f}s: {detail}".rstrip(": "))
        time.sleep(interval)


class RecordingHandle:
    """An ``EventHandle`` (cdc_outbox.delivery.engine) that records each outcome in order:
    ``published``, ``dead_lettered`` or ``retry: <reason>``."""

    def __init__(self) -> None:
        self.outcomes: list[str] = []

    def published(self, topic: str) -> None:
        self.outcomes.append("published")

    def dead_lettered(self) -> None:
        self.outcomes.append("dead_lettered")

    def retry(self, reason: str) -> None:
        self.outcomes.append(f"retry: {reason}")


@dataclass(frozen=True)
class ConsumedMessage:
    """One Kafka record as read back by :func:`consume_all`."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    timestamp_ms: int


def consume_all(
    bootstrap_servers: str,
    topics: Sequence[str],
    expected_count: int | None = None,
    until_idle_s: float = 1.0,
    timeout: float = 30.0,
) -> list[ConsumedMessage]:
    """Read ``topics`` from the beginning (all partitions, no consumer group) and return records
    ordered as received (per-partition order is preserved).

    With ``expected_count``: return as soon as that many arrived; ``AssertionError`` on timeout.
    Without: return once all topics exist and nothing arrived for ``until_idle_s`` seconds.
    Topics that do not exist yet are waited for (up to ``timeout``).
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": f"test-reader-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "fetch.wait.max.ms": 50,
            "auto.offset.reset": "earliest",
        }
    )
    records: list[ConsumedMessage] = []
    pending = set(topics)
    deadline = time.monotonic() + timeout
    last_activity = time.monotonic()
    try:
        while True:
            now = time.monotonic()
            if pending:
                _assign_existing(consumer, pending)
                if not pending:  # idle time counts from when every topic is assigned
                    last_activity = now
            if expected_count is not None and len(records) >= expected_count:
                return records
            if expected_count is None and not pending and now - last_activity >= until_idle_s:
                return records
            if now >= deadline:
                if expected_count is None and not pending:
                    return records
                raise AssertionError(
                    f"consumed {len(records)} of {expected_count} records from {list(topics)}"
                    f" within {timeout:.0f}s; missing topics: {sorted(pending)}"
                )
            msg = consumer.poll(0.1)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                if error.code() in (KafkaError._PARTITION_EOF, KafkaError.UNKNOWN_TOPIC_OR_PART):
                    continue
                raise AssertionError(f"consumer error: {error}")
            last_activity = time.monotonic()
            records.append(_record(msg))
    finally:
        consumer.close()


def _record(msg: Message) -> ConsumedMessage:
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    assert topic is not None and partition is not None and offset is not None
    raw = msg.headers() or []
    pairs = list(raw.items()) if isinstance(raw, dict) else raw
    headers = [(k, v.encode() if isinstance(v, str) else v) for k, v in pairs]
    return ConsumedMessage(
        topic=topic,
        partition=partition,
        offset=offset,
        key=_as_bytes(msg.key()),
        value=_as_bytes(msg.value()),
        headers=headers,
        timestamp_ms=msg.timestamp()[1],
    )


def _as_bytes(data: str | bytes | None) -> bytes | None:
    return data.encode() if isinstance(data, str) else data


def _assign_existing(consumer: Consumer, pending: set[str]) -> None:
    """Assign every partition (from the beginning) of the pending topics that exist now."""
    metadata = consumer.list_topics(timeout=5)
    for name in list(pending):
        topic = metadata.topics.get(name)
        if topic is None or topic.error is not None or not topic.partitions:
            continue
        consumer.incremental_assign(
            [TopicPartition(name, p, OFFSET_BEGINNING) for p in sorted(topic.partitions)]
        )
        pending.discard(name)


#: The principal of every PLAINTEXT client, the broker's own controller connections included.
ANONYMOUS = "User:ANONYMOUS"


def create_topic(
    bootstrap: str, name: str, partitions: int = 3, timeout: float = 30.0, replication: int = 1
) -> None:
    """Create topic ``name`` (replication factor ``replication``); return once every partition
    has a leader."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = NewTopic(name, partitions, replication)
    future = admin.create_topics([new], operation_timeout=timeout)[name]
    future.result(timeout)

    def led() -> bool:
        topic = admin.list_topics(name, timeout=5).topics.get(name)
        return (
            topic is not None
            and topic.error is None
            and len(topic.partitions) == partitions
            and all(p.leader >= 0 for p in topic.partitions.values())
        )

    wait_until(led, timeout, message=f"topic {name} has no leader for every partition")


def deny_topic_writes(
    bootstrap: str,
    topic_or_prefix: str,
    *,
    prefixed: bool = False,
    readable: bool = True,
    timeout: float = 30.0,
) -> None:
    """Deny WRITE on a topic (or, with ``prefixed``, every topic starting with the prefix) to
    User:ANONYMOUS; return once the broker's authorizer holds the ACLs.

    Producers then get TOPIC_AUTHORIZATION_FAILED (29). With ``readable`` (default) an ALLOW ALL
    binding on the same pattern is added too (DENY wins): the topic stays visible and readable,
    only writes fail. Without it the pattern's only ACL is the DENY, so
    ``allow.everyone.if.no.acl.found`` no longer applies to it: metadata, reads and writes all
    fail with 29. Needs a broker with an authorizer (``kafka_strict_broker``).
    """
    pattern = ResourcePatternType.PREFIXED if prefixed else ResourcePatternType.LITERAL
    wanted = [
        AclBinding(ResourceType.TOPIC, topic_or_prefix, pattern, ANONYMOUS, "*", op, permission)
        for op, permission in [(AclOperation.WRITE, AclPermissionType.DENY)]
        + ([(AclOperation.ALL, AclPermissionType.ALLOW)] if readable else [])
    ]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_acls(wanted, request_timeout=timeout).values():
        future.result(timeout)
    wait_until(
        lambda: set(wanted) <= set(_acls(admin, topic_or_prefix, pattern)),
        timeout,
        message=f"the broker never showed the ACLs denying writes to {topic_or_prefix}",
    )


def allow_topic_writes(
    bootstrap: str, topic_or_prefix: str, *, prefixed: bool = False, timeout: float = 30.0
) -> None:
    """Undo :func:`deny_topic_writes`: delete every User:ANONYMOUS ACL on exactly that literal or
    prefixed pattern; return once the broker's authorizer no longer holds any of them.

    Clients notice on their next metadata refresh: a producer that just got
    TOPIC_AUTHORIZATION_FAILED may reject ``produce()`` for up to ~0.5 s more.
    """
    pattern = ResourcePatternType.PREFIXED if prefixed else ResourcePatternType.LITERAL
    admin = AdminClient({"bootstrap.servers": bootstrap})
    match = AclBindingFilter(
        ResourceType.TOPIC,
        topic_or_prefix,
        pattern,
        ANONYMOUS,
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    for future in admin.delete_acls([match], request_timeout=timeout).values():
        future.result(timeout)
    wait_until(
        lambda: not _acls(admin, topic_or_prefix, pattern),
        timeout,
        message=lambda: f"ACLs still there: {_acls(admin, topic_or_prefix, pattern)}",
    )


def delete_all_acls(bootstrap: str, timeout: float = 30.0) -> list[AclBinding]:
    """Delete every ACL on the broker; return the ones that were there (once they are gone)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    every = AclBindingFilter(
        ResourceType.ANY,
        None,
        ResourcePatternType.ANY,
        None,
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    found: list[AclBinding] = admin.describe_acls(every, request_timeout=timeout).result(timeout)
    if found:
        for future in admin.delete_acls([every], request_timeout=timeout).values():
            future.result(timeout)
        wait_until(
            lambda: not admin.describe_acls(every).result(timeout),
            timeout,
            message="ACLs still present after deleting all of them",
        )
    return found


def _acls(admin: AdminClient, name: str, pattern: ResourcePatternType) -> list[AclBinding]:
    """The User:ANONYMOUS topic ACLs on exactly this pattern, as the broker reports them."""
    match = AclBindingFilter(
        ResourceType.TOPIC, name, pattern, ANONYMOUS, None, AclOperation.ANY, AclPermissionType.ANY
    )
    found: list[AclBinding] = admin.describe_acls(match).result(10)
    return found


def vm_hwm_kb(pid: int) -> int:
    """Peak resident set size (``VmHWM``) of process ``pid``, in kB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def run_cli(*args: str, dsn: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m cdc_outbox`` with only the CDC_OUTBOX_* variables given here."""
    environ = {k: v for k, v in os.environ.items() if not k.upper().startswith("CDC_OUTBOX_")}
    if dsn is not None:
        environ["CDC_OUTBOX_DSN"] = dsn
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-m", "cdc_outbox", *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


class StatusRecorder:
    """Stands in for the replication stream where a Checkpointer sends its status updates:
    records ``(written, flushed)`` of each."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, int]] = []

    def send_status(self, written: int, flushed: int, *, reply_requested: bool = False) -> None:
        self.sent.append((written, flushed))


def recording_checkpointer(
    ledger: Ledger, start: int, **options: Any
) -> tuple[Checkpointer, StatusRecorder]:
    """A Checkpointer of ``ledger`` (a session started at ``start``; timer 10 s: only explicit
    sends) and what it sent."""
    stream = StatusRecorder()
    ledger.start_session(History("test", 1, 2**62), start)
    checkpointer = Checkpointer(
        stream,  # type: ignore[arg-type]
        ledger,
        RelayStats(),
        start=start,
        interval_s=10.0,
        **options,
    )
    return checkpointer, stream


def arrivals_and_order(
    records: Sequence[Any], ids: Sequence[str]
) -> tuple[Counter[str], list[str]]:
    """(how often each of ``ids`` is among ``records`` (by their ``id`` header), the
    per-key order violations of the ``seq`` field among first arrivals)."""
    wanted = set(ids)
    counts: Counter[str] = Counter()
    last: dict[bytes, int] = {}
    broken = []
    for r in records:
        eid = dict(r.headers)["id"].decode()
        if eid not in wanted:
            continue
        counts[eid] += 1
        if counts[eid] > 1:
            continue
        seq = json.loads(r.value)["seq"]
        if seq < last.get(r.key, 0):
            broken.append(f"{r.key!r}: {seq} after {last[r.key]}")
        last[r.key] = seq
    return counts, broken


def lead_through_failing_streams(
    settings: Settings, monkeypatch: Any, failures: int = 3
) -> tuple[list[str], int]:
    """Run ``Service._lead`` (auto mode's choice) while every replication stream fails with
    ``CdcUnavailable`` (CDC itself usable: ``cdc_problem`` names a problem of the server),
    until ``failures`` streams failed or the service fell back to polling. Returns (the
    problems it fell back to polling for, the streams tried)."""
    import dataclasses

    from cdc_outbox.cdc.stream_failures import CdcUnavailable
    from cdc_outbox.config.backoff import BackoffPolicy
    from cdc_outbox.service import relay_service as service_mod
    from cdc_outbox.service.wiring import build_service

    svc = build_service(settings)
    fell_back: list[str] = []
    attempts: list[int] = []

    def stream_fails() -> None:
        attempts.append(1)
        if len(attempts) == failures:
            svc.request_stop()
        raise CdcUnavailable("the replication connection failed")

    def fall_back(_: Any, problem: str) -> None:
        fell_back.append(problem)
        svc.request_stop()

    svc.ops = dataclasses.replace(
        svc.ops,
        cdc_problem=lambda: "wal_level is 'replica'",
        publication_must_fit=stream_fails,
    )
    monkeypatch.setattr(service_mod, "RECONNECT", BackoffPolicy(base_s=0.0, max_s=0.0))
    monkeypatch.setattr(svc, "_read_state", lambda: None)
    monkeypatch.setattr(svc, "_fall_back", fall_back)

    class Lead:
        def is_leader(self) -> bool:
            return True

    svc._lead(Lead())  # type: ignore[arg-type]
    return fell_back, len(attempts)
