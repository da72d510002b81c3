"""The relay never stops by itself (issue 37, item 0), against real PostgreSQL and Kafka.

Only a stop request ends ``cdc-outbox run`` with 0; every other end is non-zero with its
reason, and nothing on the main path blocks without a bound:

- a relay paused past its lease twice (SIGSTOP, what a GC pause or a VM migration does)
  stands by, leads again and publishes its whole backlog, never exiting 0 with it unpublished;
- the service refuses a relay that returns without a stop request;
- a main loop that hangs stops renewing the lease, so a standby takes over;
- REPLICATION revoked while running ends cdc mode with exit 5 instead of retrying forever;
- connections on the relay's path have a connect timeout (a server that accepts TCP and never
  answers no longer hangs the polling relay or the replication stream).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from functools import partial

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from cdc_outbox.cdc.relay import Relay
from cdc_outbox.cdc.replication_stream import ReplicationError, ReplicationStream
from cdc_outbox.config.settings import Settings
from cdc_outbox.errors import PrivilegeMissing
from cdc_outbox.service.relay_service import RelayEnded, Service
from cdc_outbox.service.wiring import build_service, polling_relay
from cdc_outbox.store import db_pool
from cdc_outbox.store.relay_state import NotLeader
from cdc_outbox_dev import workload
from cdc_outbox_dev.sandbox.kafka import LocalKafka
from tests.support.helpers import wait_until
from tests.support.relay import (
    all_relayed,
    init_outbox,
    outbox_statuses,
    relay_settings,
    slot_holder,
    writers_thread,
)
from tests.support.relay_process import RelayProcess
from tests.support.sections import leadership


def _published(dsn: str) -> int:
    return outbox_statuses(dsn).get("PUBLISHED", 0)


def test_a_relay_paused_past_its_lease_twice_leads_again_and_publishes_everything(
    pg_dsn: str, kafka_broker: LocalKafka, kafka_topic_prefix: str
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    settings = relay_settings(pg_dsn, bootstrap, kafka_topic_prefix, leader_lease_s=2.0)
    init_outbox(settings)
    # ~16 s of 100-row transactions: a backlog builds up behind each pause
    spec = workload.WorkloadSpec(events=40_000, writers=2, txn_sizes=(100,), rate=2_500)
    stop_writing = threading.Event()
    writer, reports = writers_thread(pg_dsn, spec, settings, stop_writing)
    relay = RelayProcess(settings, "relay-paused-twice")
    relay.start()
    writer.start()
    try:
        assert relay.proc is not None
        for pause in (1, 2):
            seen = wait_until(lambda: _published(pg_dsn), 60, message=relay.log_tail)
            relay.proc.send_signal(signal.SIGSTOP)
            time.sleep(settings.leader_lease_s + 1.0)  # the fault itself: paused past the lease
            relay.proc.send_signal(signal.SIGCONT)
            wait_until(
                partial(lambda n: _published(pg_dsn) > n or not relay.alive, seen),
                60,
                message=relay.log_tail,
            )
            code = relay.proc.returncode
            assert relay.alive, f"exit {code} after pause {pause}\n{relay.log_tail()}"
        writer.join(120)
        assert not writer.is_alive() and reports
        total = reports[0].committed
        wait_until(
            lambda: _published(pg_dsn) == total or not relay.alive,
            120,
            message=lambda: f"{outbox_statuses(pg_dsn)} of {total}\n{relay.log_tail()}",
        )
        code = relay.proc.returncode
        assert relay.alive, f"exit {code} with a backlog\n{relay.log_tail()}"
        assert "leadership lost" in relay.log_path.read_text(), "no pause lapsed the lease"
        relay.terminate()
        assert relay.wait(60) == 0, relay.log_tail()
        all_relayed(pg_dsn, settings, bootstrap, kafka_topic_prefix, total)
    finally:
        stop_writing.set()
        if relay.alive:
            assert relay.proc is not None
            relay.proc.send_signal(signal.SIGCONT)
        relay.stop_quietly()


def _service_thread(service: Service) -> tuple[threading.Thread, list[BaseException | None]]:
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            service.run()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, name="service", daemon=True)
    thread.start()
    return thread, outcome


def test_the_service_refuses_a_relay_that_returns_without_a_stop_request(
    pg_dsn: str,
    kafka_broker: LocalKafka,
    kafka_topic_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = relay_settings(pg_dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix)
    init_outbox(settings)
    monkeypatch.setattr(Relay, "run", lambda self: None)
    thread, outcome = _service_thread(build_service(settings))
    thread.join(60)
    assert not thread.is_alive()
    assert isinstance(outcome[0], RelayEnded), repr(outcome[0])
    assert RelayEnded.exit_code != 0


def test_a_hung_main_loop_gives_up_the_lease_and_a_standby_takes_over(
    pg_dsn: str,
    kafka_broker: LocalKafka,
    kafka_topic_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = relay_settings(
        pg_dsn,
        kafka_broker.bootstrap_servers,
        kafka_topic_prefix,
        leader_lease_s=2.0,
        health={"loop_stale_s": 5.0},
    )
    init_outbox(settings)
    entered, hang = threading.Event(), threading.Event()

    def hung_run(self: Relay) -> None:  # a main loop stuck in a call that never returns
        entered.set()
        hang.wait(120)

    monkeypatch.setattr(Relay, "run", hung_run)
    service = build_service(settings)
    thread, outcome = _service_thread(service)
    standby = leadership(settings, "standby")
    try:
        assert entered.wait(60), "the service never started its relay"
        t0 = time.monotonic()
        won = threading.Event()
        threading.Thread(
            target=lambda: standby.acquire(threading.Event()) and won.set(), daemon=True
        ).start()
        bound = settings.health.loop_stale_s + settings.leader_lease_s + 5.0
        assert won.wait(bound), f"no takeover within {bound} s of a hung main loop"
        print(f"\nhung main loop: standby led after {time.monotonic() - t0:.2f} s")
    finally:
        hang.set()
        service.request_stop()
        thread.join(60)
        standby.release()
    assert not thread.is_alive()
    assert (outcome and outcome[0] is None) or isinstance(outcome[0], RelayEnded | NotLeader)


@pytest.fixture
def replication_role(pg_dsn: str) -> Iterator[str]:
    """A login role with REPLICATION and what a cdc relay needs on the outbox; its DSN."""
    role = f"repl_{uuid.uuid4().hex[:8]}"
    ident = sql.Identifier(role)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN REPLICATION PASSWORD 'pw'").format(ident))
        conn.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(ident))
        database = sql.Identifier(conninfo_to_dict(pg_dsn)["dbname"])
        conn.execute(sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(database, ident))
    yield make_conninfo(pg_dsn, user=role, password="pw")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,)
        )
        conn.execute(sql.SQL("DROP OWNED BY {}").format(ident))
        conn.execute(sql.SQL("DROP ROLE {}").format(ident))


def test_replication_revoked_while_running_ends_cdc_mode_with_exit_5(
    pg_dsn: str, replication_role: str, kafka_broker: LocalKafka, kafka_topic_prefix: str
) -> None:
    settings = relay_settings(replication_role, kafka_broker.bootstrap_servers, kafka_topic_prefix)
    init_outbox(settings)  # as the role: it owns the table, publication and slot
    relay = RelayProcess(settings, "relay-replication-revoked")
    relay.start()
    try:
        walsender = wait_until(
            lambda: slot_holder(pg_dsn, settings.slot_name), 60, message=relay.log_tail
        )
        role = conninfo_to_dict(replication_role)["user"]
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("ALTER ROLE {} NOREPLICATION").format(sql.Identifier(role)))
            conn.execute("SELECT pg_terminate_backend(%s)", (walsender,))
        code = relay.wait(90)  # before issue 37 it retried forever: this wait timed out
        log = relay.log_path.read_text()
        assert code == PrivilegeMissing.exit_code == 5, log[-3000:]
        errors = [line for line in log.splitlines() if line.startswith("cdc-outbox: error: ")]
        assert len(errors) == 1, log[-3000:]
        assert "lacks REPLICATION" in errors[0] and "ALTER ROLE" in errors[0], errors[0]
        assert "pw" not in errors[0].replace("password", "")
    finally:
        relay.stop_quietly()


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP port that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield listener.getsockname()[1]


def _raises_within(call: object, bound: float) -> BaseException | None:
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()  # type: ignore[operator]
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(bound)
    assert not thread.is_alive(), f"still blocked after {bound} s: no timeout on this path"
    return outcome[0]


def test_the_polling_relay_and_the_stream_do_not_hang_on_a_silent_server(
    silent_server: int,
) -> None:
    dsn = f"host=127.0.0.1 port={silent_server} dbname=x user=u"
    settings = Settings.model_validate(
        {"dsn": dsn, "mode": "polling", "kafka": {"bootstrap_servers": "127.0.0.1:1"}}
    )
    bound = db_pool.CONNECT_TIMEOUT_S + 10.0
    polling = polling_relay(settings)
    assert isinstance(_raises_within(polling.run_once, bound), psycopg.OperationalError)
    stream = ReplicationStream(dsn, "s", "p")
    assert isinstance(_raises_within(stream.connect, bound), ReplicationError)
    assert os.environ.get("PGCONNECT_TIMEOUT") is None  # the bound is ours, not the caller's
