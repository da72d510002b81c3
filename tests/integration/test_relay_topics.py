"""The relay's own topics belong to it (issue 23): a row routed onto the checkpoint topic is a
dead letter, and a forged checkpoint record on it is never trusted (real PostgreSQL, Kafka)."""

from __future__ import annotations

from typing import Any

import psycopg
from confluent_kafka import Producer

from cdc_outbox.kafka.checkpoints import Checkpoint
from cdc_outbox_dev.readback import read_topics
from tests.support.helpers import wait_until
from tests.support.relay import init_outbox, outbox_statuses, relay_settings, relay_thread

COMMITTED = {"isolation.level": "read_committed"}


def _insert(dsn: str, aggregate_type: str, n: int, aggregate: str = "agg") -> None:
    with psycopg.connect(dsn) as conn:
        for i in range(n):
            conn.execute(
                "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)"
                " VALUES (gen_random_uuid(), %s, %s, 'E', %s::jsonb)",
                (aggregate_type, f"{aggregate}-{i % 5}", f'{{"n": {i}}}'),
            )


def test_a_row_routed_onto_the_checkpoint_topic_and_a_forged_checkpoint_change_nothing(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str
) -> None:
    prefix = kafka_topic_prefix
    bootstrap = kafka_broker.bootstrap_servers
    settings = relay_settings(
        pg_dsn,
        bootstrap,
        prefix,
        delivery="exactly_once",
        topic_template=prefix + ".{aggregate_type}",
        eos={"checkpoint_topic": f"{prefix}.checkpoints"},
    )
    init_outbox(settings)
    with relay_thread(settings) as relay:
        _insert(pg_dsn, "orders", 10)
        # Its topic would be the relay's checkpoint topic (another aggregate: a dead letter
        # parks its own aggregate's later events).
        _insert(pg_dsn, "checkpoints", 1, aggregate="poison")
        wait_until(lambda: outbox_statuses(pg_dsn).get("PENDING", 0) == 0, timeout=90)
        assert relay.eos is not None
        key = Checkpoint(settings.slot_name, relay.eos.system_id, relay.eos.database, 0).key
        system_id, database = relay.eos.system_id, relay.eos.database
    assert outbox_statuses(pg_dsn) == {"PUBLISHED": 10, "FAILED": 1}
    dead = read_topics(bootstrap, f"{prefix}.dlq", extra_config=COMMITTED)
    assert len(dead) == 1
    assert b"is reserved for the relay's own records" in dict(dead[0].headers)["cdc_outbox.error"]
    # Only the relay's own records are on its checkpoint topic.
    cps = read_topics(bootstrap, f"{prefix}.checkpoints", extra_config=COMMITTED)
    assert cps and all(Checkpoint.decode(r.value or b"").slot == settings.slot_name for r in cps)

    # Someone writes a forged checkpoint (far ahead) and a malformed one under the relay's key:
    # a relay started next ignores both (an error line each) and publishes the new rows.
    forged = Checkpoint(
        settings.slot_name, system_id, database, 1 << 60, producer="someone-else"
    ).encode()
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(f"{prefix}.checkpoints", forged, key)
    producer.produce(f"{prefix}.checkpoints", b"{not json", key)
    assert producer.flush(30) == 0
    _insert(pg_dsn, "orders", 10)
    with relay_thread(settings):
        wait_until(lambda: outbox_statuses(pg_dsn).get("PENDING", 0) == 0, timeout=90)
    got = read_topics(bootstrap, f"{prefix}.orders", extra_config=COMMITTED)
    assert len(got) == 20  # none skipped on the forged position, none twice
