"""The physical-standby harness itself (cdc_outbox_dev/sandbox/standby.py), on real servers."""

from __future__ import annotations

import psycopg

from cdc_outbox_dev.sandbox import standby as sb
from cdc_outbox_dev.sandbox.postgres import LocalPostgres


def _write(dsn: str, rows: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS t (n int, pad text)")
        conn.execute(
            "INSERT INTO t SELECT g, repeat('x', 200) FROM generate_series(1, %s) g", (rows,)
        )


def _count(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM t").fetchone()
    assert row is not None
    return int(row[0])


def test_standby_replays_falls_behind_when_paused_and_promotes_to_timeline_2() -> None:
    with LocalPostgres() as primary:
        standby = sb.make_standby(primary, application_name="harness", slot="harness_slot")
        try:
            with psycopg.connect(primary.dsn) as conn:
                row = conn.execute(
                    "SELECT application_name, state FROM pg_stat_replication"
                ).fetchone()
                slot = conn.execute(
                    "SELECT slot_type, active FROM pg_replication_slots"
                    " WHERE slot_name = 'harness_slot'"
                ).fetchone()
            assert row == ("harness", "streaming")
            assert slot == ("physical", True)

            _write(primary.dsn, 1_000)
            sb.wait_replayed(standby, sb.current_lsn(primary))
            assert _count(standby.dsn) == 1_000

            with sb.paused_walreceiver(standby):
                before = sb.replay_lsn(standby)
                _write(primary.dsn, 200_000)  # ~50 MB of WAL: far more than socket buffers
                target = sb.current_lsn(primary)
                assert sb.replay_lsn(standby) < target
                primary.crash()
                assert sb.replay_lsn(standby) >= before
            sb.promote(standby)
            assert sb.timeline(standby.dsn) == 2
            assert sb.replay_lsn(standby) < target  # it never received the whole of it
            assert 1_000 <= _count(standby.dsn) < 201_000  # lost what it never received
            dsn = sb.multi_host_dsn([primary, standby], "postgres")
            with psycopg.connect(dsn) as conn:
                port = conn.execute("SELECT inet_server_port()").fetchone()
            assert port == (standby.port,)
        finally:
            standby.close()
