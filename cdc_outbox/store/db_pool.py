"""One process-wide PostgreSQL connection pool for short, repeated work.

Contract:
- :func:`pooled` lends an autocommit connection (``application_name`` ``cdc-outbox`` unless
  the DSN names one) from the pool of the settings' DSN, opened lazily on first use and
  shared by every thread. A connection is checked (``ConnectionPool.check_connection``) before
  it is lent, so after a PostgreSQL restart a dead one is dropped and a new one made.
- With ``statement_timeout_s`` the connection is lent inside a transaction with
  ``SET LOCAL statement_timeout``: nothing session-level is left behind for the next borrower.
- Failing to get a connection raises :class:`~cdc_outbox.admin.lifecycle.DatabaseUnavailable`
  (one line, DSN redacted, secrets masked), like :func:`cdc_outbox.admin.lifecycle.connect`.
  Errors raised by the caller's own statements pass through unchanged.
- :func:`hold` keeps the pool open for a scope (``Service.run``) and closes it when the last
  holder leaves; :func:`close_all` closes every pool (also at interpreter exit).

Who borrows: the auto-mode CDC probes and publication checks, the phase reads/writes and the
slot/publication housekeeping (:mod:`~cdc_outbox.service.relay_service`), the slot monitor
and heartbeat
samplers and the readiness check's ``SELECT 1`` - at most one connection per thread at a
time, so ``db_pool_max_size`` (default 4) covers them without waiting.

Not pooled, on purpose (they need session state or are already one connection per component):
the leader's advisory-lock connection, the replication stream, the published-marker and
failed-row connections, the polling relay's connection, and the CLI commands (one connection
per process run). Those on the relay's path connect through :func:`connect` (or
:func:`connect_kwargs`), so no connect or dead peer blocks them without a bound.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from cdc_outbox.errors import DatabaseUnavailable
from cdc_outbox.redaction import redact, redact_dsn

__all__ = [
    "BORROW_TIMEOUT_S",
    "CONNECT_TIMEOUT_S",
    "PoolSettings",
    "close_all",
    "connect",
    "connect_kwargs",
    "hold",
    "pool_kwargs",
    "pooled",
]

logger = logging.getLogger(__name__)

Conn = psycopg.Connection[tuple[Any, ...]]


class PoolSettings(Protocol):
    """What the pool reads of its settings: ``Settings`` and
    :class:`~cdc_outbox.config.database.DatabaseSection` both answer it (one pool per DSN and
    size, whichever of them asks)."""

    @property
    def db_pool_max_size(self) -> int: ...

    def postgres_dsn(self) -> str: ...

    def secret_values(self) -> list[str]: ...


#: libpq ``connect_timeout`` of each new pool connection (unless the DSN sets one).
CONNECT_TIMEOUT_S = 10
#: How long :func:`pooled` waits for a connection by default.
BORROW_TIMEOUT_S = 15.0
#: Idle connections above ``min_size`` are closed after this long.
MAX_IDLE_S = 300.0
APPLICATION_NAME = "cdc-outbox"


class _Pool(ConnectionPool[Conn]):
    """A ConnectionPool that remembers why its last connection attempt failed (for errors)."""

    last_error: BaseException | None = None

    def _connect(self, timeout: float | None = None) -> Conn:
        try:
            conn = super()._connect(timeout)
        except Exception as exc:
            self.last_error = exc
            raise
        self.last_error = None
        return conn


_lock = threading.Lock()
_pools: dict[tuple[str, int], _Pool] = {}
_holders: dict[tuple[str, int], int] = {}


#: libpq keepalives of every connection the relay makes (unless the DSN sets them): a server
#: that vanished without closing the connection (power loss, partition) is noticed in about
#: 25 s instead of the kernel's two hours.
KEEPALIVES: dict[str, int] = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
}


def connect_kwargs(dsn: str) -> dict[str, Any]:
    """libpq parameters that bound the blocking calls of a connection on the relay's path:
    ``connect_timeout`` (:data:`CONNECT_TIMEOUT_S`) and :data:`KEEPALIVES`, each only where the
    DSN does not set it."""
    given = conninfo_to_dict(dsn)
    wanted: dict[str, Any] = {"connect_timeout": CONNECT_TIMEOUT_S, **KEEPALIVES}
    return {name: value for name, value in wanted.items() if name not in given}


def connect(dsn: str, **kwargs: Any) -> Conn:
    """``psycopg.connect`` with :func:`connect_kwargs` (a dedicated, non-pooled connection)."""
    return psycopg.connect(dsn, **connect_kwargs(dsn), **kwargs)


def pool_kwargs(settings: PoolSettings) -> dict[str, Any]:
    """The ``ConnectionPool`` arguments for ``settings`` (besides ``open`` and the class)."""
    dsn = settings.postgres_dsn()
    given = conninfo_to_dict(dsn)
    kwargs: dict[str, Any] = {"autocommit": True, **connect_kwargs(dsn)}
    if "application_name" not in given:
        kwargs["application_name"] = APPLICATION_NAME
    return {
        "conninfo": dsn,
        "kwargs": kwargs,
        "min_size": 1,
        "max_size": settings.db_pool_max_size,
        "timeout": BORROW_TIMEOUT_S,
        "max_idle": MAX_IDLE_S,
        "check": ConnectionPool.check_connection,
        "name": APPLICATION_NAME,
    }


def _key(settings: PoolSettings) -> tuple[str, int]:
    return settings.postgres_dsn(), settings.db_pool_max_size


def _get(settings: PoolSettings) -> _Pool:
    key = _key(settings)
    with _lock:
        pool = _pools.get(key)
        if pool is None or pool.closed:
            _install_log_filter(settings)
            pool = _Pool(open=False, **pool_kwargs(settings))
            pool.open(wait=False)
            _pools[key] = pool
            logger.debug("opened the connection pool (max %d)", settings.db_pool_max_size)
        return pool


@contextmanager
def pooled(
    settings: PoolSettings,
    *,
    timeout: float | None = None,
    statement_timeout_s: float | None = None,
) -> Iterator[Conn]:
    """Lend a pooled autocommit connection for the block (see the module contract)."""
    pool = _get(settings)
    try:
        conn = pool.getconn(timeout)
    except (PoolTimeout, PoolClosed) as exc:
        raise DatabaseUnavailable(_unavailable(settings, pool, exc)) from None
    try:
        if statement_timeout_s is None:
            yield conn
        else:
            with conn.transaction():
                conn.execute(
                    "SELECT set_config('statement_timeout', %s, true)",
                    (f"{max(1, int(statement_timeout_s * 1000))}ms",),
                )
                yield conn
    finally:
        pool.putconn(conn)


@contextmanager
def hold(settings: PoolSettings) -> Iterator[None]:
    """Keep the settings' pool for the block; the last holder to leave closes it."""
    key = _key(settings)
    with _lock:
        _holders[key] = _holders.get(key, 0) + 1
    try:
        yield
    finally:
        with _lock:
            _holders[key] -= 1
            pool = _pools.pop(key, None) if _holders[key] == 0 else None
            if _holders[key] == 0:
                del _holders[key]
        if pool is not None:
            pool.close()
            logger.debug("closed the connection pool")


def close_all() -> None:
    """Close every pool of this process (idempotent)."""
    with _lock:
        pools = list(_pools.values())
        _pools.clear()
    for pool in pools:
        pool.close()


atexit.register(close_all)


def _unavailable(settings: PoolSettings, pool: _Pool, exc: BaseException) -> str:
    cause = pool.last_error or exc
    message = " ".join(str(cause).split()) or type(cause).__name__
    message = redact(message, settings.secret_values())
    return f"cannot connect to PostgreSQL ({redact_dsn(settings.postgres_dsn())}): {message}"


class _MaskSecrets(logging.Filter):
    """Masks known secrets in psycopg_pool's own log lines (its connection errors)."""

    def __init__(self) -> None:
        super().__init__()
        self.secrets: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            text = record.getMessage()
            masked = redact(text, self.secrets)
            if masked != text:
                record.msg, record.args = masked, None
        return True


_mask = _MaskSecrets()


def _install_log_filter(settings: PoolSettings) -> None:
    _mask.secrets.update(s for s in settings.secret_values() if s)
    pool_logger = logging.getLogger("psycopg.pool")
    if pool_logger.level == logging.NOTSET:
        pool_logger.setLevel(logging.WARNING)  # it logs every borrow at INFO
    if _mask not in pool_logger.filters:
        pool_logger.addFilter(_mask)
