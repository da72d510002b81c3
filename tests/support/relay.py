"""Helpers for relay tests: settings, the relay in a thread or a real process, slot queries."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol, TypeVar

import psycopg
from psycopg import sql

from cdc_outbox.admin import lifecycle
from cdc_outbox.cdc.catch_up import UNMARKED_WINDOW
from cdc_outbox.cdc.relay import Relay
from cdc_outbox.cdc.relay_build import build_relay
from cdc_outbox.config.settings import Settings
from cdc_outbox.lsn import Lsn
from cdc_outbox.service.relay_service import Service
from cdc_outbox.service.wiring import build_service
from cdc_outbox_dev import workload
from tests.support.helpers import wait_until
from tests.support.http import endpoint_answers


def relay_settings(dsn: str, bootstrap_servers: str, prefix: str, **overrides: Any) -> Settings:
    """Settings for one test: its own topics (``<prefix>.event.*``, ``<prefix>.dlq``), the
    CDC relay only (``mode = "cdc"``) and no metrics endpoint, unless ``overrides`` say else
    (with ``outboxes``, each entry names its own topics)."""
    values: dict[str, Any] = {
        "mode": "cdc",
        "dsn": dsn,
        "topic_template": prefix + ".event.{aggregate_type}",
        "dead_letter_topic": prefix + ".dlq",
        "kafka": {"bootstrap_servers": bootstrap_servers},
        "status_interval_s": 1.0,
        "shutdown_grace_s": 15.0,
        "metrics_port": 0,
    }
    values.update(overrides)
    if "outboxes" in overrides:
        del values["topic_template"]
    return Settings.model_validate(values)


def init_outbox(settings: Settings) -> None:
    """Outbox table, publication and slot, as ``cdc-outbox init --create-table`` does."""
    lifecycle.init(settings, create_table=True)


def init_for_catch_up(settings: Settings) -> None:
    """:func:`init_outbox`, then drop the slot and leave the phase CATCHING_UP (as ``init``
    over unpublished rows, or a crash mid catch-up, leaves it): rows written before the first
    start are published by its catch-up, and a wait for STREAMING waits for it. (A slot
    ``init`` made over an empty table is streamed as it is: rows written after it would be
    streamed.)"""
    init_outbox(settings)
    leave_for_catch_up(settings)


def leave_for_catch_up(settings: Settings) -> None:
    """Drop the slot ``init`` made and leave the phase CATCHING_UP (see
    :func:`init_for_catch_up`)."""
    with psycopg.connect(settings.postgres_dsn(), autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (settings.slot_name,))
        conn.execute(
            "UPDATE cdc_outbox_relay_state SET phase = 'CATCHING_UP', consistent_point = NULL"
            " WHERE slot_name = %s",
            (settings.slot_name,),
        )


class Runner(Protocol):
    """What the relay, the polling relay and the service have in common."""

    def run(self) -> None: ...

    def request_stop(self) -> None: ...


R = TypeVar("R", bound=Runner)


@contextmanager
def running(runner: R, timeout: float = 90) -> Iterator[R]:
    """``runner.run()`` in a background thread; stopped on exit and its error re-raised."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            runner.run()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target, name=type(runner).__name__, daemon=True)
    thread.start()
    try:
        yield runner
    finally:
        runner.request_stop()
        thread.join(timeout)
    assert not thread.is_alive(), f"{type(runner).__name__} did not stop within {timeout} s"
    if errors:
        raise errors[0]


def writers_thread(
    dsn: str, spec: workload.WorkloadSpec, settings: Settings, stop: threading.Event
) -> tuple[threading.Thread, list[workload.WriteReport]]:
    """``workload.write_orders`` until ``stop`` (or all of ``spec`` is written) on a thread
    (not started yet), and the list its report is appended to when it ends."""
    reports: list[workload.WriteReport] = []
    thread = threading.Thread(
        target=lambda: reports.append(
            workload.write_orders(dsn, spec, columns=settings.column_names(), stop=stop)
        ),
        name="writers",
    )
    return thread, reports


def relay_thread(settings: Settings) -> AbstractContextManager[Relay]:
    """The CDC relay running in a background thread."""
    return running(build_relay(settings))


@contextmanager
def service_thread(settings: Settings) -> Iterator[Service]:
    """``cdc-outbox run`` (the Service, any mode, built by the one wiring function) in a
    background thread; with a metrics endpoint (``metrics_port`` not 0), entered once its
    ``/healthz`` answers 200."""
    with running(build_service(settings)) as service:
        if settings.metrics_port:
            wait_until(lambda: endpoint_answers(settings), timeout=30, message="endpoint not up")
        yield service


def slot_position(dsn: str, slot: str) -> tuple[Lsn, bool]:
    """(confirmed_flush_lsn, active) of ``slot``; (0/0, False) while it does not exist (a
    relay's catch-up drops and recreates it)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT confirmed_flush_lsn::text, active FROM pg_replication_slots"
            " WHERE slot_name = %s",
            (slot,),
        ).fetchone()
    if row is None:
        return Lsn(0), False
    return (Lsn(0) if row[0] is None else Lsn.parse(row[0])), bool(row[1])


def slot_holder(dsn: str, slot: str) -> int | None:
    """The pid of the backend streaming from ``slot`` (None while no one holds it)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s AND active",
            (slot,),
        ).fetchone()
    return None if row is None else int(row[0])


def current_wal_lsn(dsn: str) -> Lsn:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return Lsn.parse(row[0])


def outbox_statuses(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT status, count(*) FROM outbox GROUP BY status").fetchall()
    return {status: int(n) for status, n in rows}


def drop_slot_under_the_relay(dsn: str, slot: str) -> None:
    """Terminate the walsender and drop its slot before the relay reconnects (again, until
    the drop wins the race with the walsender's exit and the relay's reconnect)."""
    with psycopg.connect(dsn, autocommit=True) as conn:

        def dropped() -> bool:
            conn.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots"
                " WHERE slot_name = %s AND active",
                (slot,),
            )
            try:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            except psycopg.errors.ObjectInUse:
                return False
            return True

        wait_until(dropped, timeout=4.0, interval=0.02, message="could not drop the slot")


def relay_phase(dsn: str, slot: str) -> tuple[str | None, str | None]:
    """(phase, leader_id) from the relay state table (None, None when there is no row)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT phase, leader_id FROM cdc_outbox_relay_state WHERE slot_name = %s", (slot,)
        ).fetchone()
    return (None, None) if row is None else (row[0], row[1])


def wait_streamed_past_now(
    dsn: str, slot: str, timeout: float, message: Any = "", *, phase: bool = True
) -> None:
    """Wait until the phase is STREAMING (unless ``phase`` is false: a bare Relay) and the
    slot is confirmed past the WAL end as of now (every transaction committed before this
    call was relayed)."""
    target = current_wal_lsn(dsn)

    def done() -> bool:
        streaming = not phase or relay_phase(dsn, slot)[0] == "STREAMING"
        return streaming and slot_position(dsn, slot)[0] >= target

    wait_until(done, timeout=timeout, interval=0.2, message=message)


def insert_bulk_transaction(dsn: str, rows: int) -> None:
    """One committed transaction of ``rows`` outbox events (aggregates agg-0..agg-99, event
    type Bulk, ~400 bytes of payload each)."""
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)"
            " SELECT gen_random_uuid(), 'order', 'agg-' || (g %% 100), 'Bulk',"
            " jsonb_build_object('seq', g, 'pad', repeat(md5(g::text), 12))"
            " FROM generate_series(1, %s) g",
            (rows,),
        )
        conn.commit()


def oversized_record_overrides(bootstrap_servers: str) -> dict[str, Any]:
    """Settings overrides (``max_record_bytes``, ``message.max.bytes``) that let a record above
    the broker's 1 MB limit reach the broker, which then rejects it."""
    return {
        "max_record_bytes": 8_000_000,
        "kafka": {
            "bootstrap_servers": bootstrap_servers,
            "config": {"message.max.bytes": "8000000"},
        },
    }


def tally_topics(
    dsn: str,
    settings: Settings,
    bootstrap: str,
    prefix: str,
    decode_value: Any = None,
    decode_key: Any = None,
    *,
    read_committed: bool = False,
) -> Any:
    """Every committed outbox row against the records of ``<prefix>.event.*`` (printed);
    ``decode_value`` reads values that are not the payload text (Avro); ``read_committed``
    reads as an exactly-once consumer does."""
    from cdc_outbox_dev import workload
    from cdc_outbox_dev.readback import read_topics

    expected = workload.stored_events(dsn, columns=settings.column_names())
    extra = {"isolation.level": "read_committed"} if read_committed else None
    records = read_topics(bootstrap, f"{prefix}.event.", timeout=120, extra_config=extra)
    verdict = workload.tally(expected, records, decode_value=decode_value, decode_key=decode_key)
    print(verdict.summary())
    return verdict


def all_relayed(dsn: str, settings: Settings, bootstrap: str, prefix: str, expected: int) -> Any:
    """:func:`tally_topics`, checked: nothing missing or out of order, ``expected`` events."""
    verdict = tally_topics(dsn, settings, bootstrap, prefix)
    assert verdict.ok, verdict.summary()
    assert verdict.expected == expected
    return verdict


_CATCH_UP_REDO = 2 * UNMARKED_WINDOW + 1_000


class UnconfirmedWindow:
    """Samples, every 0.1 s, what a fault could make the relay re-send, measured from outside:
    committed events past the slot's confirmed position (a broker outage keeps all it held
    back in that window until Kafka acknowledges it), or, while catching up or polling (or
    with no slot), rows not yet PUBLISHED, at most what a redone catch-up may re-send
    (``2 * UNMARKED_WINDOW + 1000``). ``counts``: SQL of (committed events, rows not marked);
    default: the ``outbox`` table's rows and those not PUBLISHED (tests/support/outbox_mix.py
    has the mix's)."""

    def __init__(self, dsn: str, slot: str, counts: sql.Composable | None = None) -> None:
        self.dsn, self.slot = dsn, slot
        self.counts = counts or sql.SQL(
            "(SELECT count(*) FROM outbox),"
            " (SELECT count(*) FROM outbox WHERE status <> 'PUBLISHED')"
        )
        # time, WAL end, slot confirmed (None: no slot), rows, rows not PUBLISHED, phase
        self.samples: list[tuple[float, int, int | None, int, int, str | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="window", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        query = sql.SQL(
            "SELECT clock_timestamp(), pg_current_wal_lsn() - '0/0',"
            " (SELECT confirmed_flush_lsn - '0/0' FROM pg_replication_slots"
            "  WHERE slot_name = %(slot)s), {},"
            " (SELECT phase FROM cdc_outbox_relay_state WHERE slot_name = %(slot)s)"
        ).format(self.counts)
        conn: psycopg.Connection[Any] | None = None
        while not self._stop.wait(0.1):
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=2)
                row = conn.execute(query, {"slot": self.slot}).fetchone()
            except psycopg.Error:
                conn = None  # PostgreSQL down: no sample
                continue
            assert row is not None
            at, wal, conf = row[0].timestamp(), int(row[1]), row[2]
            conf = None if conf is None else int(conf)
            self.samples.append((at, wal, conf, row[3], row[4], row[5]))
        if conn is not None:
            conn.close()

    def at(self, when: float) -> int:
        """What a fault at ``when`` may re-send, from the last sample before it."""
        before = [x for x in self.samples if x[0] <= when]
        if not before:
            return 0
        _, _, conf, rows, unpublished, phase = before[-1]
        window = 0
        if conf is not None:
            confirmed_rows = max((x[3] for x in before if x[1] <= conf), default=0)
            window = rows - confirmed_rows
        if conf is None or phase != "STREAMING":
            window = max(window, min(unpublished, _CATCH_UP_REDO))
        return window
