"""An in-memory Kafka cluster with transactions, and the producer client and checkpoint
store the relay takes through its ports.

Model: a record produced is in the log at once (the broker has it: visible without a
transaction, or part of the producer's open transaction, visible to ``read_committed``
readers only after ``commit_transaction``), but its delivery report waits until the client's
``poll``/``flush`` serves it. ``purge``/``abort_transaction`` fail the reports not served yet
with ``_PURGE_QUEUE`` (the records may be written all the same: at-least-once duplicates); an
abort marks the open transaction's records aborted. ``init_transactions`` fences the previous
client with the same ``transactional.id``: its later calls raise a fatal ``_FENCED`` error.
Faults are injected with :meth:`FakeCluster.fail_next_commit`,
:meth:`FakeCluster.land_next_commit_failing` and :meth:`FakeCluster.reject_next`; as with
librdkafka's idempotent producer, once a record of a topic failed, every later one of that
topic fails too until its failure is reported or the queue is purged (no record overtakes a
failed one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message

from cdc_outbox.kafka.checkpoints import Checkpoint


@dataclass
class Record:
    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    state: str  # "committed", "open", "aborted"
    txn: int = 0


@dataclass
class FakeCluster:
    log: list[Record] = field(default_factory=list)
    epochs: dict[str, int] = field(default_factory=dict)
    commits_to_fail: int = 0
    #: Commits that land (the transaction is committed) but are reported as failed.
    commits_to_land_failing: int = 0
    rejections: list[tuple[str, KafkaError]] = field(default_factory=list)
    #: Which transactional.id opened each transaction (fencing aborts the fenced one's).
    owners: dict[int, str | None] = field(default_factory=dict)
    _txn_ids: int = 0

    def client(self, config: dict[str, Any]) -> FakeProducerClient:
        return FakeProducerClient(self, config)

    def fail_next_commit(self, times: int = 1) -> None:
        """The next ``times`` commits fail with an abortable error (the transaction is
        aborted by the relay and re-sent)."""
        self.commits_to_fail += times

    def land_next_commit_failing(self, times: int = 1) -> None:
        """The next ``times`` commits reach the coordinator and commit, but the client is told
        they failed (the coordinator became unreachable before it answered and stayed so past
        the transaction timeout): the relay aborts, which no longer changes anything."""
        self.commits_to_land_failing += times

    def reject_next(self, topic_prefix: str, error: KafkaError) -> None:
        """The next record on a topic starting with ``topic_prefix`` fails with ``error``."""
        self.rejections.append((topic_prefix, error))

    def read_committed(self, topic_prefix: str) -> list[Record]:
        return [r for r in self.log if r.state == "committed" and r.topic.startswith(topic_prefix)]

    def read_uncommitted(self, topic_prefix: str) -> list[Record]:
        return [r for r in self.log if r.topic.startswith(topic_prefix)]

    def new_txn(self) -> int:
        self._txn_ids += 1
        return self._txn_ids


def _error(code: int, *, fatal: bool = False, abortable: bool = False, retriable: bool = False):
    return KafkaError(code, "fake", fatal=fatal, retriable=retriable, txn_requires_abort=abortable)


@dataclass
class _Pending:
    record: Record
    report: Callable[[KafkaError | None, Message], None]
    error: KafkaError | None


class FakeProducerClient:
    """What KafkaPublisher uses of confluent_kafka.Producer (ProducerClient)."""

    def __init__(self, cluster: FakeCluster, config: dict[str, Any]) -> None:
        self.cluster = cluster
        self.tid: str | None = config.get("transactional.id")
        self.epoch = -1
        self.txn = 0  # the open transaction (0: none)
        self.pending: list[_Pending] = []
        self.txn_failed = False
        self.broken: dict[str, KafkaError] = {}  # topics whose queue failed (see the module)

    # -- records ---------------------------------------------------------------------------

    def produce(
        self, topic: str, value: bytes | None, key: bytes | None, *, headers: Any, on_delivery: Any
    ) -> None:
        self._check_fenced()
        if self.tid is not None and not self.txn:
            raise KafkaException(_error(KafkaError._STATE))
        record = Record(topic, key, value, list(headers or []), "pending", self.txn)
        error = self._rejection(topic) or self.broken.get(topic)
        if error is not None:
            self.broken[topic] = error
        if error is None:  # the broker has it; the report waits for poll
            record.state = "open" if self.tid is not None else "committed"
            self.cluster.log.append(record)
        elif self.txn:
            self.txn_failed = True  # a failed record makes the transaction abortable
        self.pending.append(_Pending(record, on_delivery, error))

    def poll(self, timeout: float = 0.0) -> int:
        served = 0
        while self.pending:
            item = self.pending.pop(0)
            served += 1
            msg = Message(topic=item.record.topic, key=item.record.key, value=item.record.value)
            if item.error is not None:  # reported: records produced from now on go through
                self.broken.pop(item.record.topic, None)
            item.report(item.error, msg)
        return served

    def flush(self, timeout: float = 0.0) -> int:
        self.poll(0)
        return 0

    def purge(
        self, *, in_queue: bool = True, in_flight: bool = True, blocking: bool = True
    ) -> None:
        self.broken.clear()
        for item in self.pending:
            msg = Message(topic=item.record.topic, key=item.record.key, value=item.record.value)
            item.report(_error(KafkaError._PURGE_QUEUE), msg)
        self.pending.clear()

    def __len__(self) -> int:
        return len(self.pending)

    def list_topics(self, *, timeout: float = 0.0) -> Any:
        return None

    # -- transactions ----------------------------------------------------------------------

    def init_transactions(self, timeout: float) -> None:
        assert self.tid is not None
        cluster = self.cluster
        cluster.epochs[self.tid] = self.epoch = cluster.epochs.get(self.tid, 0) + 1
        for r in cluster.log:  # the fenced producer's open transaction is aborted
            if r.state == "open" and r.txn in self._txns_of_tid():
                r.state = "aborted"

    def begin_transaction(self) -> None:
        self._check_fenced()
        self.txn = self.cluster.new_txn()
        self.txn_failed = False
        self.cluster.owners[self.txn] = self.tid

    def commit_transaction(self, timeout: float) -> None:
        self._check_fenced()
        self.poll(0)
        if self.cluster.commits_to_land_failing and not self.txn_failed:
            self.cluster.commits_to_land_failing -= 1
            self._settle("committed")  # the open transaction stays: an abort finds it done
            raise KafkaException(_error(KafkaError._TIMED_OUT, abortable=True))
        if self.cluster.commits_to_fail or self.txn_failed:
            if self.cluster.commits_to_fail:
                self.cluster.commits_to_fail -= 1
            raise KafkaException(_error(KafkaError._TIMED_OUT, abortable=True))
        self._settle("committed")
        self.txn = 0

    def abort_transaction(self, timeout: float) -> None:
        self._check_fenced()
        self.purge()
        self._settle("aborted")
        self.txn = 0

    # -- helpers ---------------------------------------------------------------------------

    def _settle(self, state: str) -> None:
        for r in self.cluster.log:
            if r.txn == self.txn and r.state == "open":
                r.state = state

    def _txns_of_tid(self) -> set[int]:
        return {t for t, owner in self.cluster.owners.items() if owner == self.tid}

    def _check_fenced(self) -> None:
        if self.tid is not None and self.cluster.epochs.get(self.tid, 0) != self.epoch:
            raise KafkaException(_error(KafkaError._FENCED, fatal=True))

    def _rejection(self, topic: str) -> KafkaError | None:
        for i, (prefix, error) in enumerate(self.cluster.rejections):
            if topic.startswith(prefix):
                del self.cluster.rejections[i]
                return error
        return None


class FakeCheckpoints:
    """The checkpoint topic of a :class:`FakeCluster` (CheckpointStore)."""

    def __init__(self, cluster: FakeCluster, topic: str) -> None:
        self.cluster = cluster
        self.topic = topic
        self.reads = 0

    def ensure(self) -> None:
        pass

    def read_last(self, key: bytes, valid: Callable[[Checkpoint], bool]) -> Checkpoint | None:
        self.reads += 1
        last = None
        for r in self.cluster.read_committed(self.topic):
            if r.topic == self.topic and r.key == key:
                cp = Checkpoint.decode(r.value or b"")
                if valid(cp):
                    last = cp
        return last
