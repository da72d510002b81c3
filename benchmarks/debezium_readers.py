"""The systems ``python -m benchmarks debezium`` compares, each run as a process of its own.

:func:`start` runs cdc-outbox (``python -m cdc_outbox --config FILE run``, with
:func:`debezium_setup.relay_toml`) or a standalone Kafka Connect worker with Debezium
(:class:`~cdc_outbox_dev.sandbox.kafka_connect.LocalConnect`, a variant of
:data:`debezium_setup.VARIANTS`) on a slot made by the caller; :func:`peak_rss_mb` reads a
process tree's peak resident set from ``/proc``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import psycopg
from psycopg import sql

from benchmarks import debezium_setup
from cdc_outbox.config.settings import Settings
from cdc_outbox.store.schema import relay_state_ddl, relay_state_ident
from cdc_outbox_dev.sandbox import _proc
from cdc_outbox_dev.sandbox.kafka_connect import LocalConnect

TABLE, PUBLICATION = "bench_dbz_outbox", "bench_dbz_pub"
SYSTEMS = ("cdc_outbox", *debezium_setup.VARIANTS)
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Context:
    """Where the run's servers and files are; ``stamp`` makes its topic names new (one per
    run and round)."""

    dsn: str
    bootstrap: str
    workdir: Path
    stamp: str

    def prefix(self, system: str) -> str:
        return f"dbz.{self.stamp}.{system}"

    def relay_toml(self, system: str, slot: str) -> str:
        return debezium_setup.relay_toml(
            self.dsn,
            self.bootstrap,
            slot=slot,
            publication=PUBLICATION,
            table=TABLE,
            topic_prefix=self.prefix(system),
        )

    def settings(self, system: str, slot: str) -> Settings:
        """cdc-outbox's settings, as its process reads them."""
        return Settings.model_validate(tomllib.loads(self.relay_toml(system, slot)))


class Reader(Protocol):
    """A running system: its root pid and how to stop it."""

    @property
    def pid(self) -> int: ...

    @property
    def log(self) -> Path: ...

    def stop(self) -> None: ...


@dataclass
class _Relay:
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            _proc.terminate(self.proc.pid, signal.SIGTERM, 60, self.proc)


@dataclass
class _Connect:
    connect: LocalConnect
    pid: int
    log: Path

    def stop(self) -> None:
        self.connect.close()


def start(ctx: Context, system: str, slot: str, name: str) -> Reader:
    """Start ``system`` on ``slot`` (created by the caller); returns once it runs (Debezium:
    its task RUNNING; cdc-outbox: its process started)."""
    workdir = ctx.workdir / name
    workdir.mkdir(parents=True, exist_ok=True)
    if system == "cdc_outbox":
        settings = ctx.settings(system, slot)
        with psycopg.connect(ctx.dsn, autocommit=True) as conn:
            for stmt in relay_state_ddl(settings):
                conn.execute(stmt)
            conn.execute(  # the slot was made before any row it is to relay: stream it
                sql.SQL(
                    "INSERT INTO {} (slot_name, phase) VALUES (%s, 'STREAMING')"
                    " ON CONFLICT (slot_name) DO UPDATE SET phase = 'STREAMING'"
                ).format(relay_state_ident(settings)),
                (slot,),
            )
        config = workdir / "relay.toml"
        config.write_text(ctx.relay_toml(system, slot))
        path = [str(ROOT), os.environ.get("PYTHONPATH", "")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, path))}
        with open(workdir / "relay.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "cdc_outbox", "--config", str(config), "run"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=workdir,
                env=env,
                start_new_session=True,
            )
        return _Relay(proc, workdir / "relay.log")
    tuning = debezium_setup.VARIANTS[system]
    connector = debezium_setup.connector_properties(
        ctx.dsn,
        slot=slot,
        publication=PUBLICATION,
        table=TABLE,
        topic_prefix=ctx.prefix(system),
        tuning=tuning,
    )
    connect = LocalConnect("", connector, debezium_setup.CONNECTOR_NAME, workdir)
    connect.worker = debezium_setup.worker_properties(ctx.bootstrap, connect.rest_port, tuning)
    connect.start()
    assert connect.pid is not None
    return _Connect(connect, connect.pid, connect.log_path)


def peak_rss_mb(root: int) -> float:
    """Sum of ``VmHWM`` (peak resident set) over ``root`` and its descendants, in MiB."""
    total_kb, todo = 0, [root]
    while todo:
        pid = todo.pop()
        todo += _proc.children(pid)
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total_kb += int(line.split()[1])
    return round(total_kb / 1024, 1)
