"""db_pool against a real PostgreSQL: sessions are reused and a server restart is survived."""

from __future__ import annotations

import threading

import psycopg

from cdc_outbox.config.settings import Settings
from cdc_outbox.service import housekeeping
from cdc_outbox.store import db_pool
from cdc_outbox.store.schema import outbox_table_ddl
from cdc_outbox_dev.sandbox.postgres import LocalPostgres

_SESSIONS = (
    "SELECT count(*) FROM pg_stat_activity"
    " WHERE datname = current_database() AND application_name = 'cdc-outbox'"
)


def _sessions(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True, application_name="test-observer") as conn:
        row = conn.execute(_SESSIONS).fetchone()
    assert row is not None
    return int(row[0])


def _create_outbox(settings: Settings) -> None:
    """The outbox table only: a probe then finds the missing publication and slot (without
    the table it ends the relay: SchemaMissing, a problem that cannot heal)."""
    with psycopg.connect(settings.postgres_dsn(), autocommit=True) as conn:
        for stmt in outbox_table_ddl(settings):
            conn.execute(stmt)


def test_probes_reuse_at_most_max_size_sessions(pg_dsn: str) -> None:
    settings = Settings.model_validate({"dsn": pg_dsn, "db_pool_max_size": 2})
    _create_outbox(settings)
    seen: list[int] = []
    errors: list[BaseException] = []

    def probe() -> None:
        try:
            for _ in range(10):
                housekeeping.cdc_problem(settings)  # a real probe: the preflight queries
                with db_pool.pooled(settings) as conn:
                    seen.append(int(conn.execute(_SESSIONS).fetchone()[0]))  # type: ignore[index]
        except BaseException as exc:
            errors.append(exc)

    with db_pool.hold(settings):
        threads = [threading.Thread(target=probe) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not errors, errors
        assert len(seen) == 40
        assert max(seen) <= 2
        assert 1 <= _sessions(pg_dsn) <= 2
    assert _sessions(pg_dsn) == 0  # closed with its last holder


def test_next_borrow_works_after_a_server_restart(pg_server: LocalPostgres, pg_dsn: str) -> None:
    settings = Settings.model_validate({"dsn": pg_dsn})
    _create_outbox(settings)
    with db_pool.hold(settings):
        with db_pool.pooled(settings) as conn:
            before = conn.info.backend_pid
        pg_server.restart()  # every pooled session dies with the server
        with db_pool.pooled(settings) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
            assert conn.info.backend_pid != before
        # A probe works too: the table is there, the slot and publication can be created.
        problem = housekeeping.cdc_problem(settings)
        assert problem is None, problem
        with db_pool.pooled(settings, statement_timeout_s=2.0) as conn:
            row = conn.execute("SHOW statement_timeout").fetchone()
            assert row == ("2s",)
        with db_pool.pooled(settings) as conn:
            row = conn.execute("SHOW statement_timeout").fetchone()
            assert row == ("0",)  # SET LOCAL: nothing left for the next borrower
