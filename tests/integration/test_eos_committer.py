"""EosCommitter's streaming turn against a real broker (the relay around it is tested in
test_exactly_once.py)."""

from __future__ import annotations

from cdc_outbox.cdc.eos import EosCommitter
from cdc_outbox.cdc.history import History
from cdc_outbox.config.cdc import eos_section
from cdc_outbox.config.delivery import delivery_section
from cdc_outbox.config.settings import Settings
from cdc_outbox.delivery.engine import Delivery
from cdc_outbox.records import OutboxRecord
from cdc_outbox.store.outbox_table import OutboxTable
from cdc_outbox.telemetry.relay_stats import RelayStats
from cdc_outbox_dev.readback import read_topics
from tests.support.helpers import RecordingHandle, wait_until


def test_a_close_that_is_acknowledged_at_once_commits_in_the_same_step(
    kafka_broker, kafka_topic_prefix: str
) -> None:
    """The relay blocks on its next WAL read (up to 100 ms) unless the exactly-once step left
    something to wait for: a step must never return with a close that could commit."""
    settings = Settings.model_validate(
        {
            "dsn": "postgresql://unused@127.0.0.1:1/none",
            "delivery": "exactly_once",
            "slot_name": "eos_step",
            "eos": {
                "checkpoint_topic": f"{kafka_topic_prefix}.checkpoints",
                "commit_interval_ms": 1,
            },
            "kafka": {"bootstrap_servers": kafka_broker.bootstrap_servers},
        }
    )
    stats = RelayStats()
    section = delivery_section(settings)
    delivery = Delivery(section, stats, transactional_id=f"{kafka_topic_prefix}-step")
    eos = EosCommitter(
        eos_section(settings), OutboxTable.all_of(settings), delivery, stats, ("7", "db")
    )
    eos.start_session(History("7", 1, 10**9))
    publisher = delivery.publisher
    topic = f"{kafka_topic_prefix}.order"
    handles: list[RecordingHandle] = []
    commits_left_ready = 0
    try:
        for n in range(20):
            eos.batch.begin()
            eos.add_event()
            handle = RecordingHandle()
            handles.append(handle)
            record = OutboxRecord(topic, b"agg", str(n).encode(), [("id", b"%d" % n)], str(n))
            delivery.submit(record, handle)
            eos.batch.end(1000 + n, had_events=True)
            wait_until(lambda: publisher.flush(0.01) == 0, 30, 0.001, "the acknowledgement")
            wait_until(eos.due, 30, 0.001, "the interval")
            eos.step(lambda: None, lambda: None)
            if eos.closing and eos.close_ready():
                commits_left_ready += 1
            while eos.closing:  # not acknowledged within begin_close's flush: the next turn
                publisher.poll(0.01)
                eos.step(lambda: None, lambda: None)
            assert eos.batch.committed_lsn == 1000 + n
    finally:
        publisher.close(5)
    assert commits_left_ready == 0
    assert all(h.outcomes == ["published"] for h in handles)
    got = read_topics(
        kafka_broker.bootstrap_servers, topic, extra_config={"isolation.level": "read_committed"}
    )
    assert [r.value for r in got] == [str(n).encode() for n in range(20)]
