"""Kafka-side faults through the one produce loop: a full queue while the broker is down
must not hold up SIGTERM; a fatal error raised by ``produce`` means a new producer and a
re-stream from the confirmed position, never the end of the process."""

from __future__ import annotations

import threading
import time

from confluent_kafka import KafkaError, KafkaException

from cdc_outbox_dev import workload
from cdc_outbox_dev.readback import read_topics
from cdc_outbox_dev.sandbox._proc import free_port
from tests.support.helpers import wait_until
from tests.support.monitoring import metric
from tests.support.relay import (
    init_outbox,
    relay_settings,
    relay_thread,
    slot_position,
    wait_streamed_past_now,
)
from tests.support.relay_process import RelayProcess


def test_sigterm_with_a_full_queue_while_the_broker_is_down_exits_within_grace(
    pg_dsn: str, kafka_broker, kafka_topic_prefix: str
) -> None:
    grace = 4.0
    settings = relay_settings(
        pg_dsn,
        kafka_broker.bootstrap_servers,
        kafka_topic_prefix,
        mode="cdc",
        shutdown_grace_s=grace,
        kafka={
            "bootstrap_servers": kafka_broker.bootstrap_servers,
            "config": {"queue.buffering.max.messages": "500"},
        },
        metrics_port=free_port(),
    )
    init_outbox(settings)
    relay = RelayProcess(settings, "sigterm-full-queue")
    relay.start()
    try:
        wait_until(lambda: slot_position(pg_dsn, settings.slot_name)[1], timeout=60)
        kafka_broker.stop()
        spec = workload.WorkloadSpec(events=3_000, writers=2, aggregates=20, txn_sizes=(50,))
        workload.write_orders(pg_dsn, spec, columns=settings.column_names())
        # 3,000 events for a 500-record queue: wait until the relay's produce loop waits,
        # the queue full: events in flight no longer grow (where they stop varies, measured
        # 400-500: librdkafka's count of the queue is not the relay's).
        seen: list[float] = []

        def produce_loop_waits() -> bool:
            seen.append(metric(settings, "cdc_outbox_events_in_flight"))
            return len(seen) > 4 and seen[-1] >= 100 and len(set(seen[-5:])) == 1

        wait_until(
            produce_loop_waits,
            timeout=30,
            interval=0.25,  # the sampling period: 5 equal samples = 1 s without growth
            message=lambda: f"in flight {seen[-5:]}; {relay.log_tail()}",
        )
        assert relay.alive
        started = time.monotonic()
        relay.terminate()
        code = relay.wait(grace + 10)
        took = time.monotonic() - started
    finally:
        relay.stop_quietly()
        kafka_broker.start()
    print(f"exit {code} after {took:.2f} s (grace {grace} s)")
    assert took <= grace + 2.0, relay.log_tail()
    assert code == 0, relay.log_tail()


def test_a_fatal_error_raised_by_produce_means_a_new_producer_not_an_exit(
    pg_dsn: str, kafka_broker, kafka_topic_prefix: str
) -> None:
    settings = relay_settings(
        pg_dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix, mode="cdc"
    )
    init_outbox(settings)
    injected = threading.Event()
    with relay_thread(settings) as relay:
        wait_until(lambda: slot_position(pg_dsn, settings.slot_name)[1], timeout=60)
        first = relay.delivery.publisher
        real_produce = first._producer.produce

        class _FatalOnce:
            """Wraps librdkafka's produce: the 101st call raises what librdkafka raises
            after an idempotence fatal error."""

            calls = 0

            def produce(self, *args: object, **kwargs: object) -> None:
                self.calls += 1
                if self.calls == 101 and not injected.is_set():
                    injected.set()
                    raise KafkaException(
                        KafkaError(KafkaError._FATAL, "injected fatal", fatal=True)
                    )
                real_produce(*args, **kwargs)

            def __getattr__(self, name: str) -> object:
                return getattr(real_producer, name)

            def __len__(self) -> int:
                return len(real_producer)

        real_producer = first._producer
        first._producer = _FatalOnce()  # type: ignore[assignment]
        spec = workload.WorkloadSpec(events=2_000, writers=2, aggregates=20, txn_sizes=(1, 10))
        workload.write_orders(pg_dsn, spec, columns=settings.column_names())
        wait_streamed_past_now(
            pg_dsn,
            settings.slot_name,
            120,
            lambda: f"{relay.stats} {injected.is_set()}",
            phase=False,
        )
        assert injected.is_set()
        assert relay.delivery.publisher is not first  # a new producer after the fatal error
        assert relay.stats.retries_by_alert.get("producer_fatal") == 1
        assert relay.stats.restarts >= 1
    expected = workload.stored_events(pg_dsn, columns=settings.column_names())
    records = read_topics(kafka_broker.bootstrap_servers, f"{kafka_topic_prefix}.event.")
    verdict = workload.tally(expected, records)
    print(verdict.summary())
    assert verdict.ok, verdict.summary()
    assert verdict.expected == 2_000
