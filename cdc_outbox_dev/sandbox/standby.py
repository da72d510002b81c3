"""An asynchronous physical standby of a ``LocalPostgres``, as plain processes (failover tests).

``make_standby(primary)`` stops the primary cleanly, copies its data directory (a cold copy:
no ``pg_basebackup`` needed, which the Maven builds lack), starts the primary again and starts
the copy as a streaming standby: ``standby.signal``, ``primary_conninfo`` with an
``application_name`` (and a ``dbname``, which PostgreSQL 17's slot synchronization needs), and
with ``slot=...`` a physical replication slot on the primary used through ``primary_slot_name``.
Make the standby before any logical slot exists: the copy leaves ``pg_replslot/`` out, as a real
base backup would.

Then: ``wait_replayed(standby, lsn)``, ``paused_walreceiver(standby)`` (SIGSTOP / SIGCONT of its
walreceiver: the standby falls behind while the primary commits), ``primary.crash()`` (``-m
immediate``) or ``primary.kill()`` (SIGKILL), ``promote(standby)``, ``timeline(dsn)`` and
``multi_host_dsn(...)`` (libpq follows whichever server is the read-write one).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from cdc_outbox_dev.sandbox import _proc
from cdc_outbox_dev.sandbox.postgres import SUPERUSER, LocalPostgres

logger = logging.getLogger(__name__)

#: Copied as empty directories: runtime state, WAL of the source, slots (base-backup rules).
EMPTIED_DIRS = frozenset(
    {
        "pg_wal",
        "pg_replslot",
        "pg_stat_tmp",
        "pg_dynshmem",
        "pg_notify",
        "pg_serial",
        "pg_snapshots",
        "pg_subtrans",
    }
)
#: Files of the source that the copy must not have.
SKIPPED_FILES = frozenset(
    {
        "postmaster.pid",
        "postmaster.opts",
        "server.log",
        "standby.signal",
        "backup_label",
        "tablespace_map",
    }
)

#: What a standby needs to synchronize failover slots (PostgreSQL 17+; ``primary_slot_name``
#: and the ``dbname`` in ``primary_conninfo`` come from ``standby_settings``).
FAILOVER_SLOT_STANDBY_SETTINGS = {"sync_replication_slots": "on", "hot_standby_feedback": "on"}


def primary_conninfo(port: int, application_name: str, dbname: str = "postgres") -> str:
    """The standby's ``primary_conninfo``: loopback, the superuser, its application name."""
    return make_conninfo(
        "",
        host="127.0.0.1",
        port=port,
        user=SUPERUSER,
        dbname=dbname,
        application_name=application_name,
    )


def standby_settings(
    primary_port: int, application_name: str, slot: str | None = None
) -> dict[str, str]:
    """Settings that make a copy of the primary a streaming, hot standby."""
    settings = {
        "primary_conninfo": primary_conninfo(primary_port, application_name),
        "hot_standby": "on",
        "wal_receiver_status_interval": "1s",
    }
    if slot is not None:
        settings["primary_slot_name"] = slot
    return settings


def copy_ignored(directory: str, names: Iterable[str], root: str) -> set[str]:
    """``shutil.copytree`` ignore function: what a copy of data directory ``root`` leaves out
    (see EMPTIED_DIRS and SKIPPED_FILES; only at the top level, ``pg_wal`` below ``root``)."""
    if os.path.normpath(directory) != os.path.normpath(root):
        parent = os.path.relpath(directory, root).split(os.sep)[0]
        return set(names) if parent in EMPTIED_DIRS else set()
    return {n for n in names if n in SKIPPED_FILES}


def multi_host_dsn(servers: Iterable[LocalPostgres], dbname: str, **params: str) -> str:
    """``host=127.0.0.1,127.0.0.1 port=p1,p2 ... target_session_attrs=read-write``."""
    ports = [str(s.port) for s in servers]
    return make_conninfo(
        "",
        host=",".join(["127.0.0.1"] * len(ports)),
        port=",".join(ports),
        user=SUPERUSER,
        dbname=dbname,
        target_session_attrs="read-write",
        **params,
    )


def timeline_of_walfile(name: str) -> int:
    """The timeline of a WAL segment file name (its first 8 hex digits)."""
    if len(name) != 24:
        raise ValueError(f"not a WAL segment file name: {name!r}")
    return int(name[:8], 16)


def make_standby(
    primary: LocalPostgres,
    *,
    application_name: str = "standby1",
    slot: str | None = None,
    settings: Mapping[str, str] | None = None,
    failover_slots: bool = False,
    timeout: float = 120.0,
) -> LocalPostgres:
    """A running asynchronous standby of ``primary`` (a cold copy, see the module docstring);
    ``primary`` runs again on return and the standby streams from it. ``settings`` add to the
    standby's (they start as the primary's). ``failover_slots`` (PostgreSQL 17+, needs
    ``slot``): the standby synchronizes failover slots (``sync_replication_slots`` and
    ``hot_standby_feedback`` on) and the primary's ``synchronized_standby_slots`` names
    ``slot``. The caller closes the standby."""
    if failover_slots:
        if slot is None:
            raise ValueError("failover_slots needs a physical slot (slot=...)")
        settings = {**FAILOVER_SLOT_STANDBY_SETTINGS, **(settings or {})}
    if slot is not None:
        with psycopg.connect(primary.dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_create_physical_replication_slot(%s, true)", (slot,))
    primary.stop()
    standby = LocalPostgres(
        settings={
            **primary.settings,
            **standby_settings(primary.port, application_name, slot),
            **(settings or {}),
        }
    )
    try:
        root = str(primary.datadir)
        shutil.copytree(
            primary.datadir,
            standby.datadir,
            ignore=lambda d, names: copy_ignored(d, names, root),
            symlinks=True,
        )
        for name in EMPTIED_DIRS - {n.name for n in standby.datadir.iterdir()}:
            (standby.datadir / name).mkdir(mode=0o700)
        (standby.datadir / "standby.signal").write_text("")
        _chown_tree(standby)
        primary.start(timeout)
        standby.start(timeout)
        wait_streaming(standby, timeout)
        if failover_slots:  # after the copy: a promoted standby must not wait for itself
            with psycopg.connect(primary.dsn, autocommit=True) as conn:
                setting = sql.SQL("ALTER SYSTEM SET synchronized_standby_slots = {}")
                conn.execute(setting.format(sql.Literal(slot)))
                conn.execute("SELECT pg_reload_conf()")
    except BaseException:
        standby.close()
        primary.start(timeout)
        raise
    logger.info(
        "standby %s on port %d streams from port %d", application_name, standby.port, primary.port
    )
    return standby


def _chown_tree(server: LocalPostgres) -> None:
    user = server._user  # the OS user the server runs as (None: ourselves)
    if user is None:
        return
    for dirpath, _, files in os.walk(server.datadir):
        os.chown(dirpath, user.pw_uid, user.pw_gid)
        for name in files:
            os.chown(os.path.join(dirpath, name), user.pw_uid, user.pw_gid)


def _one(dsn: str, query: str, *args: object) -> object:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute(query, args or None).fetchone()
    return None if row is None else row[0]


def walreceiver_pid(standby: LocalPostgres) -> int | None:
    """The pid of the standby's walreceiver while it streams (None otherwise)."""
    pid = _one(standby.dsn, "SELECT pid FROM pg_stat_wal_receiver WHERE status = 'streaming'")
    return None if pid is None else int(str(pid))


def wait_streaming(standby: LocalPostgres, timeout: float = 120.0) -> int:
    """Wait until the standby's walreceiver streams; its pid."""
    found: list[int] = []

    def streaming() -> bool:
        pid = walreceiver_pid(standby)
        found[:] = [] if pid is None else [pid]
        return bool(found)

    _proc.wait_for(streaming, timeout, "the standby to stream", interval=0.1)
    return found[0]


def replay_lsn(standby: LocalPostgres) -> int:
    """How far the standby replayed (``pg_last_wal_replay_lsn()``, bytes)."""
    return int(str(_one(standby.dsn, "SELECT pg_last_wal_replay_lsn() - '0/0'") or 0))


def current_lsn(primary: LocalPostgres) -> int:
    """The primary's WAL insert position (bytes)."""
    return int(str(_one(primary.dsn, "SELECT pg_current_wal_lsn() - '0/0'")))


def wait_replayed(standby: LocalPostgres, lsn: int, timeout: float = 120.0) -> None:
    """Wait until the standby replayed up to ``lsn`` (bytes, e.g. ``current_lsn(primary)``)."""
    _proc.wait_for(
        lambda: replay_lsn(standby) >= lsn, timeout, f"the standby to replay up to byte {lsn}"
    )


@contextmanager
def paused_walreceiver(standby: LocalPostgres, timeout: float = 120.0) -> Iterator[int]:
    """SIGSTOP the standby's walreceiver for the block (its pid is yielded), SIGCONT after:
    the primary goes on committing and the standby falls behind (the socket buffers still hold
    what the primary sent before the pause; the walreceiver reads them on resume). Resume
    before stopping or promoting the standby: a stopped walreceiver never acts on signals."""
    pid = wait_streaming(standby, timeout)
    os.kill(pid, signal.SIGSTOP)
    logger.info("walreceiver %d of the standby on port %d paused", pid, standby.port)
    try:
        yield pid
    finally:
        if _proc.pid_alive(pid):
            os.kill(pid, signal.SIGCONT)
        logger.info("walreceiver %d resumed", pid)


def promote(standby: LocalPostgres, timeout: float = 120.0) -> None:
    """Promote the standby (``pg_promote``) and wait until it accepts writes."""
    _one(standby.dsn, "SELECT pg_promote(true, %s)", int(timeout))
    _proc.wait_for(
        lambda: bool(_one(standby.dsn, "SELECT NOT pg_is_in_recovery()")),
        timeout,
        "the promoted standby to leave recovery",
    )
    logger.info("standby on port %d promoted (timeline %d)", standby.port, timeline(standby.dsn))


def timeline(dsn: str) -> int:
    """The timeline a primary writes on (from the name of its current WAL file)."""
    return timeline_of_walfile(str(_one(dsn, "SELECT pg_walfile_name(pg_current_wal_lsn())")))
