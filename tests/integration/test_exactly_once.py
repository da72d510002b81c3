"""Exactly-once delivery (issue 9): real PostgreSQL + Kafka, kill -9, restarts, zombies; the
kill -9 and restart tests over the mix of outboxes (tests/support/outbox_mix.py, issue 36)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import threading
import time
from typing import Any

import psycopg
import pytest

from cdc_outbox.kafka import checkpoints
from cdc_outbox_dev import workload
from cdc_outbox_dev.readback import read_topics
from tests.support.eos import COMMITTED, UNCOMMITTED, tally
from tests.support.helpers import run_cli, vm_hwm_kb, wait_until
from tests.support.mix_tally import messages_before_slot, mix_tally
from tests.support.outbox_mix import (
    WINDOW_COUNTS,
    MixSpec,
    init_mix,
    marked,
    mix_settings,
    mix_writers_thread,
    unmarked,
)
from tests.support.progress import relay_events_marked, wait_relayed
from tests.support.relay import (
    UnconfirmedWindow,
    init_outbox,
    insert_bulk_transaction,
    outbox_statuses,
    oversized_record_overrides,
    relay_phase,
    relay_settings,
    relay_thread,
    service_thread,
    slot_holder,
    slot_position,
)
from tests.support.relay_process import RelayProcess


def eos_settings(pg_dsn: str, kafka_broker: Any, prefix: str, **overrides: Any) -> Any:
    return relay_settings(
        pg_dsn,
        kafka_broker.bootstrap_servers,
        prefix,
        delivery="exactly_once",
        eos={"checkpoint_topic": f"{prefix}.checkpoints"},
        **overrides,
    )


def _writer(dsn: str, settings: Any, spec: workload.WorkloadSpec) -> threading.Thread:
    thread = threading.Thread(
        target=workload.write_orders,
        args=(dsn, spec),
        kwargs={"columns": settings.column_names()},
        name="writers",
    )
    thread.start()
    return thread


def _wait_streaming(dsn: str, settings: Any, relay: RelayProcess, timeout: float = 60) -> None:
    wait_until(
        lambda: relay_phase(dsn, settings.slot_name)[0] == "STREAMING",
        timeout=timeout,
        message=relay.log_tail,
    )


def _wait_slot_held(dsn: str, settings: Any, relay: RelayProcess) -> None:
    """Some relay (``relay``, whose log a timeout shows, or another) streams from the slot."""
    wait_until(
        lambda: slot_holder(dsn, settings.slot_name) is not None,
        timeout=60,
        message=relay.log_tail,
    )


def _committed_exactly_once(
    dsn: str, settings: Any, bootstrap: str, prefix: str, total: int
) -> Any:
    """The read_committed tally, checked: ``total`` events expected, each received once."""
    committed = tally(dsn, settings, bootstrap, prefix, COMMITTED)
    assert committed.ok, committed.summary()
    assert committed.expected == total
    assert committed.duplicates == 0 and committed.received == total
    return committed


def test_streaming_in_kafka_transactions_with_checkpoints(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str
) -> None:
    """The basic path: events committed in Kafka transactions, checkpoint = slot position."""
    settings = eos_settings(pg_dsn, kafka_broker, kafka_topic_prefix)
    init_outbox(settings)
    spec = workload.WorkloadSpec(events=2_000, writers=2, aggregates=40, txn_sizes=(1, 10, 100))
    with relay_thread(settings) as relay:
        _writer(pg_dsn, settings, spec).join()
        wait_relayed(pg_dsn, settings, None, 60)
        assert relay.stats.eos_commits > 0
        assert relay.stats.delivery_guarantee == "exactly_once"
        assert relay.eos is not None
        key = checkpoints.checkpoint_key(
            relay.eos.system_id, relay.eos.database, settings.slot_name
        )
    config = settings.kafka_config()
    last = checkpoints.read_last(config, settings.eos.checkpoint_topic, key)
    assert last is not None and last.end_lsn >= 1
    confirmed, _ = slot_position(pg_dsn, settings.slot_name)
    assert int(confirmed) >= last.end_lsn  # the slot is confirmed up to the Kafka commit
    bootstrap = kafka_broker.bootstrap_servers
    verdict = tally(pg_dsn, settings, bootstrap, kafka_topic_prefix, COMMITTED)
    assert verdict.ok and verdict.duplicates == 0 and verdict.expected == 2_000
    # `status` shows the configured and the effective guarantee; polling is at-least-once.
    env = {"CDC_OUTBOX_DELIVERY": "exactly_once"}
    report = json.loads(run_cli("status", "--json", dsn=pg_dsn, **env).stdout)["relay"]
    assert (report["delivery"], report["delivery_in_effect"]) == ("exactly_once",) * 2
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("UPDATE cdc_outbox_relay_state SET phase = 'POLLING'")
    human = run_cli("status", dsn=pg_dsn, **env)
    assert "at_least_once in effect" in human.stdout, human.stdout
    refused = run_cli("run", "--delivery", "twice", dsn=pg_dsn)
    assert refused.returncode == 2
    assert "delivery must be 'at_least_once' or 'exactly_once'" in refused.stderr


def test_a_kafka_transaction_never_holds_more_than_max_events_of_whole_transactions(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str
) -> None:
    """A backlog streamed from the slot (not catch-up) in big read turns: the Kafka
    transaction is committed at the first PostgreSQL transaction boundary past
    ``eos.max_events``, not at the end of a turn of up to 2,000 frames."""
    settings = eos_settings(pg_dsn, kafka_broker, kafka_topic_prefix, mode="cdc")
    settings = settings.model_copy(
        update={
            # Never a caught-up commit (a brief pause of the walsender mid-backlog): only
            # max_events and the interval close a Kafka transaction here.
            "eos": settings.eos.model_copy(
                update={
                    "max_events": 100,
                    "commit_interval_ms": 5_000,
                    "min_commit_interval_ms": 5_000,
                }
            )
        }
    )
    init_outbox(settings)
    with service_thread(settings):
        wait_until(lambda: relay_phase(pg_dsn, settings.slot_name)[0] == "STREAMING", timeout=60)
    spec = workload.WorkloadSpec(events=3_000, writers=1, aggregates=30, txn_sizes=(1,))
    workload.write_orders(pg_dsn, spec, columns=settings.column_names())  # waits in the slot
    with service_thread(settings) as service:
        wait_relayed(pg_dsn, settings, None, 90)
        commits = service.stats.eos_commits
    # 1-row transactions: every Kafka transaction holds exactly max_events (100) events
    # but the last; a turn-bound commit would hold about 667 (2,000 frames of B, I, C): about
    # 5 commits, plus one per 5 s interval (the last, partial one commits on the interval).
    assert commits >= 3_000 // 100, commits
    verdict = tally(pg_dsn, settings, kafka_broker.bootstrap_servers, kafka_topic_prefix, COMMITTED)
    assert verdict.ok and verdict.duplicates == 0 and verdict.expected == 3_000, verdict.summary()


def test_kill_9_at_random_points_and_in_commit_exactly_once(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str
) -> None:
    """Under a 4-writer load (mixed transaction sizes): named crash points during the Kafka
    commit (a kill while the commit call is in flight) and between the Kafka commit and the
    slot confirmation (catch-up: before the rows are marked), each once in the catch-up and
    once while streaming, just before the commit (records written, commit not sent: aborted)
    while streaming, and kill -9 at 10 random points. read_committed sees every event exactly once,
    in per-aggregate order; read_uncommitted sees the aborted records too.

    The writers go on until the last crash point was hit: a streaming crash point needs new
    events to commit (writers of a fixed count could finish first on a slow host, and the
    relay then has no Kafka commit left to crash in).

    Over the mix of outboxes (tests/support/outbox_mix.py), each stream checked on its own; the
    table-less events written before the streamed slot's consistent point (the last
    catch-up's) may be lost (docs/outboxes.md), every other one must arrive once."""
    settings = mix_settings(
        pg_dsn,
        kafka_broker.bootstrap_servers,
        kafka_topic_prefix,
        delivery="exactly_once",
        eos={"checkpoint_topic": f"{kafka_topic_prefix}.checkpoints"},
    )
    init_mix(settings, for_catch_up=True)  # the backlog goes through a catch-up
    spec = MixSpec(  # at most 100 s at 1,200 events/s: ``stop`` ends it sooner
        events=120_000, writers=4, aggregates=200, txn_sizes=(1, 5, 50, 200), rate=1_200
    )
    rng = random.Random(9)
    stop = threading.Event()
    writers, written = mix_writers_thread(pg_dsn, spec, stop)
    writers.start()
    relay: RelayProcess | None = None
    crashed: list[str] = []

    def crash_at(step: str, name: str) -> None:
        nonlocal relay
        relay = RelayProcess(settings, name, CDC_OUTBOX_CRASH_AT=step)
        relay.start()
        assert relay.wait(90) == -signal.SIGKILL, relay.log_tail()
        assert f"crash point {step}" in relay.log_tail(50_000)
        crashed.append(f"{relay_phase(pg_dsn, settings.slot_name)[0]}:{step}")

    try:
        wait_until(lambda: workload_rows(pg_dsn) >= 1_000, timeout=30)  # a backlog
        crash_at("eos.in_kafka_commit", "eos-kill-catch-up-1")
        crash_at("eos.after_kafka_commit", "eos-kill-catch-up-2")
        relay = RelayProcess(settings, "eos-kill-0")
        relay.start()
        _wait_streaming(pg_dsn, settings, relay, timeout=90)
        for i in range(1, 11):
            time.sleep(rng.uniform(0.3, 2.0))  # the fault: kill -9 at a random point
            relay.kill()
            relay = RelayProcess(settings, f"eos-kill-{i}")
            relay.start()
        relay.kill()
        crash_at("eos.before_kafka_commit", "eos-kill-stream-0")
        crash_at("eos.in_kafka_commit", "eos-kill-stream-1")
        crash_at("eos.after_kafka_commit", "eos-kill-stream-2")
        stop.set()
        writers.join()
        relay = RelayProcess(settings, "eos-kill-final")
        relay.start()
        wait_relayed(pg_dsn, settings, relay, 180)
        with contextlib.suppress(AssertionError):  # asserted below, after the tally
            wait_until(lambda: not unmarked(pg_dsn), timeout=30)
    finally:
        stop.set()
        if relay is not None:
            relay.stop_quietly()
        writers.join()
    assert crashed == [
        "CATCHING_UP:eos.in_kafka_commit",
        "CATCHING_UP:eos.after_kafka_commit",
        "STREAMING:eos.before_kafka_commit",
        "STREAMING:eos.in_kafka_commit",
        "STREAMING:eos.after_kafka_commit",
    ]
    assert written, "the writers failed"
    total = written[0].committed
    bootstrap = kafka_broker.bootstrap_servers
    lost_ok = messages_before_slot(pg_dsn, settings.slot_name)
    committed = mix_tally(pg_dsn, bootstrap, kafka_topic_prefix, read_committed=True,
                          may_miss=lost_ok)  # fmt: skip
    print(f"{len(lost_ok)} messages written before the streamed slot's consistent point")
    assert committed.ok, committed.summary()
    assert committed.expected == total
    assert committed.duplicates == 0, committed.summary()
    uncommitted = mix_tally(pg_dsn, bootstrap, kafka_topic_prefix, may_miss=lost_ok)
    assert not uncommitted.missing
    assert uncommitted.received > committed.received  # aborted records are in the log
    left = unmarked(pg_dsn)
    assert left == [], f"{len(left)} delivered rows not marked: {left[:5]}"


def workload_rows(dsn: str) -> int:
    """Events committed by the mix's writers (tests/support/outbox_mix.py)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM mix_ledger").fetchone()
    return int(row[0]) if row else 0


def test_a_zombie_leader_woken_after_takeover_commits_nothing(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str
) -> None:
    """The leader (commit interval 3 s: its Kafka transaction holds records most of the time)
    is SIGSTOPped under load; the standby takes over, and its init_transactions fences the old
    producer and aborts its open transaction. Woken with SIGCONT, the old leader commits
    nothing: read_committed sees every event once, read_uncommitted also the zombie's records."""
    settings = eos_settings(pg_dsn, kafka_broker, kafka_topic_prefix, mode="cdc")
    init_outbox(settings)
    zombie = RelayProcess(
        settings,
        "eos-zombie",
        CDC_OUTBOX_EOS__COMMIT_INTERVAL_MS="3000",
        CDC_OUTBOX_EOS__MIN_COMMIT_INTERVAL_MS="3000",  # not at once when caught up
    )
    heir = RelayProcess(settings, "eos-heir")
    spec = workload.WorkloadSpec(
        events=6_000, writers=2, aggregates=60, txn_sizes=(1, 10), rate=600
    )
    writers = None
    try:
        zombie.start()
        _wait_slot_held(pg_dsn, settings, zombie)
        heir.start()
        writers = _writer(pg_dsn, settings, spec)
        # Under load (2 s of it): the zombie's open transaction holds records.
        wait_until(
            lambda: sum(outbox_statuses(pg_dsn).values()) >= 1_200,
            timeout=60,
            message=zombie.log_tail,
        )
        assert zombie.proc is not None and heir.proc is not None
        zombie.proc.send_signal(signal.SIGSTOP)
        wait_until(
            lambda: (
                "Kafka transactions ready" in heir.log_tail(20_000)
                and slot_holder(pg_dsn, settings.slot_name) is not None
            ),
            timeout=60,
            interval=0.1,
            message=heir.log_tail,
        )
        taken_over = relay_events_marked(pg_dsn)  # the heir commits while the zombie sleeps
        wait_until(
            lambda: relay_events_marked(pg_dsn) > taken_over, timeout=60, message=heir.log_tail
        )
        zombie.proc.send_signal(signal.SIGCONT)
        wait_until(
            lambda: any(
                text in zombie.log_tail(50_000)
                for text in ("lease not renewed", "lost leadership", "no longer the leader")
            ),
            timeout=60,
            message=zombie.log_tail,
        )
        writers.join(300)
        wait_relayed(pg_dsn, settings, heir, 180)
        # The woken zombie stands by (it never re-registers the transactional.id as a
        # non-leader, which would fence the heir).
        assert zombie.alive and "Traceback" not in zombie.log_tail(200_000), zombie.log_tail()
        assert "fenced" not in heir.log_tail(200_000)
    finally:
        for relay in (zombie, heir):
            if relay.proc is not None and relay.proc.poll() is None:
                relay.proc.send_signal(signal.SIGCONT)
            relay.stop_quietly()
        if writers is not None:
            writers.join(300)
    bootstrap = kafka_broker.bootstrap_servers
    committed = _committed_exactly_once(pg_dsn, settings, bootstrap, kafka_topic_prefix, 6_000)
    uncommitted = tally(pg_dsn, settings, bootstrap, kafka_topic_prefix, UNCOMMITTED)
    assert uncommitted.received > committed.received  # the zombie's aborted records


@pytest.mark.parametrize("delivery", ["exactly_once", "at_least_once"])
def test_broker_and_postgres_restarts_mid_load(
    delivery: str, pg_dsn: str, pg_server: Any, kafka_broker: Any, kafka_topic_prefix: str
) -> None:
    """The broker restarts under load, then PostgreSQL crashes (immediate shutdown: the slot
    may come back behind what Kafka holds, so PostgreSQL re-sends transactions the checkpoint
    skips): 0 missing, every row marked; exactly-once: 0 duplicates for read_committed;
    at-least-once: duplicates only from what was unconfirmed at each fault. Over the mix of
    outboxes (tests/support/outbox_mix.py), each stream checked on its own."""
    eos = delivery == "exactly_once"
    settings = mix_settings(
        pg_dsn,
        kafka_broker.bootstrap_servers,
        kafka_topic_prefix,
        delivery=delivery,
        eos={"checkpoint_topic": f"{kafka_topic_prefix}.checkpoints"},
    )
    init_mix(settings)
    rate = 500
    spec = MixSpec(events=8_000, writers=4, aggregates=80, txn_sizes=(1, 10, 50), rate=rate)
    relay = RelayProcess(settings, f"restarts-{delivery}")
    relay.start()
    window = UnconfirmedWindow(pg_dsn, settings.slot_name, WINDOW_COUNTS)
    window.start()
    writers, faults = None, []
    try:
        _wait_slot_held(pg_dsn, settings, relay)
        writers, _ = mix_writers_thread(pg_dsn, spec, threading.Event())
        writers.start()
        wait_until(lambda: marked(pg_dsn) >= 500, timeout=60, message=relay.log_tail)  # load
        faults.append(time.time())
        kafka_broker.restart()
        print("broker restarted")
        done = marked(pg_dsn)  # relaying again under load
        wait_until(lambda: marked(pg_dsn) >= done + 500, timeout=60, message=relay.log_tail)
        faults.append(time.time())
        pg_server.crash()
        pg_server.start()
        print("PostgreSQL crashed and restarted")
        writers.join(300)
        wait_relayed(pg_dsn, settings, relay, 240)
        assert relay.alive, relay.log_tail()
        with contextlib.suppress(AssertionError):  # asserted below, after the tally
            wait_until(lambda: not unmarked(pg_dsn), timeout=30)
    finally:
        window.stop()
        relay.stop_quietly()
        if writers is not None:
            writers.join(300)
    verdict = mix_tally(
        pg_dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix, read_committed=True
    )
    assert verdict.ok, verdict.summary()
    assert verdict.expected == 8_000
    if eos:
        assert verdict.duplicates == 0 and verdict.received == 8_000, verdict.summary()
    else:  # as test_chaos: the unconfirmed window at each fault, plus a second of load
        allowed = sum(window.at(t) for t in faults) + rate * len(faults)
        print(f"duplicates {verdict.duplicates}, allowed {allowed}")
        assert verdict.duplicates <= allowed, verdict.summary()
    left = unmarked(pg_dsn)
    assert left == [], f"{len(left)} delivered rows not marked: {left[:5]}"


def test_a_200k_row_transaction_exactly_once_with_bounded_memory(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str
) -> None:
    """One 200,000-row PostgreSQL transaction (~80 MB of payload) is one Kafka transaction,
    never split; the relay holds at most its in-flight window (max_in_flight = 5,000 events)
    plus librdkafka's queue of the same records, so its peak RSS grows far less than the
    transaction's size."""
    settings = eos_settings(pg_dsn, kafka_broker, kafka_topic_prefix, max_in_flight=5_000)
    init_outbox(settings)
    relay = RelayProcess(settings, "eos-huge-txn")
    relay.start()
    try:
        _wait_slot_held(pg_dsn, settings, relay)
        assert relay.proc is not None
        baseline_kb = vm_hwm_kb(relay.proc.pid)
        insert_bulk_transaction(pg_dsn, 200_000)
        wait_relayed(pg_dsn, settings, relay, 300)
        peak_kb = vm_hwm_kb(relay.proc.pid)
    finally:
        relay.stop_quietly()
    grew_mb = (peak_kb - baseline_kb) / 1024
    print(f"relay RSS: baseline {baseline_kb / 1024:.0f} MB, peak {peak_kb / 1024:.0f} MB")
    records = read_topics(
        kafka_broker.bootstrap_servers,
        f"{kafka_topic_prefix}.event.",
        timeout=120,
        extra_config=COMMITTED,
    )
    ids = [dict(r.headers)["id"] for r in records]
    assert len(ids) == len(set(ids)) == 200_000
    assert grew_mb < 80, (baseline_kb, peak_kb)


def test_dead_letters_are_exactly_once_and_a_broker_rejection_aborts_first(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str
) -> None:
    """A 2 MB record reaches the broker (max_record_bytes above its 1 MB limit) and is
    rejected inside the Kafka transaction: the relay aborts, re-streams and dead-letters it
    up front, so the event right behind it is parked (never published out of order), and a
    later one too. read_committed: each dead letter once, none of them on the main topic."""
    import base64

    settings = eos_settings(
        pg_dsn,
        kafka_broker,
        kafka_topic_prefix,
        **oversized_record_overrides(kafka_broker.bootstrap_servers),
    )
    init_outbox(settings)
    blob = base64.b64encode(os.urandom(1_500_000)).decode()

    def insert(conn: psycopg.Connection[Any], agg: str, payload: str) -> str:
        row = conn.execute(
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)"
            " VALUES (gen_random_uuid(), 'order', %s, 'E', %s::jsonb) RETURNING id::text",
            (agg, payload),
        ).fetchone()
        assert row is not None
        return str(row[0])

    with relay_thread(settings) as relay, psycopg.connect(pg_dsn) as conn:
        ok = insert(conn, "agg-0", '{"n": 0}')
        big = insert(conn, "agg-1", json.dumps({"blob": blob}))
        right_behind = insert(conn, "agg-1", '{"n": 2}')
        conn.commit()
        later = insert(conn, "agg-1", '{"n": 3}')
        conn.commit()
        wait_relayed(pg_dsn, settings, None, 90)
        stats = relay.stats
        assert stats.eos_aborts >= 1 and stats.order_broken == 0
    with psycopg.connect(pg_dsn) as conn:
        failed = {
            r[0]
            for r in conn.execute("SELECT id::text FROM outbox WHERE status = 'FAILED'").fetchall()
        }
    assert failed == {big, right_behind, later}
    bootstrap = kafka_broker.bootstrap_servers
    main = read_topics(bootstrap, f"{kafka_topic_prefix}.event.", extra_config=COMMITTED)
    dlq = read_topics(bootstrap, f"{kafka_topic_prefix}.dlq", extra_config=COMMITTED)
    assert [dict(r.headers)["id"].decode() for r in main] == [ok]
    dlq_ids = [dict(r.headers)["id"].decode() for r in dlq]
    assert sorted(dlq_ids) == sorted([big, right_behind, later])  # each exactly once
    assert b"MSG_SIZE_TOO_LARGE" in dict(dlq[dlq_ids.index(big)].headers)["cdc_outbox.error"]


def test_sigterm_commits_the_open_kafka_transaction_and_confirms_it(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str
) -> None:
    """SIGTERM after the writers finished (commit interval 60 s, so the last Kafka transaction
    is still open): the relay commits it, confirms the slot past every event and exits 0;
    read_committed already sees every event once, before any restart."""
    settings = eos_settings(pg_dsn, kafka_broker, kafka_topic_prefix, mode="cdc")
    init_outbox(settings)
    relay = RelayProcess(
        settings,
        "eos-sigterm",
        CDC_OUTBOX_EOS__COMMIT_INTERVAL_MS="60000",
        CDC_OUTBOX_EOS__MIN_COMMIT_INTERVAL_MS="60000",  # not at once when caught up
    )
    relay.start()
    try:
        _wait_streaming(pg_dsn, settings, relay)
        spec = workload.WorkloadSpec(events=1_000, writers=2, aggregates=20, txn_sizes=(1, 10))
        _writer(pg_dsn, settings, spec).join()
        records = lambda: len(  # noqa: E731
            read_topics(
                kafka_broker.bootstrap_servers,
                f"{kafka_topic_prefix}.event.",
                extra_config=UNCOMMITTED,
            )
        )
        wait_until(lambda: records() >= 1_000, timeout=60, message=relay.log_tail)
        relay.terminate()
        assert relay.wait(30) == 0, relay.log_tail()
    finally:
        relay.stop_quietly()
    bootstrap = kafka_broker.bootstrap_servers
    committed = tally(pg_dsn, settings, bootstrap, kafka_topic_prefix, COMMITTED)
    assert committed.ok and committed.duplicates == 0 and committed.received == 1_000
    # The final commit's checkpoint covers the last transaction; the slot was confirmed to it.
    from cdc_outbox.cdc.replication_stream import ReplicationStream

    system_id, database = ReplicationStream(pg_dsn, "unused", "unused").identify()
    key = checkpoints.checkpoint_key(system_id, database, settings.slot_name)
    last = checkpoints.read_last(settings.kafka_config(), settings.eos.checkpoint_topic, key)
    assert last is not None
    confirmed, active = slot_position(pg_dsn, settings.slot_name)
    assert not active and int(confirmed) >= last.end_lsn > 0
    assert "stopped; confirmed" in relay.log_tail(50_000)


def test_auto_mode_polls_at_least_once_and_says_so(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str, caplog: Any
) -> None:
    """delivery = exactly_once in auto mode, with a publication that does not cover the
    outbox: the relay polls, at-least-once, with a WARNING line and the guarantee in its stats
    (what the delivery_guarantee metric and the dashboard show)."""
    import logging

    from psycopg import sql

    settings = eos_settings(pg_dsn, kafka_broker, kafka_topic_prefix, mode="auto")
    init_outbox(settings)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE not_the_outbox (id int)")
        conn.execute(
            sql.SQL("ALTER PUBLICATION {} SET TABLE not_the_outbox").format(
                sql.Identifier(settings.publication_name)
            )
        )
    caplog.set_level(logging.WARNING, logger="cdc_outbox.service.relay_service")
    spec = workload.WorkloadSpec(events=300, writers=1, aggregates=10, txn_sizes=(1, 10))
    with service_thread(settings) as service:
        _writer(pg_dsn, settings, spec).join()
        wait_until(
            lambda: outbox_statuses(pg_dsn) == {"PUBLISHED": 300},
            timeout=90,
            message=lambda: f"{outbox_statuses(pg_dsn)} {service.stats.mode}",
        )
        assert service.stats.mode == "polling"
        assert service.stats.delivery_guarantee == "at_least_once"
    assert any("polling is at-least-once" in r.getMessage() for r in caplog.records)


def test_a_dead_letter_whose_transaction_aborted_is_dead_lettered_again_once(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str
) -> None:
    """The row is marked FAILED before the Kafka commit; the relay dies just before the commit
    (eos.before_kafka_commit). The next relay finds the row FAILED (its aggregate parked) and
    dead-letters it again in its own transaction: read_committed sees one dead letter, the
    row keeps its first reason, and the other events are published once, the one of the
    poison's aggregate ahead of it too (parked only from the poison on)."""
    settings = eos_settings(pg_dsn, kafka_broker, kafka_topic_prefix, mode="cdc")
    init_outbox(settings)
    first = RelayProcess(settings, "eos-dlq-first")
    first.start()
    try:
        _wait_streaming(pg_dsn, settings, first)
    finally:
        first.kill()
    with psycopg.connect(pg_dsn) as conn:
        insert = "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES"
        # before: agg-1's event ahead of the poison (issue 37: the re-stream must publish it,
        # not park it behind the poison found FAILED in the table).
        before = conn.execute(
            insert + " (gen_random_uuid(), 'order', 'agg-1', 'E', '{}') RETURNING id::text"
        ).fetchall()
        rows = conn.execute(
            insert + " (gen_random_uuid(), 'order', 'agg-1', 'E', NULL),"
            " (gen_random_uuid(), 'order', 'agg-2', 'E', '{}') RETURNING id::text"
        ).fetchall()
        conn.commit()
    ahead, poison, fine = str(before[0][0]), str(rows[0][0]), str(rows[1][0])
    crashing = RelayProcess(
        settings, "eos-dlq-crash", CDC_OUTBOX_CRASH_AT="eos.before_kafka_commit"
    )
    crashing.start()
    assert crashing.wait(90) == -signal.SIGKILL, crashing.log_tail()
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute(
            "SELECT status, last_error FROM outbox WHERE id = %s", (poison,)
        ).fetchone()
    assert row is not None and row[0] == "FAILED"  # durable before the (aborted) commit
    first_reason = row[1]
    relay = RelayProcess(settings, "eos-dlq-again")
    relay.start()
    try:
        wait_relayed(pg_dsn, settings, relay, 90)
    finally:
        relay.stop_quietly()
    bootstrap = kafka_broker.bootstrap_servers
    dlq = read_topics(bootstrap, f"{kafka_topic_prefix}.dlq", extra_config=COMMITTED)
    main = read_topics(bootstrap, f"{kafka_topic_prefix}.event.", extra_config=COMMITTED)
    assert [dict(r.headers)["id"].decode() for r in dlq] == [poison]
    assert sorted(dict(r.headers)["id"].decode() for r in main) == sorted([ahead, fine])
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute("SELECT last_error FROM outbox WHERE id = %s", (poison,)).fetchone()
    assert row is not None and row[0] == first_reason
    aborted = read_topics(bootstrap, f"{kafka_topic_prefix}.dlq", extra_config=UNCOMMITTED)
    assert len(aborted) == 2  # the first dead letter is in the log, aborted
