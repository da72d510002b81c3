"""A throw-away local PostgreSQL server for tests, demos and benchmarks.

``LocalPostgres`` runs the distribution's ``postgres`` binary (Debian: /usr/lib/postgresql/N/bin)
directly, bound to 127.0.0.1 on a free port, with its unix socket inside the data directory so it
never collides with a system server. Settings live in ``cdc_outbox_sandbox.conf`` (included from
``postgresql.conf``), so ``ALTER SYSTEM`` still overrides them. Authentication is ``trust`` for
127.0.0.1, including replication connections.

PostgreSQL refuses to run as root: when the current user is root, initdb and postgres run as the
``postgres`` OS user and the data directory belongs to it. If that user cannot reach ``base_dir``
(e.g. under /root), the data directory lives in ``$TMPDIR/cdc-outbox-pg-<hash>`` instead and
``base_dir/data`` is a symlink to it.

Plain ``subprocess`` is used rather than pytest-postgresql/mirakuru: those drive ``pg_ctl`` without
switching user, and mirakuru kills its children at interpreter exit, which would break
``cdc-outbox sandbox up`` (servers that outlive the CLI).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from cdc_outbox_dev.sandbox import _proc
from cdc_outbox_dev.sandbox._lifecycle import LocalServer
from cdc_outbox_dev.sandbox._pg_os import OS_USER, find_bindir, reachable, run_as_postgres

logger = logging.getLogger(__name__)

CONF_NAME = "cdc_outbox_sandbox.conf"
SUPERUSER = "postgres"

DEFAULT_SETTINGS: dict[str, str] = {
    "wal_level": "logical",
    "max_wal_senders": "10",
    "max_replication_slots": "10",
    "max_slot_wal_keep_size": "256MB",
    "wal_sender_timeout": "60s",
    "max_connections": "100",
    "shared_buffers": "128MB",
    "logging_collector": "off",
    "log_line_prefix": "%m [%p] %q%u@%d ",
}

_HBA = """\
# written by cdc_outbox_dev.sandbox: throw-away server, trust on loopback only
local   all          all                   trust
local   replication  all                   trust
host    all          all   127.0.0.1/32    trust
host    replication  all   127.0.0.1/32    trust
"""

SettingValue = str | int | bool


def _conf_value(value: SettingValue) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def create_database(dsn: str, name: str) -> None:
    """Create database ``name`` on the server of superuser conninfo ``dsn``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def drop_database(dsn: str, name: str, timeout: float = 30.0) -> None:
    """Drop ``name`` if it exists: refuse new connections, end its sessions (walsenders
    included), drop its replication slots (they block DROP DATABASE), then drop it."""
    ident = sql.Identifier(name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(ident))

        def slots_released() -> bool:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
            row = conn.execute(
                "SELECT count(*) FROM pg_replication_slots WHERE database = %s AND active",
                (name,),
            ).fetchone()
            return row is not None and row[0] == 0

        _proc.wait_for(slots_released, timeout, f"replication slots of {name} to be released")
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
            " WHERE database = %s",
            (name,),
        )
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))


class LocalPostgres(LocalServer):
    """A local PostgreSQL server; ``with LocalPostgres() as pg:`` starts it and cleans up.

    ``base_dir=None`` uses a fresh temporary directory that ``close()`` deletes; an explicit
    ``base_dir`` is kept (data and port survive, so a later instance re-attaches to it).
    """

    def __init__(
        self,
        base_dir: Path | None = None,
        port: int | None = None,
        settings: dict[str, str] | None = None,
    ) -> None:
        self.bindir = find_bindir()
        self._popen_user, self._user = run_as_postgres()
        self._owns_dir = base_dir is None
        self.base_dir = (
            Path(tempfile.mkdtemp(prefix="cdc-outbox-pg-")) if base_dir is None else base_dir
        ).absolute()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if self._owns_dir and self._user is not None:
            os.chown(self.base_dir, self._user.pw_uid, self._user.pw_gid)
        self.datadir = self._resolve_datadir()
        self.logfile = self.datadir / "server.log"
        self.settings: dict[str, str] = {**DEFAULT_SETTINGS, **(settings or {})}
        self.port = port or self._persisted_port() or _proc.free_port()
        self._proc: subprocess.Popen[bytes] | None = None

    # -- connection strings -------------------------------------------------------------------
    @property
    def dsn(self) -> str:
        """Superuser conninfo for the ``postgres`` database."""
        return self.dsn_for("postgres")

    def dsn_for(self, dbname: str) -> str:
        """Superuser conninfo for ``dbname``."""
        return make_conninfo("", host="127.0.0.1", port=self.port, user=SUPERUSER, dbname=dbname)

    # -- lifecycle ----------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        """Postmaster pid when running, else None."""
        if self._proc is not None and self._proc.poll() is None:
            return self._proc.pid  # our own child: no pid-file or /proc guesswork
        lines = self._pidfile_lines()
        if not lines or not lines[0].strip().isdigit():
            return None
        pid = int(lines[0])
        # A stale postmaster.pid (after kill) may name a reused pid: check it is our postmaster.
        alive = _proc.pid_alive(pid) and str(self.datadir) in _proc.cmdline(pid)
        return pid if alive else None

    def is_running(self) -> bool:
        """True when the postmaster of this data directory is alive."""
        return self.pid is not None

    def start(self, timeout: float = 120.0) -> None:
        """Start the server (initdb on first use) and wait until it accepts connections.

        A no-op when it is already running. After ``kill()`` this performs crash recovery.
        """
        if self.is_running():
            return
        if not (self.datadir / "PG_VERSION").exists():
            self._initdb()
        self._write_conf()
        _proc.wait_port_free(self.port)
        began = time.monotonic()
        with open(self.logfile, "ab") as log:
            self._proc = subprocess.Popen(
                [str(self.bindir / "postgres"), "-D", str(self.datadir)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.datadir,
                env=self._env(),
                start_new_session=True,
                **self._popen_user,
            )
        proc = self._proc

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"postgres exited with status {proc.returncode}; log {self.logfile}:\n"
                    + _proc.tail(self.logfile)
                )
            lines = self._pidfile_lines()
            return (
                len(lines) >= 8
                and lines[0].strip() == str(proc.pid)
                and (lines[7].strip() == "ready")
            )

        try:
            _proc.wait_for(ready, timeout, "PostgreSQL to accept connections")
        except TimeoutError:
            _proc.kill_group(proc.pid, proc)
            raise
        logger.info(
            "PostgreSQL ready on 127.0.0.1:%d (pid %d, datadir %s) in %.2fs",
            self.port,
            proc.pid,
            self.datadir,
            time.monotonic() - began,
        )

    def stop(self, timeout: float = 60.0) -> None:
        """Fast shutdown (SIGINT: abort sessions, checkpoint); SIGKILL after ``timeout``."""
        pid = self.pid
        if pid is None:
            return
        _proc.terminate(pid, signal.SIGINT, timeout, self._own(pid))
        logger.info("PostgreSQL on port %d stopped", self.port)

    def kill(self) -> None:
        """SIGKILL the postmaster and all its children: the next ``start()`` does crash recovery."""
        pid = self.pid
        if pid is None:
            return
        _proc.kill_group(pid, self._own(pid))
        logger.info("PostgreSQL on port %d killed (SIGKILL)", self.port)

    def crash(self, timeout: float = 60.0) -> None:
        """Immediate shutdown (``pg_ctl stop -m immediate``: SIGQUIT, no checkpoint); the next
        ``start()`` does crash recovery."""
        pid = self.pid
        if pid is None:
            return
        _proc.terminate(pid, signal.SIGQUIT, timeout, self._own(pid))
        logger.info("PostgreSQL on port %d shut down immediately (crash)", self.port)

    def restart(self, **overrides: SettingValue) -> None:
        """Stop and start again on the same port and data; ``overrides`` update ``settings``
        persistently (pass the old value, e.g. ``wal_level="logical"``, to revert)."""
        self.settings.update({k: _conf_value(v) for k, v in overrides.items()})
        self.stop()
        self.start()

    def destroy(self) -> None:
        """Stop the server and delete its data directory (and ``base_dir`` if temporary)."""
        self.stop()
        real = self.datadir.resolve()
        shutil.rmtree(real, ignore_errors=True)
        if real.parent.name.startswith("cdc-outbox-pg-") and real.parent != self.base_dir:
            shutil.rmtree(real.parent, ignore_errors=True)
        link = self.base_dir / "data"
        if link.is_symlink():
            link.unlink()
        if self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    # -- databases ----------------------------------------------------------------------------
    def create_database(self, name: str) -> str:
        """Create database ``name``; return its superuser conninfo."""
        create_database(self.dsn, name)
        return self.dsn_for(name)

    def drop_database(self, name: str, timeout: float = 30.0) -> None:
        """Drop ``name`` if it exists (see :func:`drop_database`)."""
        drop_database(self.dsn, name, timeout)

    # -- internals ----------------------------------------------------------------------------
    def _own(self, pid: int) -> subprocess.Popen[bytes] | None:
        return self._proc if self._proc is not None and self._proc.pid == pid else None

    def _resolve_datadir(self) -> Path:
        link = self.base_dir / "data"
        if link.is_symlink():
            return Path(os.readlink(link))
        if self._user is None or reachable(self.base_dir, self._user):
            return link
        digest = hashlib.sha1(str(self.base_dir).encode()).hexdigest()[:12]
        home = Path(tempfile.gettempdir()) / f"cdc-outbox-pg-{digest}"
        home.mkdir(mode=0o700, exist_ok=True)
        os.chown(home, self._user.pw_uid, self._user.pw_gid)
        logger.info(
            "%s is not reachable by user %s; data directory in %s", self.base_dir, OS_USER, home
        )
        link.symlink_to(home / "data")
        return home / "data"

    def _persisted_port(self) -> int | None:
        try:
            text = (self.datadir / CONF_NAME).read_text()
        except OSError:
            return None
        match = re.search(r"^port = (\d+)$", text, re.MULTILINE)
        return int(match.group(1)) if match else None

    def _pidfile_lines(self) -> list[str]:
        try:
            return (self.datadir / "postmaster.pid").read_text().splitlines()
        except OSError:
            return []

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        if self._user is not None:
            env.update(HOME=self._user.pw_dir, USER=OS_USER, LOGNAME=OS_USER)
        return env

    def _chown(self, path: Path) -> None:
        if self._user is not None:
            os.chown(path, self._user.pw_uid, self._user.pw_gid)

    def _initdb(self) -> None:
        began = time.monotonic()
        self.datadir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._chown(self.datadir)
        cmd = [
            str(self.bindir / "initdb"),
            "-D",
            str(self.datadir),
            "-U",
            SUPERUSER,
            "--auth=trust",
            "--encoding=UTF8",
            "--no-locale",
            "--no-sync",
        ]
        out = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            check=False,
            cwd=self.datadir,
            env=self._env(),
            **self._popen_user,
        )
        if out.returncode != 0:
            raise RuntimeError(f"initdb failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
        with open(self.datadir / "postgresql.conf", "a") as conf:
            conf.write(f"\ninclude_if_exists = '{CONF_NAME}'\n")
        (self.datadir / "pg_hba.conf").write_text(_HBA)
        logger.info("initdb %s in %.2fs", self.datadir, time.monotonic() - began)

    def _write_conf(self) -> None:
        managed = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(self.datadir),
        }
        lines = ["# written by cdc_outbox_dev.sandbox at every start; ALTER SYSTEM overrides it"]
        for name, value in {**self.settings, **managed}.items():
            if not re.fullmatch(r"[a-z_.]+", name):
                raise ValueError(f"invalid setting name {name!r}")
            if name == "port":
                lines.append(f"port = {value}")
            else:
                quoted = str(value).replace("'", "''")
                lines.append(f"{name} = '{quoted}'")
        path = self.datadir / CONF_NAME
        path.write_text("\n".join(lines) + "\n")
        self._chown(path)
