"""db_pool: the ConnectionPool it builds, and its errors (no server needed)."""

from __future__ import annotations

import logging

import pytest
from psycopg_pool import ConnectionPool

from cdc_outbox.config.settings import Settings
from cdc_outbox.errors import DatabaseUnavailable
from cdc_outbox.store import db_pool


def _settings(dsn: str, **extra: object) -> Settings:
    return Settings.model_validate({"dsn": dsn, **extra})


def test_pool_parameters_default() -> None:
    kw = db_pool.pool_kwargs(_settings("host=db dbname=shop user=relay password=s3cret"))
    assert kw["conninfo"] == "host=db dbname=shop user=relay password=s3cret"
    assert kw["kwargs"] == {
        "autocommit": True,
        "connect_timeout": db_pool.CONNECT_TIMEOUT_S,
        **db_pool.KEEPALIVES,
        "application_name": "cdc-outbox",
    }
    assert (kw["min_size"], kw["max_size"]) == (1, 4)
    assert kw["check"] is ConnectionPool.check_connection
    assert kw["timeout"] == db_pool.BORROW_TIMEOUT_S


def test_dsn_wins_and_size_is_configurable() -> None:
    settings = _settings(
        "host=db dbname=shop application_name=mine connect_timeout=3 keepalives_idle=30",
        db_pool_max_size=2,
    )
    kw = db_pool.pool_kwargs(settings)
    assert kw["kwargs"] == {
        "autocommit": True,
        "keepalives": 1,
        "keepalives_interval": 5,
        "keepalives_count": 3,
    }
    assert kw["max_size"] == 2


def test_max_size_is_validated() -> None:
    with pytest.raises(ValueError, match="db_pool_max_size"):
        _settings("host=db", db_pool_max_size=0)


def test_constructed_pool_carries_the_parameters() -> None:
    settings = _settings("host=db dbname=shop", db_pool_max_size=3)
    pool = db_pool._Pool(open=False, **db_pool.pool_kwargs(settings))
    assert (pool.min_size, pool.max_size, pool.name) == (1, 3, "cdc-outbox")
    assert pool.kwargs == {
        "autocommit": True,
        "connect_timeout": 10,
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        "application_name": "cdc-outbox",
    }
    assert pool.closed


def test_unreachable_is_one_line_without_the_password(caplog: pytest.LogCaptureFixture) -> None:
    # Port 1 on 127.0.0.1: refused at once, no server needed.
    settings = _settings("host=127.0.0.1 port=1 dbname=x user=u password=hunter2")
    caplog.set_level(logging.WARNING)
    try:
        with (
            pytest.raises(DatabaseUnavailable) as info,
            db_pool.hold(settings),
            db_pool.pooled(settings, timeout=1.0),
        ):
            pass
    finally:
        db_pool.close_all()
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("cannot connect to PostgreSQL (")
    assert "refused" in message or "failed" in message
    assert "hunter2" not in message
    assert "hunter2" not in caplog.text


def test_hold_closes_the_pool_when_the_last_holder_leaves() -> None:
    settings = _settings("host=127.0.0.1 port=1 dbname=x")
    with db_pool.hold(settings):
        with db_pool.hold(settings):
            pool = db_pool._get(settings)
        assert not pool.closed
    assert pool.closed
    assert db_pool._key(settings) not in db_pool._pools


def test_connect_kwargs_bound_every_connection_on_the_relay_path() -> None:
    assert db_pool.connect_kwargs("host=db") == {
        "connect_timeout": db_pool.CONNECT_TIMEOUT_S,
        **db_pool.KEEPALIVES,
    }
    given = "host=db connect_timeout=3 keepalives=0"
    assert db_pool.connect_kwargs(given) == {
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
    }
