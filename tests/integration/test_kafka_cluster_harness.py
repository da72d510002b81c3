"""The three-node test cluster itself (cdc_outbox_dev/sandbox/kafka_cluster.py): three brokers
in the metadata, replication factor 3 with min.insync.replicas=2, a killed leader replaced
by a replica and back after a start, the coordinator and the controller found."""

from __future__ import annotations

from confluent_kafka import Producer

from cdc_outbox_dev.sandbox.kafka_cluster import LocalKafkaCluster
from tests.support.helpers import consume_all, create_topic, wait_until


def test_three_brokers_replicate_and_a_killed_leader_is_replaced(
    kafka_cluster: LocalKafkaCluster, kafka_topic_prefix: str
) -> None:
    assert kafka_cluster.brokers() == {1, 2, 3}
    assert len(kafka_cluster.bootstrap_servers.split(",")) == 3
    topic = f"{kafka_topic_prefix}.t"
    create_topic(kafka_cluster.bootstrap_servers, topic, partitions=3, replication=3)
    wait_until(lambda: kafka_cluster.fully_replicated([topic]), timeout=30)
    parts = kafka_cluster.partitions(topic)
    assert all(sorted(replicas) == [1, 2, 3] for _leader, replicas, _isr in parts.values())

    leader = kafka_cluster.leader_of(topic, 0)
    assert leader in (1, 2, 3)
    kafka_cluster.kill(leader)
    assert leader not in kafka_cluster.running_nodes()
    wait_until(lambda: kafka_cluster.leader_of(topic, 0) not in (-1, leader), timeout=60)
    kafka_cluster.wait_brokers({1, 2, 3} - {leader})
    # Two of three replicas meet min.insync.replicas=2: acks=all writes still succeed.
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers, "acks": "all"})
    producer.produce(topic, b"while-one-is-down", partition=0)
    assert producer.flush(30) == 0

    kafka_cluster.start_node(leader)
    assert kafka_cluster.brokers() == {1, 2, 3}
    wait_until(lambda: kafka_cluster.fully_replicated([topic]), timeout=60)
    records = consume_all(kafka_cluster.bootstrap_servers, [topic], expected_count=1)
    assert [r.value for r in records] == [b"while-one-is-down"]


def test_coordinator_and_controller_are_found_and_move_when_killed(
    kafka_cluster: LocalKafkaCluster,
) -> None:
    producer = Producer(
        {"bootstrap.servers": kafka_cluster.bootstrap_servers, "transactional.id": "harness-t"}
    )
    producer.init_transactions(60)
    coordinator = kafka_cluster.coordinator_of("harness-t")
    assert coordinator in (1, 2, 3)
    controller = wait_until(kafka_cluster.active_controller, timeout=30)
    kafka_cluster.kill(controller)
    elected = wait_until(
        lambda: (c := kafka_cluster.active_controller()) not in (None, controller) and c,
        timeout=60,
    )
    assert elected in {1, 2, 3} - {controller}
    if coordinator == controller:
        wait_until(
            lambda: _coordinator_or_none(kafka_cluster, "harness-t") not in (None, coordinator),
            timeout=60,
        )


def _coordinator_or_none(cluster: LocalKafkaCluster, txn_id: str) -> int | None:
    try:
        return cluster.coordinator_of(txn_id)
    except RuntimeError:
        return None
