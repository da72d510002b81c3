"""The black-box run of issue 23: every kind of restart in one run, counted from outside.

One ``cdc-outbox run --mode cdc`` process (a real subprocess) relays while writers commit
events with per-aggregate versions. Each fault strikes once the relay has marked ``STEP`` more
rows PUBLISHED than at the previous one, so all of them land while events flow: the walsender
terminated four times (``pg_terminate_backend``; exactly-once: the relay's aborted-transactions
counter shows which drops aborted an open Kafka transaction holding records, at least one
must), the relay killed (kill -9) and restarted twice, the broker killed (kill -9) and
restarted once. A ``read_committed`` reader then counts every event: 0 lost, per-aggregate
order kept, 0 rows left PENDING; exactly-once: 0 duplicates (at-least-once: printed).

The code before the fix (a re-stream from the acknowledged position, past what an aborted
Kafka transaction held) lost 33 of 40,000 events and left 115 rows PENDING in the audit's
run of this shape.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from cdc_outbox.config.settings import Settings
from cdc_outbox_dev import workload
from cdc_outbox_dev.sandbox._proc import free_port
from tests.support.eos import COMMITTED, tally
from tests.support.helpers import wait_until
from tests.support.monitoring import scrape
from tests.support.progress import relay_events_marked, terminate_walsender, wait_relayed
from tests.support.relay import (
    init_outbox,
    outbox_statuses,
    relay_settings,
    slot_holder,
    writers_thread,
)
from tests.support.relay_process import RelayProcess

RATE = 800  # committed events/s offered by the writers
STEP = 1_000  # rows marked PUBLISHED between two faults
ABORTED = "cdc_outbox_kafka_transactions_total{outcome=aborted}"


class _Run:
    """The relay process (a new one after each kill -9), the broker and the faults."""

    def __init__(self, dsn: str, settings: Settings, kafka: Any) -> None:
        self.dsn, self.settings, self.kafka = dsn, settings, kafka
        self.started = 0
        self.relay = self._new_relay()
        self.marked = 0
        self.drops_in_open_txn = 0
        self.done: list[str] = []
        self.logs: list[RelayProcess] = [self.relay]

    def _new_relay(self) -> RelayProcess:
        relay = RelayProcess(self.settings, f"blackbox-{self.settings.delivery}-{self.started}")
        self.started += 1
        relay.start()
        return relay

    def strike(self, fault: Callable[[], str]) -> None:
        """``fault``, once the relay marked ``STEP`` rows more than at the previous one."""
        target = self.marked + STEP
        wait_until(
            lambda: relay_events_marked(self.dsn) >= target,
            timeout=120,
            interval=0.1,
            message=lambda: f"marked {relay_events_marked(self.dsn)}\n{self.relay.log_tail()}",
        )
        self.marked = relay_events_marked(self.dsn)
        self.done.append(fault())
        print(f"fault {len(self.done)} at {self.marked} rows marked: {self.done[-1]}")

    def drop_walsender(self) -> str:
        """Terminate the relay's walsender; exactly-once: did the relay then abort an open
        Kafka transaction that held records (its counter, read before and after)?"""
        slot = self.settings.slot_name
        wait_until(lambda: slot_holder(self.dsn, slot) is not None, 60, message=self.relay.log_tail)
        before = self._aborted()
        pid = terminate_walsender(self.dsn, slot, self.relay)
        wait_until(
            lambda: slot_holder(self.dsn, slot) not in (None, pid),
            timeout=60,
            message=self.relay.log_tail,
        )  # a new session streams: the old one was torn down (and its transaction aborted)
        if self._aborted() > before:
            self.drops_in_open_txn += 1
            return f"walsender {pid} terminated during an open Kafka transaction"
        return f"walsender {pid} terminated"

    def _aborted(self) -> float:
        return scrape(self.settings).get(ABORTED, 0.0)

    def kill_relay(self) -> str:
        self.relay.kill()
        self.relay = self._new_relay()
        self.logs.append(self.relay)
        return "relay killed (kill -9) and restarted"

    def kill_broker(self) -> str:
        self.kafka.kill()
        self.kafka.start()
        return "broker killed (kill -9) and restarted"


@pytest.mark.slow
@pytest.mark.parametrize("delivery", ["exactly_once", "at_least_once"])
def test_walsender_drops_relay_kills_and_a_broker_kill_in_one_run(
    delivery: str, pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str
) -> None:
    began = time.monotonic()
    eos = delivery == "exactly_once"
    settings = relay_settings(
        pg_dsn,
        kafka_broker.bootstrap_servers,
        kafka_topic_prefix,
        delivery=delivery,
        # A long commit interval, as in test_walsender_drops: a drop lands while the open
        # Kafka transaction holds acknowledged records, not only ones in flight.
        eos={
            "checkpoint_topic": f"{kafka_topic_prefix}.checkpoints",
            "commit_interval_ms": 2_000,
            "min_commit_interval_ms": 2_000,  # not at once when caught up
        },
        metrics_port=free_port(),
    )
    init_outbox(settings)
    spec = workload.WorkloadSpec(
        events=10_000_000, writers=4, aggregates=200, txn_sizes=(1, 5, 20), rate=RATE
    )
    stop = threading.Event()
    writers, reports = writers_thread(pg_dsn, spec, settings, stop)
    run = _Run(pg_dsn, settings, kafka_broker)
    try:
        writers.start()
        for fault in (
            run.drop_walsender,
            run.kill_relay,
            run.drop_walsender,
            run.kill_broker,
            run.kill_relay,
            run.drop_walsender,  # the last two after the last start: what a re-stream skips
            run.drop_walsender,  # is not published by a later start's catch-up
        ):
            run.strike(fault)
        run.strike(lambda: "none: the relay relays again under load")
        stop.set()
        writers.join(120)
        assert reports, "writers failed"
        wait_relayed(pg_dsn, settings, run.relay, 180)
        with contextlib.suppress(AssertionError):  # counted and asserted below either way
            wait_until(lambda: "PENDING" not in outbox_statuses(pg_dsn), timeout=30)
        assert run.relay.alive, run.relay.log_tail()
    finally:
        stop.set()
        run.relay.stop_quietly()
        if writers.ident is not None:
            writers.join(120)
    verdict = tally(pg_dsn, settings, kafka_broker.bootstrap_servers, kafka_topic_prefix, COMMITTED)
    pending = outbox_statuses(pg_dsn).get("PENDING", 0)
    catch_ups = sum(r.log_tail(10_000_000).count("catch-up needed") for r in run.logs)
    in_txn = f" {run.drops_in_open_txn} of 4 drops during an open Kafka transaction;" if eos else ""
    print(
        f"{delivery}: {verdict.expected} events, lost {len(verdict.missing)}, duplicates"
        f" {verdict.duplicates}, order violations {len(verdict.order_violations)}, PENDING"
        f" {pending};{in_txn} {catch_ups} catch-ups; {time.monotonic() - began:.1f} s"
    )
    assert verdict.expected == reports[0].committed >= 6 * STEP
    assert verdict.ok, verdict.summary()  # nothing lost, per-aggregate order kept
    assert pending == 0
    if eos:
        assert verdict.duplicates == 0, verdict.summary()
        assert run.drops_in_open_txn >= 1, run.done
