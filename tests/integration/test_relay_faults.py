"""Faults really caused: broker stopped, relay kill -9, SIGTERM, a huge transaction. The two
kill -9 tests run over the mix of outboxes (tests/support/outbox_mix.py)."""

from __future__ import annotations

import contextlib
import random
import threading
import time

import psycopg

from cdc_outbox_dev import workload
from cdc_outbox_dev.readback import read_topics
from tests.support.helpers import vm_hwm_kb, wait_until
from tests.support.mix_tally import mix_tally
from tests.support.outbox_mix import (
    WINDOW_COUNTS,
    MixSpec,
    init_mix,
    marked,
    mix_settings,
    mix_writers_thread,
    unmarked,
)
from tests.support.progress import relay_events_marked, status_updates_after
from tests.support.relay import (
    UnconfirmedWindow,
    current_wal_lsn,
    init_outbox,
    insert_bulk_transaction,
    relay_settings,
    relay_thread,
    slot_position,
    tally_topics,
    wait_streamed_past_now,
)
from tests.support.relay_process import RelayProcess, settings_env


def _writer(dsn: str, settings, spec: workload.WorkloadSpec) -> tuple[threading.Thread, list]:
    out: list = []

    def target() -> None:
        out.append(workload.write_orders(dsn, spec, columns=settings.column_names()))

    thread = threading.Thread(target=target, name="writers")
    thread.start()
    return thread, out


def test_broker_stopped_mid_load_holds_the_slot_then_recovers_by_itself(
    pg_dsn: str, kafka_broker, kafka_topic_prefix: str
) -> None:
    settings = relay_settings(pg_dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix)
    init_outbox(settings)
    # The server drops a replication connection silent for 4 s; the outage below is longer,
    # so the relay survives it only by sending status updates while Kafka is down.
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET wal_sender_timeout = '4s'")
        conn.execute("SELECT pg_reload_conf()")
    spec = workload.WorkloadSpec(
        events=6_000, writers=3, aggregates=60, txn_sizes=(1, 10, 40), rate=400
    )
    with relay_thread(settings) as relay:
        writers, _ = _writer(pg_dsn, settings, spec)
        wait_until(lambda: relay.stats.events_published >= 500, timeout=60)
        kafka_broker.stop()
        try:
            # Let the relay notice: acks stop, events pile up in flight.
            published_at_stop = relay.stats.events_published
            wait_until(lambda: relay.stats.in_flight > 0, timeout=30)
            # Acks that arrived just before the stop may still be confirmed by the next
            # status update (status_interval_s = 1 s); after two more the slot must freeze.
            status_updates_after(pg_dsn, settings.slot_name, time.time(), 2)
            frozen, _ = slot_position(pg_dsn, settings.slot_name)
            samples = []
            deadline = time.monotonic() + 8
            while time.monotonic() < deadline:
                samples.append(slot_position(pg_dsn, settings.slot_name)[0])
                time.sleep(0.5)  # sampling the whole window: the slot must not move
            head = current_wal_lsn(pg_dsn)
            # Nothing acknowledged while the broker is down, so nothing may be confirmed.
            assert relay.stats.events_published - published_at_stop < 2_000
            assert samples and max(samples) == frozen, (frozen, samples)
            assert frozen < head
        finally:
            kafka_broker.start()
        writers.join()
        wait_until(
            lambda: relay.stats.events_published >= 6_000,
            timeout=180,
            message=lambda: f"published {relay.stats.events_published}",
        )
        done_lsn = current_wal_lsn(pg_dsn)
        wait_until(lambda: slot_position(pg_dsn, settings.slot_name)[0] >= done_lsn, timeout=60)
        # The replication connection stayed up through the outage (status updates kept it alive).
        assert relay.stats.restarts == 0
    verdict = tally_topics(pg_dsn, settings, kafka_broker.bootstrap_servers, kafka_topic_prefix)
    assert verdict.ok, verdict.summary()
    assert verdict.expected == 6_000


def test_slot_never_passes_an_unacknowledged_event_kill_while_broker_down(
    pg_dsn: str, kafka_broker, kafka_topic_prefix: str
) -> None:
    """If the slot had been confirmed past an unacknowledged event, killing the relay while
    the broker is down would lose that event for good; the final tally shows none missing, in
    any stream of the mix of outboxes (tests/support/outbox_mix.py)."""
    settings = mix_settings(pg_dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix)
    init_mix(settings)
    spec = MixSpec(events=4_000, writers=2, aggregates=40, txn_sizes=(1, 25), rate=800)
    relay = RelayProcess(settings, "kill-while-broker-down")
    relay.start()
    try:
        writers, _ = mix_writers_thread(pg_dsn, spec, threading.Event())
        writers.start()
        wait_until(lambda: slot_position(pg_dsn, settings.slot_name)[1], timeout=60)
        wait_until(lambda: marked(pg_dsn) >= 500, 60, message=relay.log_tail)  # load flows
        kafka_broker.stop()
        # The fault: the outage lasts while the relay keeps streaming, acks stop and
        # confirmation must not move on.
        time.sleep(3.0)
        relay.kill()
        kafka_broker.start()
        writers.join()
        relay = RelayProcess(settings, "kill-while-broker-down-2")
        relay.start()
        # STREAMING too: a relay that starts with a catch-up creates its slot past done_lsn.
        wait_streamed_past_now(
            pg_dsn, settings.slot_name, timeout=180, message=lambda: relay.log_tail()
        )
        with contextlib.suppress(AssertionError):  # asserted below, after the tally
            wait_until(lambda: not unmarked(pg_dsn), timeout=30)
    finally:
        relay.stop_quietly()
    verdict = mix_tally(pg_dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix)
    assert verdict.ok, verdict.summary()
    assert verdict.expected == 4_000
    left = unmarked(pg_dsn)
    assert left == [], f"{len(left)} delivered rows not marked: {left[:5]}"


def test_relay_killed_at_random_points_loses_nothing(
    pg_dsn: str, kafka_broker, kafka_topic_prefix: str
) -> None:
    """kill -9 five times under load over the mix of outboxes (tests/support/outbox_mix.py): per
    stream 0 lost and per-aggregate order kept, every delivered row marked, and duplicates
    only from the unconfirmed window."""
    settings = mix_settings(pg_dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix)
    init_mix(settings)
    spec = MixSpec(events=15_000, writers=4, aggregates=200, txn_sizes=(1, 5, 50), rate=1_500)
    rng = random.Random(20261130)
    window = UnconfirmedWindow(pg_dsn, settings.slot_name, WINDOW_COUNTS)
    window.start()
    writers, reports = mix_writers_thread(pg_dsn, spec, threading.Event())
    writers.start()
    kills, killed_at = 0, []
    relay = RelayProcess(settings, "kill9-0")
    try:
        relay.start()
        for kills in range(1, 6):
            time.sleep(rng.uniform(0.5, 2.5))  # the fault: kill -9 at a random point
            killed_at.append(time.time())
            relay.kill()
            relay = RelayProcess(settings, f"kill9-{kills}")
            relay.start()
        writers.join()
        # STREAMING too: a relay that starts with a catch-up creates its slot past done_lsn.
        wait_streamed_past_now(
            pg_dsn, settings.slot_name, timeout=180, message=lambda: relay.log_tail()
        )
        with contextlib.suppress(AssertionError):  # asserted below, after the tally
            wait_until(lambda: not unmarked(pg_dsn), timeout=30)
    finally:
        relay.stop_quietly()
        window.stop()
    assert kills == 5
    verdict = mix_tally(pg_dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix)
    windows = [window.at(t) for t in killed_at]
    print(f"kill -9 x{kills}: {verdict.duplicates} duplicates in all; unconfirmed {windows}")
    assert verdict.ok, verdict.summary()
    # Only the unconfirmed window is sent again: what was in flight or acknowledged since the
    # last confirmation, measured from outside at each kill (a relay killed before its first
    # confirmation leaves the whole window to the next one, so no fixed rate bounds it), plus
    # a second of the offered load per kill for what was committed between the last 0.1 s
    # sample and the kill (as test_chaos does); re-sending from an older position exceeds it.
    assert verdict.duplicates <= sum(windows) + 1_500 * kills
    assert verdict.expected == reports[0].committed == 15_000
    assert min(reports[0].per_stream.values()) > 4_000  # each stream has its share
    left = unmarked(pg_dsn)
    assert left == [], f"{len(left)} delivered rows not marked: {left[:5]}"


def test_sigterm_exits_zero_in_grace_and_restart_publishes_no_duplicates(
    pg_dsn: str, kafka_broker, kafka_topic_prefix: str
) -> None:
    grace = 10.0
    settings = relay_settings(
        pg_dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix, shutdown_grace_s=grace
    )
    init_outbox(settings)
    spec = workload.WorkloadSpec(
        events=8_000, writers=3, aggregates=90, txn_sizes=(1, 20, 100), rate=2_000
    )
    writers, _ = _writer(pg_dsn, settings, spec)
    relay = RelayProcess(settings, "sigterm-1")
    relay.start()
    try:
        wait_until(lambda: slot_position(pg_dsn, settings.slot_name)[1], timeout=60)
        wait_until(lambda: relay_events_marked(pg_dsn) >= 1_000, 60, message=relay.log_tail)
        t0 = time.monotonic()  # under load: the writers go on (8,000 events at 2,000/s)
        relay.terminate()
        code = relay.wait(grace + 5)
        took = time.monotonic() - t0
        assert code == 0, relay.log_tail()
        assert took <= grace + 1.0, f"took {took:.1f}s, grace {grace}s"
        writers.join()
        relay = RelayProcess(settings, "sigterm-2")
        relay.start()
        # STREAMING too: a relay that starts with a catch-up creates its slot past done_lsn.
        wait_streamed_past_now(
            pg_dsn, settings.slot_name, timeout=180, message=lambda: relay.log_tail()
        )
        relay.terminate()
        assert relay.wait(grace + 5) == 0
    finally:
        relay.stop_quietly()
    verdict = tally_topics(pg_dsn, settings, kafka_broker.bootstrap_servers, kafka_topic_prefix)
    assert verdict.ok, verdict.summary()
    assert verdict.expected == 8_000
    assert verdict.duplicates == 0


def test_memory_stays_bounded_on_a_huge_transaction(
    pg_dsn: str, kafka_broker, kafka_topic_prefix: str
) -> None:
    """One 150,000-event transaction (~60 MB of payload) through a relay whose in-flight
    window is 5,000 events: its peak RSS stays far below the transaction size."""
    settings = relay_settings(
        pg_dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix, max_in_flight=5_000
    )
    assert settings_env(settings)["CDC_OUTBOX_MAX_IN_FLIGHT"] == "5000"  # the child's window
    init_outbox(settings)
    relay = RelayProcess(settings, "huge-txn")
    relay.start()
    try:
        wait_until(lambda: slot_position(pg_dsn, settings.slot_name)[1], timeout=60)
        baseline_kb = vm_hwm_kb(relay.proc.pid)
        insert_bulk_transaction(pg_dsn, 150_000)
        done_lsn = current_wal_lsn(pg_dsn)
        wait_until(
            lambda: slot_position(pg_dsn, settings.slot_name)[0] >= done_lsn,
            timeout=300,
            message=lambda: relay.log_tail(),
        )
        peak_kb = vm_hwm_kb(relay.proc.pid)
    finally:
        relay.stop_quietly()
    print(f"relay RSS: baseline {baseline_kb / 1024:.0f} MB, peak {peak_kb / 1024:.0f} MB")
    records = read_topics(kafka_broker.bootstrap_servers, f"{kafka_topic_prefix}.event.")
    assert len({dict(r.headers)["id"] for r in records}) == 150_000
    # The transaction carried ~60 MB of payload; the relay may hold only its window of it.
    assert peak_kb - baseline_kb < 60 * 1024, (baseline_kb, peak_kb)


def test_the_in_flight_window_bounds_a_huge_transaction(
    pg_dsn: str, kafka_broker, kafka_topic_prefix: str
) -> None:
    """The window itself, sampled every few ms while one 60,000-event transaction is relayed
    with max_in_flight = 2,000: it fills up (the bound is what holds the relay back) and is
    never exceeded."""
    settings = relay_settings(
        pg_dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix, max_in_flight=2_000
    )
    init_outbox(settings)
    peak = 0
    with relay_thread(settings) as relay:
        wait_until(lambda: slot_position(pg_dsn, settings.slot_name)[1], timeout=60)
        with psycopg.connect(pg_dsn) as conn:
            conn.execute(
                "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)"
                " SELECT gen_random_uuid(), 'order', 'agg-' || (g % 50), 'Bulk',"
                " jsonb_build_object('seq', g) FROM generate_series(1, 60000) g"
            )
            conn.commit()

        def relayed() -> bool:  # sampling the window every 2 ms on the way
            nonlocal peak
            peak = max(peak, relay.stats.in_flight)
            return relay.stats.events_published >= 60_000

        wait_until(relayed, timeout=180, interval=0.002)
    print(f"peak in flight: {peak} (max_in_flight 2000)")
    assert 1_000 <= peak <= 2_000
